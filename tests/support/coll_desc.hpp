// Per-collective descriptor shared by the multi-rank tests and cclz-perf
// (nccl-tests' testColl idea): buffer sizes for a call, exact-by-construction
// inputs for a rank, the expected output on a rank computed independently of
// the library, a bitwise comparison, and the bus-bandwidth factor.
//
// Plain functions over raw buffers: no MPI, no communicator. A caller fills
// its send buffer with fill_input(), runs the collective however it likes,
// and counts wrong elements with check_output().
//
// Why the data is exact: every input is a small integer chosen per
// (rank, global index) so that every partial result of sum/min/max/avg in any
// order is an integer no larger than the dtype's exactly representable range
// (bf16: 256, f16: 2048, i8: 127, u8: 255, ...) for up to 256 ranks. For prod
// the inputs are 1, 2 and (signed types) -1, with at most a few 2s per element,
// so every partial product is a small power of two. Integer results are
// computed modulo 2^bits (as the kernels wrap) so integer types stay exact at
// any rank count. avg follows cclz's documented semantics: the exact sum,
// divided by nranks in the accumulation type (f32 for f16/bf16/f32, f64 for
// f64, truncating integer division for integers), rounded once to the dtype.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "algorithm.hpp"  // coll::CollKind
#include "cclz/types.hpp"

