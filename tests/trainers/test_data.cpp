// Corpus loading, the split, the sampler's rank-independence of the global
// batch, its state round trip, evaluation batches and bad input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/corpus.hpp"
#include "data/sampler.hpp"

namespace cclz::train {
namespace {

// A scratch directory removed at the end of each test.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/cclz-data-test-XXXXXX";
    const char* d = ::mkdtemp(tmpl);
    path_ = d != nullptr ? d : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string write(const std::string& name, const std::string& text) const {
    const std::string p = path_ + "/" + name;
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }

 private:
  std::string path_;
};

Corpus counting_corpus(std::size_t n) {
  Corpus c;
  c.source = "test";
  for (std::size_t i = 0; i < n; ++i) c.bytes.push_back(static_cast<std::uint8_t>(i * 7 + i / 251));
  return c;
}

TEST(Data, LoadFileAndErrors) {
  TempDir d;
  ASSERT_FALSE(d.path().empty());
  Corpus c;
  ASSERT_TRUE(load_corpus_file(d.write("a.txt", "hello world"), &c).ok());
  EXPECT_EQ(std::string(c.bytes.begin(), c.bytes.end()), "hello world");

  Status s = load_corpus_file(d.path() + "/missing.txt", &c);
  EXPECT_EQ(s.code(), Result::invalid_argument);
  EXPECT_NE(s.message().find("missing.txt' does not exist"), std::string::npos) << s.message();
  s = load_corpus_file(d.write("empty.txt", ""), &c);
  EXPECT_NE(s.message().find("is empty"), std::string::npos) << s.message();
  s = load_corpus_file(d.path(), &c);
  EXPECT_NE(s.message().find("is a directory"), std::string::npos) << s.message();
}

TEST(Data, LoadDirSortedSkippingLinks) {
  TempDir d;
  d.write("b", "BB");
  d.write("a", "A");
  d.write("c", "CCC");
  std::filesystem::create_symlink(d.path() + "/c", d.path() + "/a-link");
  Corpus c;
  ASSERT_TRUE(load_corpus_dir(d.path(), &c).ok());
  EXPECT_EQ(std::string(c.bytes.begin(), c.bytes.end()), "ABBCCC");
  EXPECT_NE(c.source.find("(3 files)"), std::string::npos) << c.source;
  EXPECT_FALSE(load_corpus_dir(d.path() + "/nope", &c).ok());
}

TEST(Data, DefaultCorpus) {
  if (!std::filesystem::is_directory(kDefaultCorpusDir)) GTEST_SKIP() << kDefaultCorpusDir << " not present";
  Corpus a, b;
  ASSERT_TRUE(load_default_corpus(&a).ok());
  ASSERT_TRUE(load_default_corpus(&b).ok());
  EXPECT_EQ(a.bytes, b.bytes);
  EXPECT_GT(a.bytes.size(), 100000u);
  std::printf("  default corpus: %s, %zu bytes\n", a.source.c_str(), a.bytes.size());
}

TEST(Data, SplitSizesAndTooShort) {
  const Corpus c = counting_corpus(1000);
  DataSplit sp;
  ASSERT_TRUE(split_corpus(c, 0.1, 64, &sp).ok());
  EXPECT_EQ(sp.train.size(), 900u);
  EXPECT_EQ(sp.val.size(), 100u);
  EXPECT_EQ(sp.train.data() + 900, sp.val.data());  // the validation part is the tail
  ASSERT_TRUE(split_corpus(c, 0.0, 64, &sp).ok());
  EXPECT_TRUE(sp.val.empty());

  Status s = split_corpus(counting_corpus(64), 0.0, 64, &sp);  // 64 bytes < context + 1
  EXPECT_EQ(s.code(), Result::invalid_argument);
  EXPECT_NE(s.message().find("at least context + 1 = 65"), std::string::npos) << s.message();
  s = split_corpus(counting_corpus(300), 0.1, 64, &sp);  // validation part 30 bytes
  EXPECT_NE(s.message().find("validation part 30 bytes"), std::string::npos) << s.message();
  EXPECT_FALSE(split_corpus(c, 0.9, 64, &sp).ok());
}

TEST(Data, WindowsAreInputsAndShiftedTargets) {
  const Corpus c = counting_corpus(500);
  BatchSampler s;
  ASSERT_TRUE(BatchSampler::create(c.bytes, 4, 8, 0, 1, 3, &s).ok());
  std::vector<int> in(32), tg(32);
  s.batch_at(0, in.data(), tg.data());
  for (int k = 0; k < 4; ++k) {
    const std::size_t off = s.window_offset(0, k);
    ASSERT_LE(off + 9, c.bytes.size());
    for (int t = 0; t < 8; ++t) {
      EXPECT_EQ(in[static_cast<std::size_t>(k * 8 + t)], c.bytes[off + static_cast<std::size_t>(t)]);
      EXPECT_EQ(tg[static_cast<std::size_t>(k * 8 + t)], c.bytes[off + static_cast<std::size_t>(t) + 1]);
    }
  }
}

// What DP parity rests on: for every W dividing B, the ranks' batches
// concatenated in rank order equal the 1-process batch, step after step.
TEST(Data, GlobalBatchIndependentOfWorldSize) {
  const Corpus c = counting_corpus(5000);
  const int B = 12, T = 16;
  BatchSampler one;
  ASSERT_TRUE(BatchSampler::create(c.bytes, B, T, 0, 1, 42, &one).ok());
  std::vector<std::vector<int>> ref_in, ref_tg;
  for (int step = 0; step < 5; ++step) {
    std::vector<int> in(B * T), tg(B * T);
    one.next(in.data(), tg.data());
    ref_in.push_back(in);
    ref_tg.push_back(tg);
  }
  for (int W : {2, 3, 4, 6, 12}) {
    std::vector<BatchSampler> ranks(static_cast<std::size_t>(W));
    for (int r = 0; r < W; ++r) ASSERT_TRUE(BatchSampler::create(c.bytes, B, T, r, W, 42, &ranks[r]).ok());
    for (int step = 0; step < 5; ++step) {
      std::vector<int> in, tg;
      for (auto& rs : ranks) {
        std::vector<int> li(static_cast<std::size_t>(rs.local_batch() * T)), lt(li.size());
        rs.next(li.data(), lt.data());
        in.insert(in.end(), li.begin(), li.end());
        tg.insert(tg.end(), lt.begin(), lt.end());
      }
      EXPECT_EQ(in, ref_in[static_cast<std::size_t>(step)]) << "W=" << W << " step " << step;
      EXPECT_EQ(tg, ref_tg[static_cast<std::size_t>(step)]) << "W=" << W << " step " << step;
    }
  }
  // Steps differ from each other and seeds differ from each other.
  EXPECT_NE(ref_in[0], ref_in[1]);
  BatchSampler other;
  ASSERT_TRUE(BatchSampler::create(c.bytes, B, T, 0, 1, 43, &other).ok());
  std::vector<int> in(B * T), tg(B * T);
  other.next(in.data(), tg.data());
  EXPECT_NE(in, ref_in[0]);
}

TEST(Data, OffsetsCoverTheData) {
  // Every start 0 .. n-T-1 is reachable and none beyond: 8 starts, 2000 draws.
  const Corpus c = counting_corpus(12);
  BatchSampler s;
  ASSERT_TRUE(BatchSampler::create(c.bytes, 1, 4, 0, 1, 9, &s).ok());
  std::vector<int> hits(8, 0);
  for (std::uint64_t step = 0; step < 2000; ++step) {
    const std::size_t off = s.window_offset(step, 0);
    ASSERT_LT(off, 8u);
    ++hits[off];
  }
  for (int h : hits) EXPECT_GT(h, 150);  // expectation 250 each
}

TEST(Data, StateRoundTrip) {
  const Corpus c = counting_corpus(3000);
  BatchSampler a, b;
  ASSERT_TRUE(BatchSampler::create(c.bytes, 4, 16, 1, 2, 5, &a).ok());
  ASSERT_TRUE(BatchSampler::create(c.bytes, 4, 16, 1, 2, 5, &b).ok());
  std::vector<int> ia(32), ta(32), ib(32), tb(32);
  for (int i = 0; i < 7; ++i) a.next(ia.data(), ta.data());
  const std::vector<std::uint8_t> bytes = serialize(a.state());
  EXPECT_EQ(bytes.size(), 48u);
  SamplerState st;
  ASSERT_TRUE(deserialize(bytes, &st).ok());
  ASSERT_TRUE(b.restore(st).ok());
  EXPECT_EQ(b.step(), 7u);
  a.next(ia.data(), ta.data());
  b.next(ib.data(), tb.data());
  EXPECT_EQ(ia, ib);
  EXPECT_EQ(ta, tb);

  // Refusals: truncated bytes, another corpus, another batch shape.
  EXPECT_FALSE(deserialize(std::span(bytes).first(40), &st).ok());
  std::vector<std::uint8_t> bad = bytes;
  bad[0] ^= 1;
  EXPECT_FALSE(deserialize(bad, &st).ok());
  ASSERT_TRUE(deserialize(bytes, &st).ok());
  const Corpus c2 = counting_corpus(3001);
  BatchSampler other;
  ASSERT_TRUE(BatchSampler::create(c2.bytes, 4, 16, 1, 2, 5, &other).ok());
  EXPECT_NE(other.restore(st).message().find("other training data"), std::string::npos);
  ASSERT_TRUE(BatchSampler::create(c.bytes, 8, 16, 1, 2, 5, &other).ok());
  EXPECT_FALSE(other.restore(st).ok());
}

TEST(Data, EvalBatchesShardedAndInOrder) {
  const Corpus c = counting_corpus(200);
  const int B = 4, T = 10;
  // (200 - 1) / 10 = 19 windows, 4 full batches of 4.
  EXPECT_EQ(eval_batch_count(c.bytes.size(), B, T), 4);
  EXPECT_EQ(eval_batch_count(10, B, T), 0);
  std::vector<int> in(B * T), tg(B * T);
  eval_batch(c.bytes, 3, B, T, 0, 1, in.data(), tg.data());
  EXPECT_EQ(in[0], c.bytes[120]);             // batch 3 starts at window 12 = byte 120
  EXPECT_EQ(tg[B * T - 1], c.bytes[160]);     // last target of window 15: byte 15*10 + 10
  std::vector<int> joined;
  for (int r = 0; r < 2; ++r) {
    std::vector<int> li(2 * T), lt(2 * T);
    eval_batch(c.bytes, 3, B, T, r, 2, li.data(), lt.data());
    joined.insert(joined.end(), li.begin(), li.end());
  }
  EXPECT_EQ(joined, in);
}

TEST(Data, ShardErrors) {
  const Corpus c = counting_corpus(100);
  BatchSampler s;
  Status st = BatchSampler::create(c.bytes, 6, 8, 0, 4, 1, &s);
  EXPECT_NE(st.message().find("not divisible by the 4 ranks"), std::string::npos) << st.message();
  EXPECT_FALSE(BatchSampler::create(c.bytes, 4, 8, 4, 4, 1, &s).ok());
  EXPECT_FALSE(BatchSampler::create(c.bytes, 4, 100, 0, 1, 1, &s).ok());  // 100 bytes < 101
}

}  // namespace
}  // namespace cclz::train
