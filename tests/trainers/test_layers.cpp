// Gradient checks of every GPT layer kernel: each f32 backward (dX and dW
// separately) against central differences of the double-precision reference
// forward in reference.hpp, for the scalar loss L = sum_i r_i * out_i with a
// random r (the f32 backward gets dout = r). Each f32 forward is also
// compared with its reference.
//
// Tolerances (normwise relative, max|err| / max|ref|):
//  - the finite differences themselves are exact to about 1e-10 (h = 1e-5 in
//    double: truncation h^2 |f'''| ~ 1e-10, rounding 1e-16 |L| / h ~ 1e-10),
//    so the error measured is the f32 kernels' own;
//  - an f32 reduction of K terms is off by at most about K u max|term|,
//    u = 6e-8; the longest reductions here have K <= 32, so 2e-6. Measured:
//    at most 5e-7 (printed per check). kForwardTol = kGradTol = 1e-5 leaves
//    5x over that worst case for cancellation in the softmax and LayerNorm
//    Jacobians, while a formula error (a wrong term, index or factor) is an
//    O(1) relative error; the Sensitivity test shows that a single element
//    off by 1e-4 of the gradient's scale already fails.
#include <gtest/gtest.h>

#include <vector>

#include "common/rng.hpp"
#include "model/layers.hpp"
#include "reference.hpp"

