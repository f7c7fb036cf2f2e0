// Communicators over real processes: the three ways to make one (from MPI,
// from a unique id spread with MPI_Bcast, from the torchrun environment),
// topology (declared nodes), split, point-to-point rings, many collectives
// in flight at once, and barrier semantics checked through shared memory.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "algorithm.hpp"
#include "cclz/mpi.hpp"
#include "comm_impl.hpp"
#include "harness.hpp"

namespace cclz::mpitest {
namespace {

// Sum of world ranks over a communicator, checked against what each rank
// computes from the list of members it expects.
void expect_allreduce_sum(Comm& c, std::int64_t mine, std::int64_t want, const char* what) {
  std::int64_t in = mine, out = -1;
  Status st = c.all_reduce(&in, &out, 1, DataType::i64, ReduceOp::sum).wait();
  ASSERT_TRUE(st.ok()) << rank_tag() << ": " << what << ": all_reduce failed: " << st.to_string();
  EXPECT_EQ(out, want) << rank_tag() << ": " << what;
}

// ---- topology ---------------------------------------------------------------

TEST(Comm, TopologyMatchesMpiAndDeclaredNodes) {
  Comm& w = world();
  const int n = world_size();
  EXPECT_EQ(w.rank(), world_rank());
  EXPECT_EQ(w.size(), n);
  EXPECT_EQ(w.node_of(w.rank()), w.node_id());

  // Each rank's view of every rank's node must agree, and agree with the
  // local rank/size each rank reports about itself.
  std::vector<int> nodes(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) nodes[static_cast<std::size_t>(r)] = w.node_of(r);
  std::vector<int> all(static_cast<std::size_t>(n * n));
  world_allgather(nodes.data(), n, MPI_INT, all.data());
  for (int r = 0; r < n; ++r) {
    for (int q = 0; q < n; ++q) {
      EXPECT_EQ(all[static_cast<std::size_t>(r * n + q)], nodes[static_cast<std::size_t>(q)])
          << rank_tag() << ": rank " << r << " places rank " << q << " on another node than this rank does";
    }
  }
  // Numbered by first rank: node ids appear in increasing order 0, 1, 2...
  int next = 0;
  for (int r = 0; r < n; ++r) {
    const int nd = nodes[static_cast<std::size_t>(r)];
    EXPECT_LE(nd, next) << rank_tag() << ": node ids not numbered by first rank";
    if (nd == next) ++next;
  }
  EXPECT_EQ(w.num_nodes(), next);
  int local_rank = 0, local_size = 0;
  for (int r = 0; r < n; ++r) {
    if (nodes[static_cast<std::size_t>(r)] != w.node_id()) continue;
    if (r < w.rank()) ++local_rank;
    ++local_size;
  }
  EXPECT_EQ(w.local_rank(), local_rank);
  EXPECT_EQ(w.local_size(), local_size);

  // What the launcher declared: CCLZ_NODE_ID per rank, or CCLZ_LOCAL_SIZE
  // consecutive ranks per node. Without either, one machine is one node.
  const int want_nodes = env_int("CCLZ_TEST_EXPECT_NODES", 1);
  EXPECT_EQ(w.num_nodes(), want_nodes) << rank_tag() << ": CCLZ_TEST_EXPECT_NODES says the launcher declared "
                                       << want_nodes << " node(s)";
  const int declared = env_int("CCLZ_NODE_ID", -1);
  std::vector<int> decl = allgather_int(declared);
  if (declared >= 0) {
    for (int r = 0; r < n; ++r) {
      for (int q = 0; q < n; ++q) {
        EXPECT_EQ(decl[static_cast<std::size_t>(r)] == decl[static_cast<std::size_t>(q)],
                  nodes[static_cast<std::size_t>(r)] == nodes[static_cast<std::size_t>(q)])
            << rank_tag() << ": CCLZ_NODE_ID of ranks " << r << " and " << q << " not honoured";
      }
    }
  }
  const int ls = env_int("CCLZ_LOCAL_SIZE", -1);
  if (declared < 0 && ls > 0) {
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(nodes[static_cast<std::size_t>(r)], r / ls) << rank_tag() << ": CCLZ_LOCAL_SIZE=" << ls
                                                            << " not honoured for rank " << r;
    }
  }
}

// ---- the three ways to make a communicator ----------------------------------

TEST(Comm, FromMpiWorldAndSubCommunicator) {
  std::unique_ptr<Comm> c;
  Status st = comm_from_mpi(MPI_COMM_WORLD, &c);
  ASSERT_TRUE(st.ok()) << rank_tag() << ": " << st.to_string();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->rank(), world_rank());
  EXPECT_EQ(c->size(), world_size());
  const int n = world_size();
  expect_allreduce_sum(*c, world_rank(), std::int64_t{n} * (n - 1) / 2, "comm_from_mpi(MPI_COMM_WORLD)");

