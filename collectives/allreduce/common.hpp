// Shared pieces of the all-reduce algorithms: the element-granular block
// layout, a list of posted ops that is drained on every exit path, and the
// two pipelined ring phases (reduce-scatter, all-gather) that ring.cpp and
// hierarchical.cpp are built from.
//
// Ring phases (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce
// algorithms for clusters of workstations"): n-1 steps each; in step s rank r
// sends one block to r+1 and receives one from r-1, so each phase moves
// (n-1)/n of the buffer per rank. Each block is cut into slices, and the
// slices of all steps form one stream of units (step-major): the receive of
// unit u+D is posted while unit u is being reduced, and the block reduced at
// step s is forwarded slice by slice at step s+1, so transfer and reduction
// overlap (NCCL's pipelined ring).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "algorithm.hpp"
#include "kernels.hpp"

namespace cclz::coll::allreduce_impl {

// Default pipeline slice of the ring phases, and the tree's chunk. They are
// performance knobs only; every value gives the same bytes on every rank.
inline constexpr std::size_t kRingSliceBytes = std::size_t{256} << 10;
inline constexpr std::size_t kTreeChunkBytes = std::size_t{64} << 10;

// Entry points with the pipeline granularity as a parameter, so tests can
// force many slices on small buffers. The descriptors call them with the
// defaults above. Defined in ring.cpp, tree.cpp and hierarchical.cpp.
Status ring_allreduce(Group& g, const CollArgs& a, std::size_t slice_bytes);
Status tree_allreduce(Group& g, const CollArgs& a, std::size_t chunk_bytes);
Status hierarchical_allreduce(Group& g, const CollArgs& a, std::size_t slice_bytes);

// `count` elements split into `n` blocks, the first count % n one element
// longer: blocks never split an element and differ by at most one.
struct BlockLayout {
  std::size_t count = 0;
  int n = 1;

  std::size_t len(int b) const noexcept {
    const std::size_t q = count / static_cast<std::size_t>(n), rem = count % static_cast<std::size_t>(n);
    return q + (static_cast<std::size_t>(b) < rem ? 1 : 0);
  }
  std::size_t off(int b) const noexcept {
    const std::size_t q = count / static_cast<std::size_t>(n), rem = count % static_cast<std::size_t>(n);
    const auto ub = static_cast<std::size_t>(b);
    return q * ub + std::min(ub, rem);
  }
  // Offset of the first element past blocks [0, b).
  std::size_t end(int b) const noexcept { return b >= n ? count : off(b); }
  std::size_t max_len() const noexcept { return len(0); }
};

// How each block is cut into pipeline slices: the same number of slices for
// every block (so every rank walks the same unit sequence), `elems` elements
// each except at the block's end, where slices may be short or empty.
struct Slicing {
  std::size_t elems = 0;
  int slices = 1;

  static Slicing make(std::size_t max_block, std::size_t elem_size, std::size_t slice_bytes) {
    Slicing s;
    const std::size_t per = std::max<std::size_t>(1, slice_bytes / std::max<std::size_t>(1, elem_size));
    const std::size_t m = std::max<std::size_t>(1, (max_block + per - 1) / per);
    s.slices = static_cast<int>(m);
    s.elems = (max_block + m - 1) / m;  // spread evenly: no tiny last slice
    return s;
  }
  // [first, first + n) of slice j inside a block of `block_len` elements.
  std::size_t first(int j, std::size_t block_len) const noexcept {
    return std::min(block_len, static_cast<std::size_t>(j) * elems);
  }
  std::size_t len(int j, std::size_t block_len) const noexcept {
    const std::size_t f = first(j, block_len);
    return std::min(elems, block_len - f);
  }
};

inline int mod(int x, int n) noexcept { return ((x % n) + n) % n; }

// Tags: an algorithm owns all 2^20 step tags of its group; the two phases
// of a ring use disjoint halves so that an early message of the next phase
// can never match a late receive of this one. Within a half the tag wraps;
// messages with equal tags between one pair still match in posting order.
inline constexpr std::uint32_t kTagHalf = std::uint32_t{1} << (Group::kStepTagBits - 1);
inline std::uint32_t phase_tag(std::uint32_t base, std::size_t unit) noexcept {
  return base + static_cast<std::uint32_t>(unit % kTagHalf);
}

// Ops posted by one algorithm call. Storage never moves (the transport keeps
// pointers to the ops), and drain() waits for every posted op: on success
// that completes them; after an error it cancels the unfinished ones (the
// group's wait cancels on failure), so no transfer outlives the call and
// its buffers.
class PostedOps {
 public:
  explicit PostedOps(std::size_t capacity)
      : ops_(new detail::Op[capacity]), live_(new bool[capacity]()), cap_(capacity) {}
  detail::Op* slot(std::size_t i) noexcept { return &ops_[i]; }
  // Whether slot i holds a posted op that has not been waited for yet.
  bool live(std::size_t i) const noexcept { return live_[i]; }
  void posted(std::size_t i) noexcept { live_[i] = true; }
  // Waits for the op in slot i (which must be live).
  Status wait(Group& g, std::size_t i) {
    Status st = g.wait(&ops_[i]);
    if (st.ok()) live_[i] = false;
    return st;
  }
  // Waits for every live op, returns `first` if it is an error, else the
  // wait's status.
  Status finish(Group& g, Status first = {}) {
    std::vector<detail::Op*> open;
    for (std::size_t i = 0; i < cap_; ++i) {
      if (live_[i] && !ops_[i].done) open.push_back(&ops_[i]);
      live_[i] = false;
    }
    Status st = open.empty() ? Status{} : g.wait(open);
    return first.ok() ? st : first;
  }

