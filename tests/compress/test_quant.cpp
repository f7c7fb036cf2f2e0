// The quantizers (qsgd, terngrad, int8, int4, sign, signum): the documented
// payload layouts, bit-identical baseline and AVX2 kernels, unbiasedness of
// the stochastic ones within a Bernstein confidence bound, QSGD's variance
// bound, int8/int4 round-to-nearest error, sign scales, sizes for every
// dtype, a hand-run 3-rank decode-add-re-encode, and bad parameters.
#include <gmock/gmock.h>

#include <cmath>
#include <numeric>

#include "compressors/quant.hpp"
#include "helpers.hpp"

namespace cclz::test {
namespace {

using ::testing::HasSubstr;
namespace q = compress::quant;

// ---------------------------------------------------------------- layouts, by hand

TEST(QuantLayout, LevelPayloadDecodesAsDocumented) {
  // bits=2 (s = 3), n = 10: scale 6 -> unit 2; elements: levels 0..3 with signs.
  const int bits = 2;
  const std::size_t n = 10;
  std::vector<std::byte> p(q::level_block_bytes(bits, n));
  ASSERT_EQ(p.size(), 4u + 3u * 2u);
  q::write_scale(p.data(), 6.0f);
  const unsigned level[n] = {0, 1, 2, 3, 1, 0, 3, 2, 1, 3};
  const unsigned neg[n] = {0, 1, 0, 1, 0, 0, 1, 1, 0, 1};
  for (std::size_t i = 0; i < n; ++i) {
    const auto set = [&](int plane) {
      p[4 + static_cast<std::size_t>(plane) * 2 + i / 8] |= std::byte(1u << (i % 8));
    };
    if (neg[i]) set(0);
    if (level[i] & 1u) set(1);
    if (level[i] & 2u) set(2);
  }
  for (kernels::Isa isa : kernels::kAllIsas) {
    const q::Kernels* k = q::kernels_for(isa);
    if (k == nullptr) continue;
    std::vector<float> acc(n, 0.5f);
    k->level_decode_add(p.data(), n, bits, 1.0f, acc.data());
    for (std::size_t i = 0; i < n; ++i) {
      EXPECT_EQ(acc[i], 0.5f + (neg[i] ? -2.0f : 2.0f) * static_cast<float>(level[i])) << kernels::isa_name(isa) << i;
    }
  }
}

TEST(QuantLayout, AbsmaxAndSignPayloadsDecodeAsDocumented) {
  // int4: scale 0.5, nibbles of -7, 7, -1, 0, 3 (element 2j in the low nibble).
  std::vector<std::byte> p4(q::absmax_block_bytes(4, 5));
  ASSERT_EQ(p4.size(), 4u + 3u);
  q::write_scale(p4.data(), 0.5f);
  p4[4] = std::byte(0x79);  // low 9 = -7, high 7
  p4[5] = std::byte(0x0f);  // low f = -1, high 0
  p4[6] = std::byte(0x03);
  std::vector<std::byte> p8(q::absmax_block_bytes(8, 3));
  q::write_scale(p8.data(), 0.25f);
  p8[4] = std::byte(0x81);  // -127
  p8[5] = std::byte(0x7f);  // 127
  p8[6] = std::byte(0xfe);  // -2
  std::vector<std::byte> ps(q::sign_bytes(9));
  ASSERT_EQ(ps.size(), 4u + 2u);
  q::write_scale(ps.data(), 1.5f);
  ps[4] = std::byte(0x05);  // elements 0 and 2 negative
  ps[5] = std::byte(0x01);  // element 8 negative
  for (kernels::Isa isa : kernels::kAllIsas) {
    const q::Kernels* k = q::kernels_for(isa);
    if (k == nullptr) continue;
    SCOPED_TRACE(kernels::isa_name(isa));
    std::vector<float> a4(5, 0.0f), a8(3, 0.0f), as(9, 0.0f);
    k->absmax_decode_add(p4.data(), 5, 4, 1.0f, a4.data());
    k->absmax_decode_add(p8.data(), 3, 8, 2.0f, a8.data());
    k->sign_decode_add(ps.data() + 4, 9, 1.5f, as.data());
    EXPECT_THAT(a4, ::testing::ElementsAre(-3.5f, 3.5f, -0.5f, 0.0f, 1.5f));
    EXPECT_THAT(a8, ::testing::ElementsAre(-63.5f, 63.5f, -1.0f));  // alpha 2
    EXPECT_THAT(as, ::testing::ElementsAre(-1.5f, 1.5f, -1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f, -1.5f));
  }
}

// ---------------------------------------------------------------- variants agree

TEST(QuantKernels, AvxAndBaselineGiveTheSamePayloadsAndSums) {
  const q::Kernels* g = q::kernels_for(kernels::Isa::generic);
  const q::Kernels* v = q::kernels_for(kernels::Isa::avx2);
  if (v == nullptr) GTEST_SKIP() << "this CPU has no AVX2: one variant only";
  for (std::size_t n : {1u, 7u, 8u, 9u, 31u, 32u, 33u, 100u, 512u, 1000u, 4096u, 4097u, 9001u}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    std::vector<float> x = normal(n, static_cast<std::uint32_t>(n), 3.0f);
    if (n > 5) x[3] = -0.0f, x[4] = 0.0f;
    for (int bits = 1; bits <= 8; ++bits) {
      for (q::Norm norm : {q::Norm::l2, q::Norm::max}) {
        std::vector<std::byte> a(q::level_block_bytes(bits, n)), b(a.size());
        g->level_encode(x.data(), n, bits, norm, 42, 7, a.data());
        v->level_encode(x.data(), n, bits, norm, 42, 7, b.data());
        ASSERT_EQ(a, b) << "bits " << bits;
        std::vector<float> da(x), db(x);
        g->level_decode_add(a.data(), n, bits, 0.75f, da.data());
        v->level_decode_add(a.data(), n, bits, 0.75f, db.data());
        ASSERT_EQ(da, db) << "bits " << bits;
      }
    }
    for (int bits : {8, 4}) {
      for (bool stochastic : {false, true}) {
        std::vector<std::byte> a(q::absmax_block_bytes(bits, n)), b(a.size());
        g->absmax_encode(x.data(), n, bits, stochastic, 3, 1, a.data());
        v->absmax_encode(x.data(), n, bits, stochastic, 3, 1, b.data());
        ASSERT_EQ(a, b) << "bits " << bits << " stochastic " << stochastic;
        std::vector<float> da(x), db(x);
        g->absmax_decode_add(a.data(), n, bits, -1.0f, da.data());
        v->absmax_decode_add(a.data(), n, bits, -1.0f, db.data());
        ASSERT_EQ(da, db);
      }
    }
    std::vector<std::byte> a(q::plane_bytes(n)), b(a.size());
    EXPECT_EQ(g->sign_pack(x.data(), n, a.data()), v->sign_pack(x.data(), n, b.data()));
    EXPECT_EQ(a, b);
    std::vector<float> ma(n, 0.25f), mb(n, 0.25f);
    EXPECT_EQ(g->momentum_sign_pack(x.data(), ma.data(), n, 0.9f, a.data()),
              v->momentum_sign_pack(x.data(), mb.data(), n, 0.9f, b.data()));
    EXPECT_EQ(a, b);
    EXPECT_EQ(ma, mb);
    std::vector<float> da(x), db(x);
    g->sign_decode_add(a.data(), n, 0.3f, da.data());
    v->sign_decode_add(a.data(), n, 0.3f, db.data());
    EXPECT_EQ(da, db);
  }
}

TEST(QuantKernels, NonFiniteInputMarksItsBlockNan) {
  for (kernels::Isa isa : kernels::kAllIsas) {
    const q::Kernels* k = q::kernels_for(isa);
    if (k == nullptr) continue;
    for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
      std::vector<float> x(40, 1.0f);
      x[37] = bad;
      std::vector<std::byte> p(q::level_block_bytes(4, 40)), a(q::absmax_block_bytes(8, 40));
      k->level_encode(x.data(), 40, 4, q::Norm::l2, 0, 0, p.data());
      k->absmax_encode(x.data(), 40, 8, false, 0, 0, a.data());
      EXPECT_TRUE(std::isnan(q::read_scale(p.data())));
      EXPECT_TRUE(std::isnan(q::read_scale(a.data())));
      std::vector<float> d(40, 0.0f);
      k->level_decode_add(p.data(), 40, 4, 1.0f, d.data());
      EXPECT_TRUE(std::isnan(d[0]));
    }
    // Squares overflow f32 but the values are finite: the norm is right.
    std::vector<float> big(64, 1e30f);
    std::vector<std::byte> p(q::level_block_bytes(8, 64));
    k->level_encode(big.data(), 64, 8, q::Norm::l2, 0, 0, p.data());
    EXPECT_FLOAT_EQ(q::read_scale(p.data()), 8e30f);
  }
}

// ---------------------------------------------------------------- unbiasedness and variance

// Runs `draws` steps of spec on x (f32), collecting per element the mean of
// the decoded values, and per step the squared error of the whole tensor.
struct Draws {
  std::vector<double> mean;
  std::vector<double> sq_err;  // ||Q(x) - x||^2 per draw
  std::vector<std::byte> first_payload;
};
Draws run_draws(const std::string& spec, const std::vector<float>& x, int draws) {
  auto c = make(spec);
  auto st = state_for(*c, x.size());
  Draws d;
  d.mean.assign(x.size(), 0.0);
  std::vector<float> out(x.size());
  Payload p;
  for (int t = 0; t < draws; ++t) {
    EXPECT_TRUE(c->begin(*st, bytes_of(x), &p).ok());
    if (t == 0) d.first_payload = p.bytes;
    EXPECT_TRUE(c->decode(*st, p.bytes, std::as_writable_bytes(std::span(out))).ok());
    double e = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      d.mean[i] += out[i];
      e += (static_cast<double>(out[i]) - x[i]) * (static_cast<double>(out[i]) - x[i]);
    }
    d.sq_err.push_back(e);
  }
  for (double& m : d.mean) m /= draws;
  return d;
}

