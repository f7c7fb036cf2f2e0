// The quantizer kernels (quant.hpp): stochastic levels (QSGD, Alistarh et
// al. 2017; TernGrad, Wen et al. 2017), blockwise absmax int8/int4 (as
// ZeRO++'s quantized collectives) and sign bits (EF-signSGD, Karimireddy et
// al. 2019; Signum, Bernstein et al. 2018). Cost: one read of the input per
// encode (the block's norm pass runs in L1), one write of the payload; one
// read of the payload and a read-modify-write of the f32 accumulator per
// decode.
//
// Two variants, chosen at run time as src/kernels.cpp does: baseline scalar
// code, and AVX2 intrinsics (x86-64-v3, through a target attribute, so the
// build needs no -march flag). They give bit-identical payloads: the only
// order-dependent sums (an L2 norm, sum |x|) are defined as 32 f32 lanes
// (lane = i mod 32) combined by one fixed tree, which the scalar code
// reproduces; no FMA contraction anywhere.
// GCC contracts a * b + c into an FMA by default in C++ (-ffp-contract=fast),
// intrinsics included, where the target has FMA (the AVX2 variant): off for
// this file, so both variants round the same way.
#pragma GCC optimize("fp-contract=off")

#include <algorithm>
#include <cmath>
#include <limits>

#include "compressors/quant.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#define CCLZ_QUANT_X86 1
#define CCLZ_TARGET_V3 __attribute__((target("arch=x86-64-v3")))
#endif

