// Error paths over real processes: every rank makes the same wrong call and
// must get a clear status (the right code, a message naming the rank, the
// collective and the cause) at once, with no crash and no hang; the
// communicator stays usable after a rejected argument. The ErrorsChecked
// suite needs CCLZ_CHECK=1 (argument agreement between ranks) and is run by
// its own meson test; peers that die or never arrive are in fault.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "harness.hpp"

namespace cclz::mpitest {
namespace {

using Clock = std::chrono::steady_clock;

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// The status must carry `want`, and a message that names this rank, the
// collective and (any of) the words describing the cause.
void expect_error(const Status& st, Result want, int rank, const char* coll, std::vector<const char*> cause,
                  const std::string& what) {
  SCOPED_TRACE(rank_tag() + ": " + what);
  EXPECT_EQ(st.code(), want) << "got " << st.to_string();
  const std::string m = lower(st.message());
  EXPECT_TRUE(names_rank(m, rank)) << "message does not name rank " << rank << ": " << st.message();
  EXPECT_NE(m.find(coll), std::string::npos) << "message does not name " << coll << ": " << st.message();
  bool any = cause.empty();
  for (const char* w : cause) any = any || m.find(w) != std::string::npos;
  EXPECT_TRUE(any) << "message does not say why (expected one of the words given): " << st.message();
}

// A call that fails argument checks must fail at once (not after a timeout).
Status timed_wait(Request q, const std::string& what) {
  const auto t0 = Clock::now();
  Status st = q.wait();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(secs, 5.0) << rank_tag() << ": " << what << " took " << secs << " s to be rejected";
  return st;
}

void expect_usable(Comm& c, const char* after) {
  std::int64_t x = 1, y = 0;
  Status st = c.all_reduce(&x, &y, 1, DataType::i64, ReduceOp::sum).wait();
  EXPECT_TRUE(st.ok()) << rank_tag() << ": communicator unusable after " << after << ": " << st.to_string();
  EXPECT_EQ(y, c.size());
}

TEST(Errors, NullBufferWithCount) {
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int r = c->rank(), n = c->size();
  std::vector<float> buf(64 * static_cast<std::size_t>(n), 1.0f);
  float* b = buf.data();
  const std::vector<const char*> why = {"null"};
  expect_error(timed_wait(c->all_reduce(nullptr, b, 10, DataType::f32, ReduceOp::sum), "all_reduce"),
               Result::invalid_argument, r, "all_reduce", why, "all_reduce(sendbuf=null)");
  expect_error(timed_wait(c->all_reduce(b, nullptr, 10, DataType::f32, ReduceOp::sum), "all_reduce"),
               Result::invalid_argument, r, "all_reduce", why, "all_reduce(recvbuf=null)");
  expect_error(timed_wait(c->reduce_scatter(nullptr, b, 10, DataType::f32, ReduceOp::sum), "reduce_scatter"),
               Result::invalid_argument, r, "reduce_scatter", why, "reduce_scatter(sendbuf=null)");
  expect_error(timed_wait(c->all_gather(b, nullptr, 10, DataType::f32), "all_gather"), Result::invalid_argument, r,
               "all_gather", why, "all_gather(recvbuf=null)");
  expect_error(timed_wait(c->all_to_all(nullptr, b, 10, DataType::f32), "all_to_all"), Result::invalid_argument, r,
               "all_to_all", why, "all_to_all(sendbuf=null)");
  // broadcast: the root's send buffer and everyone's receive buffer matter.
  expect_error(timed_wait(c->broadcast(b, nullptr, 10, DataType::f32, 0), "broadcast"), Result::invalid_argument, r,
               "broadcast", why, "broadcast(recvbuf=null)");
  expect_error(timed_wait(c->send(nullptr, 10, DataType::f32, (r + 1) % n), "send"), Result::invalid_argument, r,
               "send", why, "send(null)");
  expect_error(timed_wait(c->recv(nullptr, 10, DataType::f32, (r + n - 1) % n), "recv"), Result::invalid_argument, r,
               "recv", why, "recv(null)");
  expect_usable(*c, "null-buffer calls");
}

TEST(Errors, ZeroCountAcceptsNullBuffers) {
  // NCCL accepts count 0 with null pointers; frameworks rely on it.
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  Status st = c->all_reduce(nullptr, nullptr, 0, DataType::f32, ReduceOp::sum).wait();
  EXPECT_TRUE(st.ok()) << rank_tag() << ": " << st.to_string();
  st = c->all_gather(nullptr, nullptr, 0, DataType::f32).wait();
  EXPECT_TRUE(st.ok()) << rank_tag() << ": " << st.to_string();
  st = c->broadcast(nullptr, nullptr, 0, DataType::f32, 0).wait();
  EXPECT_TRUE(st.ok()) << rank_tag() << ": " << st.to_string();
  expect_usable(*c, "zero-count calls");
}

TEST(Errors, UnknownDtypeAndOp) {
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int r = c->rank();
  std::vector<std::int64_t> a(16, 1), b(16 * static_cast<std::size_t>(c->size()), 0);
  const auto bad_dt = static_cast<DataType>(42);
  const auto bad_op = static_cast<ReduceOp>(42);
  const std::vector<const char*> dt_why = {"dtype", "data type", "datatype"};
  const std::vector<const char*> op_why = {"op", "reduction"};
  expect_error(timed_wait(c->all_reduce(a.data(), b.data(), 4, bad_dt, ReduceOp::sum), "all_reduce"),
               Result::invalid_argument, r, "all_reduce", dt_why, "all_reduce(dtype=42)");
  expect_error(timed_wait(c->all_reduce(a.data(), b.data(), 4, DataType::i64, bad_op), "all_reduce"),
               Result::invalid_argument, r, "all_reduce", op_why, "all_reduce(op=42)");
  expect_error(timed_wait(c->all_reduce(a.data(), b.data(), 4, DataType::i64, static_cast<ReduceOp>(-1)), "all_reduce"),
               Result::invalid_argument, r, "all_reduce", op_why, "all_reduce(op=-1)");
  expect_error(timed_wait(c->reduce(a.data(), b.data(), 4, DataType::i64, bad_op, 0), "reduce"),
               Result::invalid_argument, r, "reduce", op_why, "reduce(op=42)");
  expect_error(timed_wait(c->all_gather(a.data(), b.data(), 4, bad_dt), "all_gather"), Result::invalid_argument, r,
               "all_gather", dt_why, "all_gather(dtype=42)");
  expect_error(timed_wait(c->broadcast(a.data(), b.data(), 4, bad_dt, 0), "broadcast"), Result::invalid_argument, r,
               "broadcast", dt_why, "broadcast(dtype=42)");
  expect_error(timed_wait(c->send(a.data(), 4, bad_dt, 0), "send"), Result::invalid_argument, r, "send", dt_why,
               "send(dtype=42)");
  expect_usable(*c, "unknown dtype/op calls");
}

TEST(Errors, AvgOnIntegersIsTruncatingNotRejected) {
  // cclz documents avg on integers as truncating division (types.hpp), so it
  // must be accepted and give sum/n rounded towards zero; the matrix checks
  // every integer type, this is the readable example with negative sums.
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int n = c->size(), r = c->rank();
  std::int32_t in[3] = {-(r + 1), r + 1, 7};
  std::int32_t out[3] = {};
  Status st = c->all_reduce(in, out, 3, DataType::i32, ReduceOp::avg).wait();
  ASSERT_TRUE(st.ok()) << rank_tag() << ": " << st.to_string();
  const std::int32_t s = n * (n + 1) / 2;
  EXPECT_EQ(out[0], -s / n);
  EXPECT_EQ(out[1], s / n);
  EXPECT_EQ(out[2], 7);
}

TEST(Errors, InvalidPeer) {
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int r = c->rank(), n = c->size();
  std::int32_t x = 0;
  const std::vector<const char*> why = {"peer"};
  for (int peer : {n, -1, n + 100}) {
    expect_error(timed_wait(c->send(&x, 1, DataType::i32, peer), "send"), Result::invalid_argument, r, "send", why,
                 "send to peer " + std::to_string(peer));
    expect_error(timed_wait(c->recv(&x, 1, DataType::i32, peer), "recv"), Result::invalid_argument, r, "recv", why,
                 "recv from peer " + std::to_string(peer));
  }
  expect_usable(*c, "invalid peers");
}

TEST(Errors, InvalidRoot) {
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int r = c->rank(), n = c->size();
  std::vector<float> a(8, 1.0f), b(8, 0.0f);
  const std::vector<const char*> why = {"root"};
  for (int root : {n, -1}) {
    expect_error(timed_wait(c->broadcast(a.data(), b.data(), 8, DataType::f32, root), "broadcast"),
                 Result::invalid_argument, r, "broadcast", why, "broadcast root " + std::to_string(root));
    expect_error(timed_wait(c->reduce(a.data(), b.data(), 8, DataType::f32, ReduceOp::sum, root), "reduce"),
                 Result::invalid_argument, r, "reduce", why, "reduce root " + std::to_string(root));
  }
  expect_usable(*c, "invalid roots");
}

TEST(Errors, UnknownOrMismatchedAlgorithm) {
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int r = c->rank();
  std::vector<float> a(8, 1.0f), b(8, 0.0f);
  CallOptions o;
  o.algorithm = "no-such-algorithm";
  expect_error(timed_wait(c->all_reduce(a.data(), b.data(), 8, DataType::f32, ReduceOp::sum, o), "all_reduce"),
               Result::invalid_argument, r, "all_reduce", {"no-such-algorithm"}, "unknown algorithm name");
  // A real algorithm of another collective is unknown for this one.
  o.algorithm = "dissemination";
  expect_error(timed_wait(c->all_reduce(a.data(), b.data(), 8, DataType::f32, ReduceOp::sum, o), "all_reduce"),
               Result::invalid_argument, r, "all_reduce", {"dissemination"}, "barrier algorithm for all_reduce");
  expect_usable(*c, "unknown algorithms");
}

TEST(Errors, UseAfterDestroy) {
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int r = c->rank(), n = c->size();
  Status st = c->destroy();
  ASSERT_TRUE(st.ok()) << rank_tag() << ": destroy: " << st.to_string();
  std::int32_t x = 1, y = 0;
  const std::vector<const char*> why = {"destroy"};
  expect_error(timed_wait(c->all_reduce(&x, &y, 1, DataType::i32, ReduceOp::sum), "all_reduce"), Result::invalid_usage,
               r, "all_reduce", why, "all_reduce after destroy");
  expect_error(timed_wait(c->barrier(), "barrier"), Result::invalid_usage, r, "barrier", why, "barrier after destroy");
  expect_error(timed_wait(c->send(&x, 1, DataType::i32, (r + 1) % n), "send"), Result::invalid_usage, r, "send", why,
               "send after destroy");
  std::unique_ptr<Comm> sub;
  st = c->split(0, 0, &sub);
  EXPECT_EQ(st.code(), Result::invalid_usage) << rank_tag() << ": split after destroy: " << st.to_string();
  EXPECT_EQ(sub, nullptr);
  // A second destroy is harmless (reports either success or misuse), and
  // the destructor after it must not crash or hang.
  st = c->destroy();
  EXPECT_TRUE(st.ok() || st.code() == Result::invalid_usage) << rank_tag() << ": second destroy: " << st.to_string();
  c.reset();
}

TEST(Errors, DestroyWaitsForQueuedWork) {
  // destroy() right after issuing collectives: the queued work completes
  // (or fails) first, and the requests still report their results.
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int n = c->size();
  std::vector<std::int32_t> a(100000, 1), b(100000, 0);
  Request q = c->all_reduce(a.data(), b.data(), a.size(), DataType::i32, ReduceOp::sum);
  Status st = c->destroy();
  EXPECT_TRUE(st.ok()) << rank_tag() << ": destroy with work queued: " << st.to_string();
  Status qs = q.wait();
  EXPECT_TRUE(qs.ok()) << rank_tag() << ": queued all_reduce: " << qs.to_string();
  if (qs.ok()) {
    EXPECT_EQ(b.front(), n);
    EXPECT_EQ(b.back(), n);
  }
}

// ---- CCLZ_CHECK=1: arguments that disagree between ranks -----------------------

class ErrorsChecked : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(env_int("CCLZ_CHECK", 0), 1) << "ErrorsChecked needs CCLZ_CHECK=1 (run by the mpi-check meson test)";
  }

