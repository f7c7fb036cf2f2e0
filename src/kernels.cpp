// Reduction kernels: dst[i] = op(a[i], b[i]) for every dtype and op, a fused
// n-input reduce, the divide step of avg, and f16/bf16 <-> f32 conversions.
// Follows IEEE 754-2019 (binary16, minimum/maximum) and the bfloat16 format;
// the branch-free f16 conversion is F. Giesen's "float_to_half_fast3_rtne".
// Cost: one pass over memory, 2 reads + 1 write of count * dtype_size bytes
// (reduce_many: n reads + 1 write), memory-bandwidth bound beyond the caches.
//
// How it is fast: every loop is plain element code that GCC's vectoriser
// turns into SIMD; the pairwise loop carries `#pragma GCC ivdep` (exact
// aliasing means no dependence between iterations), so dst == a runs the
// vector loop too, without an overlap check. The same code is compiled
// twice -- baseline x86-64 (SSE2) and x86-64-v3 (AVX2, F16C) --
// through target attributes, and the variant the CPU supports is picked once
// at run time, so the build needs no -march flag. f16 uses F16C intrinsics
// on x86-64-v3 and an exact branch-free software conversion on the baseline
// (vectorised too, but only ~3 GB/s under SSE2); bf16 is integer shifts with
// round to nearest even, with AVX2 intrinsics that avoid cross-lane
// shuffles. An x86-64-v4 (AVX-512) build of the same code measured no
// faster than AVX2 at 4 KiB, 256 KiB or 64 MiB for the one-instruction ops
// (f32, integers: load/store bound) and risks AVX-512 down-clocking on older
// Xeons, so the avx512 variant keeps the AVX2 code for those and moves only
// f16/bf16 to 512-bit vectors: their conversions are the bottleneck in cache,
// and twice the lanes per instruction ran 1.5x (f16) and 1.65x (bf16) faster
// at 4-256 KiB, no slower from memory. Where the CPU has AVX512-FP16, the
// avx512fp16 variant reduces two f16 inputs in native half arithmetic
// (bitwise the widened result; see reduce_f16_native): as fast as f32 from
// 4 KiB to 64 MiB, where the conversions ran at 0.4-0.85 of it. Element
// pointers use aligned(1) types: any byte offset is valid.
// The kernels rely on GCC's loop vectoriser. At -O3 (the release buildtype)
// it runs with the dynamic cost model; at -O2 GCC 12 uses the "very cheap"
// model, which refuses any loop that needs an epilogue -- every loop here,
// as n is a run-time count -- and the kernels would silently run scalar.
// This pragma, before every include so the whole file shares one set of
// options, keeps -O1/-O2 builds (debugoptimized, distro -O2) vectorised.
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")

#include "kernels.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#define CCLZ_KERNELS_X86 1
#define CCLZ_TARGET_V3 __attribute__((target("arch=x86-64-v3")))
#define CCLZ_TARGET_V4 __attribute__((target("arch=x86-64-v4")))
#define CCLZ_TARGET_FP16 __attribute__((target("arch=x86-64-v4,avx512fp16")))
#endif

#define CCLZ_INLINE [[gnu::always_inline]] inline

namespace cclz::kernels {
namespace {

// ---------------------------------------------------------------------------
// Element types as the loops see them: any byte alignment, may alias anything
// (buffers arrive as void* at arbitrary offsets from the transports).
typedef float f32_u __attribute__((aligned(1), may_alias));
typedef double f64_u __attribute__((aligned(1), may_alias));
typedef std::int8_t i8_u __attribute__((aligned(1), may_alias));
typedef std::uint8_t u8_u __attribute__((aligned(1), may_alias));
typedef std::uint16_t u16_u __attribute__((aligned(1), may_alias));
typedef std::int32_t i32_u __attribute__((aligned(1), may_alias));
typedef std::int64_t i64_u __attribute__((aligned(1), may_alias));

template <class T>
struct unaligned;
template <>
struct unaligned<float> {
  using type = f32_u;
};
template <>
struct unaligned<double> {
  using type = f64_u;
};
template <>
struct unaligned<std::int8_t> {
  using type = i8_u;
};
template <>
struct unaligned<std::uint8_t> {
  using type = u8_u;
};
template <>
struct unaligned<std::uint16_t> {
  using type = u16_u;
};
template <>
struct unaligned<std::int32_t> {
  using type = i32_u;
};
template <>
struct unaligned<std::int64_t> {
  using type = i64_u;
};
template <class T>
using unaligned_t = typename unaligned<T>::type;
static_assert(alignof(unaligned_t<double>) == 1 && alignof(unaligned_t<std::uint16_t>) == 1);

// ---------------------------------------------------------------------------
// Scalar conversions, branch-free (selects, no branches) so that loops over
// them vectorise. Bit-exact with F16C, including NaN quieting.

// quiet = false leaves a signalling NaN signalling: reduce() feeds the value
// straight into an arithmetic op, which returns a quiet NaN anyway.
template <bool quiet = true>
CCLZ_INLINE float h2f(std::uint16_t h) noexcept {
  const std::uint32_t u = h;
  const std::uint32_t sign = (u & 0x8000u) << 16;
  const std::uint32_t em = (u & 0x7fffu) << 13;  // exponent and mantissa in f32 position
  const std::uint32_t exp = em & 0x0f800000u;
  const std::uint32_t normal = em + 0x38000000u;  // rebias 15 -> 127
  // exponent 31 -> 255; a NaN gets the quiet bit, as F16C does
  std::uint32_t special = em + 0x70000000u;
  if constexpr (quiet) special |= (em & 0x007fe000u) != 0 ? 0x00400000u : 0u;
  // Subnormal m * 2^-24: build 2^-14 * (1 + m/1024) and subtract 2^-14 (exact).
  const std::uint32_t sub =
      std::bit_cast<std::uint32_t>(std::bit_cast<float>(em + 0x38800000u) - std::bit_cast<float>(0x38800000u));
  // Masks rather than ?: so GCC keeps the float subtraction unconditional;
  // a select lets it sink the subtraction into a branch, which it then may
  // not if-convert (the operation could trap), and the loop stays scalar.
  const std::uint32_t is_sub = 0u - static_cast<std::uint32_t>(exp == 0);
  const std::uint32_t is_special = 0u - static_cast<std::uint32_t>(exp == 0x0f800000u);
  const std::uint32_t r = (sub & is_sub) | (special & is_special) | (normal & ~(is_sub | is_special));
  return std::bit_cast<float>(r | sign);
}

CCLZ_INLINE std::uint16_t f2h(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t ax = x & 0x7fffffffu;
  // Normal range: rebias 127 -> 15 (adding 0xc8000000 subtracts 0x38000000),
  // add 0xfff plus the lowest kept bit: round to nearest even. A carry out of
  // the mantissa bumps the exponent, up to inf for [65520, 65536).
  const std::uint32_t normal = (ax + 0xc8000fffu + ((ax >> 13) & 1u)) >> 13;
  // Below 2^-14: adding 0.5f puts the value's 2^-24 units in the low mantissa
  // bits of 0.5f and the FPU rounds to nearest even for us.
  const std::uint32_t sub = std::bit_cast<std::uint32_t>(std::bit_cast<float>(ax) + 0.5f) - 0x3f000000u;
  const std::uint32_t special = f != f ? (0x7e00u | ((ax >> 13) & 0x3ffu)) : 0x7c00u;
  const std::uint32_t is_special = 0u - static_cast<std::uint32_t>(ax >= 0x47800000u);
  const std::uint32_t is_sub = 0u - static_cast<std::uint32_t>(ax < 0x38800000u);  // masks: see h2f
  const std::uint32_t r = (special & is_special) | (sub & is_sub) | (normal & ~(is_special | is_sub));
  return static_cast<std::uint16_t>(r | sign);
}

template <bool quiet = true>
CCLZ_INLINE float b2f(std::uint16_t b) noexcept {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  if constexpr (!quiet) return std::bit_cast<float>(u);
  // NaN test as a signed compare: one instruction on SSE2/AVX2 (both sides >= 0).
  return std::bit_cast<float>(static_cast<std::int32_t>(u & 0x7fffffffu) > 0x7f800000 ? (u | 0x00400000u) : u);
}

CCLZ_INLINE std::uint16_t f2b(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;  // carries into exponent are right
  const std::uint32_t nan = (x >> 16) | 0x0040u;  // no rounding: it could carry a NaN into -0
  return static_cast<std::uint16_t>(f != f ? nan : rounded);
}

struct conv_f16 {
  CCLZ_INLINE static float widen(std::uint16_t h) noexcept { return h2f(h); }
  CCLZ_INLINE static float widen_raw(std::uint16_t h) noexcept { return h2f<false>(h); }
  CCLZ_INLINE static std::uint16_t narrow(float f) noexcept { return f2h(f); }
};
struct conv_bf16 {
  CCLZ_INLINE static float widen(std::uint16_t b) noexcept { return b2f(b); }
  CCLZ_INLINE static float widen_raw(std::uint16_t b) noexcept { return b2f<false>(b); }
  CCLZ_INLINE static std::uint16_t narrow(float f) noexcept { return f2b(f); }
};

// ---------------------------------------------------------------------------
// Element operations.

template <class F>
struct float_bits;
template <>
struct float_bits<float> {
  using type = std::uint32_t;
};
template <>
struct float_bits<double> {
  using type = std::uint64_t;
};

// IEEE 754-2019 minimum/maximum: NaN propagates (a + b yields a quiet NaN),
// -0 < +0. `x < y ? x : y` is exactly x86 minps(x, y), so both operand
// orders agree except where a == b (then they return different operands, and
// OR of the bits picks -0 for min, AND picks +0 for max) or a NaN is involved
// (then a + b). Fewer operations than testing a == b separately.
template <class F>
CCLZ_INLINE F fmin_nan(F a, F b) noexcept {
  using U = typename float_bits<F>::type;
  const U r = std::bit_cast<U>(b < a ? b : a) | std::bit_cast<U>(a < b ? a : b);
  const U nan = std::bit_cast<U>(a + b);
  return std::bit_cast<F>((a != a || b != b) ? nan : r);
}
template <class F>
CCLZ_INLINE F fmax_nan(F a, F b) noexcept {
  using U = typename float_bits<F>::type;
  const U r = std::bit_cast<U>(b > a ? b : a) & std::bit_cast<U>(a > b ? a : b);
  const U nan = std::bit_cast<U>(a + b);
  return std::bit_cast<F>((a != a || b != b) ? nan : r);
}

// Integer sum/prod go through the unsigned type: wrap modulo 2^bits without
// signed-overflow UB. (u8 * u8 promotes to int, which cannot overflow.)
struct op_sum {
  template <class T>
  CCLZ_INLINE static T apply(T a, T b) noexcept {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return a + b;
    }
  }
};
struct op_prod {
  template <class T>
  CCLZ_INLINE static T apply(T a, T b) noexcept {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
    } else {
      return a * b;
    }
  }
};
struct op_min {
  template <class T>
  CCLZ_INLINE static T apply(T a, T b) noexcept {
    if constexpr (std::is_integral_v<T>) {
      return b < a ? b : a;
    } else {
      return fmin_nan(a, b);
    }
  }
};
struct op_max {
  template <class T>
  CCLZ_INLINE static T apply(T a, T b) noexcept {
    if constexpr (std::is_integral_v<T>) {
      return b > a ? b : a;
    } else {
      return fmax_nan(a, b);
    }
  }
};
// a / b for floats: avg's divide step (kernels::divide), never a ReduceOp.
struct op_quot {
  template <class T>
  CCLZ_INLINE static T apply(T a, T b) noexcept {
    return a / b;
  }
};

