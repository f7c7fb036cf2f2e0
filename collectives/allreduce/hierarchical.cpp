// Hierarchical (two-level) all-reduce, as in Horovod's hierarchical
// all-reduce and NCCL's intra-node/inter-node split (also "2D-torus"
// all-reduce, Mikami et al. 2018):
//   1. intra-node reduce-scatter: the node's L ranks each own 1/L of the
//      buffer, reduced over the node (through the node's shared-memory
//      window when it has one, else the pipelined ring over the transport);
//   2. inter-node all-reduce of that 1/L among the N ranks with the same
//      local index (one per node), with the algorithm the tuner picks for
//      that piece on that group (ring for large, tree/Rabenseifner small);
//   3. intra-node all-gather (shared memory or ring, as in 1).
// Phase 2 moves only 2(N-1)/N * bytes/L per rank across the slow network,
// and every node's L links to the network carry it in parallel. Each element
// is reduced in one order (by its intra-node owner, then by the inter-node
// algorithm, which is itself bitwise-consistent) and then copied, so all
// ranks get bitwise-identical results.
//
// Cost: 2(L-1) intra-node steps moving 2(L-1)/L * bytes per rank, plus the
// inner all-reduce of bytes/L over N ranks (ring: 2(N-1) steps,
// 2(N-1)/N * bytes/L; Rabenseifner: 2 log2 N steps).
//
// Needs more than one node and the same number of ranks on every node
// (the inter-node groups must cover every block).
#include "allreduce/common.hpp"
#include "shm_pipeline.hpp"

namespace cclz::coll {

extern const AlgorithmDesc allreduce_ring;
extern const AlgorithmDesc allreduce_hierarchical;

namespace allreduce_impl {
namespace {

// Sub-group spaces: one per phase, so that no message of one phase can match
// a receive of another even between the same two ranks.
constexpr int kSpaceIntraReduce = 1;
constexpr int kSpaceInter = 2;
constexpr int kSpaceIntraGather = 3;

}  // namespace

Status hierarchical_allreduce(Group& g, const CollArgs& a, std::size_t slice_bytes) {
  if (Status st = check_args(a, "hierarchical"); !st.ok()) return st;
  if (g.num_nodes() < 2 || !g.nodes_uniform()) {
    return {Result::invalid_usage, "all_reduce hierarchical: needs several nodes with equal rank counts"};
  }
  if (a.count == 0) return {};
  const int n = g.size(), me = g.rank(), my_node = g.node_of(me);
  const std::size_t es = a.elem_size();
  const auto* src = static_cast<const std::byte*>(a.sendbuf);
  auto* dst = static_cast<std::byte*>(a.recvbuf);

  // Node-local ranks in group order, and the ranks sharing my local index on
  // every node, ordered by node (node ids are dense 0..N-1).
  std::vector<int> local;
  for (int r = 0; r < n; ++r) {
    if (g.node_of(r) == my_node) local.push_back(r);
  }
  const int local_index =
      static_cast<int>(std::find(local.begin(), local.end(), me) - local.begin());
  std::vector<std::vector<int>> by_node(static_cast<std::size_t>(g.num_nodes()));
  for (int r = 0; r < n; ++r) by_node[static_cast<std::size_t>(g.node_of(r))].push_back(r);
  std::vector<int> peers;
  for (const auto& ranks : by_node) peers.push_back(ranks[static_cast<std::size_t>(local_index)]);

  Group intra_rs = g.subgroup(local, kSpaceIntraReduce);
  const BlockLayout layout{a.count, static_cast<int>(local.size())};
  const std::size_t off = layout.off(local_index), len = layout.len(local_index);
  const auto sig = shm::call_sig(g, a, a.count);
  const Status rs = intra_rs.shm() != nullptr
                        ? shm::reduce_scatter(intra_rs, sig, src, dst + off * es, layout, a.dt, a.op, /*divisor=*/1)
                        : ring_reduce_scatter(intra_rs, src, dst, layout, a.dt, a.op, slice_bytes);
  if (!rs.ok()) return rs;

  if (len > 0) {  // the same on every node for this local index
    Group inter = g.subgroup(peers, kSpaceInter);
    CollArgs inner = a;
    inner.sendbuf = dst + off * es;
    inner.recvbuf = dst + off * es;
    inner.count = len;
    // The inner group has one rank per node, so the tuner never picks this
    // algorithm for it; the guard keeps a re-tuned table from recursing.
    const AlgorithmDesc* algo = tune(inter, inner);
    if (algo == nullptr || algo == &allreduce_hierarchical) algo = &allreduce_ring;
    if (Status st = algo->run(inter, inner); !st.ok()) return st;
  }

  Group intra_ag = g.subgroup(local, kSpaceIntraGather);
  if (intra_ag.shm() != nullptr) return shm::all_gather(intra_ag, sig, dst + off * es, dst, layout, es);
  return ring_allgather(intra_ag, dst, layout, es, slice_bytes);
}

}  // namespace allreduce_impl

namespace {
bool supports(const Group& g, const CollArgs&) { return g.num_nodes() > 1 && g.nodes_uniform(); }
Status run(Group& g, const CollArgs& a) {
  return allreduce_impl::hierarchical_allreduce(g, a, allreduce_impl::kRingSliceBytes);
}
}  // namespace

extern const AlgorithmDesc allreduce_hierarchical;
const AlgorithmDesc allreduce_hierarchical = {
    CollKind::all_reduce, "hierarchical",
    "two-level: intra-node ring reduce-scatter, inter-node all-reduce per local index, intra-node all-gather",
    supports, run};

}  // namespace cclz::coll
