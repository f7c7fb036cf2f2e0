// Group: the view an algorithm has of the ranks it runs over. Ranks are
// numbered 0..size()-1 inside the group (a communicator, or a sub-group such
// as "the ranks of my node" for hierarchical algorithms); the group maps them
// to transport ranks and builds message tags from the collective's sequence
// number, so algorithms only pick small per-step tags.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "shm_window.hpp"
#include "transport.hpp"

namespace cclz::coll::shm {
struct HeapPathTiming;
}

namespace cclz::coll {

// Reusable temporary memory for algorithms, owned by the communicator so a
// steady stream of collectives does not allocate. Slots 0-3 are for leaf
// algorithms; composite algorithms (hierarchical) use slots 4-7 for buffers
// they hold while calling leaf algorithms.
class ScratchPool {
 public:
  static constexpr int kSlots = 8;
  // At least `bytes` bytes, 64-byte aligned, valid until the next call with
  // the same slot. Contents are unspecified.
  std::byte* get(int slot, std::size_t bytes);

 private:
  struct Buffer {
    std::unique_ptr<std::byte[]> mem;
    std::size_t bytes = 0;
  };
  Buffer slots_[kSlots];
};

class Group {
 public:
  // Bits of the tag an algorithm may use, and of the sub-space selector.
  static constexpr int kStepTagBits = 20;
  static constexpr int kSpaceBits = 4;
  static constexpr int kSeqBits = detail::Transport::kTagBits - kStepTagBits - kSpaceBits;

  // Who the members are: transport ranks and their nodes (renumbered
  // densely), computed once and shared by every Group over the same ranks.
  struct Shape {
    std::vector<int> members;
    std::vector<int> nodes;
    int num_nodes = 1;
    bool nodes_uniform = true;
  };
  static std::shared_ptr<const Shape> make_shape(std::vector<int> members, std::vector<int> node_of_member);

  Group(detail::Transport& t, std::vector<int> members, std::vector<int> node_of_member, int my_index,
        std::uint64_t seq, detail::Clock::time_point deadline, ScratchPool& scratch, int space = 0);
  // Over a shape made once (the communicator's per-call groups: no
  // allocation on the call path).
  Group(detail::Transport& t, std::shared_ptr<const Shape> shape, int my_index, std::uint64_t seq,
        detail::Clock::time_point deadline, ScratchPool& scratch, int space = 0);

  int rank() const noexcept { return me_; }
  int size() const noexcept { return static_cast<int>(shape_->members.size()); }
  int global_rank(int r) const noexcept { return shape_->members[static_cast<std::size_t>(r)]; }
  int node_of(int r) const noexcept { return shape_->nodes[static_cast<std::size_t>(r)]; }
  int num_nodes() const noexcept { return shape_->num_nodes; }
  // True when every node holds the same number of this group's ranks.
  bool nodes_uniform() const noexcept { return shape_->nodes_uniform; }

  // Blocking helpers: post, then wait with back-off until done, error or the
  // collective's deadline. On error every unfinished op is cancelled.
  Status send(int peer, std::uint32_t tag, const void* buf, std::size_t bytes);
  Status recv(int peer, std::uint32_t tag, void* buf, std::size_t bytes);
  Status sendrecv(int dst, const void* sbuf, std::size_t sbytes, int src, void* rbuf, std::size_t rbytes,
                  std::uint32_t tag);

  // Non-blocking pieces for pipelined algorithms. Every posted op must be
  // passed to wait() before the algorithm returns.
  Status isend(int peer, std::uint32_t tag, const void* buf, std::size_t bytes, detail::Op* op);
  Status irecv(int peer, std::uint32_t tag, void* buf, std::size_t bytes, detail::Op* op);
  Status wait(std::span<detail::Op* const> ops);
  Status wait(detail::Op* op) { return wait(std::span<detail::Op* const>(&op, 1)); }

  // A sub-group of this group (indices are this group's ranks, in the order
  // the sub-group numbers them; this rank must be among them). `space`
  // (1..15) keeps its tags apart from other sub-groups of the same call.
  Group subgroup(std::span<const int> indices, int space) const;

  // The node-local shared-memory window, when this group's ranks are exactly
  // the ranks that share it (in its order); null otherwise. Sub-groups keep
  // the window and re-check.
  detail::ShmWindow* shm() const noexcept { return shm_usable_ ? shm_ : nullptr; }
  void attach_shm(detail::ShmWindow* w) noexcept;
  // Drives the transport's pending protocol work (while waiting elsewhere).
  void progress_transport() { t_->progress(); }

  std::byte* scratch(int slot, std::size_t bytes) { return scratch_->get(slot, bytes); }
  detail::Clock::time_point deadline() const noexcept { return deadline_; }
  std::uint64_t seq() const noexcept { return seq_; }

  // Set for the length of a node-local call whose way for heap buffers
  // rank 0 may choose by measurement (shm::timing_heap_path); null otherwise.
  shm::HeapPathTiming* heap_path_timing() const noexcept { return heap_path_timing_; }
  void set_heap_path_timing(shm::HeapPathTiming* t) noexcept { heap_path_timing_ = t; }

 private:
  std::uint64_t make_tag(std::uint32_t tag) const noexcept;

  detail::Transport* t_;
  std::shared_ptr<const Shape> shape_;
  int me_;
  std::uint64_t seq_;
  detail::Clock::time_point deadline_;
  ScratchPool* scratch_;
  int space_;
  detail::ShmWindow* shm_ = nullptr;
  bool shm_usable_ = false;
  shm::HeapPathTiming* heap_path_timing_ = nullptr;
};

}  // namespace cclz::coll
