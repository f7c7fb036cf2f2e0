// Causal multi-head self-attention core (Vaswani et al. 2017), after the qkv
// projection and before the output projection. Per batch b and head h, with
// Q, K, V the (T, hs) slices of qkv (B,T,3C) and s = 1/sqrt(hs):
//   S = s Q K^T, A = softmax_rows(S masked to t2 <= t), O = A V.
// Backward (dS = A * (dA - rowsum(dA * A)), the softmax Jacobian):
//   dA = dO V^T, dV += A^T dO, dQ += s dS K, dK += s dS^T Q.
// Each product is one strided cblas_sgemm on the slices (leading dimension 3C
// or C), so no head is copied out. The products run over the full T x T
// square: the upper triangle costs 2x the causal flops but is zero in A and
// dS, so it changes no result. Cost: 4*B*T*T*C flops forward, 8*B*T*T*C backward.
#include <cblas.h>

#include <cmath>
#include <cstddef>

#include "model/layers.hpp"

namespace cclz::train {

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const int C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const float* q = qkv + static_cast<std::size_t>(b) * T * C3 + static_cast<std::size_t>(h) * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* a = att + (static_cast<std::size_t>(b) * NH + h) * T * T;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, C3, k, C3, 0.0f, a, T);
      for (int t = 0; t < T; ++t) {
        float* row = a + static_cast<std::size_t>(t) * T;
        float maxv = row[0];
        for (int t2 = 1; t2 <= t; ++t2) maxv = row[t2] > maxv ? row[t2] : maxv;
        float sum = 0.0f;
        for (int t2 = 0; t2 <= t; ++t2) {
          row[t2] = std::exp(row[t2] - maxv);
          sum += row[t2];
        }
        const float inv = 1.0f / sum;
        for (int t2 = 0; t2 <= t; ++t2) row[t2] *= inv;
        for (int t2 = t + 1; t2 < T; ++t2) row[t2] = 0.0f;  // the causal mask
      }
      float* o = out + static_cast<std::size_t>(b) * T * C + static_cast<std::size_t>(h) * hs;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, v, C3, 0.0f, o, C);
    }
  }
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att, int B,
                        int T, int C, int NH) {
  const int hs = C / NH;
  const int C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  float* ds = scratch;  // (T,T): dA, then dS in place
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const std::size_t qoff = static_cast<std::size_t>(b) * T * C3 + static_cast<std::size_t>(h) * hs;
      const float* q = qkv + qoff;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* dq = dqkv + qoff;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* a = att + (static_cast<std::size_t>(b) * NH + h) * T * T;
      const float* dO = dout + static_cast<std::size_t>(b) * T * C + static_cast<std::size_t>(h) * hs;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, dO, C, v, C3, 0.0f, ds, T);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, dO, C, 1.0f, dv, C3);
      for (int t = 0; t < T; ++t) {
        const float* arow = a + static_cast<std::size_t>(t) * T;
        float* drow = ds + static_cast<std::size_t>(t) * T;
        float dot = 0.0f;
        for (int t2 = 0; t2 <= t; ++t2) dot += arow[t2] * drow[t2];
        for (int t2 = 0; t2 <= t; ++t2) drow[t2] = arow[t2] * (drow[t2] - dot);
        for (int t2 = t + 1; t2 < T; ++t2) drow[t2] = 0.0f;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, ds, T, k, C3, 1.0f, dq, C3);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, ds, T, q, C3, 1.0f, dk, C3);
    }
  }
}

}  // namespace cclz::train
