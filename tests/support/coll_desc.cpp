// Per-collective descriptor: counts, exact inputs, independently computed
// expected outputs and bus-bandwidth factors (see coll_desc.hpp for why the
// data is exact). Everything is computed in int64 (all inputs are integers)
// and converted to the dtype once, at the end.
#include "coll_desc.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>

namespace cclz::testing {
namespace {

constexpr std::array<CollInfo, 7> kColls = {{
    {CollKind::all_reduce, "all_reduce", "allreduce", true, false, true},
    {CollKind::reduce_scatter, "reduce_scatter", "reducescatter", true, false, true},
    {CollKind::all_gather, "all_gather", "allgather", false, false, true},
    {CollKind::all_to_all, "all_to_all", "alltoall", false, false, false},
    {CollKind::all_to_allv, "all_to_allv", "alltoallv", false, false, false},
    {CollKind::broadcast, "broadcast", "broadcast", false, true, true},
    {CollKind::reduce, "reduce", "reduce", true, true, true},
}};

bool is_signed(DataType dt) noexcept { return dt != DataType::u8; }

// Largest magnitude that stays exact (and in range) when added up. Integer
// types also wrap consistently, but staying in range keeps the values
// meaningful for MPI baselines and for reading dumps. Capped at 2^20 so even
// the wide types use "small" integers.
std::int64_t exact_limit(DataType dt) noexcept {
  switch (dt) {
    case DataType::i8: return 127;
    case DataType::u8: return 255;
    case DataType::bf16: return 256;   // 8 significant bits
    case DataType::f16: return 2048;   // 11 significant bits
    case DataType::i32:
    case DataType::i64:
    case DataType::f32:
    case DataType::f64: return std::int64_t{1} << 20;
  }
  return 1;
}

// How many factors of 2 a product may collect and stay exact and in range.
int max_twos(DataType dt) noexcept {
  switch (dt) {
    case DataType::i8: return 6;   // 64, -64
    case DataType::u8: return 7;   // 128
    default: return 14;            // 16384 < f16's 65504
  }
}

// A cheap, well-mixed 32-bit hash of (rank, index): neighbouring elements
// and neighbouring ranks get unrelated values, so a misplaced block shows.
inline std::uint32_t mix(int rank, std::uint64_t index) noexcept {
  std::uint64_t x = index * 0x9E3779B97F4A7C15ull + (static_cast<std::uint64_t>(rank) + 1) * 0xD1B54A32D192ED03ull;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<std::uint32_t>(x >> 32);
}

// How inputs are generated for one case, precomputed once.
struct Gen {
  bool prod = false;
  bool sign = true;
  std::uint64_t span = 1;   // number of distinct sum-like values
  std::int64_t offset = 0;  // subtracted (signed types are centred on 0)
  std::uint64_t period = 1; // prod: only ranks with (r+i) % period == 0 may add a 2

