// Bruck all-to-all (Bruck, Ho, Kipnis, Upfal & Weathersby 1997): rotate the
// blocks so that index i holds the block for rank r+i; in round k send every
// block whose index has bit k set to rank r+2^k (packed into one message) and
// take the matching blocks from rank r-2^k; a block thus travels its index in
// hops and ends at its destination; a final inverse rotation puts block i,
// which came from rank r-i, at position r-i.
//
// Cost: ceil(log2 n) steps, about (n/2) * count * elem bytes per step per
// rank: fewer, larger messages than pairwise, so it wins for small blocks.
#include "allreduce/common.hpp"

namespace cclz::coll {
namespace {

Status run(Group& g, const CollArgs& a) {
  if (a.count == 0) return {};
  const int n = g.size(), r = g.rank();
  const std::size_t es = a.elem_size(), block = a.count * es, total = static_cast<std::size_t>(n) * block;
  const auto* src = static_cast<const std::byte*>(a.sendbuf);
  auto* out = static_cast<std::byte*>(a.recvbuf);
  std::byte* work = g.scratch(1, total);
  std::byte* pack = g.scratch(2, total);
  std::byte* unpack = g.scratch(3, total);
  auto blk = [&](auto* base, int i) { return base + static_cast<std::size_t>(i) * block; };
  for (int i = 0; i < n; ++i) std::memcpy(blk(work, i), blk(src, allreduce_impl::mod(r + i, n)), block);
  std::uint32_t round = 0;
  for (int d = 1; d < n; d *= 2, ++round) {
    std::size_t packed = 0;
    for (int i = 0; i < n; ++i) {
      if ((i & d) != 0) std::memcpy(pack + block * packed++, blk(work, i), block);
    }
    Status st = g.sendrecv(allreduce_impl::mod(r + d, n), pack, packed * block, allreduce_impl::mod(r - d, n),
                           unpack, packed * block, round);
    if (!st.ok()) return st;
    packed = 0;
    for (int i = 0; i < n; ++i) {
      if ((i & d) != 0) std::memcpy(blk(work, i), unpack + block * packed++, block);
    }
  }
  // work[i] came from rank r-i. sendbuf was only read (into work), so an
  // in-place recvbuf can be written now.
  for (int i = 0; i < n; ++i) std::memcpy(blk(out, allreduce_impl::mod(r - i, n)), blk(work, i), block);
  return {};
}

}  // namespace

extern const AlgorithmDesc alltoall_bruck;
const AlgorithmDesc alltoall_bruck = {CollKind::all_to_all, "bruck",
                                      "Bruck's algorithm, ceil(log2 n) steps, for small messages", nullptr, run};

}  // namespace cclz::coll
