// SGD with momentum in PyTorch's form (Sutskever et al. 2013 without
// Nesterov): b = mu b + (g + wd p); p -= lr b. With mu = 0 it is plain SGD.
#include "optim/optimizer.hpp"

namespace cclz::train {

void sgd_update(float* p, const float* g, float* buf, std::size_t n, float lr, float momentum, float weight_decay) {
  for (std::size_t i = 0; i < n; ++i) {
    const float b = momentum * buf[i] + g[i] + weight_decay * p[i];
    buf[i] = b;
    p[i] -= lr * b;
  }
}

}  // namespace cclz::train