  // Every rank must get an error quickly (the check is an exchange, not a
  // timeout), and the communicator then fails fast with it.
  void expect_mismatch(Comm& c, Request q, const char* coll, std::vector<const char*> why, const std::string& what) {
    const auto t0 = Clock::now();
    Status st = q.wait();
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    EXPECT_FALSE(st.ok()) << rank_tag() << ": " << what << " was not detected";
    if (st.ok()) return;
    expect_error(st, Result::invalid_usage, c.rank(), coll, why, what);
    EXPECT_LT(secs, 10.0) << rank_tag() << ": " << what << ": detected only after " << secs << " s";
    EXPECT_FALSE(c.async_error().ok()) << rank_tag() << ": async_error() after " << what;
    std::int32_t x = 1, y = 0;
    const auto t1 = Clock::now();
    Status again = c.all_reduce(&x, &y, 1, DataType::i32, ReduceOp::sum).wait();
    EXPECT_FALSE(again.ok()) << rank_tag() << ": a poisoned communicator accepted more work";
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t1).count(), 2.0) << "later calls must fail fast";
  }
};

TEST_F(ErrorsChecked, CountMismatch) {
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  if (c->size() < 2) GTEST_SKIP() << "one rank cannot disagree with itself";
  const int r = c->rank();
  std::vector<float> a(64, 1.0f), b(64, 0.0f);
  const std::size_t count = r == 0 ? 10 : 11;
  expect_mismatch(*c, c->all_reduce(a.data(), b.data(), count, DataType::f32, ReduceOp::sum), "all_reduce",
                  {"count"}, "all_reduce with count 10 on rank 0, 11 elsewhere");
}