namespace cclz::compress::quant {

Key block_key(std::uint64_t stream, std::uint64_t block_index, float scale) noexcept {
  std::uint32_t sb;
  std::memcpy(&sb, &scale, 4);
  // splitmix64's finaliser over the three inputs, each spread by an odd constant.
  std::uint64_t z = stream ^ (block_index * 0x9e3779b97f4a7c15ULL) ^ (std::uint64_t{sb} * 0xd1b54a32d192ed03ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return {static_cast<std::uint32_t>(z), static_cast<std::uint32_t>(z >> 32)};
}

namespace {

constexpr std::size_t kSignChunk = 4096;  // sum |x| goes to f64 this often (precision over 1e8 elements)

// ---------------------------------------------------------------- shared scalar pieces

// The fixed combination of 32 lane sums: groups of 8 lanes added pairwise
// ((l[j] + l[j+8]) + (l[j+16] + l[j+24])), then the 8 left by halves.
float tree32(const float* l) noexcept {
  float g[8];
  for (int j = 0; j < 8; ++j) g[j] = (l[j] + l[j + 8]) + (l[j + 16] + l[j + 24]);
  const float h0 = g[0] + g[4], h1 = g[1] + g[5], h2 = g[2] + g[6], h3 = g[3] + g[7];
  return (h0 + h2) + (h1 + h3);
}

bool finite(float f) noexcept { return std::fabs(f) <= std::numeric_limits<float>::max(); }

// The scale of a level block, or NaN when the input is not all finite.
// `lanes` holds the 32 lane sums of squares (l2) from elements already seen.
float level_scale_finish(const float* x, std::size_t n, Norm norm, float* lanes, float amax, bool bad) noexcept {
  if (bad) return std::numeric_limits<float>::quiet_NaN();
  if (norm == Norm::max) return amax;
  const float ss = tree32(lanes);
  if (finite(ss)) return std::sqrt(ss);
  double d = 0;  // squares overflowed f32 (|x| > ~1e19): redo in f64
  for (std::size_t i = 0; i < n; ++i) d += static_cast<double>(x[i]) * x[i];
  return static_cast<float>(std::sqrt(d));
}

// Levels for elements [i0, n), i0 a multiple of 8, written as whole bytes.
void level_tail(const float* x, std::size_t i0, std::size_t n, int bits, float inv, std::uint32_t s, Key key,
                std::byte* planes, std::size_t pb) noexcept {
  for (std::size_t i = i0; i < n; i += 8) {
    std::uint32_t byte[9] = {};
    const std::size_t e = std::min(n, i + 8);
    for (std::size_t j = i; j < e; ++j) {
      const float a = std::fabs(x[j]) * inv;
      const float fl = std::floor(a);
      const float f = a - fl;
      std::uint32_t l = static_cast<std::uint32_t>(fl) + (uniform(key, static_cast<std::uint32_t>(j)) < f ? 1u : 0u);
      l = std::min(l, s);
      byte[0] |= static_cast<std::uint32_t>(std::signbit(x[j])) << (j - i);
      for (int k = 0; k < bits; ++k) byte[k + 1] |= ((l >> k) & 1u) << (j - i);
    }
    for (int k = 0; k <= bits; ++k) planes[static_cast<std::size_t>(k) * pb + i / 8] = std::byte(byte[k]);
  }
}

void level_decode_tail(const std::byte* planes, std::size_t pb, std::size_t i0, std::size_t n, int bits, float w,
                       float* acc) noexcept {
  for (std::size_t i = i0; i < n; ++i) {
    const std::size_t b = i / 8;
    const unsigned sh = i % 8;
    std::uint32_t l = 0;
    for (int k = 0; k < bits; ++k) {
      l |= ((std::to_integer<std::uint32_t>(planes[static_cast<std::size_t>(k + 1) * pb + b]) >> sh) & 1u) << k;
    }
    const float v = static_cast<float>(l) * w;
    acc[i] += ((std::to_integer<unsigned>(planes[b]) >> sh) & 1u) ? -v : v;
  }
}

struct AbsmaxParams {
  float scale, inv, qmax;
  bool zero;  // all zeros, or not finite (scale NaN): every q is 0
};

AbsmaxParams absmax_params(float amax, bool bad, int bits) noexcept {
  const float qmax = bits == 8 ? 127.0f : 7.0f;
  if (bad) return {std::numeric_limits<float>::quiet_NaN(), 0.0f, qmax, true};
  if (amax == 0.0f) return {0.0f, 0.0f, qmax, true};
  return {amax / qmax, qmax / amax, qmax, false};
}

int absmax_q(float x, const AbsmaxParams& p, bool stochastic, Key key, std::uint32_t j) noexcept {
  if (p.zero) return 0;
  const float t = x * p.inv;
  float q;
  if (stochastic) {
    const float fl = std::floor(t);
    q = fl + (uniform(key, j) < t - fl ? 1.0f : 0.0f);
  } else {
    q = std::nearbyint(t);  // the default rounding mode: to nearest even, as cvtps2dq
  }
  return static_cast<int>(std::clamp(q, -p.qmax, p.qmax));
}

void absmax_store_tail(const float* x, std::size_t i0, std::size_t n, int bits, const AbsmaxParams& p,
                       bool stochastic, Key key, std::byte* q) noexcept {
  if (bits == 8) {
    for (std::size_t i = i0; i < n; ++i) {
      q[i] = std::byte(static_cast<std::uint8_t>(absmax_q(x[i], p, stochastic, key, static_cast<std::uint32_t>(i))));
    }
    return;
  }
  for (std::size_t i = i0; i < n; i += 2) {  // i0 even
    const unsigned lo = static_cast<unsigned>(absmax_q(x[i], p, stochastic, key, static_cast<std::uint32_t>(i))) & 15u;
    const unsigned hi =
        i + 1 < n ? static_cast<unsigned>(absmax_q(x[i + 1], p, stochastic, key, static_cast<std::uint32_t>(i + 1))) & 15u
                  : 0u;
    q[i / 2] = std::byte(lo | (hi << 4));
  }
}

void absmax_decode_tail(const std::byte* q, std::size_t i0, std::size_t n, int bits, float w, float* acc) noexcept {
  for (std::size_t i = i0; i < n; ++i) {
    int v;
    if (bits == 8) {
      v = static_cast<std::int8_t>(std::to_integer<std::uint8_t>(q[i]));
    } else {
      const unsigned nib = (std::to_integer<unsigned>(q[i / 2]) >> (4 * (i % 2))) & 15u;
      v = static_cast<int>(nib) - (nib >= 8 ? 16 : 0);
    }
    acc[i] += static_cast<float>(v) * w;
  }
}

// ---------------------------------------------------------------- baseline variant

namespace isa_generic {

void level_encode(const float* x, std::size_t n, int bits, Norm norm, std::uint64_t stream,
                  std::uint64_t block_index, std::byte* out) noexcept {
  float lanes[32] = {};
  float amax = 0.0f;
  bool bad = false;
  for (std::size_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    bad = bad || !finite(a);
    amax = std::max(amax, a);
    lanes[i % 32] += x[i] * x[i];
  }
  const float scale = level_scale_finish(x, n, norm, lanes, amax, bad);
  const std::uint32_t s = (1u << bits) - 1;
  const std::size_t pb = plane_bytes(n);
  write_scale(out, scale);
  std::byte* planes = out + 4;
  if (!(scale > 0.0f) || bad) {
    std::memset(planes, 0, static_cast<std::size_t>(bits + 1) * pb);
    return;
  }
  const float inv = static_cast<float>(s) / scale;
  level_tail(x, 0, n, bits, inv, s, block_key(stream, block_index, scale), planes, pb);
}

void level_decode_add(const std::byte* in, std::size_t n, int bits, float alpha, float* acc) noexcept {
  const float w = read_scale(in) / static_cast<float>((1u << bits) - 1) * alpha;
  level_decode_tail(in + 4, plane_bytes(n), 0, n, bits, w, acc);
}

void absmax_encode(const float* x, std::size_t n, int bits, bool stochastic, std::uint64_t stream,
                   std::uint64_t block_index, std::byte* out) noexcept {
  float amax = 0.0f;
  bool bad = false;
  for (std::size_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    bad = bad || !finite(a);
    amax = std::max(amax, a);
  }
  const AbsmaxParams p = absmax_params(amax, bad, bits);
  write_scale(out, p.scale);
  const Key key = stochastic ? block_key(stream, block_index, p.scale) : Key{0, 0};
  absmax_store_tail(x, 0, n, bits, p, stochastic, key, out + 4);
}

void absmax_decode_add(const std::byte* in, std::size_t n, int bits, float alpha, float* acc) noexcept {
  absmax_decode_tail(in + 4, 0, n, bits, read_scale(in) * alpha, acc);
}

double sign_pack_impl(const float* x, std::size_t n, std::byte* bits) noexcept {
  double total = 0;
  for (std::size_t c = 0; c < n; c += kSignChunk) {
    const std::size_t e = std::min(n, c + kSignChunk);
    float lanes[32] = {};
    for (std::size_t i = c; i < e; ++i) lanes[(i - c) % 32] += std::fabs(x[i]);
    for (std::size_t i = c; i < e; i += 8) {
      unsigned b = 0;
      for (std::size_t j = i; j < std::min(e, i + 8); ++j) b |= static_cast<unsigned>(std::signbit(x[j])) << (j - i);
      bits[i / 8] = std::byte(b);
    }
    total += tree32(lanes);
  }
  return total;
}

double sign_pack(const float* x, std::size_t n, std::byte* bits) noexcept { return sign_pack_impl(x, n, bits); }

double momentum_sign_pack(const float* g, float* m, std::size_t n, float beta, std::byte* bits) noexcept {
  const float c = 1.0f - beta;
  for (std::size_t i = 0; i < n; ++i) m[i] = beta * m[i] + c * g[i];
  return sign_pack_impl(m, n, bits);
}

void sign_decode_add(const std::byte* bits, std::size_t n, float w, float* acc) noexcept {
  for (std::size_t i = 0; i < n; ++i) acc[i] += ((std::to_integer<unsigned>(bits[i / 8]) >> (i % 8)) & 1u) ? -w : w;
}

}  // namespace isa_generic

constexpr Kernels kGeneric = {
    kernels::Isa::generic,          &isa_generic::level_encode,      &isa_generic::level_decode_add,
    &isa_generic::absmax_encode,    &isa_generic::absmax_decode_add, &isa_generic::sign_pack,
    &isa_generic::momentum_sign_pack, &isa_generic::sign_decode_add,
};

// ---------------------------------------------------------------- AVX2 variant

#ifdef CCLZ_QUANT_X86

// bit_lanes[b][j] = (b >> j) & 1: a byte of a bit-plane spread over 8 lanes.
struct BitLanes {
  alignas(32) std::int32_t v[256][8];
  constexpr BitLanes() : v() {
    for (int b = 0; b < 256; ++b) {
      for (int j = 0; j < 8; ++j) v[b][j] = (b >> j) & 1;
    }
  }
};
constexpr BitLanes kBitLanes;

namespace isa_avx2 {

#define CCLZ_V3_INLINE [[gnu::always_inline]] inline CCLZ_TARGET_V3

CCLZ_V3_INLINE __m256i bits_of(std::byte b) {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(kBitLanes.v[std::to_integer<unsigned>(b)]));
}

// draw24 for the 8 counters j .. j+7.
CCLZ_V3_INLINE __m256i draw24x8(Key k, std::uint32_t j) {
  const __m256i ka = _mm256_set1_epi32(static_cast<int>(k.a)), kb = _mm256_set1_epi32(static_cast<int>(k.b));
  __m256i x = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(j)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  x = _mm256_xor_si256(_mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0x9e3779b1u))), ka);
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0x85ebca6bu)));
  x = _mm256_xor_si256(x, kb);
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 13));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0xc2b2ae35u)));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  return _mm256_srli_epi32(x, 8);
}
CCLZ_V3_INLINE __m256 uniform8(Key k, std::uint32_t j) {
  return _mm256_mul_ps(_mm256_cvtepi32_ps(draw24x8(k, j)), _mm256_set1_ps(0x1p-24f));
}

