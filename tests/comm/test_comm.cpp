// Communicator tests over in-process transports (ranks as threads): argument
// validation and its messages, avg, algorithm choice and its errors,
// CCLZ_CHECK, timeouts and poisoning, abort, destroy, split, send/recv
// order, request semantics, custom tasks, logging.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "harness.hpp"

namespace cclz::ctest {
namespace {

using coll::CollArgs;
using coll::CollKind;

#define EXPECT_MSG(st, sub) EXPECT_TRUE(contains((st).message(), sub)) << "message: " << (st).message()

// ------------------------------------------------------------- validation

TEST(CommValidation, RejectsBadArgumentsWithNamedMessages) {
  run_comms(3, test_config(), [](Comm& c, int r) {
    float buf[64] = {};
    const std::string me = "rank " + std::to_string(r) + ": ";
    Status st = c.all_reduce(nullptr, buf, 16, DataType::f32, ReduceOp::sum).wait();
    EXPECT_EQ(st.code(), Result::invalid_argument);
    EXPECT_MSG(st, me + "all_reduce #1 (-, 16 x f32): sendbuf is null but count is 16");

    st = c.all_reduce(buf, nullptr, 4, DataType::f32, ReduceOp::sum).wait();
    EXPECT_EQ(st.code(), Result::invalid_argument);
    EXPECT_MSG(st, "recvbuf is null");

    st = c.all_reduce(buf, buf, 4, static_cast<DataType>(3), ReduceOp::sum).wait();
    EXPECT_EQ(st.code(), Result::invalid_argument);
    EXPECT_MSG(st, "unknown data type 3");

    st = c.all_reduce(buf, buf, 4, DataType::f32, static_cast<ReduceOp>(9)).wait();
    EXPECT_EQ(st.code(), Result::invalid_argument);
    EXPECT_MSG(st, "unknown reduction op 9");

    // Partial overlap is neither in place nor out of place.
    st = c.all_reduce(buf, buf + 1, 8, DataType::f32, ReduceOp::sum).wait();
    EXPECT_EQ(st.code(), Result::invalid_argument);
    EXPECT_MSG(st, "overlap");

    st = c.broadcast(buf, buf, 4, DataType::f32, 3).wait();
    EXPECT_EQ(st.code(), Result::invalid_argument);
    EXPECT_MSG(st, "broadcast #1 (-, 4 x f32): root 3 is not a rank of this communicator (size 3)");
    st = c.reduce(buf, buf, 4, DataType::f32, ReduceOp::sum, -1).wait();
    EXPECT_MSG(st, "root -1 is not a rank");

    // all_gather in place is sendbuf == recvbuf + rank * count; anything
    // else overlapping is an error.
    const std::size_t wrong = static_cast<std::size_t>((r + 1) % 3) * 4;
    st = c.all_gather(buf + wrong, buf, 4, DataType::f32).wait();
    EXPECT_EQ(st.code(), Result::invalid_argument);
    EXPECT_MSG(st, "in place needs sendbuf == recvbuf + rank * sendcount");
    st = c.reduce_scatter(buf, buf + wrong, 4, DataType::f32, ReduceOp::sum).wait();
    EXPECT_EQ(st.code(), Result::invalid_argument);
    EXPECT_MSG(st, "in place needs recvbuf == sendbuf + rank * recvcount");
    st = c.all_to_all(buf, buf + 2, 2, DataType::f32).wait();
    EXPECT_EQ(st.code(), Result::invalid_argument);
    EXPECT_MSG(st, "all_to_all cannot run in place");

    // all_to_allv: one entry per rank, blocks may not collide.
    std::vector<std::size_t> counts = {1, 1, 1}, displs = {0, 1, 2}, short_v = {1, 1};
    std::vector<std::size_t> clash = {0, 0, 2};
    float out[64];
    st = c.all_to_allv(buf, counts, displs, out, short_v, displs, DataType::f32).wait();
    EXPECT_EQ(st.code(), Result::invalid_argument);
    EXPECT_MSG(st, "recv_counts has 2 entries, expected 3 (one per rank)");
    st = c.all_to_allv(buf, counts, displs, out, counts, clash, DataType::f32).wait();
    EXPECT_MSG(st, "overlap in recvbuf");

    st = c.all_reduce(buf, buf, std::size_t{1} << 62, DataType::f64, ReduceOp::sum).wait();
    EXPECT_MSG(st, "overflows");

    st = c.send(buf, 1, DataType::f32, 3).wait();
    EXPECT_EQ(st.code(), Result::invalid_argument);
    EXPECT_MSG(st, me + "send #0 (to rank 3, 1 x f32): peer 3 is not a rank of this communicator (size 3)");
    st = c.recv(nullptr, 2, DataType::f32, 0).wait();
    EXPECT_MSG(st, "recv #0 (from rank 0, 2 x f32): buffer is null but count is 2");

    // Rejected calls take no sequence number: the ranks still agree, and
    // the next collective is #1 everywhere.
    std::int32_t x = r + 1, y = 0;
    st = c.all_reduce(&x, &y, 1, DataType::i32, ReduceOp::sum).wait();
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(y, 6);
    EXPECT_TRUE(c.async_error().ok()) << "argument errors must not poison";
  });
}

TEST(CommValidation, NullBuffersWithZeroCountAreFine) {
  run_comms(2, test_config(), [](Comm& c, int) {
    EXPECT_TRUE(c.all_reduce(nullptr, nullptr, 0, DataType::f32, ReduceOp::sum).wait().ok());
    EXPECT_TRUE(c.send(nullptr, 0, DataType::u8, 1 - c.rank()).wait().ok());
    EXPECT_TRUE(c.recv(nullptr, 0, DataType::u8, 1 - c.rank()).wait().ok());
  });
}

TEST(CommValidation, InPlaceAllReduceIsAccepted) {
  run_comms(4, test_config(), [](Comm& c, int r) {
    std::vector<double> v(100);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(r * 1000 + static_cast<int>(i));
    ASSERT_TRUE(c.all_reduce(v.data(), v.data(), v.size(), DataType::f64, ReduceOp::max).wait().ok());
    for (std::size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], 3000.0 + static_cast<double>(i));
  });
}

// ------------------------------------------------------------------- avg

TEST(CommAvg, FloatAverageIsExactAndBitwiseEqualOnEveryRank) {
  constexpr int n = 4;
  std::vector<std::vector<float>> results(n);
  run_comms(n, test_config(), [&](Comm& c, int r) {
    // r + 0.5 sums to 8 over 4 ranks: the average 2.0 is exact.
    std::vector<float> in(1000), out(1000, -1.f);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(r) + 0.5f + static_cast<float>(i % 7);
    ASSERT_TRUE(c.all_reduce(in.data(), out.data(), in.size(), DataType::f32, ReduceOp::avg).wait().ok());
    for (std::size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], 2.0f + static_cast<float>(i % 7)) << i;
    results[static_cast<std::size_t>(r)] = out;
  });
  for (int r = 1; r < n; ++r) {
    EXPECT_EQ(0, std::memcmp(results[0].data(), results[static_cast<std::size_t>(r)].data(), 4000));
  }
}