// Bernstein: for T draws of a variable with range `range` and variance
// var, P(|mean - E| >= t) <= 2 exp(-T t^2 / (2 var + 2 range t / 3)).
// Solved for t at log-failure L = ln(2 n / delta).
double bernstein(double var, double range, int draws, double L) {
  const double a = 2.0 * range * L / 3.0;
  return (a + std::sqrt(a * a + 8.0 * draws * var * L)) / (2.0 * draws);
}

// Checks that each element's mean is E = x within the bound, where element
// i decodes to unit_i * (floor(a_i) or floor(a_i) + 1), a_i = |x_i| / unit_i
// (so the variance is unit^2 f (1 - f), f = frac(a_i)); total failure
// probability 1e-6 over all elements.
void expect_unbiased(const std::vector<float>& x, const Draws& d, const std::vector<double>& unit, int draws) {
  const double L = std::log(2.0 * static_cast<double>(x.size()) / 1e-6);
  int bad = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double u = unit[i];
    const double a = u > 0 ? std::fabs(x[i]) / u : 0.0;
    const double f = a - std::floor(a);
    const double tol = bernstein(u * u * f * (1 - f), u, draws, L) + 1e-6 * (std::fabs(x[i]) + u);
    if (std::fabs(d.mean[i] - x[i]) > tol && ++bad < 10) {
      ADD_FAILURE() << "element " << i << ": mean " << d.mean[i] << " vs " << x[i] << " (bound " << tol << ")";
    }
  }
  EXPECT_EQ(bad, 0);
}