  inline std::int64_t value(int rank, std::uint64_t index) const noexcept {
    const std::uint32_t h = mix(rank, index);
    if (!prod) {
      // Multiply-high maps h onto [0, span) without a division.
      return static_cast<std::int64_t>((static_cast<std::uint64_t>(h) * span) >> 32) - offset;
    }
    std::int64_t v = 1;
    if ((h & 1u) && (period == 1 || (static_cast<std::uint64_t>(rank) + index) % period == 0)) v = 2;
    if (sign && ((h >> 1) & 3u) == 0) v = -v;
    return v;
  }
};

Gen make_gen(const CollCase& c) noexcept {
  Gen g;
  g.sign = is_signed(c.dt);
  const bool reduces = coll_info(c.kind).reduces;
  g.prod = reduces && c.op == ReduceOp::prod;
  const std::int64_t n = std::max(1, c.nranks);
  if (g.prod) {
    const std::int64_t k = max_twos(c.dt);
    g.period = static_cast<std::uint64_t>((n + k - 1) / k);
    return g;
  }
  // Reducing collectives: n values of magnitude <= m add up to <= limit.
  // Pure data movement needs no headroom, so it uses the whole range.
  const std::int64_t m = std::max<std::int64_t>(1, exact_limit(c.dt) / (reduces ? n : 1));
  if (g.sign) {
    g.span = static_cast<std::uint64_t>(2 * m + 1);
    g.offset = m;
  } else {
    g.span = static_cast<std::uint64_t>(m + 1);
    g.offset = 0;
  }
  return g;
}

// Writes integer-valued `v` (exact by construction) as element i of a
// buffer of dtype D. Integers are converted modulo 2^bits, which is what the
// kernels' wrapping arithmetic yields too. The dtype (and, below, the op) is
// a template argument so that the loops over every element of a case's
// buffers carry no per-element dispatch: they set the multi-rank suites'
// time, computing each rank's reference from all ranks' inputs.
template <DataType D>
inline void store_int(void* buf, std::size_t i, std::int64_t v) noexcept {
  if constexpr (D == DataType::i8) static_cast<std::int8_t*>(buf)[i] = static_cast<std::int8_t>(v);
  else if constexpr (D == DataType::u8) static_cast<std::uint8_t*>(buf)[i] = static_cast<std::uint8_t>(v);
  else if constexpr (D == DataType::i32) static_cast<std::int32_t*>(buf)[i] = static_cast<std::int32_t>(v);
  else if constexpr (D == DataType::i64) static_cast<std::int64_t*>(buf)[i] = v;
  else if constexpr (D == DataType::f16) static_cast<std::uint16_t*>(buf)[i] = to_f16_bits(static_cast<float>(v));
  else if constexpr (D == DataType::bf16) static_cast<std::uint16_t*>(buf)[i] = to_bf16_bits(static_cast<float>(v));
  else if constexpr (D == DataType::f32) static_cast<float*>(buf)[i] = static_cast<float>(v);
  else static_cast<double*>(buf)[i] = static_cast<double>(v);
}

// Calls f(std::integral_constant<DataType, dt>{}).
template <class F>
void with_dtype(DataType dt, F&& f) {
  switch (dt) {
    case DataType::i8: f(std::integral_constant<DataType, DataType::i8>{}); break;
    case DataType::u8: f(std::integral_constant<DataType, DataType::u8>{}); break;
    case DataType::i32: f(std::integral_constant<DataType, DataType::i32>{}); break;
    case DataType::i64: f(std::integral_constant<DataType, DataType::i64>{}); break;
    case DataType::f16: f(std::integral_constant<DataType, DataType::f16>{}); break;
    case DataType::bf16: f(std::integral_constant<DataType, DataType::bf16>{}); break;
    case DataType::f32: f(std::integral_constant<DataType, DataType::f32>{}); break;
    case DataType::f64: f(std::integral_constant<DataType, DataType::f64>{}); break;
  }
}

// Integer arithmetic in the dtype's width: what a wrapping kernel produces.
template <DataType D>
inline std::int64_t wrap(std::int64_t v) noexcept {
  if constexpr (D == DataType::i8) return static_cast<std::int8_t>(v);
  else if constexpr (D == DataType::u8) return static_cast<std::uint8_t>(v);
  else if constexpr (D == DataType::i32) return static_cast<std::int32_t>(v);
  else return v;
}

// Stores the final value of a reduction whose exact integer result is `acc`.
// avg: integers truncate (C++ '/' truncates towards zero); floats divide once
// in their accumulation type and round once to the dtype.
template <DataType D, ReduceOp Op>
inline void store_reduced(void* buf, std::size_t i, std::int64_t acc, int n) noexcept {
  if constexpr (Op != ReduceOp::avg) {
    store_int<D>(buf, i, acc);
  } else if constexpr (D == DataType::i8 || D == DataType::u8 || D == DataType::i32 || D == DataType::i64) {
    store_int<D>(buf, i, wrap<D>(acc) / n);
  } else if constexpr (D == DataType::f16) {
    static_cast<std::uint16_t*>(buf)[i] = to_f16_bits(static_cast<float>(acc) / static_cast<float>(n));
  } else if constexpr (D == DataType::bf16) {
    static_cast<std::uint16_t*>(buf)[i] = to_bf16_bits(static_cast<float>(acc) / static_cast<float>(n));
  } else if constexpr (D == DataType::f32) {
    static_cast<float*>(buf)[i] = static_cast<float>(acc) / static_cast<float>(n);
  } else {
    static_cast<double*>(buf)[i] = static_cast<double>(acc) / static_cast<double>(n);
  }
}

template <ReduceOp Op>
inline std::int64_t combine(std::int64_t acc, std::int64_t v) noexcept {
  if constexpr (Op == ReduceOp::sum || Op == ReduceOp::avg) return acc + v;
  else if constexpr (Op == ReduceOp::prod) return acc * v;
  else if constexpr (Op == ReduceOp::max) return std::max(acc, v);
  else return std::min(acc, v);
}

template <DataType D, ReduceOp Op>
void reduce_expected_as(const Gen& g, int n, std::uint64_t base, std::size_t count, void* out) {
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t idx = base + i;
    std::int64_t acc = g.value(0, idx);
    for (int q = 1; q < n; ++q) acc = combine<Op>(acc, g.value(q, idx));
    store_reduced<D, Op>(out, i, acc, n);
  }
}

// out[i] = op over ranks q of value(q, base + i), for i < count.
void reduce_expected(const CollCase& c, const Gen& g, std::uint64_t base, std::size_t count, void* out) {
  with_dtype(c.dt, [&](auto d) {
    constexpr DataType D = decltype(d)::value;
    switch (c.op) {
      case ReduceOp::sum: reduce_expected_as<D, ReduceOp::sum>(g, c.nranks, base, count, out); break;
      case ReduceOp::avg: reduce_expected_as<D, ReduceOp::avg>(g, c.nranks, base, count, out); break;
      case ReduceOp::prod: reduce_expected_as<D, ReduceOp::prod>(g, c.nranks, base, count, out); break;
      case ReduceOp::max: reduce_expected_as<D, ReduceOp::max>(g, c.nranks, base, count, out); break;
      case ReduceOp::min: reduce_expected_as<D, ReduceOp::min>(g, c.nranks, base, count, out); break;
    }
  });
}

// out[i] = value(rank, base + i): one rank's data, moved unchanged.
void copy_expected(const Gen& g, DataType dt, int rank, std::uint64_t base, std::size_t count, void* out) {
  with_dtype(dt, [&](auto d) {
    for (std::size_t i = 0; i < count; ++i) store_int<decltype(d)::value>(out, i, g.value(rank, base + i));
  });
}

void* offset_ptr(void* p, std::size_t elems, DataType dt) noexcept {
  return static_cast<std::byte*>(p) + elems * dtype_size(dt);
}

template <class U>
std::size_t count_diff(const void* a, const void* b, std::size_t n) noexcept {
  const U* x = static_cast<const U*>(a);
  const U* y = static_cast<const U*>(b);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += x[i] != y[i] ? 1 : 0;
  return wrong;
}

std::string normalise(std::string_view s) {
  std::string out;
  for (char ch : s) {
    if (ch == '_' || ch == '-') continue;
    out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(ch))));
  }
  return out;
}

}  // namespace

