// Node-local reduce over the shared-memory window (see shm_pipeline.hpp).
// Up to kReduceOneHandoffMaxBytes (256 KiB; shm_direct.hpp), one hand-off:
// every rank copies its input into its slot and the root reduces all slots
// in rank order into its output; its one wait beat the share path's two
// at every size measured up to there, on 2-8 ranks (docs/performance-log.md,
// "A Zen 5 host": 2 bound ranks 64 KiB 9.2-9.7 -> 5.2-5.3 us). Larger, chunk by chunk:
// (0) copy the chunk except my 1/n share into my slot; (1) reduce my share
// over my input and the n-1 peers' slots into my slot (where my share was not
// staged); (2) the root copies every share's result into its output. The
// same shares and order as the all-reduce, so both give the same bits.
//
// avg (CollArgs::divisor): whoever reduces a share divides it right after,
// while it is in the cache (in a call of one hand-off, the root, which
// reduces it all), and the root's output gets no pass afterwards;
// kernels::divide on the sum, the same bits.
//
// Cost: 2 or 3 stages per chunk, chunks = bytes / slot.
//
// Direct path (shm_direct.hpp): each rank reduces its share straight from
// the n inputs into the root's output (the same shares and rank order, so
// the same bits), one pass with no staging copies and no gather. Heap
// buffers of processes do the same through cross-memory attach: each rank
// reads its share of every peer's input a block at a time and reduces it;
// the root into its output, the others into a buffer written on into the
// root's output (process_vm_writev), where shm::cma_out_of_place allows
// it.
#include "allreduce/common.hpp"
#include "shm_direct.hpp"
#include "shm_pipeline.hpp"