// The exact E||Q(x) - x||^2 for the unit per element.
double expected_sq_err(const std::vector<float>& x, const std::vector<double>& unit) {
  double e = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (unit[i] == 0) continue;
    const double a = std::fabs(x[i]) / unit[i];
    const double f = a - std::floor(a);
    e += unit[i] * unit[i] * f * (1 - f);
  }
  return e;
}

// Mean squared error within 6 standard errors of its expectation (the draws
// are i.i.d.; the standard error from the sample).
void expect_mean_sq_err(const Draws& d, double expected) {
  const double T = static_cast<double>(d.sq_err.size());
  const double mean = std::accumulate(d.sq_err.begin(), d.sq_err.end(), 0.0) / T;
  double var = 0;
  for (double e : d.sq_err) var += (e - mean) * (e - mean);
  var /= T - 1;
  EXPECT_NEAR(mean, expected, 6.0 * std::sqrt(var / T) + 1e-9 * expected);
}

// Units of a level payload: scale / s per bucket.
std::vector<double> level_units(const std::vector<std::byte>& p, std::size_t n, int bits, std::size_t bucket) {
  std::vector<double> unit(n);
  const std::byte* at = p.data();
  for (std::size_t b = 0; b < n; b += bucket) {
    const std::size_t len = std::min(bucket, n - b);
    const double u = q::read_scale(at) / static_cast<float>((1u << bits) - 1);
    for (std::size_t i = b; i < b + len; ++i) unit[i] = u;
    at += q::level_block_bytes(bits, len);
  }
  return unit;
}