std::span<const CollInfo> all_colls() noexcept { return kColls; }

const CollInfo& coll_info(CollKind k) noexcept {
  for (const CollInfo& ci : kColls) {
    if (ci.kind == k) return ci;
  }
  return kColls[0];  // barrier is not described; callers never ask for it
}

std::optional<CollKind> parse_coll(std::string_view s) noexcept {
  const std::string n = normalise(s);
  if (n == "bcast") return CollKind::broadcast;
  for (const CollInfo& ci : kColls) {
    if (n == ci.nccl_name) return ci.kind;
  }
  return std::nullopt;
}

double busbw_factor(CollKind k, int nranks) noexcept {
  const double n = nranks;
  switch (k) {
    case CollKind::all_reduce: return 2.0 * (n - 1) / n;
    case CollKind::reduce_scatter:
    case CollKind::all_gather:
    case CollKind::all_to_all:
    case CollKind::all_to_allv: return (n - 1) / n;
    case CollKind::broadcast:
    case CollKind::reduce: return 1.0;
    case CollKind::barrier: return 0.0;
  }
  return 0.0;
}

double memory_traffic_factor(CollKind k, int nranks) noexcept {
  const double n = std::max(1, nranks);
  switch (k) {
    case CollKind::all_reduce:
    case CollKind::all_to_all:
    case CollKind::all_to_allv: return 2.0 * n;
    case CollKind::reduce_scatter:
    case CollKind::all_gather:
    case CollKind::broadcast:
    case CollKind::reduce: return n + 1.0;
    case CollKind::barrier: return 0.0;
  }
  return 0.0;
}

