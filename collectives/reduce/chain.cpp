// Pipelined chain reduce: the partial flows root-1 -> root-2 -> ... -> root
// (relative ranks n-1 down to 0) in chunks; each rank combines the arriving
// partial with its own input (partial first) and forwards the chunk while
// later chunks are still arriving. The order of combination is fixed, so the
// root's result is deterministic.
//
// Cost: (chunks + n - 2) chunk steps; count * elem bytes in, out and reduced
// per rank. Time ~ bytes / bandwidth + (n-2) * chunk latency: the choice for
// large messages.
#include <algorithm>
#include <cstring>

#include "allreduce/common.hpp"

namespace cclz::coll {
namespace {

constexpr std::size_t kChunkBytes = std::size_t{256} << 10;

Status run(Group& g, const CollArgs& a) {
  if (a.count == 0) return {};
  const int n = g.size(), r = g.rank();
  const std::size_t es = a.elem_size(), bytes = a.count * es;
  const auto* src = static_cast<const std::byte*>(a.sendbuf);
  const int v = allreduce_impl::mod(r - a.root, n);
  if (n == 1) {
    if (a.recvbuf != a.sendbuf) std::memcpy(a.recvbuf, a.sendbuf, bytes);
    return {};
  }
  const std::size_t chunk = std::max<std::size_t>(1, kChunkBytes / es) * es;
  const std::size_t chunks = (bytes + chunk - 1) / chunk;
  const int toward_root = allreduce_impl::mod(r - 1, n), from_tail = allreduce_impl::mod(r + 1, n);
  const bool tail = v == n - 1;
  // Where this rank's outgoing partial is built: the root's recvbuf, or
  // scratch (sends from it stay valid until they complete).
  std::byte* acc = v == 0 ? static_cast<std::byte*>(a.recvbuf) : tail ? nullptr : g.scratch(1, bytes);
  std::byte* in = tail ? nullptr : g.scratch(2, bytes);
  allreduce_impl::PostedOps recvs(chunks), sends(chunks);
  auto len = [&](std::size_t c) { return std::min(chunk, bytes - c * chunk); };
  auto tag = [](std::size_t c) { return static_cast<std::uint32_t>(c % allreduce_impl::kTagHalf); };
  Status st;
  if (!tail) {
    for (std::size_t c = 0; c < chunks && st.ok(); ++c) {
      st = g.irecv(from_tail, tag(c), in + c * chunk, len(c), recvs.slot(c));
      if (st.ok()) recvs.posted(c);
    }
  }
  for (std::size_t c = 0; c < chunks && st.ok(); ++c) {
    const std::byte* out_chunk = src + c * chunk;  // the tail forwards its input as is
    if (!tail) {
      st = recvs.wait(g, c);
      if (!st.ok()) break;
      kernels::reduce(acc + c * chunk, in + c * chunk, src + c * chunk, len(c) / es, a.dt, a.op);
      out_chunk = acc + c * chunk;
    }
    if (v != 0) {
      st = g.isend(toward_root, tag(c), out_chunk, len(c), sends.slot(c));
      if (st.ok()) sends.posted(c);
    }
  }
  st = recvs.finish(g, st);
  return sends.finish(g, st);
}

}  // namespace

extern const AlgorithmDesc reduce_chain;
const AlgorithmDesc reduce_chain = {CollKind::reduce, "chain",
                                    "pipelined chain in 256 KiB chunks, for large messages", nullptr, run};

}  // namespace cclz::coll
