// Ring all-reduce: a pipelined ring reduce-scatter followed by a ring
// all-gather (Patarasuk & Yuan 2009; the schedule NCCL and Horovod use).
// The buffer is cut into n element-granular blocks; after the reduce-scatter
// rank r owns the fully reduced block r, which the all-gather copies to
// everyone, so every element is reduced once, by one owner, in one order,
// and all ranks hold bitwise-identical results.
//
// Cost: 2(n-1) steps; each rank sends and receives 2(n-1)/n * bytes and
// reduces (n-1)/n * bytes. Bandwidth-optimal, latency linear in n: the
// choice for large messages. Each step is split into slices (kRingSliceBytes)
// so the transfer of one slice overlaps the reduction of the previous one.
#include "allreduce/common.hpp"

namespace cclz::coll {
namespace allreduce_impl {

Status ring_allreduce(Group& g, const CollArgs& a, std::size_t slice_bytes) {
  if (Status st = check_args(a, "ring"); !st.ok()) return st;
  if (a.count == 0) return {};
  const std::size_t es = a.elem_size();
  const auto* src = static_cast<const std::byte*>(a.sendbuf);
  auto* dst = static_cast<std::byte*>(a.recvbuf);
  if (g.size() == 1) {
    if (src != dst) std::memcpy(dst, src, a.count * es);
    return {};
  }
  const BlockLayout layout{a.count, g.size()};
  if (Status st = ring_reduce_scatter(g, src, dst, layout, a.dt, a.op, slice_bytes); !st.ok()) return st;
  return ring_allgather(g, dst, layout, es, slice_bytes);
}

}  // namespace allreduce_impl

namespace {
Status run(Group& g, const CollArgs& a) { return allreduce_impl::ring_allreduce(g, a, allreduce_impl::kRingSliceBytes); }
}  // namespace

extern const AlgorithmDesc allreduce_ring;
const AlgorithmDesc allreduce_ring = {CollKind::all_reduce, "ring",
                                      "pipelined ring: reduce-scatter + all-gather, 2(n-1) steps, bandwidth-optimal",
                                      nullptr, run};

}  // namespace cclz::coll
