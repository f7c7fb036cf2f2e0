// GELU, tanh approximation (Hendrycks, Gimpel 2016), as GPT-2 uses it:
// gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3);
// gelu'(x) = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3*0.044715 x^2).
// Elementwise over n values; one tanh per element each way.
#include "model/layers.hpp"

#include <cmath>

namespace cclz::train {

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
}  // namespace

void gelu_forward(float* out, const float* inp, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    out[i] = 0.5f * x * (1.0f + std::tanh(u));
  }
}

void gelu_backward(float* dinp, const float* dout, const float* inp, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    const float th = std::tanh(u);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    const float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
    dinp[i] += grad * dout[i];
  }
}

}  // namespace cclz::train
