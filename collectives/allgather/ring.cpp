// Ring all-gather (Patarasuk & Yuan 2009): the all-gather phase of the
// pipelined ring all-reduce. In step s rank r forwards block r-s to r+1 and
// receives block r-s-1 from r-1, straight into recvbuf, slice by slice.
//
// Cost: n-1 steps, (n-1) * count * elem bytes sent and received per rank.
// Bandwidth-optimal: the choice for large messages.
#include "allreduce/common.hpp"

namespace cclz::coll {
namespace {

Status run(Group& g, const CollArgs& a) {
  if (a.count == 0) return {};
  const int n = g.size(), r = g.rank();
  const std::size_t es = a.elem_size(), block = a.count * es;
  auto* out = static_cast<std::byte*>(a.recvbuf);
  std::byte* mine = out + static_cast<std::size_t>(r) * block;
  if (a.sendbuf != mine) std::memcpy(mine, a.sendbuf, block);  // in place: already there
  if (n == 1) return {};
  const allreduce_impl::BlockLayout layout{static_cast<std::size_t>(n) * a.count, n};
  return allreduce_impl::ring_allgather(g, out, layout, es, allreduce_impl::kRingSliceBytes, 0);
}

}  // namespace

extern const AlgorithmDesc allgather_ring;
const AlgorithmDesc allgather_ring = {CollKind::all_gather, "ring", "pipelined ring, n-1 steps, bandwidth-optimal",
                                      nullptr, run};

}  // namespace cclz::coll
