// Unit tests for the reduction kernels (src/kernels.hpp): every dtype x op x
// instruction-set variant against scalar references written here, apart from
// the library (value-level f16/bf16 decoding with ldexp, rounding by nearest
// search in a table of representable values, ties to even), at awkward
// counts, unaligned addresses and every exact-aliasing form; reduce_many and
// divide likewise; all 65536 f16/bf16 patterns and ~1.2M chosen f32 patterns
// for the conversions. Cost: a few seconds.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels.hpp"

namespace {

using cclz::DataType;
using cclz::ReduceOp;
namespace kernels = cclz::kernels;

// 128-bit integers for the integer references (a GNU extension, hence the
// __extension__ that keeps -Wpedantic quiet).
__extension__ typedef __int128 i128;
__extension__ typedef unsigned __int128 u128;

constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max};
constexpr std::size_t kCounts[] = {0, 1, 7, 16, 31, 33, 48, 1000, 4097};

std::vector<const kernels::Variant*> variants() {
  std::vector<const kernels::Variant*> v;
  for (kernels::Isa isa : kernels::kAllIsas) {
    if (const kernels::Variant* p = kernels::variant(isa)) v.push_back(p);
  }
  return v;
}

// ---------------------------------------------------------------------------
// Reference formats, by value.

// binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
double ref_half_value(std::uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v;
  if (exp == 0x1f) {
    v = mant ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (exp == 0) {
    v = std::ldexp(mant, -24);
  } else {
    v = std::ldexp(1024 + mant, exp - 25);
  }
  return sign ? -v : v;
}

// bfloat16: 1 sign, 8 exponent (bias 127), 7 mantissa bits.
double ref_bf16_value(std::uint16_t b) {
  const int sign = b >> 15, exp = (b >> 7) & 0xff, mant = b & 0x7f;
  double v;
  if (exp == 0xff) {
    v = mant ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (exp == 0) {
    v = std::ldexp(mant, -133);
  } else {
    v = std::ldexp(128 + mant, exp - 134);
  }
  return sign ? -v : v;
}

// Values of the non-negative codes 0 .. inf in increasing order, with inf
// standing for the next power of two (2^16 for f16, 2^128 for bf16): then
// rounding to nearest even over this table overflows exactly as IEEE says
// (a value at or past max + half an ulp ties or rounds to the even code inf).
struct Table {
  std::vector<double> value;  // value[code]
};
Table make_table(bool bf16) {
  Table t;
  const std::uint16_t inf = bf16 ? 0x7f80 : 0x7c00;
  for (std::uint32_t c = 0; c < inf; ++c) {
    t.value.push_back(bf16 ? ref_bf16_value(static_cast<std::uint16_t>(c))
                           : ref_half_value(static_cast<std::uint16_t>(c)));
  }
  t.value.push_back(bf16 ? std::ldexp(1.0, 128) : 65536.0);
  return t;
}
const Table& half_table() {
  static const Table t = make_table(false);
  return t;
}
const Table& bf16_table() {
  static const Table t = make_table(true);
  return t;
}

// Round a finite or infinite (non-NaN) float by searching the table.
std::uint16_t ref_round(float f, const Table& t) {
  const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double x = std::fabs(static_cast<double>(f));
  const auto& v = t.value;
  const std::uint16_t top = static_cast<std::uint16_t>(v.size() - 1);  // the inf code
  if (x >= v.back()) return sign | top;
  const auto it = std::lower_bound(v.begin(), v.end(), x);  // first value >= x
  const std::uint16_t hi = static_cast<std::uint16_t>(it - v.begin());
  if (v[hi] == x || hi == 0) return sign | hi;
  const std::uint16_t lo = hi - 1;
  const double dlo = x - v[lo], dhi = v[hi] - x;
  if (dlo < dhi) return sign | lo;
  if (dhi < dlo) return sign | hi;
  return sign | ((lo & 1) ? hi : lo);  // tie: even code
}

// NaN conventions (those of x86 F16C): widening sets the quiet bit and keeps
// the payload; narrowing sets the quiet bit and keeps the top payload bits.
std::uint32_t ref_half_nan_to_float_bits(std::uint16_t h) {
  return (static_cast<std::uint32_t>(h & 0x8000) << 16) | 0x7fc00000u | (static_cast<std::uint32_t>(h & 0x3ff) << 13);
}
std::uint16_t ref_float_to_half(float f) {
  if (std::isnan(f)) {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
    return static_cast<std::uint16_t>(((x >> 16) & 0x8000) | 0x7e00 | ((x >> 13) & 0x3ff));
  }
  return ref_round(f, half_table());
}
std::uint16_t ref_float_to_bf16(float f) {
  if (std::isnan(f)) return static_cast<std::uint16_t>((std::bit_cast<std::uint32_t>(f) >> 16) | 0x40);
  return ref_round(f, bf16_table());
}

bool half_is_nan(std::uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
bool bf16_is_nan(std::uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

std::string hex(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// The f32 inputs for the narrowing tests: every high half (sign, exponent,
// top 7 mantissa bits) with low halves placed on and around the rounding
// points of f16 (13 dropped bits) and bf16 (16 dropped bits), plus random.
std::vector<float> narrowing_inputs() {
  static const std::uint16_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x2001,
                                       0x3000, 0x7fff, 0x8000, 0x8001, 0x9000, 0xefff, 0xf000, 0xffff};
  std::vector<float> in;
  in.reserve(65536 * 16 + 200000);
  for (std::uint32_t hi = 0; hi < 65536; ++hi) {
    for (std::uint16_t lo : lows) in.push_back(std::bit_cast<float>((hi << 16) | lo));
  }
  std::mt19937 rng(12345);
  for (int i = 0; i < 200000; ++i) in.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(rng())));
  return in;
}

// ---------------------------------------------------------------------------
// Conversions.

TEST(KernelsConvert, HalfToFloatAllPatterns) {
  for (std::uint32_t c = 0; c < 65536; ++c) {
    const std::uint16_t h = static_cast<std::uint16_t>(c);
    const float f = kernels::half_to_float(h);
    if (half_is_nan(h)) {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(f), ref_half_nan_to_float_bits(h)) << hex(h);
    } else {
      ASSERT_EQ(static_cast<double>(f), ref_half_value(h)) << hex(h);
      ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << hex(h);  // -0 stays -0
    }
  }
}

TEST(KernelsConvert, Bf16ToFloatAllPatterns) {
  for (std::uint32_t c = 0; c < 65536; ++c) {
    const std::uint16_t b = static_cast<std::uint16_t>(c);
    const float f = kernels::bf16_to_float(b);
    if (bf16_is_nan(b)) {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(f), (c << 16) | 0x00400000u) << hex(b);
    } else {
      ASSERT_EQ(static_cast<double>(f), ref_bf16_value(b)) << hex(b);
      ASSERT_EQ(std::signbit(f), (b & 0x8000) != 0) << hex(b);
    }
  }
}

