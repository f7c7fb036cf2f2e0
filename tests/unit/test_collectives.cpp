// Every algorithm other than all-reduce's, run with ranks as threads over the
// in-process transport, against the shared descriptor's independent
// reference (tests/support/coll_desc): every dtype, the reducing ops, group
// sizes 1-8 (1-5 under AddressSanitizer), counts 0, 1, 3, 1001 and one
// larger, in and out of place, every root. Out of place the send buffer
// must come back untouched. Every group has a node-local shared-memory
// window with small slots (many chunks), so the "shm" algorithms run here
// too.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "algorithm.hpp"
#include "coll_desc.hpp"
#include "shm_nodes.hpp"
#include "thread_transport.hpp"

namespace cclz {
namespace {

using coll::AlgorithmDesc;
using coll::CollArgs;
using coll::CollKind;
using coll::Group;
using coll::ScratchPool;

Group make_group(detail::Transport& t, std::uint64_t seq, ScratchPool& pool) {
  std::vector<int> members(static_cast<std::size_t>(t.size()));
  for (int i = 0; i < t.size(); ++i) members[static_cast<std::size_t>(i)] = i;
  return Group(t, members, std::vector<int>(members.size(), 0), t.rank(), seq,
               detail::Clock::now() + std::chrono::seconds(30), pool);
}

// Runs one case on n threads; returns a description of the first failure.
// `direct_min_bytes`: the window's direct-path threshold (shm_direct.hpp);
// with it on, a shm algorithm's call must have run direct (in-place
// all-to-all excepted) or the case fails.
std::string run_case(const AlgorithmDesc& d, const testing::CollCase& c, bool in_place,
                     std::uint64_t direct_min_bytes = detail::ShmWindow::kDirectOff) {
  std::vector<std::string> errors(static_cast<std::size_t>(c.nranks));
  const testing::ShmNodes shm(std::vector<int>(static_cast<std::size_t>(c.nranks), 0), 4096, 3, 0,
                              direct_min_bytes);
  const bool want_direct = direct_min_bytes == 0 && std::string(d.name) == "shm" && c.count != 0 &&
                           !(in_place && c.kind == CollKind::all_to_all);
  testing::run_ranks(c.nranks, [&](detail::Transport& t, int rank) {
    std::string& err = errors[static_cast<std::size_t>(rank)];
    const std::size_t es = dtype_size(c.dt);
    ScratchPool pool;
    Group g = make_group(t, 1, pool);
    const auto window = shm.window(rank);
    g.attach_shm(window.get());
    CollArgs a;
    a.kind = c.kind;
    a.count = c.count;
    a.dt = c.dt;
    a.op = c.op;
    a.root = c.root;
    testing::VLayout v;
    std::vector<std::byte> send, recv, send_copy;
    if (c.kind == CollKind::all_to_allv) {
      v = testing::alltoallv_layout(c.count, rank, c.nranks);
      a.send_counts = v.send_counts;
      a.send_displs = v.send_displs;
      a.recv_counts = v.recv_counts;
      a.recv_displs = v.recv_displs;
    }
    const testing::BufferCounts bc =
        c.kind == CollKind::all_to_allv ? testing::BufferCounts{v.send_total, v.recv_total}
                                        : testing::buffer_counts(c, rank);
    std::byte* out = nullptr;
    if (in_place) {
      const testing::InPlaceLayout l = testing::in_place_layout(c, rank);
      recv.resize(std::max<std::size_t>(1, l.buffer_count * es));
      testing::fill_input(c, rank, recv.data() + l.send_offset * es);
      a.sendbuf = recv.data() + l.send_offset * es;
      out = recv.data() + l.recv_offset * es;
    } else {
      send.resize(std::max<std::size_t>(1, bc.send * es));
      recv.assign(std::max<std::size_t>(1, bc.recv * es), std::byte{0x5a});
      testing::fill_input(c, rank, send.data());
      send_copy = send;
      a.sendbuf = send.data();
      out = recv.data();
    }
    a.recvbuf = out;
    if (d.supports != nullptr && !d.supports(g, a)) {
      err = "supports() declined";
      return;
    }
    Status st = d.run(g, a);
    if (!st.ok()) {
      err = "rank " + std::to_string(rank) + ": " + st.to_string();
      return;
    }
    std::vector<std::byte> want(std::max<std::size_t>(1, bc.recv * es));
    if (testing::output_defined(c, rank)) {
      testing::expected_output(c, rank, want.data());
      const std::size_t wrong = testing::count_wrong(out, want.data(), bc.recv, c.dt);
      if (wrong != 0) err = "rank " + std::to_string(rank) + ": " + std::to_string(wrong) + " wrong elements";
    }
    if (!in_place && send != send_copy) err = "rank " + std::to_string(rank) + ": sendbuf modified";
    if (direct_min_bytes != detail::ShmWindow::kDirectOff && window->direct_calls() != (want_direct ? 1u : 0u)) {
      err = "rank " + std::to_string(rank) + ": " + std::to_string(window->direct_calls()) +
            " calls on the direct path, expected " + (want_direct ? "1" : "0");
    }
  });
  for (const std::string& e : errors) {
    if (!e.empty()) return e;
  }
  return {};
}

void check_algorithm(const AlgorithmDesc& d, std::uint64_t direct_min_bytes = detail::ShmWindow::kDirectOff) {
  const testing::CollInfo& info = testing::coll_info(d.kind);
  int ran = 0, declined = 0;
  for (int n = 1; n <= 8; ++n) {
    if (!testing::sweep_group_size(n)) continue;
    for (DataType dt : kAllDataTypes) {
      std::vector<ReduceOp> ops = {ReduceOp::sum};
      if (info.reduces) ops = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max};
      std::vector<int> roots = {0};
      if (info.has_root && n > 1) roots = {0, n - 1, n / 2};
      for (ReduceOp op : ops) {
        for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{1001}}) {
          for (int root : roots) {
            for (bool in_place : {false, true}) {
              if (in_place && !info.has_in_place) continue;
              testing::CollCase c{d.kind, dt, op, count, root, n};
              const std::string e = run_case(d, c, in_place, direct_min_bytes);
              if (e == "supports() declined") {
                ++declined;
                continue;
              }
              ++ran;
              ASSERT_TRUE(e.empty()) << d.name << " " << info.name << " n=" << n << " dt=" << dtype_name(dt)
                                     << " op=" << op_name(op) << " count=" << count << " root=" << root
                                     << (in_place ? " in place" : " out of place") << ": " << e;
            }
          }
        }
      }
    }
    // One larger count per group size, f32 and bf16, sum.
    for (DataType dt : {DataType::f32, DataType::bf16}) {
      testing::CollCase c{d.kind, dt, ReduceOp::sum, (std::size_t{64} << 10) + 3, n > 1 ? n - 1 : 0, n};
      const std::string e = run_case(d, c, false, direct_min_bytes);
      if (e == "supports() declined") continue;
      ASSERT_TRUE(e.empty()) << d.name << " " << info.name << " n=" << n << " large: " << e;
    }
  }
  EXPECT_GT(ran, 0) << d.name << " declined every case";
  ::testing::Test::RecordProperty("declined", declined);
}