TEST(CommAvg, IntegerAverageTruncatesAndWorksInPlace) {
  run_comms(3, test_config(), [](Comm& c, int r) {
    std::int32_t v[2] = {r == 2 ? 2 : 1, -(r == 2 ? 2 : 1)};  // sums 4 and -4
    ASSERT_TRUE(c.all_reduce(v, v, 2, DataType::i32, ReduceOp::avg).wait().ok());
    EXPECT_EQ(v[0], 1);   // 4 / 3
    EXPECT_EQ(v[1], -1);  // towards zero
  });
}

// ------------------------------------------------------- algorithm choice

TEST(CommAlgorithm, UnknownAndUnsupportedNamesListTheValidOnes) {
  run_comms(2, test_config(), [](Comm& c, int) {
    float a[4] = {}, b[4] = {};
    Status st = c.all_reduce(a, b, 4, DataType::f32, ReduceOp::sum, {"nope"}).wait();
    EXPECT_EQ(st.code(), Result::invalid_argument);
    EXPECT_MSG(st, "all_reduce #1 (-, 4 x f32): call option: all_reduce has no algorithm 'nope' (valid: ");
    EXPECT_MSG(st, "ring");
    EXPECT_MSG(st, "tree");
    // "ring" is an all_reduce algorithm, not a barrier one.
    st = c.barrier({"ring"}).wait();
    EXPECT_EQ(st.code(), Result::invalid_argument);
    EXPECT_MSG(st, "barrier has no algorithm 'ring'");
    // A named algorithm that exists is used.
    ASSERT_TRUE(c.all_reduce(a, b, 4, DataType::f32, ReduceOp::sum, {"tree"}).wait().ok());
    EXPECT_TRUE(c.async_error().ok());
  });
}

