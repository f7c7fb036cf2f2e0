// The C API over in-process communicators (handles made through the
// c_handle_from_comm testing door): results and messages, requests,
// split, use after destroy and abort.
#include <gtest/gtest.h>

#include <cstring>

#include "cclz/cclz.h"
#include "harness.hpp"
#include "thread_transport.hpp"

namespace cclz::ctest {
namespace {

// run_comms, with a C handle per rank; fn owns destroying it.
void run_c(int n, const std::function<void(cclzComm_t, int)>& fn, double timeout_s = 20) {
  auto fabric = std::make_shared<testing::ThreadFabric>(n);
  auto connector = thread_connector();
  run_threads(n, [&](int r) {
    detail::World w;
    w.transport = std::make_unique<testing::ThreadTransport>(fabric, r);
    w.ranks.assign(static_cast<std::size_t>(n), {"localhost", -1, {}});
    std::unique_ptr<Comm> c;
    ASSERT_TRUE(detail::make_comm(std::move(w), test_config(timeout_s), &c, connector).ok());
    fn(detail::c_handle_from_comm(std::move(c)), r);
  });
}

TEST(CApi, EnumValuesMatchTheCppOnes) {
  EXPECT_EQ(static_cast<int>(cclzFloat16), static_cast<int>(DataType::f16));
  EXPECT_EQ(static_cast<int>(cclzUint8), static_cast<int>(DataType::u8));
  EXPECT_EQ(static_cast<int>(cclzFloat64), static_cast<int>(DataType::f64));
  EXPECT_EQ(static_cast<int>(cclzMin), static_cast<int>(ReduceOp::min));
  EXPECT_EQ(static_cast<int>(cclzRemoteError), static_cast<int>(Result::remote_error));
  EXPECT_STREQ(cclzGetErrorString(cclzSuccess), "no error");
  EXPECT_NE(std::strstr(cclzGetErrorString(cclzTimeout), "timeout"), nullptr);
}

TEST(CApi, CollectivesQueriesAndRequests) {
  run_c(3, [](cclzComm_t c, int r) {
    int n = -1, me = -1, local = -1, node = -1;
    ASSERT_EQ(cclzCommCount(c, &n), cclzSuccess);
    ASSERT_EQ(cclzCommUserRank(c, &me), cclzSuccess);
    ASSERT_EQ(cclzCommLocalRank(c, &local), cclzSuccess);
    ASSERT_EQ(cclzCommNodeId(c, &node), cclzSuccess);
    EXPECT_EQ(n, 3);
    EXPECT_EQ(me, r);
    EXPECT_EQ(local, r);
    EXPECT_EQ(node, 0);

    int x[4] = {r, r, r, r}, y[4] = {};
    ASSERT_EQ(cclzAllReduce(x, y, 4, cclzInt32, cclzSum, c), cclzSuccess) << cclzGetLastError(c);
    EXPECT_EQ(y[3], 3);

    cclzRequest_t q = nullptr;
    ASSERT_EQ(cclzIallReduce(x, y, 4, cclzInt32, cclzMax, c, &q), cclzSuccess);
    ASSERT_NE(q, nullptr);
    int done = 0;
    while (!done) ASSERT_EQ(cclzTest(&q, &done), cclzSuccess);
    EXPECT_EQ(q, nullptr) << "a completed request is freed and cleared";
    EXPECT_EQ(y[0], 2);
    EXPECT_EQ(cclzWait(&q), cclzSuccess) << "waiting on a cleared request is a no-op";

    // Point to point in a ring, non-blocking both ways.
    double out = 1.5 * r, in = -1;
    cclzRequest_t s = nullptr, rv = nullptr;
    ASSERT_EQ(cclzIrecv(&in, 1, cclzFloat64, (r + 2) % 3, c, &rv), cclzSuccess);
    ASSERT_EQ(cclzIsend(&out, 1, cclzFloat64, (r + 1) % 3, c, &s), cclzSuccess);
    EXPECT_EQ(cclzWait(&s), cclzSuccess);
    EXPECT_EQ(cclzWait(&rv), cclzSuccess);
    EXPECT_EQ(in, 1.5 * ((r + 2) % 3));

    // Errors: code plus this thread's message.
    EXPECT_EQ(cclzAllReduce(nullptr, y, 4, cclzInt32, cclzSum, c), cclzInvalidArgument);
    EXPECT_NE(std::strstr(cclzGetLastError(c), "sendbuf is null"), nullptr) << cclzGetLastError(c);
    EXPECT_EQ(cclzIallReduce(x, y, 4, static_cast<cclzDataType_t>(3), cclzSum, c, &q), cclzInvalidArgument);
    EXPECT_EQ(q, nullptr);
    EXPECT_EQ(cclzSend(x, 1, cclzInt32, 9, c), cclzInvalidArgument);
    EXPECT_NE(std::strstr(cclzGetLastError(nullptr), "peer 9"), nullptr);

    cclzResult_t async = cclzInternalError;
    ASSERT_EQ(cclzCommGetAsyncError(c, &async), cclzSuccess);
    EXPECT_EQ(async, cclzSuccess);
    EXPECT_EQ(cclzCommDestroy(c), cclzSuccess);
  });
}

TEST(CApi, UseAfterDestroyIsInvalidUsageNotACrash) {
  run_c(2, [](cclzComm_t c, int) {
    ASSERT_EQ(cclzCommDestroy(c), cclzSuccess);
    float a = 1, b = 0;
    int n = 0;
    EXPECT_EQ(cclzAllReduce(&a, &b, 1, cclzFloat32, cclzSum, c), cclzInvalidUsage);
    EXPECT_NE(std::strstr(cclzGetLastError(c), "communicator was destroyed"), nullptr) << cclzGetLastError(c);
    EXPECT_EQ(cclzCommCount(c, &n), cclzInvalidUsage);
    cclzRequest_t q = nullptr;
    EXPECT_EQ(cclzIbarrier(c, &q), cclzInvalidUsage);
    EXPECT_EQ(q, nullptr);
    EXPECT_EQ(cclzCommDestroy(c), cclzInvalidUsage);
    EXPECT_EQ(cclzCommAbort(c), cclzInvalidUsage);
  });
  int n = 0, not_a_comm = 0;
  EXPECT_EQ(cclzCommCount(nullptr, &n), cclzInvalidArgument);
  EXPECT_EQ(cclzCommCount(reinterpret_cast<cclzComm_t>(&not_a_comm), &n), cclzInvalidArgument);
  EXPECT_EQ(cclzWait(nullptr), cclzInvalidArgument);
}

TEST(CApi, SplitAndAbort) {
  run_c(4, [](cclzComm_t c, int r) {
    cclzComm_t sub = nullptr;
    ASSERT_EQ(cclzCommSplit(c, r == 3 ? -1 : r % 2, -r, &sub), cclzSuccess) << cclzGetLastError(c);
    if (r == 3) {
      EXPECT_EQ(sub, nullptr);
    } else {
      ASSERT_NE(sub, nullptr);
      int n = 0, me = -1;
      ASSERT_EQ(cclzCommCount(sub, &n), cclzSuccess);
      ASSERT_EQ(cclzCommUserRank(sub, &me), cclzSuccess);
      EXPECT_EQ(n, r % 2 == 0 ? 2 : 1);               // {0, 2} and {1}
      EXPECT_EQ(me, r == 0 ? 1 : 0);                  // key -r: rank 2 first
      long long v = r, s = 0;
      ASSERT_EQ(cclzAllReduce(&v, &s, 1, cclzInt64, cclzSum, sub), cclzSuccess);
      EXPECT_EQ(s, r % 2 == 0 ? 2 : 1);
      ASSERT_EQ(cclzCommAbort(sub), cclzSuccess);
      EXPECT_EQ(cclzAllReduce(&v, &s, 1, cclzInt64, cclzSum, sub), cclzInvalidUsage);
    }
    int one = 1, all = 0;  // the parent still works
    EXPECT_EQ(cclzAllReduce(&one, &all, 1, cclzInt32, cclzSum, c), cclzSuccess) << cclzGetLastError(c);
    EXPECT_EQ(all, 4);
    EXPECT_EQ(cclzCommDestroy(c), cclzSuccess);
  });
}

}  // namespace
}  // namespace cclz::ctest