TEST(KernelsConvert, RoundTripAllPatterns) {
  for (std::uint32_t c = 0; c < 65536; ++c) {
    const std::uint16_t h = static_cast<std::uint16_t>(c);
    const std::uint16_t quiet_h = half_is_nan(h) ? static_cast<std::uint16_t>(h | 0x200) : h;
    ASSERT_EQ(kernels::float_to_half(kernels::half_to_float(h)), quiet_h) << hex(h);
    const std::uint16_t quiet_b = bf16_is_nan(h) ? static_cast<std::uint16_t>(h | 0x40) : h;
    ASSERT_EQ(kernels::float_to_bf16(kernels::bf16_to_float(h)), quiet_b) << hex(h);
  }
}

TEST(KernelsConvert, NarrowingMatchesReference) {
  const std::vector<float> in = narrowing_inputs();
  for (float f : in) {
    ASSERT_EQ(kernels::float_to_half(f), ref_float_to_half(f)) << hex(std::bit_cast<std::uint32_t>(f));
    ASSERT_EQ(kernels::float_to_bf16(f), ref_float_to_bf16(f)) << hex(std::bit_cast<std::uint32_t>(f));
  }
}

TEST(KernelsConvert, NamedRoundingCases) {
  const auto h = [](float f) { return kernels::float_to_half(f); };
  EXPECT_EQ(h(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie -> even (down)
  EXPECT_EQ(h(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(h(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3c01);  // just above a tie
  EXPECT_EQ(h(65504.0f), 0x7bff);
  EXPECT_EQ(h(65519.99f), 0x7bff);
  EXPECT_EQ(h(65520.0f), 0x7c00);  // max + half an ulp ties to the even code: inf
  EXPECT_EQ(h(-1e10f), 0xfc00);
  EXPECT_EQ(h(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(h(std::ldexp(1.0f, -25)), 0x0000);  // tie between 0 and it -> 0
  EXPECT_EQ(h(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(h(std::ldexp(3.0f, -25)), 0x0002);  // tie 1 / 2 -> 2
  EXPECT_EQ(h(-std::ldexp(1.0f, -30)), 0x8000);  // underflow keeps the sign
  EXPECT_EQ(h(std::ldexp(1023.5f, -24)), 0x0400);  // rounds up into the normals
  EXPECT_EQ(h(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_TRUE(half_is_nan(h(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(half_is_nan(h(std::bit_cast<float>(0x7f800001u))));  // payload only in low bits: still NaN
  const auto b = [](float f) { return kernels::float_to_bf16(f); };
  EXPECT_EQ(b(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie -> even (down)
  EXPECT_EQ(b(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(b(std::numeric_limits<float>::max()), 0x7f80);  // rounds to inf
  EXPECT_EQ(b(std::bit_cast<float>(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(b(std::bit_cast<float>(0x00008000u)), 0x0000);  // subnormal tie -> even
  EXPECT_EQ(b(std::bit_cast<float>(0x00018000u)), 0x0002);
  EXPECT_TRUE(bf16_is_nan(b(std::bit_cast<float>(0x7fffffffu))));  // no carry of a NaN into the sign
  EXPECT_TRUE(bf16_is_nan(b(std::bit_cast<float>(0x7f800001u))));
}

// Every ISA's bulk conversions agree bit for bit with the scalar ones, at
// unaligned addresses too.
TEST(KernelsConvert, BulkVariantsMatchScalar) {
  const std::vector<float> in = narrowing_inputs();
  std::vector<std::uint16_t> all(65536);
  for (std::uint32_t c = 0; c < 65536; ++c) all[c] = static_cast<std::uint16_t>(c);
  for (const kernels::Variant* v : variants()) {
    SCOPED_TRACE(kernels::isa_name(v->isa));
    for (std::size_t off : {std::size_t{0}, std::size_t{1}}) {
      std::vector<unsigned char> fbuf(in.size() * 4 + 8), hbuf(in.size() * 2 + 8);
      float* fp = reinterpret_cast<float*>(fbuf.data() + off);
      std::uint16_t* hp = reinterpret_cast<std::uint16_t*>(hbuf.data() + off);
      for (bool bf16 : {false, true}) {
        std::memcpy(fbuf.data() + off, in.data(), in.size() * 4);  // the widening below overwrites it
        (bf16 ? v->float_to_bf16 : v->float_to_half)(fp, hp, in.size());
        for (std::size_t i = 0; i < in.size(); ++i) {
          std::uint16_t got;
          std::memcpy(&got, hbuf.data() + off + 2 * i, 2);
          const std::uint16_t want = bf16 ? kernels::float_to_bf16(in[i]) : kernels::float_to_half(in[i]);
          ASSERT_EQ(got, want) << (bf16 ? "bf16 " : "f16 ") << hex(std::bit_cast<std::uint32_t>(in[i]));
        }
        std::memcpy(hbuf.data() + off, all.data(), all.size() * 2);
        (bf16 ? v->bf16_to_float : v->half_to_float)(hp, fp, all.size());
        for (std::size_t i = 0; i < all.size(); ++i) {
          float got;
          std::memcpy(&got, fbuf.data() + off + 4 * i, 4);
          const float want = bf16 ? kernels::bf16_to_float(all[i]) : kernels::half_to_float(all[i]);
          ASSERT_EQ(std::bit_cast<std::uint32_t>(got), std::bit_cast<std::uint32_t>(want)) << hex(all[i]);
        }
      }
    }
  }
  // The span front ends convert min(src, dst) elements.
  std::vector<float> f = {1.5f, -2.0f, 3.0f};
  std::vector<std::uint16_t> h(2, 0xffff);
  kernels::float_to_half(f, h);
  EXPECT_EQ(h[0], 0x3e00);
  EXPECT_EQ(h[1], 0xc000);
  std::vector<float> back(3, 7.0f);
  kernels::half_to_float(h, back);
  EXPECT_EQ(back[0], 1.5f);
  EXPECT_EQ(back[1], -2.0f);
  EXPECT_EQ(back[2], 7.0f);
  kernels::float_to_bf16(f, h);
  EXPECT_EQ(h[0], 0x3fc0);
  kernels::bf16_to_float(h, back);
  EXPECT_EQ(back[0], 1.5f);
}

// ---------------------------------------------------------------------------
// Element references. Values travel as raw bits in a uint64.

template <class T>
T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <class T>
void store(unsigned char* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

// Integer ops modulo 2^bits, through 128-bit arithmetic and a mask.
template <class T>
T ref_int(ReduceOp op, T a, T b) {
  using U = std::make_unsigned_t<T>;
  const u128 ua = static_cast<U>(a), ub = static_cast<U>(b);
  const u128 mask = (static_cast<u128>(1) << (8 * sizeof(T))) - 1;
  switch (op) {
    case ReduceOp::sum: return static_cast<T>(static_cast<U>((ua + ub) & mask));
    case ReduceOp::prod: return static_cast<T>(static_cast<U>((ua * ub) & mask));
    case ReduceOp::min: return std::min(a, b);
    case ReduceOp::max: return std::max(a, b);
    default: return a;
  }
}

// IEEE 754-2019 minimum/maximum and plain arithmetic in F.
template <class F>
F ref_float(ReduceOp op, F a, F b) {
  switch (op) {
    case ReduceOp::sum: return a + b;
    case ReduceOp::prod: return a * b;
    case ReduceOp::min:
    case ReduceOp::max: {
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<F>::quiet_NaN();
      if (a == 0 && b == 0) {  // only the signs can differ
        const bool neg = op == ReduceOp::min ? (std::signbit(a) || std::signbit(b))
                                             : (std::signbit(a) && std::signbit(b));
        return neg ? -F(0) : F(0);
      }
      return op == ReduceOp::min ? (a < b ? a : b) : (a > b ? a : b);
    }
    default: return a;
  }
}

float ref_widen(DataType dt, std::uint16_t v) {
  return static_cast<float>(dt == DataType::f16 ? ref_half_value(v) : ref_bf16_value(v));
}
std::uint16_t ref_narrow(DataType dt, float f) {
  return dt == DataType::f16 ? ref_float_to_half(f) : ref_float_to_bf16(f);
}

// Left fold over k inputs (element i of each), in the accumulation type, then
// stored as dt. Returns the raw bits of the result.
std::uint64_t ref_fold(DataType dt, ReduceOp op, const std::vector<const unsigned char*>& in) {
  switch (dt) {
    case DataType::i8: {
      auto acc = load<std::int8_t>(in[0]);
      for (std::size_t s = 1; s < in.size(); ++s) acc = ref_int(op, acc, load<std::int8_t>(in[s]));
      return static_cast<std::uint8_t>(acc);
    }
    case DataType::u8: {
      auto acc = load<std::uint8_t>(in[0]);
      for (std::size_t s = 1; s < in.size(); ++s) acc = ref_int(op, acc, load<std::uint8_t>(in[s]));
      return acc;
    }
    case DataType::i32: {
      auto acc = load<std::int32_t>(in[0]);
      for (std::size_t s = 1; s < in.size(); ++s) acc = ref_int(op, acc, load<std::int32_t>(in[s]));
      return static_cast<std::uint32_t>(acc);
    }
    case DataType::i64: {
      auto acc = load<std::int64_t>(in[0]);
      for (std::size_t s = 1; s < in.size(); ++s) acc = ref_int(op, acc, load<std::int64_t>(in[s]));
      return static_cast<std::uint64_t>(acc);
    }
    case DataType::f32: {
      auto acc = load<float>(in[0]);
      for (std::size_t s = 1; s < in.size(); ++s) acc = ref_float(op, acc, load<float>(in[s]));
      return std::bit_cast<std::uint32_t>(acc);
    }
    case DataType::f64: {
      auto acc = load<double>(in[0]);
      for (std::size_t s = 1; s < in.size(); ++s) acc = ref_float(op, acc, load<double>(in[s]));
      return std::bit_cast<std::uint64_t>(acc);
    }
    case DataType::f16:
    case DataType::bf16: {
      float acc = ref_widen(dt, load<std::uint16_t>(in[0]));
      for (std::size_t s = 1; s < in.size(); ++s) acc = ref_float(op, acc, ref_widen(dt, load<std::uint16_t>(in[s])));
      return ref_narrow(dt, acc);
    }
  }
  return 0;
}

// NaN results compare as "is a quiet NaN" (which input's payload survives
// when both are NaN is unspecified); everything else bit for bit.
bool is_nan_bits(DataType dt, std::uint64_t v) {
  switch (dt) {
    case DataType::f32: return (v & 0x7fffffffu) > 0x7f800000u;
    case DataType::f64: return (v & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    case DataType::f16: return half_is_nan(static_cast<std::uint16_t>(v));
    case DataType::bf16: return bf16_is_nan(static_cast<std::uint16_t>(v));
    default: return false;
  }
}
bool is_quiet_nan_bits(DataType dt, std::uint64_t v) {
  switch (dt) {
    case DataType::f32: return is_nan_bits(dt, v) && (v & 0x00400000u);
    case DataType::f64: return is_nan_bits(dt, v) && (v & 0x0008000000000000ull);
    case DataType::f16: return is_nan_bits(dt, v) && (v & 0x200);
    case DataType::bf16: return is_nan_bits(dt, v) && (v & 0x40);
    default: return false;
  }
}
// memcpy with a null source is UB even for 0 bytes (empty vectors have one).
void copy_bytes(unsigned char* dst, const unsigned char* src, std::size_t bytes) {
  if (bytes != 0) std::memcpy(dst, src, bytes);
}

std::uint64_t load_bits(DataType dt, const unsigned char* p) {
  std::uint64_t v = 0;
  std::memcpy(&v, p, cclz::dtype_size(dt));  // little endian: low bytes
  return v;
}

// Random inputs with the special values mixed in.
void fill_random(DataType dt, unsigned char* p, std::size_t n, std::mt19937_64& rng) {
  const std::size_t es = cclz::dtype_size(dt);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t r = rng();
    const unsigned pick = static_cast<unsigned>(r >> 56);  // 0..255
    unsigned char* q = p + i * es;
    switch (dt) {
      case DataType::f32: {
        static const std::uint32_t special[] = {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000,
                                                0x7fa00001, 0xffc12345, 0x00000001, 0x007fffff, 0x00800000,
                                                0x7f7fffff, 0xff7fffff, 0x3f800000, 0xbf800000};
        std::uint32_t bits;
        if (pick < 24) {
          bits = special[r % std::size(special)];
        } else if (pick < 64) {
          bits = static_cast<std::uint32_t>(r);  // any pattern
        } else {  // moderate magnitudes, so sums and products round
          const std::uint32_t exp = 110 + static_cast<std::uint32_t>((r >> 32) % 36);
          bits = (static_cast<std::uint32_t>(r >> 40) & 0x80000000u) | (exp << 23) | (static_cast<std::uint32_t>(r) & 0x7fffff);
        }
        store(q, bits);
        break;
      }
      case DataType::f64: {
        static const std::uint64_t special[] = {0, 0x8000000000000000ull, 0x7ff0000000000000ull,
                                                0xfff0000000000000ull, 0x7ff8000000000000ull, 0x7ff0000000000001ull,
                                                1, 0x000fffffffffffffull, 0x7fefffffffffffffull,
                                                0x3ff0000000000000ull};
        std::uint64_t bits;
        if (pick < 24) {
          bits = special[(r >> 3) % std::size(special)];
        } else if (pick < 64) {
          bits = rng();
        } else {
          const std::uint64_t exp = 1000 + (r >> 20) % 48;
          bits = ((r << 20) & 0x8000000000000000ull) | (exp << 52) | (rng() & 0xfffffffffffffull);
        }
        store(q, bits);
        break;
      }
      case DataType::f16:
      case DataType::bf16: {
        // signed zeros, infinities, quiet and signalling NaNs, smallest and
        // largest subnormal, largest finite, +-1 -- f16 codes, then bf16
        static const std::uint16_t special[2][12] = {
            {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0x0001, 0x03ff, 0x7bff, 0xfbff, 0x3c00, 0xbc00},
            {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0x7f81, 0x0001, 0x007f, 0x7f7f, 0xff7f, 0x3f80, 0xbf80}};
        std::uint16_t bits = static_cast<std::uint16_t>(r);  // every pattern: NaN, inf, subnormal, ...
        if (pick < 32) {
          bits = special[dt == DataType::bf16][(r >> 20) % 12];
        } else if (pick >= 128) {  // half of them near 1 so that sums and products round often
          bits = static_cast<std::uint16_t>((dt == DataType::f16 ? 0x3800 : 0x3f00) + (r % 0x400));
          if (r & 0x10000) bits |= 0x8000;
        }
        store(q, bits);
        break;
      }
      case DataType::i8:
      case DataType::u8: *q = static_cast<unsigned char>(r); break;
      case DataType::i32: store(q, static_cast<std::uint32_t>(r)); break;
      case DataType::i64: store(q, r); break;
    }
  }
}

std::string case_name(const kernels::Variant* v, DataType dt, ReduceOp op, std::size_t n, const char* alias,
                      std::size_t off) {
  return std::string(kernels::isa_name(v->isa)) + " " + cclz::dtype_name(dt) + " " + cclz::op_name(op) +
         " n=" + std::to_string(n) + " " + alias + " off=" + std::to_string(off);
}

// Checks dst (n elements at dp) against the fold of the inputs and that the
// guard bytes after it are untouched.
::testing::AssertionResult check_result(DataType dt, ReduceOp op, const unsigned char* dp, std::size_t n,
                                        const std::vector<std::vector<unsigned char>>& inputs,
                                        const unsigned char* guard) {
  const std::size_t es = cclz::dtype_size(dt);
  std::vector<const unsigned char*> elems(inputs.size());
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t s = 0; s < inputs.size(); ++s) elems[s] = inputs[s].data() + i * es;
    const std::uint64_t want = ref_fold(dt, op, elems);
    const std::uint64_t got = load_bits(dt, dp + i * es);
    const bool ok = is_nan_bits(dt, want) ? is_quiet_nan_bits(dt, got) : got == want;
    if (!ok) {
      std::string in;
      for (const unsigned char* e : elems) in += hex(load_bits(dt, e)) + " ";
      return ::testing::AssertionFailure() << "element " << i << ": inputs " << in << "want " << hex(want)
                                           << " got " << hex(got);
    }
  }
  for (std::size_t j = 0; j < 16; ++j) {
    if (guard[j] != 0xa5) return ::testing::AssertionFailure() << "wrote past the end";
  }
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------
// reduce

enum Alias { distinct, dst_is_a, dst_is_b, all_same };
const char* const kAliasNames[] = {"distinct", "dst==a", "dst==b", "dst==a==b"};

// One two-input reduce of n random elements against the reference: three
// separate arenas, each pointer at byte offset off (+ a different one for
// b, so a and b are misaligned differently), dst aliased as `alias` says.
::testing::AssertionResult reduce_case(const kernels::Variant* v, DataType dt, ReduceOp op, std::size_t n,
                                       int alias, std::size_t off, std::mt19937_64& rng) {
  const std::size_t es = cclz::dtype_size(dt);
  std::vector<std::vector<unsigned char>> in(2, std::vector<unsigned char>(n * es));
  fill_random(dt, in[0].data(), n, rng);
  fill_random(dt, in[1].data(), n, rng);
  if (alias == all_same) in[1] = in[0];
  const std::size_t span = n * es + 64;
  std::vector<unsigned char> arena(3 * span, 0xa5);
  unsigned char* a = arena.data() + off;
  unsigned char* b = arena.data() + span + off + (off ? 2 : 0);
  unsigned char* d = arena.data() + 2 * span + off;
  copy_bytes(a, in[0].data(), n * es);
  copy_bytes(b, in[1].data(), n * es);
  if (alias == dst_is_a) d = a;
  if (alias == dst_is_b) d = b;
  if (alias == all_same) d = b = a;
  v->reduce(d, a, b, n, dt, op);
  return check_result(dt, op, d, n, in, d + n * es);
}

TEST(KernelsReduce, EveryVariantDtypeOpCountAliasAndAlignment) {
  std::mt19937_64 rng(42);
  for (const kernels::Variant* v : variants()) {
    for (DataType dt : cclz::kAllDataTypes) {
      for (ReduceOp op : kOps) {
        for (std::size_t n : kCounts) {
          for (int alias = distinct; alias <= all_same; ++alias) {
            for (std::size_t off : {std::size_t{0}, std::size_t{1}, std::size_t{3}}) {
              SCOPED_TRACE(case_name(v, dt, op, n, kAliasNames[alias], off));
              ASSERT_TRUE(reduce_case(v, dt, op, n, alias, off, rng));
            }
          }
        }
      }
    }
  }
}

// Calls past the 128 Ki elements up to which the two-input 16-bit steps
// prefetch their sources (kernels.cpp, kAheadMaxElems) take the other
// loop: every float type, op and variant at a count above it whose
// remainder takes a 16-element step and a masked tail, aligned and not.
TEST(KernelsReduce, LongCallsEveryVariant) {
  std::mt19937_64 rng(11);
  constexpr std::size_t n = (std::size_t{128} << 10) + 49;
  for (const kernels::Variant* v : variants()) {
    for (DataType dt : {DataType::f32, DataType::f16, DataType::bf16}) {
      for (ReduceOp op : kOps) {
        for (std::size_t off : {std::size_t{0}, std::size_t{1}}) {
          SCOPED_TRACE(case_name(v, dt, op, n, kAliasNames[distinct], off));
          ASSERT_TRUE(reduce_case(v, dt, op, n, distinct, off, rng));
        }
      }
    }
  }
}

// Every f16 and bf16 pattern as the first operand, against second operands
// that make ties, cancellations, overflows and subnormal results (each
// pattern's neighbour, itself negated, one and eleven binades up, and a
// scrambled one), in every variant: bit for bit the widened reference. The
// avx512fp16 variant reduces f16 in native half arithmetic, which has to
// agree with widening to f32 and rounding back.
TEST(KernelsReduce, HalvesEveryPatternEveryVariant) {
  constexpr std::size_t kPatterns = 1 << 16;
  const std::pair<unsigned, unsigned> partners[] = {{1, 0},      {1, 1},      {1, 0x8000}, {1, 0x8001},
                                                    {1, 0x0400}, {1, 0x2c00}, {40503, 12345}};
  std::vector<std::uint16_t> a(kPatterns), b(kPatterns), d(kPatterns), want(kPatterns);
  for (std::size_t i = 0; i < kPatterns; ++i) a[i] = static_cast<std::uint16_t>(i);
  std::vector<const unsigned char*> elems(2);
  for (DataType dt : {DataType::f16, DataType::bf16}) {
    for (ReduceOp op : kOps) {
      for (const auto& [mul, add] : partners) {
        for (std::size_t i = 0; i < kPatterns; ++i) {
          b[i] = static_cast<std::uint16_t>(i * mul + add);
          elems[0] = reinterpret_cast<const unsigned char*>(&a[i]);
          elems[1] = reinterpret_cast<const unsigned char*>(&b[i]);
          want[i] = static_cast<std::uint16_t>(ref_fold(dt, op, elems));
        }
        for (const kernels::Variant* v : variants()) {
          v->reduce(d.data(), a.data(), b.data(), kPatterns, dt, op);
          std::size_t wrong = 0, first = 0;
          for (std::size_t i = 0; i < kPatterns; ++i) {
            const bool ok = is_nan_bits(dt, want[i]) ? is_quiet_nan_bits(dt, d[i]) : d[i] == want[i];
            if (!ok && wrong++ == 0) first = i;
          }
          EXPECT_EQ(wrong, 0u) << kernels::isa_name(v->isa) << " " << cclz::dtype_name(dt) << " "
                               << cclz::op_name(op) << " b = a * " << mul << " + " << add << ": first " << hex(a[first])
                               << " and " << hex(b[first]) << " want " << hex(want[first]) << " got " << hex(d[first]);
        }
      }
    }
  }
}

// The dispatching entry point gives what its variant gives.
TEST(KernelsReduce, EntryPointUsesBestVariant) {
  const kernels::Variant& best = kernels::best_variant();
  EXPECT_EQ(kernels::variant(best.isa), &best);
  std::printf("[ INFO     ] kernels use the %s variant\n", kernels::isa_name(best.isa));
  std::mt19937_64 rng(7);
  for (DataType dt : cclz::kAllDataTypes) {
    for (ReduceOp op : kOps) {
      const std::size_t n = 777, es = cclz::dtype_size(dt);
      std::vector<unsigned char> a(n * es), b(n * es), d1(n * es + 16, 0xa5), d2(n * es + 16, 0xa5);
      fill_random(dt, a.data(), n, rng);
      fill_random(dt, b.data(), n, rng);
      kernels::reduce(d1.data(), a.data(), b.data(), n, dt, op);
      best.reduce(d2.data(), a.data(), b.data(), n, dt, op);
      EXPECT_EQ(d1, d2) << cclz::dtype_name(dt) << " " << cclz::op_name(op);
      ASSERT_TRUE(check_result(dt, op, d1.data(), n, {a, b}, d1.data() + n * es));
    }
  }
}

TEST(KernelsReduce, NamedCases) {
  // Integer wrap-around, no UB (run under -fsanitize=undefined to see it).
  std::int32_t a32[] = {std::numeric_limits<std::int32_t>::max(), std::numeric_limits<std::int32_t>::min(), 65536};
  std::int32_t b32[] = {1, -1, 65536};
  std::int32_t d32[3];
  kernels::reduce(d32, a32, b32, 3, DataType::i32, ReduceOp::sum);
  EXPECT_EQ(d32[0], std::numeric_limits<std::int32_t>::min());
  EXPECT_EQ(d32[1], std::numeric_limits<std::int32_t>::max());
  kernels::reduce(d32, a32, b32, 3, DataType::i32, ReduceOp::prod);
  EXPECT_EQ(d32[2], 0);  // 2^32 wraps to 0
  std::int8_t a8[] = {127, -128, -7}, b8[] = {1, -1, 3}, d8[3];
  kernels::reduce(d8, a8, b8, 3, DataType::i8, ReduceOp::sum);
  EXPECT_EQ(d8[0], -128);
  EXPECT_EQ(d8[1], 127);
  kernels::reduce(d8, a8, b8, 3, DataType::i8, ReduceOp::min);
  EXPECT_EQ(d8[0], 1);
  EXPECT_EQ(d8[2], -7);
  std::uint8_t au[] = {200, 16}, bu[] = {100, 16}, du[2];
  kernels::reduce(du, au, bu, 2, DataType::u8, ReduceOp::sum);
  EXPECT_EQ(du[0], 44);
  kernels::reduce(du, au, bu, 2, DataType::u8, ReduceOp::prod);
  EXPECT_EQ(du[1], 0);
  kernels::reduce(du, au, bu, 2, DataType::u8, ReduceOp::max);
  EXPECT_EQ(du[0], 200);  // unsigned compare
  // NaN propagates through min and max from either side; -0 < +0.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float fa[] = {nan, 1.0f, -0.0f, 0.0f}, fb[] = {1.0f, nan, 0.0f, -0.0f}, fd[4];
  kernels::reduce(fd, fa, fb, 4, DataType::f32, ReduceOp::min);
  EXPECT_TRUE(std::isnan(fd[0]));
  EXPECT_TRUE(std::isnan(fd[1]));
  EXPECT_TRUE(std::signbit(fd[2]) && fd[2] == 0);
  EXPECT_TRUE(std::signbit(fd[3]) && fd[3] == 0);
  kernels::reduce(fd, fa, fb, 4, DataType::f32, ReduceOp::max);
  EXPECT_TRUE(std::isnan(fd[0]));
  EXPECT_TRUE(std::isnan(fd[1]));
  EXPECT_TRUE(!std::signbit(fd[2]) && fd[2] == 0);
  EXPECT_TRUE(!std::signbit(fd[3]) && fd[3] == 0);
  // f16: 1 + 2^-11 is not representable; 1 + 1/1024 + 1/2048 rounds to even.
  std::uint16_t ha[] = {0x3c00, 0x3c01, 0x7bff, 0x7c00}, hb[] = {0x1000, 0x1000, 0x7bff, 0xfc00}, hd[4];
  kernels::reduce(hd, ha, hb, 4, DataType::f16, ReduceOp::sum);
  EXPECT_EQ(hd[0], 0x3c00);  // 1 + 2^-11: tie -> 1
  EXPECT_EQ(hd[1], 0x3c02);  // (1 + 2^-10) + 2^-11: tie -> even
  EXPECT_EQ(hd[2], 0x7c00);  // overflow -> inf
  EXPECT_TRUE(half_is_nan(hd[3]));  // inf + -inf
  std::uint16_t ba[] = {0x3f80, 0x7f7f}, bb[] = {0x3b80, 0x7f7f}, bd[2];
  kernels::reduce(bd, ba, bb, 2, DataType::bf16, ReduceOp::sum);
  EXPECT_EQ(bd[0], 0x3f80);  // 1 + 2^-8: tie -> 1
  EXPECT_EQ(bd[1], 0x7f80);  // overflow -> inf
}

TEST(KernelsReduce, InvalidArgumentsLeaveDstUntouched) {
  float a[4] = {1, 2, 3, 4}, b[4] = {1, 1, 1, 1}, d[4] = {9, 9, 9, 9};
  kernels::reduce(d, a, b, 4, DataType::f32, ReduceOp::avg);
  kernels::reduce(d, a, b, 4, static_cast<DataType>(3), ReduceOp::sum);
  kernels::reduce(d, a, b, 4, DataType::f32, static_cast<ReduceOp>(17));
  const void* srcs[] = {a, b};
  kernels::reduce_many(d, srcs, 4, DataType::f32, ReduceOp::avg);
  kernels::reduce_many(d, {}, 4, DataType::f32, ReduceOp::sum);
  for (float x : d) EXPECT_EQ(x, 9.0f);
}

// ---------------------------------------------------------------------------
// reduce_many

TEST(KernelsReduceMany, FoldsEveryDtypeOpAndAlias) {
  std::mt19937_64 rng(99);
  for (const kernels::Variant* v : variants()) {
    for (DataType dt : cclz::kAllDataTypes) {
      const std::size_t es = cclz::dtype_size(dt);
      for (ReduceOp op : kOps) {
        for (std::size_t k : {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{5}, std::size_t{9}}) {
          for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{31}, std::size_t{48}, std::size_t{1000},
                                std::size_t{2049}}) {
            // alias: -1 = dst separate, otherwise dst == srcs[alias]
            for (int alias : {-1, 0, static_cast<int>(k) - 1, static_cast<int>(k / 2)}) {
              // copy: none, a buffer of its own, or (as a peer's buffer in
              // place) exactly another source than dst's.
              for (int copy_mode : {-2, -1, 0}) {
                const int copy_src = alias < 0 ? 0 : (alias + 1) % static_cast<int>(k);
                if (copy_mode == 0 && copy_src == alias) continue;
                SCOPED_TRACE(std::string(kernels::isa_name(v->isa)) + " " + cclz::dtype_name(dt) + " " +
                             cclz::op_name(op) + " k=" + std::to_string(k) + " n=" + std::to_string(n) +
                             " alias=" + std::to_string(alias) + " copy=" +
                             (copy_mode == -2 ? "none" : copy_mode == -1 ? "own" : std::to_string(copy_src)));
                std::vector<std::vector<unsigned char>> in(k, std::vector<unsigned char>(n * es));
                const std::size_t span = n * es + 32;
                std::vector<unsigned char> arena((k + 2) * span, 0xa5);
                std::vector<const void*> ptrs(k);
                for (std::size_t s = 0; s < k; ++s) {
                  fill_random(dt, in[s].data(), n, rng);
                  unsigned char* p = arena.data() + s * span + (s % 3);  // mixed misalignment
                  copy_bytes(p, in[s].data(), n * es);
                  ptrs[s] = p;
                }
                unsigned char* d = arena.data() + k * span + 1;
                if (alias >= 0) d = const_cast<unsigned char*>(static_cast<const unsigned char*>(ptrs[alias]));
                unsigned char* c = copy_mode == -2   ? nullptr
                                   : copy_mode == -1 ? arena.data() + (k + 1) * span + 2
                                                     : const_cast<unsigned char*>(
                                                           static_cast<const unsigned char*>(ptrs[copy_src]));
                v->reduce_many(d, c, ptrs.data(), k, n, dt, op);
                if (k == 1) {  // a plain copy, NaN payloads and all
                  ASSERT_TRUE(n == 0 || std::memcmp(d, in[0].data(), n * es) == 0);
                } else {
                  ASSERT_TRUE(check_result(dt, op, d, n, in, d + n * es));
                }
                if (c != nullptr) {  // the same bytes, and nothing past them
                  ASSERT_TRUE(n == 0 || std::memcmp(c, d, n * es) == 0);
                  for (std::size_t g = 0; g < 16; ++g) ASSERT_EQ(c[n * es + g], 0xa5) << "byte " << g << " past copy";
                }
              }
            }
          }
        }
      }
    }
  }
}

// reduce_many_stream: the fold of the k sources (the reference of the tests
// above) in both outputs, bitwise what reduce_many_copy gives (a NaN for a
// NaN: the compiler may swap a scalar sum's operands, and with them which
// payload a NaN carries), nothing written past
// either, for 2 to 5 sources, every count around the vector steps, every
// byte alignment of the outputs (alike mod 16) and exact aliasing of a
// source by either output, with dst streamed or stored ordinarily. f16 and
// bf16 from 3 sources are declined.
TEST(KernelsReduceManyStream, FoldsIntoBothOutputs) {
  const bool has_kernel = kernels::variant(kernels::Isa::avx2) != nullptr;
  if (!has_kernel) std::printf("[ INFO     ] no AVX2: reduce_many_stream must decline every call\n");
  std::mt19937_64 rng(2026);
  for (DataType dt : {DataType::f32, DataType::f16, DataType::bf16}) {
    const std::size_t es = cclz::dtype_size(dt);
    for (ReduceOp op : kOps) {
      for (std::size_t k : {std::size_t{2}, std::size_t{3}, std::size_t{5}}) {
        for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{9},
                              std::size_t{15}, std::size_t{16}, std::size_t{17}, std::size_t{33}, std::size_t{1000},
                              std::size_t{4099}}) {
          // Every offset in a line: the streamed output starts on a line,
          // after up to 63 bytes stored ordinarily.
          for (std::size_t off = 0; off < 64; off += off < 16 ? es : 8) {
            // place: 0 distinct, 1 copy == the first source (in place), 2 dst == the last;
            // modes 6 and 7 stream dst alone (copy nullptr), places 0 and 2
            for (int alias = 0; alias < 8; ++alias) {
              const bool one = alias >= 6;
              const bool dst_streamed = alias < 3 || one;
              const int place = one ? (alias == 6 ? 0 : 2) : alias % 3;
              SCOPED_TRACE(std::string(cclz::dtype_name(dt)) + " " + cclz::op_name(op) + " k=" + std::to_string(k) +
                           " n=" + std::to_string(n) + " off=" + std::to_string(off) +
                           " alias=" + std::to_string(place) +
                           (one ? " dst alone" : dst_streamed ? " dst streamed" : " dst cached"));
              std::vector<std::vector<unsigned char>> in(k, std::vector<unsigned char>(n * es));
              for (auto& v : in) fill_random(dt, v.data(), n, rng);
              const std::size_t span = (n * es + 128 + 63) / 64 * 64;  // room for off + 16 and a guard
              // A 64-byte aligned arena: the k sources, dst, copy. The outputs
              // sit at off and off + 16 (alike mod 16); the sources at other
              // offsets unless an output is one of them.
              std::vector<unsigned char> store_((k + 2) * span + 64, 0xa5);
              unsigned char* base = store_.data() + (64 - reinterpret_cast<std::uintptr_t>(store_.data()) % 64) % 64;
              std::vector<unsigned char*> src(k);
              for (std::size_t j = 0; j < k; ++j) {
                src[j] = base + j * span + (j == 0 || (place == 2 && j == k - 1) ? off : (off + 2 * es * j) % 16);
                copy_bytes(src[j], in[j].data(), n * es);
              }
              unsigned char* d = base + k * span + off + 16;
              unsigned char* c = base + (k + 1) * span + off;
              if (place == 1) c = src[0];
              if (place == 2) d = src[k - 1];
              // What reduce_many_copy gives, from the same inputs elsewhere.
              std::vector<unsigned char> want(n * es + 1), want_copy(n * es + 1);
              std::vector<const void*> ins(k);
              for (std::size_t j = 0; j < k; ++j) ins[j] = in[j].data();
              kernels::reduce_many_copy(want.data(), want_copy.data(), ins, n, dt, op);
              std::vector<const void*> srcs(src.begin(), src.end());
              const bool streams = has_kernel && (dt == DataType::f32 || k == 2);
              ASSERT_EQ(kernels::reduce_many_stream(d, one ? nullptr : c, srcs, n, dt, op, dst_streamed), streams);
              if (!streams) continue;
              ASSERT_TRUE(check_result(dt, op, d, n, in, d + n * es));
              for (std::size_t i = 0; i < n; ++i) {
                const std::uint64_t got = load_bits(dt, d + i * es), same = load_bits(dt, want.data() + i * es);
                ASSERT_TRUE(got == same || (is_nan_bits(dt, got) && is_nan_bits(dt, same)))
                    << "element " << i << ": " << hex(got) << ", reduce_many_copy " << hex(same);
              }
              if (one) {  // the copy's place untouched
                for (std::size_t g = 0; g < n * es + 16; ++g) ASSERT_EQ(c[g], 0xa5) << "copy byte " << g;
                continue;
              }
              ASSERT_TRUE(n == 0 || std::memcmp(c, d, n * es) == 0);
              for (std::size_t g = 0; g < 16; ++g) ASSERT_EQ(c[n * es + g], 0xa5) << "byte " << g << " past copy";
            }
          }
        }
      }
    }
  }
}

// Where there is no streaming kernel it declines and writes nothing.
TEST(KernelsReduceManyStream, DeclinesWhatItCannotDo) {
  std::vector<unsigned char> a(256, 1), b(256, 2), d(256 + 64, 0xa5), c(256 + 64, 0xa5);
  const auto aligned = [](std::vector<unsigned char>& v) {
    return v.data() + (64 - reinterpret_cast<std::uintptr_t>(v.data()) % 64) % 64;
  };
  unsigned char* dp = aligned(d);
  unsigned char* cp = aligned(c);
  const auto untouched = [&] {
    return std::all_of(d.begin(), d.end(), [](unsigned char x) { return x == 0xa5; }) &&
           std::all_of(c.begin(), c.end(), [](unsigned char x) { return x == 0xa5; });
  };
  const std::vector<const void*> two{a.data(), b.data()};
  for (DataType dt : {DataType::f64, DataType::i32, DataType::i64, DataType::i8, DataType::u8}) {
    EXPECT_FALSE(kernels::reduce_many_stream(dp, cp, two, 16, dt, ReduceOp::sum)) << cclz::dtype_name(dt);
  }
  EXPECT_FALSE(kernels::reduce_many_stream(dp, cp, two, 16, DataType::f32, ReduceOp::avg));
  EXPECT_FALSE(kernels::reduce_many_stream(dp, cp + 4, two, 16, DataType::f32, ReduceOp::sum))
      << "outputs aligned differently";
  EXPECT_FALSE(kernels::reduce_many_stream(dp + 1, cp + 1, two, 16, DataType::f32, ReduceOp::sum))
      << "copy not aligned to its element";
  const std::vector<const void*> one{a.data()};
  EXPECT_FALSE(kernels::reduce_many_stream(dp, cp, one, 16, DataType::f32, ReduceOp::sum)) << "one source";
  const std::vector<const void*> many(kernels::kMaxStreamSources + 1, a.data());
  EXPECT_FALSE(kernels::reduce_many_stream(dp, cp, many, 16, DataType::f32, ReduceOp::sum)) << "too many sources";
  const std::vector<const void*> three{a.data(), b.data(), a.data()};
  for (DataType dt : {DataType::f16, DataType::bf16}) {
    EXPECT_FALSE(kernels::reduce_many_stream(dp, cp, three, 16, dt, ReduceOp::sum)) << "three " << cclz::dtype_name(dt);
  }
  EXPECT_TRUE(untouched());
}

// For the exact types the fused form equals a chain of pairwise reduces.
TEST(KernelsReduceMany, EqualsChainForExactTypes) {
  std::mt19937_64 rng(5);
  for (DataType dt : {DataType::f32, DataType::f64, DataType::i32, DataType::i8}) {
    const std::size_t n = 3000, k = 6, es = cclz::dtype_size(dt);
    std::vector<std::vector<unsigned char>> in(k, std::vector<unsigned char>(n * es));
    std::vector<const void*> ptrs;
    for (auto& b : in) {
      fill_random(dt, b.data(), n, rng);
      ptrs.push_back(b.data());
    }
    std::vector<unsigned char> fused(n * es), chain(n * es);
    kernels::reduce_many(fused.data(), ptrs, n, dt, ReduceOp::sum);
    kernels::reduce(chain.data(), ptrs[0], ptrs[1], n, dt, ReduceOp::sum);
    for (std::size_t s = 2; s < k; ++s) kernels::reduce(chain.data(), chain.data(), ptrs[s], n, dt, ReduceOp::sum);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t x = load_bits(dt, fused.data() + i * es), y = load_bits(dt, chain.data() + i * es);
      ASSERT_TRUE(x == y || (is_nan_bits(dt, x) && is_nan_bits(dt, y))) << cclz::dtype_name(dt) << " " << i;
    }
  }
}

// ---------------------------------------------------------------------------
// divide

template <class T>
T ref_int_div(T x, int d) {
  // Truncating division computed on magnitudes in 128 bits, wrapped back.
  const i128 X = x, D = d;
  const i128 q = (X < 0) == (D < 0) ? (X < 0 ? -X : X) / (D < 0 ? -D : D)
                                         : -((X < 0 ? -X : X) / (D < 0 ? -D : D));
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<u128>(q)));
}

TEST(KernelsDivide, EveryVariantDtypeAndDivisor) {
  std::mt19937_64 rng(3);
  for (const kernels::Variant* v : variants()) {
    for (DataType dt : cclz::kAllDataTypes) {
      const std::size_t es = cclz::dtype_size(dt);
      // Powers of two (1 to 2^20) multiply by the reciprocal: the same bits.
      for (int q : {1, 2, 3, 4, 7, 8, 64, 1 << 20, -1, -2, -3, 0}) {
        for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{31}, std::size_t{1001}}) {
          SCOPED_TRACE(std::string(kernels::isa_name(v->isa)) + " " + cclz::dtype_name(dt) + " /" +
                       std::to_string(q) + " n=" + std::to_string(n));
          std::vector<unsigned char> in(n * es);
          fill_random(dt, in.data(), n, rng);
          std::vector<unsigned char> buf(n * es + 1 + 16, 0xa5);
          unsigned char* p = buf.data() + 1;  // unaligned
          copy_bytes(p, in.data(), n * es);
          v->divide(p, n, dt, q);
          auto int_div = [q](auto x) { return q != 0 ? ref_int_div(x, q) : x; };  // 0: left as it is
          for (std::size_t i = 0; i < n; ++i) {
            const unsigned char* x = in.data() + i * es;
            std::uint64_t want = 0;
            switch (dt) {
              case DataType::i8: want = static_cast<std::uint8_t>(int_div(load<std::int8_t>(x))); break;
              case DataType::u8: want = static_cast<std::uint8_t>(int_div(load<std::uint8_t>(x))); break;
              case DataType::i32: want = static_cast<std::uint32_t>(int_div(load<std::int32_t>(x))); break;
              case DataType::i64: want = static_cast<std::uint64_t>(int_div(load<std::int64_t>(x))); break;
              case DataType::f32: want = std::bit_cast<std::uint32_t>(load<float>(x) / static_cast<float>(q)); break;
              case DataType::f64: want = std::bit_cast<std::uint64_t>(load<double>(x) / static_cast<double>(q)); break;
              case DataType::f16:
              case DataType::bf16:
                want = ref_narrow(dt, ref_widen(dt, load<std::uint16_t>(x)) / static_cast<float>(q));
                break;
            }
            const std::uint64_t got = load_bits(dt, p + i * es);
            const bool ok = is_nan_bits(dt, want) ? is_quiet_nan_bits(dt, got) : got == want;
            ASSERT_TRUE(ok) << "element " << i << " in " << hex(load_bits(dt, x)) << " want " << hex(want) << " got "
                            << hex(got);
          }
          for (std::size_t j = 0; j < 16; ++j) ASSERT_EQ(buf[1 + n * es + j], 0xa5);
        }
      }
    }
  }
  // The entry point (every rank's avg) through the best variant; named:
  // truncation toward zero, and the minimum divided by -1 wraps.
  std::int32_t v[] = {7, -7, std::numeric_limits<std::int32_t>::min()};
  kernels::divide(v, 2, DataType::i32, 2);
  EXPECT_EQ(v[0], 3);
  EXPECT_EQ(v[1], -3);
  kernels::divide(v + 2, 1, DataType::i32, -1);
  EXPECT_EQ(v[2], std::numeric_limits<std::int32_t>::min());
  std::uint16_t h = kernels::float_to_half(1.0f);
  kernels::divide(&h, 1, DataType::f16, 3);
  EXPECT_EQ(h, kernels::float_to_half(1.0f / 3.0f));
}

}  // namespace
