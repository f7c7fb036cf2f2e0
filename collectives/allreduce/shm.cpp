// Node-local all-reduce over the shared-memory window (see shm_pipeline.hpp).
//
// Calls that fit one slot may take one hand-off: every rank copies its input
// into its slot, then reduces all n slots in rank order straight into its
// output (2 stages, one wait on the peers). Every rank applies the same
// kernel to the same operands in the same order, so results are bitwise
// identical. Which calls do is decided per call (fixed_handoffs() below).
//
// The others, chunk by chunk: (0) copy the chunk, except my 1/n share of
// it, into my slot; (1) reduce my share over my input and the n-1 peers'
// slots, in rank order, into my slot (where my share was not staged),
// publish, and copy it to my output (a streamed output: in the reduce's
// own pass, kernels::reduce_many_stream); (2) copy the other shares'
// results into my output.
// Each share is reduced once, by its owner, and copied by the others:
// bitwise identical on every rank, and to the one-hand-off result. Memory
// traffic per rank: the input read and the output written once each (the
// roofline's minimum); everything else stays in the shared cache, a slot
// being read a few microseconds after it was written. CPU work per rank:
// (n-1)/n of the buffer staged, 1/n reduced, (n-1)/n copied out.
//
// Large calls whose buffers every rank can map (shm_direct.hpp) skip the
// slots: each rank reduces its 1/n share straight from the n inputs into
// its output, a block at a time, and copies each block on into the n-1
// peers' outputs while it is still in L1. Only rank r reads or writes the
// share-r range of any buffer, so the ranks need no hand-off between the
// agreement and the fence, and in place is safe (a block's inputs are read
// before its results are written). The same kernel on the same operands in
// the same order: bitwise the staged result. Pushing the result, rather
// than letting each peer read it from the owner's output, keeps the
// owner's output lines out of the peers' caches, so the next call's
// reduction does not have to take them back line by line (2 ranks, 4 MB:
// in place 126 -> 79 us, out of place 150 -> 123; docs/performance.md).
// CPU work per rank: 1/n reduced, (n-1)/n copied, no staging.
//
// avg (CollArgs::divisor): whoever reduces a share divides it right after,
// while it is in the cache, before anyone copies it: kernels::divide on the
// sum, so the same bits as dividing every rank's whole output afterwards,
// which as one more pass over the output cost an avg 1.3-1.7x a sum's time
// from 1 MB (2 ranks; docs/performance-log.md, "avg: a power of two multiplies").
//
// Cost: 2 (one hand-off) or 3 stages per chunk, chunks = bytes / chunk (a
// slot or less, shm::chunk_bytes);
// direct: the agreement's 2 hand-offs and the fence's 1.
#include "allreduce/common.hpp"
#include "allreduce/handoffs.hpp"
#include "shm_direct.hpp"
#include "shm_pipeline.hpp"