// f16/bf16 element op on the storage type: widen, combine in f32, round back.
// Every op turns a NaN input into a quiet NaN (min/max through a + b), so the
// inputs need not be quieted when widened.
template <class Conv, class Op>
struct widened {
  CCLZ_INLINE static std::uint16_t apply(std::uint16_t a, std::uint16_t b) noexcept {
    return Conv::narrow(Op::apply(Conv::widen_raw(a), Conv::widen_raw(b)));
  }
};

// ---------------------------------------------------------------------------
// Pairwise loop. T is the storage type, Elem::apply works on T. Element i
// reads a[i] and b[i] and writes d[i] only, so with exact aliasing (the only
// kind allowed) there is no dependence between iterations, which is what
// `ivdep` asserts: GCC then vectorises without the overlap check that would
// send dst == a down a scalar fallback. Unrolled four vectors deep (GCC
// leaves the vectorised loop at one vector per iteration): in cache the
// kernel is level within the host's noise, but a 2-rank all-reduce, whose
// share owners run it on a peer's freshly written slot, took 16 KB in 3.55
// against 3.80 us by the median call (6 interleaved rounds; 64 KB 8.34
// against 8.80; docs/performance-log.md, "A Zen 5 host").
// With kCopy each result is stored to `copy` too (reduce_many_copy).
template <class T, class Elem, bool kCopy>
CCLZ_INLINE void reduce_loops(void* dst, void* copy, const void* a, const void* b, std::size_t n) noexcept {
  using P = unaligned_t<T>;
  P* d = static_cast<P*>(dst);
  P* c = static_cast<P*>(copy);
  const P* pa = static_cast<const P*>(a);
  const P* pb = static_cast<const P*>(b);
#pragma GCC ivdep
#pragma GCC unroll 4
  for (std::size_t i = 0; i < n; ++i) {
    const T r = Elem::apply(T(pa[i]), T(pb[i]));
    d[i] = r;
    if constexpr (kCopy) c[i] = r;
  }
}

// Block conversions in plain code (vectorised by the compiler).
template <class Conv>
CCLZ_INLINE void widen_soft_u(f32_u* __restrict out, const u16_u* __restrict in, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) out[i] = Conv::widen(in[i]);
}
template <class Conv>
CCLZ_INLINE void narrow_soft_u(u16_u* __restrict out, const f32_u* __restrict in, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) out[i] = Conv::narrow(in[i]);
}

// d[i] = Op(d[i], q) on widened values (avg's divide step: op_prod by a
// power of two's reciprocal, or op_quot). The policies' `scale`.
template <class Conv, class Op>
CCLZ_INLINE void scale_soft(u16_u* d, std::size_t n, float q) noexcept {
  for (std::size_t i = 0; i < n; ++i) d[i] = Conv::narrow(Op::apply(Conv::widen_raw(d[i]), q));
}

// ---------------------------------------------------------------------------
// F16C paths (x86-64-v3 variant): 8 halves per instruction.
#ifdef CCLZ_KERNELS_X86

template <class Op>
CCLZ_TARGET_V3 CCLZ_INLINE __m256 vop(__m256 a, __m256 b) noexcept {
  if constexpr (std::is_same_v<Op, op_sum>) {
    return _mm256_add_ps(a, b);
  } else if constexpr (std::is_same_v<Op, op_prod>) {
    return _mm256_mul_ps(a, b);
  } else if constexpr (std::is_same_v<Op, op_quot>) {
    return _mm256_div_ps(a, b);
  } else {
    // Same formulation as fmin_nan/fmax_nan.
    __m256 r;
    if constexpr (std::is_same_v<Op, op_min>) {
      r = _mm256_or_ps(_mm256_min_ps(b, a), _mm256_min_ps(a, b));
    } else {
      r = _mm256_and_ps(_mm256_max_ps(b, a), _mm256_max_ps(a, b));
    }
    return _mm256_blendv_ps(r, _mm256_add_ps(a, b), _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
  }
}

CCLZ_TARGET_V3 CCLZ_INLINE __m256 load_h8(const u16_u* p) noexcept {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
CCLZ_TARGET_V3 CCLZ_INLINE void store_h8(u16_u* p, __m256 v) noexcept {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
// store_h8 to d, and with kCopy to c as well (one conversion).
template <bool kCopy>
CCLZ_TARGET_V3 CCLZ_INLINE void put_h8(u16_u* d, u16_u* c, __m256 v) noexcept {
  const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(d), h);
  if constexpr (kCopy) _mm_storeu_si128(reinterpret_cast<__m128i*>(c), h);
}
// A scalar tail's result, to d and with kCopy to c.
template <bool kCopy>
CCLZ_INLINE void put_u16(u16_u* d, u16_u* c, std::uint16_t r) noexcept {
  *d = r;
  if constexpr (kCopy) *c = r;
}

// Each step loads its a and b lanes before it stores the same lanes of d, so
// exact aliasing needs no special case here. Two vectors per step give the
// out-of-order core independent convert chains to overlap.
template <class Op, bool kCopy>
CCLZ_TARGET_V3 void reduce_f16c(void* dst, void* copy, const void* a, const void* b, std::size_t n) noexcept {
  u16_u* d = static_cast<u16_u*>(dst);
  u16_u* c = static_cast<u16_u*>(copy);
  const u16_u* pa = static_cast<const u16_u*>(a);
  const u16_u* pb = static_cast<const u16_u*>(b);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 r0 = vop<Op>(load_h8(pa + i), load_h8(pb + i));
    const __m256 r1 = vop<Op>(load_h8(pa + i + 8), load_h8(pb + i + 8));
    put_h8<kCopy>(d + i, c + i, r0);
    put_h8<kCopy>(d + i + 8, c + i + 8, r1);
  }
  for (; i + 8 <= n; i += 8) put_h8<kCopy>(d + i, c + i, vop<Op>(load_h8(pa + i), load_h8(pb + i)));
  for (; i < n; ++i) {
    const std::uint16_t x = pa[i], y = pb[i];
    put_u16<kCopy>(d + i, c + i, widened<conv_f16, Op>::apply(x, y));
  }
}

CCLZ_TARGET_V3 void widen_f16c(f32_u* out, const u16_u* in, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(reinterpret_cast<float*>(out + i), load_h8(in + i));
  for (; i < n; ++i) out[i] = h2f(in[i]);
}
CCLZ_TARGET_V3 void narrow_f16c(u16_u* out, const f32_u* in, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) store_h8(out + i, _mm256_loadu_ps(reinterpret_cast<const float*>(in + i)));
  for (; i < n; ++i) out[i] = f2h(in[i]);
}

// bf16 with AVX2. Unpacking 16-bit lanes against zero puts each value in the
// top half of a 32-bit lane, which is exactly bf16 -> f32; unpack and
// packus both work within 128-bit halves, so unpacklo/hi followed by packus
// restores element order with no cross-lane permute (the compiler's own
// vectorisation of the scalar code needs zero-extends, shifts and vpermq).
CCLZ_TARGET_V3 CCLZ_INLINE __m256 bf16_lo(__m256i v) noexcept {
  return _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), v));
}
CCLZ_TARGET_V3 CCLZ_INLINE __m256 bf16_hi(__m256i v) noexcept {
  return _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), v));
}
// f2b on 8 lanes for results of arithmetic on widened bf16 values: round to
// nearest even with no NaN case. A NaN here comes out of an x86 add, mul or
// (for min/max) a + b, so it is already quiet and its low 16 bits are zero
// (a propagated bf16 payload, or the default NaN); adding 0x7fff + lsb then
// cannot carry, and the result is the same bits f2b's NaN branch gives.
CCLZ_TARGET_V3 CCLZ_INLINE __m256i bf16_round(__m256 v) noexcept {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb);
  return _mm256_srli_epi32(rounded, 16);
}
CCLZ_TARGET_V3 CCLZ_INLINE __m256i bf16_pack(__m256 lo, __m256 hi) noexcept {
  return _mm256_packus_epi32(bf16_round(lo), bf16_round(hi));  // lanes are < 2^16: no saturation
}
CCLZ_TARGET_V3 CCLZ_INLINE __m256i load_i256(const u16_u* p) noexcept {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
CCLZ_TARGET_V3 CCLZ_INLINE void store_i256(u16_u* p, __m256i v) noexcept {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
}

// Loads before stores within each step: exact aliasing is fine.
template <class Op, bool kCopy>
CCLZ_TARGET_V3 void reduce_bf16_avx2(void* dst, void* copy, const void* a, const void* b, std::size_t n) noexcept {
  u16_u* d = static_cast<u16_u*>(dst);
  u16_u* c = static_cast<u16_u*>(copy);
  const u16_u* pa = static_cast<const u16_u*>(a);
  const u16_u* pb = static_cast<const u16_u*>(b);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i va = load_i256(pa + i), vb = load_i256(pb + i);
    const __m256i r = bf16_pack(vop<Op>(bf16_lo(va), bf16_lo(vb)), vop<Op>(bf16_hi(va), bf16_hi(vb)));
    store_i256(d + i, r);
    if constexpr (kCopy) store_i256(c + i, r);
  }
  for (; i < n; ++i) {
    const std::uint16_t x = pa[i], y = pb[i];
    put_u16<kCopy>(d + i, c + i, widened<conv_bf16, Op>::apply(x, y));
  }
}

// ---------------------------------------------------------------------------
// reduce_many_stream: k sources, the result to two outputs with streaming
// stores, in the pass that loads the sources. A staged all-reduce's reduced
// share goes to its slot and its output, both read next from memory; with
// the loads interleaved with the streaming stores the 2-rank 64 MB call ran
// 1.2x faster than reducing into the cache and streaming that in a second
// pass, which leaves the memory idle in turn for reads and for writes
// (docs/performance.md). The same operations, order and rounding as
// reduce_many: sources folded left to right (the accumulator the first
// operand), halves in f32 and rounded once.
// kDst: d streamed too (false: an ordinary store, for a d its reader finds
// in this core's cache). kCopy false: d alone (streamed); c is then d and
// never stored to.
template <bool kDst, bool kCopy>
CCLZ_TARGET_V3 CCLZ_INLINE void stream2(std::byte* d, std::byte* c, __m128i v) noexcept {
  if constexpr (kDst) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), v);
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d), v);
  }
  if constexpr (kCopy) _mm_stream_si128(reinterpret_cast<__m128i*>(c), v);
}
template <bool kDst, bool kCopy>
CCLZ_TARGET_V3 CCLZ_INLINE void stream2(std::byte* d, std::byte* c, __m256i v) noexcept {
  stream2<kDst, kCopy>(d, c, _mm256_castsi256_si128(v));
  stream2<kDst, kCopy>(d + 16, c + 16, _mm256_extracti128_si256(v, 1));
}

