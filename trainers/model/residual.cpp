// Residual connection: out = a + b over n elements; its gradient passes
// unchanged to both inputs (da += dout, db += dout).
#include "model/layers.hpp"

namespace cclz::train {

void residual_forward(float* out, const float* a, const float* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void residual_backward(float* da, float* db, const float* dout, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

}  // namespace cclz::train