class Collectives : public ::testing::TestWithParam<const AlgorithmDesc*> {};

TEST_P(Collectives, MatchTheReferenceEverywhere) { check_algorithm(*GetParam()); }

std::vector<const AlgorithmDesc*> non_allreduce_algorithms() {
  std::vector<const AlgorithmDesc*> out;
  for (const AlgorithmDesc* d : coll::all_algorithms()) {
    if (d->kind != CollKind::all_reduce && d->kind != CollKind::barrier) out.push_back(d);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(All, Collectives, ::testing::ValuesIn(non_allreduce_algorithms()),
                         [](const ::testing::TestParamInfo<const AlgorithmDesc*>& p) {
                           return std::string(coll::coll_name(p.param->kind)) + "_" + p.param->name;
                         });

// The shm algorithms on their direct path (every rank reads the peers'
// buffers in place), for every call: the same cases, and each call must
// have gone direct (in-place all-to-all takes the staged path).
TEST(ShmDirect, MatchTheReferenceEverywhere) {
  for (CollKind kind : {CollKind::reduce_scatter, CollKind::all_gather, CollKind::all_to_all, CollKind::broadcast,
                        CollKind::reduce}) {
    const AlgorithmDesc* d = coll::find_algorithm(kind, "shm");
    ASSERT_NE(d, nullptr) << coll::coll_name(kind);
    check_algorithm(*d, 0);
  }
}

TEST(PowerOfTwoOnly, HalvingAndDoublingDeclineOtherSizes) {
  for (const char* name : {"halving", "doubling"}) {
    const CollKind kind = std::string(name) == "halving" ? CollKind::reduce_scatter : CollKind::all_gather;
    const AlgorithmDesc* d = coll::find_algorithm(kind, name);
    ASSERT_NE(d, nullptr);
    testing::run_ranks(6, [&](detail::Transport& t, int) {
      ScratchPool pool;
      Group g = make_group(t, 1, pool);
      CollArgs a;
      a.kind = kind;
      EXPECT_FALSE(d->supports(g, a)) << name;
    });
  }
}

TEST(Barrier, NoRankLeavesBeforeTheLastArrives) {
  const AlgorithmDesc* d = coll::find_algorithm(CollKind::barrier, "dissemination");
  ASSERT_NE(d, nullptr);
  for (int n : {1, 2, 3, 5, 8}) {
    for (int late = 0; late < n; late += 2) {
      std::atomic<int> arrived{0};
      testing::run_ranks(n, [&](detail::Transport& t, int rank) {
        ScratchPool pool;
        Group g = make_group(t, 1, pool);
        if (rank == late) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        arrived.fetch_add(1);
        CollArgs a;
        a.kind = CollKind::barrier;
        ASSERT_TRUE(d->run(g, a).ok());
        EXPECT_EQ(arrived.load(), n) << "rank " << rank << " left early (n=" << n << ", late " << late << ")";
      });
    }
  }
}

}  // namespace
}  // namespace cclz
