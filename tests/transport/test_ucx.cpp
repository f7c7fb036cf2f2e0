// UcxTransport tests: data integrity from 0 B to 64 MB (eager and
// rendezvous), matching order, traffic classes, length mismatches, timeouts
// with cancel, fail(), peers that leave or are killed, and 8 ranks on the
// machine's cores.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "harness.hpp"
#include "ucx_transport.hpp"

namespace cclz::ttest {
namespace {

std::uint8_t pattern(std::size_t i, std::size_t salt) {
  return static_cast<std::uint8_t>((i * 131 + salt * 17 + (i >> 12)) & 0xff);
}

void fill(std::vector<std::uint8_t>& v, std::size_t salt) {
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = pattern(i, salt);
}

// Index of the first wrong byte, or -1.
long long first_bad(const std::vector<std::uint8_t>& v, std::size_t salt) {
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i] != pattern(i, salt)) return static_cast<long long>(i);
  }
  return -1;
}

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

TEST(Ucx, SendRecvFromZeroBytesTo64MegabytesBothWays) {
  const std::size_t sizes[] = {0, 1, 1 << 20, 64 << 20};
  run_world(2, [&](World& w, int rank) {
    Transport& t = *w.transport;
    const int peer = 1 - rank;
    for (std::size_t k = 0; k < std::size(sizes); ++k) {
      const std::size_t n = sizes[k];
      std::vector<std::uint8_t> out(n), in(n, 0);
      fill(out, k * 2 + static_cast<std::size_t>(rank));
      const Status st = sendrecv(t, peer, out.data(), n, peer, in.data(), n, k, 20);
      ASSERT_TRUE(st.ok()) << n << " B: " << st.to_string();
      EXPECT_EQ(first_bad(in, k * 2 + static_cast<std::size_t>(peer)), -1) << "size " << n;
    }
  });
}

TEST(Ucx, MessagesWithTheSameTagMatchInSendOrder) {
  // Mixed sizes so eager and rendezvous messages interleave on one tag.
  constexpr int kCount = 120;
  auto size_of = [](int i) -> std::size_t { return i % 5 == 4 ? (256u << 10) + static_cast<std::size_t>(i) : 8u + static_cast<std::size_t>(i); };
  run_world(2, [&](World& w, int rank) {
    Transport& t = *w.transport;
    if (rank == 0) {
      std::vector<std::vector<std::uint8_t>> bufs(kCount);
      std::vector<Op> ops(kCount);
      std::vector<Op*> ptrs;
      for (int i = 0; i < kCount; ++i) {
        bufs[static_cast<std::size_t>(i)].resize(size_of(i));
        fill(bufs[static_cast<std::size_t>(i)], static_cast<std::size_t>(i));
        ASSERT_TRUE(t.post_send(1, 42, bufs[static_cast<std::size_t>(i)].data(), size_of(i), &ops[static_cast<std::size_t>(i)]).ok());
        ptrs.push_back(&ops[static_cast<std::size_t>(i)]);
      }
      const Status st = t.wait(ptrs, after(20));
      ASSERT_TRUE(st.ok()) << st.to_string();
    } else {
      // Receives posted one at a time, after most sends arrived unexpected.
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      for (int i = 0; i < kCount; ++i) {
        std::vector<std::uint8_t> in(size_of(i));
        const Status st = recv_wait(t, 0, 42, in.data(), in.size(), 20);
        ASSERT_TRUE(st.ok()) << "message " << i << ": " << st.to_string();
        ASSERT_EQ(first_bad(in, static_cast<std::size_t>(i)), -1) << "message " << i;
      }
    }
  });
}

TEST(Ucx, TrafficClassesAndSendersDoNotMatchEachOther) {
  run_world(3, [&](World& w, int rank) {
    Transport& t = *w.transport;
    using Tr = Transport::Traffic;
    if (rank == 0 || rank == 2) {
      // Same tag, both classes, from two senders; p2p first.
      const int a = 100 + rank, b = 200 + rank;
      ASSERT_TRUE(send_wait(t, 1, 3, &a, sizeof a, 5, Tr::point_to_point).ok());
      ASSERT_TRUE(send_wait(t, 1, 3, &b, sizeof b, 5, Tr::collective).ok());
    } else {
      int v = 0;
      ASSERT_TRUE(recv_wait(t, 2, 3, &v, sizeof v, 5, Tr::collective).ok());
      EXPECT_EQ(v, 202);
      ASSERT_TRUE(recv_wait(t, 0, 3, &v, sizeof v, 5, Tr::collective).ok());
      EXPECT_EQ(v, 200);
      ASSERT_TRUE(recv_wait(t, 0, 3, &v, sizeof v, 5, Tr::point_to_point).ok());
      EXPECT_EQ(v, 100);
      ASSERT_TRUE(recv_wait(t, 2, 3, &v, sizeof v, 5, Tr::point_to_point).ok());
      EXPECT_EQ(v, 102);
    }
  });
}

