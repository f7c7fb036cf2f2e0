// Node-local all-reduce over the shared-memory window (see shm_pipeline.hpp).
//
// Small buffers (see small_path): every rank copies its input into its slot,
// then reduces all n slots in rank order straight into its output: 2
// stages, one wait on the peers. Every rank applies the same kernel to the
// same operands in the same order, so results are bitwise identical.
//
// Larger buffers, chunk by chunk: (0) copy the chunk, except my 1/n share of
// it, into my slot; (1) reduce my share over my input and the n-1 peers'
// slots, in rank order, into my slot (where my share was not staged),
// publish, and copy it to my output; (2) copy the other shares' results
// into my output.
// Each share is reduced once, by its owner, and copied by the others:
// bitwise identical on every rank. Memory traffic per rank: the input read
// and the output written once each (the roofline's minimum); everything
// else stays in the shared cache, a slot being read a few microseconds
// after it was written. CPU work per rank: (n-1)/n of the buffer staged,
// 1/n reduced, (n-1)/n copied out.
//
// Cost: 2 (small) or 3 stages per chunk, chunks = bytes / slot.
#include "allreduce/common.hpp"
#include "shm_pipeline.hpp"

namespace cclz::coll {
namespace {

// The small path saves a hand-off but has every rank read all n-1 peers'
// whole buffers instead of 2(n-1)/n of one. With spinning waits a hand-off
// is cheap: on 2 bound ranks the large path was faster from 3 KB (16 KB:
// 1.57 against 2.72 us) and the small one only up to 2 KB; with more ranks
// than cores a hand-off may cost a context switch, and 4 ranks on 2 cores
// favoured the small path up to 16 KB and the large one from 32 KB
// (docs/performance.md).
constexpr std::size_t kSmallPeerBytes = 2 << 10;        // ranks fit the cores: bytes * (n-1)
constexpr std::size_t kSmallOversubscribed = 16 << 10;  // more ranks than cores: bytes

// Every rank of the window decides alike: the same bytes and geometry, and
// oversubscribed() comes from the rendezvous table they all share.
bool small_path(const detail::ShmWindow& w, std::size_t bytes, int n) {
  if (bytes > w.slot_bytes()) return false;
  if (w.oversubscribed()) return bytes <= kSmallOversubscribed;
  return bytes * static_cast<std::size_t>(n - 1) <= kSmallPeerBytes;
}
// Outputs larger than this are written with streaming stores: they would
// not stay in the cache anyway, and the slots should.
constexpr std::size_t kStreamBytes = 4 << 20;

Status run(Group& g, const CollArgs& a) {
  if (a.count == 0) return {};
  detail::ShmWindow& w = *g.shm();
  const int n = g.size(), me = g.rank();
  const std::size_t es = a.elem_size(), bytes = a.count * es;
  const auto* src = static_cast<const std::byte*>(a.sendbuf);
  auto* dst = static_cast<std::byte*>(a.recvbuf);
  const auto sig = shm::call_sig(g, a, a.count);
  std::vector<const void*> srcs(static_cast<std::size_t>(n));

  if (small_path(w, bytes, n)) {
    auto body = [&](std::size_t, std::uint64_t slot, int t) {
      if (t == 0) {
        shm::copy(w.slot(me, slot), src, bytes);
      } else {
        for (int q = 0; q < n; ++q) srcs[static_cast<std::size_t>(q)] = w.slot(q, slot);
        kernels::reduce_many(dst, srcs, a.count, a.dt, a.op);
      }
    };
    return shm::run_pipeline(g, sig, 1, 2, body, [](int) { return shm::Deps::all(); }, "all_reduce");
  }

  // Chunk: C elements, one slot. My share's part of my slot is not staged
  // (nobody else reads my input there); it holds my share's result instead.
  const std::size_t unit = shm::line_elems(es) * static_cast<std::size_t>(n);
  const std::size_t C = std::max(unit, w.slot_bytes() / es / unit * unit);
  const std::size_t chunks = (a.count + C - 1) / C;
  const bool stream = bytes > kStreamBytes;
  auto out_copy = stream ? shm::copy_stream : shm::copy;

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
      kernels::reduce_many(mine + off * es, srcs, m, a.dt, a.op);
    } else {
      for (int q = 0; q < n; ++q) {
        if (q == me || sh.size(q) == 0) continue;
        out_copy(dst + (first + sh.off(q)) * es, w.slot(q, slot) + sh.off(q) * es, sh.size(q) * es);
      }
    }
  };
  // My share's result to my output once the peers can read it from my slot.
  auto own = [&](std::size_t c, std::uint64_t slot, int t) {
    if (t != 1) return;
    const std::size_t first = c * C, len = std::min(C, a.count - first);
    const shm::Shares sh{len, shm::line_elems(es), n};
    const std::size_t off = sh.off(me), m = sh.size(me);
    if (m != 0) out_copy(dst + (first + off) * es, w.slot(me, slot) + off * es, m * es);
  };
  return shm::run_pipeline(g, sig, chunks, 3, body, [](int) { return shm::Deps::all(); }, "all_reduce", own);
}

bool supports(const Group& g, const CollArgs&) { return g.shm() != nullptr; }

}  // namespace

extern const AlgorithmDesc allreduce_shm;
const AlgorithmDesc allreduce_shm = {
    CollKind::all_reduce, "shm",
    "node-local shared memory: chunks reduced by share owners straight from the peers' slots", supports, run};

}  // namespace cclz::coll