CCLZ_V3_INLINE __m256 abs8(__m256 v) { return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))); }
// Lanes whose |x| is infinite or NaN.
CCLZ_V3_INLINE __m256 nonfinite8(__m256 a) {
  return _mm256_cmp_ps(a, _mm256_set1_ps(std::numeric_limits<float>::max()), _CMP_NLE_UQ);
}

CCLZ_V3_INLINE float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// Max |x|, the 32 lane sums of squares (when want_sq) and whether any
// element is not finite.
CCLZ_V3_INLINE void block_stats(const float* x, std::size_t n, bool want_sq, float* lanes, float* amax, bool* bad) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  __m256 m0 = s0, m1 = s0, nf = s0;
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
    const __m256 v2 = _mm256_loadu_ps(x + i + 16), v3 = _mm256_loadu_ps(x + i + 24);
    const __m256 a0 = abs8(v0), a1 = abs8(v1), a2 = abs8(v2), a3 = abs8(v3);
    m0 = _mm256_max_ps(m0, _mm256_max_ps(a0, a1));
    m1 = _mm256_max_ps(m1, _mm256_max_ps(a2, a3));
    nf = _mm256_or_ps(nf, _mm256_or_ps(_mm256_or_ps(nonfinite8(a0), nonfinite8(a1)),
                                       _mm256_or_ps(nonfinite8(a2), nonfinite8(a3))));
    if (want_sq) {
      s0 = _mm256_add_ps(s0, _mm256_mul_ps(v0, v0));
      s1 = _mm256_add_ps(s1, _mm256_mul_ps(v1, v1));
      s2 = _mm256_add_ps(s2, _mm256_mul_ps(v2, v2));
      s3 = _mm256_add_ps(s3, _mm256_mul_ps(v3, v3));
    }
  }
  _mm256_storeu_ps(lanes, s0);
  _mm256_storeu_ps(lanes + 8, s1);
  _mm256_storeu_ps(lanes + 16, s2);
  _mm256_storeu_ps(lanes + 24, s3);
  float mx = hmax8(_mm256_max_ps(m0, m1));
  bool b = _mm256_movemask_ps(nf) != 0;
  for (; i < n; ++i) {
    const float a = std::fabs(x[i]);
    b = b || !finite(a);
    mx = std::max(mx, a);
    if (want_sq) lanes[i % 32] += x[i] * x[i];
  }
  *amax = mx;
  *bad = b;
}