// Each returns how many elements it did (whole steps); d and c are 16-byte
// aligned, k >= 2.
template <class Op, bool kDst, bool kCopy>
CCLZ_TARGET_V3 CCLZ_INLINE std::size_t stream_f32(std::byte* d, std::byte* c, const void* const* s,
                                                  std::size_t k, std::size_t n) noexcept {
  const auto at = [&](std::size_t j, std::size_t i) {
    return _mm256_loadu_ps(static_cast<const float*>(s[j]) + i);
  };
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 r = vop<Op>(at(0, i), at(1, i));
    for (std::size_t j = 2; j < k; ++j) r = vop<Op>(r, at(j, i));
    stream2<kDst, kCopy>(d + 4 * i, c + 4 * i, _mm256_castps_si256(r));
  }
  return i;
}
// Halves take two sources (reduce_many_stream declines more).
template <class Op, bool kDst, bool kCopy>
CCLZ_TARGET_V3 CCLZ_INLINE std::size_t stream_f16(std::byte* d, std::byte* c, const void* const* s,
                                                  std::size_t n) noexcept {
  const auto* pa = static_cast<const u16_u*>(s[0]);
  const auto* pb = static_cast<const u16_u*>(s[1]);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 r = vop<Op>(load_h8(pa + i), load_h8(pb + i));
    stream2<kDst, kCopy>(d + 2 * i, c + 2 * i, _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  return i;
}
template <class Op, bool kDst, bool kCopy>
CCLZ_TARGET_V3 CCLZ_INLINE std::size_t stream_bf16(std::byte* d, std::byte* c, const void* const* s,
                                                   std::size_t n) noexcept {
  const auto* pa = static_cast<const u16_u*>(s[0]);
  const auto* pb = static_cast<const u16_u*>(s[1]);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i va = load_i256(pa + i), vb = load_i256(pb + i);
    stream2<kDst, kCopy>(d + 2 * i, c + 2 * i,
                         bf16_pack(vop<Op>(bf16_lo(va), bf16_lo(vb)), vop<Op>(bf16_hi(va), bf16_hi(vb))));
  }
  return i;
}
template <class Op, bool kDst, bool kCopy>
CCLZ_TARGET_V3 CCLZ_INLINE std::size_t stream_dt(std::byte* d, std::byte* c, const void* const* s,
                                                 std::size_t k, std::size_t n, DataType dt) noexcept {
  switch (dt) {
    case DataType::f32: return stream_f32<Op, kDst, kCopy>(d, c, s, k, n);
    case DataType::f16: return stream_f16<Op, kDst, kCopy>(d, c, s, n);
    case DataType::bf16: return stream_bf16<Op, kDst, kCopy>(d, c, s, n);
    default: return 0;
  }
}
template <bool kDst, bool kCopy>
CCLZ_TARGET_V3 std::size_t stream_steps(std::byte* d, std::byte* c, const void* const* s, std::size_t k,
                                        std::size_t n, DataType dt, ReduceOp op) noexcept {
  std::size_t done = 0;
  switch (op) {
    case ReduceOp::sum: done = stream_dt<op_sum, kDst, kCopy>(d, c, s, k, n, dt); break;
    case ReduceOp::prod: done = stream_dt<op_prod, kDst, kCopy>(d, c, s, k, n, dt); break;
    case ReduceOp::min: done = stream_dt<op_min, kDst, kCopy>(d, c, s, k, n, dt); break;
    case ReduceOp::max: done = stream_dt<op_max, kDst, kCopy>(d, c, s, k, n, dt); break;
    case ReduceOp::avg: break;
  }
  _mm_sfence();  // streaming stores are not ordered by a later release
  return done;
}

// ---------------------------------------------------------------------------
// f16/bf16 on 512-bit vectors (avx512 variant). The same operations as the
// AVX2 paths, twice the lanes; a tail shorter than a step runs the same step
// with masked loads and stores (masked-off lanes are zero and never stored,
// and a masked load does not fault past the buffer's end).
// GCC 12 warns inside its own AVX-512 intrinsics that pass an "undefined"
// vector through (-Wmaybe-uninitialized on `__Y = __Y`); the section is
// compiled with that warning off.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

template <class Op>
CCLZ_TARGET_V4 CCLZ_INLINE __m512 vop512(__m512 a, __m512 b) noexcept {
  if constexpr (std::is_same_v<Op, op_sum>) {
    return _mm512_add_ps(a, b);
  } else if constexpr (std::is_same_v<Op, op_prod>) {
    return _mm512_mul_ps(a, b);
  } else if constexpr (std::is_same_v<Op, op_quot>) {
    return _mm512_div_ps(a, b);
  } else {
    // Same formulation as fmin_nan/fmax_nan.
    __m512 r;
    if constexpr (std::is_same_v<Op, op_min>) {
      r = _mm512_or_ps(_mm512_min_ps(b, a), _mm512_min_ps(a, b));
    } else {
      r = _mm512_and_ps(_mm512_max_ps(b, a), _mm512_max_ps(a, b));
    }
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q), r, _mm512_add_ps(a, b));
  }
}

// 16 halves; lanes outside `mask` read as zero. Callers pass the constant
// kFull16 for whole steps, which GCC turns into plain loads and stores (a
// convert straight to memory for store_h16), and a computed mask only for
// a tail: masked accesses on every step ran the 4-input reduce from memory
// at 40% (f16) and 70% (bf16) of this speed (bench-kernels reduce_many k4,
// 64 MiB: 14.5 against 37 GB/s, 24.5 against 36).
constexpr __mmask16 kFull16 = 0xffff;
constexpr __mmask32 kFull32 = 0xffffffffu;
CCLZ_TARGET_V4 CCLZ_INLINE __m512 load_h16(const u16_u* p, __mmask16 mask) noexcept {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p));
}
CCLZ_TARGET_V4 CCLZ_INLINE void store_h16(u16_u* p, __m512 v, __mmask16 mask) noexcept {
  _mm256_mask_storeu_epi16(p, mask, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
// The mask of a tail of `left` elements (fewer than a step).
CCLZ_TARGET_V4 CCLZ_INLINE __mmask16 mask16(std::size_t left) noexcept {
  return static_cast<__mmask16>((1u << left) - 1u);
}
CCLZ_TARGET_V4 CCLZ_INLINE __mmask32 mask32(std::size_t left) noexcept {
  return static_cast<__mmask32>((1u << left) - 1u);
}

// With kCopy the step stores its result to c too (converted once).
template <class Op, bool kCopy>
CCLZ_TARGET_V4 CCLZ_INLINE void reduce_f16_step(u16_u* d, u16_u* c, const u16_u* a, const u16_u* b,
                                                __mmask16 m) noexcept {
  const __m256i h =
      _mm512_cvtps_ph(vop512<Op>(load_h16(a, m), load_h16(b, m)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  _mm256_mask_storeu_epi16(d, m, h);
  if constexpr (kCopy) _mm256_mask_storeu_epi16(c, m, h);
}

// Two-input 16-bit reductions of up to kAheadMaxElems elements prefetch
// each source kAheadBytes ahead. Such a call's sources are mostly a peer's
// slot, written moments before in the other core's cache, and the 16-bit
// step's conversions fill the vector scheduler before many of those lines
// are on their way; f32's step has few enough uops that they are. 2 bound
// ranks, bf16/f32 by the median call at 16-64 KB: 0.79-0.89 -> 0.83-0.96
// in the host's slow state, 64 KB 0.90-0.98 -> 0.98-1.02 in its fast one
// (docs/performance-log.md, "prefetch-1202"). Larger calls read from
// memory, where software prefetch slowed every type (docs/performance.md).
constexpr std::size_t kAheadBytes = 1024;
constexpr std::size_t kAheadMaxElems = std::size_t{128} << 10;
CCLZ_INLINE void prefetch_ahead(const u16_u* a, const u16_u* b) noexcept {
  // As addresses: a line past the end of a source is never formed as a pointer.
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(a) + kAheadBytes), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(b) + kAheadBytes), _MM_HINT_T0);
}

// The two-input f16 loop around STEP(d, c, a, b, mask), a 16-element step:
// two steps per iteration (1.2x faster in the cache than one), then single
// steps, then a masked tail; with AHEAD, prefetch_ahead once per iteration
// (one line of each source) for calls of up to kAheadMaxElems. A macro, so
// that each loop is compiled for its own target with its step inlined.
#define CCLZ_F16_PAIR_LOOP(STEP, AHEAD)                                                   \
  u16_u* d = static_cast<u16_u*>(dst);                                                     \
  u16_u* c = static_cast<u16_u*>(copy);                                                    \
  const u16_u* pa = static_cast<const u16_u*>(a);                                          \
  const u16_u* pb = static_cast<const u16_u*>(b);                                          \
  std::size_t i = 0;                                                                       \
  if (AHEAD && n <= kAheadMaxElems) {                                                      \
    for (; i + 32 <= n; i += 32) {                                                         \
      prefetch_ahead(pa + i, pb + i);                                                      \
      STEP(d + i, c + i, pa + i, pb + i, kFull16);                                         \
      STEP(d + i + 16, c + i + 16, pa + i + 16, pb + i + 16, kFull16);                     \
    }                                                                                      \
  }                                                                                        \
  for (; i + 32 <= n; i += 32) {                                                           \
    STEP(d + i, c + i, pa + i, pb + i, kFull16);                                           \
    STEP(d + i + 16, c + i + 16, pa + i + 16, pb + i + 16, kFull16);                       \
  }                                                                                        \
  for (; i + 16 <= n; i += 16) STEP(d + i, c + i, pa + i, pb + i, kFull16);                \
  if (i < n) STEP(d + i, c + i, pa + i, pb + i, mask16(n - i));

template <class Op, bool kCopy>
CCLZ_TARGET_V4 void reduce_f16_512(void* dst, void* copy, const void* a, const void* b, std::size_t n) noexcept {
  CCLZ_F16_PAIR_LOOP((reduce_f16_step<Op, kCopy>), true)
}

CCLZ_TARGET_V4 CCLZ_INLINE void widen_step(f32_u* out, const u16_u* in, __mmask16 m) noexcept {
  _mm512_mask_storeu_ps(reinterpret_cast<float*>(out), m, load_h16(in, m));
}
CCLZ_TARGET_V4 CCLZ_INLINE void narrow_step(u16_u* out, const f32_u* in, __mmask16 m) noexcept {
  store_h16(out, _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(in)), m);
}
CCLZ_TARGET_V4 void widen_f16_512(f32_u* out, const u16_u* in, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) widen_step(out + i, in + i, kFull16);
  if (i < n) widen_step(out + i, in + i, mask16(n - i));
}
CCLZ_TARGET_V4 void narrow_f16_512(u16_u* out, const f32_u* in, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) narrow_step(out + i, in + i, kFull16);
  if (i < n) narrow_step(out + i, in + i, mask16(n - i));
}

// 32 bf16 as two 256-bit loads. One 512-bit load per line is faster in the
// cache (bf16 sum at 4 KiB: 160 against 140 GB/s) but ran at 60% of these
// from memory on the AVX-512 EPYC measured (8 MiB per input: 49 against 80
// GB/s), and a collective's reductions read their peers' data from memory.
CCLZ_TARGET_V4 CCLZ_INLINE __m512i load_b32_full(const u16_u* p) noexcept {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16)), 1);
}
// As load_h16/store_h16: kFull32 for whole steps, a computed mask for a tail.
CCLZ_TARGET_V4 CCLZ_INLINE __m512i load_b32(const u16_u* p, __mmask32 mask) noexcept {
  return mask == kFull32 ? load_b32_full(p) : _mm512_maskz_loadu_epi16(mask, p);
}
CCLZ_TARGET_V4 CCLZ_INLINE void store_b32(u16_u* p, __m512i v, __mmask32 mask) noexcept {
  _mm512_mask_storeu_epi16(p, mask, v);
}

