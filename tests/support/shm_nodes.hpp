// Node-local shared-memory windows for ranks that are threads of one test
// process: one anonymous segment per node, one window per rank, as the
// communicator would make them across processes. Small slots by default so
// that modest counts already run many pipeline chunks and wrap the slots.
// The direct path (shm_direct.hpp) is off unless asked for: thread ranks
// share their address space, so it would otherwise take every large call.
#pragma once

#include <map>
#include <memory>
#include <stdexcept>
#include <vector>

#include "shm_window.hpp"
#include "topology.hpp"

namespace cclz::testing {

class ShmNodes {
 public:
  explicit ShmNodes(std::vector<int> node_of, std::size_t slot_bytes = 4096, int slots = 3,
                    int allreduce_handoffs = 0, std::uint64_t direct_min_bytes = detail::ShmWindow::kDirectOff,
                    std::uint64_t llc_bytes = 0, int slot_stores = 0)
      : node_of_(std::move(node_of)) {
    for (std::size_t r = 0; r < node_of_.size(); ++r) members_[node_of_[r]].push_back(static_cast<int>(r));
    for (const auto& [node, members] : members_) {
      std::shared_ptr<detail::ShmSegment> seg;
      const detail::ShmWindow::Geometry g{static_cast<int>(members.size()), slot_bytes, slots, allreduce_handoffs,
                                          direct_min_bytes, 0, llc_bytes, slot_stores};
      if (!detail::ShmWindow::create_anonymous(g, &seg).ok()) throw std::runtime_error("cannot map a test window");
      segments_[node] = std::move(seg);
    }
  }
  std::unique_ptr<detail::ShmWindow> window(int rank) const {
    const int node = node_of_[static_cast<std::size_t>(rank)];
    const std::vector<int>& m = members_.at(node);
    const int index = static_cast<int>(std::find(m.begin(), m.end(), rank) - m.begin());
    return std::make_unique<detail::ShmWindow>(segments_.at(node), m, index,
                                               static_cast<int>(node_of_.size()) > detail::usable_cpus());
  }

 private:
  std::vector<int> node_of_;
  std::map<int, std::vector<int>> members_;
  std::map<int, std::shared_ptr<detail::ShmSegment>> segments_;
};

}  // namespace cclz::testing