CCLZ_TARGET_V3 void level_encode(const float* x, std::size_t n, int bits, Norm norm, std::uint64_t stream,
                                 std::uint64_t block_index, std::byte* out) noexcept {
  float lanes[32];
  float amax;
  bool bad;
  block_stats(x, n, norm == Norm::l2, lanes, &amax, &bad);
  const float scale = level_scale_finish(x, n, norm, lanes, amax, bad);
  const std::uint32_t s = (1u << bits) - 1;
  const std::size_t pb = plane_bytes(n);
  write_scale(out, scale);
  std::byte* planes = out + 4;
  if (!(scale > 0.0f) || bad) {
    std::memset(planes, 0, static_cast<std::size_t>(bits + 1) * pb);
    return;
  }
  const float inv = static_cast<float>(s) / scale;
  const Key key = block_key(stream, block_index, scale);
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256i vs = _mm256_set1_epi32(static_cast<int>(s));
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 a = _mm256_mul_ps(abs8(v), vinv);
    const __m256 fl = _mm256_floor_ps(a);
    const __m256 up = _mm256_cmp_ps(uniform8(key, static_cast<std::uint32_t>(i)), _mm256_sub_ps(a, fl), _CMP_LT_OQ);
    // cvtt(fl) - (-1 where up): floor plus the stochastic step, clamped to s.
    const __m256i l = _mm256_min_epu32(_mm256_sub_epi32(_mm256_cvttps_epi32(fl), _mm256_castps_si256(up)), vs);
    const std::size_t b = i / 8;
    planes[b] = std::byte(static_cast<unsigned char>(_mm256_movemask_ps(v)));
    for (int k = 0; k < bits; ++k) {
      const __m256i t = _mm256_sll_epi32(l, _mm_cvtsi32_si128(31 - k));
      planes[static_cast<std::size_t>(k + 1) * pb + b] =
          std::byte(static_cast<unsigned char>(_mm256_movemask_ps(_mm256_castsi256_ps(t))));
    }
  }
  if (i < n) level_tail(x, i, n, bits, inv, s, key, planes, pb);
}

