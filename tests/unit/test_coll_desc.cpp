// The tests' own helpers (tests/support/coll_desc): the buffer hash that
// the multi-rank suites compare outputs and send buffers with, and
// check_output, whose expected outputs of large cases are kept for reuse.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "coll_desc.hpp"

namespace cclz::testing {
namespace {

// Every single-byte change, at every position of every length up to a few
// of the hash's 32-byte steps, and at every alignment, changes the hash;
// the same bytes anywhere hash alike; a trailing zero byte counts.
TEST(HashBytes, EveryByteAndTheLengthCount) {
  std::vector<unsigned char> base(200);
  for (std::size_t i = 0; i < base.size(); ++i) base[i] = static_cast<unsigned char>(i * 37 + 11);
  std::vector<unsigned char> copy(base.size() + 8);
  for (std::size_t len = 0; len <= 130; ++len) {
    const std::uint64_t h = hash_bytes(base.data(), len);
    for (std::size_t shift = 1; shift < 8; ++shift) {
      std::memcpy(copy.data() + shift, base.data(), len);
      ASSERT_EQ(hash_bytes(copy.data() + shift, len), h) << "length " << len << " at offset " << shift;
    }
    std::vector<unsigned char> longer(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(len));
    longer.push_back(0);
    EXPECT_NE(hash_bytes(longer.data(), longer.size()), h) << "length " << len << " and a zero byte";
    for (std::size_t pos = 0; pos < len; ++pos) {
      for (unsigned char flip : {0x01, 0x80}) {
        base[pos] ^= flip;
        EXPECT_NE(hash_bytes(base.data(), len), h) << "length " << len << ", byte " << pos << " ^ " << int{flip};
        base[pos] ^= flip;
      }
    }
  }
  // Chaining: the seed changes the result.
  EXPECT_NE(hash_bytes(base.data(), 64, 1), hash_bytes(base.data(), 64, 2));
}

// check_output keeps large cases' expected outputs: a case that differs
// from a checked one in any one field, or is checked on another rank, must
// be checked against its own. Every variant's output, checked as every
// other variant (twice: the second time from the kept outputs), gives the
// count of wrong elements against the variant's own expected output,
// computed afresh here.
TEST(CheckOutput, LargeCasesAreCheckedAgainstTheirOwnExpectedOutput) {
  const CollCase base{CollKind::reduce_scatter, DataType::f32, ReduceOp::sum, std::size_t{40} << 10, 0, 3};
  struct Variant {
    CollCase c;
    int rank;
  };
  std::vector<Variant> vs = {{base, 0}, {base, 1}};
  CollCase c = base;
  c.op = ReduceOp::max;
  vs.push_back({c, 0});
  c = base;
  c.dt = DataType::i32;
  vs.push_back({c, 0});
  c = base;
  c.count += 1;
  vs.push_back({c, 0});
  c = base;
  c.nranks = 4;
  vs.push_back({c, 0});
  c = base;
  c.kind = CollKind::all_gather;
  vs.push_back({c, 0});
  c.kind = CollKind::broadcast;
  c.root = 1;
  vs.push_back({c, 0});
  c.root = 2;
  vs.push_back({c, 0});
  std::vector<std::vector<std::byte>> outs;
  for (const Variant& v : vs) {
    std::vector<std::byte> out(buffer_counts(v.c, v.rank).recv * dtype_size(v.c.dt));
    expected_output(v.c, v.rank, out.data());
    outs.push_back(std::move(out));
  }
  int differing = 0;
  for (int round = 0; round < 2; ++round) {
    for (std::size_t i = 0; i < vs.size(); ++i) {
      const std::size_t n = outs[i].size() / dtype_size(vs[i].c.dt);
      for (std::size_t j = 0; j < vs.size(); ++j) {
        if (outs[j].size() < outs[i].size()) continue;
        const std::size_t want = count_wrong(outs[j].data(), outs[i].data(), n, vs[i].c.dt);
        EXPECT_EQ(check_output(vs[i].c, vs[i].rank, outs[j].data()), want)
            << "variant " << i << " checked against variant " << j << "'s output, round " << round;
        if (want != 0) ++differing;
      }
    }
  }
  EXPECT_GE(differing, 2 * 20) << "too few variants differ for the test to tell kept outputs apart";
}

// cclz-perf's roofline: the least traffic of a call is what its ranks'
// buffers hold, counted from buffer_counts (each input read once, each
// output written once; a broadcast reads only the root's input, a reduce
// writes only the root's output), in units of the row's size.
TEST(MemoryTraffic, EveryInputReadOnceAndEveryOutputWrittenOnce) {
  for (const CollInfo& ci : all_colls()) {
    for (int n = 1; n <= 8; ++n) {
      const std::size_t count = 12;
      const CollCase c{ci.kind, DataType::f32, ReduceOp::sum, count, 0, n};
      double traffic = 0;
      for (int r = 0; r < n; ++r) {
        const BufferCounts b = buffer_counts(c, r);
        if (ci.kind != CollKind::broadcast || r == c.root) traffic += static_cast<double>(b.send);
        if (ci.kind != CollKind::reduce || r == c.root) traffic += static_cast<double>(b.recv);
      }
      const auto size = static_cast<double>(row_count(ci.kind, count, n));
      if (ci.kind == CollKind::all_to_allv) {
        // Uneven pairs: the nominal size is the mean, so compare the sum
        // over ranks with all_to_all's, whose pairs all carry `count`.
        EXPECT_EQ(memory_traffic_factor(ci.kind, n), memory_traffic_factor(CollKind::all_to_all, n));
        continue;
      }
      EXPECT_EQ(memory_traffic_factor(ci.kind, n) * size, traffic) << ci.name << " on " << n << " ranks";
    }
    const bool two_n = memory_traffic_factor(ci.kind, 3) == 6.0;
    EXPECT_STREQ(memory_traffic_formula(ci.kind), two_n ? "2*n*size" : "(n+1)*size") << ci.name;
  }
}

}  // namespace
}  // namespace cclz::testing
