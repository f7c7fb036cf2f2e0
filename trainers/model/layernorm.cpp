// LayerNorm over the channel dimension (Ba, Kiros, Hinton 2016):
// out = (x - mean) * rstd * w + b, rstd = 1/sqrt(var + eps), biased variance.
// Shapes: inp, out (N,C); w, b (C); mean, rstd (N). Statistics are
// accumulated in double so long rows lose nothing to cancellation.
// Cost: about 8*N*C flops forward, 10*N*C backward (dX and dW together).
#include "model/layers.hpp"

#include <cmath>
#include <cstddef>

namespace cclz::train {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<std::size_t>(n) * C;
    double s = 0.0;
    for (int c = 0; c < C; ++c) s += x[c];
    const double m = s / C;
    double v = 0.0;
    for (int c = 0; c < C; ++c) {
      const double d = x[c] - m;
      v += d * d;
    }
    const float mf = static_cast<float>(m);
    const float rs = static_cast<float>(1.0 / std::sqrt(v / C + kLayerNormEps));
    float* o = out + static_cast<std::size_t>(n) * C;
    for (int c = 0; c < C; ++c) o[c] = (x[c] - mf) * rs * weight[c] + bias[c];
    mean[n] = mf;
    rstd[n] = rs;
  }
}

void layernorm_backward_dx(float* dinp, const float* dout, const float* inp, const float* weight, const float* mean,
                           const float* rstd, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const std::size_t row = static_cast<std::size_t>(n) * C;
    const float* x = inp + row;
    const float* dy = dout + row;
    const float m = mean[n];
    const float rs = rstd[n];
    // Two row means of g = dy * w: mean(g) and mean(g * xhat).
    float g_mean = 0.0f;
    float gx_mean = 0.0f;
    for (int c = 0; c < C; ++c) {
      const float g = dy[c] * weight[c];
      g_mean += g;
      gx_mean += g * (x[c] - m) * rs;
    }
    g_mean /= static_cast<float>(C);
    gx_mean /= static_cast<float>(C);
    float* dx = dinp + row;
    for (int c = 0; c < C; ++c) {
      const float xhat = (x[c] - m) * rs;
      dx[c] += rs * (dy[c] * weight[c] - g_mean - xhat * gx_mean);
    }
  }
}

void layernorm_backward_dw(float* dweight, float* dbias, const float* dout, const float* inp, const float* mean,
                           const float* rstd, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const std::size_t row = static_cast<std::size_t>(n) * C;
    const float* x = inp + row;
    const float* dy = dout + row;
    const float m = mean[n];
    const float rs = rstd[n];
    for (int c = 0; c < C; ++c) {
      dweight[c] += dy[c] * (x[c] - m) * rs;
      dbias[c] += dy[c];
    }
  }
}

}  // namespace cclz::train
