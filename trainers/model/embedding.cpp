// Token + position embedding: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].
// Shapes: tokens (B,T), wte (V,C), wpe (context,C), out (B,T,C).
// Cost: B*T*C adds forward, the same backward (a scatter-add into dwte).
#include "model/layers.hpp"

#include <cstddef>

namespace cclz::train {

void embedding_forward(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const std::size_t bt = static_cast<std::size_t>(b) * T + t;
      float* o = out + bt * C;
      const float* we = wte + static_cast<std::size_t>(tokens[bt]) * C;
      const float* pe = wpe + static_cast<std::size_t>(t) * C;
      for (int c = 0; c < C; ++c) o[c] = we[c] + pe[c];
    }
  }
}

void embedding_backward_dw(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const std::size_t bt = static_cast<std::size_t>(b) * T + t;
      const float* d = dout + bt * C;
      float* dwe = dwte + static_cast<std::size_t>(tokens[bt]) * C;
      float* dpe = dwpe + static_cast<std::size_t>(t) * C;
      for (int c = 0; c < C; ++c) {
        dwe[c] += d[c];
        dpe[c] += d[c];
      }
    }
  }
}

}  // namespace cclz::train
