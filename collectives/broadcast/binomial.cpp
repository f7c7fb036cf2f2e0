// Binomial-tree broadcast: ranks are renumbered relative to the root
// (v = r - root mod n); rank v receives the whole buffer from v minus its
// lowest set bit, then sends it to v + 2^k for every 2^k below that bit.
//
// Cost: ceil(log2 n) steps, count * elem bytes per step on the critical
// path: latency-optimal, the choice for small messages.
#include <cstring>

#include "allreduce/common.hpp"

namespace cclz::coll {
namespace {

Status run(Group& g, const CollArgs& a) {
  if (a.count == 0) return {};
  const int n = g.size(), r = g.rank();
  const std::size_t bytes = a.count * a.elem_size();
  auto* buf = static_cast<std::byte*>(a.recvbuf);
  const int v = allreduce_impl::mod(r - a.root, n);
  if (v == 0 && a.sendbuf != buf) std::memcpy(buf, a.sendbuf, bytes);
  int mask = 1;
  while (mask < n) {
    if ((v & mask) != 0) {
      const int parent = allreduce_impl::mod(v - mask + a.root, n);
      if (Status st = g.recv(parent, 0, buf, bytes); !st.ok()) return st;
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (v + mask < n) {
      if (Status st = g.send(allreduce_impl::mod(v + mask + a.root, n), 0, buf, bytes); !st.ok()) return st;
    }
  }
  return {};
}

}  // namespace

extern const AlgorithmDesc broadcast_binomial;
const AlgorithmDesc broadcast_binomial = {CollKind::broadcast, "binomial",
                                          "binomial tree, ceil(log2 n) steps, for small messages", nullptr, run};

}  // namespace cclz::coll
