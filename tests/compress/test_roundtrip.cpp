// decode(encode(x)) for every compressor and dtype: payload sizes, the
// declared aggregation, output sizes and values; finish() over several
// simulated ranks equals the sum of each rank's decoded payload; a saved
// state loads into a fresh one and the next step is bitwise the same.
#include <gmock/gmock.h>

#include <cmath>

#include "helpers.hpp"

namespace cclz::test {
namespace {

const char* const kSpecs[] = {
    "none",           "fp16", "bf16", "topk:ratio=0.1", "topk:ratio=0.1,approx=1", "randk:ratio=0.1",
    "threshold:tau=0.5", "dgc:ratio=0.1,warmup=0", "ef+topk:ratio=0.1", "ef+fp16", "ef21+randk:ratio=0.2",
    "ef21+topk:ratio=0.05",
};
constexpr DataType kDtypes[] = {DataType::f32, DataType::f16, DataType::bf16};

// Payload bytes the format documents for x, or SIZE_MAX when data dependent.
std::size_t expected_payload(const std::string& spec, DataType dt, const std::vector<float>& x) {
  const std::size_t n = x.size();
  const bool ef = spec.starts_with("ef");
  const std::size_t vs = ef ? 4 : dtype_size(dt);  // ef feeds its compressor f32
  const auto k = [&](double r) { return n == 0 ? 0 : std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(r * n))); };
  if (spec == "none") return n * dtype_size(dt);
  if (spec.ends_with("fp16") || spec == "bf16") return n * 2;
  if (spec == "topk:ratio=0.1" || spec == "ef+topk:ratio=0.1") return k(0.1) * (4 + vs);
  if (spec == "randk:ratio=0.1") return k(0.1) * 4;
  if (spec == "ef21+randk:ratio=0.2") return k(0.2) * 4;
  if (spec == "ef21+topk:ratio=0.05") return k(0.05) * (4 + vs);
  if (spec == "dgc:ratio=0.1,warmup=0") return k(0.1) * 8;
  if (spec == "threshold:tau=0.5") {
    std::size_t c = 0;
    for (float v : x) c += std::fabs(v) >= 0.5f;
    return c * (4 + vs);
  }
  return SIZE_MAX;
}

TEST(RoundTrip, EveryCompressorEveryDtype) {
  for (const char* spec : kSpecs) {
    auto c = make(spec);
    for (DataType dt : kDtypes) {
      for (std::size_t n : {0u, 1u, 5u, 1000u}) {
        SCOPED_TRACE(std::string(spec) + " " + dtype_name(dt) + " n=" + std::to_string(n));
        const std::vector<float> x = widen(typed(normal(n, 2), dt), dt);  // representable in dt
        const std::vector<std::byte> xb = typed(x, dt);
        auto st = state_for(*c, n, dt);
        Payload p;
        ASSERT_TRUE(c->begin(*st, xb, &p).ok());
        EXPECT_TRUE(p.last);
        EXPECT_EQ(p.round, 0);
        EXPECT_EQ(p.aggregation, c->aggregation());
        if (p.aggregation == Aggregation::summable) {
          EXPECT_EQ(p.bytes.size() % dtype_size(p.sum_dtype), 0u);
        }
        const std::size_t want = expected_payload(spec, dt, x);
        if (want != SIZE_MAX) {
          EXPECT_EQ(p.bytes.size(), want);
        }
        EXPECT_EQ(st->wire().last_payload_bytes, p.bytes.size());
        EXPECT_EQ(st->wire().last_dense_bytes, n * dtype_size(dt));
        EXPECT_EQ(st->step(), 1u);

        std::vector<std::byte> out(n * dtype_size(dt));
        ASSERT_TRUE(c->decode(*st, p.bytes, out).ok());
        const std::vector<float> d = widen(out, dt);
        std::vector<float> dec(n, 0.0f), acc(n, 1.0f);
        ASSERT_TRUE(c->decode_add(*st, p.bytes, dec).ok());
        ASSERT_TRUE(c->decode_add(*st, p.bytes, acc, 2.0f).ok());
        const std::vector<float> dec_in_dt = widen(typed(dec, dt), dt);
        for (std::size_t i = 0; i < n; ++i) {
          EXPECT_EQ(acc[i], 1.0f + 2.0f * dec[i]);  // decode_add: acc += alpha * decoded
          EXPECT_EQ(d[i], dec_in_dt[i]);            // decode: the same, rounded once to dt
          if (std::string(spec) == "none") {
            EXPECT_EQ(d[i], x[i]);
          }
          if (std::string(spec) == "fp16" || std::string(spec) == "bf16") {
            EXPECT_NEAR(d[i], x[i], (std::string(spec) == "fp16" ? 1e-3 : 8e-3) * std::fabs(x[i]) + 1e-7);
          }
          // Sparsifiers send x itself where they send anything.
          if (std::string(spec).starts_with("topk") || std::string(spec).starts_with("threshold") ||
              std::string(spec).starts_with("randk")) {
            EXPECT_TRUE(d[i] == 0.0f || d[i] == x[i]) << i;
          }
        }
        // One rank: finish over its own payload is its decoding.
        std::vector<std::span<const std::byte>> agg{p.bytes};
        std::vector<std::byte> fin(n * dtype_size(dt));
        ASSERT_TRUE(c->finish(*st, agg, fin).ok());
        EXPECT_EQ(fin, out);
      }
    }
  }
}

