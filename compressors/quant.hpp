// Internal: the numerical cores of the quantizing compressors (qsgd,
// terngrad, int8, int4, sign, signum) and their payload layouts, kept apart
// from the Compressor classes so tests reach them directly. Every kernel has
// a baseline version and an AVX2 one (picked at run time, as src/kernels
// does); both give bit-identical payloads and sums, which the tests check.
//
// Payload layouts (little-endian; bit i of a bit-plane is bit i%8 of byte
// i/8; every block starts on a byte boundary, right after the previous one):
//
//   levels (qsgd, terngrad), per bucket of n elements:
//     f32 scale | plane 0: sign bits | planes 1..B: bit k-1 of the level
//     = 4 + (B + 1) * ceil(n / 8) bytes. Element i decodes to
//     (sign ? -1 : +1) * level * scale / (2^B - 1).
//   absmax (int8, int4), per block of n elements:
//     f32 scale | n int8 (int8), or ceil(n/2) bytes of two's-complement
//     nibbles, element 2j in the low nibble of byte j (int4).
//     Element i decodes to q_i * scale.
//   sign (sign, signum), one block for the whole tensor:
//     f32 scale | ceil(n / 8) bytes of sign bits (1 = negative);
//     element i decodes to (sign ? -scale : +scale).
//
// A scale that is NaN marks a block whose input held a NaN or an infinity:
// it decodes to NaN, so the problem stays visible after aggregation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "cclz/compress.hpp"
#include "kernels.hpp"

namespace cclz::compress::quant {

// ---------------------------------------------------------------- randomness
//
// Counter-based: the uniform for element j of a block is a hash of (the
// block's key, j), so any chunk can be encoded alone, in any order, and
// vector lanes draw independently. The block key mixes the stream (spec
// seed and step), the block's index in the tensor and the block's scale
// bits: ranks with different data, and the re-encode of a partial sum at a
// ring hop, draw different numbers without knowing their rank.
struct Key {
  std::uint32_t a, b;
};
Key block_key(std::uint64_t stream, std::uint64_t block_index, float scale) noexcept;

// 24 random bits (murmur3's fmix32 with the second key word folded in
// between its rounds).
inline std::uint32_t draw24(Key k, std::uint32_t j) noexcept {
  std::uint32_t x = (j * 0x9e3779b1u) ^ k.a;
  x ^= x >> 16;
  x *= 0x85ebca6bu;
  x ^= k.b;
  x ^= x >> 13;
  x *= 0xc2b2ae35u;
  x ^= x >> 16;
  return x >> 8;
}
// Uniform in [0, 1) on a 2^-24 grid.
inline float uniform(Key k, std::uint32_t j) noexcept { return static_cast<float>(draw24(k, j)) * 0x1p-24f; }

// ---------------------------------------------------------------- layouts

enum class Norm : int { l2 = 0, max = 1 };  // levels: QSGD's bucket L2 norm, TernGrad's max |g|

inline std::size_t plane_bytes(std::size_t n) noexcept { return (n + 7) / 8; }
inline std::size_t level_block_bytes(int bits, std::size_t n) noexcept {
  return n == 0 ? 0 : 4 + static_cast<std::size_t>(bits + 1) * plane_bytes(n);
}
inline std::size_t absmax_block_bytes(int bits, std::size_t n) noexcept {
  return n == 0 ? 0 : 4 + (bits == 8 ? n : (n + 1) / 2);
}
inline std::size_t sign_bytes(std::size_t n) noexcept { return 4 + plane_bytes(n); }

// Bytes of `elems` elements cut into blocks of `block` (the last partial)
// whose payload is block_bytes(n) for n elements.
template <class F>
std::size_t blocked_bytes(std::size_t elems, std::size_t block, F block_bytes) noexcept {
  const std::size_t full = elems / block, rest = elems % block;
  return full * block_bytes(block) + block_bytes(rest);
}

inline float read_scale(const std::byte* p) noexcept {
  float s;
  std::memcpy(&s, p, 4);
  return s;
}
inline void write_scale(std::byte* p, float s) noexcept { std::memcpy(p, &s, 4); }

// ---------------------------------------------------------------- kernels
//
// One block per call; the compressors loop over blocks. `out` / `in` point at
// the block's payload (its size from the layout functions above); n >= 1.
// decode_add: acc[i] += w * q_i with w = alpha * (scale / levels), computed
// once per block, so alpha = 1 gives exactly q_i * unit.

struct Kernels {
  kernels::Isa isa;
  // Levels: scale = ||x||_2 (l2) or max |x_i| (max); level_i = floor(|x_i| *
  // s / scale + u_i), u_i uniform, clamped to s = 2^bits - 1: unbiased.
  void (*level_encode)(const float* x, std::size_t n, int bits, Norm norm, std::uint64_t stream,
                       std::uint64_t block_index, std::byte* out) noexcept;
  void (*level_decode_add)(const std::byte* in, std::size_t n, int bits, float alpha, float* acc) noexcept;
  // Absmax: scale = max |x_i| / qmax (qmax = 127 for 8 bits, 7 for 4);
  // q_i = round-to-nearest-even(x_i / scale), or with stochastic,
  // floor(x_i / scale + u_i), clamped to [-qmax, qmax].
  void (*absmax_encode)(const float* x, std::size_t n, int bits, bool stochastic, std::uint64_t stream,
                        std::uint64_t block_index, std::byte* out) noexcept;
  void (*absmax_decode_add)(const std::byte* in, std::size_t n, int bits, float alpha, float* acc) noexcept;
  // Sign bits of x into `bits` (plane_bytes(n) bytes); returns sum |x_i|
  // (f32 partial sums in a fixed order, added in f64 every 4096 elements).
  double (*sign_pack)(const float* x, std::size_t n, std::byte* bits) noexcept;
  // Signum: m = beta * m + (1 - beta) * g first, then sign_pack of m.
  double (*momentum_sign_pack)(const float* g, float* m, std::size_t n, float beta, std::byte* bits) noexcept;
  void (*sign_decode_add)(const std::byte* bits, std::size_t n, float w, float* acc) noexcept;
};

// nullptr when this build or this CPU lacks the variant.
const Kernels* kernels_for(kernels::Isa isa) noexcept;
// The best one this CPU has (chosen once).
const Kernels& best() noexcept;

// ---------------------------------------------------------------- factories

// qsgd (norm l2, key bits) and terngrad (norm max, 1 bit): blockquant.cpp.
Status make_levels(const CompressorSpec& spec, Norm norm, std::unique_ptr<Compressor>* out);
// int8 (bits 8) and int4 (bits 4): blockquant.cpp.
Status make_absmax(const CompressorSpec& spec, int bits, std::unique_ptr<Compressor>* out);
// sign and signum (momentum): signs.cpp.
Status make_sign(const CompressorSpec& spec, bool momentum, std::unique_ptr<Compressor>* out);

}  // namespace cclz::compress::quant
