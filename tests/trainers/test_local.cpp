// The single-process training loop: bitwise determinism, that it learns,
// option parsing, and bad input refused before the first step.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "local.hpp"
#include "options.hpp"

namespace cclz::train {
namespace {

class TempFile {
 public:
  explicit TempFile(const std::string& text) {
    char tmpl[] = "/tmp/cclz-local-test-XXXXXX";
    const int fd = ::mkstemp(tmpl);
    if (fd >= 0) ::close(fd);
    path_ = tmpl;
    std::ofstream(path_, std::ios::binary) << text;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string prose(int repeats) {
  std::string s;
  for (int i = 0; i < repeats; ++i)
    s += "the quick brown fox jumps over the lazy dog while " + std::to_string(i % 7) + " cats watch. ";
  return s;
}

TrainOptions tiny(const std::string& data) {
  TrainOptions o;
  o.model.layers = 2;
  o.model.width = 32;
  o.model.heads = 2;
  o.model.context = 16;
  o.batch = 4;
  o.steps = 8;
  o.eval_every = 4;
  o.schedule.warmup = 2;
  o.schedule.total = o.steps;
  o.schedule.max_lr = 3e-3f;
  o.schedule.min_lr = 3e-4f;
  o.data = data;
  o.quiet = true;
  return o;
}

TEST(Local, SameSeedSameBits) {
  TempFile f(prose(40));
  TrainOptions o = tiny(f.path());
  TrainResult a, b, c;
  ASSERT_TRUE(train_local(o, nullptr, &a).ok());
  ASSERT_TRUE(train_local(o, nullptr, &b).ok());
  ASSERT_EQ(a.train_loss.size(), 8u);
  ASSERT_EQ(a.val.size(), 3u);  // before training, after 4 and after 8 steps
  EXPECT_EQ(0, std::memcmp(a.train_loss.data(), b.train_loss.data(), a.train_loss.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(a.grad_norm.data(), b.grad_norm.data(), a.grad_norm.size() * sizeof(float)));
  for (std::size_t i = 0; i < a.val.size(); ++i) {
    EXPECT_EQ(a.val[i].step, b.val[i].step);
    EXPECT_EQ(0, std::memcmp(&a.val[i].loss, &b.val[i].loss, sizeof(float)));
  }
  o.seed = 2;
  ASSERT_TRUE(train_local(o, nullptr, &c).ok());
  EXPECT_NE(a.train_loss, c.train_loss);
}

TEST(Local, LearnsARepeatingText) {
  TempFile f(prose(40));
  TrainOptions o = tiny(f.path());
  o.steps = 60;
  o.eval_every = 0;
  o.schedule.warmup = 5;
  o.schedule.total = o.steps;
  TrainResult r;
  ASSERT_TRUE(train_local(o, nullptr, &r).ok());
  std::printf("  train loss %.3f -> %.3f, val %.3f -> %.3f\n", r.train_loss.front(), r.train_loss.back(),
              r.val.front().loss, r.val.back().loss);
  EXPECT_NEAR(r.train_loss.front(), std::log(256.0), 0.3);
  EXPECT_LT(r.train_loss.back(), 3.0f);  // from ln 256 = 5.55
  EXPECT_LT(r.val.back().loss, 3.0f);
}

TEST(Local, SgdAndConstantScheduleRun) {
  TempFile f(prose(40));
  TrainOptions o = tiny(f.path());
  o.optim.kind = OptimizerKind::sgd;
  o.schedule.kind = ScheduleKind::constant;
  o.schedule.max_lr = 0.1f;
  o.clip = 0;
  TrainResult r;
  ASSERT_TRUE(train_local(o, nullptr, &r).ok());
  EXPECT_LT(r.train_loss.back(), r.train_loss.front());
}

TEST(Local, BadInputBeforeTraining) {
  TrainOptions o = tiny("/nonexistent/corpus.txt");
  TrainResult r;
  Status s = train_local(o, nullptr, &r);
  EXPECT_NE(s.message().find("'/nonexistent/corpus.txt' does not exist"), std::string::npos) << s.message();
  EXPECT_TRUE(r.train_loss.empty());

  TempFile short_text("only a few bytes, fewer than 17 per split");
  o = tiny(short_text.path());
  s = train_local(o, nullptr, &r);
  EXPECT_NE(s.message().find("too short for context 16"), std::string::npos) << s.message();

  TempFile f(prose(40));
  o = tiny(f.path());
  o.csv = "/nonexistent/dir/log.csv";
  s = train_local(o, nullptr, &r);
  EXPECT_NE(s.message().find("cannot write --csv"), std::string::npos) << s.message();
  EXPECT_TRUE(r.train_loss.empty());
}

TEST(Local, ParseArgs) {
  auto parse = [](std::vector<const char*> args, TrainOptions* o, bool* help) {
    args.insert(args.begin(), "prog");
    return parse_train_args(static_cast<int>(args.size()), args.data(), o, help);
  };
  TrainOptions o;
  bool help = false;
  ASSERT_TRUE(parse({"--layers", "2", "--width=64", "--heads", "2", "--context", "32", "--batch", "8", "--steps", "200",
                     "--optimizer", "sgd", "--lr", "0.05", "--schedule", "constant", "--seed", "9", "--csv", "x.csv"},
                    &o, &help)
                  .ok());
  EXPECT_EQ(o.model.layers, 2);
  EXPECT_EQ(o.model.width, 64);
  EXPECT_EQ(o.model.context, 32);
  EXPECT_EQ(o.batch, 8);
  EXPECT_EQ(o.optim.kind, OptimizerKind::sgd);
  EXPECT_FLOAT_EQ(o.schedule.max_lr, 0.05f);
  EXPECT_FLOAT_EQ(o.schedule.min_lr, 0.005f);  // lr / 10 by default
  EXPECT_EQ(o.schedule.warmup, 20);            // 50 capped at steps / 10
  EXPECT_EQ(o.schedule.total, 200);
  EXPECT_EQ(o.seed, 9u);
  EXPECT_EQ(o.csv, "x.csv");
  EXPECT_FALSE(help);

  TrainOptions d;
  ASSERT_TRUE(parse({"--help"}, &d, &help).ok());
  EXPECT_TRUE(help);

  struct Bad {
    std::vector<const char*> args;
    const char* says;
  };
  const std::vector<Bad> bad = {
      {{"--layers", "0"}, "--layers '0'"},
      {{"--width", "12x"}, "--width '12x'"},
      {{"--heads", "3"}, "heads"},  // 128 not divisible by 3
      {{"--lr", "nan"}, "--lr 'nan'"},
      {{"--optimizer", "adam"}, "adamw or sgd"},
      {{"--bogus", "1"}, "unknown option --bogus"},
      {{"--steps"}, "--steps needs a value"},
      {{"stray"}, "unexpected argument 'stray'"},
      {{"--warmup", "100", "--steps", "100"}, "warmup"},
      {{"--min-lr", "0.1", "--lr", "0.01"}, "min_lr"},
  };
  for (const Bad& b : bad) {
    TrainOptions x;
    Status s = parse(b.args, &x, &help);
    EXPECT_EQ(s.code(), Result::invalid_argument) << b.says;
    EXPECT_NE(s.message().find(b.says), std::string::npos) << s.message();
  }
}

}  // namespace
}  // namespace cclz::train