const char* memory_traffic_formula(CollKind k) noexcept {
  switch (k) {
    case CollKind::all_reduce:
    case CollKind::all_to_all:
    case CollKind::all_to_allv: return "2*n*size";
    case CollKind::barrier: return "0";
    default: return "(n+1)*size";
  }
}

std::size_t alltoallv_pair_count(std::size_t count, int from, int to) noexcept {
  return count * static_cast<std::size_t>((from + 2 * to + 1) % 3);
}

VLayout alltoallv_layout(std::size_t count, int rank, int nranks) {
  VLayout v;
  const auto n = static_cast<std::size_t>(nranks);
  v.send_counts.resize(n);
  v.send_displs.resize(n);
  v.recv_counts.resize(n);
  v.recv_displs.resize(n);
  for (int p = 0; p < nranks; ++p) {
    const auto i = static_cast<std::size_t>(p);
    v.send_counts[i] = alltoallv_pair_count(count, rank, p);
    v.send_displs[i] = v.send_total;
    v.send_total += v.send_counts[i];
    v.recv_counts[i] = alltoallv_pair_count(count, p, rank);
    v.recv_displs[i] = v.recv_total;
    v.recv_total += v.recv_counts[i];
  }
  return v;
}

BufferCounts buffer_counts(const CollCase& c, int rank) {
  const std::size_t n = static_cast<std::size_t>(std::max(1, c.nranks));
  switch (c.kind) {
    case CollKind::all_reduce:
    case CollKind::broadcast:
    case CollKind::reduce: return {c.count, c.count};
    case CollKind::reduce_scatter: return {n * c.count, c.count};
    case CollKind::all_gather: return {c.count, n * c.count};
    case CollKind::all_to_all: return {n * c.count, n * c.count};
    case CollKind::all_to_allv: {
      const VLayout v = alltoallv_layout(c.count, rank, c.nranks);
      return {v.send_total, v.recv_total};
    }
    case CollKind::barrier: return {0, 0};
  }
  return {0, 0};
}

std::size_t count_for_bytes(CollKind k, std::size_t bytes, DataType dt, int nranks) noexcept {
  const std::size_t es = dtype_size(dt);
  const std::size_t elems = es == 0 ? 0 : bytes / es;
  switch (k) {
    case CollKind::reduce_scatter:
    case CollKind::all_gather:
    case CollKind::all_to_all:
    case CollKind::all_to_allv: return elems / static_cast<std::size_t>(std::max(1, nranks));
    default: return elems;
  }
}

std::size_t row_count(CollKind k, std::size_t count, int nranks) noexcept {
  switch (k) {
    case CollKind::reduce_scatter:
    case CollKind::all_gather:
    case CollKind::all_to_all:
    case CollKind::all_to_allv: return count * static_cast<std::size_t>(std::max(1, nranks));
    default: return count;
  }
}

InPlaceLayout in_place_layout(const CollCase& c, int rank) {
  const std::size_t n = static_cast<std::size_t>(std::max(1, c.nranks));
  const std::size_t r = static_cast<std::size_t>(rank);
  switch (c.kind) {
    case CollKind::all_gather: return {n * c.count, r * c.count, 0};
    case CollKind::reduce_scatter: return {n * c.count, 0, r * c.count};
    default: return {c.count, 0, 0};
  }
}

double input_value(const CollCase& c, int rank, std::size_t index) noexcept {
  return static_cast<double>(make_gen(c).value(rank, index));
}

