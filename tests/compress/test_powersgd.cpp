// PowerSGD: exact reconstruction of a rank-r matrix, no NaN from zero
// columns, the reshape and min_rate rules, warm-up, error feedback
// (sent + residual == sum of gradients), checkpoint round trip, several
// simulated ranks, dtypes and bad parameters.
#include <gmock/gmock.h>

#include <cmath>

#include "compressors/powersgd.hpp"
#include "helpers.hpp"

namespace cclz::test {
namespace {

using ::testing::HasSubstr;
namespace ps = compress::powersgd;

// A = U V^T with U (n x r), V (m x r) normal: rank r exactly (almost surely).
std::vector<float> low_rank(std::size_t n, std::size_t m, std::size_t r, std::uint32_t seed) {
  const std::vector<float> u = normal(n * r, seed), v = normal(m * r, seed + 1000);
  std::vector<float> a(n * m, 0.0f);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < m; ++j) {
      double s = 0;
      for (std::size_t k = 0; k < r; ++k) s += static_cast<double>(u[i * r + k]) * v[j * r + k];
      a[i * m + j] = static_cast<float>(s);
    }
  }
  return a;
}

double rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

std::unique_ptr<CompressorState> matrix_state(const Compressor& c, std::size_t n, std::size_t m,
                                              DataType dt = DataType::f32) {
  std::unique_ptr<CompressorState> st;
  const Status s = c.make_state(TensorDesc{n * m, dt, n, m}, &st);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return st;
}

// One step on one rank (the all-reduce of one rank is the identity).
std::vector<float> one_rank_step(const Compressor& c, CompressorState& st, const std::vector<float>& g,
                                 int* rounds = nullptr) {
  Payload p;
  EXPECT_TRUE(c.begin(st, bytes_of(g), &p).ok());
  int k = 1;
  while (!p.last) {
    EXPECT_EQ(p.aggregation, Aggregation::summable);
    EXPECT_EQ(p.sum_dtype, DataType::f32);
    const std::vector<std::byte> agg_bytes = p.bytes;
    std::vector<std::span<const std::byte>> agg{agg_bytes};
    const Status s = c.next(st, agg, &p);
    EXPECT_TRUE(s.ok()) << s.to_string();
    ++k;
  }
  if (rounds != nullptr) *rounds = k;
  std::vector<std::span<const std::byte>> agg{p.bytes};
  std::vector<float> out(g.size());
  const Status s = c.finish(st, agg, std::as_writable_bytes(std::span(out)));
  EXPECT_TRUE(s.ok()) << s.to_string();
  return out;
}

TEST(PowerSgd, ReconstructsAnExactlyRankRMatrix) {
  for (const char* spec : {"powersgd:rank=3", "powersgd:rank=3,ef=0", "powersgd:rank=5"}) {
    SCOPED_TRACE(spec);
    auto c = make(spec);
    const std::size_t n = 96, m = 200;
    const std::vector<float> a = low_rank(n, m, 3, 1);
    auto st = matrix_state(*c, n, m);
    int rounds = 0;
    const std::vector<float> out = one_rank_step(*c, *st, a, &rounds);
    EXPECT_EQ(rounds, 2);
    EXPECT_LT(rel_err(out, a), 1e-5);
    // Warm-started steps on the same matrix stay exact.
    for (int t = 0; t < 3; ++t) EXPECT_LT(rel_err(one_rank_step(*c, *st, a), a), 1e-5);
  }
}

TEST(PowerSgd, WarmStartConvergesToTheBestRankRApproximation) {
  // A full-rank matrix with a clear spectral gap after rank 2: repeated
  // steps on it (no error feedback) approach its top-2 projection.
  auto c = make("powersgd:rank=2,ef=0");
  const std::size_t n = 64, m = 80;
  std::vector<float> top = low_rank(n, m, 2, 3);
  std::vector<float> noise = normal(n * m, 4, 0.01f);
  std::vector<float> a(n * m);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = top[i] + noise[i];
  auto st = matrix_state(*c, n, m);
  std::vector<float> out;
  for (int t = 0; t < 10; ++t) out = one_rank_step(*c, *st, a);
  // The error of the best rank-2 approximation is at most ||noise||.
  double nn = 0, aa = 0;
  for (std::size_t i = 0; i < a.size(); ++i) nn += static_cast<double>(noise[i]) * noise[i], aa += static_cast<double>(a[i]) * a[i];
  EXPECT_LT(rel_err(out, a), 1.05 * std::sqrt(nn / aa));
}

