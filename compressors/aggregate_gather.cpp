// Gather-only aggregation (top-k, threshold, DGC, sign): every rank gets
// every rank's payload, in rank order, whatever their sizes. An all-gather
// of the sizes (one u64 per rank, Comm::all_gather), then an all-to-allv of
// bytes in which each rank sends its whole payload to every other rank
// (Comm::all_to_allv, send displacements all 0) and receives rank j's at
// the prefix sum of the sizes before j.
//
// Cost per rank: two collectives; sent (n-1) 8 + (n-1) |own payload| bytes,
// received the other ranks' payloads; memory: the sum of all payloads.
#include "compressors/compressed_internal.hpp"

namespace cclz::compress::cc {

Status gather_payloads(Call& k, std::span<const std::byte> payload, std::vector<std::byte>* all,
                       std::vector<std::size_t>* offs) {
  const auto n = static_cast<std::size_t>(k.size);
  const std::int64_t mine = static_cast<std::int64_t>(payload.size());
  std::vector<std::int64_t> sizes(n, 0);
  if (Status s = k.fail(k.comm.all_gather(&mine, sizes.data(), 1, DataType::i64).wait()); !s.ok()) return s;
  k.wire += all_gather_wire(8, k.size);
  if (sizes[static_cast<std::size_t>(k.rank)] != mine) {
    return k.fail(Result::internal_error, "the size all-gather returned " +
                                              std::to_string(sizes[static_cast<std::size_t>(k.rank)]) +
                                              " for this rank's payload of " + std::to_string(mine) + " bytes");
  }
  offs->assign(n + 1, 0);
  std::vector<std::size_t> send_counts(n, payload.size()), send_displs(n, 0), recv_counts(n), recv_displs(n);
  for (std::size_t j = 0; j < n; ++j) {
    if (sizes[j] < 0) {
      return k.fail(Result::remote_error,
                    "rank " + std::to_string(j) + " announced a payload of " + std::to_string(sizes[j]) + " bytes");
    }
    recv_counts[j] = static_cast<std::size_t>(sizes[j]);
    recv_displs[j] = (*offs)[j];
    (*offs)[j + 1] = (*offs)[j] + recv_counts[j];
  }
  all->resize((*offs)[n]);
  Request q = k.comm.all_to_allv(payload.data(), send_counts, send_displs, all->data(), recv_counts, recv_displs,
                                 DataType::u8);
  if (Status s = k.fail(q.wait()); !s.ok()) return s;
  k.wire += all_gather_wire(payload.size(), k.size);
  return {};
}

}  // namespace cclz::compress::cc