TEST(CommAlgorithm, PrecedenceIsCallOptionThenCclzAlgoThenTuner) {
  Config cfg = test_config();
  ASSERT_TRUE(detail::parse_algo_spec("all_reduce=tree", &cfg.algo).ok());
  run_comms(2, cfg, [](Comm& c, int) {
    CollArgs a;
    a.kind = CollKind::all_reduce;
    a.count = 1 << 20;
    a.dt = DataType::f32;
    std::string name, source;
    ASSERT_TRUE(c.impl()->algorithm_for(a, {}, &name, &source).ok());
    EXPECT_EQ(name, "tree");
    EXPECT_EQ(source, "CCLZ_ALGO");
    ASSERT_TRUE(c.impl()->algorithm_for(a, {"ring"}, &name, &source).ok());
    EXPECT_EQ(name, "ring");
    EXPECT_EQ(source, "call option");
    a.kind = CollKind::barrier;
    a.count = 0;
    ASSERT_TRUE(c.impl()->algorithm_for(a, {}, &name, &source).ok());
    EXPECT_EQ(source, "tuner");
  });
}

TEST(CommAlgorithm, BareCclzAlgoNameAppliesWhereItExists) {
  Config cfg = test_config();
  ASSERT_TRUE(detail::parse_algo_spec("ring", &cfg.algo).ok());
  run_comms(3, cfg, [](Comm& c, int r) {
    CollArgs a;
    a.kind = CollKind::all_reduce;
    a.count = 8;
    a.dt = DataType::f32;
    std::string name, source;
    ASSERT_TRUE(c.impl()->algorithm_for(a, {}, &name, &source).ok());
    EXPECT_EQ(name, "ring");
    EXPECT_EQ(source, "CCLZ_ALGO");
    a.kind = CollKind::barrier;  // has no "ring": the tuner decides
    ASSERT_TRUE(c.impl()->algorithm_for(a, {}, &name, &source).ok());
    EXPECT_EQ(source, "tuner");
    std::int64_t x = r, y = -1;
    ASSERT_TRUE(c.all_reduce(&x, &y, 1, DataType::i64, ReduceOp::sum).wait().ok());
    EXPECT_EQ(y, 3);
  });
}

// ------------------------------------------------------------- CCLZ_CHECK

TEST(CommCheck, MismatchedCountsFailOnEveryRankNamingRanksAndCounts) {
  Config cfg = test_config();
  cfg.check = true;
  run_comms(3, cfg, [](Comm& c, int r) {
    std::vector<float> a(16, 1.f), b(16);
    // Matching calls pass the check.
    Status st = c.all_reduce(a.data(), b.data(), 16, DataType::f32, ReduceOp::sum).wait();
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(b[5], 3.f);
    const std::size_t count = r == 1 ? 8 : 16;
    const auto t0 = Clock::now();
    st = c.all_reduce(a.data(), b.data(), count, DataType::f32, ReduceOp::sum).wait();
    EXPECT_LT(seconds_since(t0), 5.0) << "found by the exchange, not by a timeout";
    EXPECT_EQ(st.code(), Result::invalid_usage);
    EXPECT_MSG(st, "rank " + std::to_string(r) + ": all_reduce #2 (");
    EXPECT_MSG(st, "CCLZ_CHECK: count differs between ranks: ranks 0, 2: all_reduce 16 x f32 sum; rank 1: "
                   "all_reduce 8 x f32 sum");
    // The ranks are out of step: the communicator keeps reporting the cause.
    EXPECT_EQ(c.async_error().code(), Result::invalid_usage);
    st = c.all_reduce(a.data(), b.data(), 16, DataType::f32, ReduceOp::sum).wait();
    EXPECT_EQ(st.code(), Result::invalid_usage);
    EXPECT_MSG(st, "communicator failed earlier");
  });
}

TEST(CommCheck, DifferentCollectivesDtypesOpsAndRootsAreCaught) {
  Config cfg = test_config();
  cfg.check = true;
  run_comms(2, cfg, [](Comm& c, int r) {
    float a[4] = {1, 2, 3, 4}, b[4];
    // Each mismatch poisons its communicator, so each gets its own split.
    auto fresh = [&] {
      std::unique_ptr<Comm> s;
      EXPECT_TRUE(c.split(0, r, &s).ok());
      return s;
    };
    auto s1 = fresh(), s2 = fresh(), s3 = fresh(), s4 = fresh();
    Status st = r == 0 ? s1->all_reduce(a, b, 4, DataType::f32, ReduceOp::sum).wait()
                       : s1->broadcast(a, b, 4, DataType::f32, 0).wait();
    EXPECT_EQ(st.code(), Result::invalid_usage);
    EXPECT_MSG(st, "CCLZ_CHECK: collective differs between ranks: rank 0: all_reduce 4 x f32 sum; rank 1: "
                   "broadcast 4 x f32 root 0");
    st = s2->reduce(a, b, 4, DataType::f32, ReduceOp::max, r).wait();
    EXPECT_MSG(st, "root differs");
    st = s3->all_reduce(a, b, 4, r == 0 ? DataType::f32 : DataType::i32, ReduceOp::sum).wait();
    EXPECT_MSG(st, "data type differs");
    st = s4->all_reduce(a, b, 4, DataType::f32, r == 0 ? ReduceOp::sum : ReduceOp::avg).wait();
    EXPECT_MSG(st, "op differs");
    EXPECT_TRUE(c.async_error().ok()) << "the parent is untouched";
  });
}

