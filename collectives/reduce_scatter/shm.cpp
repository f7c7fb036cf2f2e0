// Node-local reduce-scatter over the shared-memory window (see
// shm_pipeline.hpp). Chunk by chunk: (0) each rank copies the chunk's piece
// of every other rank's block into its slot; (1) each rank reduces its own
// block's piece over its input and the n-1 peers' slots, in rank order,
// straight into its output. Each output
// element is reduced once by its owner, so the result does not depend on
// timing. Also the intra-node phase of the hierarchical all-reduce (with
// blocks that differ by one element).
//
// avg (CollArgs::divisor): each rank divides its block's piece right after
// reducing it, while it is in the cache, instead of the communicator's
// pass over the output afterwards; kernels::divide on the sum, the same
// bits.
//
// Cost: 2 stages per chunk, chunks = block bytes / (slot / n); per rank the
// input is read once ((n-1)/n of it staged) and the output written once,
// the rest stays in the shared cache.
//
// Large calls whose buffers every rank can read in place (shm_direct.hpp)
// skip the slots: each rank reduces its block straight from the n inputs,
// in rank order, into its output (bitwise the staged result); 3 hand-offs.
// Out of place past twice the cache the output is streamed
// (shm::stream_reduced).
#include "shm_direct.hpp"
#include "shm_pipeline.hpp"

namespace cclz::coll {

Status shm::reduce_scatter(Group& g, const detail::ShmWindow::CallSig& sig, const void* src, void* mine,
                           const allreduce_impl::BlockLayout& layout, DataType dt, ReduceOp op, int divisor) {
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
      shm::reduce_divided(out + c * C * es, srcs, m, dt, op, divisor);
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
  const bool in_place = a.recvbuf == static_cast<const std::byte*>(a.sendbuf) + static_cast<std::size_t>(me) * block;
  const auto node = static_cast<std::uint64_t>(n) * (static_cast<std::uint64_t>(n) + 1) * block;
  const bool stream = !in_place && shm::stream_reduced(g, node);
  (stream ? shm::reduce_divided_stream : shm::reduce_divided)(a.recvbuf, srcs, a.count, a.dt, a.op, a.divisor);
}

// Where the cross-memory attach path reads the peers' pieces.
struct CmaScratch {
  std::vector<std::byte> bytes;
};

// run_direct through cross-memory attach (heap buffers of processes): each
// peer's part of my block is read, shm::kCmaBlockBytes at a time, into a
// buffer here and reduced with my input's part into my output: the same
// sources, order and kernel, so the same bits. Peers read only their own
// blocks of my input, so in place (my output is my block of my input) is
// safe. Only where shm::cma_out_of_place allows it, in place too: past
// its cap the kernel read the peers' inputs from memory slower than the
// staged path's copies (2 ranks, 64 MB: 11.7-12.6 against 10.6 ms), except
// where rank 0 measures the two.
Status run_direct_cma(Group& g, const CollArgs& a, const shm::PeerBuffers& pb) {
  const std::size_t es = a.elem_size(), block = a.count * es;
  const std::size_t B = std::max<std::size_t>(1, shm::kCmaBlockBytes / es);
  auto& scratch = g.shm()->local_state<CmaScratch>().bytes;
  std::vector<const void*> srcs;
  auto* out = static_cast<std::byte*>(a.recvbuf);
  for (std::size_t o = 0; o < a.count; o += B) {
    const std::size_t m = std::min(B, a.count - o), at = static_cast<std::size_t>(g.rank()) * block + o * es;
    if (Status st = shm::read_sources(g, pb, at, m * es, B * es, scratch, srcs); !st.ok()) return st;
    shm::reduce_divided(out + o * es, srcs, m, a.dt, a.op, a.divisor);
  }
  return {};
}

Status run(Group& g, const CollArgs& a) {
  if (a.count == 0) return {};
  const std::size_t in_bytes = a.count * a.elem_size() * static_cast<std::size_t>(g.size());
  bool ran = false;
  Status direct = shm::run_if_direct(
      g, a, in_bytes, in_bytes, 0, &ran,
      [&](const auto&, const auto& pb) {
        if (pb.cma) return run_direct_cma(g, a, pb);
        run_direct(g, a, pb);
        return Status{};
      },
      true, shm::cma_out_of_place(g, in_bytes, a.count * a.elem_size()));
  if (!direct.ok() || ran) return direct;
  const allreduce_impl::BlockLayout layout{a.count * static_cast<std::size_t>(g.size()), g.size()};
  return shm::reduce_scatter(g, shm::call_sig(g, a, a.count), a.sendbuf, a.recvbuf, layout, a.dt, a.op, a.divisor);
}

bool supports(const Group& g, const CollArgs&) { return g.shm() != nullptr; }

}  // namespace

extern const AlgorithmDesc reduce_scatter_shm;
const AlgorithmDesc reduce_scatter_shm = {
    CollKind::reduce_scatter, "shm", "node-local shared memory: each rank reduces its block from the peers' slots",
    supports, shm::timing_heap_path<run>, true};

}  // namespace cclz::coll