CCLZ_TARGET_V3 void level_decode_add(const std::byte* in, std::size_t n, int bits, float alpha, float* acc) noexcept {
  const float w = read_scale(in) / static_cast<float>((1u << bits) - 1) * alpha;
  const std::byte* planes = in + 4;
  const std::size_t pb = plane_bytes(n);
  const __m256 vw = _mm256_set1_ps(w);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const std::size_t b = i / 8;
    __m256i l = _mm256_setzero_si256();
    for (int k = 0; k < bits; ++k) {
      l = _mm256_or_si256(l, _mm256_sll_epi32(bits_of(planes[static_cast<std::size_t>(k + 1) * pb + b]),
                                              _mm_cvtsi32_si128(k)));
    }
    const __m256 sign = _mm256_castsi256_ps(_mm256_slli_epi32(bits_of(planes[b]), 31));
    const __m256 v = _mm256_xor_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(l), vw), sign);
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), v));
  }
  if (i < n) level_decode_tail(planes, pb, i, n, bits, w, acc);
}

// q for 8 elements (as int32), absmax parameters p (not p.zero).
CCLZ_V3_INLINE __m256i absmax_q8(__m256 v, const AbsmaxParams& p, bool stochastic, Key key, std::uint32_t j) {
  const __m256 t = _mm256_mul_ps(v, _mm256_set1_ps(p.inv));
  __m256 q;
  if (stochastic) {
    const __m256 fl = _mm256_floor_ps(t);
    const __m256 up = _mm256_cmp_ps(uniform8(key, j), _mm256_sub_ps(t, fl), _CMP_LT_OQ);
    q = _mm256_add_ps(fl, _mm256_and_ps(up, _mm256_set1_ps(1.0f)));
  } else {
    q = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  q = _mm256_min_ps(_mm256_max_ps(q, _mm256_set1_ps(-p.qmax)), _mm256_set1_ps(p.qmax));
  return _mm256_cvttps_epi32(q);
}

CCLZ_TARGET_V3 void absmax_encode(const float* x, std::size_t n, int bits, bool stochastic, std::uint64_t stream,
                                  std::uint64_t block_index, std::byte* out) noexcept {
  float lanes[32];
  float amax;
  bool bad;
  block_stats(x, n, false, lanes, &amax, &bad);
  const AbsmaxParams p = absmax_params(amax, bad, bits);
  write_scale(out, p.scale);
  std::byte* q = out + 4;
  if (p.zero) {
    std::memset(q, 0, absmax_block_bytes(bits, n) - 4);
    return;
  }
  const Key key = stochastic ? block_key(stream, block_index, p.scale) : Key{0, 0};
  // 32 elements per step: four int32 vectors narrowed to 32 bytes; packs
  // interleave 128-bit lanes, the permute restores element order.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const auto j = static_cast<std::uint32_t>(i);
    const __m256i q0 = absmax_q8(_mm256_loadu_ps(x + i), p, stochastic, key, j);
    const __m256i q1 = absmax_q8(_mm256_loadu_ps(x + i + 8), p, stochastic, key, j + 8);
    const __m256i q2 = absmax_q8(_mm256_loadu_ps(x + i + 16), p, stochastic, key, j + 16);
    const __m256i q3 = absmax_q8(_mm256_loadu_ps(x + i + 24), p, stochastic, key, j + 24);
    const __m256i w01 = _mm256_packs_epi32(q0, q1), w23 = _mm256_packs_epi32(q2, q3);
    const __m256i b = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23), order);
    if (bits == 8) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), b);
    } else {
      // Pairs of bytes (even, odd) as u16 -> (even & 15) | (odd << 4).
      const __m256i lo = _mm256_and_si256(b, _mm256_set1_epi16(0x000f));
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), _mm256_set1_epi16(0x00f0));
      const __m256i nib = _mm256_or_si256(lo, hi);  // 16 u16, each < 256
      const __m128i packed = _mm_packus_epi16(_mm256_castsi256_si128(nib), _mm256_extracti128_si256(nib, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i / 2), packed);
    }
  }
  if (i < n) absmax_store_tail(x, i, n, bits, p, stochastic, key, q);
}