// ------------------------------------------------- timeouts and poisoning

TEST(CommErrors, TimeoutNamesTheMissingRankAndPoisons) {
  run_comms(2, test_config(0.3), [](Comm& c, int r) {
    float a[8] = {}, b[8];
    if (r == 0) {
      // Rank 1 never joins.
      const auto t0 = Clock::now();
      Status st = c.all_reduce(a, b, 8, DataType::f32, ReduceOp::sum, {"ring"}).wait();
      EXPECT_LT(seconds_since(t0), 5.0);
      EXPECT_EQ(st.code(), Result::timeout);
      EXPECT_MSG(st, "rank 0: all_reduce #1 (ring, 8 x f32): ");
      EXPECT_MSG(st, "waiting for rank(s) 1");
      EXPECT_MSG(st, "CCLZ_TIMEOUT=0.3 s");
      // Poisoned: the error sticks and later calls fail at once with it.
      EXPECT_EQ(c.async_error().code(), Result::timeout);
      st = c.all_reduce(a, b, 8, DataType::f32, ReduceOp::sum).wait();
      EXPECT_EQ(st.code(), Result::timeout);
      EXPECT_MSG(st, "all_reduce #2 (-, 8 x f32): communicator failed earlier: ");
      st = c.send(a, 1, DataType::f32, 0).wait();
      EXPECT_EQ(st.code(), Result::timeout);
    }
  });
}

TEST(CommErrors, ReceiveTimeoutPoisonsAndFailsQueuedWork) {
  run_comms(2, test_config(0.3), [](Comm& c, int r) {
    if (r != 0) return;
    float x = 0, y = 0;
    Request a = c.recv(&x, 1, DataType::f32, 1);  // never sent
    Request b = c.recv(&y, 1, DataType::f32, 1);  // nor this
    Status sa = a.wait();
    EXPECT_EQ(sa.code(), Result::timeout);
    EXPECT_MSG(sa, "rank 0: recv #0 (from rank 1, 1 x f32): timed out after 0.3 s (CCLZ_TIMEOUT) waiting for rank 1");
    Status sb = b.wait();
    EXPECT_EQ(sb.code(), Result::timeout);
    EXPECT_MSG(sb, "recv #1 (from rank 1, 1 x f32)");
    EXPECT_EQ(c.async_error().code(), Result::timeout);
    EXPECT_MSG(c.async_error(), "recv #0");
    Status sc = c.all_reduce(&x, &y, 1, DataType::f32, ReduceOp::sum).wait();
    EXPECT_EQ(sc.code(), Result::timeout);
    EXPECT_MSG(sc, "all_reduce #1 (-, 1 x f32): communicator failed earlier: rank 0: recv #0");
  });
}

TEST(CommErrors, AbortUnblocksLocalWaitersAndPeersEndInAnError) {
  run_comms(2, test_config(1.0), [](Comm& c, int r) {
    float x = 0;
    if (r == 0) {
      // Waits on a message that never comes; abort from another thread
      // must end the wait long before CCLZ_TIMEOUT... set generously here.
      Request q = c.recv(&x, 1, DataType::f32, 1);
      std::thread killer([&c] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        c.abort();
      });
      const auto t0 = Clock::now();
      Status st = q.wait();
      killer.join();
      EXPECT_LT(seconds_since(t0), 0.9);
      EXPECT_EQ(st.code(), Result::remote_error);
      EXPECT_MSG(st, "aborted by rank 0");
      EXPECT_EQ(c.async_error().code(), Result::remote_error);
      st = c.barrier().wait();
      EXPECT_EQ(st.code(), Result::remote_error);
      EXPECT_TRUE(c.destroy().ok());
    } else {
      // The peer of the aborted rank: bounded by its timeout, no hang.
      const auto t0 = Clock::now();
      Status st = c.recv(&x, 1, DataType::f32, 0).wait();
      EXPECT_EQ(st.code(), Result::timeout);
      EXPECT_LT(seconds_since(t0), 5.0);
    }
  });
}