TEST(Qsgd, UnbiasedWithinBernsteinBoundAndVarianceWithinThePapersBound) {
  const int T = 3000;
  const std::size_t n = 1000, bucket = 256;  // three full buckets and a partial one
  const std::vector<float> x = normal(n, 11);
  for (int bits : {1, 2, 4, 8}) {
    SCOPED_TRACE("bits " + std::to_string(bits));
    const std::string spec = "qsgd:bits=" + std::to_string(bits) + ",bucket=" + std::to_string(bucket);
    const Draws d = run_draws(spec, x, T);
    const std::vector<double> unit = level_units(d.first_payload, n, bits, bucket);
    // The scale is the bucket's L2 norm.
    for (std::size_t b = 0; b < n; b += bucket) {
      double ss = 0;
      for (std::size_t i = b; i < std::min(n, b + bucket); ++i) ss += static_cast<double>(x[i]) * x[i];
      EXPECT_NEAR(unit[b] * ((1 << bits) - 1), std::sqrt(ss), 1e-6 * std::sqrt(ss));
    }
    expect_unbiased(x, d, unit, T);
    const double expected = expected_sq_err(x, unit);
    expect_mean_sq_err(d, expected);
    // The paper's bound, bucket by bucket: E||Q(v) - v||^2 <= min(n/s^2, sqrt(n)/s) ||v||^2.
    double bound = 0;
    const double s = (1 << bits) - 1;
    for (std::size_t b = 0; b < n; b += bucket) {
      const double len = static_cast<double>(std::min(bucket, n - b));
      double ss = 0;
      for (std::size_t i = b; i < std::min(n, b + bucket); ++i) ss += static_cast<double>(x[i]) * x[i];
      bound += std::min(len / (s * s), std::sqrt(len) / s) * ss;
    }
    EXPECT_LE(expected, bound);
  }
}

TEST(Qsgd, VarianceBoundIsNearlyReachedByEqualMagnitudesAndHolds) {
  // |v_i| all equal, one level: E||Q(v) - v||^2 = (sqrt(n) - 1) ||v||^2, the
  // bound sqrt(n) ||v||^2: the measured error must sit under it.
  const std::size_t n = 256;
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = (i % 3 == 0) ? -0.5f : 0.5f;
  const Draws d = run_draws("qsgd:bits=1,bucket=256", x, 4000);
  const double norm2 = 0.25 * n;
  const double expected = (std::sqrt(static_cast<double>(n)) - 1) * norm2;
  expect_mean_sq_err(d, expected);
  const double mean = std::accumulate(d.sq_err.begin(), d.sq_err.end(), 0.0) / static_cast<double>(d.sq_err.size());
  EXPECT_LE(mean, std::sqrt(static_cast<double>(n)) * norm2);
}

TEST(Terngrad, TernaryUnbiasedWithTheMaxScale) {
  const int T = 3000;
  const std::size_t n = 700;
  const std::vector<float> x = normal(n, 12, 0.1f);
  const Draws d = run_draws("terngrad:bucket=512", x, T);
  const std::vector<double> unit = level_units(d.first_payload, n, 1, 512);
  EXPECT_EQ(d.first_payload.size(), (4 + 2 * 64) + (4 + 2 * 24u));
  for (std::size_t b : {0u, 512u}) {
    float mx = 0;
    for (std::size_t i = b; i < std::min(n, b + 512); ++i) mx = std::max(mx, std::fabs(x[i]));
    EXPECT_EQ(unit[b], mx);
  }
  expect_unbiased(x, d, unit, T);
  // E||Q - x||^2 = sum s|x_i| - x_i^2.
  double want = 0;
  for (std::size_t i = 0; i < n; ++i) want += unit[i] * std::fabs(x[i]) - static_cast<double>(x[i]) * x[i];
  expect_mean_sq_err(d, want);
  // Decoded values are 0 or +-scale.
  auto c = make("terngrad");
  auto st = state_for(*c, n);
  Payload p;
  ASSERT_TRUE(c->begin(*st, bytes_of(x), &p).ok());
  std::vector<float> out(n);
  ASSERT_TRUE(c->decode(*st, p.bytes, std::as_writable_bytes(std::span(out))).ok());
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_TRUE(out[i] == 0.0f || std::fabs(out[i]) == static_cast<float>(unit[i])) << i;
    if (out[i] != 0.0f) {
      EXPECT_EQ(std::signbit(out[i]), std::signbit(x[i])) << i;
    }
  }
}

