// Error-feedback invariants over many steps.
//
// ef+C: per rank, (sum of everything decoded from its payloads) + e ==
// (sum of its gradients). In f32 the only rounding is in a = e + g and in
// e = a - decode(C(a)); each step adds at most 2^-24 |a| per coordinate
// twice, so the tolerance is T * 2^-23 * max|a| (sums kept in double).
//
// (ef+dgc is left out: DGC keeps its own residual v, so there the
// invariant is sent + e + v == sum of gradients.)
//
// ef21+C: h == sum of this rank's decoded payloads; the output H == sum
// over ranks of h (same tolerance); and for a fixed gradient the estimate
// contracts: ||g - h_t||^2 <= (1 - k/n)^t ||g||^2 for top-k. (Payloads
// summed in f32 here; a cast summed in f16 would add its rounding to H.)
#include <cmath>

#include "helpers.hpp"

namespace cclz::test {
namespace {

TEST(ErrorFeedback, SentPlusResidualEqualsSumOfGradients) {
  for (const char* spec : {"ef+topk:ratio=0.02", "ef+topk:ratio=0.02,approx=1", "ef+randk:ratio=0.05", "ef+fp16",
                           "ef+bf16", "ef+threshold:tau=2"}) {
    for (DataType dt : {DataType::f32, DataType::f16}) {
      SCOPED_TRACE(std::string(spec) + " " + dtype_name(dt));
      const std::size_t n = 5000;
      const int steps = 200;
      auto c = make(spec);
      auto st = state_for(*c, n, dt);
      std::vector<double> sent(n, 0.0), grads(n, 0.0);
      double max_a = 0;
      for (int t = 0; t < steps; ++t) {
        const std::vector<float> g = widen(typed(normal(n, 1000 + static_cast<std::uint32_t>(t)), dt), dt);
        const std::vector<float> before = saved_body_floats(*st, n);
        for (std::size_t i = 0; i < n; ++i) max_a = std::max(max_a, std::fabs(double{before[i]} + g[i]));
        Payload p;
        ASSERT_TRUE(c->begin(*st, typed(g, dt), &p).ok());
        std::vector<float> d(n, 0.0f);
        ASSERT_TRUE(c->decode_add(*st, p.bytes, d).ok());
        for (std::size_t i = 0; i < n; ++i) {
          sent[i] += d[i];
          grads[i] += g[i];
        }
      }
      const std::vector<float> e = saved_body_floats(*st, n);
      const double tol = steps * std::ldexp(1.0, -23) * max_a;
      double worst = 0;
      for (std::size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(sent[i] + e[i] - grads[i]));
      EXPECT_LE(worst, tol);
      // Something was held back: the residual is not trivially zero.
      double e_norm = 0;
      for (float v : e) e_norm += std::fabs(v);
      if (!std::string(spec).ends_with("fp16")) {
        EXPECT_GT(e_norm, 0.0);
      }
    }
  }
}

TEST(ErrorFeedback, Ef21EstimatesSumToTheOutputAndTrackTheGradient) {
  for (const char* spec : {"ef21+topk:ratio=0.05", "ef21+randk:ratio=0.1", "ef21+threshold:tau=1"}) {
    SCOPED_TRACE(spec);
    const std::size_t n = 2000;
    const int nranks = 3, steps = 60;
    auto c = make(spec);
    std::vector<std::unique_ptr<CompressorState>> states;
    for (int r = 0; r < nranks; ++r) states.push_back(state_for(*c, n));
    std::vector<std::vector<double>> own(nranks, std::vector<double>(n, 0.0));
    double max_abs = 0;
    for (int t = 0; t < steps; ++t) {
      std::vector<std::vector<std::byte>> grads;
      for (int r = 0; r < nranks; ++r) {
        // A slowly drifting gradient per rank.
        std::vector<float> g = normal(n, 7 + static_cast<std::uint32_t>(r));
        const std::vector<float> drift = normal(n, 500 + static_cast<std::uint32_t>(t * nranks + r), 0.05f);
        for (std::size_t i = 0; i < n; ++i) g[i] += drift[i];
        for (float v : g) max_abs = std::max(max_abs, double{std::fabs(v)});
        grads.push_back(typed(g, DataType::f32));
      }
      const Step s = run_step(*c, states, grads);
      std::vector<double> h_sum(n, 0.0);
      for (int r = 0; r < nranks; ++r) {
        const auto ur = static_cast<std::size_t>(r);
        std::vector<float> d(n, 0.0f);
        ASSERT_TRUE(c->decode_add(*states[ur], s.payloads[ur].bytes, d).ok());
        const std::vector<float> h = saved_body_floats(*states[ur], n);
        for (std::size_t i = 0; i < n; ++i) {
          own[ur][i] += d[i];
          h_sum[i] += h[i];
        }
        const double tol = (t + 1) * std::ldexp(1.0, -22) * 4 * max_abs;
        for (std::size_t i = 0; i < n; ++i) ASSERT_NEAR(h[i], own[ur][i], tol) << "rank " << r << " step " << t;
        EXPECT_EQ(s.outs[ur], s.outs[0]);
      }
      const std::vector<float> out = widen(s.outs[0], DataType::f32);
      const double tol = (t + 1) * std::ldexp(1.0, -22) * 4 * nranks * max_abs;
      for (std::size_t i = 0; i < n; ++i) ASSERT_NEAR(out[i], h_sum[i], tol) << "step " << t;
    }
  }
}

TEST(ErrorFeedback, Ef21TopkContractsTowardsAFixedGradient) {
  const std::size_t n = 1000, k = 50;  // ratio 0.05
  auto c = make("ef21+topk:ratio=0.05");
  auto st = state_for(*c, n);
  const std::vector<float> g = normal(n, 4);
  double g2 = 0;
  for (float v : g) g2 += double{v} * v;
  double bound = g2;
  for (int t = 1; t <= 30; ++t) {
    Payload p;
    ASSERT_TRUE(c->begin(*st, bytes_of(g), &p).ok());
    const std::vector<float> h = saved_body_floats(*st, n);
    double diff = 0;
    for (std::size_t i = 0; i < n; ++i) diff += (double{g[i]} - h[i]) * (double{g[i]} - h[i]);
    bound *= 1.0 - static_cast<double>(k) / n;
    EXPECT_LE(diff, bound * (1 + 1e-6)) << "step " << t;
  }
}

}  // namespace
}  // namespace cclz::test
