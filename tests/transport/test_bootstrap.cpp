// Bootstrap tests: unique-id and host:port rendezvous (ranks as threads),
// the errors a rendezvous can end in (missing rank, disagreeing nranks,
// duplicate rank, unreachable root, bad id) and the split exchange.
#include <gtest/gtest.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "harness.hpp"
#include "socket.hpp"

namespace cclz::ttest {
namespace {

namespace net = detail::net;

std::string my_hostname() {
  char h[256] = {};
  ::gethostname(h, sizeof h - 1);
  return h;
}

// A port that was free a moment ago (bound to 0, then released).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Every rank sends its rank to the next and checks what the previous sent:
// proves each endpoint pair carries bytes after the rendezvous.
void check_ring(Transport& t, int rank) {
  const int n = t.size();
  int out = 1000 + rank, in = -1;
  const Status st = sendrecv(t, (rank + 1) % n, &out, sizeof out, (rank + n - 1) % n, &in, sizeof in, 5);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(in, 1000 + (rank + n - 1) % n);
}

class UniqueIdRendezvous : public ::testing::TestWithParam<int> {};

TEST_P(UniqueIdRendezvous, EveryRankGetsTheTableAndConnects) {
  const int n = GetParam();
  const std::string host = my_hostname();
  run_world(n, [&](World& w, int rank) {
    ASSERT_NE(w.transport, nullptr);
    EXPECT_EQ(w.transport->rank(), rank);
    EXPECT_EQ(w.transport->size(), n);
    EXPECT_STREQ(w.transport->name(), "ucx");
    ASSERT_EQ(w.ranks.size(), static_cast<std::size_t>(n));
    for (const auto& info : w.ranks) {
      EXPECT_EQ(info.hostname, host);
      EXPECT_EQ(info.node_override, -1);
    }
    check_ring(*w.transport, rank);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, UniqueIdRendezvous, ::testing::Values(1, 2, 3, 5));

TEST(Bootstrap, NodeIdComesFromTheEnvironment) {
  ::setenv("CCLZ_NODE_ID", "7", 1);
  run_world(2, [](World& w, int) {
    ASSERT_EQ(w.ranks.size(), 2u);
    EXPECT_EQ(w.ranks[0].node_override, 7);
    EXPECT_EQ(w.ranks[1].node_override, 7);
  });
  ::setenv("CCLZ_NODE_ID", "seven", 1);
  UniqueId id;
  ASSERT_TRUE(detail::make_unique_id(&id).ok());
  World w;
  const Status st = detail::connect_unique_id(id, 1, 0, after(2), &w);
  ::unsetenv("CCLZ_NODE_ID");
  EXPECT_EQ(st.code(), Result::invalid_argument) << st.to_string();
  EXPECT_NE(st.message().find("CCLZ_NODE_ID"), std::string::npos) << st.message();
}

TEST(Bootstrap, HostPortOnLoopbackWithRankZeroStartingLast) {
  const int port = free_port();
  const int n = 3;
  run_threads(n, [&](int rank) {
    // Ranks 1 and 2 start before the root exists: they must retry.
    if (rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    World w;
    const Status st = detail::connect_host_port("127.0.0.1", port, n, rank, after(10), &w);
    ASSERT_TRUE(st.ok()) << "rank " << rank << ": " << st.to_string();
    ASSERT_EQ(w.ranks.size(), static_cast<std::size_t>(n));
    check_ring(*w.transport, rank);
  });
}

TEST(Bootstrap, HostPortCanBeReusedForASecondCommunicator) {
  const int port = free_port();
  for (int round = 0; round < 2; ++round) {
    run_threads(2, [&](int rank) {
      World w;
      const Status st = detail::connect_host_port("localhost", port, 2, rank, after(10), &w);
      ASSERT_TRUE(st.ok()) << "round " << round << " rank " << rank << ": " << st.to_string();
      check_ring(*w.transport, rank);
    });
  }
}

TEST(Bootstrap, MissingRanksAreNamedOnTheRanksThatArrived) {
  UniqueId id;
  ASSERT_TRUE(detail::make_unique_id(&id).ok());
  const double timeout = 1.5;
  const int present[] = {0, 2};
  run_threads(2, [&](int i) {
    const int rank = present[i];
    const auto t0 = Clock::now();
    World w;
    const Status st = detail::connect_unique_id(id, 4, rank, after(timeout), &w);
    const double took = seconds_since(t0);
    EXPECT_EQ(st.code(), Result::timeout) << st.to_string();
    EXPECT_NE(st.message().find("2 of 4 ranks arrived"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("missing rank(s) 1, 3"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("rendezvous at "), std::string::npos) << st.message();
    EXPECT_GE(took, timeout - 0.2);
    EXPECT_LT(took, timeout + 1.0);  // the root answers at the deadline, not after the grace period
  });
}

TEST(Bootstrap, RanksThatDisagreeOnTheSizeAllFail) {
  UniqueId id;
  ASSERT_TRUE(detail::make_unique_id(&id).ok());
  const int sizes[] = {2, 3};
  run_threads(2, [&](int i) {
    if (i == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));  // rank 0 arrives first
    const auto t0 = Clock::now();
    World w;
    const Status st = detail::connect_unique_id(id, sizes[i], i, after(5), &w);
    EXPECT_EQ(st.code(), Result::invalid_usage) << st.to_string();
    EXPECT_NE(st.message().find("disagree on the number of ranks"), std::string::npos) << st.message();
    EXPECT_LT(seconds_since(t0), 2.0);  // told at once, not at the deadline
  });
}

TEST(Bootstrap, DuplicateRankFailsEveryone) {
  UniqueId id;
  ASSERT_TRUE(detail::make_unique_id(&id).ok());
  run_threads(3, [&](int i) {
    const int rank = i == 2 ? 1 : i;  // ranks 0, 1, 1
    if (i == 2) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    World w;
    const Status st = detail::connect_unique_id(id, 3, rank, after(5), &w);
    EXPECT_EQ(st.code(), Result::invalid_usage) << st.to_string();
    EXPECT_NE(st.message().find("rank 1 joined twice"), std::string::npos) << st.message();
  });
}

TEST(Bootstrap, UnreachableRootFailsAtTheDeadlineNamingTheAddress) {
  const int port = free_port();
  const auto t0 = Clock::now();
  World w;
  const Status st = detail::connect_host_port("127.0.0.1", port, 2, 1, after(0.6), &w);
  const double took = seconds_since(t0);
  EXPECT_EQ(st.code(), Result::timeout) << st.to_string();
  EXPECT_NE(st.message().find("127.0.0.1:" + std::to_string(port)), std::string::npos) << st.message();
  EXPECT_GE(took, 0.5);
  EXPECT_LT(took, 1.5);
}

// Moves the calling thread into a network namespace of its own with
// loopback up. Returns why it could not ("" when done): it needs
// CAP_SYS_ADMIN and CAP_NET_ADMIN.
std::string private_loopback() {
  if (::unshare(CLONE_NEWNET) != 0) return std::string("unshare(CLONE_NEWNET): ") + std::strerror(errno);
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  ifr.ifr_flags = IFF_UP;
  const bool up = fd >= 0 && ::ioctl(fd, SIOCSIFFLAGS, &ifr) == 0;
  if (fd >= 0) ::close(fd);
  return up ? "" : "cannot bring up lo in the new namespace";
}

// The source ports connects may take in the calling thread's namespace.
bool set_source_ports(int lo, int hi) {
  FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "w");
  if (f == nullptr) return false;
  const bool set = std::fprintf(f, "%d %d", lo, hi) > 0;
  return std::fclose(f) == 0 && set;
}

int local_port(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  return ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0 ? ntohs(a.sin_port) : -1;
}

// A rank that dials the root before the root listens, on a port the kernel
// may also hand out as a source port: on loopback the connect can pick
// that very port and connect to itself (TCP simultaneous open). Taken for
// the root, such a socket carried nothing and held the port, and the root
// then failed with "Address already in use" (seen in the fault suite).
// Here the root's port is the only source port at first, so every attempt
// connects to itself unless the library refuses it.
TEST(Bootstrap, ConnectNeverTakesItselfForTheRoot) {
  std::string skipped;
  std::thread([&] {
    skipped = private_loopback();
    if (!skipped.empty()) return;
    constexpr int kPort = 40000;
    ASSERT_TRUE(set_source_ports(kPort, kPort));
    net::SockAddr root;
    ASSERT_TRUE(net::resolve("127.0.0.1", kPort, &root).ok());
    // Nobody listens: the call must run to its deadline.
    net::Fd fd;
    Status st = net::connect_retry(root, after(0.5), &fd);
    EXPECT_EQ(st.code(), Result::timeout) << st.to_string() << " (connected from port " << local_port(fd.get())
                                          << ")";

    // The root arrives late, on the port the rank's attempts keep taking:
    // it must still bind it, and the rank then reach it from the other.
    ASSERT_TRUE(set_source_ports(kPort, kPort + 1));
    std::thread dialer([&] { st = net::connect_retry(root, after(5), &fd); });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    net::Fd listener;
    net::SockAddr bound;
    const Status ls = net::listen_on(root, true, 16, &listener, &bound);
    EXPECT_TRUE(ls.ok()) << ls.to_string();
    dialer.join();
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(local_port(fd.get()), kPort + 1);
  }).join();
  if (!skipped.empty()) GTEST_SKIP() << "needs a network namespace of its own: " << skipped;
}

TEST(Bootstrap, RejectsBadArguments) {
  UniqueId id{};
  World w;
  EXPECT_EQ(detail::connect_unique_id(id, 2, 0, after(1), &w).code(), Result::invalid_argument);
  ASSERT_TRUE(detail::make_unique_id(&id).ok());
  EXPECT_EQ(detail::connect_unique_id(id, 2, 2, after(1), &w).code(), Result::invalid_argument);
  EXPECT_EQ(detail::connect_unique_id(id, 0, 0, after(1), &w).code(), Result::invalid_argument);
  EXPECT_EQ(detail::connect_host_port("127.0.0.1", 0, 1, 0, after(1), &w).code(), Result::invalid_argument);
  EXPECT_EQ(detail::connect_host_port("no-such-host.invalid", 5000, 1, 0, after(1), &w).code(),
            Result::system_error);
}

TEST(Bootstrap, HostPortOverIpv6Loopback) {
  const int port = free_port();
  run_threads(2, [&](int rank) {
    World w;
    const Status st = detail::connect_host_port("::1", port, 2, rank, after(10), &w);
    ASSERT_TRUE(st.ok()) << "rank " << rank << ": " << st.to_string();
    check_ring(*w.transport, rank);
  });
}

// CCLZ_SOCKET_IFNAME picks the interface the unique id advertises (seen in
// the root's messages); one that matches nothing is an error.
TEST(Bootstrap, SocketIfnameChoosesTheAdvertisedAddress) {
  ::setenv("CCLZ_SOCKET_IFNAME", "lo", 1);
  UniqueId id;
  const Status made = detail::make_unique_id(&id);
  ::setenv("CCLZ_SOCKET_IFNAME", "no-such-interface", 1);
  UniqueId bad;
  const Status made_bad = detail::make_unique_id(&bad);
  ::unsetenv("CCLZ_SOCKET_IFNAME");
  ASSERT_TRUE(made.ok()) << made.to_string();
  EXPECT_EQ(made_bad.code(), Result::invalid_argument) << made_bad.to_string();
  World w;
  const Status st = detail::connect_unique_id(id, 2, 5, after(2), &w);  // rank out of range: checked locally
  EXPECT_EQ(st.code(), Result::invalid_argument);
  // Rank 0 asks for 2 ranks, rank 1 for 3: the root's verdict names its address.
  run_threads(2, [&](int i) {
    if (i == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    World x;
    const Status s2 = detail::connect_unique_id(id, i + 2, i, after(5), &x);
    EXPECT_EQ(s2.code(), Result::invalid_usage) << s2.to_string();
    EXPECT_NE(s2.message().find("rendezvous at 127.0.0.1:"), std::string::npos) << s2.message();
  });
}

// A process that exits while its root thread still waits for ranks must exit
// cleanly (the thread owns all it touches).
TEST(Bootstrap, ProcessExitWhileTheRootWaitsIsClean) {
  UniqueId unused;
  ASSERT_TRUE(detail::make_unique_id(&unused).ok());
  const pid_t child = spawn_child({"root_then_exit", id_to_hex(unused)});
  ASSERT_GT(child, 0);
  EXPECT_EQ(wait_child(child, 10), 0);
}

TEST(Bootstrap, AnUnboundedDeadlineWorks) {
  UniqueId id;
  ASSERT_TRUE(detail::make_unique_id(&id).ok());
  World w;
  const Status st = detail::connect_unique_id(id, 1, 0, Clock::time_point::max(), &w);
  ASSERT_TRUE(st.ok()) << st.to_string();
  int out = 5, in = 0;
  ASSERT_TRUE(sendrecv(*w.transport, 0, &out, sizeof out, 0, &in, sizeof in, 1, 5).ok());
  EXPECT_EQ(in, 5);
}

TEST(Bootstrap, UniqueIdsDiffer) {
  UniqueId a, b;
  ASSERT_TRUE(detail::make_unique_id(&a).ok());
  ASSERT_TRUE(detail::make_unique_id(&b).ok());
  EXPECT_NE(id_to_hex(a), id_to_hex(b));
  // Serve both so their root threads exit.
  for (const UniqueId* id : {&a, &b}) {
    World w;
    EXPECT_TRUE(detail::connect_unique_id(*id, 1, 0, after(5), &w).ok());
  }
}

// Split: two disjoint sub-groups of a 5-rank world connect at the same
// time (different tag bases), with members listed out of parent order.
TEST(Bootstrap, SubgroupsConnectOverTheParentTransport) {
  const std::vector<int> group_a = {4, 1, 3};
  const std::vector<int> group_b = {2, 0};
  run_world(5, [&](World& parent, int rank) {
    const bool in_a = std::find(group_a.begin(), group_a.end(), rank) != group_a.end();
    const auto& members = in_a ? group_a : group_b;
    World sub;
    const Status st =
        detail::connect_subgroup(*parent.transport, members, in_a ? 100 : 200, parent.ranks, after(5), &sub);
    ASSERT_TRUE(st.ok()) << "rank " << rank << ": " << st.to_string();
    const int me = static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
    EXPECT_EQ(sub.transport->rank(), me);
    EXPECT_EQ(sub.transport->size(), static_cast<int>(members.size()));
    ASSERT_EQ(sub.ranks.size(), members.size());
    for (std::size_t i = 0; i < members.size(); ++i) {
      EXPECT_EQ(sub.ranks[i].hostname, parent.ranks[static_cast<std::size_t>(members[i])].hostname);
    }
    // Bytes in the sub-group carry the parent rank, to check who talks to whom.
    const int n = sub.transport->size();
    int out = rank, in = -1;
    const Status ex = sendrecv(*sub.transport, (me + 1) % n, &out, sizeof out, (me + n - 1) % n, &in, sizeof in, 7, 5);
    ASSERT_TRUE(ex.ok()) << ex.to_string();
    EXPECT_EQ(in, members[static_cast<std::size_t>((me + n - 1) % n)]);
    // The parent still works after the split.
    check_ring(*parent.transport, rank);
  });
}

TEST(Bootstrap, SubgroupRejectsAListWithoutThisRank) {
  run_world(2, [](World& parent, int rank) {
    World sub;
    const std::vector<int> members = {1 - rank};
    EXPECT_EQ(detail::connect_subgroup(*parent.transport, members, 0, parent.ranks, after(1), &sub).code(),
              Result::invalid_argument);
  });
}

TEST(Bootstrap, SubgroupTimesOutWhenAMemberNeverJoins) {
  run_world(3, [](World& parent, int rank) {
    if (rank == 2) {
      // Never takes part in the split, but stays alive past the others'
      // deadline so they see a timeout, not a departed peer.
      std::this_thread::sleep_for(std::chrono::milliseconds(1000));
      return;
    }
    World sub;
    const Status st = detail::connect_subgroup(*parent.transport, {0, 2, 1}, 40, parent.ranks, after(0.5), &sub);
    EXPECT_EQ(st.code(), Result::timeout) << st.to_string();
    EXPECT_NE(st.message().find("rank(s)"), std::string::npos) << st.message();
  });
}

}  // namespace
}  // namespace cclz::ttest