TEST(Absmax, StochasticRoundingIsUnbiased) {
  const int T = 3000;
  const std::size_t n = 600;
  const std::vector<float> x = normal(n, 13);
  for (int bits : {8, 4}) {
    SCOPED_TRACE(bits);
    const std::string spec = std::string(bits == 8 ? "int8" : "int4") + ":block=128,stochastic=1";
    const Draws d = run_draws(spec, x, T);
    std::vector<double> unit(n);
    for (std::size_t b = 0, at = 0; b < n; b += 128) {
      const std::size_t len = std::min<std::size_t>(128, n - b);
      for (std::size_t i = b; i < b + len; ++i) unit[i] = q::read_scale(d.first_payload.data() + at);
      at += q::absmax_block_bytes(bits, len);
    }
    expect_unbiased(x, d, unit, T);
  }
}

TEST(Absmax, RoundToNearestErrorIsAtMostHalfAScale) {
  const std::size_t n = 5000;
  std::vector<float> x = normal(n, 14, 2.0f);
  x[100] = 0.0f;
  for (std::size_t i = 256; i < 512; ++i) x[i] = 0.0f;  // an all-zero block: scale 0, exact
  for (const char* spec : {"int8", "int4", "int8:block=1000", "int4:block=33"}) {
    SCOPED_TRACE(spec);
    auto c = make(spec);
    const std::size_t block = c->block_elems();
    const int bits = std::string(spec).starts_with("int8") ? 8 : 4;
    auto st = state_for(*c, n);
    Payload p;
    ASSERT_TRUE(c->begin(*st, bytes_of(x), &p).ok());
    EXPECT_EQ(p.aggregation, Aggregation::requantizable);
    ASSERT_EQ(p.bytes.size(), c->payload_bytes(n));
    std::vector<float> out(n);
    ASSERT_TRUE(c->decode(*st, p.bytes, std::as_writable_bytes(std::span(out))).ok());
    std::size_t at = 0;
    for (std::size_t b = 0; b < n; b += block) {
      const std::size_t len = std::min(block, n - b);
      const float scale = q::read_scale(p.bytes.data() + at);
      float mx = 0;
      for (std::size_t i = b; i < b + len; ++i) mx = std::max(mx, std::fabs(x[i]));
      EXPECT_FLOAT_EQ(scale, mx / (bits == 8 ? 127.0f : 7.0f));
      for (std::size_t i = b; i < b + len; ++i) {
        // scale / 2, plus the rounding of x / scale and of q * scale (a few ulps of max |x|).
        EXPECT_LE(std::fabs(out[i] - x[i]), 0.5 * scale + 4e-7 * mx) << i;
      }
      at += q::absmax_block_bytes(bits, len);
    }
    EXPECT_EQ(out[300], 0.0f);
  }
}

// ---------------------------------------------------------------- sign, signum

