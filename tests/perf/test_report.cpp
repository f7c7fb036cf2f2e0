// cclz-perf's report helpers that the end-to-end run cannot pin down
// exactly: the nearest-rank percentile behind --per-call.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "report.hpp"

namespace cclz::perf {
namespace {

std::vector<double> one_to(int n) {
  std::vector<double> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 1.0);
  return v;
}

TEST(Percentile, NearestRank) {
  EXPECT_EQ(percentile({}, 50), -1);
  EXPECT_EQ(percentile({7.5}, 50), 7.5);
  EXPECT_EQ(percentile({7.5}, 99), 7.5);
  // Under 100 values the 99th percentile is the largest.
  EXPECT_EQ(percentile(one_to(20), 50), 10);
  EXPECT_EQ(percentile(one_to(20), 99), 20);
  EXPECT_EQ(percentile(one_to(21), 50), 11);
  EXPECT_EQ(percentile(one_to(100), 50), 50);
  EXPECT_EQ(percentile(one_to(100), 99), 99);
  EXPECT_EQ(percentile(one_to(200), 99), 198);
  EXPECT_EQ(percentile(one_to(1000), 99), 990);
  EXPECT_EQ(percentile(one_to(1000), 100), 1000);
  EXPECT_EQ(percentile({1, 1, 2, 9}, 50), 1);
}

}  // namespace
}  // namespace cclz::perf