  // An MPI sub-communicator with reversed order: cclz must follow MPI's ranks.
  MPI_Comm sub;
  const int color = world_rank() % 2;
  MPI_Comm_split(MPI_COMM_WORLD, color, -world_rank(), &sub);
  int sr = 0, sn = 0;
  MPI_Comm_rank(sub, &sr);
  MPI_Comm_size(sub, &sn);
  std::unique_ptr<Comm> s;
  st = comm_from_mpi(sub, &s);
  EXPECT_TRUE(st.ok()) << rank_tag() << ": comm_from_mpi(sub): " << st.to_string();
  if (st.ok() && s) {
    EXPECT_EQ(s->rank(), sr);
    EXPECT_EQ(s->size(), sn);
    std::int64_t want = 0;
    for (int r = color; r < n; r += 2) want += r;
    expect_allreduce_sum(*s, world_rank(), want, "comm_from_mpi(split MPI comm)");
    // Rank 0 of the sub-communicator is the highest world rank of the color.
    std::int64_t v = world_rank();
    st = s->broadcast(&v, &v, 1, DataType::i64, 0).wait();
    EXPECT_TRUE(st.ok()) << st.to_string();
    int top = color;
    while (top + 2 < n) top += 2;
    EXPECT_EQ(v, top) << rank_tag() << ": sub-communicator rank 0 is not MPI's rank 0";
    EXPECT_TRUE(s->destroy().ok());
  }
  MPI_Comm_free(&sub);
  EXPECT_TRUE(c->destroy().ok());
}

TEST(Comm, FromUniqueIdBroadcastWithMpi) {
  UniqueId id{};
  Status st;
  if (world_rank() == 0) st = Comm::create_unique_id(&id);
  // Rank 0's outcome decides whether anyone proceeds, so no one waits alone.
  int ok = st.ok() ? 1 : 0;
  world_bcast(&ok, 1, MPI_INT, 0);
  ASSERT_EQ(ok, 1) << rank_tag() << ": create_unique_id on rank 0 failed: " << st.to_string();
  world_bcast(&id, sizeof id, MPI_BYTE, 0);

  // Ranks given in reverse of MPI's order: the communicator must use the
  // rank passed to init_rank, not the launcher's.
  const int n = world_size();
  const int my = n - 1 - world_rank();
  std::unique_ptr<Comm> c;
  st = Comm::init_rank(&c, n, id, my);
  ASSERT_TRUE(st.ok()) << rank_tag() << ": init_rank: " << st.to_string();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->rank(), my);
  EXPECT_EQ(c->size(), n);
  std::int64_t v = world_rank();
  st = c->broadcast(&v, &v, 1, DataType::i64, 0).wait();
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(v, n - 1) << rank_tag() << ": cclz rank 0 should be MPI rank " << n - 1;
  expect_allreduce_sum(*c, my, std::int64_t{n} * (n - 1) / 2, "init_rank");
  EXPECT_TRUE(c->destroy().ok());
}

// A TCP port that was free a moment ago (bind to 0, read it back, close).
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

TEST(Comm, FromTorchrunEnvironment) {
  int port = world_rank() == 0 ? free_port() : 0;
  world_bcast(&port, 1, MPI_INT, 0);
  ASSERT_GT(port, 0) << "no free port on rank 0";
  const int n = world_size();
  // LOCAL_RANK as torchrun sets it: the index on this (declared) node.
  ::setenv("RANK", std::to_string(world_rank()).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(world().local_rank()).c_str(), 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  std::unique_ptr<Comm> c;
  Status st = Comm::init_from_env(&c);
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) ::unsetenv(v);
  ASSERT_TRUE(st.ok()) << rank_tag() << ": init_from_env on port " << port << ": " << st.to_string();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->rank(), world_rank());
  EXPECT_EQ(c->size(), n);
  EXPECT_EQ(c->num_nodes(), world().num_nodes()) << "environment launch sees other nodes than the MPI one";
  expect_allreduce_sum(*c, world_rank(), std::int64_t{n} * (n - 1) / 2, "init_from_env");
  EXPECT_TRUE(c->destroy().ok());
}

