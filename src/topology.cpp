// Node layout from host names and overrides (see topology.hpp).
// Cost: O(n log n) per communicator creation.
#include "topology.hpp"

#include <sched.h>
#include <unistd.h>

#include <bit>
#include <map>

namespace cclz::detail {

Topology topology_from_labels(const std::vector<int>& labels, std::string source) {
  Topology t;
  t.source = std::move(source);
  const std::size_t n = labels.size();
  t.node_of.resize(n);
  t.local_rank.resize(n);
  std::map<int, int> dense;  // label -> node, in order of the first (lowest) rank
  for (std::size_t r = 0; r < n; ++r) {
    auto [it, added] = dense.try_emplace(labels[r], static_cast<int>(dense.size()));
    if (added) t.node_size.push_back(0);
    const int node = it->second;
    t.node_of[r] = node;
    t.local_rank[r] = t.node_size[static_cast<std::size_t>(node)]++;
  }
  return t;
}

Topology compute_topology(std::span<const RankInfo> ranks, int local_size) {
  const std::size_t n = ranks.size();
  std::vector<int> labels(n);
  bool any_override = false;
  for (const RankInfo& r : ranks) any_override = any_override || r.node_override >= 0;
  if (any_override) {
    // Overridden ids keep their value as label; ranks without one get a label
    // per host name below every id (negative), so they never merge with one.
    std::map<std::string, int> hosts;
    for (std::size_t r = 0; r < n; ++r) {
      if (ranks[r].node_override >= 0) {
        labels[r] = ranks[r].node_override;
      } else {
        auto it = hosts.try_emplace(ranks[r].hostname, -1 - static_cast<int>(hosts.size())).first;
        labels[r] = it->second;
      }
    }
    return topology_from_labels(labels, "CCLZ_NODE_ID");
  }
  if (local_size > 0) {
    for (std::size_t r = 0; r < n; ++r) labels[r] = static_cast<int>(r) / local_size;
    return topology_from_labels(labels, "CCLZ_LOCAL_SIZE=" + std::to_string(local_size));
  }
  std::map<std::string, int> hosts;
  for (std::size_t r = 0; r < n; ++r) {
    labels[r] = hosts.try_emplace(ranks[r].hostname, static_cast<int>(hosts.size())).first->second;
  }
  return topology_from_labels(labels, "hostname");
}

std::string Topology::describe(std::span<const RankInfo> ranks) const {
  std::string out;
  for (int node = 0; node < num_nodes(); ++node) {
    // Ranks of this node as runs: "0-3,6".
    std::string list;
    int run_start = -1, prev = -2;
    auto flush = [&] {
      if (run_start < 0) return;
      if (!list.empty()) list += ',';
      list += std::to_string(run_start);
      if (prev != run_start) {
        list += '-';
        list += std::to_string(prev);
      }
    };
    int first = -1;
    for (int r = 0; r < static_cast<int>(node_of.size()); ++r) {
      if (node_of[static_cast<std::size_t>(r)] != node) continue;
      if (first < 0) first = r;
      if (r != prev + 1) {
        flush();
        run_start = r;
      }
      prev = r;
    }
    flush();
    if (!out.empty()) out += "; ";
    out += "node ";
    out += std::to_string(node);
    out += ": ranks ";
    out += list;
    if (first >= 0 && static_cast<std::size_t>(first) < ranks.size()) {
      out += " (" + ranks[static_cast<std::size_t>(first)].hostname + ")";
    }
  }
  return out;
}

int usable_cpus() noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

std::vector<std::byte> affinity_bitmap() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<std::byte> bits;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return bits;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    const auto byte = static_cast<std::size_t>(cpu / 8);
    if (bits.size() <= byte) bits.resize(byte + 1);
    bits[byte] |= static_cast<std::byte>(1u << (cpu % 8));
  }
  return bits;
}

bool host_oversubscribed(std::span<const RankInfo> ranks, int rank) {
  if (rank < 0 || static_cast<std::size_t>(rank) >= ranks.size()) return false;
  const std::string& mine = ranks[static_cast<std::size_t>(rank)].hostname;
  std::vector<std::byte> all;
  int n = 0;
  bool known = true;
  for (const RankInfo& r : ranks) {
    if (r.hostname != mine) continue;
    ++n;
    known = known && !r.cpus.empty();
    if (r.cpus.size() > all.size()) all.resize(r.cpus.size());
    for (std::size_t i = 0; i < r.cpus.size(); ++i) all[i] |= r.cpus[i];
  }
  int cpus = 0;
  for (std::byte b : all) cpus += std::popcount(static_cast<unsigned>(b));
  if (!known) {
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    cpus = online > 0 ? static_cast<int>(online) : 1;
  }
  return n > cpus;
}

}  // namespace cclz::detail