// bf16 on 512-bit vectors splits each 32-bit lane instead of unpacking
// 16-bit lanes as AVX2 does: its even element shifted up and its odd one
// masked are f32 values in place, and the rounded results go back with a
// shift and a mask, so no step has a shuffle. In the cache (256 KiB per
// buffer, in place with the copy, as a 2-rank direct all-reduce runs) the
// two-input step ran 1.12x the unpacking one.
CCLZ_TARGET_V4 CCLZ_INLINE __m512 bf16_even512(__m512i v) noexcept {
  return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}
CCLZ_TARGET_V4 CCLZ_INLINE __m512 bf16_odd512(__m512i v) noexcept {
  return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}
// bf16_round on 16 lanes (the NaN reasoning there holds here), leaving the
// result in the top 16 bits: x + 0x7fff, or x + 0x8000 where bit 16 (the
// result's lowest) is set.
CCLZ_TARGET_V4 CCLZ_INLINE __m512i bf16_round_top512(__m512 v) noexcept {
  const __m512i x = _mm512_castps_si512(v);
  const __mmask16 odd = _mm512_test_epi32_mask(x, _mm512_set1_epi32(0x10000));
  return _mm512_mask_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), odd, x, _mm512_set1_epi32(0x8000));
}
CCLZ_TARGET_V4 CCLZ_INLINE __m512i bf16_join512(__m512 even, __m512 odd) noexcept {
  return _mm512_or_si512(_mm512_srli_epi32(bf16_round_top512(even), 16),
                         _mm512_and_si512(bf16_round_top512(odd), _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

template <class Op, bool kCopy>
CCLZ_TARGET_V4 CCLZ_INLINE void reduce_bf16_step(u16_u* d, u16_u* c, const u16_u* a, const u16_u* b,
                                                 __mmask32 m) noexcept {
  const __m512i va = load_b32(a, m), vb = load_b32(b, m);
  const __m512i r =
      bf16_join512(vop512<Op>(bf16_even512(va), bf16_even512(vb)), vop512<Op>(bf16_odd512(va), bf16_odd512(vb)));
  store_b32(d, r, m);
  if constexpr (kCopy) store_b32(c, r, m);
}

template <class Op, bool kCopy>
CCLZ_TARGET_V4 void reduce_bf16_512(void* dst, void* copy, const void* a, const void* b, std::size_t n) noexcept {
  u16_u* d = static_cast<u16_u*>(dst);
  u16_u* c = static_cast<u16_u*>(copy);
  const u16_u* pa = static_cast<const u16_u*>(a);
  const u16_u* pb = static_cast<const u16_u*>(b);
  std::size_t i = 0;
  if (n <= kAheadMaxElems) {  // as CCLZ_F16_PAIR_LOOP's AHEAD
    for (; i + 32 <= n; i += 32) {
      prefetch_ahead(pa + i, pb + i);
      reduce_bf16_step<Op, kCopy>(d + i, c + i, pa + i, pb + i, kFull32);
    }
  }
  for (; i + 32 <= n; i += 32) reduce_bf16_step<Op, kCopy>(d + i, c + i, pa + i, pb + i, kFull32);
  if (i < n) reduce_bf16_step<Op, kCopy>(d + i, c + i, pa + i, pb + i, mask32(n - i));
}

// f16 in native half arithmetic (AVX512-FP16; the avx512fp16 variant): one
// instruction per 16 lanes and no conversion. For two operands this is bitwise
// the widened result. A product of two halves is exact in f32, so rounding
// it to f16 is the one rounding vmulph does. A sum is correctly rounded to
// f32 and then to f16, and with 24 >= 2 * 11 + 2 bits that double rounding
// is innocuous; sums in the subnormal range are multiples of 2^-24 below
// 2^-14, exact in both. min, max and the NaN rule are the same comparisons,
// and FP16 instructions, like the F16C conversions, ignore MXCSR's DAZ and
// FTZ. Folds of more inputs keep the f32 accumulator (one rounding at the
// end is not a chain of half-precision steps).
template <class Op>
CCLZ_TARGET_FP16 CCLZ_INLINE __m256i vop_ph(__m256i a, __m256i b) noexcept {
  const __m256h x = _mm256_castsi256_ph(a), y = _mm256_castsi256_ph(b);
  if constexpr (std::is_same_v<Op, op_sum>) {
    return _mm256_castph_si256(_mm256_add_ph(x, y));
  } else if constexpr (std::is_same_v<Op, op_prod>) {
    return _mm256_castph_si256(_mm256_mul_ph(x, y));
  } else {
    // vop512's formulation on halves.
    __m256i r;
    if constexpr (std::is_same_v<Op, op_min>) {
      r = _mm256_or_si256(_mm256_castph_si256(_mm256_min_ph(y, x)), _mm256_castph_si256(_mm256_min_ph(x, y)));
    } else {
      r = _mm256_and_si256(_mm256_castph_si256(_mm256_max_ph(y, x)), _mm256_castph_si256(_mm256_max_ph(x, y)));
    }
    return _mm256_mask_blend_epi16(_mm256_cmp_ph_mask(x, y, _CMP_UNORD_Q), r,
                                   _mm256_castph_si256(_mm256_add_ph(x, y)));
  }
}

// 16 halves per step: 256-bit vectors kept pace with f32 from the L2 (256
// KiB per input: 121 GB/s, f32 120), 512-bit ones did not (109).
template <class Op, bool kCopy>
CCLZ_TARGET_FP16 CCLZ_INLINE void reduce_ph_step(u16_u* d, u16_u* c, const u16_u* a, const u16_u* b,
                                                 __mmask16 m) noexcept {
  const auto load = [m](const u16_u* p) {
    return m == kFull16 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)) : _mm256_maskz_loadu_epi16(m, p);
  };
  const __m256i r = vop_ph<Op>(load(a), load(b));
  _mm256_mask_storeu_epi16(d, m, r);
  if constexpr (kCopy) _mm256_mask_storeu_epi16(c, m, r);
}

template <class Op, bool kCopy>
CCLZ_TARGET_FP16 void reduce_f16_native(void* dst, void* copy, const void* a, const void* b,
                                        std::size_t n) noexcept {
  CCLZ_F16_PAIR_LOOP((reduce_ph_step<Op, kCopy>), false)
}

// k bf16 sources folded in registers, one step of every source at a time:
// the same order and rounding as the block loop (sources left to right, the
// accumulator the first operand, in f32, rounded once), without its f32
// accumulator in L1, twice the bytes of the sources, stored and reloaded
// once per source. Every source's step is loaded before the step's outputs
// are stored, so dst and copy may be sources. In the cache (bench-kernels
// reduce_many/bf16/sum/k4/256KB) 1.26x the block loop, level from memory
// (64MB). For k up to kFoldMax; more sources take the block loop.
constexpr std::size_t kFoldMax = 8;

template <class Op, bool kCopy>
CCLZ_TARGET_V4 CCLZ_INLINE void fold_bf16_step(u16_u* d, u16_u* c, const u16_u* const* s, std::size_t k,
                                               std::size_t j, __mmask32 m) noexcept {
  __m512i v = load_b32(s[0] + j, m), w = load_b32(s[1] + j, m);
  __m512 even = vop512<Op>(bf16_even512(v), bf16_even512(w));
  __m512 odd = vop512<Op>(bf16_odd512(v), bf16_odd512(w));
  for (std::size_t t = 2; t < k; ++t) {
    v = load_b32(s[t] + j, m);
    even = vop512<Op>(even, bf16_even512(v));
    odd = vop512<Op>(odd, bf16_odd512(v));
  }
  const __m512i r = bf16_join512(even, odd);
  store_b32(d + j, r, m);
  if constexpr (kCopy) store_b32(c + j, r, m);
}

// The loop around a fold step of k 16-bit sources, Step(d, c, s, k, j,
// mask), 32 elements each: whole steps with the constant kFull32, then one
// masked tail.
template <auto Step>
CCLZ_TARGET_V4 void fold_u16_512(void* dst, void* copy, const void* const* srcs, std::size_t k,
                                 std::size_t n) noexcept {
  const u16_u* s[kFoldMax];
  for (std::size_t t = 0; t < k; ++t) s[t] = static_cast<const u16_u*>(srcs[t]);
  u16_u* d = static_cast<u16_u*>(dst);
  u16_u* c = static_cast<u16_u*>(copy);
  std::size_t j = 0;
  for (; j + 32 <= n; j += 32) Step(d, c, s, k, j, kFull32);
  if (j < n) Step(d, c, s, k, j, mask32(n - j));
}

// k f16 sources folded in registers as bf16 above, 32 elements (two
// 16-lane halves, two independent chains) per step. In the cache 1.07x
// (4KB) and 1.15x (256KB) the block loop, level from memory
// (reduce_many/f16/sum/k4); in the staged 4-rank all-reduce, whose sources
// are mostly peers' slots, 0.79-0.95x its time at 128 KB-2 MB.
template <class Op, bool kCopy>
CCLZ_TARGET_V4 CCLZ_INLINE void fold_f16_step(u16_u* d, u16_u* c, const u16_u* const* s, std::size_t k,
                                              std::size_t j, __mmask32 m) noexcept {
  const auto lo = static_cast<__mmask16>(m), hi = static_cast<__mmask16>(m >> 16);
  __m512 a = vop512<Op>(load_h16(s[0] + j, lo), load_h16(s[1] + j, lo));
  __m512 b = vop512<Op>(load_h16(s[0] + j + 16, hi), load_h16(s[1] + j + 16, hi));
  for (std::size_t t = 2; t < k; ++t) {
    a = vop512<Op>(a, load_h16(s[t] + j, lo));
    b = vop512<Op>(b, load_h16(s[t] + j + 16, hi));
  }
  const __m256i ra = _mm512_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256i rb = _mm512_cvtps_ph(b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  _mm256_mask_storeu_epi16(d + j, lo, ra);
  _mm256_mask_storeu_epi16(d + j + 16, hi, rb);
  if constexpr (kCopy) {
    _mm256_mask_storeu_epi16(c + j, lo, ra);
    _mm256_mask_storeu_epi16(c + j + 16, hi, rb);
  }
}

// The n-input reduce folded in registers on AVX2, 16 elements (two 8-lane
// chains) per step, for f32, f16 and bf16: every source's step loaded and
// combined in order (so dst and copy may be sources), then stored once; the
// tail element by element with the same operations. H reads a step as two
// 8-float halves and puts them back (bf16's halves are in unpack order,
// which its pack undoes), and widens and narrows one element for the tail.
template <class H, class Op, bool kCopy>
CCLZ_TARGET_V3 void fold_v3(void* dst, void* copy, const void* const* srcs, std::size_t k, std::size_t n) noexcept {
  using P = typename H::P;
  const P* s[kFoldMax];
  for (std::size_t t = 0; t < k; ++t) s[t] = static_cast<const P*>(srcs[t]);
  P* d = static_cast<P*>(dst);
  P* c = static_cast<P*>(copy);
  std::size_t j = 0;
  for (; j + 16 <= n; j += 16) {
    __m256 lo, hi, x, y;
    H::widen(s[0] + j, lo, hi);
    H::widen(s[1] + j, x, y);
    lo = vop<Op>(lo, x);
    hi = vop<Op>(hi, y);
    for (std::size_t t = 2; t < k; ++t) {
      H::widen(s[t] + j, x, y);
      lo = vop<Op>(lo, x);
      hi = vop<Op>(hi, y);
    }
    H::template put<kCopy>(d + j, c + j, lo, hi);
  }
  for (; j < n; ++j) {
    float acc = Op::apply(H::widen1(s[0][j]), H::widen1(s[1][j]));
    for (std::size_t t = 2; t < k; ++t) acc = Op::apply(acc, H::widen1(s[t][j]));
    const auto r = H::narrow1(acc);
    d[j] = r;
    if constexpr (kCopy) c[j] = r;
  }
}

// f32 (since e9ce97d), against the block loop (bench-kernels
// reduce_many/f32/sum/k4, medians of 4 interleaved runs, two days): 4KB
// 127 -> 214 GB/s, 256KB 1.08-1.16x, 64MB 1.0-1.47x (docs/performance.md).
// Byte-aligned element types: the buffers need not be 4-byte aligned. The
// other plain types keep the block loop.
struct fold_v3_f32 {
  using P = f32_u;
  CCLZ_TARGET_V3 CCLZ_INLINE static void widen(const P* p, __m256& lo, __m256& hi) noexcept {
    lo = _mm256_loadu_ps(p);
    hi = _mm256_loadu_ps(p + 8);
  }
  template <bool kCopy>
  CCLZ_TARGET_V3 CCLZ_INLINE static void put(P* d, P* c, __m256 lo, __m256 hi) noexcept {
    _mm256_storeu_ps(d, lo);
    _mm256_storeu_ps(d + 8, hi);
    if constexpr (kCopy) {
      _mm256_storeu_ps(c, lo);
      _mm256_storeu_ps(c + 8, hi);
    }
  }
  CCLZ_INLINE static float widen1(float x) noexcept { return x; }
  CCLZ_INLINE static float narrow1(float x) noexcept { return x; }
};

// f16 and bf16, converted back once per step. Against the block loop
// (bench-kernels isa/avx2/reduce_many/*/sum/k4, 3 interleaved rounds): f16
// 4KB and 256KB 41-56 -> 58-60 GB/s, bf16 42-53 -> 66-69 and 40-53 ->
// 64-71; level from memory (64MB). V converts a 16-element step to and
// from two 8-float halves, Conv one element.
struct f16_halves {
  CCLZ_TARGET_V3 CCLZ_INLINE static void widen(const u16_u* p, __m256& lo, __m256& hi) noexcept {
    lo = load_h8(p);
    hi = load_h8(p + 8);
  }
  CCLZ_TARGET_V3 CCLZ_INLINE static __m256i pack(__m256 lo, __m256 hi) noexcept {
    constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    return _mm256_set_m128i(_mm256_cvtps_ph(hi, kRound), _mm256_cvtps_ph(lo, kRound));
  }
};
struct bf16_halves {
  CCLZ_TARGET_V3 CCLZ_INLINE static void widen(const u16_u* p, __m256& lo, __m256& hi) noexcept {
    const __m256i v = load_i256(p);
    lo = bf16_lo(v);
    hi = bf16_hi(v);
  }
  CCLZ_TARGET_V3 CCLZ_INLINE static __m256i pack(__m256 lo, __m256 hi) noexcept { return bf16_pack(lo, hi); }
};
template <class V, class Conv>
struct fold_v3_u16 {
  using P = u16_u;
  CCLZ_TARGET_V3 CCLZ_INLINE static void widen(const P* p, __m256& lo, __m256& hi) noexcept { V::widen(p, lo, hi); }
  template <bool kCopy>
  CCLZ_TARGET_V3 CCLZ_INLINE static void put(P* d, P* c, __m256 lo, __m256 hi) noexcept {
    const __m256i r = V::pack(lo, hi);
    store_i256(d, r);
    if constexpr (kCopy) store_i256(c, r);
  }
  CCLZ_INLINE static float widen1(std::uint16_t x) noexcept { return Conv::widen_raw(x); }
  CCLZ_INLINE static std::uint16_t narrow1(float x) noexcept { return Conv::narrow(x); }
};
using fold_v3_f16 = fold_v3_u16<f16_halves, conv_f16>;
using fold_v3_bf16 = fold_v3_u16<bf16_halves, conv_bf16>;

#pragma GCC diagnostic pop

#endif  // CCLZ_KERNELS_X86

// ---------------------------------------------------------------------------
// n-input reduce, in blocks of kBlock elements. The running value lives in an
// L1-resident accumulator of the accumulation type (f32 for f16/bf16), so
// memory sees each source read once and dst written once. Per block:
//   first:  acc = op(s0, s1)        middle: acc = op(acc, s)
//   last:   dst = op(acc, s_last)   (rounded back for f16/bf16)
// A block's sources are all read before its dst is written, so dst may alias
// any source exactly; only last can meet it, as d == s_last.
// 256 elements (0.5-2 KiB per source): small enough that all k streams
// advance together and the hardware prefetchers keep up with each (measured
// at 64 MiB, k = 4, f32: 1.2x faster than the chain of reduce() calls with
// 1024-element blocks, 1.5x with 256), big enough to amortise the loop.
constexpr std::size_t kBlock = 256;

template <class T>
struct conv_identity {
  CCLZ_INLINE static T widen_raw(T x) noexcept { return x; }
  CCLZ_INLINE static T narrow(T x) noexcept { return x; }
};

// Plain element loops; S is the storage type, A the accumulation type.
template <class S, class A, class Conv>
struct soft_many {
  using P = unaligned_t<S>;
  template <class Op>
  CCLZ_INLINE static void first(A* __restrict acc, const P* __restrict a, const P* __restrict b,
                                std::size_t m) noexcept {
    for (std::size_t j = 0; j < m; ++j) acc[j] = Op::apply(Conv::widen_raw(S(a[j])), Conv::widen_raw(S(b[j])));
  }
  template <class Op>
  CCLZ_INLINE static void middle(A* __restrict acc, const P* __restrict src, std::size_t m) noexcept {
    for (std::size_t j = 0; j < m; ++j) acc[j] = Op::apply(acc[j], Conv::widen_raw(S(src[j])));
  }
  template <class Op>
  CCLZ_INLINE static void last_distinct(P* __restrict d, const A* __restrict acc, const P* __restrict src,
                                        std::size_t m) noexcept {
    for (std::size_t j = 0; j < m; ++j) d[j] = Conv::narrow(Op::apply(acc[j], Conv::widen_raw(S(src[j]))));
  }
  template <class Op>
  CCLZ_INLINE static void last_inplace(P* __restrict d, const A* __restrict acc, std::size_t m) noexcept {
    for (std::size_t j = 0; j < m; ++j) d[j] = Conv::narrow(Op::apply(acc[j], Conv::widen_raw(S(d[j]))));
  }
  template <class Op>
  CCLZ_INLINE static void last(P* d, const A* acc, const P* src, std::size_t m) noexcept {
    if (d == src) {
      last_inplace<Op>(d, acc, m);
    } else {
      last_distinct<Op>(d, acc, src, m);
    }
  }
};

// The block loop, for k >= 3 sources (two go to the pairwise reduce, whose
// result is the same). Pol supplies first, middle and last. copy, when not
// null, gets every block's result too.
#define CCLZ_MANY_BLOCKS_BODY                                                                               \
  using P = typename Pol::P;                                                                               \
  alignas(64) A acc[kBlock];                                                                               \
  for (std::size_t off = 0; off < n; off += kBlock) {                                                      \
    const std::size_t m = std::min(kBlock, n - off);                                                       \
    Pol::template first<Op>(acc, static_cast<const P*>(srcs[0]) + off, static_cast<const P*>(srcs[1]) + off, \
                            m);                                                                            \
    for (std::size_t s = 2; s + 1 < k; ++s) {                                                              \
      const P* src = static_cast<const P*>(srcs[s]) + off;                                                 \
      /* An empty volatile asm makes this loop nest imperfect: otherwise GCC's                             \
         unroll-and-jam fuses two sources into one inner loop that it then                                 \
         leaves scalar (measured: 3-5x slower than the vector loop). */                                    \
      asm volatile("" : "+r"(src));                                                                        \
      Pol::template middle<Op>(acc, src, m);                                                               \
    }                                                                                                      \
    Pol::template last<Op>(static_cast<P*>(dst) + off, acc, static_cast<const P*>(srcs[k - 1]) + off, m);  \
    /* The block is in L1: a second output costs a copy from there. */                                   \
    if (copy != nullptr) {                                                                                 \
      std::memcpy(static_cast<P*>(copy) + off, static_cast<const P*>(dst) + off, m * sizeof(P));           \
    }                                                                                                      \
  }

template <class Pol, class A, class Op>
CCLZ_INLINE void many_blocks(void* dst, void* copy, const void* const* srcs, std::size_t k, std::size_t n) noexcept {
  CCLZ_MANY_BLOCKS_BODY
}
#ifdef CCLZ_KERNELS_X86
// The same loop compiled for AVX2, so that the F16C/AVX2 steps inline into it
// (a generic-target loop could only call them, once per step).
template <class Pol, class A, class Op>
CCLZ_TARGET_V3 void many_blocks_v3(void* dst, void* copy, const void* const* srcs, std::size_t k,
                                    std::size_t n) noexcept {
  CCLZ_MANY_BLOCKS_BODY
}
template <class Pol, class A, class Op>
CCLZ_TARGET_V4 void many_blocks_v4(void* dst, void* copy, const void* const* srcs, std::size_t k,
                                    std::size_t n) noexcept {
  CCLZ_MANY_BLOCKS_BODY
}
#endif

template <class T>
using plain_policy = soft_many<T, T, conv_identity<T>>;

struct soft_bf16 : soft_many<std::uint16_t, float, conv_bf16> {
  template <class Op>
  CCLZ_INLINE static void many(void* dst, void* copy, const void* const* srcs, std::size_t k,
                               std::size_t n) noexcept {
    many_blocks<soft_bf16, float, Op>(dst, copy, srcs, k, n);
  }
  template <class Op, bool kCopy>
  CCLZ_INLINE static void reduce(void* d, void* c, const void* a, const void* b, std::size_t n) noexcept {
    reduce_loops<std::uint16_t, widened<conv_bf16, Op>, kCopy>(d, c, a, b, n);
  }
  template <class Op>
  CCLZ_INLINE static void scale(u16_u* d, std::size_t n, float q) noexcept {
    scale_soft<conv_bf16, Op>(d, n, q);
  }
};

// f16 policies: pairwise reduce, the n-input steps, and bulk conversions.
struct soft_f16 : soft_many<std::uint16_t, float, conv_f16> {
  template <class Op>
  CCLZ_INLINE static void many(void* dst, void* copy, const void* const* srcs, std::size_t k,
                               std::size_t n) noexcept {
    many_blocks<soft_f16, float, Op>(dst, copy, srcs, k, n);
  }
  template <class Op, bool kCopy>
  CCLZ_INLINE static void reduce(void* d, void* c, const void* a, const void* b, std::size_t n) noexcept {
    reduce_loops<std::uint16_t, widened<conv_f16, Op>, kCopy>(d, c, a, b, n);
  }
  CCLZ_INLINE static void widen(f32_u* out, const u16_u* in, std::size_t n) noexcept {
    widen_soft_u<conv_f16>(out, in, n);
  }
  CCLZ_INLINE static void narrow(u16_u* out, const f32_u* in, std::size_t n) noexcept {
    narrow_soft_u<conv_f16>(out, in, n);
  }
  template <class Op>
  CCLZ_INLINE static void scale(u16_u* d, std::size_t n, float q) noexcept {
    scale_soft<conv_f16, Op>(d, n, q);
  }
};

#ifdef CCLZ_KERNELS_X86
// Not always_inline: plain calls (once per reduce or per block) let the
// generic-target templates that use a policy call into F16C code.
struct hw_f16 {
  using P = u16_u;
  template <class Op>
  CCLZ_TARGET_V3 static void many(void* dst, void* copy, const void* const* srcs, std::size_t k,
                                  std::size_t n) noexcept {
    if (k > kFoldMax) return many_blocks_v3<hw_f16, float, Op>(dst, copy, srcs, k, n);
    if (copy != nullptr) return fold_v3<fold_v3_f16, Op, true>(dst, copy, srcs, k, n);
    fold_v3<fold_v3_f16, Op, false>(dst, copy, srcs, k, n);
  }
  template <class Op, bool kCopy>
  CCLZ_TARGET_V3 static void reduce(void* d, void* c, const void* a, const void* b, std::size_t n) noexcept {
    reduce_f16c<Op, kCopy>(d, c, a, b, n);
  }
  CCLZ_TARGET_V3 static void widen(f32_u* out, const u16_u* in, std::size_t n) noexcept {
    widen_f16c(out, in, n);
  }
  CCLZ_TARGET_V3 static void narrow(u16_u* out, const f32_u* in, std::size_t n) noexcept {
    narrow_f16c(out, in, n);
  }
  template <class Op>
  CCLZ_TARGET_V3 static void scale(u16_u* d, std::size_t n, float q) noexcept {
    const __m256 vq = _mm256_set1_ps(q);
    std::size_t j = 0;
    for (; j + 8 <= n; j += 8) store_h8(d + j, vop<Op>(load_h8(d + j), vq));
    for (; j < n; ++j) d[j] = f2h(Op::apply(h2f<false>(d[j]), q));
  }
  // acc is 64-byte aligned and j steps by 8 floats: aligned accumulator loads.
  template <class Op>
  CCLZ_TARGET_V3 CCLZ_INLINE static void first(float* acc, const P* a, const P* b, std::size_t m) noexcept {
    std::size_t j = 0;
    for (; j + 8 <= m; j += 8) _mm256_store_ps(acc + j, vop<Op>(load_h8(a + j), load_h8(b + j)));
    for (; j < m; ++j) acc[j] = Op::apply(h2f<false>(a[j]), h2f<false>(b[j]));
  }
  template <class Op>
  CCLZ_TARGET_V3 CCLZ_INLINE static void middle(float* acc, const P* src, std::size_t m) noexcept {
    std::size_t j = 0;
    for (; j + 8 <= m; j += 8) _mm256_store_ps(acc + j, vop<Op>(_mm256_load_ps(acc + j), load_h8(src + j)));
    for (; j < m; ++j) acc[j] = Op::apply(acc[j], h2f<false>(src[j]));
  }
  // Loads each src chunk before storing the same chunk of d: d == src is fine.
  template <class Op>
  CCLZ_TARGET_V3 CCLZ_INLINE static void last(P* d, const float* acc, const P* src, std::size_t m) noexcept {
    std::size_t j = 0;
    for (; j + 8 <= m; j += 8) store_h8(d + j, vop<Op>(_mm256_load_ps(acc + j), load_h8(src + j)));
    for (; j < m; ++j) {
      const std::uint16_t x = src[j];
      d[j] = f2h(Op::apply(acc[j], h2f<false>(x)));
    }
  }
};
#endif

#ifdef CCLZ_KERNELS_X86
// The accumulator holds each 16-element step in unpack order (8 low-half
// values, then 8 high-half values); first, middle and last all use the same
// order and the same split of the block, so it never needs undoing.
struct hw_bf16 {
  using P = u16_u;
  template <class Op>
  CCLZ_TARGET_V3 static void many(void* dst, void* copy, const void* const* srcs, std::size_t k,
                                  std::size_t n) noexcept {
    if (k > kFoldMax) return many_blocks_v3<hw_bf16, float, Op>(dst, copy, srcs, k, n);
    if (copy != nullptr) return fold_v3<fold_v3_bf16, Op, true>(dst, copy, srcs, k, n);
    fold_v3<fold_v3_bf16, Op, false>(dst, copy, srcs, k, n);
  }
  template <class Op, bool kCopy>
  CCLZ_TARGET_V3 static void reduce(void* d, void* c, const void* a, const void* b, std::size_t n) noexcept {
    reduce_bf16_avx2<Op, kCopy>(d, c, a, b, n);
  }
  template <class Op>
  CCLZ_TARGET_V3 static void scale(u16_u* d, std::size_t n, float q) noexcept {
    const __m256 vq = _mm256_set1_ps(q);
    std::size_t j = 0;
    for (; j + 16 <= n; j += 16) {
      const __m256i v = load_i256(d + j);
      store_i256(d + j, bf16_pack(vop<Op>(bf16_lo(v), vq), vop<Op>(bf16_hi(v), vq)));
    }
    for (; j < n; ++j) d[j] = f2b(Op::apply(b2f<false>(d[j]), q));
  }
  template <class Op>
  CCLZ_TARGET_V3 CCLZ_INLINE static void first(float* acc, const P* a, const P* b, std::size_t m) noexcept {
    std::size_t j = 0;
    for (; j + 16 <= m; j += 16) {
      const __m256i va = load_i256(a + j), vb = load_i256(b + j);
      _mm256_store_ps(acc + j, vop<Op>(bf16_lo(va), bf16_lo(vb)));
      _mm256_store_ps(acc + j + 8, vop<Op>(bf16_hi(va), bf16_hi(vb)));
    }
    for (; j < m; ++j) acc[j] = Op::apply(b2f<false>(a[j]), b2f<false>(b[j]));
  }
  template <class Op>
  CCLZ_TARGET_V3 CCLZ_INLINE static void middle(float* acc, const P* src, std::size_t m) noexcept {
    std::size_t j = 0;
    for (; j + 16 <= m; j += 16) {
      const __m256i v = load_i256(src + j);
      _mm256_store_ps(acc + j, vop<Op>(_mm256_load_ps(acc + j), bf16_lo(v)));
      _mm256_store_ps(acc + j + 8, vop<Op>(_mm256_load_ps(acc + j + 8), bf16_hi(v)));
    }
    for (; j < m; ++j) acc[j] = Op::apply(acc[j], b2f<false>(src[j]));
  }
  template <class Op>
  CCLZ_TARGET_V3 CCLZ_INLINE static void last(P* d, const float* acc, const P* src, std::size_t m) noexcept {
    std::size_t j = 0;
    for (; j + 16 <= m; j += 16) {
      const __m256i v = load_i256(src + j);
      store_i256(d + j, bf16_pack(vop<Op>(_mm256_load_ps(acc + j), bf16_lo(v)),
                                  vop<Op>(_mm256_load_ps(acc + j + 8), bf16_hi(v))));
    }
    for (; j < m; ++j) {
      const std::uint16_t x = src[j];
      d[j] = f2b(Op::apply(acc[j], b2f<false>(x)));
    }
  }
};
#endif

#ifdef CCLZ_KERNELS_X86
// 512-bit policies. acc is 64-byte aligned and every step starts at a
// multiple of 16 (f16) or 32 (bf16) floats: aligned accumulator accesses. A
// block's last step may be partial; it still fills whole accumulator steps
// (kBlock is a multiple of 32), and only its stores to d are masked.
struct hw512_f16 {
  using P = u16_u;
  template <class Op>
  CCLZ_TARGET_V4 static void many(void* dst, void* copy, const void* const* srcs, std::size_t k,
                                  std::size_t n) noexcept {
    if (k > kFoldMax) return many_blocks_v4<hw512_f16, float, Op>(dst, copy, srcs, k, n);
    if (copy != nullptr) return fold_u16_512<fold_f16_step<Op, true>>(dst, copy, srcs, k, n);
    fold_u16_512<fold_f16_step<Op, false>>(dst, copy, srcs, k, n);
  }
  template <class Op, bool kCopy>
  CCLZ_TARGET_V4 static void reduce(void* d, void* c, const void* a, const void* b, std::size_t n) noexcept {
    reduce_f16_512<Op, kCopy>(d, c, a, b, n);
  }
  CCLZ_TARGET_V4 static void widen(f32_u* out, const u16_u* in, std::size_t n) noexcept {
    widen_f16_512(out, in, n);
  }
  CCLZ_TARGET_V4 static void narrow(u16_u* out, const f32_u* in, std::size_t n) noexcept {
    narrow_f16_512(out, in, n);
  }
  template <class Op>
  CCLZ_TARGET_V4 static void scale(u16_u* d, std::size_t n, float q) noexcept {
    const __m512 vq = _mm512_set1_ps(q);
    std::size_t j = 0;
    for (; j + 16 <= n; j += 16) store_h16(d + j, vop512<Op>(load_h16(d + j, kFull16), vq), kFull16);
    if (j < n) store_h16(d + j, vop512<Op>(load_h16(d + j, mask16(n - j)), vq), mask16(n - j));
  }
  // One step each of first, middle and last; the loops below run whole
  // steps with kFull16 and a tail with its mask.
  template <class Op>
  CCLZ_TARGET_V4 CCLZ_INLINE static void first_step(float* acc, const P* a, const P* b, __mmask16 k) noexcept {
    _mm512_store_ps(acc, vop512<Op>(load_h16(a, k), load_h16(b, k)));
  }
  template <class Op>
  CCLZ_TARGET_V4 CCLZ_INLINE static void middle_step(float* acc, const P* src, __mmask16 k) noexcept {
    _mm512_store_ps(acc, vop512<Op>(_mm512_load_ps(acc), load_h16(src, k)));
  }
  // Loads each src step before storing the same step of d: d == src is fine.
  template <class Op>
  CCLZ_TARGET_V4 CCLZ_INLINE static void last_step(P* d, const float* acc, const P* src, __mmask16 k) noexcept {
    store_h16(d, vop512<Op>(_mm512_load_ps(acc), load_h16(src, k)), k);
  }
  template <class Op>
  CCLZ_TARGET_V4 CCLZ_INLINE static void first(float* acc, const P* a, const P* b, std::size_t m) noexcept {
    std::size_t j = 0;
    for (; j + 16 <= m; j += 16) first_step<Op>(acc + j, a + j, b + j, kFull16);
    if (j < m) first_step<Op>(acc + j, a + j, b + j, mask16(m - j));
  }
  template <class Op>
  CCLZ_TARGET_V4 CCLZ_INLINE static void middle(float* acc, const P* src, std::size_t m) noexcept {
    std::size_t j = 0;
    for (; j + 16 <= m; j += 16) middle_step<Op>(acc + j, src + j, kFull16);
    if (j < m) middle_step<Op>(acc + j, src + j, mask16(m - j));
  }
  template <class Op>
  CCLZ_TARGET_V4 CCLZ_INLINE static void last(P* d, const float* acc, const P* src, std::size_t m) noexcept {
    std::size_t j = 0;
    for (; j + 16 <= m; j += 16) last_step<Op>(d + j, acc + j, src + j, kFull16);
    if (j < m) last_step<Op>(d + j, acc + j, src + j, mask16(m - j));
  }
};

// hw512_f16 with two-input steps in native half arithmetic.
struct hw512fp16_f16 : hw512_f16 {
  template <class Op, bool kCopy>
  CCLZ_TARGET_FP16 static void reduce(void* d, void* c, const void* a, const void* b, std::size_t n) noexcept {
    reduce_f16_native<Op, kCopy>(d, c, a, b, n);
  }
};

// The accumulator holds each 32-element step as 16 even then 16 odd elements.
struct hw512_bf16 {
  using P = u16_u;
  template <class Op>
  CCLZ_TARGET_V4 static void many(void* dst, void* copy, const void* const* srcs, std::size_t k,
                                  std::size_t n) noexcept {
    if (k > kFoldMax) return many_blocks_v4<hw512_bf16, float, Op>(dst, copy, srcs, k, n);
    if (copy != nullptr) return fold_u16_512<fold_bf16_step<Op, true>>(dst, copy, srcs, k, n);
    fold_u16_512<fold_bf16_step<Op, false>>(dst, copy, srcs, k, n);
  }
  template <class Op, bool kCopy>
  CCLZ_TARGET_V4 static void reduce(void* d, void* c, const void* a, const void* b, std::size_t n) noexcept {
    reduce_bf16_512<Op, kCopy>(d, c, a, b, n);
  }
  template <class Op>
  CCLZ_TARGET_V4 CCLZ_INLINE static void scale_step(P* d, __m512 q, __mmask32 k) noexcept {
    const __m512i v = load_b32(d, k);
    store_b32(d, bf16_join512(vop512<Op>(bf16_even512(v), q), vop512<Op>(bf16_odd512(v), q)), k);
  }
  template <class Op>
  CCLZ_TARGET_V4 static void scale(u16_u* d, std::size_t n, float q) noexcept {
    const __m512 vq = _mm512_set1_ps(q);
    std::size_t j = 0;
    for (; j + 32 <= n; j += 32) scale_step<Op>(d + j, vq, kFull32);
    if (j < n) scale_step<Op>(d + j, vq, mask32(n - j));
  }
  template <class Op>
  CCLZ_TARGET_V4 CCLZ_INLINE static void first_step(float* acc, const P* a, const P* b, __mmask32 k) noexcept {
    const __m512i va = load_b32(a, k), vb = load_b32(b, k);
    _mm512_store_ps(acc, vop512<Op>(bf16_even512(va), bf16_even512(vb)));
    _mm512_store_ps(acc + 16, vop512<Op>(bf16_odd512(va), bf16_odd512(vb)));
  }
  template <class Op>
  CCLZ_TARGET_V4 CCLZ_INLINE static void middle_step(float* acc, const P* src, __mmask32 k) noexcept {
    const __m512i v = load_b32(src, k);
    _mm512_store_ps(acc, vop512<Op>(_mm512_load_ps(acc), bf16_even512(v)));
    _mm512_store_ps(acc + 16, vop512<Op>(_mm512_load_ps(acc + 16), bf16_odd512(v)));
  }
  template <class Op>
  CCLZ_TARGET_V4 CCLZ_INLINE static void last_step(P* d, const float* acc, const P* src, __mmask32 k) noexcept {
    const __m512i v = load_b32(src, k);
    store_b32(d,
              bf16_join512(vop512<Op>(_mm512_load_ps(acc), bf16_even512(v)),
                           vop512<Op>(_mm512_load_ps(acc + 16), bf16_odd512(v))),
              k);
  }
  template <class Op>
  CCLZ_TARGET_V4 CCLZ_INLINE static void first(float* acc, const P* a, const P* b, std::size_t m) noexcept {
    std::size_t j = 0;
    for (; j + 32 <= m; j += 32) first_step<Op>(acc + j, a + j, b + j, kFull32);
    if (j < m) first_step<Op>(acc + j, a + j, b + j, mask32(m - j));
  }
  template <class Op>
  CCLZ_TARGET_V4 CCLZ_INLINE static void middle(float* acc, const P* src, std::size_t m) noexcept {
    std::size_t j = 0;
    for (; j + 32 <= m; j += 32) middle_step<Op>(acc + j, src + j, kFull32);
    if (j < m) middle_step<Op>(acc + j, src + j, mask32(m - j));
  }
  template <class Op>
  CCLZ_TARGET_V4 CCLZ_INLINE static void last(P* d, const float* acc, const P* src, std::size_t m) noexcept {
    std::size_t j = 0;
    for (; j + 32 <= m; j += 32) last_step<Op>(d + j, acc + j, src + j, kFull32);
    if (j < m) last_step<Op>(d + j, acc + j, src + j, mask32(m - j));
  }
};
static_assert(kBlock % 32 == 0, "a partial 512-bit step must stay inside the accumulator");
#endif

// Which f16 and bf16 implementations a variant uses, and whether its f32
// n-input reduce may take fold_v3<fold_v3_f32> (AVX2).
struct soft_halves {
  static constexpr bool kFoldF32 = false;
  using f16 = soft_f16;
  using bf16 = soft_bf16;
};
#ifdef CCLZ_KERNELS_X86
struct hw_halves {
  static constexpr bool kFoldF32 = true;
  using f16 = hw_f16;
  using bf16 = hw_bf16;
};
struct hw512_halves {
  static constexpr bool kFoldF32 = true;
  using f16 = hw512_f16;
  using bf16 = hw512_bf16;
};
struct hw512fp16_halves {
  static constexpr bool kFoldF32 = true;
  using f16 = hw512fp16_f16;
  using bf16 = hw512_bf16;
};
#endif

template <class H, class Op, bool kCopy>
CCLZ_INLINE void reduce_op(void* dst, void* copy, const void* a, const void* b, std::size_t n, DataType dt) noexcept {
  switch (dt) {
    case DataType::f32: return reduce_loops<float, Op, kCopy>(dst, copy, a, b, n);
    case DataType::f64: return reduce_loops<double, Op, kCopy>(dst, copy, a, b, n);
    case DataType::i8: return reduce_loops<std::int8_t, Op, kCopy>(dst, copy, a, b, n);
    case DataType::u8: return reduce_loops<std::uint8_t, Op, kCopy>(dst, copy, a, b, n);
    case DataType::i32: return reduce_loops<std::int32_t, Op, kCopy>(dst, copy, a, b, n);
    case DataType::i64: return reduce_loops<std::int64_t, Op, kCopy>(dst, copy, a, b, n);
    case DataType::f16: return H::f16::template reduce<Op, kCopy>(dst, copy, a, b, n);
    case DataType::bf16: return H::bf16::template reduce<Op, kCopy>(dst, copy, a, b, n);
  }
}

template <class H, bool kCopy>
CCLZ_INLINE void reduce_any(void* dst, void* copy, const void* a, const void* b, std::size_t n, DataType dt,
                            ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum: return reduce_op<H, op_sum, kCopy>(dst, copy, a, b, n, dt);
    case ReduceOp::prod: return reduce_op<H, op_prod, kCopy>(dst, copy, a, b, n, dt);
    case ReduceOp::min: return reduce_op<H, op_min, kCopy>(dst, copy, a, b, n, dt);
    case ReduceOp::max: return reduce_op<H, op_max, kCopy>(dst, copy, a, b, n, dt);
    case ReduceOp::avg: return;
  }
}

template <class H, class Op>
CCLZ_INLINE void many_op(void* dst, void* copy, const void* const* srcs, std::size_t k, std::size_t n,
                         DataType dt) noexcept {
  switch (dt) {
    case DataType::f32:
#ifdef CCLZ_KERNELS_X86
      if constexpr (H::kFoldF32) {
        if (k <= kFoldMax) {
          return copy != nullptr ? fold_v3<fold_v3_f32, Op, true>(dst, copy, srcs, k, n)
                                 : fold_v3<fold_v3_f32, Op, false>(dst, copy, srcs, k, n);
        }
      }
#endif
      return many_blocks<plain_policy<float>, float, Op>(dst, copy, srcs, k, n);
    case DataType::f64: return many_blocks<plain_policy<double>, double, Op>(dst, copy, srcs, k, n);
    case DataType::i8: return many_blocks<plain_policy<std::int8_t>, std::int8_t, Op>(dst, copy, srcs, k, n);
    case DataType::u8: return many_blocks<plain_policy<std::uint8_t>, std::uint8_t, Op>(dst, copy, srcs, k, n);
    case DataType::i32: return many_blocks<plain_policy<std::int32_t>, std::int32_t, Op>(dst, copy, srcs, k, n);
    case DataType::i64: return many_blocks<plain_policy<std::int64_t>, std::int64_t, Op>(dst, copy, srcs, k, n);
    case DataType::f16: return H::f16::template many<Op>(dst, copy, srcs, k, n);
    case DataType::bf16: return H::bf16::template many<Op>(dst, copy, srcs, k, n);
  }
}

template <class H>
CCLZ_INLINE void many_any(void* dst, void* copy, const void* const* srcs, std::size_t k, std::size_t n, DataType dt,
                          ReduceOp op) noexcept {
  const std::size_t es = dtype_size(dt);
  if (k == 0 || es == 0 || n == 0) return;
  if (k == 1) {
    if (dst != srcs[0]) std::memmove(dst, srcs[0], n * es);
    if (copy != nullptr && copy != srcs[0]) std::memmove(copy, srcs[0], n * es);
    return;
  }
  switch (op) {
    case ReduceOp::sum: return many_op<H, op_sum>(dst, copy, srcs, k, n, dt);
    case ReduceOp::prod: return many_op<H, op_prod>(dst, copy, srcs, k, n, dt);
    case ReduceOp::min: return many_op<H, op_min>(dst, copy, srcs, k, n, dt);
    case ReduceOp::max: return many_op<H, op_max>(dst, copy, srcs, k, n, dt);
    case ReduceOp::avg: return;
  }
}

// ---------------------------------------------------------------------------
// divide(): the last step of avg, over a rank's output or the share of it
// the rank owns, compiled per variant like the reduce. Floats and integers
// are plain loops; f16 and bf16 go through their policy's `scale`, the
// reduce's vector conversions around one multiply or divide (the plain
// loop at the baseline ran 2.4 (f16) and 8.3 (bf16) GB/s in the cache,
// `scale` with avx512fp16 92 and 64; docs/performance-log.md). Integer
// division has no SIMD form on x86.
//
// A power of two divides as a multiplication by its reciprocal: x / 2^k and
// x * 2^-k are the same real number, rounded once either way, so the bits
// agree (subnormal results, infinities and NaNs included), and the loop
// runs at the multiplier's throughput instead of the divider's (avg of 2
// bound ranks, 1 MB: 190 us against 76 for sum; docs/performance-log.md).
CCLZ_INLINE bool power_of_two(int divisor) noexcept {
  return divisor > 0 && std::has_single_bit(static_cast<unsigned>(divisor));
}

template <class T>
CCLZ_INLINE void divide_float(void* dst, std::size_t n, int divisor) noexcept {
  using P = unaligned_t<T>;
  P* d = static_cast<P*>(dst);
  const T q = static_cast<T>(divisor);
  if (power_of_two(divisor)) {
    const T r = T(1) / q;
    for (std::size_t i = 0; i < n; ++i) d[i] = T(d[i]) * r;
    return;
  }
  for (std::size_t i = 0; i < n; ++i) d[i] = T(d[i]) / q;
}

// Halves through their policy (`scale`: vectors where the variant has them).
template <class Half>
CCLZ_INLINE void divide_half(void* dst, std::size_t n, int divisor) noexcept {
  u16_u* d = static_cast<u16_u*>(dst);
  const float q = static_cast<float>(divisor);
  if (power_of_two(divisor)) return Half::template scale<op_prod>(d, n, 1.0f / q);
  Half::template scale<op_quot>(d, n, q);
}

template <class T>
CCLZ_INLINE void divide_int(void* dst, std::size_t n, int divisor) noexcept {
  using U = std::make_unsigned_t<T>;
  using P = unaligned_t<T>;
  P* d = static_cast<P*>(dst);
  if (divisor == 0) return;
  if (divisor == -1) {  // x / -1 == -x, wrapping for the minimum (no UB)
    for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<T>(static_cast<U>(U{0} - static_cast<U>(T(d[i]))));
    return;
  }
  // i8/u8 promote to int; i32/i64 divide in their own type (no overflow now).
  using W = std::conditional_t<(sizeof(T) < sizeof(int)), int, T>;
  const W q = static_cast<W>(divisor);
  for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<T>(static_cast<W>(T(d[i])) / q);
}

template <class H>
CCLZ_INLINE void divide_any(void* dst, std::size_t count, DataType dt, int divisor) noexcept {
  switch (dt) {
    case DataType::f32: return divide_float<float>(dst, count, divisor);
    case DataType::f64: return divide_float<double>(dst, count, divisor);
    case DataType::i8: return divide_int<std::int8_t>(dst, count, divisor);
    case DataType::u8: return divide_int<std::uint8_t>(dst, count, divisor);
    case DataType::i32: return divide_int<std::int32_t>(dst, count, divisor);
    case DataType::i64: return divide_int<std::int64_t>(dst, count, divisor);
    case DataType::f16: return divide_half<typename H::f16>(dst, count, divisor);
    case DataType::bf16: return divide_half<typename H::bf16>(dst, count, divisor);
  }
}

// ---------------------------------------------------------------------------
// One set of entry points per instruction set. The bodies above are all
// always_inline, so each entry point is compiled for its own target.
#define CCLZ_DEFINE_VARIANT(NS, ATTR, H)                                                                   \
  namespace NS {                                                                                           \
  [[gnu::noinline]] ATTR void reduce(void* dst, const void* a, const void* b, std::size_t n, DataType dt,  \
                                     ReduceOp op) noexcept {                                               \
    reduce_any<H, false>(dst, nullptr, a, b, n, dt, op);                                                   \
  }                                                                                                        \
  ATTR void reduce_many(void* dst, void* copy, const void* const* srcs, std::size_t k, std::size_t n,      \
                        DataType dt, ReduceOp op) noexcept {                                               \
    if (k == 2) { /* the pairwise reduce: same result, no accumulator */                                   \
      if (copy == nullptr) return reduce(dst, srcs[0], srcs[1], n, dt, op);                                \
      return reduce_any<H, true>(dst, copy, srcs[0], srcs[1], n, dt, op);                                  \
    }                                                                                                      \
    many_any<H>(dst, copy, srcs, k, n, dt, op);                                                            \
  }                                                                                                        \
  ATTR void half_to_float(const std::uint16_t* src, float* dst, std::size_t n) noexcept {                  \
    H::f16::widen(reinterpret_cast<f32_u*>(dst), reinterpret_cast<const u16_u*>(src), n);                  \
  }                                                                                                        \
  ATTR void float_to_half(const float* src, std::uint16_t* dst, std::size_t n) noexcept {                  \
    H::f16::narrow(reinterpret_cast<u16_u*>(dst), reinterpret_cast<const f32_u*>(src), n);                 \
  }                                                                                                        \
  ATTR void bf16_to_float(const std::uint16_t* src, float* dst, std::size_t n) noexcept {                  \
    widen_soft_u<conv_bf16>(reinterpret_cast<f32_u*>(dst), reinterpret_cast<const u16_u*>(src), n);        \
  }                                                                                                        \
  ATTR void float_to_bf16(const float* src, std::uint16_t* dst, std::size_t n) noexcept {                  \
    narrow_soft_u<conv_bf16>(reinterpret_cast<u16_u*>(dst), reinterpret_cast<const f32_u*>(src), n);       \
  }                                                                                                        \
  ATTR void divide(void* dst, std::size_t n, DataType dt, int divisor) noexcept {                          \
    divide_any<H>(dst, n, dt, divisor);                                                                    \
  }                                                                                                        \
  }

#define CCLZ_NO_ATTR
CCLZ_DEFINE_VARIANT(isa_generic, CCLZ_NO_ATTR, soft_halves)
#ifdef CCLZ_KERNELS_X86
CCLZ_DEFINE_VARIANT(isa_avx2, CCLZ_TARGET_V3, hw_halves)
// AVX2 code for everything but f16/bf16, which call into 512-bit policies.
CCLZ_DEFINE_VARIANT(isa_avx512, CCLZ_TARGET_V3, hw512_halves)
// avx512 with f16 two-input steps in native half arithmetic.
CCLZ_DEFINE_VARIANT(isa_avx512fp16, CCLZ_TARGET_V3, hw512fp16_halves)
#endif

#define CCLZ_VARIANT_TABLE(NS, ISA)                                                                      \
  Variant {                                                                                              \
    ISA, &NS::reduce, &NS::reduce_many, &NS::half_to_float, &NS::float_to_half, &NS::bf16_to_float,      \
        &NS::float_to_bf16, &NS::divide                                                                  \
  }

constexpr Variant kGeneric = CCLZ_VARIANT_TABLE(isa_generic, Isa::generic);
#ifdef CCLZ_KERNELS_X86
constexpr Variant kAvx2 = CCLZ_VARIANT_TABLE(isa_avx2, Isa::avx2);
constexpr Variant kAvx512 = CCLZ_VARIANT_TABLE(isa_avx512, Isa::avx512);
constexpr Variant kAvx512Fp16 = CCLZ_VARIANT_TABLE(isa_avx512fp16, Isa::avx512fp16);
#endif

bool cpu_has(Isa isa) noexcept {
#ifdef CCLZ_KERNELS_X86
  __builtin_cpu_init();
  switch (isa) {
    case Isa::generic: return true;
    case Isa::avx2: return __builtin_cpu_supports("x86-64-v3");
    case Isa::avx512: return __builtin_cpu_supports("x86-64-v4");
    case Isa::avx512fp16: return __builtin_cpu_supports("x86-64-v4") && __builtin_cpu_supports("avx512fp16");
  }
  return false;
#else
  return isa == Isa::generic;
#endif
}

const Variant* pick_best() noexcept {
  if (const Variant* v = variant(Isa::avx512fp16)) return v;
  if (const Variant* v = variant(Isa::avx512)) return v;
  if (const Variant* v = variant(Isa::avx2)) return v;
  return &kGeneric;
}

}  // namespace