// ---- split -------------------------------------------------------------------

// Members of `color` ordered by (key, old rank), as split promises.
std::vector<int> expected_members(const std::vector<int>& colors, const std::vector<int>& keys, int color) {
  std::vector<int> m;
  for (int r = 0; r < static_cast<int>(colors.size()); ++r) {
    if (colors[static_cast<std::size_t>(r)] == color) m.push_back(r);
  }
  std::stable_sort(m.begin(), m.end(), [&](int a, int b) {
    return keys[static_cast<std::size_t>(a)] < keys[static_cast<std::size_t>(b)];
  });
  return m;
}

// Checks one split: membership, order, and collectives on the sub-comm.
void check_split(Comm& parent, int color, int key, const char* what) {
  const int n = parent.size();
  std::vector<int> colors = allgather_int(color), keys = allgather_int(key);
  std::unique_ptr<Comm> sub;
  Status st = timed_split(parent, color, key, &sub, what);
  ASSERT_TRUE(st.ok()) << rank_tag() << ": " << what << ": split(" << color << ", " << key << "): " << st.to_string();
  if (color < 0) {
    EXPECT_EQ(sub, nullptr) << rank_tag() << ": " << what << ": color -1 must give no communicator";
    return;
  }
  ASSERT_NE(sub, nullptr);
  std::vector<int> m = expected_members(colors, keys, color);
  const int me = static_cast<int>(std::find(m.begin(), m.end(), parent.rank()) - m.begin());
  EXPECT_EQ(sub->size(), static_cast<int>(m.size())) << what;
  EXPECT_EQ(sub->rank(), me) << what;

  // all_gather of parent ranks shows the order the sub-communicator uses.
  std::vector<std::int32_t> order(m.size(), -1);
  std::int32_t pr = parent.rank();
  st = sub->all_gather(&pr, order.data(), 1, DataType::i32).wait();
  ASSERT_TRUE(st.ok()) << rank_tag() << ": " << what << ": all_gather: " << st.to_string();
  for (std::size_t i = 0; i < m.size(); ++i) EXPECT_EQ(order[i], m[i]) << what << ": member " << i;
  expect_allreduce_sum(*sub, parent.rank(), std::accumulate(m.begin(), m.end(), std::int64_t{0}), what);

  // A split of the split, and a collective on it.
  std::unique_ptr<Comm> sub2;
  st = timed_split(*sub, sub->rank() % 2, sub->rank(), &sub2, "nested split");
  ASSERT_TRUE(st.ok()) << rank_tag() << ": " << what << ": nested split: " << st.to_string();
  ASSERT_NE(sub2, nullptr);
  std::int64_t want = 0;
  for (std::size_t i = static_cast<std::size_t>(sub->rank() % 2); i < m.size(); i += 2) want += m[i];
  expect_allreduce_sum(*sub2, parent.rank(), want, "nested split");
  EXPECT_TRUE(timed_destroy(*sub2, "nested split").ok());
  EXPECT_TRUE(timed_destroy(*sub, what).ok());
  (void)n;
}

TEST(Comm, SplitColorsReversedKeysAndNoColor) {
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int r = c->rank(), n = c->size();
  // Three colors, keys reversing the order, the last rank (n > 1) opting out.
  const int color = (n > 1 && r == n - 1) ? -1 : r % 3;
  check_split(*c, color, n - r, "three colors, reversed keys, last rank color -1");
  // One color, equal keys: ordered by old rank.
  check_split(*c, 7, 0, "one color, equal keys");
  // Everyone alone.
  check_split(*c, r, 0, "one rank per color");
  // Collectives on the parent still work after the sub-comms came and went.
  expect_allreduce_sum(*c, r, std::int64_t{n} * (n - 1) / 2, "parent after splits");
}