TEST(PowerSgd, OrthogonaliseGivesOrthonormalOrZeroColumnsNeverNan) {
  const std::size_t n = 50, r = 4;
  std::vector<float> p = normal(n * r, 5);
  for (std::size_t i = 0; i < n; ++i) {
    p[i * r + 1] = 0.0f;                // an all-zero column
    p[i * r + 3] = 2.0f * p[i * r + 0];  // a multiple of column 0
  }
  ps::orthogonalise(p.data(), n, r);
  for (float v : p) ASSERT_FALSE(std::isnan(v));
  for (std::size_t j = 0; j < r; ++j) {
    for (std::size_t k = 0; k <= j; ++k) {
      double d = 0;
      for (std::size_t i = 0; i < n; ++i) d += static_cast<double>(p[i * r + j]) * p[i * r + k];
      if (j == 1 || k == 1) {
        EXPECT_EQ(d, 0.0) << j << k;  // the zero column stays zero
      } else if (j == k) {
        // Column 3 lost everything but rounding noise: either zero or, renormalised, a unit vector.
        if (j == 3 && d == 0.0) continue;
        EXPECT_NEAR(d, 1.0, 1e-5) << j;
      } else {
        EXPECT_NEAR(d, 0.0, 1e-5) << j << k;
      }
    }
  }
}

TEST(PowerSgd, ZeroGradientGivesZeroNotNanAndRecovers) {
  auto c = make("powersgd:rank=2");
  const std::size_t n = 40, m = 60;
  auto st = matrix_state(*c, n, m);
  const std::vector<float> zero(n * m, 0.0f);
  for (int t = 0; t < 2; ++t) {
    const std::vector<float> out = one_rank_step(*c, *st, zero);
    for (float v : out) ASSERT_EQ(v, 0.0f);
  }
  // The zero columns of Q were drawn again: a rank-2 matrix is found at once.
  const std::vector<float> a = low_rank(n, m, 2, 6);
  EXPECT_LT(rel_err(one_rank_step(*c, *st, a), a), 1e-5);
}

TEST(PowerSgd, ReshapeRuleAndRateRule) {
  EXPECT_EQ(ps::matrix_shape(TensorDesc{4096u * 4096u, DataType::f32, 0, 0}).rows, 4096u);
  const ps::Shape s12 = ps::matrix_shape(TensorDesc{12, DataType::f32, 0, 0});
  EXPECT_EQ(s12.rows, 3u);
  EXPECT_EQ(s12.cols, 4u);
  const ps::Shape prime = ps::matrix_shape(TensorDesc{1009, DataType::f32, 0, 0});
  EXPECT_EQ(prime.rows, 1u);
  EXPECT_EQ(prime.cols, 1009u);
  const ps::Shape declared = ps::matrix_shape(TensorDesc{12, DataType::f32, 2, 6});
  EXPECT_EQ(declared.rows, 2u);
  EXPECT_EQ(declared.cols, 6u);
  const ps::Shape sq = ps::matrix_shape(TensorDesc{10000, DataType::f32, 0, 0});
  EXPECT_EQ(sq.rows, 100u);
  // (n + m) r min_rate < n m: 16x16 at rank 4 is exactly at the limit for 2.
  EXPECT_FALSE(ps::compresses({16, 16}, 4, 2.0));
  EXPECT_TRUE(ps::compresses({16, 16}, 4, 1.9));
  EXPECT_FALSE(ps::compresses({1, 1009}, 1, 2.0));

  // Through the compressor: a dense payload in the tensor's dtype, one round.
  for (const char* spec : {"powersgd:rank=4", "powersgd:rank=4,min_rate=1.9"}) {
    auto c = make(spec);
    auto st = matrix_state(*c, 16, 16, DataType::bf16);
    const std::vector<float> g = widen(typed(normal(256, 7), DataType::bf16), DataType::bf16);
    Payload p;
    ASSERT_TRUE(c->begin(*st, typed(g, DataType::bf16), &p).ok());
    EXPECT_EQ(p.aggregation, Aggregation::summable);
    if (std::string(spec).ends_with("1.9")) {
      EXPECT_FALSE(p.last);
      EXPECT_EQ(p.bytes.size(), 16u * 4 * 4);  // P: n x r f32
      EXPECT_EQ(p.sum_dtype, DataType::f32);
    } else {
      EXPECT_TRUE(p.last);
      EXPECT_EQ(p.sum_dtype, DataType::bf16);
      EXPECT_EQ(p.bytes, typed(g, DataType::bf16));
      std::vector<std::span<const std::byte>> agg{p.bytes};
      std::vector<std::byte> out(256 * 2);
      ASSERT_TRUE(c->finish(*st, agg, out).ok());
      EXPECT_EQ(out, typed(g, DataType::bf16));
    }
  }
  // A vector (no shape, prime count) is always dense.
  auto c = make("powersgd");
  auto st = state_for(*c, 1009);
  Payload p;
  ASSERT_TRUE(c->begin(*st, bytes_of(normal(1009, 8)), &p).ok());
  EXPECT_TRUE(p.last);
  EXPECT_EQ(p.bytes.size(), 1009u * 4);
}

