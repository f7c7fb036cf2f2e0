// Sparsifiers: top-k against an nth_element reference (ties to the lower
// index), contraction, the sampled threshold's band, random-k's shared
// indices, threshold, and DGC against a direct transcription of the paper.
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "helpers.hpp"

namespace cclz::test {
namespace {

// Decoded payload (f32 tensor of n) of one begin().
std::vector<float> encode_decode(const Compressor& c, CompressorState& st, const std::vector<float>& x,
                                 Payload* p = nullptr) {
  Payload local;
  Payload& pay = p != nullptr ? *p : local;
  EXPECT_TRUE(c.begin(st, bytes_of(x), &pay).ok());
  std::vector<float> d(x.size());
  const Status s = c.decode(st, pay.bytes, std::as_writable_bytes(std::span(d)));
  EXPECT_TRUE(s.ok()) << s.to_string();
  return d;
}

// The reference: the k largest |x| by nth_element, ties at the k-th
// magnitude going to the lowest indices.
std::vector<std::uint32_t> reference_topk(const std::vector<float>& x, std::size_t k) {
  std::vector<std::uint32_t> idx;
  if (k == 0) return idx;
  std::vector<float> mags(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) mags[i] = std::fabs(x[i]);
  std::nth_element(mags.begin(), mags.begin() + static_cast<std::ptrdiff_t>(k - 1), mags.end(), std::greater<>());
  const float kth = mags[k - 1];
  std::size_t above = 0;
  for (float m : x) above += std::fabs(m) > kth;
  std::size_t ties = k - above;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float m = std::fabs(x[i]);
    if (m > kth || (m == kth && ties > 0)) {
      if (m == kth) --ties;
      idx.push_back(static_cast<std::uint32_t>(i));
    }
  }
  return idx;
}

std::vector<std::uint32_t> payload_indices(const Payload& p, std::size_t value_size) {
  const std::size_t k = p.bytes.size() / (4 + value_size);
  std::vector<std::uint32_t> idx(k);
  if (k != 0) std::memcpy(idx.data(), p.bytes.data(), 4 * k);
  return idx;
}

std::vector<float> ties_data(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> d(-3, 3);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(d(gen)) * 0.25f;
  return v;
}

TEST(Topk, ExactAgreesWithNthElementIncludingTies) {
  // 2^21 + 5: large enough that the prefiltered select runs at ratio 0.01
  // (and falls back on the tied data); the smaller sizes prefilter only at
  // the larger ratios.
  for (std::size_t n : {1u, 2u, 7u, 1000u, 100003u, (1u << 21) + 5u}) {
    for (int data = 0; data < 3; ++data) {
      std::vector<float> x = data == 0   ? normal(n, 11 + static_cast<std::uint32_t>(n))
                             : data == 1 ? ties_data(n, 5)
                                         : std::vector<float>(n, -1.5f);  // all tied
      if (data == 0 && n > 10) {
        x[3] = std::numeric_limits<float>::infinity();
        x[4] = -0.0f;
        x[5] = 1e-42f;  // subnormal
      }
      for (double ratio : {1e-5, 0.01, 0.3, 0.5, 0.999, 1.0}) {
        const std::size_t k = std::min(n, std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(ratio * n))));
        auto c = make("topk:ratio=" + std::to_string(ratio));
        auto st = state_for(*c, n);
        Payload p;
        const std::vector<float> d = encode_decode(*c, *st, x, &p);
        const std::vector<std::uint32_t> got = payload_indices(p, 4);
        const std::vector<std::uint32_t> want = reference_topk(x, k);
        ASSERT_EQ(got, want) << "n " << n << " data " << data << " ratio " << ratio;
        for (std::size_t j = 0; j < got.size(); ++j) {  // payload values: x's bits; decoded: x's value
          EXPECT_EQ(std::memcmp(p.bytes.data() + 4 * got.size() + 4 * j, &x[got[j]], 4), 0);
          EXPECT_EQ(d[got[j]], x[got[j]]);
        }
      }
    }
  }
}

TEST(Topk, IsContractive) {
  // ||C(x) - x||^2 <= (1 - k/n) ||x||^2, exact top-k and sampled.
  for (const char* approx : {"0", "1"}) {
    for (double ratio : {0.001, 0.01, 0.1, 0.5}) {
      const std::size_t n = 200000;
      auto c = make("topk:ratio=" + std::to_string(ratio) + ",approx=" + approx);
      auto st = state_for(*c, n);
      const std::vector<float> x = normal(n, 3);
      Payload p;
      const std::vector<float> d = encode_decode(*c, *st, x, &p);
      const double k = static_cast<double>(p.bytes.size() / 8);
      double err = 0, norm = 0;
      for (std::size_t i = 0; i < n; ++i) {
        err += (double{d[i]} - x[i]) * (double{d[i]} - x[i]);
        norm += double{x[i]} * x[i];
      }
      EXPECT_LE(err, (1.0 - k / n) * norm) << ratio << " approx " << approx;
    }
  }
}

