// Node-local all-gather over the shared-memory window (see
// shm_pipeline.hpp). Chunk by chunk: (0) each rank copies its block's chunk
// into its slot, publishes, then copies it to its own place in its output
// (a streamed output: in the same pass as the slot, before publishing, so
// the input is read once); (1) each rank copies every peer's chunk from the
// peer's slot into its output. Also the last phase of the hierarchical
// all-reduce.
//
// Large calls whose buffers every rank can read in place (shm_direct.hpp)
// skip the slots: each rank copies every rank's block straight from its
// input into its output, one copy per byte.
//
// Cost: 2 stages per chunk, chunks = block bytes / chunk (a slot or less,
// shm::chunk_bytes); per rank one block read and the whole output written
// once. Direct: 3 hand-offs, one copy.
#include "shm_direct.hpp"
#include "shm_pipeline.hpp"

namespace cclz::coll {

Status shm::all_gather(Group& g, const detail::ShmWindow::CallSig& sig, const void* mine, void* dst,
                       const allreduce_impl::BlockLayout& layout, std::size_t es) {
  detail::ShmWindow& w = *g.shm();
  const int n = g.size(), me = g.rank();
  const std::size_t unit = line_elems(es);
  const auto* in = static_cast<const std::byte*>(mine);
  auto* out = static_cast<std::byte*>(dst);
  const bool own_in_place = in == out + layout.off(me) * es;
  const std::size_t block_max = layout.max_len();
  if (block_max == 0) return {};
  const bool stream = stream_outputs(g, own_in_place ? 0 : layout.len(me) * es, layout.count * es);
  std::size_t C = chunk_bytes(w, stream, block_max * es, ChunkUse::copy) / es;
  C = std::max(unit, C / unit * unit);
  const std::size_t chunks = (block_max + C - 1) / C;
  auto out_copy = stream ? copy_stream : copy;
  // Small outputs publish first and copy their own block after: the input
  // is still in the cache then, and the peers start a copy earlier.
  const bool own_with_slot = stream && !own_in_place;
  auto piece = [&](int q, std::size_t c) {
    const std::size_t len = layout.len(q), first = std::min(len, c * C);
    return std::min(C, len - first);
  };
  SlotStoreCall stores(g, sig, own_in_place, layout.count * es, stream);
  auto body = [&](std::size_t c, std::uint64_t slot, int t) {
    stores.at_stage(c, slot, t);
    if (t == 0) {
      const std::size_t m = piece(me, c);
      if (m != 0 && own_with_slot) {
        copy_and_stream(w.slot(me, slot), out + (layout.off(me) + c * C) * es, in + c * C * es, m * es,
                        stores.memory());
      } else if (m != 0) {
        stores.to_slot(w.slot(me, slot), in + c * C * es, m * es);
      }
    } else {
      for (int q = 0; q < n; ++q) {
        const std::size_t m = piece(q, c);
        if (q != me && m != 0) out_copy(out + (layout.off(q) + c * C) * es, w.slot(q, slot), m * es);
      }
    }
  };
  // My own block goes to its place in my output once my slot is published.
  auto own = [&](std::size_t c, std::uint64_t, int t) {
    const std::size_t m = piece(me, c);
    if (t != 0 || m == 0 || own_in_place || own_with_slot) return;
    out_copy(out + (layout.off(me) + c * C) * es, in + c * C * es, m * es);
  };
  return stores.finish(run_pipeline(g, sig, chunks, 2, body, [](int) { return Deps::all(); }, "all_gather", own));
}

namespace {

Status run_direct(Group& g, const CollArgs& a, const shm::PeerBuffers& pb) {
  const int n = g.size(), me = g.rank();
  const std::size_t block = a.count * a.elem_size();
  auto* out = static_cast<std::byte*>(a.recvbuf);
  auto out_copy = shm::stream_outputs(g, block, block * static_cast<std::size_t>(n)) ? shm::copy_stream : shm::copy;
  if (pb.cma) {
    // One kernel copy per peer block, straight into the output.
    for (int k = 1; k < n; ++k) {
      const int q = (me + k) % n;
      Status st = shm::peer_read(g, pb, q, out + static_cast<std::size_t>(q) * block,
                                 pb.send[static_cast<std::size_t>(q)], block);
      if (!st.ok()) return st;
    }
    return {};  // this rank's own block: own_block() in run()
  }
  // The ranks go through the blocks piece by piece (a slot's worth) at
  // about the same pace, each copying its own block's piece first: the
  // peers copy that piece a moment later and find it in the shared cache,
  // so each input byte is read from memory about once.
  const std::size_t piece = g.shm()->slot_bytes();
  for (std::size_t first = 0; first < block; first += piece) {
    const std::size_t len = std::min(piece, block - first);
    for (int k = 0; k < n; ++k) {
      const int q = (me + k) % n;
      std::byte* to = out + static_cast<std::size_t>(q) * block + first;
      const std::byte* from = pb.send[static_cast<std::size_t>(q)] + first;
      if (to != from) out_copy(to, from, len);
    }
  }
  return {};
}

Status run(Group& g, const CollArgs& a) {
  if (a.count == 0) return {};
  const std::size_t block = a.count * a.elem_size();
  bool ran = false, mapped = false;
  // This rank's own block, a half at a time (run_if_direct's `own`), where
  // the peers' buffers are not mapped: run_direct copies it there itself,
  // interleaved with the peers' blocks.
  auto own_block = [&](int half) {
    const int n = g.size(), me = g.rank();
    std::byte* mine = static_cast<std::byte*>(a.recvbuf) + static_cast<std::size_t>(me) * block;
    if (mapped || mine == a.sendbuf) return;
    const bool stream = shm::stream_outputs(g, block, block * static_cast<std::size_t>(n));
    shm::copy_own_half(mine, a.sendbuf, block, half, stream);
  };
  Status direct = shm::run_if_direct(
      g, a, block * static_cast<std::size_t>(g.size()), block, 0, &ran,
      [&](const auto&, const auto& pb) {
        mapped = !pb.cma;
        return run_direct(g, a, pb);
      },
      true, shm::cma_out_of_place(g, block, block * static_cast<std::size_t>(g.size())), own_block);
  if (!direct.ok() || ran) return direct;
  const allreduce_impl::BlockLayout layout{a.count * static_cast<std::size_t>(g.size()), g.size()};
  return shm::all_gather(g, shm::call_sig(g, a, a.count), a.sendbuf, a.recvbuf, layout, a.elem_size());
}

bool supports(const Group& g, const CollArgs&) { return g.shm() != nullptr; }

}  // namespace

extern const AlgorithmDesc allgather_shm;
const AlgorithmDesc allgather_shm = {CollKind::all_gather, "shm",
                                     "node-local shared memory: every rank copies the peers' blocks from their slots",
                                     supports, shm::timing_heap_path<run>};

}  // namespace cclz::coll
