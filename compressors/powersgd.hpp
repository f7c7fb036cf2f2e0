// Internal: PowerSGD's pieces that tests reach directly (powersgd.cpp has
// the method and its cost).
#pragma once

#include <cstddef>
#include <vector>

#include "cclz/compress.hpp"

namespace cclz::compress::powersgd {

// The matrix a tensor is read as (row-major, its memory order): the declared
// TensorDesc shape when given, else rows = the largest divisor of count that
// is <= sqrt(count) and cols = count / rows (a 4096 x 4096 tensor stays
// square; a prime count becomes 1 x count, which the rate rule sends dense).
struct Shape {
  std::size_t rows = 0, cols = 0;
};
Shape matrix_shape(const TensorDesc& d) noexcept;

// Compressed only where (rows + cols) * rank * min_rate < rows * cols
// (PyTorch's min_compression_rate rule).
bool compresses(Shape s, std::size_t rank, double min_rate) noexcept;

// Orthonormalises the r columns of the n x r row-major p in place:
// Gram-Schmidt, each column projected against the earlier ones twice
// ("twice is enough", Giraud et al. 2005), in f64 arithmetic; a column whose
// remaining norm is <= kZeroNorm becomes zero (no division by ~0, no NaN).
// A NaN column stays NaN.
inline constexpr double kZeroNorm = 1e-30;
void orthogonalise(float* p, std::size_t n, std::size_t r) noexcept;

// The error-feedback residual the state holds now (rows * cols floats; all
// zero before the first compressed step or without error feedback).
Status residual(const CompressorState& state, std::vector<float>* out);

}  // namespace cclz::compress::powersgd
