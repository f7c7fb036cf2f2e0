// Ring reduce-scatter (Patarasuk & Yuan 2009): the reduce-scatter phase of
// the pipelined ring all-reduce over n blocks of `count` elements. In step s
// rank r sends its running partial of block r-s-1 to r+1 and reduces the one
// arriving from r-1; after n-1 steps block r is complete on rank r.
//
// Cost: n-1 steps, (n-1)/n * (n*count*elem) bytes sent and received per rank,
// the same reduced. Bandwidth-optimal: the choice for large messages.
#include "allreduce/common.hpp"

namespace cclz::coll {
namespace {

Status run(Group& g, const CollArgs& a) {
  if (a.count == 0) return {};
  const int n = g.size(), r = g.rank();
  const std::size_t es = a.elem_size(), block = a.count * es;
  const auto* src = static_cast<const std::byte*>(a.sendbuf);
  auto* out = static_cast<std::byte*>(a.recvbuf);
  if (n == 1) {
    if (src != out) std::memmove(out, src, block);
    return {};
  }
  // Partials of every block land here (slot 0 is the ring's receive area), so
  // sendbuf is only read and an in-place recvbuf is written once, at the end.
  std::byte* partial = g.scratch(1, static_cast<std::size_t>(n) * block);
  const allreduce_impl::BlockLayout layout{static_cast<std::size_t>(n) * a.count, n};
  Status st = allreduce_impl::ring_reduce_scatter(g, src, partial, layout, a.dt, a.op,
                                                  allreduce_impl::kRingSliceBytes, 0);
  if (!st.ok()) return st;
  std::memcpy(out, partial + static_cast<std::size_t>(r) * block, block);
  return {};
}

}  // namespace

extern const AlgorithmDesc reduce_scatter_ring;
const AlgorithmDesc reduce_scatter_ring = {CollKind::reduce_scatter, "ring",
                                           "pipelined ring, n-1 steps, bandwidth-optimal", nullptr, run};

}  // namespace cclz::coll
