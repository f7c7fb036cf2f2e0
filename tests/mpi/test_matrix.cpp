// The collective matrix over real processes: every collective x every
// registered algorithm for it (and the tuned default) x every dtype x every
// op (avg included) x counts 0, 1, fewer than the ranks, odd, and a few MB
// (for a subset of dtype/op), out of place and in place, at every root.
//
// Inputs and expected outputs come from tests/support/coll_desc (computed on
// each rank from the same formula, independently of the library), compared
// bitwise. Around that each case also checks that the send buffer of an
// out-of-place call is untouched, that nothing is written past either end of
// a buffer (guard bytes), and, for collectives whose result is the same on
// every rank, that the result is bitwise identical across ranks (a hash of
// every output, compared over MPI once per test, outside the collectives).
//
// An algorithm is skipped for a case only when its own supports() says no;
// skips are counted and printed, and an algorithm skipped for every case
// fails the test (it would otherwise be tested by nothing).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "algorithm.hpp"
#include "coll_desc.hpp"
#include "comm_impl.hpp"
#include "harness.hpp"

namespace cclz::mpitest {
namespace {

using coll::CollKind;
using testing::CollCase;
using testing::CollInfo;

// Whether the communicator would run `d` for this call: asks the
// communicator itself (call option > supports()), so windows and node
// layout count exactly as they do when the call runs.
bool algo_supports(const coll::AlgorithmDesc& d, Comm& c, const coll::CollArgs& a) {
  CallOptions opt;
  opt.algorithm = d.name;
  return c.impl()->algorithm_for(a, opt, nullptr, nullptr).ok();
}

std::string case_label(const CollCase& cc, const std::string& algo, bool in_place) {
  const CollInfo& info = testing::coll_info(cc.kind);
  std::string s = std::string(info.name) + " algo=" + (algo.empty() ? "default" : algo) + " dt=" + dtype_name(cc.dt);
  if (info.reduces) s += std::string(" op=") + op_name(cc.op);
  s += " count=" + std::to_string(cc.count);
  if (info.has_root) s += " root=" + std::to_string(cc.root);
  s += in_place ? " in-place" : " out-of-place";
  s += " n=" + std::to_string(cc.nranks);
  return s;
}

// The result is the same on every rank, so its hash must be too.
bool replicated(CollKind k) {
  return k == CollKind::all_reduce || k == CollKind::all_gather || k == CollKind::broadcast;
}

struct Param {
  CollKind kind;
  std::string algo;  // "" = the tuned default
};

std::vector<Param> matrix_params() {
  std::vector<Param> out;
  for (const CollInfo& info : testing::all_colls()) {
    for (const coll::AlgorithmDesc* d : coll::all_algorithms()) {
      if (d->kind == info.kind) out.push_back({info.kind, d->name});
    }
    out.push_back({info.kind, ""});
  }
  return out;
}

std::string param_name(const ::testing::TestParamInfo<Param>& p) {
  std::string s = std::string(testing::coll_info(p.param.kind).name) + "_" + (p.param.algo.empty() ? "default" : p.param.algo);
  for (char& ch : s) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return s;
}

struct Tally {
  int run = 0;
  int unsupported = 0;
  std::vector<std::uint64_t> hashes;  // replicated outputs, in call order
  std::vector<std::string> labels;    // parallel to hashes
};

Request issue(Comm& c, const CollCase& cc, const void* s, void* r, const CallOptions& o,
              const testing::VLayout* v) {
  switch (cc.kind) {
    case CollKind::all_reduce: return c.all_reduce(s, r, cc.count, cc.dt, cc.op, o);
    case CollKind::reduce_scatter: return c.reduce_scatter(s, r, cc.count, cc.dt, cc.op, o);
    case CollKind::all_gather: return c.all_gather(s, r, cc.count, cc.dt, o);
    case CollKind::all_to_all: return c.all_to_all(s, r, cc.count, cc.dt, o);
    case CollKind::all_to_allv:
      return c.all_to_allv(s, v->send_counts, v->send_displs, r, v->recv_counts, v->recv_displs, cc.dt, o);
    case CollKind::broadcast: return c.broadcast(s, r, cc.count, cc.dt, cc.root, o);
    case CollKind::reduce: return c.reduce(s, r, cc.count, cc.dt, cc.op, cc.root, o);
    case CollKind::barrier: return c.barrier(o);
  }
  return Request::failed({Result::internal_error, "test: unknown collective"});
}

// Runs one case on this rank. Returns false when the collective itself
// failed: the communicator is then unusable and the test stops.
bool run_case(Comm& c, const CollCase& cc, bool in_place, const std::string& algo, Tally& tally) {
  const int rank = c.rank();
  const std::size_t es = dtype_size(cc.dt);
  const std::string label = case_label(cc, algo, in_place);

  // The algorithm's own verdict, asked with the arguments it would see.
  if (!algo.empty()) {
    const coll::AlgorithmDesc* d = coll::find_algorithm(cc.kind, algo);
    if (d == nullptr) {
      ADD_FAILURE() << rank_tag() << ": algorithm " << algo << " vanished from the registry";
      return false;
    }
    coll::CollArgs a;
    a.kind = cc.kind;
    a.count = cc.count;
    a.dt = cc.dt;
    a.op = cc.op == ReduceOp::avg ? ReduceOp::sum : cc.op;
    a.root = cc.root;
    testing::VLayout v;
    if (cc.kind == CollKind::all_to_allv) {
      v = testing::alltoallv_layout(cc.count, rank, cc.nranks);
      a.send_counts = v.send_counts;
      a.send_displs = v.send_displs;
      a.recv_counts = v.recv_counts;
      a.recv_displs = v.recv_displs;
    }
    if (!algo_supports(*d, c, a)) {
      ++tally.unsupported;
      return true;
    }
  }

  CallOptions opt;
  opt.algorithm = algo;
  testing::VLayout v;
  std::size_t send_n = 0, recv_n = 0;
  if (cc.kind == CollKind::all_to_allv) {
    v = testing::alltoallv_layout(cc.count, rank, cc.nranks);
    send_n = v.send_total;
    recv_n = v.recv_total;
  } else {
    testing::BufferCounts bc = testing::buffer_counts(cc, rank);
    send_n = bc.send;
    recv_n = bc.recv;
  }

  Status st;
  std::size_t wrong = 0;
  bool guards_ok = true, send_untouched = true;
  std::uint64_t out_hash = 0;
  if (!in_place) {
    Guarded send(send_n * es), recv(recv_n * es);
    testing::fill_input(cc, rank, send.data());
    const std::uint64_t before = testing::hash_bytes(send.data(), send.bytes());
    st = issue(c, cc, send.data(), recv.data(), opt, &v).wait();
    if (st.ok()) {
      wrong = testing::check_output(cc, rank, recv.data());
      guards_ok = send.guards_intact() && recv.guards_intact();
      send_untouched = testing::hash_bytes(send.data(), send.bytes()) == before;
      out_hash = testing::hash_bytes(recv.data(), recv.bytes());
    }
  } else {
    testing::InPlaceLayout lay = testing::in_place_layout(cc, rank);
    Guarded buf(lay.buffer_count * es);
    testing::fill_input(cc, rank, buf.data() + lay.send_offset * es);
    st = issue(c, cc, buf.data() + lay.send_offset * es, buf.data() + lay.recv_offset * es, opt, &v).wait();
    if (st.ok()) {
      wrong = testing::check_output(cc, rank, buf.data() + lay.recv_offset * es);
      guards_ok = buf.guards_intact();
      out_hash = testing::hash_bytes(buf.data() + lay.recv_offset * es, recv_n * es);
    }
  }
  ++tally.run;
  if (!st.ok()) {
    ADD_FAILURE() << rank_tag() << ": " << label << " returned " << st.to_string()
                  << " (stopping this test: the communicator is unusable after an error)";
    return false;
  }
  EXPECT_EQ(wrong, 0u) << rank_tag() << ": " << label << ": " << wrong << " of " << recv_n
                       << " output elements differ bitwise from the reference";
  EXPECT_TRUE(guards_ok) << rank_tag() << ": " << label << ": wrote outside its buffers";
  EXPECT_TRUE(send_untouched) << rank_tag() << ": " << label << ": modified the send buffer of an out-of-place call";
  if (replicated(cc.kind)) {
    tally.hashes.push_back(out_hash);
    tally.labels.push_back(label);
  }
  return true;
}

// Compares the replicated-output hashes of every rank, case by case.
void expect_same_on_every_rank(const Tally& t) {
  std::vector<std::uint64_t> lens = allgather_u64(t.hashes.size());
  for (std::uint64_t l : lens) {
    if (l != t.hashes.size()) {
      ADD_FAILURE() << rank_tag() << ": ranks ran different numbers of cases; cannot compare results across ranks";
      return;
    }
  }
  const int n = world_size();
  std::vector<std::uint64_t> all(t.hashes.size() * static_cast<std::size_t>(n));
  if (!t.hashes.empty()) {
    world_allgather(t.hashes.data(), static_cast<int>(t.hashes.size()), MPI_UINT64_T, all.data());
  }
  int reported = 0;
  for (std::size_t i = 0; i < t.hashes.size() && reported < 5; ++i) {
    for (int r = 0; r < n; ++r) {
      if (all[static_cast<std::size_t>(r) * t.hashes.size() + i] != t.hashes[i]) {
        ADD_FAILURE() << rank_tag() << ": " << t.labels[i] << ": output differs bitwise from rank " << r;
        ++reported;
        break;
      }
    }
  }
}

// Counts for one call: 0, 1, fewer than the ranks, odd and not divisible by
// any rank count up to 8, and larger odd ones.
std::vector<std::size_t> small_counts(int n) {
  std::set<std::size_t> s = {0, 1, 37, 1027};
  if (n > 2) s.insert(static_cast<std::size_t>(n - 1));
  return {s.begin(), s.end()};
}

std::vector<int> roots_for(int n) {
  std::set<int> s = {0, n - 1, n / 2};
  return {s.begin(), s.end()};
}

// The few-MB calls, one per width of element (they take most of the
// matrix's time): what a call larger than a slot adds (chunks, their
// bounds and alignment) depends on the width, and the kernels of every
// dtype and op run in the small counts above. avg is among them for the
// division by the rank that reduces each range.
struct Big {
  DataType dt;
  ReduceOp op;
};
constexpr Big kBig[] = {{DataType::f32, ReduceOp::sum}, {DataType::bf16, ReduceOp::avg},
                        {DataType::u8, ReduceOp::min}, {DataType::f64, ReduceOp::max}};
// With the caches tests/mpi/meson.build sets (1 MiB level 2, 32 MiB last
// level), on 2 ranks these calls are larger than a slot and their buffers
// fit in the cache: the shared-memory algorithms run them in 512 KiB chunks
// with ordinary stores.
constexpr std::size_t kBigBytes = 3u << 20;
// Large enough that the node's buffers exceed the last level at every rank
// count (an all-gather on 2 ranks: 2 x (6 + 12) MB), so that the
// shared-memory algorithms write outputs with streaming stores (and copy a
// large input to a slot and to the output in one pass): those paths run
// only for the shm and default algorithms' calls of this size.
constexpr std::size_t kStreamBytes = 12u << 20;
// A broadcast that fits one slot (1 MiB from 2 to 4 ranks) but passes half
// the level 2: where the ranks outnumber the cores it is cut into chunks
// too (shm::chunk_bytes), elsewhere it is one.
constexpr std::size_t kOneSlotBytes = 768u << 10;

class Matrix : public ::testing::TestWithParam<Param> {};

TEST_P(Matrix, BitExact) {
  const Param& p = GetParam();
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int n = c->size();
  const CollInfo& info = testing::coll_info(p.kind);
  const auto t0 = std::chrono::steady_clock::now();
  Tally tally;

  auto run_all = [&]() -> bool {
    std::vector<int> roots = info.has_root ? roots_for(n) : std::vector<int>{0};
    std::vector<bool> places = {false};
    if (info.has_in_place) places.push_back(true);
    for (DataType dt : kAllDataTypes) {
      std::vector<ReduceOp> ops(std::begin(kAllReduceOps), std::end(kAllReduceOps));
      if (!info.reduces) ops = {ReduceOp::sum};
      for (ReduceOp op : ops) {
        for (std::size_t count : small_counts(n)) {
          for (int root : roots) {
            for (bool in_place : places) {
              CollCase cc{p.kind, dt, op, count, root, n};
              if (!run_case(*c, cc, in_place, p.algo, tally)) return false;
            }
          }
        }
      }
    }
    for (const Big& b : kBig) {
      std::size_t count = testing::count_for_bytes(p.kind, kBigBytes, b.dt, n) | 1;  // odd
      int root = n - 1;
      for (bool in_place : places) {
        CollCase cc{p.kind, b.dt, info.reduces ? b.op : ReduceOp::sum, count, root, n};
        if (!run_case(*c, cc, in_place, p.algo, tally)) return false;
      }
    }
    if (p.algo.empty() || p.algo == "shm") {
      // avg too where the collective reduces: the rank that reduces a range
      // divides it, before the all-reduce's streamed copies
      // (shm::reduce_divided).
      std::vector<Big> streamed = {{DataType::f32, ReduceOp::sum}};
      if (info.reduces) streamed.push_back({DataType::bf16, ReduceOp::avg});
      for (const Big& b : streamed) {
        const std::size_t count = testing::count_for_bytes(p.kind, kStreamBytes, b.dt, n) | 1;
        for (bool in_place : places) {
          CollCase cc{p.kind, b.dt, b.op, count, n - 1, n};
          if (!run_case(*c, cc, in_place, p.algo, tally)) return false;
        }
      }
      if (p.kind == CollKind::broadcast) {
        const std::size_t count = testing::count_for_bytes(p.kind, kOneSlotBytes, DataType::f32, n) | 1;
        for (bool in_place : places) {
          CollCase cc{p.kind, DataType::f32, ReduceOp::sum, count, n - 1, n};
          if (!run_case(*c, cc, in_place, p.algo, tally)) return false;
        }
      }
    }
    return true;
  };
  const bool completed = run_all();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (completed) expect_same_on_every_rank(tally);
  if (completed && !p.algo.empty()) {
    // A supports() that always says no would leave its algorithm untested.
    // Hierarchical algorithms may decline a single node; on a communicator
    // that spans several declared nodes they are the point of the run.
    // The shared-memory algorithms need the whole communicator on one node.
    const bool hierarchical = p.algo.find("hier") != std::string::npos;
    const bool one_node_only = p.algo == "shm";
    if (one_node_only && c->num_nodes() == 1 && n > 1) {
      EXPECT_GT(tally.run, 0) << rank_tag() << ": " << info.name << "/" << p.algo
                              << " declined every case on one node (no shared-memory window?)";
    } else if (one_node_only) {
      // Declining is right here: several nodes, or a single rank.
    } else if (hierarchical && env_int("CCLZ_TEST_REQUIRE_HIER", 0) == 1) {
      EXPECT_GT(tally.run, 0) << rank_tag() << ": " << info.name << "/" << p.algo << " declined every case on "
                              << c->num_nodes() << " declared nodes";
    } else if (!hierarchical && (n == 2 || n == 4 || n == 8)) {
      EXPECT_GT(tally.run, 0) << rank_tag() << ": " << info.name << "/" << p.algo
                              << " declined every case (supports() false) at a power-of-two rank count";
    }
  }
  if (c->rank() == 0) {
    std::printf("[matrix n=%d nodes=%d] %s/%s: %d cases run, %d unsupported (skipped by supports()), %.2f s\n", n,
                c->num_nodes(), info.name, p.algo.empty() ? "default" : p.algo.c_str(), tally.run, tally.unsupported,
                secs);
    std::fflush(stdout);
  }
  destroy_comm(c);
}

INSTANTIATE_TEST_SUITE_P(Coll, Matrix, ::testing::ValuesIn(matrix_params()), param_name);

}  // namespace
}  // namespace cclz::mpitest
