// Softmax cross-entropy over V classes for N rows (the LM loss):
// probs = softmax(logits) (max-subtracted for range), loss[n] = -log probs[n, y_n];
// d loss[n] / d logits[n] = probs[n] - onehot(y_n).
// Shapes: logits, probs (N,V); targets, losses (N). Cost: O(N*V), one exp each.
#include "model/layers.hpp"

#include <cmath>
#include <cstddef>

namespace cclz::train {

void crossentropy_forward(float* losses, float* probs, const float* logits, const int* targets, int N, int V) {
  for (int n = 0; n < N; ++n) {
    const std::size_t row = static_cast<std::size_t>(n) * V;
    const float* z = logits + row;
    float* p = probs + row;  // may be z itself: each z[v] is read before p[v] is written
    // The target logit is read first, so the loss comes from the logits
    // (log-sum-exp minus z_y, finite even for a confident miss) in place too.
    const float zy = targets != nullptr ? z[targets[n]] : 0.0f;
    float maxv = z[0];
    for (int v = 1; v < V; ++v) maxv = z[v] > maxv ? z[v] : maxv;
    double sum = 0.0;
    for (int v = 0; v < V; ++v) {
      const float e = std::exp(z[v] - maxv);
      p[v] = e;
      sum += e;
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int v = 0; v < V; ++v) p[v] *= inv;
    if (targets != nullptr) losses[n] = static_cast<float>(static_cast<double>(maxv) + std::log(sum) - zy);
  }
}

void crossentropy_backward(float* dlogits, const float* probs, const int* targets, float dloss, int N, int V) {
  for (int n = 0; n < N; ++n) {
    const std::size_t row = static_cast<std::size_t>(n) * V;
    const float* p = probs + row;
    float* d = dlogits + row;
    for (int v = 0; v < V; ++v) d[v] += dloss * p[v];
    d[targets[n]] -= dloss;
  }
}

}  // namespace cclz::train