namespace cclz::train {
namespace {

using ref::Vec;

constexpr double kForwardTol = 1e-5;
constexpr double kGradTol = 1e-5;
// Gradient buffers start at this value, not 0, so every check also proves the
// backward kernels add (the documented contract) rather than overwrite.
constexpr float kPrefill = 0.0625f;

std::vector<float> rand_f(std::size_t n, double lo, double hi, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(lo + (hi - lo) * rng.uniform());
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

std::vector<float> prefilled(std::size_t n) { return std::vector<float>(n, kPrefill); }

// The gradient a backward call added to a prefilled buffer.
std::vector<float> added(const std::vector<float>& buf) {
  std::vector<float> g(buf);
  for (auto& x : g) x -= kPrefill;
  return g;
}

TEST(LayerGrad, Embedding) {
  const int B = 2, T = 3, C = 4, V = 5, ctx = 4;
  const std::vector<int> tok = {1, 3, 1, 0, 4, 1};  // repeats: the scatter-add must sum them
  auto wte = rand_f(V * C, -1, 1, 1), wpe = rand_f(ctx * C, -1, 1, 2), r = rand_f(B * T * C, -1, 1, 3);
  std::vector<float> out(B * T * C);
  embedding_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  Vec wted = ref::to_double(wte), wped = ref::to_double(wpe), rd = ref::to_double(r), outd;
  ref::embedding(outd, tok, wted, wped, B, T, C);
  EXPECT_LT(ref::rel_error(out, outd, "embedding forward"), kForwardTol);

  auto dwte = prefilled(V * C), dwpe = prefilled(ctx * C);
  embedding_backward_dw(dwte.data(), dwpe.data(), r.data(), tok.data(), B, T, C);
  auto loss = [&] {
    Vec o;
    ref::embedding(o, tok, wted, wped, B, T, C);
    return dot(o, rd);
  };
  EXPECT_LT(ref::rel_error(added(dwte), ref::numeric_grad(loss, wted), "embedding dwte"), kGradTol);
  EXPECT_LT(ref::rel_error(added(dwpe), ref::numeric_grad(loss, wped), "embedding dwpe"), kGradTol);
}

TEST(LayerGrad, LayerNorm) {
  const int N = 6, C = 8;
  auto x = rand_f(N * C, 2, 4, 4);  // off-centre rows: the mean subtraction matters
  auto w = rand_f(C, 0.5, 1.5, 5), b = rand_f(C, -0.5, 0.5, 6), r = rand_f(N * C, -1, 1, 7);
  std::vector<float> out(N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  Vec xd = ref::to_double(x), wd = ref::to_double(w), bd = ref::to_double(b), rd = ref::to_double(r), outd;
  ref::layernorm(outd, xd, wd, bd, N, C);
  EXPECT_LT(ref::rel_error(out, outd, "layernorm forward"), kForwardTol);

  auto dx = prefilled(N * C), dw = prefilled(C), db = prefilled(C);
  layernorm_backward_dx(dx.data(), r.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
  layernorm_backward_dw(dw.data(), db.data(), r.data(), x.data(), mean.data(), rstd.data(), N, C);
  auto loss = [&] {
    Vec o;
    ref::layernorm(o, xd, wd, bd, N, C);
    return dot(o, rd);
  };
  EXPECT_LT(ref::rel_error(added(dx), ref::numeric_grad(loss, xd), "layernorm dx"), kGradTol);
  EXPECT_LT(ref::rel_error(added(dw), ref::numeric_grad(loss, wd), "layernorm dweight"), kGradTol);
  EXPECT_LT(ref::rel_error(added(db), ref::numeric_grad(loss, bd), "layernorm dbias"), kGradTol);
}

void check_linear(bool with_bias) {
  const int N = 6, C = 5, OC = 7;
  auto x = rand_f(N * C, -1, 1, 8), W = rand_f(OC * C, -1, 1, 9), r = rand_f(N * OC, -1, 1, 11);
  auto bias = with_bias ? rand_f(OC, -1, 1, 10) : std::vector<float>{};
  std::vector<float> out(N * OC);
  linear_forward(out.data(), x.data(), W.data(), with_bias ? bias.data() : nullptr, N, C, OC);
  Vec xd = ref::to_double(x), Wd = ref::to_double(W), bd = ref::to_double(bias), rd = ref::to_double(r), outd;
  ref::linear(outd, xd, Wd, bd, N, C, OC);
  EXPECT_LT(ref::rel_error(out, outd, "linear forward"), kForwardTol);

  auto dx = prefilled(N * C), dW = prefilled(OC * C), db = prefilled(OC);
  linear_backward_dx(dx.data(), r.data(), W.data(), N, C, OC);
  linear_backward_dw(dW.data(), with_bias ? db.data() : nullptr, r.data(), x.data(), N, C, OC);
  auto loss = [&] {
    Vec o;
    ref::linear(o, xd, Wd, bd, N, C, OC);
    return dot(o, rd);
  };
  EXPECT_LT(ref::rel_error(added(dx), ref::numeric_grad(loss, xd), "linear dx"), kGradTol);
  EXPECT_LT(ref::rel_error(added(dW), ref::numeric_grad(loss, Wd), "linear dweight"), kGradTol);
  if (with_bias) {
    EXPECT_LT(ref::rel_error(added(db), ref::numeric_grad(loss, bd), "linear dbias"), kGradTol);
  } else {
    for (float v : db) EXPECT_EQ(v, kPrefill) << "a null bias must leave dbias alone";
  }
}

TEST(LayerGrad, Linear) { check_linear(true); }
TEST(LayerGrad, LinearNoBias) { check_linear(false); }

TEST(LayerGrad, Attention) {
  const int B = 2, T = 5, C = 8, NH = 2;
  auto qkv = rand_f(B * T * 3 * C, -1.5, 1.5, 12), r = rand_f(B * T * C, -1, 1, 13);
  std::vector<float> out(B * T * C), att(B * NH * T * T), scratch(T * T);
  attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  Vec qd = ref::to_double(qkv), rd = ref::to_double(r), outd;
  ref::attention(outd, qd, B, T, C, NH);
  EXPECT_LT(ref::rel_error(out, outd, "attention forward"), kForwardTol);
  // Rows of att are causal probability distributions.
  for (int bh = 0; bh < B * NH; ++bh)
    for (int t = 0; t < T; ++t) {
      double s = 0;
      for (int u = 0; u < T; ++u) {
        const float a = att[(static_cast<std::size_t>(bh) * T + t) * T + u];
        if (u > t) {
          EXPECT_EQ(a, 0.0f);
        }
        s += a;
      }
      EXPECT_NEAR(s, 1.0, 1e-6);
    }

  auto dqkv = prefilled(B * T * 3 * C);
  attention_backward(dqkv.data(), scratch.data(), r.data(), qkv.data(), att.data(), B, T, C, NH);
  auto loss = [&] {
    Vec o;
    ref::attention(o, qd, B, T, C, NH);
    return dot(o, rd);
  };
  EXPECT_LT(ref::rel_error(added(dqkv), ref::numeric_grad(loss, qd), "attention dqkv"), kGradTol);
}

TEST(LayerGrad, Gelu) {
  const std::size_t n = 64;
  auto x = rand_f(n, -4, 4, 14), r = rand_f(n, -1, 1, 15);
  std::vector<float> out(n);
  gelu_forward(out.data(), x.data(), n);
  Vec xd = ref::to_double(x), rd = ref::to_double(r), outd(n);
  for (std::size_t i = 0; i < n; ++i) outd[i] = ref::gelu(xd[i]);
  EXPECT_LT(ref::rel_error(out, outd, "gelu forward"), kForwardTol);

  auto dx = prefilled(n);
  gelu_backward(dx.data(), r.data(), x.data(), n);
  auto loss = [&] {
    double s = 0;
    for (std::size_t i = 0; i < n; ++i) s += ref::gelu(xd[i]) * rd[i];
    return s;
  };
  EXPECT_LT(ref::rel_error(added(dx), ref::numeric_grad(loss, xd), "gelu dx"), kGradTol);
}

TEST(LayerGrad, Residual) {
  const std::size_t n = 10;
  auto a = rand_f(n, -1, 1, 16), b = rand_f(n, -1, 1, 17), r = rand_f(n, -1, 1, 18);
  std::vector<float> out(n);
  residual_forward(out.data(), a.data(), b.data(), n);
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(out[i], a[i] + b[i]);
  auto da = prefilled(n), db = prefilled(n);
  residual_backward(da.data(), db.data(), r.data(), n);
  Vec ad = ref::to_double(a), bd = ref::to_double(b), rd = ref::to_double(r);
  auto loss = [&] {
    double s = 0;
    for (std::size_t i = 0; i < n; ++i) s += (ad[i] + bd[i]) * rd[i];
    return s;
  };
  EXPECT_LT(ref::rel_error(added(da), ref::numeric_grad(loss, ad), "residual da"), kGradTol);
  EXPECT_LT(ref::rel_error(added(db), ref::numeric_grad(loss, bd), "residual db"), kGradTol);
}

TEST(LayerGrad, CrossEntropy) {
  const int N = 6, V = 7;
  const std::vector<int> y = {0, 6, 3, 3, 1, 5};
  const float dloss = 0.375f;  // L = dloss * sum_n loss_n
  auto z = rand_f(N * V, -2, 2, 19);
  std::vector<float> losses(N), probs(N * V);
  crossentropy_forward(losses.data(), probs.data(), z.data(), y.data(), N, V);
  Vec zd = ref::to_double(z), lossd;
  ref::crossentropy(lossd, zd, y, N, V);
  EXPECT_LT(ref::rel_error(losses, lossd, "crossentropy forward"), kForwardTol);
  // In place (probs aliasing logits) gives the same bits.
  std::vector<float> inplace(z), losses2(N);
  crossentropy_forward(losses2.data(), inplace.data(), inplace.data(), y.data(), N, V);
  EXPECT_EQ(inplace, probs);
  EXPECT_EQ(losses2, losses);

  auto dz = prefilled(N * V);
  crossentropy_backward(dz.data(), probs.data(), y.data(), dloss, N, V);
  auto loss = [&] {
    Vec l;
    ref::crossentropy(l, zd, y, N, V);
    double s = 0;
    for (double v : l) s += v;
    return dloss * s;
  };
  EXPECT_LT(ref::rel_error(added(dz), ref::numeric_grad(loss, zd), "crossentropy dlogits"), kGradTol);
}

// The checks above can fail: a gradient off by 1e-4 of its scale in a single
// element exceeds kGradTol (the tolerance is not so loose that it passes
// anything).
TEST(LayerGrad, Sensitivity) {
  const int N = 6, C = 5, OC = 7;
  auto x = rand_f(N * C, -1, 1, 8), W = rand_f(OC * C, -1, 1, 9), r = rand_f(N * OC, -1, 1, 11);
  std::vector<float> dx(N * C, 0.0f);
  linear_backward_dx(dx.data(), r.data(), W.data(), N, C, OC);
  Vec xd = ref::to_double(x), Wd = ref::to_double(W), rd = ref::to_double(r);
  auto loss = [&] {
    Vec o;
    ref::linear(o, xd, Wd, {}, N, C, OC);
    return dot(o, rd);
  };
  const Vec num = ref::numeric_grad(loss, xd);
  ASSERT_LT(ref::rel_error(dx, num, "linear dx (control)"), kGradTol);
  double scale = 0;
  for (double v : num) scale = std::max(scale, std::fabs(v));
  dx[7] += static_cast<float>(1e-4 * scale);
  EXPECT_GT(ref::rel_error(dx, num, "linear dx, one element off"), kGradTol);
}

}  // namespace
}  // namespace cclz::train