TEST(Topk, SampledCountStaysInBandAndIsATopSet) {
  // Band: [ceil(0.8 k), floor(1.3 k)]. The selection is always every
  // element at or above some magnitude.
  int accepted_estimates = 0;
  for (std::uint32_t seed = 0; seed < 6; ++seed) {
    for (double ratio : {0.001, 0.01, 0.05}) {
      for (int data = 0; data < 2; ++data) {
        const std::size_t n = 1 << 20;
        std::vector<float> x = data == 0 ? normal(n, seed) : ties_data(n, seed);
        if (data == 0) {  // heavy tail
          for (std::size_t i = 0; i < n; i += 97) x[i] *= 50.0f;
        }
        auto c = make("topk:approx=1,seed=" + std::to_string(seed) + ",ratio=" + std::to_string(ratio));
        auto st = state_for(*c, n);
        Payload p;
        encode_decode(*c, *st, x, &p);
        const std::vector<std::uint32_t> idx = payload_indices(p, 4);
        const std::size_t k = static_cast<std::size_t>(std::ceil(ratio * n));
        EXPECT_GE(idx.size(), (8 * k + 9) / 10) << ratio;
        EXPECT_LE(idx.size(), 13 * k / 10) << ratio;
        accepted_estimates += idx.size() != k;
        EXPECT_TRUE(std::is_sorted(idx.begin(), idx.end()));
        std::vector<bool> in(n, false);
        float min_in = std::numeric_limits<float>::infinity(), max_out = 0;
        for (std::uint32_t i : idx) in[i] = true;
        for (std::size_t i = 0; i < n; ++i) {
          if (in[i]) {
            min_in = std::min(min_in, std::fabs(x[i]));
          } else {
            max_out = std::max(max_out, std::fabs(x[i]));
          }
        }
        EXPECT_GE(min_in, max_out);
      }
    }
  }
  // The sampled estimate itself is used on normal data (not only the exact fallback).
  EXPECT_GT(accepted_estimates, 10);
}

TEST(Topk, NanIsSelectedFirst) {
  std::vector<float> x = normal(1000, 1);
  x[17] = std::numeric_limits<float>::quiet_NaN();
  auto c = make("topk:ratio=0.001");
  auto st = state_for(*c, x.size());
  Payload p;
  encode_decode(*c, *st, x, &p);
  EXPECT_EQ(payload_indices(p, 4), std::vector<std::uint32_t>{17});
}

TEST(Threshold, KeepsExactlyTheLargeOnes) {
  const std::vector<float> x = normal(50000, 9);
  auto c = make("threshold:tau=1.5");
  auto st = state_for(*c, x.size());
  Payload p;
  const std::vector<float> d = encode_decode(*c, *st, x, &p);
  EXPECT_EQ(p.aggregation, Aggregation::gather_only);
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::fabs(x[i]) >= 1.5f) {
      EXPECT_EQ(d[i], x[i]);
    } else {
      EXPECT_EQ(d[i], 0.0f);
    }
  }
  EXPECT_GT(p.bytes.size(), 0u);
}

TEST(Randk, SameIndicesOnEveryRankPerStepAndNewOnesNextStep) {
  const std::size_t n = 10000;
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i + 1);
  // Two "ranks" with their own compressor and state, same spec.
  auto c0 = make("randk:ratio=0.05,seed=7");
  auto c1 = make("randk:ratio=0.05,seed=7");
  auto other_seed = make("randk:ratio=0.05,seed=8");
  auto s0 = state_for(*c0, n), s1 = state_for(*c1, n), s2 = state_for(*other_seed, n);
  std::set<std::vector<std::uint32_t>> seen;
  for (int step = 0; step < 5; ++step) {
    const auto i0 = nonzero(encode_decode(*c0, *s0, x));
    const auto i1 = nonzero(encode_decode(*c1, *s1, x));
    const auto i2 = nonzero(encode_decode(*other_seed, *s2, x));
    EXPECT_EQ(i0.size(), 500u);
    EXPECT_EQ(i0, i1);
    EXPECT_NE(i0, i2);
    EXPECT_TRUE(seen.insert(i0).second) << "step " << step << " repeated an earlier step's indices";
  }
  // Values are summable: rank 0's payload + rank 1's decodes to the sum.
  Payload p0, p1;
  ASSERT_TRUE(c0->begin(*s0, bytes_of(x), &p0).ok());
  ASSERT_TRUE(c1->begin(*s1, bytes_of(x), &p1).ok());
  EXPECT_EQ(p0.aggregation, Aggregation::summable);
  EXPECT_EQ(p0.sum_dtype, DataType::f32);
  EXPECT_EQ(p0.bytes.size(), 500u * 4);
}