namespace cclz::coll {
namespace {

using allreduce_impl::HandoffChooser;

// With more ranks than cores a hand-off may cost a context switch, and
// timing calls there measures the scheduler more than the protocol: 4 ranks
// on 2 cores favoured one hand-off up to 16 KB and two from 32 KB
// (docs/performance.md), so that is fixed.
constexpr std::size_t kOneOversubscribed = 16 << 10;

// Hand-offs for a call of `bytes` (1 or 2; a call larger than a slot runs
// the chunked pipeline, 2), or 0 when the HandoffChooser's `band` decides.
// Every rank of the window decides alike: the same bytes and geometry,
// oversubscribed() from the rendezvous table they share, and the chooser's
// choices in effect, which every rank took from rank 0 in the same call.
int fixed_handoffs(const detail::ShmWindow& w, std::size_t bytes, int n, int* band) {
  *band = -1;
  if (bytes > w.slot_bytes()) return 2;
  const std::size_t peer_bytes = bytes * static_cast<std::size_t>(n - 1);
  const int fixed = w.allreduce_handoffs();
  if (fixed != 0 && peer_bytes <= HandoffChooser::kChooseUpTo) return fixed;
  if (w.oversubscribed()) return bytes <= kOneOversubscribed ? 1 : 2;
  if (peer_bytes <= HandoffChooser::kOneUpTo) return 1;
  *band = HandoffChooser::band(peer_bytes);
  return *band < 0 ? 2 : 0;
}

// Where a streamed call's share is reduced before one pass streams it to
// the slot and the output (slot_stores.hpp); a chunk's share at most.
struct ShareScratch {
  std::vector<std::byte> bytes;
};

// Elements reduced and pushed at a time on the direct path: the reduced
// block is still in L1 when it is copied out to the peers.
constexpr std::size_t kPushBlockBytes = 16 << 10;

// The direct all-reduce through cross-memory attach (heap buffers of
// processes): the same shares, order and kernel as run_direct's mapped
// case, so the same bits; per rank its share of every peer's input read
// and its share's result written to every peer's output, one kernel copy
// each. In place is safe for the same reason (only rank r touches share r).
Status run_direct_cma(Group& g, const CollArgs& a, const shm::PeerBuffers& pb) {
  const int n = g.size(), me = g.rank();
  const std::size_t es = a.elem_size(), line = shm::line_elems(es);
  const shm::Shares sh{a.count, line, n};
  const std::size_t first = sh.off(me), m = sh.size(me);
  const std::size_t B = std::max(line, shm::kCmaBlockBytes / es / line * line);
  auto& scratch = g.shm()->local_state<ShareScratch>().bytes;
  std::vector<const void*> srcs;
  auto* out = static_cast<std::byte*>(a.recvbuf);
  for (std::size_t o = 0; o < m; o += B) {
    const std::size_t at = (first + o) * es, bytes = std::min(B, m - o) * es;
    if (Status st = shm::read_sources(g, pb, at, bytes, B * es, scratch, srcs); !st.ok()) return st;
    shm::reduce_divided(out + at, srcs, bytes / es, a.dt, a.op, a.divisor);
    for (int q = 0; q < n; ++q) {
      if (q == me) continue;
      if (Status st = shm::peer_write(g, pb, q, pb.recv[static_cast<std::size_t>(q)] + at, out + at, bytes);
          !st.ok()) {
        return st;
      }
    }
  }
  return {};
}

void run_direct(Group& g, const CollArgs& a, const shm::PeerBuffers& pb) {
  const int n = g.size(), me = g.rank();
  const std::size_t es = a.elem_size(), line = shm::line_elems(es);
  const shm::Shares sh{a.count, line, n};
  const std::size_t first = sh.off(me), m = sh.size(me);
  const std::size_t B = std::max(line, kPushBlockBytes / es / line * line);
  // Two ranks: the result goes to the peer's output in the reduce's own pass
  // (reduce_many_copy stores each vector twice), with ordinary stores: in
  // place, the peer's lines were just read into this cache (a streamed copy
  // after the reduce took 1.4-1.9x as long at 16-64 MB). Out of place, once
  // the node's buffers pass twice the last-level cache, both outputs are
  // streamed instead, in the same pass (kernels::reduce_many_stream;
  // otherwise from an L1 block): ordinary stores read every output line for
  // ownership first, and the 64 MB call took 15-16 ms against 8 streamed
  // (shm::stream_reduced). More ranks: the block is reduced in L1 and
  // copied to each peer, streamed for large calls (with 4 ranks on 2 cores,
  // the one-pass store to one of them measured 1.1-1.4x slower at 1-64 MB
  // out of place), and then to this rank's own output too (4 ranks, 64 and
  // 256 MB: 20.1-24.2 -> 18.8-19.5 ms and 77-86 -> 73.5-74.6 ms).
  const bool pair = n == 2;
  const bool in_place = a.sendbuf == a.recvbuf;
  const std::size_t whole = a.count * es;
  auto push = shm::stream_outputs(g, in_place ? 0 : whole, whole) ? shm::copy_stream : shm::copy;
  const bool streamed =
      !in_place && (pair ? shm::stream_reduced(g, std::uint64_t{4} * whole) : push == shm::copy_stream);
  alignas(64) std::byte block[kPushBlockBytes];  // a streamed call's reduced block, in L1
  std::vector<const void*> srcs(static_cast<std::size_t>(n));
  for (std::size_t o = 0; o < m; o += B) {
    const std::size_t at = (first + o) * es, bytes = std::min(B, m - o) * es;
    for (int q = 0; q < n; ++q) srcs[static_cast<std::size_t>(q)] = pb.send[static_cast<std::size_t>(q)] + at;
    std::byte* mine = pb.recv[static_cast<std::size_t>(me)] + at;
    if (streamed) {
      if (pair && a.divisor == 1 &&
          kernels::reduce_many_stream(mine, pb.recv[static_cast<std::size_t>(1 - me)] + at, srcs, bytes / es, a.dt,
                                      a.op, true)) {
        continue;
      }
      shm::reduce_divided(block, srcs, bytes / es, a.dt, a.op, a.divisor);
      for (int q = 0; q < n; ++q) shm::copy_stream(pb.recv[static_cast<std::size_t>(q)] + at, block, bytes);
      continue;
    }
    if (pair && a.divisor == 1) {
      kernels::reduce_many_copy(mine, pb.recv[static_cast<std::size_t>(1 - me)] + at, srcs, bytes / es, a.dt, a.op);
      continue;
    }
    shm::reduce_divided(mine, srcs, bytes / es, a.dt, a.op, a.divisor);
    if (pair) {
      shm::copy(pb.recv[static_cast<std::size_t>(1 - me)] + at, mine, bytes);
      continue;
    }
    for (int q = 0; q < n; ++q) {
      if (q != me) push(pb.recv[static_cast<std::size_t>(q)] + at, mine, bytes);
    }
  }
}

Status run(Group& g, const CollArgs& a) {
  if (a.count == 0) return {};
  const std::size_t whole = a.count * a.elem_size();
  bool ran = false;
  Status direct = shm::run_if_direct(
      g, a, whole, whole, whole, &ran,
      [&](const auto&, const auto& pb) {
        if (pb.cma) return run_direct_cma(g, a, pb);
        run_direct(g, a, pb);
        return Status{};
      },
      true, a.sendbuf == a.recvbuf || shm::cma_out_of_place(g, whole, whole));
  if (!direct.ok() || ran) return direct;
  detail::ShmWindow& w = *g.shm();
  const int n = g.size(), me = g.rank();
  const std::size_t es = a.elem_size(), bytes = a.count * es;
  const auto* src = static_cast<const std::byte*>(a.sendbuf);
  auto* dst = static_cast<std::byte*>(a.recvbuf);
  const auto sig = shm::call_sig(g, a, a.count);
  std::vector<const void*> srcs(static_cast<std::size_t>(n));

  int band = -1;
  int hand_offs = fixed_handoffs(w, bytes, n, &band);
  // A timed call: rank 0 sends its choices with it (before publishing stage
  // 0), every rank takes them after its first wait (stage 1 of chunk 0).
  HandoffChooser* chooser = hand_offs == 0 ? &w.local_state<HandoffChooser>() : nullptr;
  if (chooser != nullptr) hand_offs = chooser->handoffs(band);
  auto exchange_choices = [&](std::uint64_t slot, int t) {
    if (chooser == nullptr) return;
    if (t == 0 && me == 0) w.set_call_hint(slot, chooser->wanted());
    if (t == 1) chooser->take(w.call_hint(0, slot));
  };
  const std::uint64_t start = chooser != nullptr && me == 0 ? shm::ticks() : 0;
  auto timed = [&](Status st) {
    if (st.ok() && chooser != nullptr && me == 0) chooser->record(band, hand_offs, shm::ticks() - start);
    return st;
  };

  if (hand_offs == 1) {
    auto body = [&](std::size_t, std::uint64_t slot, int t) {
      exchange_choices(slot, t);
      if (t == 0) {
        shm::copy(w.slot(me, slot), src, bytes);
      } else {
        for (int q = 0; q < n; ++q) srcs[static_cast<std::size_t>(q)] = w.slot(q, slot);
        shm::reduce_divided(dst, srcs, a.count, a.dt, a.op, a.divisor);
      }
    };
    return timed(shm::run_pipeline(g, sig, 1, 2, body, [](int) { return shm::Deps::all(); }, "all_reduce"));
  }

  // Chunk: C elements, a slot or less (shm::chunk_bytes). My share's part
  // of my slot is not staged (nobody else reads my input there); it holds
  // my share's result instead.
  const std::size_t unit = shm::line_elems(es) * static_cast<std::size_t>(n);
  const bool stream = shm::stream_outputs(g, a.sendbuf == a.recvbuf ? 0 : bytes, bytes);
  const std::size_t C = std::max(unit, shm::chunk_bytes(w, stream, bytes, shm::ChunkUse::reduce) / es / unit * unit);
  const std::size_t chunks = (a.count + C - 1) / C;
  auto out_copy = stream ? shm::copy_stream : shm::copy;
  // Through memory, my share's result is streamed to my slot and my output:
  // by the reduce itself where kernels::reduce_many_stream applies, otherwise
  // in one pass from a buffer of this process the reduce writes in the
  // cache. (The hand-off chooser's calls send their own hint.)
  shm::SlotStoreCall stores(g, sig, a.sendbuf == a.recvbuf, bytes, stream && chooser == nullptr);
  std::byte* result = nullptr;  // the two-pass buffer, taken when first needed
  bool own_fused = false;       // this chunk's share already streamed to the output

  auto body = [&](std::size_t c, std::uint64_t slot, int t) {
    const std::size_t first = c * C, len = std::min(C, a.count - first);
    const shm::Shares sh{len, shm::line_elems(es), n};
    const std::size_t off = sh.off(me), m = sh.size(me);
    std::byte* mine = w.slot(me, slot);
    exchange_choices(slot, t);
    stores.at_stage(c, slot, t);
    if (t == 0) {
      stores.to_slot(mine, src + first * es, off * es);
      stores.to_slot(mine + (off + m) * es, src + (first + off + m) * es, (len - off - m) * es);
    } else if (t == 1) {
      own_fused = false;
      if (m == 0) return;
      for (int q = 0; q < n; ++q) {
        srcs[static_cast<std::size_t>(q)] = q == me ? src + (first + off) * es : w.slot(q, slot) + off * es;
      }
      // The reduce's own pass streams the share out only where nothing
      // (avg's division) comes between the sum and the copies.
      const bool fuse = a.divisor == 1;
      if (stores.memory()) {
        if (!fuse || !kernels::reduce_many_stream(mine + off * es, dst + (first + off) * es, srcs, m, a.dt, a.op)) {
          if (result == nullptr) {
            auto& scratch = w.local_state<ShareScratch>().bytes;
            if (scratch.size() < C * es) scratch.resize(C * es);
            result = scratch.data();
          }
          shm::reduce_divided(result, srcs, m, a.dt, a.op, a.divisor);
          shm::copy_and_stream(mine + off * es, dst + (first + off) * es, result, m * es, true);
        }
      } else {
        // Through the cache: the slot by ordinary stores, a streamed output
        // in the reduce's own pass where a kernel does that.
        own_fused = fuse && stream &&
                    kernels::reduce_many_stream(mine + off * es, dst + (first + off) * es, srcs, m, a.dt, a.op,
                                                false);
        if (!own_fused) {
          shm::reduce_divided(mine + off * es, srcs, m, a.dt, a.op, a.divisor);
        }
      }
    } else {
      for (int q = 0; q < n; ++q) {
        if (q == me || sh.size(q) == 0) continue;
        out_copy(dst + (first + sh.off(q)) * es, w.slot(q, slot) + sh.off(q) * es, sh.size(q) * es);
      }
    }
  };
  // My share's result to my output once the peers can read it from my slot.
  auto own = [&](std::size_t c, std::uint64_t slot, int t) {
    if (t != 1 || stores.memory() || own_fused) return;
    const std::size_t first = c * C, len = std::min(C, a.count - first);
    const shm::Shares sh{len, shm::line_elems(es), n};
    const std::size_t off = sh.off(me), m = sh.size(me);
    if (m != 0) out_copy(dst + (first + off) * es, w.slot(me, slot) + off * es, m * es);
  };
  return stores.finish(
      timed(shm::run_pipeline(g, sig, chunks, 3, body, [](int) { return shm::Deps::all(); }, "all_reduce", own)));
}

bool supports(const Group& g, const CollArgs&) { return g.shm() != nullptr; }

}  // namespace

extern const AlgorithmDesc allreduce_shm;
const AlgorithmDesc allreduce_shm = {
    CollKind::all_reduce, "shm",
    "node-local shared memory: chunks reduced by share owners straight from the peers' slots", supports,
    shm::timing_heap_path<run>, true};

}  // namespace cclz::coll
