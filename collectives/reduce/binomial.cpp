// Binomial-tree reduce: ranks renumbered relative to the root (v = r - root
// mod n); rank v combines the partials of v + 2^k for each 2^k below its
// lowest set bit, in increasing k, then sends its partial to v minus that
// bit. Every element is combined in the same tree order whatever the data,
// so the root's result is deterministic.
//
// Cost: ceil(log2 n) steps, count * elem bytes per step on the critical path
// and up to log2 n reductions at the root: the choice for small messages.
#include <cstring>

#include "allreduce/common.hpp"

namespace cclz::coll {
namespace {

Status run(Group& g, const CollArgs& a) {
  if (a.count == 0) return {};
  const int n = g.size(), r = g.rank();
  const std::size_t bytes = a.count * a.elem_size();
  const int v = allreduce_impl::mod(r - a.root, n);
  // The root accumulates in recvbuf; others in scratch (their recvbuf is not
  // part of the call).
  std::byte* acc = v == 0 ? static_cast<std::byte*>(a.recvbuf) : g.scratch(1, bytes);
  if (acc != a.sendbuf) std::memcpy(acc, a.sendbuf, bytes);
  std::byte* tmp = g.scratch(2, bytes);
  for (int mask = 1; mask < n; mask <<= 1) {
    if ((v & mask) != 0) {
      return g.send(allreduce_impl::mod(v - mask + a.root, n), 0, acc, bytes);
    }
    if (v + mask < n) {
      if (Status st = g.recv(allreduce_impl::mod(v + mask + a.root, n), 0, tmp, bytes); !st.ok()) return st;
      kernels::reduce(acc, acc, tmp, a.count, a.dt, a.op);
    }
  }
  return {};
}

}  // namespace

extern const AlgorithmDesc reduce_binomial;
const AlgorithmDesc reduce_binomial = {CollKind::reduce, "binomial",
                                       "binomial tree, ceil(log2 n) steps, for small messages", nullptr, run};

}  // namespace cclz::coll