TEST(PowerSgd, WarmupStepsAreDense) {
  auto c = make("powersgd:rank=2,warmup=2");
  const std::size_t n = 30, m = 40;
  auto st = matrix_state(*c, n, m);
  const std::vector<float> g = normal(n * m, 9);
  for (int t = 1; t <= 4; ++t) {
    Payload p;
    ASSERT_TRUE(c->begin(*st, bytes_of(g), &p).ok());
    if (t <= 2) {
      EXPECT_TRUE(p.last) << t;
      EXPECT_EQ(p.bytes.size(), n * m * 4) << t;
      std::vector<std::span<const std::byte>> agg{p.bytes};
      std::vector<float> out(n * m);
      ASSERT_TRUE(c->finish(*st, agg, std::as_writable_bytes(std::span(out))).ok());
      EXPECT_EQ(out, g);  // dense and exact
      std::vector<float> e;
      ASSERT_TRUE(ps::residual(*st, &e).ok());
      for (float v : e) ASSERT_EQ(v, 0.0f);  // nothing withheld
    } else {
      EXPECT_FALSE(p.last) << t;
      EXPECT_EQ(p.bytes.size(), n * 2 * 4) << t;
      std::vector<std::span<const std::byte>> agg{p.bytes};
      ASSERT_TRUE(c->next(*st, agg, &p).ok());
      EXPECT_EQ(p.bytes.size(), m * 2 * 4);
      std::vector<std::span<const std::byte>> agg2{p.bytes};
      std::vector<float> out(n * m);
      ASSERT_TRUE(c->finish(*st, agg2, std::as_writable_bytes(std::span(out))).ok());
    }
  }
}

TEST(PowerSgd, ErrorFeedbackSentPlusResidualIsTheSumOfGradients) {
  auto c = make("powersgd:rank=2");
  const std::size_t n = 48, m = 64;
  auto st = matrix_state(*c, n, m);
  std::vector<double> sent(n * m, 0.0), grads(n * m, 0.0);
  for (int t = 0; t < 8; ++t) {
    const std::vector<float> g = normal(n * m, 100 + static_cast<std::uint32_t>(t));
    const std::vector<float> out = one_rank_step(*c, *st, g);
    std::vector<float> e;
    ASSERT_TRUE(ps::residual(*st, &e).ok());
    double worst = 0, scale = 0;
    for (std::size_t i = 0; i < g.size(); ++i) {
      sent[i] += out[i];
      grads[i] += g[i];
      worst = std::max(worst, std::fabs(sent[i] + e[i] - grads[i]));
      scale = std::max(scale, std::fabs(grads[i]));
    }
    EXPECT_LT(worst, 1e-5 * (scale + 1)) << "step " << t;
    // Not trivially: the residual is not zero (rank 2 of a full-rank gradient).
    double ee = 0;
    for (float v : e) ee += static_cast<double>(v) * v;
    EXPECT_GT(ee, 1.0);
  }
  // Without error feedback there is no residual.
  auto c0 = make("powersgd:rank=2,ef=0");
  auto s0 = matrix_state(*c0, n, m);
  (void)one_rank_step(*c0, *s0, normal(n * m, 7));
  std::vector<float> e;
  ASSERT_TRUE(ps::residual(*s0, &e).ok());
  for (float v : e) ASSERT_EQ(v, 0.0f);
}

