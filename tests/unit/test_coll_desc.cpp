// The tests' own helpers (tests/support/coll_desc): the buffer hash that
// the multi-rank suites compare outputs and send buffers with.
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

}  // namespace
}  // namespace cclz::testing