TEST(Sign, ScaleIsMeanAbsAndSignsAreKept) {
  for (DataType dt : {DataType::f32, DataType::f16, DataType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const std::size_t n = 50001;  // several f64 summing chunks and f16 pieces, a partial byte
    const std::vector<float> x = widen(typed(normal(n, 15), dt), dt);
    auto c = make("sign");
    auto st = state_for(*c, n, dt);
    Payload p;
    ASSERT_TRUE(c->begin(*st, typed(x, dt), &p).ok());
    EXPECT_EQ(p.aggregation, Aggregation::gather_only);
    ASSERT_EQ(p.bytes.size(), 4 + (n + 7) / 8);
    double mean_abs = 0;
    for (float v : x) mean_abs += std::fabs(v);
    mean_abs /= n;
    const float scale = q::read_scale(p.bytes.data());
    EXPECT_NEAR(scale, mean_abs, 1e-6 * mean_abs);
    std::vector<float> acc(n, 0.0f);
    ASSERT_TRUE(c->decode_add(*st, p.bytes, acc).ok());
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(acc[i], std::signbit(x[i]) ? -scale : scale) << i;
  }
}

TEST(Signum, SignOfMomentumAndTheMomentumIsSaved) {
  const std::size_t n = 1000;
  auto c = make("signum:beta=0.5");
  auto st = state_for(*c, n);
  const std::vector<float> g1 = normal(n, 16), g2 = normal(n, 17);
  Payload p;
  ASSERT_TRUE(c->begin(*st, bytes_of(g1), &p).ok());
  ASSERT_TRUE(c->begin(*st, bytes_of(g2), &p).ok());
  // m = 0.5 (0.5 * 0.5 g1) + 0.5 g2 (in f32 as the kernel rounds it).
  std::vector<float> m(n);
  double mean_abs = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float m1 = 0.5f * 0.0f + 0.5f * g1[i];
    m[i] = 0.5f * m1 + 0.5f * g2[i];
    mean_abs += std::fabs(m[i]);
  }
  mean_abs /= n;
  const float scale = q::read_scale(p.bytes.data());
  EXPECT_NEAR(scale, mean_abs, 1e-6 * mean_abs);
  std::vector<float> out(n);
  ASSERT_TRUE(c->decode(*st, p.bytes, std::as_writable_bytes(std::span(out))).ok());
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], std::signbit(m[i]) ? -scale : scale) << i;
  // The momentum is the state's body: a loaded state continues bitwise.
  std::vector<float> saved_m = saved_body_floats(*st, n);
  EXPECT_EQ(saved_m, m);
  std::vector<std::byte> saved;
  ASSERT_TRUE(st->save(&saved).ok());
  auto st2 = state_for(*c, n);
  ASSERT_TRUE(st2->load(saved).ok());
  Payload pa, pb;
  ASSERT_TRUE(c->begin(*st, bytes_of(g1), &pa).ok());
  ASSERT_TRUE(c->begin(*st2, bytes_of(g1), &pb).ok());
  EXPECT_EQ(pa.bytes, pb.bytes);
}

// ---------------------------------------------------------------- sizes, dtypes, determinism

std::size_t expected_bytes(const std::string& spec, std::size_t n) {
  const auto blocks = [n](std::size_t block, auto bytes) { return q::blocked_bytes(n, block, bytes); };
  if (spec == "qsgd") return blocks(512, [](std::size_t k) { return q::level_block_bytes(4, k); });
  if (spec == "qsgd:bits=8,bucket=100") return blocks(100, [](std::size_t k) { return q::level_block_bytes(8, k); });
  if (spec == "terngrad") return blocks(512, [](std::size_t k) { return q::level_block_bytes(1, k); });
  if (spec == "int8") return blocks(256, [](std::size_t k) { return q::absmax_block_bytes(8, k); });
  if (spec == "int4:stochastic=1") return blocks(256, [](std::size_t k) { return q::absmax_block_bytes(4, k); });
  return q::sign_bytes(n);  // sign, signum
}

TEST(QuantCompressors, SizesAndShapesForEveryDtype) {
  for (const char* spec : {"qsgd", "qsgd:bits=8,bucket=100", "terngrad", "int8", "int4:stochastic=1", "sign", "signum"}) {
    auto c = make(spec);
    for (DataType dt : {DataType::f32, DataType::f16, DataType::bf16}) {
      for (std::size_t n : {0u, 1u, 9u, 256u, 1000u, 20000u}) {
        SCOPED_TRACE(std::string(spec) + " " + dtype_name(dt) + " n=" + std::to_string(n));
        const std::vector<float> x = widen(typed(normal(n, 18), dt), dt);
        auto st = state_for(*c, n, dt);
        Payload p;
        ASSERT_TRUE(c->begin(*st, typed(x, dt), &p).ok());
        EXPECT_EQ(p.bytes.size(), expected_bytes(spec, n));
        EXPECT_TRUE(p.last);
        if (p.aggregation == Aggregation::requantizable) {
          EXPECT_EQ(p.bytes.size(), c->payload_bytes(n));
        }
        std::vector<std::byte> out(n * dtype_size(dt));
        ASSERT_TRUE(c->decode(*st, p.bytes, out).ok());
        // The f16/bf16 input gives the payload of its f32 widening.
        auto c32 = make(spec);
        auto s32 = state_for(*c32, n);
        Payload p32;
        ASSERT_TRUE(c32->begin(*s32, bytes_of(x), &p32).ok());
        EXPECT_EQ(p.bytes, p32.bytes);
        std::vector<std::span<const std::byte>> agg{p.bytes};
        std::vector<std::byte> fin(n * dtype_size(dt));
        ASSERT_TRUE(c->finish(*st, agg, fin).ok());
        EXPECT_EQ(fin, out);
        std::vector<std::byte> wrong(p.bytes.size() + 1);
        std::vector<float> acc(n);
        EXPECT_THAT(c->decode_add(*st, wrong, acc).message(), HasSubstr("payload is"));
      }
    }
  }
}