TEST(PowerSgd, SavedStateContinues) {
  for (const char* spec : {"powersgd:rank=3", "powersgd:rank=3,ef=0"}) {
    for (DataType dt : {DataType::f32, DataType::f16}) {
      SCOPED_TRACE(std::string(spec) + " " + dtype_name(dt));
      auto c = make(spec);
      const std::size_t n = 40, m = 50;
      auto a = matrix_state(*c, n, m, dt);
      const auto step = [&](const Compressor& cc, CompressorState& st, std::uint32_t seed) {
        const std::vector<std::byte> g = typed(normal(n * m, seed), dt);
        Payload p;
        EXPECT_TRUE(cc.begin(st, g, &p).ok());
        std::vector<std::byte> b0 = p.bytes;
        std::vector<std::span<const std::byte>> agg{b0};
        EXPECT_TRUE(cc.next(st, agg, &p).ok());
        std::vector<std::span<const std::byte>> agg2{p.bytes};
        std::vector<std::byte> out(g.size());
        EXPECT_TRUE(cc.finish(st, agg2, out).ok());
        return out;
      };
      for (std::uint32_t t = 0; t < 3; ++t) (void)step(*c, *a, 200 + t);
      std::vector<std::byte> saved;
      ASSERT_TRUE(a->save(&saved).ok());
      auto c2 = make(spec);
      auto b = matrix_state(*c2, n, m, dt);
      const Status ls = b->load(saved);
      ASSERT_TRUE(ls.ok()) << ls.to_string();
      EXPECT_EQ(b->step(), 3u);
      std::vector<float> ea, eb;
      ASSERT_TRUE(ps::residual(*a, &ea).ok());
      ASSERT_TRUE(ps::residual(*b, &eb).ok());
      EXPECT_EQ(ea, eb);
      for (std::uint32_t t = 0; t < 2; ++t) {
        // The materialised residual can differ from the folded one in the
        // last bit (sgemm on a block vs the whole matrix): near, not bitwise.
        const std::vector<float> oa = widen(step(*c, *a, 300 + t), dt), ob = widen(step(*c2, *b, 300 + t), dt);
        EXPECT_LT(rel_err(ob, oa), dt == DataType::f32 ? 1e-5 : 1e-3);
      }
      // A state of another rank or shape is refused.
      auto c4 = make("powersgd:rank=4");
      auto other = matrix_state(*c4, n, m, dt);
      EXPECT_FALSE(other->load(saved).ok());
      auto shaped = matrix_state(*c2, m, n, dt);
      EXPECT_FALSE(shaped->load(saved).ok());
    }
  }
}