 private:
  std::unique_ptr<detail::Op[]> ops_;
  std::unique_ptr<bool[]> live_;
  std::size_t cap_;
};

inline Status check_args(const CollArgs& a, const char* algo) {
  if (a.kind != CollKind::all_reduce || !dtype_valid(a.dt) || a.op == ReduceOp::avg || !op_valid(a.op)) {
    return {Result::invalid_argument, std::string("all_reduce ") + algo + ": bad kind, dtype or op (avg is the comm's job)"};
  }
  if (a.count > 0 && (a.sendbuf == nullptr || a.recvbuf == nullptr)) {
    return {Result::invalid_argument, std::string("all_reduce ") + algo + ": null buffer"};
  }
  return {};
}

// Reduce-scatter phase of a ring on `g` over `layout` (layout.n == g.size()).
// On return block g.rank() of `dst` holds op over every rank's `src` for that
// block; other blocks of `dst` hold partial sums. `src` may equal `dst`; if
// not, `src` is only read. Uses scratch slot `slot` for the receive slices.
inline Status ring_reduce_scatter(Group& g, const std::byte* src, std::byte* dst, const BlockLayout& layout,
                                  DataType dt, ReduceOp op, std::size_t slice_bytes, int slot = 0,
                                  std::uint32_t tag_base = 0) {
  const int n = g.size(), r = g.rank();
  const std::size_t es = dtype_size(dt);
  if (n == 1) {
    if (src != dst && layout.count > 0) std::memmove(dst, src, layout.count * es);
    return {};
  }
  const Slicing sl = Slicing::make(layout.max_len(), es, slice_bytes);
  const int m = sl.slices, steps = n - 1;
  const std::size_t units = static_cast<std::size_t>(steps) * static_cast<std::size_t>(m);
  constexpr std::size_t kDepth = 4;  // receive slices in flight
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  // Step s: send block r-s-1, receive block r-s-2 (reduced, then forwarded
  // at step s+1). After n-1 steps the last block received is r itself.
  auto send_block = [&](int s) { return mod(r - s - 1, n); };
  auto recv_block = [&](int s) { return mod(r - s - 2, n); };
  std::byte* tmp = g.scratch(slot, static_cast<std::size_t>(kDepth) * std::max<std::size_t>(1, sl.elems) * es);

  PostedOps sends(units);
  PostedOps recvs(kDepth);

  auto post_send = [&](std::size_t u) -> Status {
    const int s = static_cast<int>(u / static_cast<std::size_t>(m)), j = static_cast<int>(u % static_cast<std::size_t>(m));
    const int b = send_block(s);
    const std::size_t len = sl.len(j, layout.len(b));
    if (len == 0) return {};  // the receiver computes the same empty slice
    const std::size_t off = layout.off(b) + sl.first(j, layout.len(b));
    const std::byte* base = s == 0 ? src : dst;
    Status st = g.isend(right, phase_tag(tag_base, u), base + off * es, len * es, sends.slot(u));
    if (st.ok()) sends.posted(u);
    return st;
  };
  auto post_recv = [&](std::size_t u) -> Status {
    const int s = static_cast<int>(u / static_cast<std::size_t>(m)), j = static_cast<int>(u % static_cast<std::size_t>(m));
    const int b = recv_block(s);
    const std::size_t len = sl.len(j, layout.len(b));
    if (len == 0) return {};
    const std::size_t k = u % kDepth;
    Status st = g.irecv(left, phase_tag(tag_base, u), tmp + k * sl.elems * es, len * es, recvs.slot(k));
    if (st.ok()) recvs.posted(k);
    return st;
  };

  Status st;
  for (std::size_t u = 0; u < units && u < static_cast<std::size_t>(kDepth) && st.ok(); ++u) st = post_recv(u);
  // Step-0 slices come straight from src and depend on nothing: post them all.
  for (std::size_t u = 0; u < static_cast<std::size_t>(m) && st.ok(); ++u) st = post_send(u);
  for (std::size_t u = 0; u < units && st.ok(); ++u) {
    const int s = static_cast<int>(u / static_cast<std::size_t>(m)), j = static_cast<int>(u % static_cast<std::size_t>(m));
    const std::size_t k = u % kDepth;
    if (recvs.live(k)) {
      st = recvs.wait(g, k);
      if (!st.ok()) break;
      const int b = recv_block(s);
      const std::size_t off = layout.off(b) + sl.first(j, layout.len(b));
      // Incoming partial first, own contribution second: the same order on
      // every rank, and the block's owner is the only one whose result counts.
      kernels::reduce(dst + off * es, tmp + k * sl.elems * es, src + off * es, sl.len(j, layout.len(b)), dt, op);
    }
    if (s + 1 < steps) st = post_send(u + static_cast<std::size_t>(m));
    if (st.ok() && u + kDepth < units) st = post_recv(u + kDepth);
  }
  st = recvs.finish(g, st);
  return sends.finish(g, st);
}

// All-gather phase of a ring: block g.rank() of `buf` is valid on entry; on
// return every block is. Receives go straight into `buf`.
inline Status ring_allgather(Group& g, std::byte* buf, const BlockLayout& layout, std::size_t es,
                             std::size_t slice_bytes, std::uint32_t tag_base = kTagHalf) {
  const int n = g.size(), r = g.rank();
  if (n == 1 || layout.count == 0) return {};
  const Slicing sl = Slicing::make(layout.max_len(), es, slice_bytes);
  const int m = sl.slices, steps = n - 1;
  const std::size_t units = static_cast<std::size_t>(steps) * static_cast<std::size_t>(m);
  constexpr std::size_t kDepth = 4;
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  // Step s: send block r-s (own block first), receive block r-s-1, which is
  // forwarded at step s+1.
  auto send_block = [&](int s) { return mod(r - s, n); };
  auto recv_block = [&](int s) { return mod(r - s - 1, n); };

  PostedOps sends(units), recvs(units);
  auto post = [&](std::size_t u, bool is_send) -> Status {
    const int s = static_cast<int>(u / static_cast<std::size_t>(m)), j = static_cast<int>(u % static_cast<std::size_t>(m));
    const int b = is_send ? send_block(s) : recv_block(s);
    const std::size_t len = sl.len(j, layout.len(b));
    if (len == 0) return {};
    std::byte* p = buf + (layout.off(b) + sl.first(j, layout.len(b))) * es;
    PostedOps& ops = is_send ? sends : recvs;
    Status st = is_send ? g.isend(right, phase_tag(tag_base, u), p, len * es, ops.slot(u))
                        : g.irecv(left, phase_tag(tag_base, u), p, len * es, ops.slot(u));
    if (st.ok()) ops.posted(u);
    return st;
  };

  Status st;
  for (std::size_t u = 0; u < units && u < kDepth && st.ok(); ++u) st = post(u, false);
  for (std::size_t u = 0; u < static_cast<std::size_t>(m) && st.ok(); ++u) st = post(u, true);
  for (std::size_t u = 0; u < units && st.ok(); ++u) {
    if (recvs.live(u)) {  // empty slices are never posted
      st = recvs.wait(g, u);
      if (!st.ok()) break;
    }
    const int s = static_cast<int>(u / static_cast<std::size_t>(m));
    if (s + 1 < steps) st = post(u + static_cast<std::size_t>(m), true);
    if (st.ok() && u + kDepth < units) st = post(u + kDepth, false);
  }
  st = recvs.finish(g, st);
  return sends.finish(g, st);
}

// Sends `sbytes` to `peer` and receives `rbytes` from it at once; an empty
// direction is skipped (both sides compute the same sizes).
inline Status exchange(Group& g, int peer, const void* sbuf, std::size_t sbytes, void* rbuf, std::size_t rbytes,
                       std::uint32_t tag) {
  detail::Op s, r;
  detail::Op* ops[2];
  int k = 0;
  if (rbytes > 0) {
    if (Status st = g.irecv(peer, tag, rbuf, rbytes, &r); !st.ok()) return st;
    ops[k++] = &r;
  }
  if (sbytes > 0) {
    Status st = g.isend(peer, tag, sbuf, sbytes, &s);
    if (!st.ok()) {
      if (k > 0) (void)g.wait(std::span<detail::Op* const>(ops, static_cast<std::size_t>(k)));
      return st;
    }
    ops[k++] = &s;
  }
  if (k == 0) return {};
  return g.wait(std::span<detail::Op* const>(ops, static_cast<std::size_t>(k)));
}

}  // namespace cclz::coll::allreduce_impl
