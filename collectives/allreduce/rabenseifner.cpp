// Rabenseifner all-reduce: reduce-scatter by recursive halving, then
// all-gather by recursive doubling (Rabenseifner 2004; Thakur, Rabenseifner
// & Gropp 2005, "Optimization of collective communication operations in
// MPICH", section 4.4).
//
// Non-power-of-two n: let p' = 2^floor(log2 n) and r = n - p'. Among the
// first 2r ranks each even rank sends its whole vector to the odd rank above
// it and drops out; the odd rank reduces the pair. The p' remaining ranks
// run the power-of-two algorithm over "new ranks", and each odd rank finally
// sends the whole result back to its even partner.
//
// Halving: at the step with distance d (p'/2, p'/4, ..., 1) a rank keeps the
// half of its current window on its side of d, sends the other half to
// new rank ^ d and reduces the half it receives. After log p' steps new rank
// k owns the fully reduced block k (element-granular, p' blocks). Doubling
// retraces the steps and copies. Each element is reduced by one owner in one
// order, so all ranks get bitwise-identical results.
//
// Cost (p' = n): 2 log2 n steps, 2(n-1)/n * bytes sent and received per rank,
// (n-1)/n * bytes reduced. Otherwise add 2 steps of a whole vector for the
// first 2r ranks. Latency logarithmic and bandwidth near-optimal: the choice
// for small and medium messages.
#include "allreduce/common.hpp"

namespace cclz::coll {
namespace {

using allreduce_impl::BlockLayout;
using allreduce_impl::exchange;

constexpr std::uint32_t kTagPre = 0;        // pair-up of the first 2r ranks
constexpr std::uint32_t kTagHalving = 1;    // + step
constexpr std::uint32_t kTagDoubling = 64;  // + step
constexpr std::uint32_t kTagPost = 128;     // result back to the dropped ranks

Status run(Group& g, const CollArgs& a) {
  if (Status st = allreduce_impl::check_args(a, "rabenseifner"); !st.ok()) return st;
  if (a.count == 0) return {};
  const int n = g.size(), rank = g.rank();
  const std::size_t es = a.elem_size(), bytes = a.count * es;
  const auto* src = static_cast<const std::byte*>(a.sendbuf);
  auto* dst = static_cast<std::byte*>(a.recvbuf);
  if (n == 1) {
    if (src != dst) std::memcpy(dst, src, bytes);
    return {};
  }

  int pof2 = 1;
  while (pof2 * 2 <= n) pof2 *= 2;
  const int extra = n - pof2;
  // At most half the vector arrives per halving step, the whole vector in
  // the pair-up step.
  std::byte* tmp = g.scratch(0, bytes);

  // Pair-up: `cur` is where this rank's running partial lives.
  const std::byte* cur = src;
  int newrank;
  if (rank < 2 * extra) {
    if (rank % 2 == 0) {
      if (Status st = g.send(rank + 1, kTagPre, src, bytes); !st.ok()) return st;
      newrank = -1;
    } else {
      if (Status st = g.recv(rank - 1, kTagPre, tmp, bytes); !st.ok()) return st;
      kernels::reduce(dst, tmp, src, a.count, a.dt, a.op);
      cur = dst;
      newrank = rank / 2;
    }
  } else {
    newrank = rank - extra;
  }
  auto real_rank = [extra](int nr) { return nr < extra ? 2 * nr + 1 : nr + extra; };

  if (newrank >= 0) {
    const BlockLayout layout{a.count, pof2};
    int lo = 0, hi = pof2;  // window of blocks this rank is responsible for
    std::uint32_t step = 0;
    for (int d = pof2 / 2; d >= 1; d /= 2, ++step) {
      const int peer = real_rank(newrank ^ d);
      const int mid = lo + d;
      const bool upper = (newrank & d) != 0;
      const int keep_lo = upper ? mid : lo, keep_hi = upper ? hi : mid;
      const int send_lo = upper ? lo : mid, send_hi = upper ? mid : hi;
      const std::size_t keep_off = layout.off(keep_lo), keep_len = layout.end(keep_hi) - keep_off;
      const std::size_t send_off = layout.off(send_lo), send_len = layout.end(send_hi) - send_off;
      if (Status st = exchange(g, peer, cur + send_off * es, send_len * es, tmp, keep_len * es, kTagHalving + step);
          !st.ok()) {
        return st;
      }
      // Partner's partial first, own second (the order is irrelevant for
      // identity across ranks, since only this rank computes these elements).
      kernels::reduce(dst + keep_off * es, tmp, cur + keep_off * es, keep_len, a.dt, a.op);
      cur = dst;
      lo = keep_lo;
      hi = keep_hi;
    }
    step = 0;
    for (int d = 1; d < pof2; d *= 2, ++step) {
      const int peer = real_rank(newrank ^ d);
      const int peer_lo = lo ^ d, peer_hi = peer_lo + d;  // windows are d-aligned
      const std::size_t my_off = layout.off(lo), my_len = layout.end(hi) - my_off;
      const std::size_t peer_off = layout.off(peer_lo), peer_len = layout.end(peer_hi) - peer_off;
      if (Status st = exchange(g, peer, dst + my_off * es, my_len * es, dst + peer_off * es, peer_len * es,
                               kTagDoubling + step);
          !st.ok()) {
        return st;
      }
      lo = std::min(lo, peer_lo);
      hi = lo + 2 * d;
    }
  }

  if (rank < 2 * extra) {
    if (rank % 2 == 0) return g.recv(rank + 1, kTagPost, dst, bytes);
    return g.send(rank - 1, kTagPost, dst, bytes);
  }
  return {};
}

}  // namespace

extern const AlgorithmDesc allreduce_rabenseifner;
const AlgorithmDesc allreduce_rabenseifner = {
    CollKind::all_reduce, "rabenseifner",
    "recursive halving reduce-scatter + recursive doubling all-gather, 2 log2 n steps", nullptr, run};

}  // namespace cclz::coll
