// Node-local reduce-scatter over the shared-memory window (see
// shm_pipeline.hpp). Chunk by chunk: (0) each rank copies the chunk's piece
// of every other rank's block into its slot; (1) each rank reduces its own
// block's piece over its input and the n-1 peers' slots, in rank order,
// straight into its output. Each output
// element is reduced once by its owner, so the result does not depend on
// timing. Also the intra-node phase of the hierarchical all-reduce (with
// blocks that differ by one element).
//
// Cost: 2 stages per chunk, chunks = block bytes / (slot / n); per rank the
// input is read once ((n-1)/n of it staged) and the output written once,
// the rest stays in the shared cache.
//
// Large calls whose buffers every rank can read in place (shm_direct.hpp)
// skip the slots: each rank reduces its block straight from the n inputs,
// in rank order, into its output (bitwise the staged result); 3 hand-offs.
#include "shm_direct.hpp"
#include "shm_pipeline.hpp"

namespace cclz::coll {

Status shm::reduce_scatter(Group& g, const detail::ShmWindow::CallSig& sig, const void* src, void* mine,
                           const allreduce_impl::BlockLayout& layout, DataType dt, ReduceOp op) {
  detail::ShmWindow& w = *g.shm();
  const int n = g.size(), me = g.rank();
  const std::size_t es = dtype_size(dt), unit = line_elems(es);
  std::size_t C = w.slot_bytes() / static_cast<std::size_t>(n) / es;
  C = std::max(unit, C / unit * unit);
  const std::size_t block_max = layout.max_len();
  if (block_max == 0) return {};
  const std::size_t chunks = (block_max + C - 1) / C;
  const auto* in = static_cast<const std::byte*>(src);
  auto* out = static_cast<std::byte*>(mine);
  std::vector<const void*> srcs(static_cast<std::size_t>(n));
  auto piece = [&](int q, std::size_t c) {
    const std::size_t len = layout.len(q), first = std::min(len, c * C);
    return std::min(C, len - first);
  };
  auto body = [&](std::size_t c, std::uint64_t slot, int t) {
    if (t == 0) {
      std::byte* s = w.slot(me, slot);
      for (int q = 0; q < n; ++q) {
        const std::size_t m = piece(q, c);
        if (q != me && m != 0) copy(s + static_cast<std::size_t>(q) * C * es, in + (layout.off(q) + c * C) * es, m * es);
      }
    } else {
      const std::size_t m = piece(me, c);
      if (m == 0) return;
      for (int p = 0; p < n; ++p) {
        srcs[static_cast<std::size_t>(p)] = p == me ? in + (layout.off(me) + c * C) * es
                                                    : w.slot(p, slot) + static_cast<std::size_t>(me) * C * es;
      }
      kernels::reduce_many(out + c * C * es, srcs, m, dt, op);
    }
  };
  return run_pipeline(g, sig, chunks, 2, body, [](int) { return Deps::all(); }, "reduce_scatter");
}

namespace {

void run_direct(Group& g, const CollArgs& a, const shm::PeerBuffers& pb) {
  const int n = g.size(), me = g.rank();
  const std::size_t block = a.count * a.elem_size();
  std::vector<const void*> srcs(static_cast<std::size_t>(n));
  for (int q = 0; q < n; ++q) {
    srcs[static_cast<std::size_t>(q)] = pb.send[static_cast<std::size_t>(q)] + static_cast<std::size_t>(me) * block;
  }
  kernels::reduce_many(a.recvbuf, srcs, a.count, a.dt, a.op);
}

Status run(Group& g, const CollArgs& a) {
  if (a.count == 0) return {};
  const std::size_t in_bytes = a.count * a.elem_size() * static_cast<std::size_t>(g.size());
  bool ran = false;
  Status direct = shm::run_if_direct(g, a, in_bytes, in_bytes, 0, &ran,
                                     [&](const auto&, const auto& pb) { run_direct(g, a, pb); });
  if (!direct.ok() || ran) return direct;
  const allreduce_impl::BlockLayout layout{a.count * static_cast<std::size_t>(g.size()), g.size()};
  return shm::reduce_scatter(g, shm::call_sig(g, a, a.count), a.sendbuf, a.recvbuf, layout, a.dt, a.op);
}

bool supports(const Group& g, const CollArgs&) { return g.shm() != nullptr; }

}  // namespace

extern const AlgorithmDesc reduce_scatter_shm;
const AlgorithmDesc reduce_scatter_shm = {
    CollKind::reduce_scatter, "shm", "node-local shared memory: each rank reduces its block from the peers' slots",
    supports, run};

}  // namespace cclz::coll
