// Global-norm gradient clipping; see clip.hpp. Two passes over n gradients.
#include "optim/clip.hpp"

#include <cmath>

namespace cclz::train {

double grad_sq_sum(const float* g, std::size_t n) noexcept {
  double s = 0.0;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(g[i]) * g[i];
  return s;
}

float clip_factor(double norm, float max_norm) noexcept {
  if (max_norm <= 0.0f || !(norm > max_norm)) return 1.0f;
  return static_cast<float>(max_norm / norm);
}

void scale_grads(float* g, std::size_t n, float s) noexcept {
  for (std::size_t i = 0; i < n; ++i) g[i] *= s;
}

double clip_grad_norm(float* g, std::size_t n, float max_norm) noexcept {
  const double norm = std::sqrt(grad_sq_sum(g, n));
  const float f = clip_factor(norm, max_norm);
  if (f != 1.0f) scale_grads(g, n, f);
  return norm;
}

}  // namespace cclz::train
