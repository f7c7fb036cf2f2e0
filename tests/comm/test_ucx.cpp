// Communicators over the real bootstrap and UCX transport: unique-id
// creation for 1..4 ranks as threads, the C API, the torchrun-style
// environment launch as child processes on 127.0.0.1 (with CCLZ_MASTER_PORT
// beside an occupied MASTER_PORT), and an abort seen from another process.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "cclz/cclz.h"
#include "harness.hpp"

namespace cclz::ctest {
namespace {

#if CCLZ_HAVE_UCX

TEST(UcxComm, UniqueIdForOneToFourRanksAsThreads) {
  for (int n = 1; n <= 4; ++n) {
    UniqueId id{};
    Status st = Comm::create_unique_id(&id);
    ASSERT_TRUE(st.ok()) << st.to_string();
    run_threads(n, [&](int r) {
      std::unique_ptr<Comm> c;
      Status s = Comm::init_rank(&c, n, id, r);
      ASSERT_TRUE(s.ok()) << s.to_string();
      EXPECT_EQ(c->rank(), r);
      EXPECT_EQ(c->size(), n);
      EXPECT_EQ(c->num_nodes(), 1) << "one host";
      EXPECT_EQ(c->local_rank(), r);
      std::vector<std::int32_t> v(1000, r + 1), w(1000, 0);
      ASSERT_TRUE(c->all_reduce(v.data(), w.data(), v.size(), DataType::i32, ReduceOp::sum).wait().ok());
      EXPECT_EQ(w[999], n * (n + 1) / 2);
      // Split over the UCX parent, then use the child.
      std::unique_ptr<Comm> sub;
      ASSERT_TRUE(c->split(r % 2, r, &sub).ok());
      std::int32_t x = 1, y = 0;
      ASSERT_TRUE(sub->all_reduce(&x, &y, 1, DataType::i32, ReduceOp::sum).wait().ok());
      EXPECT_EQ(y, sub->size());
      EXPECT_EQ(sub->size(), (n + 1 - r % 2) / 2);
      EXPECT_TRUE(sub->destroy().ok());
      EXPECT_TRUE(c->destroy().ok());
    });
  }
}

TEST(UcxComm, CApiInitRankFromThreads) {
  cclzUniqueId id;
  ASSERT_EQ(cclzGetUniqueId(&id), cclzSuccess) << cclzGetLastError(nullptr);
  run_threads(2, [&](int r) {
    cclzComm_t c = nullptr;
    ASSERT_EQ(cclzCommInitRank(&c, 2, id, r), cclzSuccess) << cclzGetLastError(nullptr);
    double v = r + 0.25, s = 0;
    ASSERT_EQ(cclzAllReduce(&v, &s, 1, cclzFloat64, cclzSum, c), cclzSuccess) << cclzGetLastError(c);
    EXPECT_EQ(s, 1.5);
    ASSERT_EQ(cclzCommDestroy(c), cclzSuccess);
    EXPECT_EQ(cclzAllReduce(&v, &s, 1, cclzFloat64, cclzSum, c), cclzInvalidUsage);
  });
}

TEST(UcxComm, InitRankRejectsBadRanks) {
  UniqueId id{};
  std::unique_ptr<Comm> c;
  Status st = Comm::init_rank(&c, 2, id, 2);
  EXPECT_EQ(st.code(), Result::invalid_argument);
  EXPECT_TRUE(contains(st.message(), "rank 2 is not in [0, nranks = 2)")) << st.message();
}

// A listening socket on 127.0.0.1 that keeps a port busy.
struct BusyPort {
  int fd = -1, port = -1;
  BusyPort() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 1) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      port = ntohs(a.sin_port);
    }
  }
  ~BusyPort() { ::close(fd); }
};