namespace cclz::coll {
namespace {

// My share of the result, reduced from every rank's input into the root's
// output. Only I touch that range of any buffer: in place at the root is safe.
// Out of place past twice the cache the share is streamed there
// (shm::stream_reduced).
void run_direct(Group& g, const CollArgs& a, const shm::PeerBuffers& pb) {
  const int n = g.size(), me = g.rank();
  const std::size_t es = a.elem_size();
  const shm::Shares sh{a.count, shm::line_elems(es), n};
  const std::size_t off = sh.off(me), m = sh.size(me);
  if (m == 0) return;
  std::vector<const void*> srcs(static_cast<std::size_t>(n));
  for (int q = 0; q < n; ++q) srcs[static_cast<std::size_t>(q)] = pb.send[static_cast<std::size_t>(q)] + off * es;
  std::byte* out = pb.recv[static_cast<std::size_t>(a.root)] + off * es;
  const bool in_place = pb.recv[static_cast<std::size_t>(a.root)] == pb.send[static_cast<std::size_t>(a.root)];
  const bool stream = !in_place && shm::stream_reduced(g, static_cast<std::uint64_t>(n + 1) * a.count * es);
  (stream ? shm::reduce_divided_stream : shm::reduce_divided)(out, srcs, m, a.dt, a.op, a.divisor);
}

// Where run_direct_cma reads the peers' parts of a block and a non-root
// rank keeps its result before writing it to the root.
struct CmaScratch {
  std::vector<std::byte> sources, result;
};

// run_direct through cross-memory attach: the same shares, order and
// kernel, so the same bits. Only rank r reads or writes share r of any
// buffer, so the root in place is safe.
Status run_direct_cma(Group& g, const CollArgs& a, const shm::PeerBuffers& pb) {
  const int n = g.size(), me = g.rank(), root = a.root;
  const std::size_t es = a.elem_size(), line = shm::line_elems(es);
  const shm::Shares sh{a.count, line, n};
  const std::size_t first = sh.off(me), m = sh.size(me);
  const std::size_t B = std::max(line, shm::kCmaBlockBytes / es / line * line);
  auto& scratch = g.shm()->local_state<CmaScratch>();
  if (me != root && scratch.result.size() < B * es) scratch.result.resize(B * es);
  std::vector<const void*> srcs;
  for (std::size_t o = 0; o < m; o += B) {
    const std::size_t at = (first + o) * es, len = std::min(B, m - o) * es;
    if (Status st = shm::read_sources(g, pb, at, len, B * es, scratch.sources, srcs); !st.ok()) return st;
    if (me == root) {
      shm::reduce_divided(static_cast<std::byte*>(a.recvbuf) + at, srcs, len / es, a.dt, a.op, a.divisor);
      continue;
    }
    shm::reduce_divided(scratch.result.data(), srcs, len / es, a.dt, a.op, a.divisor);
    const auto r = static_cast<std::size_t>(root);
    if (Status st = shm::peer_write(g, pb, root, pb.recv[r] + at, scratch.result.data(), len); !st.ok()) return st;
  }
  return {};
}

Status run(Group& g, const CollArgs& a) {
  if (a.count == 0) return {};
  const int n = g.size(), me = g.rank(), root = a.root;
  const std::size_t es = a.elem_size(), bytes = a.count * es;
  bool ran = false;
  Status direct = shm::run_if_direct(
      g, a, bytes, bytes, me == root ? bytes : 0, &ran,
      [&](const auto&, const auto& pb) {
        if (pb.cma) return run_direct_cma(g, a, pb);
        run_direct(g, a, pb);
        return Status{};
      },
      true, shm::cma_out_of_place(g, bytes, bytes));
  if (!direct.ok() || ran) return direct;
  detail::ShmWindow& w = *g.shm();
  const auto* src = static_cast<const std::byte*>(a.sendbuf);
  auto* dst = static_cast<std::byte*>(a.recvbuf);
  const auto sig = shm::call_sig(g, a, a.count);
  std::vector<const void*> srcs(static_cast<std::size_t>(n));
  // Non-roots wait for nobody after copying in: only the root reads.
  auto root_waits = [&](int) { return me == root ? shm::Deps::all() : shm::Deps::none(); };

  if (bytes <= shm::kReduceOneHandoffMaxBytes && bytes <= w.slot_bytes()) {
    auto body = [&](std::size_t, std::uint64_t slot, int t) {
      if (t == 0) {
        shm::copy(w.slot(me, slot), src, bytes);
      } else if (me == root) {
        for (int q = 0; q < n; ++q) srcs[static_cast<std::size_t>(q)] = w.slot(q, slot);
        shm::reduce_divided(dst, srcs, a.count, a.dt, a.op, a.divisor);
      }
    };
    return shm::run_pipeline(g, sig, 1, 2, body, root_waits, "reduce");
  }

  const std::size_t unit = shm::line_elems(es) * static_cast<std::size_t>(n);
  const std::size_t C = std::max(unit, w.slot_bytes() / es / unit * unit);
  const std::size_t chunks = (a.count + C - 1) / C;
  auto body = [&](std::size_t c, std::uint64_t slot, int t) {
    const std::size_t first = c * C, len = std::min(C, a.count - first);
    const shm::Shares sh{len, shm::line_elems(es), n};
    const std::size_t off = sh.off(me), m = sh.size(me);
    std::byte* mine = w.slot(me, slot);
    if (t == 0) {
      shm::copy(mine, src + first * es, off * es);
      shm::copy(mine + (off + m) * es, src + (first + off + m) * es, (len - off - m) * es);
    } else if (t == 1) {
      if (m == 0) return;
      for (int q = 0; q < n; ++q) {
        srcs[static_cast<std::size_t>(q)] = q == me ? src + (first + off) * es : w.slot(q, slot) + off * es;
      }
      shm::reduce_divided(mine + off * es, srcs, m, a.dt, a.op, a.divisor);
    } else if (me == root) {
      for (int q = 0; q < n; ++q) {
        if (sh.size(q) != 0) {
          shm::copy(dst + (first + sh.off(q)) * es, w.slot(q, slot) + sh.off(q) * es, sh.size(q) * es);
        }
      }
    }
  };
  // Stage 1 reads every slot; stage 2 only the root reads the results.
  auto deps = [&](int t) { return t == 1 ? shm::Deps::all() : root_waits(t); };
  return shm::run_pipeline(g, sig, chunks, 3, body, deps, "reduce");
}

bool supports(const Group& g, const CollArgs&) { return g.shm() != nullptr; }

}  // namespace

extern const AlgorithmDesc reduce_shm;
const AlgorithmDesc reduce_shm = {
    CollKind::reduce, "shm", "node-local shared memory: shares reduced from the peers' slots, gathered by the root",
    supports, shm::timing_heap_path<run>, true};

}  // namespace cclz::coll
