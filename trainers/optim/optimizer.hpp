// Optimizers over the flat parameter buffer of a ParamTable:
//  - AdamW (Loshchilov, Hutter 2019): m = b1 m + (1-b1) g, v = b2 v + (1-b2) g^2,
//    p -= lr (m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps) + wd p): the decay is
//    decoupled from the gradient statistics.
//  - SGD with momentum (PyTorch's form): b = mu b + (g + wd p), p -= lr b; the
//    decay here is the classic L2 term added to the gradient.
// Weight decay rule (both): only tensors marked weight_decay in the table,
// i.e. the matrices of the linear layers and the LM head; never LayerNorm
// gains and shifts, biases or the embeddings (as GPT-2/nanoGPT practice).
//
// An Optimizer owns the state (AdamW m and v, SGD's momentum) for a range
// [lo, hi) of the flat buffer, the whole table by default; ZeRO-1 gives each
// rank its own range. The flat kernels are public so other trainers can run
// them on any slice.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "cclz/types.hpp"
#include "model/params.hpp"

namespace cclz::train {

enum class OptimizerKind { sgd, adamw };
const char* optimizer_name(OptimizerKind k) noexcept;
bool parse_optimizer(std::string_view s, OptimizerKind* out) noexcept;

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::adamw;
  float beta1 = 0.9f;   // AdamW
  float beta2 = 0.95f;  // AdamW (GPT-3's value; 0.999 is PyTorch's default)
  float eps = 1e-8f;    // AdamW
  float momentum = 0.9f;      // SGD
  float weight_decay = 0.1f;  // on weight_decay tensors only
};
Status validate(const OptimizerConfig& cfg);

// One AdamW update of n elements at step t >= 1 (bias correction uses t).
void adamw_update(float* p, const float* g, float* m, float* v, std::size_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, std::int64_t t);
// One SGD-with-momentum update of n elements.
void sgd_update(float* p, const float* g, float* buf, std::size_t n, float lr, float momentum, float weight_decay);

class Optimizer {
 public:
  static constexpr std::size_t kAll = std::numeric_limits<std::size_t>::max();
  // State for [lo, hi) of the table's buffer (hi clamped to table.total).
  static Status create(const OptimizerConfig& cfg, const ParamTable& table, std::unique_ptr<Optimizer>* out,
                       std::size_t lo = 0, std::size_t hi = kAll);

  // One update of params[lo, hi) from grads[lo, hi); params and grads point
  // at the start of the whole buffer. Advances steps() by one.
  void step(float* params, const float* grads, float lr);

  const OptimizerConfig& config() const noexcept { return cfg_; }
  std::int64_t steps() const noexcept { return t_; }
  void set_steps(std::int64_t t) noexcept { t_ = t; }
  std::size_t lo() const noexcept { return lo_; }
  std::size_t hi() const noexcept { return hi_; }
  // The state, for checkpoints: AdamW m then v (2 (hi-lo) floats), SGD the
  // momentum buffer (hi-lo floats).
  std::span<float> state() noexcept { return state_; }

 private:
  struct Segment {
    std::size_t begin, end;
    bool decay;
  };
  Optimizer() = default;
  OptimizerConfig cfg_;
  std::size_t lo_ = 0, hi_ = 0;
  std::vector<Segment> segments_;  // [lo, hi) cut where the decay flag changes
  std::vector<float> state_;
  std::int64_t t_ = 0;
};

}  // namespace cclz::train