TEST(Comm, SplitSubCommsRunConcurrently) {
  // Two halves run different collectives at the same time on their own
  // sub-communicators; their traffic must not mix.
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int r = c->rank(), n = c->size();
  std::unique_ptr<Comm> half;
  ASSERT_TRUE(c->split(r < n / 2 ? 0 : 1, r, &half).ok());
  ASSERT_NE(half, nullptr);
  std::vector<float> a(4099), b(4099);
  for (int it = 0; it < 20; ++it) {
    std::fill(a.begin(), a.end(), static_cast<float>(r + it));
    Request q1 = half->all_reduce(a.data(), b.data(), a.size(), DataType::f32, ReduceOp::max);
    std::int64_t x = r, y = -1;
    Request q2 = c->all_reduce(&x, &y, 1, DataType::i64, ReduceOp::sum);
    Status s1 = q1.wait(), s2 = q2.wait();
    ASSERT_TRUE(s1.ok()) << rank_tag() << ": " << s1.to_string();
    ASSERT_TRUE(s2.ok()) << rank_tag() << ": " << s2.to_string();
    const int top = r < n / 2 ? n / 2 - 1 : n - 1;
    EXPECT_EQ(b[0], static_cast<float>(top + it));
    EXPECT_EQ(b[4098], static_cast<float>(top + it));
    EXPECT_EQ(y, std::int64_t{n} * (n - 1) / 2);
  }
}

TEST(Comm, SplitRecordsWhereItsTimeWent) {
  // The phases a split's communicator records (CommImpl::setup_times, and
  // shutdown_times for its destroy), which CCLZ_DEBUG=INFO and a slow test
  // print: each took some time, and together no longer than the call.
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  std::unique_ptr<Comm> sub;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(c->split(0, c->rank(), &sub).ok());
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_NE(sub, nullptr);
  const detail::CommImpl::SetupTimes& t = sub->impl()->setup_times();
  EXPECT_GT(t.connect_s, 0.0) << rank_tag();
  EXPECT_GT(t.shm_s, 0.0) << rank_tag();
  EXPECT_GT(t.start_s, 0.0) << rank_tag();
  EXPECT_LE(t.connect_s + t.shm_s + t.start_s, wall) << rank_tag();
  // And its destroy's phases (Engine::shutdown_times), zeros before it.
  EXPECT_EQ(sub->impl()->shutdown_times().transport_s, 0.0) << rank_tag();
  const auto d0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(sub->destroy().ok());
  const double destroy_wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - d0).count();
  const detail::Engine::ShutdownTimes d = sub->impl()->shutdown_times();
  EXPECT_GT(d.worker_s, 0.0) << rank_tag();
  EXPECT_GT(d.transport_s, 0.0) << rank_tag();
  EXPECT_LE(d.worker_s + d.idle_s + d.transport_s, destroy_wall) << rank_tag();
  // A communicator made from MPI, not split, connected nothing of its own.
  EXPECT_EQ(world().impl()->setup_times().connect_s, 0.0) << rank_tag();
  EXPECT_GT(world().impl()->setup_times().shm_s, 0.0) << rank_tag();
}

// ---- point to point ------------------------------------------------------------

TEST(Comm, SendRecvRings) {
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int r = c->rank(), n = c->size();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1001}, std::size_t{(1u << 20) + 3}}) {
    std::vector<std::int32_t> out(count), in(count, -1);
    for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<std::int32_t>(r * 1000003 + i);
    // Both directions at once, posted receive-first on even ranks and
    // send-first on odd ones, so no ordering assumption hides a deadlock.
    Request s, q;
    if (r % 2 == 0) {
      q = c->recv(in.data(), count, DataType::i32, prev);
      s = c->send(out.data(), count, DataType::i32, next);
    } else {
      s = c->send(out.data(), count, DataType::i32, next);
      q = c->recv(in.data(), count, DataType::i32, prev);
    }
    Status ss = s.wait(), qs = q.wait();
    ASSERT_TRUE(ss.ok()) << rank_tag() << ": send of " << count << ": " << ss.to_string();
    ASSERT_TRUE(qs.ok()) << rank_tag() << ": recv of " << count << ": " << qs.to_string();
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i) wrong += in[i] != static_cast<std::int32_t>(prev * 1000003 + i);
    EXPECT_EQ(wrong, 0u) << rank_tag() << ": ring message of " << count << " from rank " << prev;
  }
}