TEST(QuantCompressors, SeededRerunsAreDeterministicAndStepsDrawAfresh) {
  const std::vector<float> x = normal(3000, 19);
  for (const char* spec : {"qsgd:bits=2", "terngrad", "int8:stochastic=1"}) {
    SCOPED_TRACE(spec);
    auto c = make(spec);
    auto a = state_for(*c, x.size()), b = state_for(*c, x.size());
    Payload pa, pb, pa2;
    ASSERT_TRUE(c->begin(*a, bytes_of(x), &pa).ok());
    ASSERT_TRUE(c->begin(*b, bytes_of(x), &pb).ok());
    EXPECT_EQ(pa.bytes, pb.bytes);
    ASSERT_TRUE(c->begin(*a, bytes_of(x), &pa2).ok());
    EXPECT_NE(pa.bytes, pa2.bytes);
    const std::string sp = spec;
    auto other = make(sp + (sp.find(':') == std::string::npos ? ":" : ",") + "seed=5");
    auto so = state_for(*other, x.size());
    Payload po;
    ASSERT_TRUE(other->begin(*so, bytes_of(x), &po).ok());
    EXPECT_NE(po.bytes, pb.bytes);
  }
}

// ---------------------------------------------------------------- requantizable aggregation by hand

TEST(QuantCompressors, ThreeRanksDecodeAddReencodeByChunks) {
  // What scatter-reduce-allgather does: chunk owners decode every rank's
  // chunk, add, and encode the sum once; the chunks concatenate to the
  // whole re-encoded payload that finish() decodes on every rank.
  const std::size_t n = 2500;
  for (const char* spec : {"int8:block=64", "qsgd:bits=4,bucket=128", "terngrad:bucket=100", "int4:stochastic=1"}) {
    SCOPED_TRACE(spec);
    auto c = make(spec);
    const std::size_t block = c->block_elems();
    std::vector<std::unique_ptr<CompressorState>> st;
    std::vector<Payload> pay(3);
    std::vector<float> dense_sum(n, 0.0f);
    for (int r = 0; r < 3; ++r) {
      st.push_back(state_for(*c, n));
      const std::vector<float> g = normal(n, 30 + static_cast<std::uint32_t>(r));
      ASSERT_TRUE(c->begin(*st.back(), bytes_of(g), &pay[static_cast<std::size_t>(r)]).ok());
    }
    // The decoded sum, independently: decode each payload whole and add in rank order.
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(c->decode_add(*st[static_cast<std::size_t>(r)], pay[static_cast<std::size_t>(r)].bytes, dense_sum).ok());
    }
    // Chunks of 3 blocks (the last partial), owned round-robin.
    const std::size_t chunk = 3 * block;
    std::vector<std::byte> reduced(c->payload_bytes(n));
    for (std::size_t a = 0, owner = 0; a < n; a += chunk, owner = (owner + 1) % 3) {
      const std::size_t b = std::min(n, a + chunk);
      const std::size_t pa = c->payload_bytes(a), pbytes = c->payload_bytes(b) - pa;
      std::vector<float> acc(b - a, 0.0f);
      for (int r = 0; r < 3; ++r) {
        std::span<const std::byte> part(pay[static_cast<std::size_t>(r)].bytes.data() + pa, pbytes);
        ASSERT_TRUE(c->decode_chunk_add(*st[owner], part, a, acc).ok());
      }
      for (std::size_t i = a; i < b; ++i) ASSERT_EQ(acc[i - a], dense_sum[i]) << i;  // same order, same sum
      ASSERT_TRUE(c->encode_chunk(*st[owner], acc, a, std::span(reduced).subspan(pa, pbytes)).ok());
    }
    // Every rank finishes on the same bytes; the result is the decoded re-encoding.
    std::vector<std::span<const std::byte>> agg{reduced};
    std::vector<std::vector<float>> outs(3, std::vector<float>(n));
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(c->finish(*st[static_cast<std::size_t>(r)], agg,
                            std::as_writable_bytes(std::span(outs[static_cast<std::size_t>(r)])))
                      .ok());
    }
    EXPECT_EQ(outs[0], outs[1]);
    EXPECT_EQ(outs[0], outs[2]);
    // Re-encoding is one more quantisation of dense_sum: within one unit per element.
    std::size_t at = 0;
    const int bits = std::string(spec).starts_with("qsgd") ? 4 : 1;
    for (std::size_t b = 0; b < n; b += block) {
      const std::size_t len = std::min(block, n - b);
      const float scale = q::read_scale(reduced.data() + at);
      double unit = scale;
      if (std::string(spec).starts_with("qsgd") || std::string(spec).starts_with("terngrad")) {
        unit = scale / ((1 << bits) - 1);
        at += q::level_block_bytes(bits, len);
      } else {
        at += q::absmax_block_bytes(std::string(spec).starts_with("int8") ? 8 : 4, len);
      }
      for (std::size_t i = b; i < b + len; ++i) ASSERT_LE(std::fabs(outs[0][i] - dense_sum[i]), unit * (1 + 1e-5)) << i;
    }
    // Encoding the whole sum at once gives the same bytes as by chunks.
    std::vector<std::byte> whole(reduced.size());
    ASSERT_TRUE(c->encode_chunk(*st[0], dense_sum, 0, whole).ok());
    EXPECT_EQ(whole, reduced);
    // A chunk off a block boundary, or of the wrong payload size, is refused.
    std::vector<float> some(block);
    std::vector<std::byte> buf(c->payload_bytes(block));
    EXPECT_THAT(c->encode_chunk(*st[0], some, 1, buf).message(), HasSubstr("not on block boundaries"));
    EXPECT_THAT(c->decode_chunk_add(*st[0], std::span(buf).first(buf.size() - 1), 0, some).message(),
                HasSubstr("chunk payload is"));
  }
}