namespace cclz::testing {

using coll::CollKind;

// One collective call as the descriptor sees it. `count` is the count
// argument of the cclz call (NCCL's meaning): all_reduce/broadcast/reduce the
// whole buffer, reduce_scatter the per-rank result, all_gather the per-rank
// input, all_to_all (and the nominal size of all_to_allv) the count per peer.
struct CollCase {
  CollKind kind = CollKind::all_reduce;
  DataType dt = DataType::f32;
  ReduceOp op = ReduceOp::sum;  // ignored by collectives that do not reduce
  std::size_t count = 0;
  int root = 0;                 // broadcast and reduce only
  int nranks = 1;
};

// Static facts about a collective.
struct CollInfo {
  CollKind kind;
  const char* name;       // "all_reduce" (cclz spelling)
  const char* nccl_name;  // "allreduce" (nccl-tests' binary prefix)
  bool reduces;           // takes a ReduceOp
  bool has_root;          // broadcast, reduce
  bool has_in_place;      // NCCL defines an in-place form (not all_to_all[v])
};

// The collectives the descriptor knows (barrier excluded), in a fixed order.
std::span<const CollInfo> all_colls() noexcept;
const CollInfo& coll_info(CollKind k) noexcept;
// Accepts "all_reduce", "allreduce", "all-reduce", "AllReduce", ... (case and
// '_'/'-' insensitive). Also "reducescatter", "allgather", "alltoall",
// "alltoallv", "bcast"/"broadcast", "reduce".
std::optional<CollKind> parse_coll(std::string_view s) noexcept;

// nccl-tests' bus-bandwidth factor: busbw = algbw * factor.
// all_reduce 2(n-1)/n; reduce_scatter, all_gather, all_to_all[v] (n-1)/n;
// broadcast, reduce 1.
double busbw_factor(CollKind k, int nranks) noexcept;

// The least memory traffic of an out-of-place call on one host, in units of
// the row's size S (bytes read + written, summed over the n ranks): every
// input byte read once and every output byte written once, whatever the
// algorithm. all_reduce, all_to_all[v]: n inputs and n outputs of S, 2n.
// reduce_scatter and reduce: n inputs of S, outputs of S in all, n + 1.
// all_gather and broadcast: inputs of S in all, n outputs of S, n + 1
// (a block's second and later readers may find it in a shared cache, so
// it is read once). cclz-perf's roofline time is this times S over the
// n-copier bandwidth (docs/performance.md).
double memory_traffic_factor(CollKind k, int nranks) noexcept;
// The same as text, as cclz-perf's header prints it: "2*n*size" or "(n+1)*size".
const char* memory_traffic_formula(CollKind k) noexcept;

// Element counts of one rank's send and receive buffers for an out-of-place
// call. (For reduce, non-root ranks still get `count`: NCCL lets them pass a
// recvbuf they never read.) For all_to_allv they depend on the rank; use
// alltoallv_layout().
struct BufferCounts {
  std::size_t send = 0;
  std::size_t recv = 0;
};
BufferCounts buffer_counts(const CollCase& c, int rank = 0);

// nccl-tests' row sizes: a benchmark asks for `bytes`; the call's count is
// derived from it (all_gather, reduce_scatter, all_to_all split it over the
// ranks, rounding down), and the row prints the size actually moved.
std::size_t count_for_bytes(CollKind k, std::size_t bytes, DataType dt, int nranks) noexcept;
// Total elements the row reports (nccl-tests' `count` column): the larger
// buffer, e.g. all_gather's n*sendcount.
std::size_t row_count(CollKind k, std::size_t count, int nranks) noexcept;

// all_to_allv layout for rank `rank`: counts and packed displacements in
// elements, one entry per peer. Rank r sends c*((r + 2p + 1) % 3) elements to
// peer p (0, c or 2c: uneven, with empty pairs, mean c), so both sides can
// compute every count without talking.
struct VLayout {
  std::vector<std::size_t> send_counts, send_displs, recv_counts, recv_displs;
  std::size_t send_total = 0, recv_total = 0;
};
VLayout alltoallv_layout(std::size_t count, int rank, int nranks);
std::size_t alltoallv_pair_count(std::size_t count, int from, int to) noexcept;

// In-place form (NCCL conventions, see cclz.hpp): one buffer of
// `buffer_count` elements; sendbuf = buffer + send_offset, recvbuf = buffer +
// recv_offset (element offsets). all_gather: send at rank*count;
// reduce_scatter: recv at rank*count; all_reduce/broadcast/reduce: both 0.
// Only for collectives with has_in_place.
struct InPlaceLayout {
  std::size_t buffer_count = 0;
  std::size_t send_offset = 0;
  std::size_t recv_offset = 0;
};
InPlaceLayout in_place_layout(const CollCase& c, int rank);

// Fills this rank's send buffer (buffer_counts(c, rank).send elements of
// c.dt). For broadcast, non-root ranks get the same pattern as the root would
// have; the collective must not read it.
void fill_input(const CollCase& c, int rank, void* sendbuf);

// Whether the rank's receive buffer has a defined result (reduce: root only).
bool output_defined(const CollCase& c, int rank) noexcept;

// Writes the expected receive buffer of `rank` (buffer_counts(c, rank).recv
// elements), computed in int64/double from the same input formula, then
// converted once to c.dt. Does nothing when !output_defined().
void expected_output(const CollCase& c, int rank, void* out);

// Number of elements of `got` that differ bitwise from `want`.
std::size_t count_wrong(const void* got, const void* want, std::size_t n, DataType dt) noexcept;

// A hash of `bytes` bytes for comparing buffers (a send buffer before and
// after a call, a replicated result across ranks); `h` chains calls. Any
// change to a single 8-byte word changes the result: each step is a
// bijection of the running value. Four words per step in independent
// lanes, so that hashing every output costs a few percent of the tests'
// time rather than a quarter of it.
std::uint64_t hash_bytes(const void* data, std::size_t bytes, std::uint64_t h = 0x243F6A8885A308D3ull);

// expected_output() into a temporary, then count_wrong() against `recvbuf`.
// 0 when the output is not defined on this rank.
std::size_t check_output(const CollCase& c, int rank, const void* recvbuf);

// The value fill_input() puts at element `index` of rank `rank`'s input, as a
// double (exact). Exposed for tests that build their own layouts.
double input_value(const CollCase& c, int rank, std::size_t index) noexcept;

// Conversions used for the expected values (round to nearest even), written
// here independently of the library's kernels so the oracle does not share
// their bugs.
std::uint16_t to_f16_bits(float f) noexcept;
std::uint16_t to_bf16_bits(float f) noexcept;
float from_f16_bits(std::uint16_t h) noexcept;
float from_bf16_bits(std::uint16_t b) noexcept;

}  // namespace cclz::testing
