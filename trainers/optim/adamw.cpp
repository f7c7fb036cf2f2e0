// AdamW update kernel (Loshchilov, Hutter 2019, decoupled weight decay):
// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= lr * (mhat / (sqrt(vhat) + eps) + wd p), mhat = m / (1-b1^t), vhat = v / (1-b2^t).
// One pass over n elements: 3 reads, 3 writes each.
#include <cmath>

#include "optim/optimizer.hpp"

namespace cclz::train {

void adamw_update(float* p, const float* g, float* m, float* v, std::size_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, std::int64_t t) {
  // Bias corrections once per call, in double (b^t for large t is tiny).
  const float c1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(t))));
  const float c2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(t))));
  for (std::size_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] -= lr * (mi * c1 / (std::sqrt(vi * c2) + eps) + weight_decay * p[i]);
  }
}

}  // namespace cclz::train