TEST(Comm, SendRecvMatchInIssueOrder) {
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int r = c->rank(), n = c->size();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  // Eight messages in flight to one peer, of different sizes (so a transport
  // that reorders by size or protocol shows); they must match in order.
  constexpr int kMsgs = 8;
  std::vector<std::vector<std::int64_t>> out(kMsgs), in(kMsgs);
  std::vector<Request> reqs;
  for (int k = 0; k < kMsgs; ++k) {
    const std::size_t count = k % 2 == 0 ? 3 : 70000;
    out[static_cast<std::size_t>(k)].assign(count, r * 100 + k);
    in[static_cast<std::size_t>(k)].assign(count, -1);
  }
  for (int k = 0; k < kMsgs; ++k) {
    auto& b = in[static_cast<std::size_t>(k)];
    reqs.push_back(c->recv(b.data(), b.size(), DataType::i64, prev));
  }
  for (int k = 0; k < kMsgs; ++k) {
    auto& b = out[static_cast<std::size_t>(k)];
    reqs.push_back(c->send(b.data(), b.size(), DataType::i64, next));
  }
  for (Request& q : reqs) {
    Status st = q.wait();
    ASSERT_TRUE(st.ok()) << rank_tag() << ": " << st.to_string();
  }
  for (int k = 0; k < kMsgs; ++k) {
    const auto& b = in[static_cast<std::size_t>(k)];
    EXPECT_EQ(b.front(), prev * 100 + k) << rank_tag() << ": message " << k << " out of order";
    EXPECT_EQ(b.back(), prev * 100 + k) << rank_tag() << ": message " << k << " out of order";
  }
}

TEST(Comm, PointToPointInterleavedWithCollectives) {
  // A send posted before a collective and received after it: the two kinds
  // of traffic must not match each other.
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int r = c->rank(), n = c->size();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  std::int64_t pout = 1000 + r, pin = -1;
  Request s = c->send(&pout, 1, DataType::i64, next);
  std::int64_t x = 1, y = 0;
  Status st = c->all_reduce(&x, &y, 1, DataType::i64, ReduceOp::sum).wait();
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(y, n);
  st = c->recv(&pin, 1, DataType::i64, prev).wait();
  ASSERT_TRUE(st.ok()) << st.to_string();
  ASSERT_TRUE(s.wait().ok());
  EXPECT_EQ(pin, 1000 + prev);
}

// ---- many operations in flight ------------------------------------------------

TEST(Comm, ManyCollectivesInFlightWaitedInReverse) {
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int r = c->rank(), n = c->size();
  constexpr int kOps = 16;
  std::vector<std::vector<std::int32_t>> in(kOps), out(kOps);
  std::vector<Request> reqs;
  for (int k = 0; k < kOps; ++k) {
    const std::size_t count = static_cast<std::size_t>(1) << (k % 12);
    in[static_cast<std::size_t>(k)].assign(count, r + k);
    if (k % 3 == 2) {
      out[static_cast<std::size_t>(k)].assign(count * static_cast<std::size_t>(n), -1);
      reqs.push_back(c->all_gather(in[static_cast<std::size_t>(k)].data(), out[static_cast<std::size_t>(k)].data(), count,
                                   DataType::i32));
    } else {
      out[static_cast<std::size_t>(k)].assign(count, -1);
      reqs.push_back(c->all_reduce(in[static_cast<std::size_t>(k)].data(), out[static_cast<std::size_t>(k)].data(), count,
                                   DataType::i32, ReduceOp::sum));
    }
  }
  for (int k = kOps - 1; k >= 0; --k) {
    Status st = reqs[static_cast<std::size_t>(k)].wait();
    ASSERT_TRUE(st.ok()) << rank_tag() << ": op " << k << ": " << st.to_string();
  }
  for (int k = 0; k < kOps; ++k) {
    const auto& o = out[static_cast<std::size_t>(k)];
    if (k % 3 == 2) {
      const std::size_t count = o.size() / static_cast<std::size_t>(n);
      for (int q = 0; q < n; ++q) EXPECT_EQ(o[static_cast<std::size_t>(q) * count], q + k) << "op " << k;
    } else {
      EXPECT_EQ(o.front(), n * (n - 1) / 2 + n * k) << "op " << k;
      EXPECT_EQ(o.back(), n * (n - 1) / 2 + n * k) << "op " << k;
    }
  }
  // test() polls to completion without wait().
  std::int32_t a = 1, b = 0;
  Request q = c->all_reduce(&a, &b, 1, DataType::i32, ReduceOp::sum);
  Status st;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!q.test(&st) && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(b, n);
}