TEST(QuantCompressors, ErrorFeedbackWrapsThem) {
  // ef+ feeds f32 and keeps the residual: sent + residual == gradient.
  for (const char* spec : {"ef+qsgd:bits=2", "ef+int4", "ef+sign", "ef+terngrad"}) {
    SCOPED_TRACE(spec);
    auto c = make(spec);
    const std::size_t n = 777;
    auto st = state_for(*c, n, DataType::bf16);
    const std::vector<float> g = widen(typed(normal(n, 20), DataType::bf16), DataType::bf16);
    Payload p;
    ASSERT_TRUE(c->begin(*st, typed(g, DataType::bf16), &p).ok());
    std::vector<float> sent(n, 0.0f);
    ASSERT_TRUE(c->decode_add(*st, p.bytes, sent).ok());
    const std::vector<float> e = saved_body_floats(*st, n);
    for (std::size_t i = 0; i < n; ++i) ASSERT_NEAR(sent[i] + e[i], g[i], 1e-6 * (std::fabs(g[i]) + 1)) << i;
  }
}

// ---------------------------------------------------------------- bad parameters

TEST(QuantCompressors, BadParametersNameTheSpecAndTheProblem) {
  const std::pair<const char*, const char*> cases[] = {
      {"qsgd:bits=0", "compressor spec 'qsgd:bits=0': bits=0 is out of range [1, 8]"},
      {"qsgd:bits=9", "compressor spec 'qsgd:bits=9': bits=9 is out of range [1, 8]"},
      {"qsgd:bits=x", "bits=x is not an integer"},
      {"qsgd:bucket=0", "bucket=0 is out of range [1, 16777216]"},
      {"qsgd:ratio=0.1", "compressor spec 'qsgd:ratio=0.1': unknown parameter 'ratio' for qsgd"},
      {"terngrad:bits=2", "unknown parameter 'bits' for terngrad"},
      {"int8:block=-4", "block=-4 is out of range"},
      {"int4:stochastic=2", "stochastic=2 is not 0, 1, true or false"},
      {"signum:beta=1", "compressor spec 'signum:beta=1': beta must be in [0, 1), got 1"},
      {"sign:beta=0.5", "unknown parameter 'beta' for sign"},
  };
  for (const auto& [spec, want] : cases) {
    std::unique_ptr<Compressor> c;
    const Status s = make_compressor(spec, &c);
    EXPECT_EQ(s.code(), Result::invalid_argument) << spec;
    EXPECT_THAT(s.message(), HasSubstr(want)) << spec;
  }
  auto c = make("int8");
  std::unique_ptr<CompressorState> st;
  EXPECT_THAT(c->make_state(TensorDesc{10, DataType::i32, 0, 0}, &st).message(), HasSubstr("dtype i32 is not supported"));
}

}  // namespace
}  // namespace cclz::test
