// Recursive-doubling all-gather (Thakur, Rabenseifner & Gropp 2005, section
// 4.2) for power-of-two groups: at distance d (1, 2, 4, ...) a rank swaps its
// window of d gathered blocks with rank ^ d, doubling the window.
//
// Cost: log2 n steps, (n-1) * count * elem bytes sent and received per rank:
// logarithmic latency at the ring's bandwidth, the choice for small and
// medium messages. Groups that are not a power of two use the ring
// (supports() is false for them).
#include <bit>

#include "allreduce/common.hpp"

namespace cclz::coll {
namespace {

bool supports(const Group& g, const CollArgs&) { return std::has_single_bit(static_cast<unsigned>(g.size())); }

Status run(Group& g, const CollArgs& a) {
  if (!supports(g, a)) return {Result::invalid_argument, "all_gather doubling needs a power-of-two group"};
  if (a.count == 0) return {};
  const int n = g.size(), r = g.rank();
  const std::size_t es = a.elem_size(), block = a.count * es;
  auto* out = static_cast<std::byte*>(a.recvbuf);
  std::byte* mine = out + static_cast<std::size_t>(r) * block;
  if (a.sendbuf != mine) std::memcpy(mine, a.sendbuf, block);
  std::uint32_t step = 0;
  for (int d = 1; d < n; d *= 2, ++step) {
    const int peer = r ^ d;
    const int my_first = r / d * d, peer_first = peer / d * d;  // windows of d blocks
    const std::size_t bytes = static_cast<std::size_t>(d) * block;
    Status st = allreduce_impl::exchange(g, peer, out + static_cast<std::size_t>(my_first) * block, bytes,
                                         out + static_cast<std::size_t>(peer_first) * block, bytes, step);
    if (!st.ok()) return st;
  }
  return {};
}

}  // namespace

extern const AlgorithmDesc allgather_doubling;
const AlgorithmDesc allgather_doubling = {CollKind::all_gather, "doubling",
                                          "recursive doubling, log2 n steps (power-of-two groups)", supports, run};

}  // namespace cclz::coll
