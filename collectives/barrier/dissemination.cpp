// Dissemination barrier (Hensgen, Finkel & Manber 1988): in round k a rank
// signals rank + 2^k and waits for rank - 2^k. After ceil(log2 n) rounds
// every rank has heard, directly or through others, from every rank, so none
// leaves before all have arrived.
//
// Cost: ceil(log2 n) rounds of one 1-byte message each way per rank.
#include "allreduce/common.hpp"

namespace cclz::coll {
namespace {

Status run(Group& g, const CollArgs&) {
  const int n = g.size(), r = g.rank();
  std::uint32_t round = 0;
  for (int d = 1; d < n; d *= 2, ++round) {
    // One byte rather than zero: every transport handles it the same way.
    const unsigned char out = 1;
    unsigned char in = 0;
    Status st = g.sendrecv(allreduce_impl::mod(r + d, n), &out, 1, allreduce_impl::mod(r - d, n), &in, 1, round);
    if (!st.ok()) return st;
  }
  return {};
}

}  // namespace

extern const AlgorithmDesc barrier_dissemination;
const AlgorithmDesc barrier_dissemination = {CollKind::barrier, "dissemination",
                                             "dissemination, ceil(log2 n) rounds of 1-byte messages", nullptr, run};

}  // namespace cclz::coll
