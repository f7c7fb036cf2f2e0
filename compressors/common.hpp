// Internal helpers shared by the compressors: dtype conversion to and from
// f32, a small deterministic RNG, the sparse payload format and magnitude
// selection (exact radix select, sampled threshold, fixed threshold).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "cclz/compress.hpp"

namespace cclz::compress {

// ---------------------------------------------------------------- dtypes
// Buffers are aligned to their element type (callers' tensors and payloads).

inline std::span<float> as_f32(std::span<std::byte> b) noexcept {
  return {reinterpret_cast<float*>(b.data()), b.size() / sizeof(float)};
}
inline std::span<const float> as_f32(std::span<const std::byte> b) noexcept {
  return {reinterpret_cast<const float*>(b.data()), b.size() / sizeof(float)};
}

// dst[i] = float(src[i]); src holds dst.size() elements of dt (f32, f16, bf16).
void load_f32(std::span<const std::byte> src, DataType dt, std::span<float> dst) noexcept;
// `src` (n elements of dt) as f32: src itself for f32, else widened into
// `widened` (resized to n), which the result then points into.
std::span<const float> f32_view(std::span<const std::byte> src, DataType dt, std::size_t n,
                                std::vector<float>& widened);
// dst (src.size() elements of dt) = src rounded to nearest even.
void store_f32(std::span<const float> src, DataType dt, std::span<std::byte> dst) noexcept;
// acc[i] += alpha * float(src[i]).
void add_scaled(std::span<const std::byte> src, DataType dt, std::span<float> acc, float alpha) noexcept;
// n elements from sdt to ddt (any of f32, f16, bf16), rounding to nearest even.
void convert(std::span<const std::byte> src, DataType sdt, std::span<std::byte> dst, DataType ddt,
             std::size_t n) noexcept;

// ---------------------------------------------------------------- RNG

// splitmix64 (Steele, Lea, Flood 2014): tiny, fast and the same on every
// platform, which is what shared-seed schemes need.
struct Rng {
  std::uint64_t s;
  explicit Rng(std::uint64_t seed) noexcept : s(seed) {}
  std::uint64_t next() noexcept {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n), n >= 1, without bias (Lemire 2019).
  std::uint32_t below(std::uint32_t n) noexcept {
    std::uint64_t m = (next() >> 32) * n;
    auto low = static_cast<std::uint32_t>(m);
    if (low < n) {
      const std::uint32_t t = static_cast<std::uint32_t>(-n) % n;
      while (low < t) {
        m = (next() >> 32) * n;
        low = static_cast<std::uint32_t>(m);
      }
    }
    return static_cast<std::uint32_t>(m >> 32);
  }
};

// A seed for (spec seed, step, stream): different inputs give unrelated streams.
std::uint64_t mix_seed(std::uint64_t seed, std::uint64_t step, std::uint64_t stream) noexcept;

// ---------------------------------------------------------------- sparse payload
//
// k u32 indices (any order, each < count), then k values of `vdt`
// (f32, f16 or bf16). k is the payload size / (4 + size of vdt).

inline std::size_t sparse_bytes(std::size_t k, DataType vdt) noexcept { return k * (4 + dtype_size(vdt)); }

// Payload of the elements at idx, values copied bit for bit from src (count
// elements of dt): the values are in the input dtype.
void sparse_write(std::span<const std::uint32_t> idx, std::span<const std::byte> src, DataType dt,
                  std::vector<std::byte>* out);
// acc[idx[j]] += alpha * value[j]; fails on a size that is not k records or
// an index >= acc.size().
Status sparse_decode_add(const Compressor& c, std::span<const std::byte> payload, DataType vdt, std::span<float> acc,
                         float alpha);
// acc[idx[j]] += alpha * value[j] without checks: for this rank's own payload.
void sparse_add_trusted(std::span<const std::byte> payload, DataType vdt, std::span<float> acc, float alpha) noexcept;

// ---------------------------------------------------------------- selection
//
// Magnitude order is the order of |x|'s bit pattern: NaN sorts above inf,
// so a NaN is always selected rather than silently dropped. Ties at the
// k-th magnitude go to the lower indices. Output indices are ascending.

inline std::uint32_t mag_key(float f) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u & 0x7fffffffu;
}

// k for a ratio of n: ceil(ratio * n) clamped to [min(1, n), n].
std::size_t count_for_ratio(double ratio, std::size_t n) noexcept;

struct SelectScratch {
  std::vector<std::uint32_t> cand;  // radix select candidates (keys, or indices when prefiltered)
  std::vector<std::uint32_t> sample;
  std::vector<std::uint32_t> keys;  // the prefiltered candidates' keys
};

// Exactly min(k, n) indices of the largest |x| (radix select: three passes
// over x, no sort).
void topk_exact(std::span<const float> x, std::size_t k, SelectScratch& scratch, std::vector<std::uint32_t>* idx);

// The sampled-threshold band: the count lies in [ceil(0.8 k), floor(1.3 k)].
struct Band {
  std::size_t lo, hi;
};
Band sampled_band(std::size_t k) noexcept;

// Deep Gradient Compression's selection: the threshold is the matching
// order statistic of a random sample of |x|, every |x| >= threshold is
// taken; if that count falls outside sampled_band(k), the exact top-k is
// taken instead. One pass over x plus the sample when the estimate holds.
void topk_sampled(std::span<const float> x, std::size_t k, std::uint64_t seed, SelectScratch& scratch,
                  std::vector<std::uint32_t>* idx);

// Every index with |x| >= tau (tau >= 0), plus NaNs.
void select_at_least(std::span<const float> x, float tau, std::vector<std::uint32_t>* idx);

// ---------------------------------------------------------------- factories

// The fp16/bf16/none casts (cast.cpp); `to` is f16, bf16, or nullptr for
// the input dtype.
enum class CastTo : int { same, f16, bf16 };
Status make_cast(const CompressorSpec& spec, CastTo to, std::unique_ptr<Compressor>* out);

// Wraps inner in error feedback (error_feedback.cpp); spec.feedback says which.
Status make_error_feedback(const CompressorSpec& spec, std::unique_ptr<Compressor> inner,
                           std::unique_ptr<Compressor>* out);

// ratio in (0, 1] (key "ratio", default def).
Status get_ratio(const CompressorSpec& spec, double def, double* out);
// Sparse payloads index with u32.
Status check_u32_count(const Compressor& c, const TensorDesc& desc);

}  // namespace cclz::compress

namespace cclz::compress {
// DGC's density at a step (dgc.cpp): the warm-up schedule, then ratio.
double dgc_density(std::uint64_t step, std::int64_t warmup, double ratio) noexcept;
}  // namespace cclz::compress