// ---------------------------------------------------------------------------
// Public entry points.

const char* isa_name(Isa isa) noexcept {
  switch (isa) {
    case Isa::generic: return "generic";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
    case Isa::avx512fp16: return "avx512fp16";
  }
  return "unknown";
}

const Variant* variant(Isa isa) noexcept {
  if (!cpu_has(isa)) return nullptr;
  switch (isa) {
    case Isa::generic: return &kGeneric;
#ifdef CCLZ_KERNELS_X86
    case Isa::avx2: return &kAvx2;
    case Isa::avx512: return &kAvx512;
    case Isa::avx512fp16: return &kAvx512Fp16;
#else
    default: return nullptr;
#endif
  }
  return nullptr;
}

const Variant& best_variant() noexcept {
  static const Variant* const best = pick_best();  // CPU features do not change; chosen once
  return *best;
}

void reduce(void* dst, const void* a, const void* b, std::size_t count, DataType dt, ReduceOp op) noexcept {
  best_variant().reduce(dst, a, b, count, dt, op);
}

void reduce_many(void* dst, std::span<const void* const> srcs, std::size_t count, DataType dt,
                 ReduceOp op) noexcept {
  best_variant().reduce_many(dst, nullptr, srcs.data(), srcs.size(), count, dt, op);
}

