// Pairwise-exchange all-to-all (Thakur, Rabenseifner & Gropp 2005, section
// 4.5): in step s (1..n-1) a rank sends its block for one peer and receives
// that step's block from another — rank ^ s both ways for power-of-two n,
// else to r+s and from r-s — so each step is one exchange per rank and no
// rank is flooded.
//
// Cost: n-1 steps, (n-1) * count * elem bytes sent and received per rank:
// the choice for large messages.
#include <bit>

#include "allreduce/common.hpp"

namespace cclz::coll {
namespace {

Status run(Group& g, const CollArgs& a) {
  if (a.count == 0) return {};
  const int n = g.size(), r = g.rank();
  const std::size_t es = a.elem_size(), block = a.count * es, total = static_cast<std::size_t>(n) * block;
  const auto* src = static_cast<const std::byte*>(a.sendbuf);
  auto* out = static_cast<std::byte*>(a.recvbuf);
  if (src == out) {  // in place: every block is overwritten, so read from a copy
    std::byte* copy = g.scratch(1, total);
    std::memcpy(copy, src, total);
    src = copy;
  }
  auto at = [&](auto* base, int peer) { return base + static_cast<std::size_t>(peer) * block; };
  std::memcpy(at(out, r), at(src, r), block);
  const bool pof2 = std::has_single_bit(static_cast<unsigned>(n));
  for (int s = 1; s < n; ++s) {
    const int to = pof2 ? (r ^ s) : allreduce_impl::mod(r + s, n);
    const int from = pof2 ? (r ^ s) : allreduce_impl::mod(r - s, n);
    Status st = g.sendrecv(to, at(src, to), block, from, at(out, from), block, static_cast<std::uint32_t>(s));
    if (!st.ok()) return st;
  }
  return {};
}

}  // namespace

extern const AlgorithmDesc alltoall_pairwise;
const AlgorithmDesc alltoall_pairwise = {CollKind::all_to_all, "pairwise",
                                         "pairwise exchange, n-1 steps, for large messages", nullptr, run};

}  // namespace cclz::coll