TEST(RoundTrip, FinishOverRanksIsTheSumOfDecodedPayloadsOnEveryRank) {
  // Gather-only payloads are summed in rank order, summable ones by the
  // (simulated) all-reduce; every rank ends with bitwise the same tensor.
  for (const char* spec : kSpecs) {
    if (std::string(spec).starts_with("ef21")) continue;  // outputs the running estimate, tested in test_feedback
    for (int nranks : {1, 2, 3, 5}) {
      SCOPED_TRACE(std::string(spec) + " ranks " + std::to_string(nranks));
      auto c = make(spec);
      const std::size_t n = 777;
      std::vector<std::unique_ptr<CompressorState>> states;
      std::vector<std::vector<std::byte>> grads;
      for (int r = 0; r < nranks; ++r) {
        states.push_back(state_for(*c, n));
        grads.push_back(typed(normal(n, 50 + static_cast<std::uint32_t>(r)), DataType::f32));
      }
      const Step s = run_step(*c, states, grads);
      std::vector<float> want(n, 0.0f);
      for (int r = 0; r < nranks; ++r) {
        std::vector<float> d(n, 0.0f);
        ASSERT_TRUE(c->decode_add(*states[static_cast<std::size_t>(r)], s.payloads[static_cast<std::size_t>(r)].bytes, d).ok());
        for (std::size_t i = 0; i < n; ++i) want[i] += d[i];
      }
      for (int r = 0; r < nranks; ++r) {
        EXPECT_EQ(s.outs[static_cast<std::size_t>(r)], s.outs[0]);
        const std::vector<float> got = widen(s.outs[static_cast<std::size_t>(r)], DataType::f32);
        for (std::size_t i = 0; i < n; ++i) {
          // Summable casts are summed in their 16-bit dtype: allow its rounding.
          // (one rounding per rank: 2^-11 relative for f16, 2^-8 for bf16).
          const std::string sp = spec;
          const double rel = sp.ends_with("fp16") ? 1e-3 : sp.ends_with("bf16") ? 8e-3 : 1e-6;
          EXPECT_NEAR(got[i], want[i], rel * nranks * (std::fabs(want[i]) + 1));
        }
      }
    }
  }
}

