// Global-norm gradient clipping (Pascanu, Mikolov, Bengio 2013):
// norm = sqrt(sum_i g_i^2) over all gradients; if norm > max_norm, every
// gradient is scaled by max_norm / norm. The sum is accumulated in double in
// index order (deterministic). Sharded trainers add grad_sq_sum over ranks
// and call clip_factor on the square root.
#pragma once

#include <cstddef>

namespace cclz::train {

double grad_sq_sum(const float* g, std::size_t n) noexcept;
// min(1, max_norm / norm); 1 when max_norm <= 0 (clipping off) or norm is 0.
float clip_factor(double norm, float max_norm) noexcept;
void scale_grads(float* g, std::size_t n, float s) noexcept;
// Clips in place; returns the norm before clipping.
double clip_grad_norm(float* g, std::size_t n, float max_norm) noexcept;

}  // namespace cclz::train
