// Reduction kernels: the one place where `dst = op(a, b)` is computed, for
// every dtype and op. f16 and bf16 are widened to f32, combined and rounded
// back (round to nearest even), so a ring hop loses at most one rounding.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cclz/types.hpp"

namespace cclz::kernels {

// dst[i] = op(a[i], b[i]) for i < count. dst may alias a or b (exactly, not
// partially). op must be sum, prod, min or max; avg is sum followed by
// divide(). Integer sum and prod wrap modulo 2^bits.
void reduce(void* dst, const void* a, const void* b, std::size_t count, DataType dt, ReduceOp op) noexcept;

// dst[i] = dst[i] / divisor (the last step of avg). Integers truncate
// towards zero; floats divide in their accumulation type (f32 for f16/bf16).
void divide(void* dst, std::size_t count, DataType dt, int divisor) noexcept;

float half_to_float(std::uint16_t h) noexcept;
std::uint16_t float_to_half(float f) noexcept;
float bf16_to_float(std::uint16_t b) noexcept;
std::uint16_t float_to_bf16(float f) noexcept;

}  // namespace cclz::kernels
