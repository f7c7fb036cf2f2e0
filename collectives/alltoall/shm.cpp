// Node-local all-to-all over the shared-memory window (see
// shm_pipeline.hpp). Chunk by chunk: (0) each rank copies the chunk's piece
// of its block for every peer into its slot, publishes, then copies its own
// block's piece straight to its output; (1) each rank copies the piece
// addressed to it from every peer's slot into its output. In place works too: stage 1 of a
// chunk overwrites only what stage 0 of that chunk has already copied.
//
// Large out-of-place calls skip the slots (shm_direct.hpp): each rank
// copies its block straight from every peer's input into its output, one
// copy per byte: from the peers' buffers mapped here where every rank's can
// be, otherwise (heap memory) through cross-memory attach. (In place, a rank
// would overwrite blocks its peers have yet to read.)
//
// Cost: 2 stages per chunk, chunks = block bytes / (slot / n); per rank the
// input read once and the output written once. Direct: 3 hand-offs, one copy.
#include "shm_direct.hpp"
#include "shm_pipeline.hpp"

namespace cclz::coll {
namespace {

// The peers' blocks; this rank's own block goes across in own_block().
Status run_direct(Group& g, const CollArgs& a, const shm::PeerBuffers& pb) {
  const int n = g.size(), me = g.rank();
  const std::size_t block = a.count * a.elem_size();
  auto* out = static_cast<std::byte*>(a.recvbuf);
  const std::size_t bytes = block * static_cast<std::size_t>(n);
  auto out_copy = shm::stream_outputs(g, bytes, bytes) ? shm::copy_stream : shm::copy;
  for (int k = 1; k < n; ++k) {
    const int q = (me + k) % n;
    std::byte* to = out + static_cast<std::size_t>(q) * block;
    const std::byte* from = pb.send[static_cast<std::size_t>(q)] + static_cast<std::size_t>(me) * block;
    if (pb.cma) {
      if (Status st = shm::peer_read(g, pb, q, to, from, block); !st.ok()) return st;
    } else {
      out_copy(to, from, block);
    }
  }
  return {};
}

// Half 0 or 1 of this rank's own block, straight across (run_if_direct's
// `own`).
void own_block(Group& g, const CollArgs& a, int half) {
  const std::size_t block = a.count * a.elem_size(), at = static_cast<std::size_t>(g.rank()) * block;
  const std::size_t bytes = block * static_cast<std::size_t>(g.size());
  shm::copy_own_half(static_cast<std::byte*>(a.recvbuf) + at, static_cast<const std::byte*>(a.sendbuf) + at, block,
                     half, shm::stream_outputs(g, bytes, bytes));
}

Status run(Group& g, const CollArgs& a) {
  if (a.count == 0) return {};
  if (a.sendbuf != a.recvbuf) {
    const std::size_t bytes = a.count * a.elem_size() * static_cast<std::size_t>(g.size());
    bool ran = false;
    Status direct = shm::run_if_direct(
        g, a, bytes, bytes, 0, &ran, [&](const auto&, const auto& pb) { return run_direct(g, a, pb); }, true,
        shm::cma_out_of_place(g, bytes, bytes), [&](int half) { own_block(g, a, half); });
    if (!direct.ok() || ran) return direct;
  }
  detail::ShmWindow& w = *g.shm();
  const int n = g.size(), me = g.rank();
  const std::size_t es = a.elem_size(), unit = shm::line_elems(es);
  std::size_t C = w.slot_bytes() / static_cast<std::size_t>(n) / es;
  C = std::max(unit, C / unit * unit);
  const std::size_t chunks = (a.count + C - 1) / C;
  const auto* in = static_cast<const std::byte*>(a.sendbuf);
  auto* out = static_cast<std::byte*>(a.recvbuf);
  const std::size_t bytes = a.count * es * static_cast<std::size_t>(n);
  const bool stream = shm::stream_outputs(g, in == out ? 0 : bytes, bytes);
  auto out_copy = stream ? shm::copy_stream : shm::copy;
  const auto sig = shm::call_sig(g, a, a.count);
  shm::SlotStoreCall stores(g, sig, in == out, bytes, stream);
  auto body = [&](std::size_t c, std::uint64_t slot, int t) {
    stores.at_stage(c, slot, t);
    const std::size_t first = c * C, m = std::min(C, a.count - first);
    for (int q = 0; q < n; ++q) {
      if (q == me) continue;
      const std::size_t block = static_cast<std::size_t>(q) * a.count;
      if (t == 0) {
        stores.to_slot(w.slot(me, slot) + static_cast<std::size_t>(q) * C * es, in + (block + first) * es, m * es);
      } else {
        out_copy(out + (block + first) * es, w.slot(q, slot) + static_cast<std::size_t>(me) * C * es, m * es);
      }
    }
  };
  // My own block goes straight across once my slot is published (in place
  // it is already there).
  auto own = [&](std::size_t c, std::uint64_t, int t) {
    if (t != 0 || in == out) return;
    const std::size_t first = c * C, m = std::min(C, a.count - first),
                      block = static_cast<std::size_t>(me) * a.count;
    out_copy(out + (block + first) * es, in + (block + first) * es, m * es);
  };
  return stores.finish(
      shm::run_pipeline(g, sig, chunks, 2, body, [](int) { return shm::Deps::all(); }, "all_to_all", own));
}

bool supports(const Group& g, const CollArgs&) { return g.shm() != nullptr; }

}  // namespace

extern const AlgorithmDesc alltoall_shm;
const AlgorithmDesc alltoall_shm = {CollKind::all_to_all, "shm",
                                    "node-local shared memory: every rank copies its blocks from the peers' slots",
                                    supports, shm::timing_heap_path<run>};

}  // namespace cclz::coll
