// Optimizers, schedule and clipping against values worked out by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "model/params.hpp"
#include "optim/clip.hpp"
#include "optim/optimizer.hpp"
#include "optim/schedule.hpp"

namespace cclz::train {
namespace {

// A two-tensor table: one decayed matrix (2 floats), one LayerNorm gain (1 float).
ParamTable two_tensors() {
  ParamTable t;
  ParamTensor w;
  w.name = "w";
  w.shape = {1, 2};
  w.numel = 2;
  w.kind = ParamKind::matrix;
  w.weight_decay = true;
  ParamTensor g;
  g.name = "ln.weight";
  g.shape = {1};
  g.numel = 1;
  g.offset = 2;
  g.kind = ParamKind::norm_weight;
  t.tensors = {w, g};
  t.total = 3;
  t.num_groups = 1;
  return t;
}

TEST(Optim, AdamWByHand) {
  // lr 0.1, b1 0.9, b2 0.999, eps 1e-8, wd 0.1; p = 1, g = 0.5 then g = -0.25.
  // Step 1: m = 0.05, v = 2.5e-4, mhat = 0.5, vhat = 0.25, mhat/sqrt(vhat) = 1:
  //   decayed     p = 1 - 0.1 (1 + 0.1 * 1)             = 0.89
  //   not decayed p = 1 - 0.1 * 1                       = 0.9
  // Step 2: m = 0.045 - 0.025 = 0.02, mhat = 0.02 / 0.19;
  //   v = 2.4975e-4 + 6.25e-5 = 3.1225e-4, vhat = v / (1 - 0.999^2) = v / 1.999e-3;
  //   u = mhat / sqrt(vhat) = 0.105263.../0.395224... = 0.266337...
  //   decayed     p = 0.89 - 0.1 (u + 0.1 * 0.89) = 0.854466...
  //   not decayed p = 0.9 - 0.1 u                  = 0.873366...
  OptimizerConfig cfg;
  cfg.kind = OptimizerKind::adamw;
  cfg.beta1 = 0.9f;
  cfg.beta2 = 0.999f;
  cfg.eps = 1e-8f;
  cfg.weight_decay = 0.1f;
  std::unique_ptr<Optimizer> opt;
  ASSERT_TRUE(Optimizer::create(cfg, two_tensors(), &opt).ok());
  std::vector<float> p = {1, 1, 1}, g = {0.5f, 0.5f, 0.5f};
  opt->step(p.data(), g.data(), 0.1f);
  EXPECT_NEAR(p[0], 0.89, 1e-6);
  EXPECT_NEAR(p[1], 0.89, 1e-6);
  EXPECT_NEAR(p[2], 0.9, 1e-6);
  g = {-0.25f, -0.25f, -0.25f};
  opt->step(p.data(), g.data(), 0.1f);
  const double mhat = 0.02 / 0.19, vhat = 3.1225e-4 / (1 - 0.999 * 0.999);
  const double u = mhat / (std::sqrt(vhat) + 1e-8);
  EXPECT_NEAR(u, 0.266337, 1e-6);
  EXPECT_NEAR(p[0], 0.89 - 0.1 * (u + 0.1 * 0.89), 1e-6);
  EXPECT_NEAR(p[2], 0.9 - 0.1 * u, 1e-6);
  EXPECT_EQ(opt->steps(), 2);
  ASSERT_EQ(opt->state().size(), 6u);
  EXPECT_NEAR(opt->state()[0], 0.02, 1e-7);     // m
  // v to 1e-4 relative: 0.999f is 0.99900001, so the f32 (1 - beta2) is
  // 1.3e-5 relative off the decimal value used by hand.
  EXPECT_NEAR(opt->state()[3], 3.1225e-4, 3e-8);  // v
}

TEST(Optim, SgdMomentumByHand) {
  // lr 0.5, mu 0.9, wd 0.1 (decayed tensor only); p = 2, g = 1 then 1.
  // Step 1: b = 1 + 0.2 = 1.2, p = 2 - 0.6 = 1.4 (no decay: b = 1, p = 1.5).
  // Step 2: b = 0.9*1.2 + 1 + 0.14 = 2.22, p = 1.4 - 1.11 = 0.29
  //         (no decay: b = 1.9, p = 1.5 - 0.95 = 0.55).
  OptimizerConfig cfg;
  cfg.kind = OptimizerKind::sgd;
  cfg.momentum = 0.9f;
  cfg.weight_decay = 0.1f;
  std::unique_ptr<Optimizer> opt;
  ASSERT_TRUE(Optimizer::create(cfg, two_tensors(), &opt).ok());
  EXPECT_EQ(opt->state().size(), 3u);
  std::vector<float> p = {2, 2, 2}, g = {1, 1, 1};
  opt->step(p.data(), g.data(), 0.5f);
  EXPECT_NEAR(p[0], 1.4, 1e-6);
  EXPECT_NEAR(p[2], 1.5, 1e-6);
  opt->step(p.data(), g.data(), 0.5f);
  EXPECT_NEAR(p[0], 0.29, 1e-6);
  EXPECT_NEAR(p[2], 0.55, 1e-6);
}

TEST(Optim, RangeTouchesOnlyItsSlice) {
  // Optimizers over [0,1) and [1,3) together equal one over [0,3): what ZeRO-1 relies on.
  OptimizerConfig cfg;
  std::unique_ptr<Optimizer> whole, a, b;
  const ParamTable t = two_tensors();
  ASSERT_TRUE(Optimizer::create(cfg, t, &whole).ok());
  ASSERT_TRUE(Optimizer::create(cfg, t, &a, 0, 1).ok());
  ASSERT_TRUE(Optimizer::create(cfg, t, &b, 1, 3).ok());
  std::vector<float> p1 = {1, -2, 3}, p2 = p1, g = {0.3f, -0.7f, 0.1f};
  for (int s = 0; s < 3; ++s) {
    whole->step(p1.data(), g.data(), 0.01f);
    a->step(p2.data(), g.data(), 0.01f);
    std::vector<float> before = p2;
    b->step(p2.data(), g.data(), 0.01f);
    EXPECT_EQ(p2[0], before[0]);  // b leaves index 0 alone
  }
  EXPECT_EQ(p1, p2);
  std::unique_ptr<Optimizer> bad;
  EXPECT_FALSE(Optimizer::create(cfg, t, &bad, 2, 1).ok());
}

TEST(Optim, DecayRuleInModelTable) {
  const ParamTable t = make_param_table(ModelConfig{});
  for (const ParamTensor& p : t.tensors) {
    const bool matrix = p.name.find("weight") != std::string::npos && p.shape.size() == 2;
    EXPECT_EQ(p.weight_decay, matrix) << p.name;  // linear weights and the head; not wte/wpe, LN, biases
  }
}

TEST(Optim, Validation) {
  OptimizerConfig c;
  c.beta2 = 1.0f;
  EXPECT_FALSE(validate(c).ok());
  c = {};
  c.eps = 0;
  EXPECT_FALSE(validate(c).ok());
  c = {};
  c.weight_decay = std::nanf("");
  EXPECT_FALSE(validate(c).ok());
  EXPECT_TRUE(validate(OptimizerConfig{}).ok());
  OptimizerKind k;
  EXPECT_TRUE(parse_optimizer("sgd", &k));
  EXPECT_EQ(k, OptimizerKind::sgd);
  EXPECT_FALSE(parse_optimizer("adam", &k));
}

TEST(Schedule, WarmupCosineEndpoints) {
  LrSchedule s;
  s.kind = ScheduleKind::cosine;
  s.max_lr = 1e-3f;
  s.min_lr = 1e-4f;
  s.warmup = 10;
  s.total = 110;
  ASSERT_TRUE(validate(s).ok());
  EXPECT_FLOAT_EQ(s.at(0), 1e-4f);    // 1/10 of max
  EXPECT_FLOAT_EQ(s.at(4), 5e-4f);
  EXPECT_FLOAT_EQ(s.at(9), 1e-3f);    // warm-up ends at max
  EXPECT_FLOAT_EQ(s.at(10), 1e-3f);   // cosine starts at max
  EXPECT_FLOAT_EQ(s.at(60), 5.5e-4f); // half way: the mean of max and min
  EXPECT_FLOAT_EQ(s.at(110), 1e-4f);  // reaches min at total
  EXPECT_FLOAT_EQ(s.at(500), 1e-4f);  // and stays there
  for (int i = 10; i < 110; ++i) EXPECT_GE(s.at(i), s.at(i + 1)) << i;  // monotone decay
}

TEST(Schedule, ConstantAndValidation) {
  LrSchedule s;
  s.kind = ScheduleKind::constant;
  s.max_lr = 0.1f;
  s.warmup = 0;
  s.total = 5;
  EXPECT_FLOAT_EQ(s.at(0), 0.1f);
  EXPECT_FLOAT_EQ(s.at(1000), 0.1f);
  LrSchedule bad = s;
  bad.min_lr = 0.2f;  // above max
  EXPECT_FALSE(validate(bad).ok());
  bad = s;
  bad.kind = ScheduleKind::cosine;
  bad.warmup = 5;  // no room for the decay
  EXPECT_FALSE(validate(bad).ok());
  ScheduleKind k;
  EXPECT_TRUE(parse_schedule("constant", &k));
  EXPECT_FALSE(parse_schedule("linear", &k));
}

TEST(Clip, ScalesToTheNorm) {
  std::vector<float> g = {3, 4};  // norm 5
  EXPECT_DOUBLE_EQ(clip_grad_norm(g.data(), 2, 1.0f), 5.0);
  EXPECT_FLOAT_EQ(g[0], 0.6f);
  EXPECT_FLOAT_EQ(g[1], 0.8f);
  EXPECT_NEAR(std::sqrt(grad_sq_sum(g.data(), 2)), 1.0, 1e-7);
  g = {3, 4};
  EXPECT_DOUBLE_EQ(clip_grad_norm(g.data(), 2, 10.0f), 5.0);  // under the limit: untouched
  EXPECT_EQ(g, (std::vector<float>{3, 4}));
  EXPECT_DOUBLE_EQ(clip_grad_norm(g.data(), 2, 0.0f), 5.0);  // 0 = off
  EXPECT_EQ(g, (std::vector<float>{3, 4}));
  EXPECT_EQ(clip_factor(0.0, 1.0f), 1.0f);
}

}  // namespace
}  // namespace cclz::train