TEST(CommErrors, UseAfterDestroyIsInvalidUsage) {
  run_comms(2, test_config(), [](Comm& c, int r) {
    ASSERT_TRUE(c.destroy().ok());
    EXPECT_TRUE(c.destroy().ok()) << "destroy is idempotent";
    float a = 1, b;
    Status st = c.all_reduce(&a, &b, 1, DataType::f32, ReduceOp::sum).wait();
    EXPECT_EQ(st.code(), Result::invalid_usage);
    EXPECT_MSG(st, "rank " + std::to_string(r) + ": all_reduce #1 (-, 1 x f32): communicator was destroyed");
    EXPECT_EQ(c.recv(&b, 1, DataType::f32, 0).wait().code(), Result::invalid_usage);
    std::unique_ptr<Comm> child;
    EXPECT_EQ(c.split(0, 0, &child).code(), Result::invalid_usage);
    EXPECT_EQ(c.rank(), r);  // queries still answer
  });
}

TEST(CommErrors, DestroyDrainsQueuedWork) {
  run_comms(2, test_config(), [](Comm& c, int r) {
    std::vector<std::int32_t> v(64, r + 1), w(64, 0);
    Request q = c.all_reduce(v.data(), w.data(), v.size(), DataType::i32, ReduceOp::sum);
    ASSERT_TRUE(c.destroy().ok());
    Status st;
    ASSERT_TRUE(q.test(&st)) << "destroy returned before the queued call finished";
    EXPECT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(w[63], 3);
  });
}

// ----------------------------------------------------------------- split

TEST(CommSplit, ColorsKeysAndNoColor) {
  constexpr int n = 7;
  Config cfg = test_config();
  cfg.local_size = 2;  // parent nodes: {0,1} {2,3} {4,5} {6}
  run_comms(n, cfg, [](Comm& c, int r) {
    // Rank 6 takes part but asks for no communicator; the others form
    // colors r % 3, keys descending so the order reverses.
    const int color = r == 6 ? -1 : r % 3;
    std::unique_ptr<Comm> sub;
    Status st = c.split(color, 100 - r, &sub);
    ASSERT_TRUE(st.ok()) << st.to_string();
    std::int32_t x = r, z = 0;
    // The parent still works after the split (rank 6 included).
    ASSERT_TRUE(c.all_reduce(&x, &z, 1, DataType::i32, ReduceOp::sum).wait().ok());
    EXPECT_EQ(z, 21);
    if (color < 0) {
      EXPECT_EQ(sub, nullptr);
      return;
    }
    ASSERT_NE(sub, nullptr);
    std::vector<int> members;
    for (int p = n - 2; p >= 0; --p) {
      if (p % 3 == color) members.push_back(p);
    }
    EXPECT_EQ(sub->size(), static_cast<int>(members.size()));
    const int want_rank = static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin());
    EXPECT_EQ(sub->rank(), want_rank);
    // The child keeps the parent's physical layout.
    for (int i = 0; i < sub->size(); ++i) {
      for (int j = 0; j < sub->size(); ++j) {
        const bool same_parent = c.node_of(members[static_cast<std::size_t>(i)]) ==
                                 c.node_of(members[static_cast<std::size_t>(j)]);
        EXPECT_EQ(sub->node_of(i) == sub->node_of(j), same_parent);
      }
    }
    // It works, independently of the parent: sum of the old ranks.
    std::int32_t y = -1;
    ASSERT_TRUE(sub->all_reduce(&x, &y, 1, DataType::i32, ReduceOp::sum).wait().ok());
    std::int32_t want = 0;
    for (int m : members) want += m;
    EXPECT_EQ(y, want);
    ASSERT_TRUE(sub->destroy().ok());
    EXPECT_EQ(sub->all_reduce(&x, &z, 1, DataType::i32, ReduceOp::sum).wait().code(), Result::invalid_usage);
  });
}