void reduce_many_copy(void* dst, void* copy, std::span<const void* const> srcs, std::size_t count, DataType dt,
                      ReduceOp op) noexcept {
  best_variant().reduce_many(dst, copy, srcs.data(), srcs.size(), count, dt, op);
}

bool reduce_many_stream(void* dst, void* copy, std::span<const void* const> srcs, std::size_t count, DataType dt,
                        ReduceOp op, bool dst_streamed) noexcept {
#ifdef CCLZ_KERNELS_X86
  static const bool has_avx2 = cpu_has(Isa::avx2);
  const std::size_t k = srcs.size();
  const bool typed = dt == DataType::f32 || dt == DataType::f16 || dt == DataType::bf16;
  const bool op_ok = op == ReduceOp::sum || op == ReduceOp::prod || op == ReduceOp::min || op == ReduceOp::max;
  const std::size_t es = dtype_size(dt);
  const auto at = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  // Halves from 3 sources on: the fold of 4 f16 or bf16 sources ran at
  // 0.6-0.7 of reduce_many into the cache and a streamed copy of that
  // (bench-kernels reduce_many_stream against reduce_then_stream), the
  // widening of every source then costing more than the second pass.
  const bool halves = dt != DataType::f32;
  // One output (copy null) is streamed whatever dst_streamed says.
  const bool one = copy == nullptr;
  if (one) copy = dst;
  if (!has_avx2 || !typed || !op_ok || k < 2 || k > (halves ? 2 : kMaxStreamSources) ||
      (at(dst) - at(copy)) % 16 != 0 || at(copy) % es != 0) {
    return false;
  }
  auto* d = static_cast<std::byte*>(dst);
  auto* c = static_cast<std::byte*>(copy);
  // The sources from the element `from` on.
  std::array<const void*, kMaxStreamSources> s{};
  const auto from = [&](std::size_t e) {
    for (std::size_t j = 0; j < k; ++j) s[j] = static_cast<const std::byte*>(srcs[j]) + e * es;
    return s.data();
  };
  // reduce_many_copy (ordinary stores) up to the first line of `copy`, so
  // that streaming stores fill whole lines from there (as shm::copy_stream),
  // and for the tail after the last whole step.
  const auto plain = [&](std::size_t e, std::size_t n) {
    best_variant().reduce_many(d + e * es, one ? nullptr : c + e * es, from(e), k, n, dt, op);
  };
  const std::size_t head = std::min(count, (64 - at(c) % 64) % 64 / es);
  plain(0, head);
  const auto steps = one            ? stream_steps<true, false>
                     : dst_streamed ? stream_steps<true, true>
                                    : stream_steps<false, true>;
  const std::size_t done = head + steps(d + head * es, c + head * es, from(head), k, count - head, dt, op);
  plain(done, count - done);
  return true;
#else
  (void)dst, (void)copy, (void)srcs, (void)count, (void)dt, (void)op, (void)dst_streamed;
  return false;
#endif
}

