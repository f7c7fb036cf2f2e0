// Reduction kernels: the one place where `dst = op(a, b)` is computed, for
// every dtype and op. f16 and bf16 are widened to f32, combined and rounded
// back (round to nearest even), so a ring hop loses at most one rounding.
//
// Semantics shared by every variant (and checked by tests/unit/test_kernels):
// - Integer sum and prod wrap modulo 2^bits (computed in unsigned, no UB).
// - Floating min/max follow IEEE 754-2019 minimum/maximum: a NaN in either
//   input gives a quiet NaN (which payload survives when both inputs are NaN
//   is unspecified), and -0 < +0.
// - f16 <-> f32 and bf16 <-> f32 conversions round to nearest even, keep
//   inf, produce and read subnormals exactly, and quiet NaNs keeping the top
//   payload bits (bit for bit what x86 F16C does). They assume the default
//   floating-point environment (round to nearest).
// - Pointers need no alignment; dst may alias a source exactly (not partly).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "cclz/types.hpp"

namespace cclz::kernels {

// dst[i] = op(a[i], b[i]) for i < count. dst may alias a or b (exactly, not
// partially). op must be sum, prod, min or max; avg is sum followed by
// divide(). Integer sum and prod wrap modulo 2^bits. An invalid dtype or op
// leaves dst untouched (callers validate arguments and report a Status).
void reduce(void* dst, const void* a, const void* b, std::size_t count, DataType dt, ReduceOp op) noexcept;

// dst[i] = op(...op(op(srcs[0][i], srcs[1][i]), srcs[2][i])..., srcs[n-1][i])
// in one pass: n reads and one write per element instead of the 3(n-1) of a
// chain of reduce() calls (a node-local reduction over shared-memory
// buffers). dst may alias any source exactly. Integers and f32/f64 give the
// chain's result bit for bit; f16/bf16 keep the running value in f32 and
// round once at the end (at least as accurate as the chain, not always
// equal to it). One source copies it; none leaves dst untouched.
void reduce_many(void* dst, std::span<const void* const> srcs, std::size_t count, DataType dt, ReduceOp op) noexcept;

// reduce_many that also stores the result to `copy` (a second output, such
// as a peer's buffer), in the same pass: two sources store each result
// vector twice from the register, more store each block to copy from L1.
// Faster than reduce_many and a copy (the direct all-reduce's in-place 4 MB
// call ran 1.2-1.4x faster). copy may alias a source exactly, as dst may,
// and must not overlap dst; nullptr makes this reduce_many.
void reduce_many_copy(void* dst, void* copy, std::span<const void* const> srcs, std::size_t count, DataType dt,
                      ReduceOp op) noexcept;

// reduce_many_copy with streaming (non-temporal) stores to both outputs: for
// results neither output's reader will find in this core's cache (a staged
// all-reduce's reduced share, to the slot its peers read and to the output,
// when its slots go through memory). The same results as reduce_many_copy
// (where that gives a NaN, a NaN, its payload perhaps another source's).
// With dst_streamed false, dst takes ordinary stores and only copy is
// streamed (a staged all-reduce's share to a slot its peers read from this
// core's cache, and to its output, in one pass).
// Returns false, writing nothing, where there is no such kernel (or it was
// measured slower than two passes): dtypes other than f32, f16 and bf16,
// ops other than sum, prod, min and max, CPUs without AVX2, fewer than 2
// sources, more than kMaxStreamSources f32 or 2 f16/bf16 sources, or
// outputs not 16-byte aligned alike ((dst - copy) % 16 != 0, or copy not
// aligned to its element); the caller then takes two passes. dst and copy
// may each alias a source exactly and must not overlap each other. copy
// nullptr: one output, dst, streamed (dst_streamed is then ignored).
inline constexpr std::size_t kMaxStreamSources = 16;  // measured up to 16 (docs/performance.md)
bool reduce_many_stream(void* dst, void* copy, std::span<const void* const> srcs, std::size_t count, DataType dt,
                        ReduceOp op, bool dst_streamed = true) noexcept;

// dst[i] = dst[i] / divisor (the last step of avg). Integers truncate
// towards zero; floats divide in their accumulation type (f32 for f16/bf16).
// Integer division by 0 leaves dst unchanged (floats follow IEEE 754);
// INT_MIN / -1 wraps.
void divide(void* dst, std::size_t count, DataType dt, int divisor) noexcept;

float half_to_float(std::uint16_t h) noexcept;
std::uint16_t float_to_half(float f) noexcept;
float bf16_to_float(std::uint16_t b) noexcept;
std::uint16_t float_to_bf16(float f) noexcept;

// Bulk conversions (fp16/bf16 cast compressors, mixed-precision buffers):
// convert min(src.size(), dst.size()) elements, same rules as the scalar ones.
void half_to_float(std::span<const std::uint16_t> src, std::span<float> dst) noexcept;
void float_to_half(std::span<const float> src, std::span<std::uint16_t> dst) noexcept;
void bf16_to_float(std::span<const std::uint16_t> src, std::span<float> dst) noexcept;
void float_to_bf16(std::span<const float> src, std::span<std::uint16_t> dst) noexcept;

// Instruction-set variants. The functions above use the best one this CPU
// has (chosen once); tests and benchmarks reach each one through variant().
enum class Isa : int {
  generic = 0,  // baseline x86-64 (SSE2), or the target's default elsewhere
  avx2 = 1,     // x86-64-v3: AVX2, F16C, FMA (not used: no contraction)
  avx512 = 2,   // x86-64-v4: avx2's kernels, with f16/bf16 on 512-bit vectors
  avx512fp16 = 3,  // avx512, with two-input f16 steps in AVX512-FP16 arithmetic
};
inline constexpr Isa kAllIsas[] = {Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512fp16};
const char* isa_name(Isa isa) noexcept;

struct Variant {
  Isa isa;
  void (*reduce)(void* dst, const void* a, const void* b, std::size_t count, DataType dt, ReduceOp op) noexcept;
  // copy: as reduce_many_copy's (nullptr for none).
  void (*reduce_many)(void* dst, void* copy, const void* const* srcs, std::size_t nsrcs, std::size_t count,
                      DataType dt, ReduceOp op) noexcept;
  void (*half_to_float)(const std::uint16_t* src, float* dst, std::size_t count) noexcept;
  void (*float_to_half)(const float* src, std::uint16_t* dst, std::size_t count) noexcept;
  void (*bf16_to_float)(const std::uint16_t* src, float* dst, std::size_t count) noexcept;
  void (*float_to_bf16)(const float* src, std::uint16_t* dst, std::size_t count) noexcept;
  void (*divide)(void* dst, std::size_t count, DataType dt, int divisor) noexcept;
};

// nullptr when this build or this CPU lacks the variant.
const Variant* variant(Isa isa) noexcept;
// The variant the plain functions use.
const Variant& best_variant() noexcept;

}  // namespace cclz::kernels
