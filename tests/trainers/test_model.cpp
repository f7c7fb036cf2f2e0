// The whole GPT: the f32 loss against the double reference model, the
// gradient of every parameter against central differences of the reference
// loss, the parameter table's layout, the group-ready callback, gradient
// accumulation, and input errors.
//
// Tolerance for the whole model (normwise relative, as in test_layers.cpp,
// over all parameters and per tensor): kModelGradTol = 1e-4. The gradient
// passes through about 3 + 8L kernels (about 20 for L = 2), each with an f32
// error measured at <= 5e-7 in test_layers.cpp, and the errors add along the
// chain: about 1e-5; measured 2e-6 (printed). 1e-4 leaves a margin of 10x
// over that sum for other seeds, shapes and compiler flags (the sanitizer
// build is not vectorised). Random O(0.5) weights instead of the 0.02 init
// keep every nonlinearity out of its linear regime, which makes the check
// stricter. A formula error in any kernel gives an O(1) error in some
// tensor's gradient. The loss itself matches the reference to 1e-5 relative
// (measured 1e-7).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "common/rng.hpp"
#include "model/gpt.hpp"
#include "reference.hpp"

namespace cclz::train {
namespace {

constexpr double kModelLossTol = 1e-5;
constexpr double kModelGradTol = 1e-4;

ModelConfig tiny() {
  ModelConfig c;
  c.vocab_size = 11;
  c.context = 6;
  c.layers = 2;
  c.width = 8;
  c.heads = 2;
  c.mlp_ratio = 4;
  return c;
}

// Random O(1) parameters (LayerNorm gains around 1), see the tolerance note.
void randomise(Gpt& m, std::uint64_t seed) {
  Rng rng(seed);
  for (const ParamTensor& t : m.table().tensors) {
    for (std::size_t i = 0; i < t.numel; ++i) {
      const double u = rng.uniform() - 0.5;
      m.params()[t.offset + i] = static_cast<float>(t.kind == ParamKind::norm_weight ? 1.0 + 0.6 * u : u);
    }
  }
}

void tokens(std::vector<int>& in, std::vector<int>& tg, int n, int V, std::uint64_t seed) {
  Rng rng(seed);
  in.resize(static_cast<std::size_t>(n));
  tg.resize(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    in[static_cast<std::size_t>(i)] = static_cast<int>(rng.next_u64() % static_cast<std::uint64_t>(V));
    tg[static_cast<std::size_t>(i)] = static_cast<int>(rng.next_u64() % static_cast<std::uint64_t>(V));
  }
}

TEST(Model, ParamTableLayout) {
  ModelConfig cfg;  // defaults: L=4 C=128 NH=4 T=64 V=256
  const ParamTable t = make_param_table(cfg);
  const std::size_t C = 128, V = 256, T = 64, L = 4;
  EXPECT_EQ(t.total, V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C + V * C);
  EXPECT_EQ(t.num_groups, 6);
  // Contiguous, in order, no gaps; groups non-decreasing, each one range.
  std::size_t off = 0;
  int group = 0;
  for (const ParamTensor& p : t.tensors) {
    EXPECT_EQ(p.offset, off) << p.name;
    off += p.numel;
    EXPECT_GE(p.group, group) << p.name;
    group = p.group;
    EXPECT_EQ(p.weight_decay, p.kind == ParamKind::matrix) << p.name;
  }
  EXPECT_EQ(off, t.total);
  for (int g = 0; g + 1 < t.num_groups; ++g) EXPECT_EQ(t.group_end(g), t.group_begin(g + 1));
  EXPECT_EQ(t.group_begin(0), 0u);
  EXPECT_EQ(t.group_end(t.num_groups - 1), t.total);
  const int qkv = t.find("h.3.attn.qkv.weight");
  ASSERT_GE(qkv, 0);
  EXPECT_EQ(t.tensors[static_cast<std::size_t>(qkv)].shape, (std::vector<int>{384, 128}));
  EXPECT_EQ(t.tensors[static_cast<std::size_t>(qkv)].group, 4);
  EXPECT_EQ(t.find("no.such.tensor"), -1);
}

TEST(Model, InitIsSeededAndScaled) {
  ModelConfig cfg;
  std::unique_ptr<Gpt> a, b;
  ASSERT_TRUE(Gpt::create(cfg, 1, &a).ok());
  ASSERT_TRUE(Gpt::create(cfg, 1, &b).ok());
  a->init(7);
  b->init(7);
  EXPECT_EQ(0, std::memcmp(a->params(), b->params(), a->num_params() * sizeof(float)));
  b->init(8);
  EXPECT_NE(0, std::memcmp(a->params(), b->params(), a->num_params() * sizeof(float)));
  // Sample standard deviations match the GPT-2 rule within sampling error.
  auto stddev = [&](const char* name) {
    const ParamTensor& t = a->table().tensors[static_cast<std::size_t>(a->table().find(name))];
    double s = 0, s2 = 0;
    for (std::size_t i = 0; i < t.numel; ++i) {
      const double v = a->params()[t.offset + i];
      s += v;
      s2 += v * v;
    }
    return std::sqrt(s2 / t.numel - (s / t.numel) * (s / t.numel));
  };
  EXPECT_NEAR(stddev("h.0.mlp.fc.weight"), 0.02, 0.02 * 0.02);  // 65536 samples: relative error ~0.3%
  EXPECT_NEAR(stddev("h.0.mlp.proj.weight"), 0.02 / std::sqrt(8.0), 0.02 * 0.02);
  const ParamTensor& ln = a->table().tensors[static_cast<std::size_t>(a->table().find("h.1.ln2.weight"))];
  for (std::size_t i = 0; i < ln.numel; ++i) EXPECT_EQ(a->params()[ln.offset + i], 1.0f);
}

TEST(Model, WholeModelGradientCheck) {
  const ModelConfig cfg = tiny();
  const int B = 2, T = 5;  // T < context: wpe's last row must get a zero gradient
  std::unique_ptr<Gpt> m;
  ASSERT_TRUE(Gpt::create(cfg, B, &m).ok());
  randomise(*m, 21);
  std::vector<int> in, tg;
  tokens(in, tg, B * T, cfg.vocab_size, 22);

  float loss = 0;
  ASSERT_TRUE(m->forward(in.data(), tg.data(), B, T, &loss).ok());
  m->zero_grad();
  ASSERT_TRUE(m->backward().ok());

  std::vector<float> params(m->params(), m->params() + m->num_params());
  ref::Vec pd = ref::to_double(params);
  auto f = [&] { return ref::model_loss(cfg, m->table(), pd, in, tg, B, T); };
  const double ref_loss = f();
  std::printf("  loss f32 %.9g  double %.12g\n", loss, ref_loss);
  EXPECT_LT(std::fabs(loss - ref_loss) / ref_loss, kModelLossTol);

  const ref::Vec num = ref::numeric_grad(f, pd);
  const std::vector<float> grads(m->grads(), m->grads() + m->num_params());
  EXPECT_LT(ref::rel_error(grads, num, "whole model, all params"), kModelGradTol);
  // Per tensor too, so a small tensor's error is not hidden by a large
  // gradient elsewhere (each against the largest gradient of its tensor).
  for (const ParamTensor& t : m->table().tensors) {
    std::vector<float> a(grads.begin() + static_cast<std::ptrdiff_t>(t.offset),
                         grads.begin() + static_cast<std::ptrdiff_t>(t.offset + t.numel));
    ref::Vec n(num.begin() + static_cast<std::ptrdiff_t>(t.offset),
               num.begin() + static_cast<std::ptrdiff_t>(t.offset + t.numel));
    EXPECT_LT(ref::rel_error(a, n, t.name.c_str()), kModelGradTol) << t.name;
  }
  const ParamTensor& wpe = m->table().tensors[static_cast<std::size_t>(m->table().find("wpe"))];
  for (int c = 0; c < cfg.width; ++c) EXPECT_EQ(grads[wpe.offset + 5 * 8 + static_cast<std::size_t>(c)], 0.0f);
}

TEST(Model, GroupReadyOrderAndFinality) {
  const ModelConfig cfg = tiny();
  std::unique_ptr<Gpt> m;
  ASSERT_TRUE(Gpt::create(cfg, 2, &m).ok());
  randomise(*m, 31);
  std::vector<int> in, tg;
  tokens(in, tg, 2 * 6, cfg.vocab_size, 32);
  ASSERT_TRUE(m->forward(in.data(), tg.data(), 2, 6, nullptr).ok());
  m->zero_grad();
  std::vector<int> order;
  std::vector<std::vector<float>> at_ready(static_cast<std::size_t>(m->table().num_groups));
  ASSERT_TRUE(m->backward(1.0f, [&](int g) {
                  order.push_back(g);
                  at_ready[static_cast<std::size_t>(g)].assign(m->grads() + m->table().group_begin(g),
                                                               m->grads() + m->table().group_end(g));
                }).ok());
  EXPECT_EQ(order, (std::vector<int>{3, 2, 1, 0}));
  // A group's gradients do not change after its callback.
  for (int g = 0; g < m->table().num_groups; ++g) {
    const std::vector<float> final_g(m->grads() + m->table().group_begin(g), m->grads() + m->table().group_end(g));
    EXPECT_EQ(at_ready[static_cast<std::size_t>(g)], final_g) << "group " << g;
  }
}

TEST(Model, BackwardAccumulatesAndScales) {
  const ModelConfig cfg = tiny();
  std::unique_ptr<Gpt> m;
  ASSERT_TRUE(Gpt::create(cfg, 2, &m).ok());
  randomise(*m, 41);
  std::vector<int> in, tg;
  tokens(in, tg, 2 * 4, cfg.vocab_size, 42);
  ASSERT_TRUE(m->forward(in.data(), tg.data(), 2, 4, nullptr).ok());
  m->zero_grad();
  ASSERT_TRUE(m->backward(0.5f).ok());
  const std::vector<float> half(m->grads(), m->grads() + m->num_params());
  ASSERT_TRUE(m->backward(1.5f).ok());  // accumulates: 0.5 + 1.5 = 2x
  m->zero_grad();
  ASSERT_TRUE(m->backward(1.0f).ok());
  const std::vector<float> one(m->grads(), m->grads() + m->num_params());
  for (std::size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(half[i], 0.5f * one[i], 1e-6f * (1 + std::fabs(one[i])));
}

TEST(Model, ForwardIsBitwiseRepeatable) {
  ModelConfig cfg;
  cfg.layers = 2;
  std::unique_ptr<Gpt> m;
  ASSERT_TRUE(Gpt::create(cfg, 2, &m).ok());
  m->init(5);
  std::vector<int> in, tg;
  tokens(in, tg, 2 * 64, 256, 51);
  float l1 = 0, l2 = 0;
  ASSERT_TRUE(m->forward(in.data(), tg.data(), 2, 64, &l1).ok());
  ASSERT_TRUE(m->forward(in.data(), tg.data(), 2, 64, &l2).ok());
  EXPECT_EQ(l1, l2);
  // Freshly initialised, the prediction is near uniform: loss near ln 256.
  EXPECT_NEAR(l1, std::log(256.0), 0.1);
}

TEST(Model, Errors) {
  ModelConfig bad = tiny();
  bad.heads = 3;  // 8 not divisible by 3
  std::unique_ptr<Gpt> m;
  Status s = Gpt::create(bad, 2, &m);
  EXPECT_EQ(s.code(), Result::invalid_argument);
  EXPECT_NE(s.message().find("heads"), std::string::npos) << s.message();
  EXPECT_EQ(m, nullptr);
  EXPECT_FALSE(Gpt::create(tiny(), 0, &m).ok());

  ASSERT_TRUE(Gpt::create(tiny(), 2, &m).ok());
  EXPECT_EQ(m->backward().code(), Result::invalid_usage);  // no forward yet
  std::vector<int> in(12, 1), tg(12, 2);
  EXPECT_FALSE(m->forward(in.data(), tg.data(), 3, 4, nullptr).ok());  // batch over max
  EXPECT_FALSE(m->forward(in.data(), tg.data(), 2, 7, nullptr).ok());  // beyond context
  in[5] = 11;                                                          // vocab is 11
  s = m->forward(in.data(), tg.data(), 2, 6, nullptr);
  EXPECT_EQ(s.code(), Result::invalid_argument);
  EXPECT_NE(s.message().find("input token 11"), std::string::npos) << s.message();
  in[5] = 1;
  tg[0] = -1;
  EXPECT_FALSE(m->forward(in.data(), tg.data(), 2, 6, nullptr).ok());
  // Without targets: probs only, and backward refuses.
  ASSERT_TRUE(m->forward(in.data(), nullptr, 2, 6, nullptr).ok());
  EXPECT_EQ(m->backward().code(), Result::invalid_usage);
  double s0 = 0;
  for (int v = 0; v < 11; ++v) s0 += m->probs()[v];
  EXPECT_NEAR(s0, 1.0, 1e-6);
}

}  // namespace
}  // namespace cclz::train