void fill_input(const CollCase& c, int rank, void* sendbuf) {
  const Gen g = make_gen(c);
  copy_expected(g, c.dt, rank, 0, buffer_counts(c, rank).send, sendbuf);
}

bool output_defined(const CollCase& c, int rank) noexcept { return c.kind != CollKind::reduce || rank == c.root; }

void expected_output(const CollCase& c, int rank, void* out) {
  if (!output_defined(c, rank)) return;
  const Gen g = make_gen(c);
  const std::size_t cnt = c.count;
  switch (c.kind) {
    case CollKind::all_reduce:
    case CollKind::reduce: reduce_expected(c, g, 0, cnt, out); break;
    case CollKind::reduce_scatter:
      reduce_expected(c, g, static_cast<std::uint64_t>(rank) * cnt, cnt, out);
      break;
    case CollKind::broadcast: copy_expected(g, c.dt, c.root, 0, cnt, out); break;
    case CollKind::all_gather:
      for (int p = 0; p < c.nranks; ++p) {
        copy_expected(g, c.dt, p, 0, cnt, offset_ptr(out, static_cast<std::size_t>(p) * cnt, c.dt));
      }
      break;
    case CollKind::all_to_all:
      // Block p of my output is block `rank` of peer p's input.
      for (int p = 0; p < c.nranks; ++p) {
        copy_expected(g, c.dt, p, static_cast<std::uint64_t>(rank) * cnt, cnt,
                      offset_ptr(out, static_cast<std::size_t>(p) * cnt, c.dt));
      }
      break;
    case CollKind::all_to_allv: {
      const VLayout mine = alltoallv_layout(cnt, rank, c.nranks);
      for (int p = 0; p < c.nranks; ++p) {
        // Where peer p packed the block it sends me.
        std::size_t peer_displ = 0;
        for (int q = 0; q < rank; ++q) peer_displ += alltoallv_pair_count(cnt, p, q);
        const auto i = static_cast<std::size_t>(p);
        copy_expected(g, c.dt, p, peer_displ, mine.recv_counts[i], offset_ptr(out, mine.recv_displs[i], c.dt));
      }
      break;
    }
    case CollKind::barrier: break;
  }
}

std::size_t count_wrong(const void* got, const void* want, std::size_t n, DataType dt) noexcept {
  switch (dtype_size(dt)) {
    case 1: return count_diff<std::uint8_t>(got, want, n);
    case 2: return count_diff<std::uint16_t>(got, want, n);
    case 4: return count_diff<std::uint32_t>(got, want, n);
    case 8: return count_diff<std::uint64_t>(got, want, n);
    default: return n;
  }
}

std::uint64_t hash_bytes(const void* data, std::size_t bytes, std::uint64_t h) {
  constexpr std::uint64_t kMul = 0x9E3779B97F4A7C15ull;  // odd: multiplying is a bijection
  const auto* p = static_cast<const unsigned char*>(data);
  auto step = [](std::uint64_t x, std::uint64_t w) { return std::rotl((x ^ w) * kMul, 29); };
  auto word = [](const unsigned char* q) {
    std::uint64_t w;
    std::memcpy(&w, q, sizeof w);
    return w;
  };
  std::uint64_t lane[4] = {h, h ^ 1, h ^ 2, h ^ 3};
  std::size_t i = 0;
  for (; i + 32 <= bytes; i += 32) {
    for (int k = 0; k < 4; ++k) lane[k] = step(lane[k], word(p + i + 8 * k));
  }
  for (; i + 8 <= bytes; i += 8) lane[0] = step(lane[0], word(p + i));
  std::uint64_t tail = 0;
  std::memcpy(&tail, p + i, bytes - i);
  // The length goes in too, so that trailing zero bytes count.
  h = step(step(lane[0], tail), bytes);
  for (int k = 1; k < 4; ++k) h = step(h, lane[k]);
  return h;
}