TEST_F(ErrorsChecked, DtypeOpRootAndCollectiveMismatch) {
  std::unique_ptr<Comm> world_copy = fresh_comm();
  ASSERT_NE(world_copy, nullptr);
  if (world_copy->size() < 2) GTEST_SKIP() << "one rank cannot disagree with itself";
  const int r = world_copy->rank(), n = world_copy->size();
  std::vector<float> a(64 * static_cast<std::size_t>(n), 1.0f), b(64 * static_cast<std::size_t>(n), 0.0f);
  // Each mismatch poisons its communicator, so each gets its own.
  auto fresh = [&]() {
    std::unique_ptr<Comm> c;
    Status st = world_copy->split(0, r, &c);
    EXPECT_TRUE(st.ok()) << st.to_string();
    return c;
  };
  if (auto c = fresh()) {
    const DataType dt = r == n - 1 ? DataType::i32 : DataType::f32;
    expect_mismatch(*c, c->all_reduce(a.data(), b.data(), 8, dt, ReduceOp::sum), "all_reduce",
                    {"dtype", "data type", "datatype"}, "dtype mismatch");
  }
  if (auto c = fresh()) {
    const ReduceOp op = r == n - 1 ? ReduceOp::max : ReduceOp::sum;
    expect_mismatch(*c, c->all_reduce(a.data(), b.data(), 8, DataType::f32, op), "all_reduce", {"op"}, "op mismatch");
  }
  if (auto c = fresh()) {
    const int root = r == n - 1 ? 1 : 0;
    expect_mismatch(*c, c->broadcast(a.data(), b.data(), 8, DataType::f32, root), "broadcast", {"root"},
                    "root mismatch");
  }
  if (auto c = fresh()) {
    Request q = r == n - 1 ? c->all_gather(a.data(), b.data(), 8, DataType::f32)
                           : c->all_reduce(a.data(), b.data(), 8, DataType::f32, ReduceOp::sum);
    expect_mismatch(*c, q, r == n - 1 ? "all_gather" : "all_reduce", {"all_gather", "all_reduce", "collective"},
                    "different collectives on different ranks");
  }
}

}  // namespace
}  // namespace cclz::mpitest