TEST(Ucx, SendToSelfAndTagLimits) {
  run_world(1, [](World& w, int) {
    Transport& t = *w.transport;
    const std::uint64_t top = (std::uint64_t{1} << Transport::kTagBits) - 1;
    std::vector<std::uint8_t> out(3000), in(3000);
    fill(out, 9);
    const Status st = sendrecv(t, 0, out.data(), out.size(), 0, in.data(), in.size(), top, 5);
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(first_bad(in, 9), -1);
    Op op;
    EXPECT_EQ(t.post_send(0, top + 1, out.data(), 1, &op).code(), Result::invalid_argument);
    EXPECT_EQ(t.post_recv(1, 0, in.data(), 1, &op).code(), Result::invalid_argument);
    EXPECT_EQ(t.post_send(-1, 0, out.data(), 1, &op).code(), Result::invalid_argument);
  });
}

// A receive of the wrong length completes with invalid_usage naming the
// peer and both sizes, for eager and rendezvous sizes, shorter and longer;
// the transport keeps working afterwards.
TEST(Ucx, LengthMismatchIsInvalidUsageNamingPeerAndSizes) {
  struct Case {
    std::size_t sent, posted;
  };
  const Case cases[] = {{100, 64}, {10, 64}, {1 << 20, 512 << 10}, {512 << 10, 1 << 20}};
  run_world(2, [&](World& w, int rank) {
    Transport& t = *w.transport;
    for (std::size_t k = 0; k < std::size(cases); ++k) {
      const Case c = cases[k];
      if (rank == 0) {
        std::vector<std::uint8_t> out(c.sent);
        fill(out, k);
        // The sender may or may not see an error; it must not hang.
        (void)send_wait(t, 1, 50 + k, out.data(), out.size(), 5);
      } else {
        std::vector<std::uint8_t> in(c.posted);
        const Status st = recv_wait(t, 0, 50 + k, in.data(), in.size(), 5);
        EXPECT_EQ(st.code(), Result::invalid_usage) << c.sent << " -> " << c.posted << ": " << st.to_string();
        EXPECT_TRUE(contains(st.message(), "rank 0")) << st.message();
        EXPECT_TRUE(contains(st.message(), std::to_string(c.posted) + " B")) << st.message();
        if (c.sent < c.posted) {
          EXPECT_TRUE(contains(st.message(), std::to_string(c.sent) + " B")) << st.message();
        } else {
          EXPECT_TRUE(contains(st.message(), std::to_string(c.sent) + " B") ||
                      contains(st.message(), "more than " + std::to_string(c.posted) + " B"))
              << st.message();
        }
      }
      int x = rank, y = -1;
      const Status ok = sendrecv(t, 1 - rank, &x, sizeof x, 1 - rank, &y, sizeof y, 99, 5);
      ASSERT_TRUE(ok.ok()) << ok.to_string();
      EXPECT_EQ(y, 1 - rank);
    }
  });
}

TEST(Ucx, TimeoutNamesThePeerAndCancelReleasesTheReceive) {
  run_world(2, [&](World& w, int rank) {
    Transport& t = *w.transport;
    std::uint64_t v = 0;
    if (rank == 0) {
      Op op;
      ASSERT_TRUE(t.post_recv(1, 9, &v, sizeof v, &op).ok());
      Op* ops[] = {&op};
      const auto t0 = Clock::now();
      const Status st = t.wait(ops, after(0.2));
      const double took = seconds_since(t0);
      EXPECT_EQ(st.code(), Result::timeout);
      EXPECT_TRUE(contains(st.message(), "timed out after 0.2 s waiting for rank(s) 1 (recv of 8 B)")) << st.message();
      EXPECT_LT(took, 0.5);
      EXPECT_FALSE(op.done);
      t.cancel(&op);
      EXPECT_EQ(op.handle, nullptr);
      // The cancelled receive must not swallow the next message on tag 9.
      const int go = 1;
      ASSERT_TRUE(send_wait(t, 1, 1, &go, sizeof go).ok());
      ASSERT_TRUE(recv_wait(t, 1, 9, &v, sizeof v).ok());
      EXPECT_EQ(v, 0x1234567890abcdefull);
    } else {
      int go = 0;
      ASSERT_TRUE(recv_wait(t, 0, 1, &go, sizeof go).ok());
      v = 0x1234567890abcdefull;
      ASSERT_TRUE(send_wait(t, 0, 9, &v, sizeof v).ok());
    }
  });
}

