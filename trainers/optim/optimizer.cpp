// The Optimizer wrapper: cuts its range of the parameter table into
// segments of equal decay flag and runs the flat kernel on each.
#include "optim/optimizer.hpp"

#include <algorithm>
#include <cstdio>
#include <new>
#include <string>

namespace cclz::train {

const char* optimizer_name(OptimizerKind k) noexcept {
  return k == OptimizerKind::sgd ? "sgd" : "adamw";
}

bool parse_optimizer(std::string_view s, OptimizerKind* out) noexcept {
  if (s == "sgd") {
    *out = OptimizerKind::sgd;
  } else if (s == "adamw") {
    *out = OptimizerKind::adamw;
  } else {
    return false;
  }
  return true;
}

Status validate(const OptimizerConfig& c) {
  char buf[160];
  auto bad = [&](const char* what, float v, const char* want) {
    std::snprintf(buf, sizeof buf, "optimizer: %s = %g, want %s", what, static_cast<double>(v), want);
    return Status(Result::invalid_argument, buf);
  };
  // Negated comparisons so that NaN fails too.
  if (!(c.beta1 >= 0.0f && c.beta1 < 1.0f)) return bad("beta1", c.beta1, "[0, 1)");
  if (!(c.beta2 >= 0.0f && c.beta2 < 1.0f)) return bad("beta2", c.beta2, "[0, 1)");
  if (!(c.eps > 0.0f)) return bad("eps", c.eps, "> 0");
  if (!(c.momentum >= 0.0f && c.momentum < 1.0f)) return bad("momentum", c.momentum, "[0, 1)");
  if (!(c.weight_decay >= 0.0f)) return bad("weight_decay", c.weight_decay, ">= 0");
  return {};
}

Status Optimizer::create(const OptimizerConfig& cfg, const ParamTable& table, std::unique_ptr<Optimizer>* out,
                         std::size_t lo, std::size_t hi) {
  if (Status s = validate(cfg); !s.ok()) return s;
  hi = std::min(hi, table.total);
  if (lo > hi)
    return {Result::invalid_argument,
            "optimizer: range [" + std::to_string(lo) + ", " + std::to_string(hi) + ") is empty or reversed"};
  std::unique_ptr<Optimizer> o(new (std::nothrow) Optimizer());
  if (!o) return {Result::system_error, "optimizer: out of memory"};
  o->cfg_ = cfg;
  o->lo_ = lo;
  o->hi_ = hi;
  for (const ParamTensor& t : table.tensors) {
    const std::size_t b = std::max(lo, t.offset), e = std::min(hi, t.offset + t.numel);
    if (b >= e) continue;
    if (!o->segments_.empty() && o->segments_.back().decay == t.weight_decay && o->segments_.back().end == b) {
      o->segments_.back().end = e;
    } else {
      o->segments_.push_back({b, e, t.weight_decay});
    }
  }
  const std::size_t n = (hi - lo) * (cfg.kind == OptimizerKind::adamw ? 2 : 1);
  try {
    o->state_.assign(n, 0.0f);
  } catch (const std::bad_alloc&) {
    return {Result::system_error, "optimizer: out of memory for " + std::to_string(n) + " floats of state"};
  }
  *out = std::move(o);
  return {};
}

void Optimizer::step(float* params, const float* grads, float lr) {
  ++t_;
  const std::size_t n = hi_ - lo_;
  for (const Segment& s : segments_) {
    const float wd = s.decay ? cfg_.weight_decay : 0.0f;
    const std::size_t k = s.begin - lo_;
    const std::size_t len = s.end - s.begin;
    if (cfg_.kind == OptimizerKind::adamw) {
      adamw_update(params + s.begin, grads + s.begin, state_.data() + k, state_.data() + n + k, len, lr, cfg_.beta1,
                   cfg_.beta2, cfg_.eps, wd, t_);
    } else {
      sgd_update(params + s.begin, grads + s.begin, state_.data() + k, len, lr, cfg_.momentum, wd);
    }
  }
}

}  // namespace cclz::train
