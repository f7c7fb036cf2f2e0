// Recursive-halving reduce-scatter (Thakur, Rabenseifner & Gropp 2005,
// section 4.3) for power-of-two groups. The window of blocks a rank is
// responsible for halves every step: at distance d (n/2, n/4, ..., 1) the
// rank keeps the half of its window on its side of d, sends the other half
// to rank ^ d and reduces the half it receives. After log2 n steps the window
// is block r.
//
// Cost: log2 n steps, (n-1)/n * (n*count*elem) bytes sent, received and
// reduced per rank: logarithmic latency at the ring's bandwidth. Groups that
// are not a power of two use the ring (supports() is false for them).
#include <bit>

#include "allreduce/common.hpp"

namespace cclz::coll {
namespace {

bool supports(const Group& g, const CollArgs&) { return std::has_single_bit(static_cast<unsigned>(g.size())); }

Status run(Group& g, const CollArgs& a) {
  if (!supports(g, a)) return {Result::invalid_argument, "reduce_scatter halving needs a power-of-two group"};
  if (a.count == 0) return {};
  const int n = g.size(), r = g.rank();
  const std::size_t es = a.elem_size(), block = a.count * es;
  const auto* src = static_cast<const std::byte*>(a.sendbuf);
  auto* out = static_cast<std::byte*>(a.recvbuf);
  if (n == 1) {
    if (src != out) std::memmove(out, src, block);
    return {};
  }
  std::byte* acc = g.scratch(1, static_cast<std::size_t>(n) * block);
  std::byte* tmp = g.scratch(2, static_cast<std::size_t>(n / 2) * block);
  std::memcpy(acc, src, static_cast<std::size_t>(n) * block);
  int lo = 0, hi = n;  // window of blocks, [lo, hi)
  std::uint32_t step = 0;
  for (int d = n / 2; d >= 1; d /= 2, ++step) {
    const int peer = r ^ d, mid = lo + (hi - lo) / 2;
    const bool keep_low = (r & d) == 0;
    const int keep_lo = keep_low ? lo : mid, send_lo = keep_low ? mid : lo;
    const std::size_t half = static_cast<std::size_t>(mid - lo) * block;
    Status st = allreduce_impl::exchange(g, peer, acc + static_cast<std::size_t>(send_lo) * block, half, tmp,
                                         half, step);
    if (!st.ok()) return st;
    std::byte* mine = acc + static_cast<std::size_t>(keep_lo) * block;
    // Lower rank's partial first on both sides of the pair: a fixed order.
    if (keep_low) {
      kernels::reduce(mine, mine, tmp, half / es, a.dt, a.op);
    } else {
      kernels::reduce(mine, tmp, mine, half / es, a.dt, a.op);
    }
    hi = keep_lo + (mid - lo);
    lo = keep_lo;
  }
  std::memcpy(out, acc + static_cast<std::size_t>(r) * block, block);
  return {};
}

}  // namespace

extern const AlgorithmDesc reduce_scatter_halving;
const AlgorithmDesc reduce_scatter_halving = {CollKind::reduce_scatter, "halving",
                                              "recursive halving, log2 n steps (power-of-two groups)", supports,
                                              run};

}  // namespace cclz::coll
