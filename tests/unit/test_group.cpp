#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "group.hpp"
#include "thread_transport.hpp"

namespace cclz {
namespace {

using coll::Group;
using coll::ScratchPool;

Group make_group(detail::Transport& t, int seq, double timeout_s, ScratchPool& pool) {
  std::vector<int> members(static_cast<std::size_t>(t.size()));
  for (int i = 0; i < t.size(); ++i) members[static_cast<std::size_t>(i)] = i;
  std::vector<int> nodes(members.size(), 0);
  auto deadline = detail::Clock::now() + std::chrono::duration_cast<detail::Clock::duration>(
                                             std::chrono::duration<double>(timeout_s));
  return Group(t, members, nodes, t.rank(), static_cast<std::uint64_t>(seq), deadline, pool);
}

TEST(Group, RingSendRecvDeliversInOrder) {
  testing::run_ranks(5, [](detail::Transport& t, int rank) {
    ScratchPool pool;
    Group g = make_group(t, 1, 10.0, pool);
    const int n = g.size();
    for (std::uint32_t step = 0; step < 3; ++step) {
      int out = rank * 100 + static_cast<int>(step), in = -1;
      ASSERT_TRUE(g.sendrecv((rank + 1) % n, &out, sizeof out, (rank + n - 1) % n, &in, sizeof in, step).ok());
      EXPECT_EQ(in, ((rank + n - 1) % n) * 100 + static_cast<int>(step));
    }
  });
}

TEST(Group, SubgroupsKeepTagsApart) {
  testing::run_ranks(4, [](detail::Transport& t, int rank) {
    ScratchPool pool;
    Group g = make_group(t, 7, 10.0, pool);
    const int pair[2][2] = {{0, 1}, {2, 3}};
    const int* mine = pair[rank / 2];
    Group sub = g.subgroup(std::span<const int>(mine, 2), 3);
    EXPECT_EQ(sub.size(), 2);
    EXPECT_EQ(sub.rank(), rank % 2);
    int out = rank, in = -1;
    ASSERT_TRUE(sub.sendrecv(1 - sub.rank(), &out, sizeof out, 1 - sub.rank(), &in, sizeof in, 0).ok());
    EXPECT_EQ(in, rank ^ 1);
  });
}

TEST(Group, TimeoutNamesTheMissingPeerAndCancels) {
  testing::run_ranks(2, [](detail::Transport& t, int rank) {
    ScratchPool pool;
    Group g = make_group(t, 2, 0.2, pool);
    if (rank == 0) {
      int in = 0;
      Status st = g.recv(1, 0, &in, sizeof in);
      EXPECT_EQ(st.code(), Result::timeout);
      EXPECT_NE(st.message().find("rank(s) 1"), std::string::npos) << st.message();
    }
  });
}

TEST(Group, LengthMismatchIsAnError) {
  testing::run_ranks(2, [](detail::Transport& t, int rank) {
    ScratchPool pool;
    Group g = make_group(t, 3, 5.0, pool);
    long long buf = 0;
    if (rank == 0) {
      ASSERT_TRUE(g.send(1, 0, &buf, 4).ok());
    } else {
      Status st = g.recv(0, 0, &buf, 8);
      EXPECT_EQ(st.code(), Result::invalid_usage) << st.to_string();
    }
  });
}

TEST(ScratchPool, GrowsAndAligns) {
  ScratchPool pool;
  std::byte* a = pool.get(0, 100);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % 64, 0u);
  std::memset(pool.get(1, 1 << 20), 1, 1 << 20);
}

}  // namespace
}  // namespace cclz
