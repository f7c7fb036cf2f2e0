// Internal: what the compressed collectives (compressed_collectives.cpp)
// share with their aggregation schemes (aggregate_*.cpp) and the auto rule
// (compressed_auto.cpp): one call's context (messages, wire count), the
// chunk layout of re-quantizable payloads, and the schemes themselves.
// The public contract, including the chunk rule and the wire accounting,
// is in include/cclz/compressed.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cclz/compressed.hpp"

namespace cclz::compress::cc {

// One call of a compressed collective.
struct Call {
  Comm& comm;
  const Compressor& c;
  CompressorState& state;
  const char* coll;  // "compressed_all_reduce"
  std::string what;  // "tensor 'w' (1024 x f32), spec 'topk:ratio=0.01'"
  int rank = 0;
  int size = 1;
  std::uint64_t wire = 0;  // bytes this rank sent so far

  Call(Comm& cm, const Compressor& cp, CompressorState& st, const char* name, std::string w)
      : comm(cm), c(cp), state(st), coll(name), what(std::move(w)), rank(cm.rank()), size(cm.size()) {}

  // "rank R: <coll> (<what>): <cause>"; a cause that already starts with
  // "rank R: " (a Comm error) loses that prefix.
  Status fail(Result code, const std::string& cause) const;
  Status fail(const Status& st) const { return st.ok() ? st : fail(st.code(), st.message()); }
};

// Wire counts of the Comm collectives (see compressed.hpp).
inline std::uint64_t all_reduce_wire(std::uint64_t bytes, int n) noexcept {
  return n <= 1 ? 0 : 2 * static_cast<std::uint64_t>(n - 1) * bytes / static_cast<std::uint64_t>(n);
}
inline std::uint64_t reduce_scatter_wire(std::uint64_t bytes, int n) noexcept {
  return n <= 1 ? 0 : static_cast<std::uint64_t>(n - 1) * bytes / static_cast<std::uint64_t>(n);
}
inline std::uint64_t all_gather_wire(std::uint64_t bytes_per_rank, int n) noexcept {
  return n <= 1 ? 0 : static_cast<std::uint64_t>(n - 1) * bytes_per_rank;
}

// Element ranges [lo, hi) and payload byte ranges [blo, bhi) of each rank's
// chunk of a re-quantizable payload.
struct Chunks {
  std::vector<std::size_t> lo, hi, blo, bhi;
  std::size_t elems(int j) const noexcept { return hi[static_cast<std::size_t>(j)] - lo[static_cast<std::size_t>(j)]; }
  std::size_t bytes(int j) const noexcept {
    return bhi[static_cast<std::size_t>(j)] - blo[static_cast<std::size_t>(j)];
  }
  std::size_t max_elems() const noexcept;
  std::size_t max_bytes() const noexcept;
};
// All-reduce: disjoint, balanced in blocks, covering [0, count).
Chunks balanced_chunks(const Compressor& c, std::size_t count, int n);
// Reduce-scatter: rank j's chunk is the whole blocks covering [j count/n, (j+1) count/n).
Chunks shard_chunks(const Compressor& c, std::size_t count, int n);

// Re-quantizable reduction of this rank's payload (count elements) over the
// communicator. Always: *mine = the f32 sum over ranks of chunk `rank`
// (ch.elems(rank) values). full != nullptr (all-reduce; the chunks must be
// disjoint and cover the tensor): *full = the concatenation of every chunk's
// sum encoded once more by its owner, the same bytes on every rank.
Status requant_sra(Call& k, std::span<const std::byte> payload, const Chunks& ch, std::vector<float>* mine,
                   std::vector<std::byte>* full);
Status requant_ring(Call& k, std::span<const std::byte> payload, const Chunks& ch, std::vector<float>* mine,
                    std::vector<std::byte>* full);

// Every rank's payload (sizes may differ), in rank order: rank j's is
// (*all)[(*offs)[j], (*offs)[j+1]).
Status gather_payloads(Call& k, std::span<const std::byte> payload, std::vector<std::byte>* all,
                       std::vector<std::size_t>* offs);

// The auto rule (compressed_auto.cpp).
enum class Coll : int { all_reduce, reduce_scatter, all_gather };
struct AutoChoice {
  bool compress = false;
  double t_compressed = 0, t_dense = 0;
  std::string reason;
};
Status auto_choose(Call& k, Coll coll, const TensorDesc& desc, const CompressedOptions& opt, AutoChoice* out);

}  // namespace cclz::compress::cc