TEST(RoundTrip, SavedStateLoadsAndContinuesBitwise) {
  for (const char* spec : kSpecs) {
    for (DataType dt : {DataType::f32, DataType::bf16}) {
      SCOPED_TRACE(std::string(spec) + " " + dtype_name(dt));
      auto c = make(spec);
      const std::size_t n = 3000;
      auto a = state_for(*c, n, dt);
      for (int step = 0; step < 3; ++step) {
        Payload p;
        const auto g = typed(normal(n, 60 + static_cast<std::uint32_t>(step)), dt);
        ASSERT_TRUE(c->begin(*a, g, &p).ok());
        std::vector<std::span<const std::byte>> agg{p.bytes};
        std::vector<std::byte> out(g.size());
        ASSERT_TRUE(c->finish(*a, agg, out).ok());
      }
      std::vector<std::byte> saved;
      ASSERT_TRUE(a->save(&saved).ok());
      auto c2 = make(spec);  // a fresh compressor, as after a restart
      auto b = state_for(*c2, n, dt);
      const Status ls = b->load(saved);
      ASSERT_TRUE(ls.ok()) << ls.to_string();
      EXPECT_EQ(b->step(), 3u);
      const auto g = typed(normal(n, 99), dt);
      Payload pa, pb;
      ASSERT_TRUE(c->begin(*a, g, &pa).ok());
      ASSERT_TRUE(c2->begin(*b, g, &pb).ok());
      EXPECT_EQ(pa.bytes, pb.bytes);
      std::vector<std::span<const std::byte>> aa{pa.bytes}, ab{pb.bytes};
      std::vector<std::byte> oa(g.size()), ob(g.size());
      ASSERT_TRUE(c->finish(*a, aa, oa).ok());
      ASSERT_TRUE(c2->finish(*b, ab, ob).ok());
      EXPECT_EQ(oa, ob);
      std::vector<std::byte> sa, sb;
      ASSERT_TRUE(a->save(&sa).ok());
      ASSERT_TRUE(b->save(&sb).ok());
      EXPECT_EQ(sa, sb);
    }
  }
}

TEST(RoundTrip, LoadRejectsAMismatchedOrDamagedState) {
  using ::testing::HasSubstr;
  auto topk = make("ef+topk:ratio=0.1");
  auto st = state_for(*topk, 100);
  std::vector<std::byte> saved;
  ASSERT_TRUE(st->save(&saved).ok());

  auto randk = make("ef+randk");
  auto other = state_for(*randk, 100);
  EXPECT_THAT(other->load(saved).message(), HasSubstr("saved state is for compressor 'ef+topk', not 'ef+randk'"));
  auto bigger = state_for(*topk, 101);
  EXPECT_THAT(bigger->load(saved).message(), HasSubstr("saved state is for a tensor of 100 f32 (0x0), this one has 101 f32"));
  auto half = state_for(*topk, 100, DataType::f16);
  EXPECT_THAT(half->load(saved).message(), HasSubstr("this one has 100 f16"));
  std::vector<std::byte> cut(saved.begin(), saved.end() - 3);
  EXPECT_THAT(st->load(cut).message(), HasSubstr("saved state body is"));
  std::vector<std::byte> junk = saved;
  junk[0] = std::byte{'X'};
  EXPECT_THAT(st->load(junk).message(), HasSubstr("does not start with 'CZS1'"));
  EXPECT_THAT(st->load(std::span(saved).first(10)).message(), HasSubstr("saved state truncated"));
  auto plain = make("topk:ratio=0.1");
  auto ps = state_for(*plain, 100);
  std::vector<std::byte> ps_saved;
  ASSERT_TRUE(ps->save(&ps_saved).ok());
  ps_saved.push_back(std::byte{0});
  std::memcpy(ps_saved.data() + ps_saved.size() - 9, "\x01\0\0\0\0\0\0\0", 8);  // body length 1
  EXPECT_THAT(ps->load(ps_saved).message(), HasSubstr("has a body this compressor does not keep"));
}

}  // namespace
}  // namespace cclz::test