void run_env_children(int n, bool use_cclz_port) {
  BusyPort busy;  // stands for torch's store on MASTER_PORT
  ASSERT_GT(busy.port, 0);
  const int port = use_cclz_port ? free_port() : free_port();
  ASSERT_GT(port, 0);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> env = {"RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(n),
                                    "MASTER_ADDR=127.0.0.1", "LOCAL_RANK=" + std::to_string(r),
                                    "CCLZ_TIMEOUT=30"};
    if (use_cclz_port) {
      env.push_back("MASTER_PORT=" + std::to_string(busy.port));
      env.push_back("CCLZ_MASTER_PORT=" + std::to_string(port));
    } else {
      env.push_back("MASTER_PORT=" + std::to_string(port));
      env.push_back("CCLZ_MASTER_PORT=");
    }
    pids.push_back(spawn_child({"env"}, env));
    ASSERT_GT(pids.back(), 0);
  }
  for (int r = 0; r < n; ++r) EXPECT_EQ(wait_child(pids[static_cast<std::size_t>(r)], 60), 0) << "rank " << r;
}

TEST(UcxComm, InitFromEnvThreeProcesses) { run_env_children(3, false); }

TEST(UcxComm, InitFromEnvCclzMasterPortBesideABusyMasterPort) { run_env_children(2, true); }

TEST(UcxComm, InitFromEnvNamesMissingVariables) {
  // Only reads the environment (no rendezvous): safe in this process.
  const char* saved = std::getenv("WORLD_SIZE");
  std::string keep = saved ? saved : "";
  ::unsetenv("WORLD_SIZE");
  std::unique_ptr<Comm> c;
  Status st = Comm::init_from_env(&c);
  EXPECT_EQ(st.code(), Result::invalid_argument);
  EXPECT_TRUE(contains(st.message(), "WORLD_SIZE is not set")) << st.message();
  if (saved) ::setenv("WORLD_SIZE", keep.c_str(), 1);
}

TEST(UcxComm, AbortedPeerProcessEndsInAnErrorNotAHang) {
  const int port = free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    pids.push_back(spawn_child({"abort"}, {"RANK=" + std::to_string(r), "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
                                           "MASTER_PORT=" + std::to_string(port), "CCLZ_MASTER_PORT=",
                                           "CCLZ_TIMEOUT=5"}));
  }
  for (int r = 0; r < 2; ++r) EXPECT_EQ(wait_child(pids[static_cast<std::size_t>(r)], 40), 0) << "rank " << r;
}

#else
TEST(UcxComm, SkippedWithoutUcx) { GTEST_SKIP() << "cclz was built without UCX"; }
#endif

}  // namespace

// ------------------------------------------------------------ child side

int child_main(int argc, char** argv) {
  if (argc < 3) return 2;
  const std::string role = argv[2];
  std::unique_ptr<Comm> c;
  Status st = Comm::init_from_env(&c);
  if (!st.ok()) {
    std::fprintf(stderr, "child %s: init_from_env: %s\n", role.c_str(), st.to_string().c_str());
    return 1;
  }
  const int r = c->rank(), n = c->size();
  if (role == "env") {
    if (c->local_rank() != r || c->num_nodes() != 1) {
      std::fprintf(stderr, "rank %d: bad layout local %d nodes %d\n", r, c->local_rank(), c->num_nodes());
      return 1;
    }
    std::vector<float> v(4096, static_cast<float>(r + 1)), w(4096, 0);
    st = c->all_reduce(v.data(), w.data(), v.size(), DataType::f32, ReduceOp::sum).wait();
    if (!st.ok() || w[4095] != static_cast<float>(n * (n + 1) / 2)) {
      std::fprintf(stderr, "rank %d: all_reduce: %s (%g)\n", r, st.to_string().c_str(), w[4095]);
      return 1;
    }
    return c->destroy().ok() ? 0 : 1;
  }
  if (role == "abort") {
    if (r == 1) {
      // Aborts instead of joining the all-reduce, then lingers so rank 0
      // sees an abort rather than a process exit.
      c->abort();
      std::this_thread::sleep_for(std::chrono::seconds(1));
      return c->async_error().code() == Result::remote_error ? 0 : 1;
    }
    const auto t0 = Clock::now();
    float x = 1, y = 0;
    st = c->all_reduce(&x, &y, 1, DataType::f32, ReduceOp::sum).wait();
    const double took = seconds_since(t0);
    std::fprintf(stderr, "rank 0 after the peer's abort (%.2f s): %s\n", took, st.to_string().c_str());
    const bool ended_in_error = st.code() == Result::remote_error || st.code() == Result::timeout;
    return ended_in_error && took < 15 && !c->async_error().ok() ? 0 : 1;
  }
  return 2;
}

}  // namespace cclz::ctest
