// Deterministic random numbers for the trainers: splitmix64 (Steele, Lea,
// Flood 2014) to mix seeds and counters, xoshiro256** (Blackman, Vigna 2018)
// as the stream generator, Box-Muller for normals. Written out here rather
// than taken from <random> because std::normal_distribution's algorithm is
// implementation-defined: weights must be the same on every platform and
// standard library for the parity and checkpoint tests to mean anything.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

namespace cclz::train {

// One splitmix64 output for state x: a bijective 64-bit mix.
constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Mixes a seed with counters into one well-spread 64-bit value; used to give
// each (seed, step, sequence) or (seed, tensor) its own independent draw.
constexpr std::uint64_t hash_combine(std::uint64_t seed, std::uint64_t a, std::uint64_t b = 0) noexcept {
  return splitmix64(splitmix64(splitmix64(seed) ^ a) ^ (b * 0xD6E8FEB86659FD93ull));
}

// Uniform integer in [0, n) from a 64-bit hash by Lemire's multiply-shift;
// the bias is at most n / 2^64, negligible for corpus offsets.
__extension__ typedef unsigned __int128 uint128_t;  // __extension__: quiet under -Wpedantic
inline std::uint64_t uniform_below(std::uint64_t h, std::uint64_t n) noexcept {
  return static_cast<std::uint64_t>((static_cast<uint128_t>(h) * n) >> 64);
}

class Rng {
 public:
  explicit Rng(std::uint64_t seed) noexcept {
    std::uint64_t x = seed;
    for (auto& w : s_) {
      x += 0x9E3779B97F4A7C15ull;
      w = splitmix64(x);
    }
  }

  std::uint64_t next_u64() noexcept {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 53 random bits.
  double uniform() noexcept { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

  // Standard normal by Box-Muller; one draw per call (the sine half is
  // dropped so the stream position does not depend on call parity).
  double normal() noexcept {
    const double u1 = 1.0 - uniform();  // (0, 1]: log stays finite
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

  std::array<std::uint64_t, 4> state() const noexcept { return s_; }
  void set_state(const std::array<std::uint64_t, 4>& s) noexcept { s_ = s; }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) noexcept { return (x << k) | (x >> (64 - k)); }
  std::array<std::uint64_t, 4> s_{};
};

}  // namespace cclz::train
