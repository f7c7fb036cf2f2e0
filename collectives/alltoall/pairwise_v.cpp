// Pairwise-exchange all-to-all with per-peer counts (MPI_Alltoallv's shape):
// in step s (1..n-1) a rank sends to r+s and receives from r-s, skipping a
// direction whose count is zero (both sides know the counts).
//
// Cost: n-1 steps; per rank, the sum of its send counts out and of its
// receive counts in.
#include <algorithm>

#include "allreduce/common.hpp"

namespace cclz::coll {
namespace {

Status run(Group& g, const CollArgs& a) {
  const int n = g.size(), r = g.rank();
  const auto un = static_cast<std::size_t>(n);
  if (a.send_counts.size() != un || a.send_displs.size() != un || a.recv_counts.size() != un ||
      a.recv_displs.size() != un) {
    return {Result::invalid_argument, "all_to_allv: counts and displacements need one entry per rank"};
  }
  const std::size_t es = a.elem_size();
  const auto ur = static_cast<std::size_t>(r);
  if (a.send_counts[ur] != a.recv_counts[ur]) {
    return {Result::invalid_argument, "all_to_allv: send_counts[rank] and recv_counts[rank] differ"};
  }
  const auto* src = static_cast<const std::byte*>(a.sendbuf);
  auto* out = static_cast<std::byte*>(a.recvbuf);
  if (src == out && src != nullptr) {  // in place: read from a copy of the send extent
    std::size_t extent = 0;
    for (std::size_t i = 0; i < un; ++i) extent = std::max(extent, a.send_displs[i] + a.send_counts[i]);
    std::byte* copy = g.scratch(1, extent * es);
    if (extent > 0) std::memcpy(copy, src, extent * es);
    src = copy;
  }
  if (a.send_counts[ur] > 0) {
    std::memmove(out + a.recv_displs[ur] * es, src + a.send_displs[ur] * es, a.send_counts[ur] * es);
  }
  for (int s = 1; s < n; ++s) {
    const auto to = static_cast<std::size_t>(allreduce_impl::mod(r + s, n));
    const auto from = static_cast<std::size_t>(allreduce_impl::mod(r - s, n));
    detail::Op ops[2];
    detail::Op* posted[2];
    int k = 0;
    if (a.recv_counts[from] > 0) {
      Status st = g.irecv(static_cast<int>(from), static_cast<std::uint32_t>(s), out + a.recv_displs[from] * es,
                          a.recv_counts[from] * es, &ops[k]);
      if (!st.ok()) return st;
      posted[k] = &ops[k];
      ++k;
    }
    if (a.send_counts[to] > 0) {
      Status st = g.isend(static_cast<int>(to), static_cast<std::uint32_t>(s), src + a.send_displs[to] * es,
                          a.send_counts[to] * es, &ops[k]);
      if (!st.ok()) {
        if (k > 0) (void)g.wait(std::span<detail::Op* const>(posted, static_cast<std::size_t>(k)));
        return st;
      }
      posted[k] = &ops[k];
      ++k;
    }
    if (k > 0) {
      if (Status st = g.wait(std::span<detail::Op* const>(posted, static_cast<std::size_t>(k))); !st.ok()) return st;
    }
  }
  return {};
}

}  // namespace

extern const AlgorithmDesc alltoallv_pairwise;
const AlgorithmDesc alltoallv_pairwise = {CollKind::all_to_allv, "pairwise",
                                          "pairwise exchange with per-peer counts, n-1 steps", nullptr, run};

}  // namespace cclz::coll