TEST(Ucx, TimedOutRendezvousSendCanBeCancelledQuickly) {
  run_world(2, [&](World& w, int rank) {
    Transport& t = *w.transport;
    std::vector<std::uint8_t> big(8 << 20);
    if (rank == 0) {
      Op op;
      ASSERT_TRUE(t.post_send(1, 11, big.data(), big.size(), &op).ok());
      Op* ops[] = {&op};
      const Status st = t.wait(ops, after(0.2));
      EXPECT_EQ(st.code(), Result::timeout);
      EXPECT_TRUE(contains(st.message(), "rank(s) 1 (send of 8388608 B)")) << st.message();
      const auto t0 = Clock::now();
      t.cancel(&op);
      EXPECT_LT(seconds_since(t0), 0.2);
      EXPECT_EQ(op.handle, nullptr);
    }
    // Rank 1 never receives tag 11; both sync before tearing down.
    int x = rank, y = -1;
    ASSERT_TRUE(sendrecv(t, 1 - rank, &x, sizeof x, 1 - rank, &y, sizeof y, 12, 5).ok());
  });
}

TEST(Ucx, FailWakesAWaitingRankAndFailsLaterPosts) {
  run_world(2, [&](World& w, int rank) {
    Transport& t = *w.transport;
    if (rank == 0) {
      int v = 0;
      Op op;
      ASSERT_TRUE(t.post_recv(1, 5, &v, sizeof v, &op).ok());
      std::thread aborter([&t] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        t.fail(Status(Result::remote_error, "aborted by the test"));
      });
      Op* ops[] = {&op};
      const auto t0 = Clock::now();
      const Status st = t.wait(ops, after(10));
      const double took = seconds_since(t0);
      aborter.join();
      EXPECT_EQ(st.code(), Result::remote_error);
      EXPECT_EQ(st.message(), "aborted by the test");
      EXPECT_LT(took, 1.0);  // woken from the event fd, not by the deadline
      t.cancel(&op);
      Op op2;
      EXPECT_EQ(t.post_send(1, 5, &v, sizeof v, &op2).message(), "aborted by the test");
      Op* none[] = {&op2};
      EXPECT_EQ(t.wait(none, after(1)).message(), "aborted by the test");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  });
}

// A rank that destroys its transport (as Comm::abort/destroy do) while a peer
// waits on it: the peer must get an error (graceful close tells it), not hang.
TEST(Ucx, PeerThatLeavesIsReportedToTheWaitingRank) {
  run_world(2, [&](World& w, int rank) {
    Transport& t = *w.transport;
    int x = rank, y = -1;
    ASSERT_TRUE(sendrecv(t, 1 - rank, &x, sizeof x, 1 - rank, &y, sizeof y, 1, 5).ok());
    if (rank == 1) {
      w.transport.reset();
      return;
    }
    Op op;
    ASSERT_TRUE(t.post_recv(1, 2, &y, sizeof y, &op).ok());
    Op* ops[] = {&op};
    const auto t0 = Clock::now();
    const Status st = t.wait(ops, after(8));
    const double took = seconds_since(t0);
    EXPECT_EQ(st.code(), Result::remote_error) << st.to_string() << " after " << took << " s";
    EXPECT_TRUE(contains(st.message(), "rank 1 left")) << st.message();
    EXPECT_LT(took, 1.0);  // the goodbye, not a keepalive timeout
    EXPECT_TRUE(op.done);
    // Later operations with that rank fail at once.
    Op op2;
    EXPECT_EQ(t.post_send(1, 2, &x, sizeof x, &op2).code(), Result::remote_error);
    std::cout << "[ info ] departed peer reported after " << took << " s: " << st.message() << "\n";
  });
}