TEST(PowerSgd, ThreeRanksSumTheirApproximationsIdentically) {
  // Each rank holds a rank-1 matrix; their sum has rank 3, so rank 3 recovers it exactly.
  auto c = make("powersgd:rank=3");
  const std::size_t n = 30, m = 45;
  std::vector<std::unique_ptr<CompressorState>> states;
  std::vector<std::vector<std::byte>> grads;
  std::vector<float> sum(n * m, 0.0f);
  for (std::uint32_t r = 0; r < 3; ++r) {
    std::unique_ptr<CompressorState> st;
    ASSERT_TRUE(c->make_state(TensorDesc{n * m, DataType::f32, n, m}, &st).ok());
    states.push_back(std::move(st));
    const std::vector<float> g = low_rank(n, m, 1, 40 + r);
    for (std::size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
    grads.push_back(typed(g, DataType::f32));
  }
  const Step s = run_step(*c, states, grads);
  for (std::size_t r = 1; r < 3; ++r) EXPECT_EQ(s.outs[r], s.outs[0]);
  EXPECT_LT(rel_err(widen(s.outs[0], DataType::f32), sum), 1e-5);
  // finish() is the sum over ranks of each rank's decoded last payload... of
  // its own Q: decode_add of the summed Q equals the output.
  std::vector<float> acc(n * m, 0.0f);
  std::vector<float> qsum(s.payloads[0].bytes.size() / 4, 0.0f);
  for (const Payload& p : s.payloads) {
    const std::vector<float> qr = widen(p.bytes, DataType::f32);
    for (std::size_t i = 0; i < qsum.size(); ++i) qsum[i] += qr[i];
  }
  ASSERT_TRUE(c->decode_add(*states[0], bytes_of(qsum), acc).ok());
  EXPECT_LT(rel_err(acc, widen(s.outs[0], DataType::f32)), 1e-6);
}

TEST(PowerSgd, SizesForEveryDtype) {
  auto c = make("powersgd:rank=2");
  for (DataType dt : {DataType::f32, DataType::f16, DataType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const std::size_t n = 33, m = 70;
    auto st = matrix_state(*c, n, m, dt);
    const std::vector<float> a = widen(typed(low_rank(n, m, 2, 50), dt), dt);
    Payload p;
    ASSERT_TRUE(c->begin(*st, typed(a, dt), &p).ok());
    EXPECT_EQ(p.bytes.size(), n * 2 * 4);
    std::vector<std::byte> b0 = p.bytes;
    std::vector<std::span<const std::byte>> agg{b0};
    ASSERT_TRUE(c->next(*st, agg, &p).ok());
    EXPECT_EQ(p.bytes.size(), m * 2 * 4);
    EXPECT_EQ(p.round, 1);
    std::vector<std::span<const std::byte>> agg2{p.bytes};
    std::vector<std::byte> out(n * m * dtype_size(dt)), dec(out.size());
    ASSERT_TRUE(c->decode(*st, p.bytes, dec).ok());
    ASSERT_TRUE(c->finish(*st, agg2, out).ok());
    EXPECT_EQ(out, dec);
    const double tol = dt == DataType::f32 ? 1e-5 : dt == DataType::f16 ? 1e-3 : 8e-3;
    EXPECT_LT(rel_err(widen(out, dt), a), tol);
    // A wrong-sized aggregate or payload is refused.
    std::vector<std::byte> bad(8);
    std::vector<std::span<const std::byte>> badagg{bad};
    std::vector<float> acc(n * m);
    EXPECT_THAT(c->decode_add(*st, bad, acc).message(), HasSubstr("final round's Q"));
    Payload p2;
    ASSERT_TRUE(c->begin(*st, typed(a, dt), &p2).ok());
    EXPECT_THAT(c->next(*st, badagg, &p2).message(), HasSubstr("aggregate of P (round 0)"));
  }
}

TEST(PowerSgd, BadParametersAndDecoratorsAreRefused) {
  const std::pair<const char*, const char*> cases[] = {
      {"powersgd:rank=0", "compressor spec 'powersgd:rank=0': rank=0 is out of range [1, 1024]"},
      {"powersgd:rank=2000", "rank=2000 is out of range"},
      {"powersgd:warmup=-1", "warmup=-1 must be >= 0"},
      {"powersgd:min_rate=0", "min_rate must be > 0, got 0"},
      {"powersgd:ef=2", "ef=2 is not 0, 1, true or false"},
      {"powersgd:bits=2", "unknown parameter 'bits' for powersgd"},
      {"ef+powersgd", "needs a single-round compressor"},
  };
  for (const auto& [spec, want] : cases) {
    std::unique_ptr<Compressor> c;
    const Status s = make_compressor(spec, &c);
    EXPECT_EQ(s.code(), Result::invalid_argument) << spec;
    EXPECT_THAT(s.message(), HasSubstr(want)) << spec;
  }
}

}  // namespace
}  // namespace cclz::test