TEST(CommSplit, SplitOfASplitAndParentKeepsWorking) {
  run_comms(4, test_config(), [](Comm& c, int r) {
    std::unique_ptr<Comm> half, quarter;
    ASSERT_TRUE(c.split(r / 2, 0, &half).ok());
    ASSERT_TRUE(half->split(half->rank(), 0, &quarter).ok());
    EXPECT_EQ(quarter->size(), 1);
    EXPECT_EQ(quarter->rank(), 0);
    std::int32_t x = r, y = 0;
    ASSERT_TRUE(quarter->all_reduce(&x, &y, 1, DataType::i32, ReduceOp::sum).wait().ok());
    EXPECT_EQ(y, r);
    ASSERT_TRUE(c.all_reduce(&x, &y, 1, DataType::i32, ReduceOp::sum).wait().ok());
    EXPECT_EQ(y, 6);
    ASSERT_TRUE(half->all_reduce(&x, &y, 1, DataType::i32, ReduceOp::sum).wait().ok());
    EXPECT_EQ(y, r < 2 ? 1 : 5);
  });
}

// ------------------------------------------------------------- send/recv

TEST(CommP2P, MessagesBetweenAPairArriveInIssueOrder) {
  run_comms(2, test_config(), [](Comm& c, int r) {
    constexpr int k = 20;
    std::vector<std::int32_t> buf(k * 3);
    std::vector<Request> reqs;
    if (r == 0) {
      for (int i = 0; i < k; ++i) {
        for (int j = 0; j < 3; ++j) buf[static_cast<std::size_t>(3 * i + j)] = 100 * i + j;
        reqs.push_back(c.send(&buf[static_cast<std::size_t>(3 * i)], 3, DataType::i32, 1));
      }
    } else {
      for (int i = 0; i < k; ++i) reqs.push_back(c.recv(&buf[static_cast<std::size_t>(3 * i)], 3, DataType::i32, 0));
    }
    for (auto& q : reqs) ASSERT_TRUE(q.wait().ok());
    if (r == 1) {
      for (int i = 0; i < k; ++i) EXPECT_EQ(buf[static_cast<std::size_t>(3 * i)], 100 * i);
    }
  });
}

TEST(CommP2P, ExchangeBothWaysAndToSelfDoesNotDeadlock) {
  run_comms(3, test_config(), [](Comm& c, int r) {
    const int n = c.size(), next = (r + 1) % n, prev = (r + n - 1) % n;
    std::vector<double> out(1 << 16, r), in(1 << 16, -1), self_in(4, -1), self_out(4, 10.0 * r);
    // Receives posted after the sends on every rank: posting is in order
    // but nothing waits for a send before the next call is posted.
    Request s = c.send(out.data(), out.size(), DataType::f64, next);
    Request q = c.recv(in.data(), in.size(), DataType::f64, prev);
    Request ss = c.send(self_out.data(), 4, DataType::f64, r);
    Request sq = c.recv(self_in.data(), 4, DataType::f64, r);
    EXPECT_TRUE(q.wait().ok());
    EXPECT_TRUE(s.wait().ok());
    EXPECT_TRUE(sq.wait().ok());
    EXPECT_TRUE(ss.wait().ok());
    EXPECT_EQ(in[12345], prev);
    EXPECT_EQ(self_in[3], 10.0 * r);
  });
}

TEST(CommP2P, CollectivesInterleavedWithPendingReceives) {
  run_comms(2, test_config(), [](Comm& c, int r) {
    std::int32_t msg = -1, x = r + 1, y = 0;
    Request q;
    if (r == 0) q = c.recv(&msg, 1, DataType::i32, 1);  // posted first, sent after the all_reduce
    ASSERT_TRUE(c.all_reduce(&x, &y, 1, DataType::i32, ReduceOp::sum).wait().ok());
    EXPECT_EQ(y, 3);
    if (r == 1) {
      std::int32_t v = 77;
      ASSERT_TRUE(c.send(&v, 1, DataType::i32, 0).wait().ok());
    } else {
      ASSERT_TRUE(q.wait().ok());
      EXPECT_EQ(msg, 77);
    }
  });
}

TEST(CommP2P, LengthMismatchFailsTheReceiveOnly) {
  run_comms(2, test_config(), [](Comm& c, int r) {
    std::int32_t v[4] = {1, 2, 3, 4};
    if (r == 0) {
      ASSERT_TRUE(c.send(v, 2, DataType::i32, 1).wait().ok());
    } else {
      Status st = c.recv(v, 4, DataType::i32, 0).wait();
      EXPECT_EQ(st.code(), Result::invalid_usage);
      EXPECT_MSG(st, "rank 1: recv #0 (from rank 0, 4 x i32): ");
      EXPECT_TRUE(c.async_error().ok());
    }
    std::int32_t x = 1, y = 0;
    ASSERT_TRUE(c.all_reduce(&x, &y, 1, DataType::i32, ReduceOp::sum).wait().ok());
    EXPECT_EQ(y, 2);
  });
}

// -------------------------------------------------------------- requests

