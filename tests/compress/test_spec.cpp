// Spec grammar and every error path of making a compressor or a state: the
// message must quote the whole spec and name the problem.
#include <gmock/gmock.h>

#include "helpers.hpp"

namespace cclz::test {
namespace {

using ::testing::HasSubstr;

TEST(CompressSpec, ParsesPrefixesNameAndParams) {
  CompressorSpec s;
  ASSERT_TRUE(parse_compressor_spec("auto:ef21+topk:ratio=0.01,approx=1", &s).ok());
  EXPECT_TRUE(s.auto_select);
  EXPECT_EQ(s.feedback, Feedback::ef21);
  EXPECT_EQ(s.name, "topk");
  ASSERT_EQ(s.params.size(), 2u);
  EXPECT_EQ(s.params[0].first, "ratio");
  EXPECT_EQ(s.params[0].second, "0.01");
  ASSERT_NE(s.find("approx"), nullptr);
  EXPECT_EQ(*s.find("approx"), "1");
  EXPECT_EQ(s.find("seed"), nullptr);

  ASSERT_TRUE(parse_compressor_spec("ef+fp16", &s).ok());
  EXPECT_FALSE(s.auto_select);
  EXPECT_EQ(s.feedback, Feedback::ef);
  EXPECT_EQ(s.name, "fp16");
  EXPECT_TRUE(s.params.empty());
}

TEST(CompressSpec, MakesEveryBuiltinWithDefaults) {
  for (const char* spec : {"none", "fp16", "bf16", "topk", "topk:ratio=0.5,approx=1,seed=3", "randk:ratio=1",
                           "threshold:tau=0.1", "dgc", "ef+topk:ratio=0.01", "ef21+randk", "auto:ef+fp16"}) {
    std::unique_ptr<Compressor> c;
    const Status s = make_compressor(spec, &c);
    EXPECT_TRUE(s.ok()) << spec << ": " << s.to_string();
    ASSERT_TRUE(c);
    EXPECT_EQ(c->spec().text, spec);
  }
  auto c = make("auto:ef21+topk:ratio=0.1");
  EXPECT_TRUE(c->spec().auto_select);
  EXPECT_EQ(c->name(), "ef21+topk");
  EXPECT_EQ(c->aggregation(), Aggregation::gather_only);
  EXPECT_EQ(make("ef+fp16")->aggregation(), Aggregation::summable);
  EXPECT_EQ(make("randk")->aggregation(), Aggregation::summable);
}

struct BadSpec {
  const char* spec;
  const char* problem;
};

TEST(CompressSpec, BadSpecsNameTheSpecAndTheProblem) {
  const BadSpec cases[] = {
      {"", "empty spec"},
      {"foo", "unknown compressor 'foo' (known: none, fp16, bf16, topk, randk, threshold, dgc"},
      {"ef+foo:ratio=1", "unknown compressor 'foo'"},
      {"Topk", "bad compressor name 'Topk'"},
      {":ratio=1", "missing compressor name"},
      {"topk:ratio=0", "ratio must be in (0, 1], got 0"},
      {"topk:ratio=1.5", "ratio must be in (0, 1], got 1.5"},
      {"topk:ratio=-0.1", "ratio must be in (0, 1], got -0.1"},
      {"randk:ratio=0", "ratio must be in (0, 1], got 0"},
      {"dgc:ratio=2", "ratio must be in (0, 1], got 2"},
      {"topk:ratio=abc", "ratio=abc is not a finite number"},
      {"topk:ratio=inf", "ratio=inf is not a finite number"},
      {"topk:ratio=0.1x", "ratio=0.1x is not a finite number"},
      {"topk:ratio=0.1,frob=1", "unknown parameter 'frob' for topk (accepted: ratio,approx,seed)"},
      {"none:x=1", "unknown parameter 'x' for none (accepted: none)"},
      {"ef+fp16:ratio=0.1", "unknown parameter 'ratio' for fp16"},
      {"topk:ratio=0.1,ratio=0.2", "parameter 'ratio' given twice"},
      {"topk:", "empty parameter list after ':'"},
      {"topk:ratio", "parameter 'ratio' is not key=value"},
      {"topk:ratio=", "parameter 'ratio' has no value"},
      {"topk:ratio=1=2", "more than one '='"},
      {"topk:approx=2", "approx=2 is not 0, 1, true or false"},
      {"topk:seed=1.5", "seed=1.5 is not an integer"},
      {"ef+ef21+topk", "at most one error-feedback decorator"},
      {"ef+auto:topk", "'auto:' must come first"},
      {"threshold", "threshold needs tau"},
      {"threshold:tau=0", "tau must be > 0"},
      {"threshold:tau=-1", "tau must be > 0"},
      {"dgc:momentum=1", "momentum must be in [0, 1), got 1"},
      {"dgc:clip=-1", "clip must be >= 0"},
      {"dgc:warmup=-5", "warmup must be >= 0 steps, got -5"},
  };
  for (const BadSpec& b : cases) {
    std::unique_ptr<Compressor> c;
    const Status s = make_compressor(b.spec, &c);
    EXPECT_EQ(s.code(), Result::invalid_argument) << b.spec;
    EXPECT_THAT(s.message(), HasSubstr(std::string("compressor spec '") + b.spec + "'")) << b.spec;
    EXPECT_THAT(s.message(), HasSubstr(b.problem)) << b.spec;
    EXPECT_FALSE(c) << b.spec;
  }
}

TEST(CompressSpec, WrongDtypeAndShapeAreRejected) {
  for (const char* spec : {"none", "fp16", "bf16", "topk", "randk", "threshold:tau=1", "dgc", "ef+topk"}) {
    auto c = make(spec);
    for (DataType dt : {DataType::i32, DataType::f64, DataType::i8, DataType::u8, DataType::i64}) {
      std::unique_ptr<CompressorState> st;
      const Status s = c->make_state(TensorDesc{10, dt, 0, 0}, &st);
      EXPECT_EQ(s.code(), Result::invalid_argument);
      EXPECT_THAT(s.message(), HasSubstr(std::string("compressor spec '") + spec + "'"));
      EXPECT_THAT(s.message(), HasSubstr(std::string("dtype ") + dtype_name(dt) + " is not supported"));
    }
    std::unique_ptr<CompressorState> st;
    const Status s = c->make_state(TensorDesc{10, DataType::f32, 3, 4}, &st);
    EXPECT_THAT(s.message(), HasSubstr("shape 3x4 does not hold 10 elements"));
    EXPECT_TRUE(c->make_state(TensorDesc{12, DataType::f32, 3, 4}, &st).ok());
  }
}

TEST(CompressSpec, ProtocolMisuseIsAnError) {
  auto c = make("topk:ratio=0.5");
  auto other = make("topk:ratio=0.5");
  auto st = state_for(*c, 8);
  std::vector<float> x(8, 1.0f), out(8);
  Payload p;
  std::vector<std::span<const std::byte>> agg;
  auto outb = std::as_writable_bytes(std::span(out));

  EXPECT_THAT(c->finish(*st, agg, outb).message(), HasSubstr("finish() without begin()"));
  EXPECT_THAT(other->begin(*st, bytes_of(x), &p).message(), HasSubstr("the state was made by compressor"));
  std::vector<float> short_x(7, 1.0f);
  EXPECT_THAT(c->begin(*st, bytes_of(short_x), &p).message(), HasSubstr("gradient is 28 bytes, the tensor needs 32"));
  ASSERT_TRUE(c->begin(*st, bytes_of(x), &p).ok());
  EXPECT_TRUE(p.last);
  agg.emplace_back(p.bytes);
  EXPECT_THAT(c->next(*st, agg, &p).message(), HasSubstr("next() after the last round"));
  EXPECT_THAT(c->finish(*st, agg, outb.first(16)).message(), HasSubstr("output is 16 bytes"));
  std::vector<float> acc(9);
  EXPECT_THAT(c->decode_add(*st, p.bytes, acc).message(), HasSubstr("accumulator is 36 bytes"));
  ASSERT_TRUE(c->finish(*st, agg, outb).ok());
  EXPECT_THAT(c->finish(*st, agg, outb).message(), HasSubstr("finish() without begin()"));

  // A payload that is not whole records, or whose index is out of range.
  std::vector<std::byte> bad(7);
  EXPECT_THAT(c->decode_add(*st, bad, std::span(out)).message(), HasSubstr("not a whole number of 8-byte records"));
  std::vector<std::byte> oob(8);
  const std::uint32_t i = 8;
  const float v = 1.0f;
  std::memcpy(oob.data(), &i, 4);
  std::memcpy(oob.data() + 4, &v, 4);
  std::fill(out.begin(), out.end(), 0.0f);
  EXPECT_THAT(c->decode_add(*st, oob, std::span(out)).message(), HasSubstr("index 8 (record 0) is out of range"));
  EXPECT_EQ(out, std::vector<float>(8, 0.0f));

  auto f16 = make("fp16");
  auto fs = state_for(*f16, 8);
  EXPECT_THAT(f16->decode_add(*fs, bad, std::span(out)).message(), HasSubstr("payload is 7 bytes, 8 f16 need 16"));
  auto rk = make("randk:ratio=0.5");
  auto rs = state_for(*rk, 8);
  EXPECT_THAT(rk->decode_add(*rs, bad, std::span(out)).message(), HasSubstr("payload is 7 bytes, 4 f32 values need 16"));
  EXPECT_EQ(c->encode_chunk(*st, x, 0, {}).code(), Result::invalid_usage);
}

}  // namespace
}  // namespace cclz::test
