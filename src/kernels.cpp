// Reduction kernels: dst[i] = op(a[i], b[i]) for every dtype and op, and the
// divide step of avg. First, simple and correct version: plain scalar loops.
// f16/bf16 follow IEEE 754 binary16 / bfloat16 with round to nearest even.
// Cost: one pass, 2 reads + 1 write of count * dtype_size bytes.
#include "kernels.hpp"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace cclz::kernels {

float half_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0x1f) {
    // inf stays inf; NaN is quieted and keeps its payload (as F16C does).
    bits = sign | 0x7f800000u | (mant << 13) | (mant ? 0x00400000u : 0u);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal half: normalise. value = mant * 2^-24.
    int e = 113;  // exponent of 2^-14 in f32 bias, minus the shifts below
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | (static_cast<std::uint32_t>(e) << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

std::uint16_t float_to_half(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) {  // NaN: quiet it, keep the top payload bits
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  }
  if (ax >= 0x477ff000u) {  // >= 65520 rounds to inf (65504 + half an ulp)
    return static_cast<std::uint16_t>(sign | 0x7c00u);
  }
  if (ax >= 0x38800000u) {  // normal half range (>= 2^-14)
    const std::uint32_t rounded = ax + 0xfffu + ((ax >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
  }
  if (ax < 0x33000000u) {  // < 2^-25: rounds to zero (2^-25 itself ties to 0)
    return static_cast<std::uint16_t>(sign);
  }
  // Subnormal half: value = m * 2^-24 with m < 1024. Shift the full
  // significand into place and round to nearest even on the dropped bits.
  const std::uint32_t e = ax >> 23;
  const std::uint32_t sig = (ax & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = 126 - e;  // 14..24 for e in [102, 112]
  const std::uint32_t kept = sig >> shift;
  const std::uint32_t rem = sig & ((1u << shift) - 1u);
  const std::uint32_t halfway = 1u << (shift - 1);
  const std::uint32_t up = (rem > halfway || (rem == halfway && (kept & 1u))) ? 1u : 0u;
  return static_cast<std::uint16_t>(sign | (kept + up));
}

float bf16_to_float(std::uint16_t b) noexcept {
  std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  if ((bits & 0x7fffffffu) > 0x7f800000u) bits |= 0x00400000u;  // quiet NaN
  return std::bit_cast<float>(bits);
}

std::uint16_t float_to_bf16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<std::uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  }
  // Round to nearest even; carries into the exponent (and up to inf) are right.
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

namespace {

template <class T>
using wide_unsigned = std::make_unsigned_t<T>;

// Integer sum/prod in unsigned arithmetic: wraps modulo 2^bits, no UB.
template <class T>
T int_add(T a, T b) {
  using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, wide_unsigned<T>>;
  return static_cast<T>(static_cast<U>(static_cast<U>(static_cast<wide_unsigned<T>>(a)) +
                                       static_cast<U>(static_cast<wide_unsigned<T>>(b))));
}
template <class T>
T int_mul(T a, T b) {
  using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, wide_unsigned<T>>;
  return static_cast<T>(static_cast<U>(static_cast<U>(static_cast<wide_unsigned<T>>(a)) *
                                       static_cast<U>(static_cast<wide_unsigned<T>>(b))));
}

// Floating min/max propagate NaN (IEEE 754-2019 minimum/maximum).
template <class F>
F fmin_nan(F a, F b) {
  if (a != a || b != b) return a + b;
  if (a == b) return std::signbit(a) ? a : b;  // -0 < +0
  return b < a ? b : a;
}
template <class F>
F fmax_nan(F a, F b) {
  if (a != a || b != b) return a + b;
  if (a == b) return std::signbit(a) ? b : a;
  return b > a ? b : a;
}

template <class T>
T combine(T a, T b, ReduceOp op) {
  if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case ReduceOp::sum: return a + b;
      case ReduceOp::prod: return a * b;
      case ReduceOp::min: return fmin_nan(a, b);
      case ReduceOp::max: return fmax_nan(a, b);
      default: return a;
    }
  } else {
    switch (op) {
      case ReduceOp::sum: return int_add(a, b);
      case ReduceOp::prod: return int_mul(a, b);
      case ReduceOp::min: return b < a ? b : a;
      case ReduceOp::max: return b > a ? b : a;
      default: return a;
    }
  }
}

template <class T>
void reduce_typed(void* dst, const void* a, const void* b, std::size_t n, ReduceOp op) {
  for (std::size_t i = 0; i < n; ++i) {
    T x, y;
    std::memcpy(&x, static_cast<const T*>(a) + i, sizeof(T));
    std::memcpy(&y, static_cast<const T*>(b) + i, sizeof(T));
    const T r = combine(x, y, op);
    std::memcpy(static_cast<T*>(dst) + i, &r, sizeof(T));
  }
}

template <float (*to_f)(std::uint16_t), std::uint16_t (*from_f)(float)>
void reduce_half(void* dst, const void* a, const void* b, std::size_t n, ReduceOp op) {
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t x, y;
    std::memcpy(&x, static_cast<const std::uint16_t*>(a) + i, 2);
    std::memcpy(&y, static_cast<const std::uint16_t*>(b) + i, 2);
    const std::uint16_t r = from_f(combine(to_f(x), to_f(y), op));
    std::memcpy(static_cast<std::uint16_t*>(dst) + i, &r, 2);
  }
}

template <class T>
void divide_typed(void* dst, std::size_t n, int d) {
  for (std::size_t i = 0; i < n; ++i) {
    T x;
    std::memcpy(&x, static_cast<T*>(dst) + i, sizeof(T));
    if constexpr (std::is_floating_point_v<T>) {
      x = x / static_cast<T>(d);
    } else {
      if (d == 0) return;  // integer division by zero: leave dst unchanged
      if (d == -1) {
        x = static_cast<T>(static_cast<wide_unsigned<T>>(0u - static_cast<wide_unsigned<T>>(x)));
      } else if constexpr (sizeof(T) < sizeof(int)) {
        x = static_cast<T>(static_cast<int>(x) / d);
      } else {
        x = static_cast<T>(x / static_cast<T>(d));
      }
    }
    std::memcpy(static_cast<T*>(dst) + i, &x, sizeof(T));
  }
}

template <float (*to_f)(std::uint16_t), std::uint16_t (*from_f)(float)>
void divide_half(void* dst, std::size_t n, int d) {
  const float fd = static_cast<float>(d);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t x;
    std::memcpy(&x, static_cast<std::uint16_t*>(dst) + i, 2);
    x = from_f(to_f(x) / fd);
    std::memcpy(static_cast<std::uint16_t*>(dst) + i, &x, 2);
  }
}

}  // namespace

