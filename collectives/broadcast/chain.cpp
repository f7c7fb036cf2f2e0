// Pipelined chain broadcast: root -> root+1 -> ... -> root-1, the buffer cut
// into chunks; a rank forwards chunk c as soon as it has arrived, while
// chunks c+1.. are still coming in (all receives are posted up front).
//
// Cost: (chunks + n - 2) chunk steps; count * elem bytes in and out per rank.
// Time ~ bytes / bandwidth + (n-2) * chunk latency: the choice for large
// messages.
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
  auto* buf = static_cast<std::byte*>(a.recvbuf);
  const int v = allreduce_impl::mod(r - a.root, n);
  if (v == 0 && a.sendbuf != buf) std::memcpy(buf, a.sendbuf, bytes);
  if (n == 1) return {};
  const std::size_t chunk = std::max<std::size_t>(1, kChunkBytes / es) * es;
  const std::size_t chunks = (bytes + chunk - 1) / chunk;
  const int next = allreduce_impl::mod(r + 1, n), prev = allreduce_impl::mod(r - 1, n);
  const bool has_next = v + 1 < n;
  allreduce_impl::PostedOps recvs(chunks), sends(chunks);
  auto len = [&](std::size_t c) { return std::min(chunk, bytes - c * chunk); };
  auto tag = [](std::size_t c) { return static_cast<std::uint32_t>(c % allreduce_impl::kTagHalf); };
  Status st;
  if (v != 0) {
    for (std::size_t c = 0; c < chunks && st.ok(); ++c) {
      st = g.irecv(prev, tag(c), buf + c * chunk, len(c), recvs.slot(c));
      if (st.ok()) recvs.posted(c);
    }
  }
  for (std::size_t c = 0; c < chunks && st.ok(); ++c) {
    if (v != 0) st = recvs.wait(g, c);
    if (st.ok() && has_next) {
      st = g.isend(next, tag(c), buf + c * chunk, len(c), sends.slot(c));
      if (st.ok()) sends.posted(c);
    }
  }
  st = recvs.finish(g, st);
  return sends.finish(g, st);
}

}  // namespace

extern const AlgorithmDesc broadcast_chain;
const AlgorithmDesc broadcast_chain = {CollKind::broadcast, "chain",
                                       "pipelined chain in 256 KiB chunks, for large messages", nullptr, run};

}  // namespace cclz::coll