TEST(Randk, EveryIndexEquallyLikely) {
  // n = 100, k = 10, 4000 steps: each index is drawn 400 times on average,
  // standard deviation sqrt(4000 * 0.1 * 0.9) = 19; allow 6 of them.
  const std::size_t n = 100;
  std::vector<float> x(n, 1.0f);
  auto c = make("randk:ratio=0.1");
  auto st = state_for(*c, n);
  std::vector<int> hits(n, 0);
  for (int step = 0; step < 4000; ++step) {
    for (std::uint32_t i : nonzero(encode_decode(*c, *st, x))) ++hits[i];
  }
  for (std::size_t i = 0; i < n; ++i) EXPECT_NEAR(hits[i], 400, 6 * 19) << i;
}

// DGC as the paper writes it, for tensors small enough that the selection
// is exact top-k (the sample would be a quarter of the tensor or more).
struct DgcReference {
  std::vector<float> u, v;
  float m, clip;
  std::vector<float> step(const std::vector<float>& g, std::size_t k) {
    const std::size_t n = g.size();
    if (u.empty()) u.assign(n, 0.0f), v.assign(n, 0.0f);
    double ss = 0;
    for (float x : g) ss += double{x} * x;
    float scale = 1.0f;
    if (clip > 0 && std::sqrt(ss) > clip) scale = static_cast<float>(clip / std::sqrt(ss));
    for (std::size_t i = 0; i < n; ++i) {
      u[i] = m * u[i] + scale * g[i];
      v[i] += u[i];
    }
    std::vector<float> sent(n, 0.0f);
    for (std::uint32_t i : reference_topk(v, k)) {
      sent[i] = v[i];
      v[i] = 0.0f;
      u[i] = 0.0f;
    }
    return sent;
  }
};

TEST(Dgc, MatchesThePaperStepByStep) {
  const std::size_t n = 64;
  auto c = make("dgc:ratio=0.05,momentum=0.7,clip=3,warmup=0");
  auto st = state_for(*c, n);
  DgcReference ref{{}, {}, 0.7f, 3.0f};
  for (int step = 0; step < 20; ++step) {
    const std::vector<float> g = normal(n, 100 + static_cast<std::uint32_t>(step));
    const std::vector<float> got = encode_decode(*c, *st, g);
    const std::vector<float> want = ref.step(g, 4);  // ceil(0.05 * 64)
    ASSERT_EQ(got, want) << "step " << step;
  }
}

TEST(Dgc, WarmupScheduleAndCountBand) {
  // warmup 8: steps 1-2 25%, 3-4 6.25%, 5-6 1.5625%, 7-8 0.4%, then 0.1%.
  const std::size_t n = 1 << 20;
  const double density[] = {0.25, 0.25, 0.0625, 0.0625, 0.015625, 0.015625, 0.004, 0.004, 0.001, 0.001};
  auto c = make("dgc:ratio=0.001,warmup=8");
  auto st = state_for(*c, n);
  for (int step = 0; step < 10; ++step) {
    const std::vector<float> g = normal(n, 40 + static_cast<std::uint32_t>(step));
    Payload p;
    ASSERT_TRUE(c->begin(*st, bytes_of(g), &p).ok());
    const std::size_t got = p.bytes.size() / 8;  // u32 index + f32 value
    const auto k = static_cast<std::size_t>(std::ceil(density[step] * n));
    EXPECT_GE(got, (8 * k + 9) / 10) << "step " << step + 1;
    EXPECT_LE(got, 13 * k / 10) << "step " << step + 1;
  }
  // A ratio above a stage's density wins over it.
  auto wide = make("dgc:ratio=0.1,warmup=8");
  auto ws = state_for(*wide, 1000);
  const std::vector<float> g = normal(1000, 1);
  for (int step = 0; step < 10; ++step) {
    Payload p;
    ASSERT_TRUE(wide->begin(*ws, bytes_of(g), &p).ok());
    EXPECT_EQ(p.bytes.size() / 8, step < 4 ? (step < 2 ? 250u : 100u) : 100u) << step;
  }
}

}  // namespace
}  // namespace cclz::test