CCLZ_TARGET_V3 void absmax_decode_add(const std::byte* in, std::size_t n, int bits, float alpha,
                                      float* acc) noexcept {
  const float w = read_scale(in) * alpha;
  const std::byte* q = in + 4;
  const __m256 vw = _mm256_set1_ps(w);
  std::size_t i = 0;
  if (bits == 8) {
    for (; i + 8 <= n; i += 8) {
      const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i)));
      _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_mul_ps(_mm256_cvtepi32_ps(v), vw)));
    }
  } else {
    const __m256i shl = _mm256_setr_epi32(28, 24, 20, 16, 12, 8, 4, 0);
    for (; i + 8 <= n; i += 8) {
      std::uint32_t word;
      std::memcpy(&word, q + i / 2, 4);
      // Nibble j to the top of lane j, then an arithmetic shift sign-extends it.
      const __m256i v = _mm256_srai_epi32(_mm256_sllv_epi32(_mm256_set1_epi32(static_cast<int>(word)), shl), 28);
      _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_mul_ps(_mm256_cvtepi32_ps(v), vw)));
    }
  }
  if (i < n) absmax_decode_tail(q, i, n, bits, w, acc);
}

// Sign bits and sum |x| of one chunk (<= kSignChunk elements, starting on a
// byte of `bits`).
CCLZ_V3_INLINE float sign_chunk(const float* x, std::size_t n, std::byte* bits) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
    const __m256 v2 = _mm256_loadu_ps(x + i + 16), v3 = _mm256_loadu_ps(x + i + 24);
    s0 = _mm256_add_ps(s0, abs8(v0));
    s1 = _mm256_add_ps(s1, abs8(v1));
    s2 = _mm256_add_ps(s2, abs8(v2));
    s3 = _mm256_add_ps(s3, abs8(v3));
    const std::uint32_t word = static_cast<std::uint32_t>(_mm256_movemask_ps(v0)) |
                               static_cast<std::uint32_t>(_mm256_movemask_ps(v1)) << 8 |
                               static_cast<std::uint32_t>(_mm256_movemask_ps(v2)) << 16 |
                               static_cast<std::uint32_t>(_mm256_movemask_ps(v3)) << 24;
    std::memcpy(bits + i / 8, &word, 4);
  }
  alignas(32) float lanes[32];
  _mm256_store_ps(lanes, s0);
  _mm256_store_ps(lanes + 8, s1);
  _mm256_store_ps(lanes + 16, s2);
  _mm256_store_ps(lanes + 24, s3);
  for (std::size_t k = i; k < n; ++k) lanes[k % 32] += std::fabs(x[k]);
  for (; i < n; i += 8) {
    unsigned b = 0;
    for (std::size_t j = i; j < std::min(n, i + 8); ++j) b |= static_cast<unsigned>(std::signbit(x[j])) << (j - i);
    bits[i / 8] = std::byte(b);
  }
  return tree32(lanes);
}