namespace {

// The expected outputs of the latest large cases. The multi-rank matrix
// runs the same cases for every algorithm of a collective, one algorithm
// after another, and computing a rank's expected all-reduce from all n
// ranks' inputs, again for each, was a fifth of its time. A case's output
// depends only on the case and the rank, so the first computation serves
// the rest; the oldest entries go once the cache holds kMaxHeld bytes.
class ExpectedCache {
 public:
  // The expected output of a case of at least kMinBytes, from the cache or
  // computed and kept; nullptr for smaller ones, which are cheaper to
  // compute again than to look up.
  std::shared_ptr<const std::byte[]> get(const CollCase& c, int rank, std::size_t bytes) {
    if (bytes < kMinBytes) return nullptr;
    {
      std::lock_guard lk(mu_);
      for (const Entry& e : entries_) {
        if (same(e.c, c) && e.rank == rank) return e.out;
      }
    }
    // Not value-initialised: expected_output writes every byte.
    std::shared_ptr<std::byte[]> out = std::make_shared_for_overwrite<std::byte[]>(bytes);
    expected_output(c, rank, out.get());
    std::lock_guard lk(mu_);
    entries_.push_back({c, rank, out, bytes});
    held_ += bytes;
    while (held_ > kMaxHeld && entries_.size() > 1) {
      held_ -= entries_.front().bytes;
      entries_.pop_front();
    }
    return out;
  }

 private:
  static constexpr std::size_t kMinBytes = std::size_t{64} << 10;
  static constexpr std::size_t kMaxHeld = std::size_t{128} << 20;
  struct Entry {
    CollCase c;
    int rank;
    std::shared_ptr<const std::byte[]> out;
    std::size_t bytes;
  };
  static bool same(const CollCase& a, const CollCase& b) {
    return a.kind == b.kind && a.dt == b.dt && a.op == b.op && a.count == b.count && a.root == b.root &&
           a.nranks == b.nranks;
  }
  std::mutex mu_;
  std::deque<Entry> entries_;
  std::size_t held_ = 0;
};

}  // namespace

std::size_t check_output(const CollCase& c, int rank, const void* recvbuf) {
  if (!output_defined(c, rank)) return 0;
  const std::size_t n = buffer_counts(c, rank).recv;
  if (n == 0) return 0;
  static ExpectedCache* cache = new ExpectedCache;  // never destroyed: rank threads may outlive statics
  const std::size_t bytes = n * dtype_size(c.dt);
  if (const auto kept = cache->get(c, rank, bytes)) return count_wrong(recvbuf, kept.get(), n, c.dt);
  auto want = std::make_unique_for_overwrite<std::byte[]>(bytes);
  expected_output(c, rank, want.get());
  return count_wrong(recvbuf, want.get(), n, c.dt);
}

std::uint16_t to_f16_bits(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t a = x & 0x7FFFFFFFu;
  if (a >= 0x7F800000u) {  // inf or nan (keep nan quiet and non-zero)
    return static_cast<std::uint16_t>(sign | 0x7C00u | (a > 0x7F800000u ? 0x200u | ((a >> 13) & 0x3FFu) : 0u));
  }
  if (a >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to inf
  if (a < 0x38800000u) {
    // Below f16's smallest normal (2^-14): a subnormal in units of 2^-24.
    // Scaling by 2^24 is exact in float; nearbyint rounds to nearest even.
    const float scaled = std::bit_cast<float>(a) * 16777216.0f;
    return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(std::nearbyint(scaled)));
  }
  const std::uint32_t mant = a & 0x7FFFFFu;
  const std::uint32_t exp = (a >> 23) - 127 + 15;
  std::uint32_t h = (exp << 10) | (mant >> 13);
  const std::uint32_t rem = mant & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry correctly bumps the exponent
  return static_cast<std::uint16_t>(sign | h);
}

float from_f16_bits(std::uint16_t h) noexcept {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  const std::uint32_t mant = h & 0x3FFu;
  if (exp == 0) {
    const float v = static_cast<float>(mant) * (1.0f / 16777216.0f);  // exact
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

std::uint16_t to_bf16_bits(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet nan
  const std::uint32_t lsb = (x >> 16) & 1u;
  return static_cast<std::uint16_t>((x + 0x7FFFu + lsb) >> 16);
}

float from_bf16_bits(std::uint16_t b) noexcept { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

}  // namespace cclz::testing