void reduce(void* dst, const void* a, const void* b, std::size_t count, DataType dt, ReduceOp op) noexcept {
  if (op != ReduceOp::sum && op != ReduceOp::prod && op != ReduceOp::min && op != ReduceOp::max) return;
  switch (dt) {
    case DataType::f32: return reduce_typed<float>(dst, a, b, count, op);
    case DataType::f64: return reduce_typed<double>(dst, a, b, count, op);
    case DataType::i8: return reduce_typed<std::int8_t>(dst, a, b, count, op);
    case DataType::u8: return reduce_typed<std::uint8_t>(dst, a, b, count, op);
    case DataType::i32: return reduce_typed<std::int32_t>(dst, a, b, count, op);
    case DataType::i64: return reduce_typed<std::int64_t>(dst, a, b, count, op);
    case DataType::f16: return reduce_half<half_to_float, float_to_half>(dst, a, b, count, op);
    case DataType::bf16: return reduce_half<bf16_to_float, float_to_bf16>(dst, a, b, count, op);
  }
}

void divide(void* dst, std::size_t count, DataType dt, int divisor) noexcept {
  switch (dt) {
    case DataType::f32: return divide_typed<float>(dst, count, divisor);
    case DataType::f64: return divide_typed<double>(dst, count, divisor);
    case DataType::i8: return divide_typed<std::int8_t>(dst, count, divisor);
    case DataType::u8: return divide_typed<std::uint8_t>(dst, count, divisor);
    case DataType::i32: return divide_typed<std::int32_t>(dst, count, divisor);
    case DataType::i64: return divide_typed<std::int64_t>(dst, count, divisor);
    case DataType::f16: return divide_half<half_to_float, float_to_half>(dst, count, divisor);
    case DataType::bf16: return divide_half<bf16_to_float, float_to_bf16>(dst, count, divisor);
  }
}

}  // namespace cclz::kernels