CCLZ_TARGET_V3 double sign_pack(const float* x, std::size_t n, std::byte* bits) noexcept {
  double total = 0;
  for (std::size_t c = 0; c < n; c += kSignChunk) total += sign_chunk(x + c, std::min(kSignChunk, n - c), bits + c / 8);
  return total;
}

CCLZ_TARGET_V3 double momentum_sign_pack(const float* g, float* m, std::size_t n, float beta,
                                         std::byte* bits) noexcept {
  const float c = 1.0f - beta;
  const __m256 vb = _mm256_set1_ps(beta), vc = _mm256_set1_ps(c);
  double total = 0;
  for (std::size_t c0 = 0; c0 < n; c0 += kSignChunk) {
    // Update the chunk while it is in L1, then pack it.
    const std::size_t e = std::min(n, c0 + kSignChunk);
    std::size_t i = c0;
    for (; i + 8 <= e; i += 8) {
      const __m256 v = _mm256_add_ps(_mm256_mul_ps(vb, _mm256_loadu_ps(m + i)), _mm256_mul_ps(vc, _mm256_loadu_ps(g + i)));
      _mm256_storeu_ps(m + i, v);
    }
    for (; i < e; ++i) m[i] = beta * m[i] + c * g[i];
    total += sign_chunk(m + c0, e - c0, bits + c0 / 8);
  }
  return total;
}

CCLZ_TARGET_V3 void sign_decode_add(const std::byte* bits, std::size_t n, float w, float* acc) noexcept {
  const __m256 vw = _mm256_set1_ps(w);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 sign = _mm256_castsi256_ps(_mm256_slli_epi32(bits_of(bits[i / 8]), 31));
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_xor_ps(vw, sign)));
  }
  for (; i < n; ++i) acc[i] += ((std::to_integer<unsigned>(bits[i / 8]) >> (i % 8)) & 1u) ? -w : w;
}

#undef CCLZ_V3_INLINE

}  // namespace isa_avx2

constexpr Kernels kAvx2 = {
    kernels::Isa::avx2,          &isa_avx2::level_encode,      &isa_avx2::level_decode_add,
    &isa_avx2::absmax_encode,    &isa_avx2::absmax_decode_add, &isa_avx2::sign_pack,
    &isa_avx2::momentum_sign_pack, &isa_avx2::sign_decode_add,
};

#endif  // CCLZ_QUANT_X86

const Kernels* pick_best() noexcept {
  if (const Kernels* k = kernels_for(kernels::Isa::avx2)) return k;
  return &kGeneric;
}

}  // namespace

const Kernels* kernels_for(kernels::Isa isa) noexcept {
  switch (isa) {
    case kernels::Isa::generic: return &kGeneric;
    case kernels::Isa::avx2:
#ifdef CCLZ_QUANT_X86
      __builtin_cpu_init();
      return __builtin_cpu_supports("x86-64-v3") ? &kAvx2 : nullptr;
#else
      return nullptr;
#endif
    case kernels::Isa::avx512:
    case kernels::Isa::avx512fp16: return nullptr;  // no 512-bit quantisation kernels: avx2's serve
  }
  return nullptr;
}

const Kernels& best() noexcept {
  static const Kernels* const k = pick_best();
  return *k;
}

}  // namespace cclz::compress::quant
