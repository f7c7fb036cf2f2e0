// Linear layer: out (N,OC) = inp (N,C) . W (OC,C)^T + bias (OC), W stored as
// PyTorch's nn.Linear does (one row per output channel), so a column split
// for tensor parallelism is a contiguous block of rows.
// Cost: 2*N*C*OC flops forward, the same for dX and again for dW.
#include "model/layers.hpp"

#include <cblas.h>

#include <cstddef>

namespace cclz::train {

void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC) {
  float beta = 0.0f;
  if (bias != nullptr) {
    // Start each row from the bias and let sgemm add the product (beta = 1).
    for (int n = 0; n < N; ++n) {
      float* o = out + static_cast<std::size_t>(n) * OC;
      for (int k = 0; k < OC; ++k) o[k] = bias[k];
    }
    beta = 1.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, beta, out, OC);
}

void linear_backward_dx(float* dinp, const float* dout, const float* weight, int N, int C, int OC) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
}

void linear_backward_dw(float* dweight, float* dbias, const float* dout, const float* inp, int N, int C, int OC) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  if (dbias != nullptr) {
    for (int n = 0; n < N; ++n) {
      const float* d = dout + static_cast<std::size_t>(n) * OC;
      for (int k = 0; k < OC; ++k) dbias[k] += d[k];
    }
  }
}

}  // namespace cclz::train