void divide(void* dst, std::size_t count, DataType dt, int divisor) noexcept {
  best_variant().divide(dst, count, dt, divisor);
}

float half_to_float(std::uint16_t h) noexcept { return h2f(h); }
std::uint16_t float_to_half(float f) noexcept { return f2h(f); }
float bf16_to_float(std::uint16_t b) noexcept { return b2f(b); }
std::uint16_t float_to_bf16(float f) noexcept { return f2b(f); }

void half_to_float(std::span<const std::uint16_t> src, std::span<float> dst) noexcept {
  best_variant().half_to_float(src.data(), dst.data(), std::min(src.size(), dst.size()));
}
void float_to_half(std::span<const float> src, std::span<std::uint16_t> dst) noexcept {
  best_variant().float_to_half(src.data(), dst.data(), std::min(src.size(), dst.size()));
}
void bf16_to_float(std::span<const std::uint16_t> src, std::span<float> dst) noexcept {
  best_variant().bf16_to_float(src.data(), dst.data(), std::min(src.size(), dst.size()));
}
void float_to_bf16(std::span<const float> src, std::span<std::uint16_t> dst) noexcept {
  best_variant().float_to_bf16(src.data(), dst.data(), std::min(src.size(), dst.size()));
}

}  // namespace cclz::kernels