// A peer process killed with SIGKILL: the survivor's wait ends with an
// error within a bounded time and its transport tears down without hanging.
TEST(Ucx, KilledPeerProcessEndsTheWaitWithAnError) {
  UniqueId id;
  ASSERT_TRUE(detail::make_unique_id(&id).ok());
  const pid_t child = spawn_child({"echo_then_idle", id_to_hex(id)});
  ASSERT_GT(child, 0);
  World w;
  const Status c = detail::connect_unique_id(id, 2, 0, after(10), &w);
  if (!c.ok()) {
    ::kill(child, SIGKILL);
    wait_child(child, 5);
    FAIL() << c.to_string();
  }
  Transport& t = *w.transport;
  char ping[8] = "ping", pong[8] = {};
  ASSERT_TRUE(send_wait(t, 1, 1, ping, sizeof ping).ok());
  ASSERT_TRUE(recv_wait(t, 1, 1, pong, sizeof pong).ok());
  EXPECT_STREQ(pong, "ping");
  ::kill(child, SIGKILL);
  EXPECT_EQ(wait_child(child, 5), 128 + SIGKILL);
  int v = 0;
  Op op;
  ASSERT_TRUE(t.post_recv(1, 2, &v, sizeof v, &op).ok());
  Op* ops[] = {&op};
  const auto t0 = Clock::now();
  const Status st = t.wait(ops, after(8));
  const double took = seconds_since(t0);
  EXPECT_TRUE(st.code() == Result::remote_error || st.code() == Result::timeout) << st.to_string();
  EXPECT_LT(took, 8.5);
  std::cout << "[ info ] killed peer reported after " << took << " s: " << st.to_string() << "\n";
  if (!st.ok() && op.handle != nullptr && !op.done) t.cancel(&op);
  const auto t1 = Clock::now();
  w.transport.reset();
  EXPECT_LT(seconds_since(t1), 3.0);
}

TEST(Ucx, DestructorWithUnfinishedOpsDoesNotHang) {
  run_world(2, [&](World& w, int rank) {
    Transport& t = *w.transport;
    std::vector<std::uint8_t> big(4 << 20), small(16);
    Op a, b;
    // Neither side ever posts the matching operations.
    ASSERT_TRUE(t.post_send(1 - rank, 70, big.data(), big.size(), &a).ok());
    ASSERT_TRUE(t.post_recv(1 - rank, 71, small.data(), small.size(), &b).ok());
    Op* ops[] = {&a, &b};
    EXPECT_EQ(t.wait(ops, after(0.1)).code(), Result::timeout);
    // Both ranks time out before either tears down (else one sees the other leave).
    int x = rank, y = -1;
    ASSERT_TRUE(sendrecv(t, 1 - rank, &x, sizeof x, 1 - rank, &y, sizeof y, 72, 5).ok());
    const auto t0 = Clock::now();
    w.transport.reset();
    EXPECT_LT(seconds_since(t0), 2.0);
  });
}

// 8 ranks on a 2-core machine: ring exchanges must keep moving (the back-off
// leaves the cores to ranks that have work).
TEST(Ucx, EightRanksRingExchangeOnFewCores) {
  constexpr int kRanks = 8, kIters = 200;
  constexpr std::size_t kBytes = 4096;
  std::atomic<double> worst{0};
  run_world(kRanks, [&](World& w, int rank) {
    Transport& t = *w.transport;
    std::vector<std::uint8_t> out(kBytes), in(kBytes);
    constexpr int kWarm = 50;  // endpoints wire up on first use
    auto t0 = Clock::now();
    for (int it = 0; it < kWarm + kIters; ++it) {
      if (it == kWarm) t0 = Clock::now();
      fill(out, static_cast<std::size_t>(it * kRanks + rank));
      const Status st = sendrecv(t, (rank + 1) % kRanks, out.data(), kBytes, (rank + kRanks - 1) % kRanks, in.data(),
                                 kBytes, static_cast<std::uint64_t>(it), 10);
      ASSERT_TRUE(st.ok()) << st.to_string();
      ASSERT_EQ(first_bad(in, static_cast<std::size_t>(it * kRanks + (rank + kRanks - 1) % kRanks)), -1);
    }
    const double per = seconds_since(t0) / kIters;
    double cur = worst.load();
    while (per > cur && !worst.compare_exchange_weak(cur, per)) {
    }
  });
  std::cout << "[ info ] 8-rank 4 KB ring step (threads): " << worst.load() * 1e6 << " us\n";
  EXPECT_LT(worst.load(), 0.01);  // 10 ms a step would mean ranks starve each other
}

}  // namespace
}  // namespace cclz::ttest