TEST(Comm, ThousandsOfSmallCollectives) {
  // Sequence numbers and tags over a long run; prints the rate for reading.
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int n = c->size();
  constexpr int kIters = 2000;
  const auto t0 = std::chrono::steady_clock::now();
  std::int64_t bad = 0;
  for (int i = 0; i < kIters; ++i) {
    std::int64_t x = i, y = -1;
    Status st = c->all_reduce(&x, &y, 1, DataType::i64, ReduceOp::sum).wait();
    ASSERT_TRUE(st.ok()) << rank_tag() << ": iteration " << i << ": " << st.to_string();
    bad += y != std::int64_t{i} * n;
  }
  EXPECT_EQ(bad, 0);
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / kIters;
  if (c->rank() == 0) std::printf("[comm n=%d] 8-byte all_reduce: %.1f us per call (default algorithm)\n", n, us);
}

// ---- barrier -------------------------------------------------------------------

// A counter in shared memory that every rank increments before a barrier:
// after the barrier each rank must see all n increments of that round. The
// segment's name comes from rank 0 (pid) over MPI.
class SharedCounter {
 public:
  SharedCounter() {
    int pid = world_rank() == 0 ? static_cast<int>(::getpid()) : 0;
    world_bcast(&pid, 1, MPI_INT, 0);
    name_ = "/cclz-test-barrier-" + std::to_string(pid);
    if (world_rank() == 0) {
      int fd = ::shm_open(name_.c_str(), O_CREAT | O_RDWR | O_TRUNC, 0600);
      if (fd >= 0) {
        if (::ftruncate(fd, sizeof(std::uint64_t)) != 0) {
          ::close(fd);
          fd = -1;
        }
      }
      if (fd >= 0) ::close(fd);
    }
    world_barrier();
    int fd = ::shm_open(name_.c_str(), O_RDWR, 0600);
    if (fd >= 0) {
      void* p = ::mmap(nullptr, sizeof(std::uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      ::close(fd);
      if (p != MAP_FAILED) word_ = static_cast<std::uint64_t*>(p);
    }
  }
  ~SharedCounter() {
    if (word_ != nullptr) ::munmap(word_, sizeof(std::uint64_t));
    world_barrier();
    if (world_rank() == 0) ::shm_unlink(name_.c_str());
  }
  bool ok() const { return word_ != nullptr; }
  std::uint64_t add() { return std::atomic_ref<std::uint64_t>(*word_).fetch_add(1) + 1; }
  std::uint64_t load() { return std::atomic_ref<std::uint64_t>(*word_).load(); }
  void reset() { std::atomic_ref<std::uint64_t>(*word_).store(0); }

 private:
  std::string name_;
  std::uint64_t* word_ = nullptr;
};

TEST(Comm, BarrierHoldsEveryRankBack) {
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int n = c->size(), r = c->rank();
  SharedCounter counter;
  ASSERT_TRUE(all_true(counter.ok())) << "shared memory segment for the barrier check";
  std::vector<std::string> algos = {""};
  for (const coll::AlgorithmDesc* d : coll::all_algorithms()) {
    // Every barrier this communicator can run (shm only on one node).
    CallOptions o;
    o.algorithm = d->name;
    coll::CollArgs a;
    a.kind = coll::CollKind::barrier;
    if (d->kind == coll::CollKind::barrier && c->impl()->algorithm_for(a, o, nullptr, nullptr).ok()) {
      algos.push_back(d->name);
    }
  }
  if (n > 1 && c->num_nodes() == 1) {
    EXPECT_NE(std::find(algos.begin(), algos.end(), "shm"), algos.end()) << "one node but no shared-memory barrier";
  }
  for (const std::string& algo : algos) {
    // Outside the check: nobody still reads the last round when it resets.
    world_barrier();
    if (r == 0) counter.reset();
    world_barrier();  // outside the check: everyone sees the reset
    CallOptions o;
    o.algorithm = algo;
    constexpr int kRounds = 10;
    int early = 0;
    for (int round = 1; round <= kRounds; ++round) {
      // Arrive late on a different rank each round so a barrier that lets
      // anyone through early is caught with high probability.
      if (r == round % n) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      counter.add();
      Status st = c->barrier(o).wait();
      ASSERT_TRUE(st.ok()) << rank_tag() << ": barrier algo=" << (algo.empty() ? "default" : algo) << ": "
                           << st.to_string();
      if (counter.load() < static_cast<std::uint64_t>(round) * static_cast<std::uint64_t>(n)) ++early;
    }
    EXPECT_EQ(early, 0) << rank_tag() << ": barrier algo=" << (algo.empty() ? "default" : algo)
                        << " released this rank before every rank had arrived";
  }
}

}  // namespace
}  // namespace cclz::mpitest