TEST(CommRequest, TestWaitAndCopiesShareOneResult) {
  EXPECT_TRUE(Request().test());
  EXPECT_TRUE(Request().wait().ok());
  Request f = Request::failed({Result::internal_error, "boom"});
  Status st;
  EXPECT_TRUE(f.test(&st));
  EXPECT_EQ(st.code(), Result::internal_error);
  EXPECT_EQ(f.wait().message(), "boom");

  std::atomic<int> stage{0};
  run_comms(2, test_config(), [&](Comm& c, int r) {
    std::int32_t v = 0;
    if (r == 1) {
      Request q = c.recv(&v, 1, DataType::i32, 0);
      Request copy = q;
      // Rank 0 sends only once we have seen the request unfinished.
      for (int i = 0; i < 5; ++i) {
        EXPECT_FALSE(q.test()) << "finished before the message was sent";
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      stage = 1;
      Status s2;
      while (!copy.test(&s2)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      EXPECT_TRUE(s2.ok());
      EXPECT_TRUE(q.test());  // all copies see completion
      EXPECT_TRUE(q.wait().ok());
      EXPECT_TRUE(q.wait().ok());  // waiting twice is fine
      EXPECT_EQ(v, 42);
    } else {
      while (stage.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      v = 42;
      ASSERT_TRUE(c.send(&v, 1, DataType::i32, 1).wait().ok());
    }
  });
}

TEST(CommRequest, ManyOutstandingRequestsCompleteInOrderWithoutWaiting) {
  run_comms(3, test_config(), [](Comm& c, int r) {
    constexpr int k = 50;
    std::vector<std::int32_t> in(k), out(k, -1);
    std::vector<Request> q;
    for (int i = 0; i < k; ++i) {
      in[static_cast<std::size_t>(i)] = r * i;
      q.push_back(c.all_reduce(&in[static_cast<std::size_t>(i)], &out[static_cast<std::size_t>(i)], 1,
                               DataType::i32, ReduceOp::sum));
    }
    // Nobody waits: the worker must progress them in the background.
    for (int i = k - 1; i >= 0; --i) {
      Status st;
      const auto t0 = Clock::now();
      while (!q[static_cast<std::size_t>(i)].test(&st)) {
        ASSERT_LT(seconds_since(t0), 10.0);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      ASSERT_TRUE(st.ok()) << st.to_string();
      EXPECT_EQ(out[static_cast<std::size_t>(i)], 3 * i);
    }
  });
}

// A program that waits on its calls runs them on its own thread; waking the
// worker for each would cost context switches on the caller's core (see
// Engine::submit). Calls 5 ms apart let the worker fall asleep between them,
// so before that rule every one of them woke it. A call nobody waits on or
// tests must still run in the background, within the worker's idle wait.
TEST(CommRequest, WaitedCallsLeaveTheWorkerAsleepAndUnwaitedOnesStillRun) {
  // Two CPUs for the two ranks: not oversubscribed, where wake-ups are off anyway.
  const std::vector<detail::RankInfo> infos(2, detail::RankInfo{"localhost", -1, {std::byte{0x3}}});
  run_comms(
      2, test_config(),
      [](Comm& c, int r) {
        std::int32_t in = r + 1, out = 0;
        ASSERT_TRUE(c.all_reduce(&in, &out, 1, DataType::i32, ReduceOp::sum).wait().ok());
        const std::uint64_t kicks = c.impl()->worker_kicks();
        for (int i = 0; i < 10; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
          ASSERT_TRUE(c.all_reduce(&in, &out, 1, DataType::i32, ReduceOp::sum).wait().ok());
          EXPECT_EQ(out, 3);
        }
        // A waiter preempted for more than the worker's grace period before
        // it claims its call leaves that call to the worker: allow one such.
        EXPECT_LE(c.impl()->worker_kicks() - kicks, 1u) << "waited calls woke the worker";

        std::atomic<bool> ran{false};
        out = 0;
        Request sum = c.all_reduce(&in, &out, 1, DataType::i32, ReduceOp::sum);
        Request flag = c.impl()->run_custom("flag", "", [&ran](coll::Group&) -> Status {
          ran.store(true, std::memory_order_release);
          return {};
        });
        const auto t0 = Clock::now();
        while (!ran.load(std::memory_order_acquire)) {
          ASSERT_LT(seconds_since(t0), 5.0) << "an unwaited call did not run in the background";
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        ASSERT_TRUE(sum.wait().ok());
        EXPECT_EQ(out, 3);
        ASSERT_TRUE(flag.wait().ok());
      },
      infos);
}

// ---------------------------------------------------------- custom tasks

TEST(CommCustom, CustomTasksRunInOrderWithCollectiveSequenceNumbers) {
  run_comms(3, test_config(), [](Comm& c, int r) {
    std::vector<std::uint64_t> seqs;
    std::vector<Request> q;
    // The all-reduces' buffers must outlive the loop: they run when waited on.
    std::int32_t x[3] = {1, 1, 1}, y[3] = {};
    for (int i = 0; i < 3; ++i) {
      q.push_back(c.impl()->run_custom("probe", "test", [&seqs, r](coll::Group& g) -> Status {
        seqs.push_back(g.seq());
        // A ring step over the group, like an algorithm would.
        const int n = g.size();
        int out = r, in = -1;
        Status st = g.sendrecv((g.rank() + 1) % n, &out, sizeof out, (g.rank() + n - 1) % n, &in, sizeof in, 0);
        if (st.ok() && in != (r + n - 1) % n) st = Status(Result::internal_error, "wrong neighbour");
        return st;
      }));
      q.push_back(c.all_reduce(&x[i], &y[i], 1, DataType::i32, ReduceOp::sum));
    }
    for (auto& req : q) ASSERT_TRUE(req.wait().ok());
    for (std::int32_t v : y) EXPECT_EQ(v, 3);
    // Collectives #1, #3, #5 were the probes (the group tag space is 2 * seq).
    ASSERT_EQ(seqs.size(), 3u);
    EXPECT_EQ(seqs[0], 2u);
    EXPECT_EQ(seqs[1], 6u);
    EXPECT_EQ(seqs[2], 10u);
  });
}

TEST(CommCustom, WaitingFromInsideTheEngineIsAnErrorNotADeadlock) {
  run_comms(1, test_config(), [](Comm& c, int) {
    Status inner;
    Request q = c.impl()->run_custom("nested", "", [&](coll::Group&) -> Status {
      float a = 1, b;
      Request later = c.all_reduce(&a, &b, 1, DataType::f32, ReduceOp::sum);
      inner = later.wait();
      return {};
    });
    ASSERT_TRUE(q.wait().ok());
    EXPECT_EQ(inner.code(), Result::invalid_usage);
    EXPECT_MSG(inner, "would deadlock");
  });
}

// --------------------------------------------------------------- topology

TEST(CommTopology, QueriesFollowHostNamesAndOverrides) {
  std::vector<detail::RankInfo> hosts = {{"b", -1, {}}, {"a", -1, {}}, {"b", -1, {}}, {"a", -1, {}}, {"c", -1, {}}};
  run_comms(5, test_config(), [](Comm& c, int r) {
    const int want_node[] = {0, 1, 0, 1, 2};
    const int want_local[] = {0, 0, 1, 1, 0};
    EXPECT_EQ(c.num_nodes(), 3);
    EXPECT_EQ(c.node_id(), want_node[r]);
    EXPECT_EQ(c.local_rank(), want_local[r]);
    EXPECT_EQ(c.local_size(), r == 4 ? 1 : 2);
    EXPECT_EQ(c.node_of(3), 1);
    EXPECT_EQ(c.node_of(5), -1);
  }, hosts);
}

// ---------------------------------------------------------------- logging

TEST(CommLog, InfoNamesTransportLayoutAndAlgorithmOnce) {
  Config cfg = test_config();
  cfg.log_level = detail::LogLevel::info;
  cfg.local_size = 1;
  ::testing::internal::CaptureStderr();
  run_comms(2, cfg, [](Comm& c, int) {
    float a[4] = {}, b[4];
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(c.all_reduce(a, b, 4, DataType::f32, ReduceOp::sum).wait().ok());
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(err, "cclz rank 0: INFO transport threads, rank 0 of 2, node 0 of 2")) << err;
  EXPECT_TRUE(contains(err, "cclz rank 1: INFO transport threads")) << err;
  EXPECT_TRUE(contains(err, "node layout: node 0: ranks 0 (localhost); node 1: ranks 1")) << err;
  // Where the creation's time went (CommImpl::setup_times).
  EXPECT_TRUE(contains(err, "set up in ")) << err;
  EXPECT_TRUE(contains(err, " ms (connecting 0.0 ms, shared memory ")) << err;
  // Three calls of one size class: one line per rank.
  std::size_t lines = 0;
  for (std::size_t p = err.find("all_reduce: algorithm"); p != std::string::npos;
       p = err.find("all_reduce: algorithm", p + 1)) {
    ++lines;
  }
  EXPECT_EQ(lines, 2u) << err;
}

}  // namespace
}  // namespace cclz::ctest
