// The driver every node-local shared-memory algorithm runs on (the
// collectives' "shm" algorithms, and the intra-node phases of hierarchical).
//
// A call is cut into chunks that fit one staging slot; each chunk goes
// through a few stages (typically: copy my part into my slot; read the
// others' slots). Before the first stage of a chunk the rank waits until its
// slot is free (every rank is done with the chunk that used it `slots`
// chunks ago); before stage t > 0 it waits for the stage t-1 of the ranks
// that stage reads from. So ranks run up to `slots` chunks apart, copying in
// while others are still reading, and a chunk's data is read from the shared
// cache soon after it was written.
//
// Every call also publishes what it is (CallSig) in its first chunk's slot,
// and compares the peers' once it has waited for them: ranks that disagree
// on the collective or its count get invalid_usage instead of mixing data.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <utility>

#include "algorithm.hpp"
#include "allreduce/common.hpp"
#include "shm_window.hpp"
#include "slot_stores.hpp"

namespace cclz::coll::shm {

// Which ranks a stage waits for, after the previous stage.
struct Deps {
  enum class Kind { all, none, one } kind = Kind::all;
  int rank = -1;
  static Deps all() { return {}; }
  static Deps none() { return {Kind::none, -1}; }
  static Deps one(int r) { return {Kind::one, r}; }
};

// The CallSig of a collective call (kind, dtype, op, root, count).
inline detail::ShmWindow::CallSig call_sig(const Group& g, const CollArgs& a, std::size_t count) {
  const auto shape = static_cast<std::uint64_t>(a.kind) | (static_cast<std::uint64_t>(a.dt) << 8) |
                     (static_cast<std::uint64_t>(a.op) << 16) | (static_cast<std::uint64_t>(a.root) << 24);
  return {g.seq(), shape, count};
}

Status sig_mismatch(const Group& g, int peer, const detail::ShmWindow::CallSig& mine,
                    const detail::ShmWindow::CallSig& theirs);

// Runs `chunks` chunks of `stages` stages (1..kStages). body(c, slot, t)
// does stage t of chunk c (0-based within this call); `slot` is the global
// chunk number to pass to ShmWindow::slot(). deps(t) says whom stage t > 0
// waits for. after(c, slot, t) runs right after stage t is published: work
// no peer waits for (a copy into this rank's own output), done while the
// peers see the stage instead of delaying it by one hand-off. The caller
// must have checked g.shm() != nullptr.
template <class Body, class DepsFn, class After>
Status run_pipeline(Group& g, const detail::ShmWindow::CallSig& sig, std::size_t chunks, int stages, Body&& body,
                    DepsFn&& deps, const char* name, After&& after) {
  detail::ShmWindow& w = *g.shm();
  constexpr auto K = static_cast<std::uint64_t>(detail::ShmWindow::kStages);
  const auto slots = static_cast<std::uint64_t>(w.slots());
  const std::uint64_t first = w.next_chunk();
  const std::function<void()> idle = [&g] { g.progress_transport(); };
  int me_only[1] = {0};
  for (std::size_t c = 0; c < chunks; ++c) {
    const std::uint64_t G = first + c;
    for (int t = 0; t < stages; ++t) {
      Status st;
      if (t == 0) {
        if (G >= slots) st = w.wait({}, K * (G - slots + 1), g.deadline(), idle, name);
        if (st.ok() && c == 0) w.set_call_sig(G, sig);
      } else {
        const Deps d = deps(t);
        if (d.kind == Deps::Kind::all) {
          st = w.wait({}, K * G + static_cast<std::uint64_t>(t), g.deadline(), idle, name);
        } else if (d.kind == Deps::Kind::one) {
          me_only[0] = d.rank;
          st = w.wait(me_only, K * G + static_cast<std::uint64_t>(t), g.deadline(), idle, name);
        }
        // The first wait on peers of this call: check that they run the same call.
        if (st.ok() && c == 0 && t == 1) {
          for (int r = 0; r < g.size(); ++r) {
            if (r == g.rank() || (d.kind == Deps::Kind::one && r != d.rank) || d.kind == Deps::Kind::none) continue;
            const auto theirs = w.call_sig(r, G);
            if (!(theirs == sig)) st = sig_mismatch(g, r, sig, theirs);
            if (!st.ok()) break;
          }
        }
      }
      if (!st.ok()) return st;
      body(c, G, t);
      w.publish(t + 1 == stages ? K * (G + 1) : K * G + static_cast<std::uint64_t>(t) + 1);
      after(c, G, t);
    }
  }
  w.advance(chunks);
  return {};
}

template <class Body, class DepsFn>
Status run_pipeline(Group& g, const detail::ShmWindow::CallSig& sig, std::size_t chunks, int stages, Body&& body,
                    DepsFn&& deps, const char* name) {
  return run_pipeline(g, sig, chunks, stages, std::forward<Body>(body), std::forward<DepsFn>(deps), name,
                      [](std::size_t, std::uint64_t, int) {});
}

// `len` elements shared by `n` ranks in whole units of `unit` elements (a
// cache line), the first shares one unit longer; the last non-empty share is
// cut at len. Every rank computes the same split.
struct Shares {
  std::size_t len = 0, unit = 1;
  int n = 1;
  std::size_t off(int r) const noexcept {
    const std::size_t units = (len + unit - 1) / unit, per = units / static_cast<std::size_t>(n),
                      extra = units % static_cast<std::size_t>(n);
    const auto ur = static_cast<std::size_t>(r);
    return std::min(len, unit * (per * ur + std::min(ur, extra)));
  }
  std::size_t size(int r) const noexcept { return off(r + 1) - off(r); }
};

// kernels::reduce_many into dst, then avg's divide step (CollArgs::divisor)
// on the result: only the rank that reduces a range divides it, once. The
// division goes a piece at a time, right after the piece's reduce, while it
// is in L1 (2 bound ranks, reduce-scatter avg of 256 MB, against dividing
// each 512 KiB chunk after its reduce: 48.3-49.6 -> 46.4-47.1 ms, sum
// 42.0-42.3). A divisor of 1 is reduce_many alone.
void reduce_divided(void* dst, std::span<const void* const> srcs, std::size_t count, DataType dt, ReduceOp op,
                    int divisor);

// reduce_divided with streaming stores to dst, for an output no one reads
// from this core's cache next (a large out-of-place call's): in the
// reduce's own pass where kernels::reduce_many_stream applies, otherwise a
// piece at a time through L1. The same bits as reduce_divided.
void reduce_divided_stream(void* dst, std::span<const void* const> srcs, std::size_t count, DataType dt,
                           ReduceOp op, int divisor);

// Elements per cache line for this element size (at least 1).
inline std::size_t line_elems(std::size_t es) { return std::max<std::size_t>(1, 64 / es); }

// Copies n bytes; large copies into memory the caller will not read soon
// may bypass the cache (see shm_pipeline.cpp).
void copy(void* dst, const void* src, std::size_t n) noexcept;
void copy_stream(void* dst, const void* src, std::size_t n) noexcept;
// copy_in copies from a source that is in memory rather than in the cache
// (a large call's input) to a destination that stays cached (a slot).
void copy_in(void* dst, const void* src, std::size_t n) noexcept;
// copy_and_stream copies src both into a slot and to an output (bypassing
// the cache) in one pass; the slot too bypasses it when `slot_streamed`.
void copy_and_stream(void* slot, void* out, const void* src, std::size_t n, bool slot_streamed = false) noexcept;
// The large copies above move 64-byte lines as two 256-bit vectors where
// the CPU has AVX2 (the default), otherwise as four 128-bit ones. Sets the
// wide form for the whole process (for tests, which check both); returns
// false, changing nothing, where the CPU lacks AVX2.
bool set_wide_copies(bool wide) noexcept;

// Whether a call writes its outputs with streaming stores: when the node's
// buffers (every local rank's in_bytes + out_bytes; pass in_bytes 0 in
// place) do not fit in the last-level cache (the window's llc_bytes). Then
// they would be evicted before they are read again anyway, and the stores
// skip the read for ownership and leave the slots cached. When they fit,
// ordinary stores leave the output in the cache for the program and the
// next call (2 ranks: 8 MB all-gathers, all-to-alls and all-reduces took
// 0.44-0.75x the time they took streamed).
bool stream_outputs(const Group& g, std::size_t in_bytes, std::size_t out_bytes);

// Whether an out-of-place direct call streams the outputs it reduces into
// (shm::reduce_divided_stream, kernels::reduce_many_stream): once the
// node's buffers (`node_bytes`, every local rank's inputs and outputs) pass
// twice the last-level cache. Ordinary stores read each output line for
// ownership first; at twice the cache they were still level with streaming
// for f32 and faster for bf16 and avg, beyond it streaming was 1.2-2.1x
// faster (2 ranks: the all-reduce's 64 MB 15-16 -> 8 ms, reduce-scatter's
// and reduce's 7.2-7.6 -> 5.6-6.1 ms; docs/performance.md).
bool stream_reduced(const Group& g, std::uint64_t node_bytes);

// What a call's stages do with a chunk: only copy it (broadcast,
// all-gather: a peer copies a chunk out as soon as it is in the slot) or
// reduce it (all-reduce).
enum class ChunkUse { copy, reduce };

// The bytes of a slot one chunk of a call fills, for a call that moves
// `call_bytes` (per rank) through the slots: the whole slot for a streamed
// call; otherwise half the level-2 cache (the window's l2_bytes; at least
// 256 KiB) if that is less, since a chunk read from a peer's slot and the
// output it is written to both pass through that cache, and a chunk that
// overflows it is written back and read again from the shared cache (2
// ranks, 1 MiB level 2: 1 MiB chunks made 2-8 MB all-gathers 1.2-1.9x
// slower than 512 KiB ones). A call that fits in one slot stays one chunk
// (every chunk costs a hand-off; two made a 1 MB broadcast 1.2-1.7x slower
// on 2 bound ranks of an earlier host, level on the Zen 5 one), but for
// the copying calls where the ranks outnumber the cores: there the peers,
// taking turns on the cores with the writer, copy out its first chunk
// while the next is written. The 4-rank broadcast of 1 MB (1 MiB slots)
// took 2.6x as long as one chunk; cut in two, the all-reduce gained
// nothing (docs/performance-log.md, "More ranks than cores on the Zen 5
// host").
std::size_t chunk_bytes(const detail::ShmWindow& w, bool stream, std::size_t call_bytes, ChunkUse use);

// A steady clock cheap enough to read around every call.
std::uint64_t ticks() noexcept;

// The slot stores of one call (slot_stores.hpp). Made after the call has
// decided whether it streams; a call that does not, or whose window fixes
// the stores (CCLZ_SHM_SLOT_STORES), is neither timed nor sends a hint.
// The body calls at_stage() first in every stage (it sends or takes rank
// 0's choice in the first chunk), copies into its own slot with to_slot(),
// and the call returns through finish().
class SlotStoreCall {
 public:
  SlotStoreCall(Group& g, const detail::ShmWindow::CallSig& sig, bool in_place, std::size_t bytes, bool stream);
  bool memory() const noexcept { return stores_ == SlotStores::memory; }
  void at_stage(std::size_t c, std::uint64_t slot, int t);
  void to_slot(void* slot, const void* src, std::size_t n) const noexcept {
    (memory() ? copy_stream : stream_ ? copy_in : copy)(slot, src, n);
  }
  Status finish(Status st);

 private:
  Group& g_;
  bool stream_;
  SlotStoreState* state_ = nullptr;  // null: fixed (not streamed, or by the window)
  SlotStores stores_ = SlotStores::cache;
  std::uint32_t band_ = 0;
  std::size_t bytes_ = 0;
  std::uint64_t start_ = 0;
};

// The node-local phases hierarchical algorithms are built from (defined in
// reduce_scatter/shm.cpp and allgather/shm.cpp). `layout` gives every rank's
// block of the whole buffer. reduce_scatter reduces block `me` of every
// rank's `src` into `mine` (which may be src's own block: in place), and
// divides it by `divisor` (see reduce_divided());
// all_gather copies every rank's `mine` to its block of `dst` (`mine` may be
// dst's own block). `sig` identifies the call (see call_sig).
Status reduce_scatter(Group& g, const detail::ShmWindow::CallSig& sig, const void* src, void* mine,
                      const allreduce_impl::BlockLayout& layout, DataType dt, ReduceOp op, int divisor);
Status all_gather(Group& g, const detail::ShmWindow::CallSig& sig, const void* mine, void* dst,
                  const allreduce_impl::BlockLayout& layout, std::size_t es);

}  // namespace cclz::coll::shm
