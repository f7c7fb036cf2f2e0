// The node-local direct path on real processes: buffers from
// cclz::mem_alloc, which the ranks of a node map from one another
// (pidfd_getfd) and read in place (collectives/shm_direct.hpp).
//
// Each call is checked bitwise against the independent reference
// (tests/support/coll_desc), with guard bytes around every buffer, the send
// buffer of an out-of-place call untouched, and replicated results equal on
// every rank. Whether the calls really took the direct path is checked too
// (CommImpl::direct_calls): where the whole communicator shares one window,
// every eligible call must have gone direct, unless the run says otherwise
// (CCLZ_TEST_EXPECT_DIRECT=0, for runs that switch the path off); and when
// one rank's buffers are plain heap memory, none may have.
#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "algorithm.hpp"
#include "coll_desc.hpp"
#include "comm_impl.hpp"
#include "harness.hpp"
#include "shm_direct.hpp"

namespace cclz::mpitest {
namespace {

using coll::CollKind;
using testing::CollCase;

Request issue(Comm& c, const CollCase& cc, const void* s, void* r, const CallOptions& o) {
  switch (cc.kind) {
    case CollKind::all_reduce: return c.all_reduce(s, r, cc.count, cc.dt, cc.op, o);
    case CollKind::reduce_scatter: return c.reduce_scatter(s, r, cc.count, cc.dt, cc.op, o);
    case CollKind::all_gather: return c.all_gather(s, r, cc.count, cc.dt, o);
    case CollKind::all_to_all: return c.all_to_all(s, r, cc.count, cc.dt, o);
    case CollKind::broadcast: return c.broadcast(s, r, cc.count, cc.dt, cc.root, o);
    case CollKind::reduce: return c.reduce(s, r, cc.count, cc.dt, cc.op, cc.root, o);
    default: break;
  }
  return Request::failed({Result::internal_error, "test: collective without a direct path"});
}

// The smallest call that may try the direct path: the window's threshold,
// or the probing band's floor below it.
std::uint64_t direct_floor(Comm& c, CollKind kind) {
  const std::uint64_t t = c.impl()->direct_min_bytes();
  if (t == detail::ShmWindow::kDirectOff) return t;
  return std::min(t, coll::shm::direct_probe_min_bytes(kind, c.impl()->shm_oversubscribed()));
}

// Whether a call of heap buffers goes direct through cross-memory attach
// where the window allows it (shm_direct.hpp): the all-reduce, all-gather,
// all-to-all, reduce-scatter, broadcast and reduce from cma_min_bytes(), while the
// node's buffers fit kCmaMaxNodeBytes or at any size where rank 0 measures
// the way (CCLZ_SHM_CMA=auto, a core per rank), and the all-reduce in
// place at any size.
bool cma_eligible(Comm& c, const CollCase& cc, bool in_place) {
  const std::uint64_t es = dtype_size(cc.dt), n = static_cast<std::uint64_t>(cc.nranks);
  std::uint64_t in = 0, out = 0;
  switch (cc.kind) {
    case CollKind::all_reduce: in = out = cc.count * es; break;
    case CollKind::all_gather: in = cc.count * es, out = in * n; break;
    case CollKind::all_to_all: in = out = cc.count * es * n; break;
    case CollKind::reduce_scatter: out = cc.count * es, in = out * n; break;
    case CollKind::broadcast:
    case CollKind::reduce: in = out = cc.count * es; break;
    default: return false;
  }
  const std::uint64_t floor = coll::shm::cma_min_bytes(cc.kind, c.impl()->shm_oversubscribed());
  if (!c.impl()->shm_cma() || cc.count == 0 || std::max(in, out) < floor) return false;
  if (c.impl()->direct_min_bytes() == detail::ShmWindow::kDirectOff) return false;
  if (in_place && cc.kind == CollKind::all_reduce) return true;
  if (c.impl()->shm_cma_measured()) return true;
  return n * (in + out) <= coll::shm::kCmaMaxNodeBytes;
}

// One call. Returns false when the collective failed (the communicator is
// then unusable); an algorithm the communicator does not offer for the call
// is skipped. *eligible: whether shm runs the call and its direct path
// takes such calls when every rank's buffers can be mapped.
bool run_one(Comm& c, const CollCase& cc, bool in_place, Memory memory, const std::string& algo,
             std::vector<std::uint64_t>* hashes, bool* eligible) {
  const int rank = c.rank();
  const std::size_t es = dtype_size(cc.dt);
  const testing::BufferCounts bc = testing::buffer_counts(cc, rank);
  std::string label = std::string(testing::coll_info(cc.kind).name) + " algo=" + (algo.empty() ? "default" : algo) +
                      " " + dtype_name(cc.dt) + " count=" + std::to_string(cc.count) +
                      (in_place ? " in-place" : " out-of-place") +
                      (memory == Memory::heap        ? " heap"
                       : memory == Memory::mem_alloc ? " mem_alloc"
                                                     : " registered heap");
  CallOptions opt;
  opt.algorithm = algo;
  std::string ran;
  coll::CollArgs a;
  a.kind = cc.kind;
  a.count = cc.count;
  a.dt = cc.dt;
  a.op = cc.op;
  if (!c.impl()->algorithm_for(a, opt, &ran, nullptr).ok()) {
    if (!algo.empty()) return true;  // not offered here (one rank, several nodes): nothing to test
    ran.clear();
  }
  const std::size_t largest = std::max(bc.send, bc.recv) * es;
  // From the probing band up: these tests' calls below the threshold follow
  // direct ones (or none), so they try too (DirectHistory).
  *eligible = ran == "shm" && cc.count != 0 && largest >= direct_floor(c, cc.kind) &&
              !(in_place && cc.kind == CollKind::all_to_all);

  Status st;
  std::size_t wrong = 0;
  bool guards = true, untouched = true;
  std::uint64_t hash = 0;
  if (!in_place) {
    Guarded send(bc.send * es, memory), recv(bc.recv * es, memory);
    testing::fill_input(cc, rank, send.data());
    const std::uint64_t before = testing::hash_bytes(send.data(), bc.send * es);
    st = issue(c, cc, send.data(), recv.data(), opt).wait();
    if (st.ok()) {
      wrong = testing::check_output(cc, rank, recv.data());
      guards = send.guards_intact() && recv.guards_intact();
      untouched = testing::hash_bytes(send.data(), bc.send * es) == before;
      hash = testing::hash_bytes(recv.data(), bc.recv * es);
    }
  } else {
    const testing::InPlaceLayout lay = testing::in_place_layout(cc, rank);
    Guarded buf(lay.buffer_count * es, memory);
    testing::fill_input(cc, rank, buf.data() + lay.send_offset * es);
    st = issue(c, cc, buf.data() + lay.send_offset * es, buf.data() + lay.recv_offset * es, opt).wait();
    if (st.ok()) {
      wrong = testing::check_output(cc, rank, buf.data() + lay.recv_offset * es);
      guards = buf.guards_intact();
      hash = testing::hash_bytes(buf.data() + lay.recv_offset * es, bc.recv * es);
    }
  }
  if (!st.ok()) {
    ADD_FAILURE() << rank_tag() << ": " << label << " returned " << st.to_string();
    return false;
  }
  EXPECT_EQ(wrong, 0u) << rank_tag() << ": " << label << ": elements differ bitwise from the reference";
  EXPECT_TRUE(guards) << rank_tag() << ": " << label << ": wrote outside its buffers";
  EXPECT_TRUE(untouched) << rank_tag() << ": " << label << ": modified the send buffer";
  if (cc.kind == CollKind::all_reduce || cc.kind == CollKind::all_gather) hashes->push_back(hash);
  return true;
}

bool run_one(Comm& c, const CollCase& cc, bool in_place, bool registered, const std::string& algo,
             std::vector<std::uint64_t>* hashes, bool* eligible) {
  return run_one(c, cc, in_place, registered ? Memory::mem_alloc : Memory::heap, algo, hashes, eligible);
}

void expect_same_everywhere(const std::vector<std::uint64_t>& hashes) {
  std::uint64_t h = 0;
  for (std::uint64_t x : hashes) h = testing::hash_bytes(&x, sizeof x, h);
  for (std::uint64_t other : allgather_u64(h)) {
    EXPECT_EQ(other, h) << rank_tag() << ": a replicated result differs between ranks";
  }
}

// Whether this run expects eligible calls to go direct: one window holds
// the whole communicator (one node, several ranks) and the run does not
// switch the path off.
bool direct_expected(Comm& c) {
  return c.num_nodes() == 1 && c.size() > 1 && env_int("CCLZ_TEST_EXPECT_DIRECT", 1) == 1;
}

constexpr CollKind kKinds[] = {CollKind::all_reduce, CollKind::reduce_scatter, CollKind::all_gather,
                               CollKind::all_to_all,  CollKind::broadcast,      CollKind::reduce};

// A call's type, op and size, for the tables of the tests below.
struct Shape {
  DataType dt;
  ReduceOp op;
  std::size_t bytes;
};

// Buffers every rank can read in place (`memory`: mem_alloc, or heap
// buffers registered with register_buffer) on every rank: `shapes` in
// every collective, odd counts, in and out of place, through each of
// `algos` ("" is the tuned default). Every eligible call must go direct.
void in_place_readable_bit_exact(Memory memory, std::span<const Shape> shapes,
                                 std::initializer_list<const char*> algos) {
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int n = c->size();
  std::vector<std::uint64_t> hashes;
  std::uint64_t eligible_calls = 0;
  const std::uint64_t before = c->impl()->direct_calls(), mapped_before = c->impl()->mapped_calls();
  for (CollKind kind : kKinds) {
    const testing::CollInfo& info = testing::coll_info(kind);
    for (const std::string algo : algos) {
      for (const Shape& s : shapes) {
        const std::size_t count = testing::count_for_bytes(kind, s.bytes, s.dt, n) | 1;
        for (bool in_place : {false, true}) {
          if (in_place && !info.has_in_place) continue;
          CollCase cc{kind, s.dt, info.reduces ? s.op : ReduceOp::sum, count, 0, n};
          bool eligible = false;
          ASSERT_TRUE(run_one(*c, cc, in_place, memory, algo, &hashes, &eligible));
          eligible_calls += eligible;
        }
      }
    }
  }
  expect_same_everywhere(hashes);
  const std::uint64_t direct = c->impl()->direct_calls() - before;
  const std::uint64_t mapped = c->impl()->mapped_calls() - mapped_before;
  if (direct_expected(*c)) {
    EXPECT_GT(eligible_calls, 0u) << rank_tag() << ": no call reached the shm algorithm";
    EXPECT_EQ(direct, eligible_calls) << rank_tag() << ": calls that should have read the peers' buffers in place";
    EXPECT_EQ(mapped, eligible_calls) << rank_tag() << ": calls that went through cross-memory attach instead";
  } else {
    EXPECT_EQ(direct, 0u) << rank_tag() << ": the direct path ran where it should not";
  }
}

// mem_alloc buffers: calls from 300 KB (below the default 1 MiB threshold:
// staged unless a run lowers it) to past the 4 MB streaming size, several
// dtypes and ops (avg too), through the shm algorithm and the tuned default.
TEST(Direct, RegisteredBuffersBitExact) {
  const Shape shapes[] = {{DataType::f32, ReduceOp::sum, 300u << 10}, {DataType::bf16, ReduceOp::sum, 1u << 20},
                          {DataType::i32, ReduceOp::max, 2u << 20},   {DataType::f16, ReduceOp::prod, 700u << 10},
                          {DataType::u8, ReduceOp::min, 600u << 10},  {DataType::f64, ReduceOp::sum, 5u << 20},
                          {DataType::bf16, ReduceOp::avg, 1536u << 10}};
  in_place_readable_bit_exact(Memory::mem_alloc, shapes, {"", "shm"});
}

// Heap buffers made readable in place by register_buffer go direct exactly
// as mem_alloc ones do. Once mapped, a call runs the same code as on
// mem_alloc buffers (the test above); what is new is finding the buffer,
// so three shapes that span the thresholds (staged or direct by the run's
// setting, cached, streamed), through the tuned default.
TEST(Direct, HeapRegisteredBitExact) {
  const Shape shapes[] = {{DataType::f32, ReduceOp::sum, 300u << 10},
                          {DataType::bf16, ReduceOp::avg, 1536u << 10},
                          {DataType::f64, ReduceOp::sum, 5u << 20}};
  in_place_readable_bit_exact(Memory::registered_heap, shapes, {""});
}

// Rank 0's buffers are heap memory, the others' mem_alloc: no rank can map
// rank 0's buffers, so every rank must take the staged path, exactly, or,
// for the collectives that have it, cross-memory attach, all alike.
TEST(Direct, OneHeapRankSendsEveryoneStaged) {
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int n = c->size();
  std::vector<std::uint64_t> hashes;
  const std::uint64_t before = c->impl()->direct_calls();
  std::uint64_t via_cma = 0;
  for (CollKind kind : kKinds) {
    const std::size_t count = testing::count_for_bytes(kind, 1u << 20, DataType::f32, n) | 1;
    CollCase cc{kind, DataType::f32, ReduceOp::sum, count, 0, n};
    bool eligible = false;
    ASSERT_TRUE(run_one(*c, cc, false, c->rank() != 0, "", &hashes, &eligible));
    via_cma += eligible && direct_expected(*c) && cma_eligible(*c, cc, false);
  }
  expect_same_everywhere(hashes);
  EXPECT_EQ(c->impl()->direct_calls() - before, via_cma)
      << rank_tag() << ": rank 0's buffers are heap: only cross-memory attach may go direct";
}

// Heap buffers on every rank: the all-reduce, all-gather, all-to-all,
// reduce-scatter, broadcast and reduce go through cross-memory attach where it applies (sizes around its bounds,
// odd counts, several dtypes and ops, avg too, in and out of place), everything else
// staged; every call bitwise against the reference. With CCLZ_SHM_CMA=0 on
// the node's first rank (mpi-cma-first-0), nothing goes direct. For the
// all-reduce out of place, the node's cap (kCmaMaxNodeBytes) lies between
// the 9 and 17 MiB calls' buffers on 2 and 3 ranks and below the 9 MiB
// ones from 4: the 17 MiB call (avg) crosses it on every rank count.
TEST(Cma, HeapBuffersBitExact) {
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int n = c->size();
  const Shape shapes[] = {{DataType::f32, ReduceOp::sum, 200u << 10}, {DataType::f32, ReduceOp::sum, 300u << 10},
                          {DataType::bf16, ReduceOp::sum, 1u << 20},  {DataType::i32, ReduceOp::max, 3u << 20},
                          {DataType::f16, ReduceOp::prod, 700u << 10}, {DataType::f64, ReduceOp::min, 9u << 20},
                          {DataType::u8, ReduceOp::sum, 1536u << 10}, {DataType::f32, ReduceOp::avg, 600u << 10},
                          {DataType::bf16, ReduceOp::avg, 17u << 20}};
  std::vector<std::uint64_t> hashes;
  std::uint64_t want = 0;
  const std::uint64_t before = c->impl()->direct_calls(), mapped_before = c->impl()->mapped_calls();
  for (CollKind kind : kKinds) {
    const testing::CollInfo& info = testing::coll_info(kind);
    for (const Shape& s : shapes) {
      const std::size_t count = testing::count_for_bytes(kind, s.bytes, s.dt, n) | 1;
      for (bool in_place : {false, true}) {
        if (in_place && !info.has_in_place) continue;
        CollCase cc{kind, s.dt, info.reduces ? s.op : ReduceOp::sum, count, 0, n};
        bool eligible = false;
        ASSERT_TRUE(run_one(*c, cc, in_place, false, "shm", &hashes, &eligible));
        want += eligible && direct_expected(*c) && cma_eligible(*c, cc, in_place);
      }
    }
  }
  expect_same_everywhere(hashes);
  EXPECT_EQ(c->impl()->direct_calls() - before, want) << rank_tag() << ": heap calls through cross-memory attach";
  EXPECT_EQ(c->impl()->mapped_calls() - mapped_before, 0u) << rank_tag() << ": heap buffers were mapped";
  if (direct_expected(*c) && c->impl()->shm_cma()) {
    EXPECT_GT(want, 0u) << rank_tag() << ": no call was eligible";
  }
}

// Heap buffers on every rank with CCLZ_SHM_CMA=auto: rank 0 times each
// band's calls, the kernel's way first, and picks each call's way one call
// of the band ahead (HeapPathPlan), which every rank follows. Six calls of
// one band: the first staged (no pick yet), the next kMin through
// cross-memory attach, then staged until the staged way has kMin calls,
// and the rest as rank 0 measured; every call bitwise against the
// reference and the same on every rank. Under cma_min_bytes() every call
// stays staged. Where no rank measures, kMin calls of each band.
// With the node's first rank at 1 (mpi-cma-first-1-others-auto), all of them
// go through cross-memory attach on every rank, except the 24 MiB calls out
// of place, whose node's buffers pass kCmaMaxNodeBytes: those are measured
// only where rank 0 measures, and are staged otherwise. With more ranks
// than cores (no measured choice then) only the all-to-all goes through the
// kernel, from 512 KiB, as at 1; every other call is staged.
TEST(CmaMeasured, RunsBothWaysBitExact) {
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int n = c->size();
  if (!direct_expected(*c) || !c->impl()->shm_cma()) {
    GTEST_SKIP() << "needs several ranks sharing one window with cross-memory attach on";
  }
  const bool measured = c->impl()->shm_cma_measured();
  constexpr int kMin = coll::shm::HeapPathChooser::kMin, kMeasuredCalls = 2 * kMin + 2;
  // Without a measured choice on any rank each call's way is a rule of its
  // size alone, so kMin calls show it; the six calls of a band (warm-up,
  // then the chooser's pick) are for the runs that measure. Asked of every
  // rank: all of them must make the same number of calls.
  std::uint64_t measuring_ranks = 0;
  for (std::uint64_t m : allgather_u64(measured ? 1 : 0)) measuring_ranks += m;
  const int calls = measuring_ranks > 0 ? kMeasuredCalls : kMin;
  std::vector<std::uint64_t> hashes;
  // 1536 KiB and up: eligible with more ranks than cores too, for the
  // all-to-all. 256 KiB (an odd count: just past it): the all-reduce and
  // reduce through the kernel unmeasured with a core per rank, the others
  // measured. 64 KiB (the all-reduce and reduce) and 192 KiB (the reduce,
  // bf16 avg: its one hand-off): staged.
  const Shape shapes[] = {{DataType::f32, ReduceOp::sum, 3u << 20},
                          {DataType::bf16, ReduceOp::sum, 1536u << 10},
                          {DataType::f32, ReduceOp::sum, 24u << 20},
                          {DataType::f32, ReduceOp::sum, 256u << 10},
                          {DataType::f32, ReduceOp::sum, 64u << 10},
                          {DataType::bf16, ReduceOp::avg, 192u << 10}};
  for (CollKind kind : {CollKind::all_reduce, CollKind::all_to_all, CollKind::reduce_scatter, CollKind::all_gather,
                        CollKind::broadcast, CollKind::reduce}) {
    const bool reduction = kind == CollKind::all_reduce || kind == CollKind::reduce;
    // Every shape for the all-reduce, all-to-all and reduce-scatter; the
    // all-gather, broadcast and reduce at 1536 and 256 KiB only (the
    // sanitizer jobs' time); 64 KiB for the all-reduce and reduce only.
    const bool every_size = kind == CollKind::all_reduce || kind == CollKind::all_to_all ||
                            kind == CollKind::reduce_scatter;
    for (const Shape& s : shapes) {
      const bool wanted = s.bytes == (192u << 10)  ? kind == CollKind::reduce
                          : s.bytes == (64u << 10) ? reduction
                                                   : every_size || s.bytes == (1536u << 10) || s.bytes == (256u << 10);
      if (!wanted) continue;
      for (bool in_place : {false, true}) {
        if (in_place && !testing::coll_info(kind).has_in_place) continue;
        const std::size_t count = testing::count_for_bytes(kind, s.bytes, s.dt, n) | 1;
        // A broadcast's or reduce's root last: rank 0 then does not run the
        // call's root, and in a broadcast no rank waits for it, yet every
        // rank must follow its picks.
        const int root = kind == CollKind::broadcast || kind == CollKind::reduce ? n - 1 : 0;
        CollCase cc{kind, s.dt, s.op, count, root, n};
        // The policy stated here, not read from the library: with a core
        // per rank, heap calls stay staged under 128 KiB (the all-reduce),
        // up to 256 KiB (the reduce, in one hand-off) or under 32 KiB (the
        // others), the all-reduce and reduce go through the kernel
        // unmeasured from there to 512 KiB, and every other call is
        // measured. With more ranks than cores, every call but the
        // all-to-all's from 512 KiB stays staged.
        const bool oversubscribed = c->impl()->shm_oversubscribed();
        const std::size_t call_bytes = count * dtype_size(s.dt);
        const bool staged = oversubscribed                 ? kind != CollKind::all_to_all || s.bytes < (512u << 10)
                            : kind == CollKind::reduce     ? call_bytes <= (256u << 10)
                            : kind == CollKind::all_reduce ? s.bytes < (128u << 10)
                                                           : s.bytes < (32u << 10);
        const bool small = reduction && s.bytes < (512u << 10);
        if (!staged && !cma_eligible(*c, cc, in_place)) {
          // Past the node's cap unmeasured (24 MiB out of place).
          ASSERT_FALSE(measured) << testing::coll_info(kind).name;
          continue;
        }
        const std::uint64_t before = c->impl()->direct_calls();
        // Calls through the kernel after the first call, after kMin + 1
        // calls and after 2 * kMin.
        std::uint64_t after_first = 0, after_trial = 0, after_staged = 0;
        for (int k = 1; k <= calls; ++k) {
          bool eligible = false;
          ASSERT_TRUE(run_one(*c, cc, in_place, false, "shm", &hashes, &eligible));
          ASSERT_TRUE(eligible);
          const std::uint64_t so_far = c->impl()->direct_calls() - before;
          if (k == 1) after_first = so_far;
          if (k == kMin + 1) after_trial = so_far;
          if (k == 2 * kMin) after_staged = so_far;
        }
        const std::uint64_t direct = c->impl()->direct_calls() - before;
        const std::string what = std::string(testing::coll_info(kind).name) + " " + dtype_name(s.dt) + " " +
                                 std::to_string(s.bytes >> 10) + " KiB" + (in_place ? " in place" : " out of place");
        if (staged) {
          EXPECT_EQ(direct, 0u) << rank_tag() << ": " << what << ": under the kernel's floor";
          continue;
        }
        if (!measured || small) {
          EXPECT_EQ(direct, static_cast<std::uint64_t>(calls)) << rank_tag() << ": " << what << ": not measured";
          continue;
        }
        EXPECT_EQ(after_first, 0u) << rank_tag() << ": " << what << ": the first call, before any pick";
        EXPECT_EQ(after_trial, std::uint64_t{kMin}) << rank_tag() << ": " << what << ": the kernel's trial";
        EXPECT_EQ(after_staged, std::uint64_t{kMin}) << rank_tag() << ": " << what << ": the staged trial";
        EXPECT_LE(direct, static_cast<std::uint64_t>(calls - kMin)) << rank_tag() << ": " << what;
      }
    }
  }
  expect_same_everywhere(hashes);
}

// Staged heap calls whose outputs are streamed (the job sets a 512 KiB
// last level) also choose their slot stores by measurement, the ordinary
// ones first. Rank 0 must not time the staged way while those are being
// measured: the stores tried first may be the slow ones, and the staged
// way's times would then keep the kernel's way. So, per band: a first
// staged call (no pick yet; the stores' first trial, unrecorded), kMin
// through cross-memory attach, recorded (see RunsBothWaysBitExact), then
// staged calls: the rest of the stores' 2 * kMin trials unrecorded, and
// kMin recorded; every call bitwise against the reference and the same
// on every rank.
TEST(CmaMeasured, StagedTimedOnlyOnceItsStoresAreChosen) {
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int n = c->size();
  if (!direct_expected(*c) || !c->impl()->shm_cma_measured()) {
    GTEST_SKIP() << "needs several ranks sharing one window, a core each, with CCLZ_SHM_CMA=auto";
  }
  if (env_int("CCLZ_SHM_LLC_KB", 0) != 512) GTEST_SKIP() << "its job sets CCLZ_SHM_LLC_KB=512";
  constexpr int kMin = coll::shm::HeapPathChooser::kMin, kCalls = 4 * kMin;
  std::vector<std::uint64_t> hashes;
  // The collectives whose staged calls stream through SlotStoreCall.
  for (CollKind kind : {CollKind::all_reduce, CollKind::all_gather, CollKind::all_to_all}) {
    for (bool in_place : {false, true}) {
      if (in_place && !testing::coll_info(kind).has_in_place) continue;
      const std::size_t count = testing::count_for_bytes(kind, 1536u << 10, DataType::f32, n) | 1;
      CollCase cc{kind, DataType::f32, ReduceOp::sum, count, 0, n};
      ASSERT_TRUE(cma_eligible(*c, cc, in_place)) << testing::coll_info(kind).name;
      const std::string what =
          std::string(testing::coll_info(kind).name) + (in_place ? " in place" : " out of place");
      const std::uint64_t direct_before = c->impl()->direct_calls();
      const std::uint64_t cma_timed = c->impl()->heap_path_timed(false);
      const std::uint64_t staged_timed = c->impl()->heap_path_timed(true);
      for (int k = 0; k < kCalls; ++k) {
        bool eligible = false;
        ASSERT_TRUE(run_one(*c, cc, in_place, false, "shm", &hashes, &eligible));
        ASSERT_TRUE(eligible);
      }
      EXPECT_EQ(c->impl()->direct_calls() - direct_before, std::uint64_t{kMin})
          << rank_tag() << ": " << what << ": the staged calls while the stores were measured";
      if (c->rank() == 0) {
        EXPECT_EQ(c->impl()->heap_path_timed(false) - cma_timed, std::uint64_t{kMin}) << what;
        EXPECT_EQ(c->impl()->heap_path_timed(true) - staged_timed, std::uint64_t{kMin})
            << what << ": staged calls timed while their stores were measured";
      }
    }
  }
  expect_same_everywhere(hashes);
}

// A call whose cross-memory read of rank `from`'s buffer failed: a clear
// invalid_usage naming that rank.
void expect_could_not_read(const Status& st, int from) {
  EXPECT_EQ(st.code(), Result::invalid_usage) << rank_tag() << ": " << st.to_string();
  EXPECT_NE(st.message().find("cross-memory attach could not read rank " + std::to_string(from)), std::string::npos)
      << st.message();
}

// The last rank's in-place all-gather block ends, in its process, a page
// before the count says: the peers' cross-memory reads of it fail, and
// they must say so (invalid_usage naming the rank) instead of crashing or
// hanging, while the last rank, which reads only the others' blocks,
// completes. The communicator is not used afterwards.
TEST(Cma, ShortPeerBufferIsAClearError) {
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int n = c->size(), rank = c->rank(), last = n - 1;
  if (!direct_expected(*c) || !c->impl()->shm_cma()) {
    GTEST_SKIP() << "needs several ranks sharing one window with cross-memory attach on";
  }
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  // At least 64 pages a block, and an all-gather large enough to go through
  // cross-memory attach. With more ranks than cores it never does: the
  // staged call would read the missing page itself.
  const std::uint64_t floor = coll::shm::cma_min_bytes(CollKind::all_gather, c->impl()->shm_oversubscribed());
  if (floor == coll::shm::kCmaNever) {
    GTEST_SKIP() << "with more ranks than cores an all-gather never goes through cross-memory attach";
  }
  const std::size_t pages = std::max<std::size_t>(64, (floor / static_cast<std::uint64_t>(n) + page - 1) / page);
  const std::size_t block = pages * page, count = block / sizeof(float), total = block * static_cast<std::size_t>(n);
  // The whole output, and one page more that the last rank takes away.
  void* mem = mmap(nullptr, total + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* out = static_cast<std::byte*>(mem);
  for (std::size_t i = 0; i < total; ++i) out[i] = std::byte{static_cast<unsigned char>(rank + 1)};
  if (rank == last) {
    ASSERT_EQ(munmap(out + total - page, 2 * page), 0);
  }
  const Status st =
      c->all_gather(out + static_cast<std::size_t>(rank) * block, out, count, DataType::f32).wait();
  if (rank == last) {
    EXPECT_TRUE(st.ok()) << rank_tag() << ": " << st.to_string();
    for (int q = 0; q < last; ++q) {
      EXPECT_EQ(out[static_cast<std::size_t>(q) * block], std::byte{static_cast<unsigned char>(q + 1)}) << q;
    }
  } else {
    expect_could_not_read(st, last);
  }
  munmap(out, rank == last ? total - page : total + page);
}

// The root's broadcast buffer ends, in its process, a page before the
// count says: the other ranks' cross-memory reads of it fail, and they must
// say so (invalid_usage naming the root) instead of crashing or hanging,
// while the root, whose in-place call reads nothing, completes. The
// communicator is not used afterwards.
TEST(Cma, ShortRootBufferIsAClearError) {
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int rank = c->rank(), root = 0;
  if (!direct_expected(*c) || !c->impl()->shm_cma()) {
    GTEST_SKIP() << "needs several ranks sharing one window with cross-memory attach on";
  }
  const std::uint64_t floor = coll::shm::cma_min_bytes(CollKind::broadcast, c->impl()->shm_oversubscribed());
  if (floor == coll::shm::kCmaNever) {
    GTEST_SKIP() << "with more ranks than cores a broadcast never goes through cross-memory attach";
  }
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t bytes = std::max<std::size_t>(64, (floor + page - 1) / page) * page;
  void* mem = mmap(nullptr, bytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* buf = static_cast<std::byte*>(mem);
  std::memset(buf, rank + 1, bytes);
  if (rank == root) {
    ASSERT_EQ(munmap(buf + bytes - page, 2 * page), 0);
  }
  const Status st = c->broadcast(buf, buf, bytes / sizeof(float), DataType::f32, root).wait();
  if (rank == root) {
    EXPECT_TRUE(st.ok()) << rank_tag() << ": " << st.to_string();
  } else {
    expect_could_not_read(st, root);
  }
  munmap(buf, rank == root ? bytes - page : bytes + page);
}

// Below the threshold, in the probing band, calls ask their peers only
// while the direct path is being taken (DirectHistory): heap buffers ask
// once and then once every kRetryAfter calls; after a direct call,
// mem_alloc buffers go direct every time; one heap rank sends everyone
// staged, and the next calls stop asking. Every call is checked bitwise.
// An all-reduce of 96 KiB: in the band (from 32 KiB) and below where heap
// buffers go through cross-memory attach instead (128 KiB and up).
TEST(DirectProbe, BelowThresholdAsksWhileTaken) {
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int n = c->size();
  const std::uint64_t threshold = c->impl()->direct_min_bytes();
  constexpr CollKind kKind = CollKind::all_reduce;
  constexpr std::size_t kBandBytes = 96u << 10;
  static_assert(kBandBytes >= coll::shm::direct_probe_min_bytes(kKind, false) &&
                kBandBytes >= coll::shm::direct_probe_min_bytes(kKind, true) &&
                kBandBytes < coll::shm::cma_min_bytes(kKind, false));
  const bool band = direct_expected(*c) && threshold != detail::ShmWindow::kDirectOff && threshold > kBandBytes;
  const CollCase small{kKind, DataType::f32, ReduceOp::sum,
                       testing::count_for_bytes(kKind, kBandBytes, DataType::f32, n) | 1, 0, n};
  const CollCase large{kKind, DataType::f32, ReduceOp::sum,
                       testing::count_for_bytes(kKind, 2u << 20, DataType::f32, n) | 1, 0, n};
  std::vector<std::uint64_t> hashes;
  bool eligible = false;
  auto tries = [&] { return c->impl()->direct_tries(); };
  auto direct = [&] { return c->impl()->direct_calls(); };

  // Heap everywhere: the first call asks, the next 63 do not, the 65th does.
  std::uint64_t t0 = tries(), d0 = direct();
  const unsigned calls = coll::shm::DirectHistory::kRetryAfter + 6;
  for (unsigned i = 0; i < calls; ++i) ASSERT_TRUE(run_one(*c, small, i % 2 == 1, false, "shm", &hashes, &eligible));
  if (band) {
    EXPECT_EQ(tries() - t0, 2u) << rank_tag() << ": heap calls in the band should ask on the 1st and 65th call";
  }
  EXPECT_EQ(direct() - d0, 0u) << rank_tag() << ": heap buffers went direct";

  // mem_alloc everywhere: a call above the threshold goes direct, and the
  // band's calls after it do too.
  t0 = tries();
  d0 = direct();
  ASSERT_TRUE(run_one(*c, large, false, true, "shm", &hashes, &eligible));
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(run_one(*c, small, i % 2 == 1, true, "shm", &hashes, &eligible));
  if (band) {
    EXPECT_EQ(tries() - t0, 11u) << rank_tag();
    EXPECT_EQ(direct() - d0, 11u) << rank_tag() << ": mem_alloc calls in the band after a direct call";
  }

  // Rank 0 back on heap buffers: the first band call asks and goes staged
  // everywhere, the next ones do not ask.
  t0 = tries();
  d0 = direct();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(run_one(*c, small, false, c->rank() != 0, "shm", &hashes, &eligible));
  if (band) {
    EXPECT_EQ(tries() - t0, 1u) << rank_tag();
  }
  EXPECT_EQ(direct() - d0, 0u) << rank_tag() << ": went direct although rank 0's buffers are heap";
  expect_same_everywhere(hashes);
}

// The probing band's floor of every collective (direct_probe_min_bytes: by
// collective, and higher where the ranks outnumber the cores): mem_alloc
// calls whose largest buffer is one element short of it stay staged, calls
// that reach it go direct, in and out of place, all bit exact.
TEST(DirectProbe, FloorPerCollective) {
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int n = c->size();
  const std::size_t es = dtype_size(DataType::f32);
  std::vector<std::uint64_t> hashes;
  std::uint64_t eligible_calls = 0, below_floor = 0;
  const std::uint64_t before = c->impl()->direct_calls();
  for (CollKind kind : kKinds) {
    const testing::CollInfo& info = testing::coll_info(kind);
    const std::uint64_t floor = direct_floor(*c, kind);
    if (floor == detail::ShmWindow::kDirectOff) continue;
    // Bytes of the largest buffer per element of `count`.
    const testing::BufferCounts per_elem = testing::buffer_counts({kind, DataType::f32, ReduceOp::sum, 1, 0, n}, 0);
    const std::size_t unit = es * std::max(per_elem.send, per_elem.recv);
    const std::size_t at = (floor + unit - 1) / unit, short_of = at - 1;
    ASSERT_GE(at * unit, floor);
    ASSERT_LT(short_of * unit, floor);
    for (std::size_t count : {short_of, at}) {
      for (bool in_place : {false, true}) {
        if (in_place && !info.has_in_place) continue;
        CollCase cc{kind, DataType::f32, ReduceOp::sum, count, 0, n};
        bool eligible = false;
        const std::uint64_t d0 = c->impl()->direct_calls();
        ASSERT_TRUE(run_one(*c, cc, in_place, Memory::mem_alloc, "shm", &hashes, &eligible));
        eligible_calls += eligible;
        if (count == short_of) {
          ++below_floor;
          EXPECT_EQ(c->impl()->direct_calls(), d0)
              << rank_tag() << ": " << info.name << " of " << count * unit << " bytes, below the floor of " << floor
              << ", went direct";
        }
      }
    }
  }
  expect_same_everywhere(hashes);
  const std::uint64_t direct = c->impl()->direct_calls() - before;
  if (direct_expected(*c)) {
    EXPECT_GT(below_floor, 0u);
    EXPECT_GT(eligible_calls, 0u) << rank_tag() << ": no call reached the shm algorithm";
    EXPECT_EQ(direct, eligible_calls) << rank_tag() << ": calls at the floor that should have gone direct";
  } else {
    EXPECT_EQ(direct, 0u) << rank_tag() << ": the direct path ran where it should not";
  }
}

// More buffers than a rank keeps peers' mappings of (64): each call's
// buffers are new allocations, freed afterwards, so mappings are made,
// evicted and never confused with a freed buffer's.
TEST(Direct, ManyShortLivedBuffers) {
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int n = c->size();
  std::vector<std::uint64_t> hashes;
  std::uint64_t eligible_calls = 0;
  const std::uint64_t before = c->impl()->direct_calls();
  for (int i = 0; i < 80; ++i) {
    const CollKind kind = i % 2 == 0 ? CollKind::all_reduce : CollKind::all_gather;
    const std::size_t count = testing::count_for_bytes(kind, (1u << 20) + 4096u * static_cast<unsigned>(i),
                                                       DataType::f32, n) | 1;
    CollCase cc{kind, DataType::f32, ReduceOp::sum, count, 0, n};
    bool eligible = false;
    ASSERT_TRUE(run_one(*c, cc, false, true, "", &hashes, &eligible));
    eligible_calls += eligible;
  }
  expect_same_everywhere(hashes);
  const std::uint64_t direct = c->impl()->direct_calls() - before;
  if (direct_expected(*c)) {
    EXPECT_EQ(direct, eligible_calls) << rank_tag();
  }
}

// From now on the system calls `nrs` fail with EPERM in this process (a
// seccomp filter, which cannot be removed): what a host that forbids them
// looks like to the direct path. On every thread of the process
// (SECCOMP_FILTER_FLAG_TSYNC): a collective runs on whichever thread holds
// the communicator's runner role, its worker thread included, which was
// started before the filter; a filter on the calling thread alone let a
// call the worker ran go direct (once, in a sanitizer run).
bool deny_syscalls(std::initializer_list<long> nrs) {
  // Load the number; one test per call, jumping to the EPERM return at the
  // end; allow everything else.
  std::vector<sock_filter> code{BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr))};
  const auto k = static_cast<unsigned char>(nrs.size());
  unsigned char j = 1;
  for (long nr : nrs) {
    const auto to_deny = static_cast<unsigned char>(k + 1 - j);
    code.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<unsigned>(nr), to_deny, 0));
    ++j;
  }
  code.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  code.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)));
  sock_fprog prog{static_cast<unsigned short>(code.size()), code.data()};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog) == 0;
}

// The last rank cannot map its peers' buffers. Every rank has mem_alloc
// buffers, so all of them try, and the last rank's failure, confirmed in
// the second hand-off, must send every rank to the staged path, exactly.
// It changes the process for good, so it runs in a job of its own
// (mpi-direct-unmappable) and the other runs leave it out.
TEST(DirectUnmappable, OneRankCannotMapSendsEveryoneStaged) {
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int n = c->size();
  if (c->rank() == n - 1) {
    ASSERT_TRUE(deny_syscalls({SYS_pidfd_getfd})) << rank_tag() << ": cannot install the seccomp filter";
  }
  std::vector<std::uint64_t> hashes;
  const std::uint64_t before = c->impl()->direct_calls();
  std::uint64_t eligible_calls = 0;
  for (CollKind kind : kKinds) {
    const std::size_t count = testing::count_for_bytes(kind, 2u << 20, DataType::f32, n) | 1;
    CollCase cc{kind, DataType::f32, ReduceOp::sum, count, 0, n};
    bool eligible = false;
    ASSERT_TRUE(run_one(*c, cc, false, true, "", &hashes, &eligible));
    eligible_calls += eligible;
  }
  expect_same_everywhere(hashes);
  if (direct_expected(*c)) {
    EXPECT_GT(eligible_calls, 0u) << rank_tag() << ": no call reached the direct agreement";
  }
  EXPECT_EQ(c->impl()->direct_calls(), before) << rank_tag() << ": went direct although rank " << n - 1
                                               << " could not map its peers' buffers";
}

// The last rank may not use cross-memory attach. Heap buffers everywhere:
// the first eligible call's probe fails on that rank, the confirming
// hand-off sends every rank staged, and from then on that rank no longer
// offers it, so no later call goes direct either; every result exact.
// Changes the process for good: a job of its own (mpi-cma-refused).
TEST(CmaRefused, OneRankDeniedSendsEveryoneStaged) {
  std::unique_ptr<Comm> c = fresh_comm();
  ASSERT_NE(c, nullptr);
  const int n = c->size();
  if (c->rank() == n - 1) {
    ASSERT_TRUE(deny_syscalls({SYS_process_vm_readv, SYS_process_vm_writev}))
        << rank_tag() << ": cannot install the seccomp filter";
  }
  std::vector<std::uint64_t> hashes;
  const std::uint64_t before = c->impl()->direct_calls(), tries = c->impl()->direct_tries();
  std::uint64_t eligible_calls = 0;
  for (int round = 0; round < 3; ++round) {
    for (CollKind kind : {CollKind::all_reduce, CollKind::all_gather, CollKind::all_to_all}) {
      const std::size_t count = testing::count_for_bytes(kind, 2u << 20, DataType::f32, n) | 1;
      CollCase cc{kind, DataType::f32, ReduceOp::sum, count, 0, n};
      bool eligible = false;
      ASSERT_TRUE(run_one(*c, cc, false, false, "", &hashes, &eligible));
      eligible_calls += eligible && cma_eligible(*c, cc, false);
    }
  }
  expect_same_everywhere(hashes);
  if (direct_expected(*c)) {
    EXPECT_GT(eligible_calls, 0u) << rank_tag() << ": no call reached the agreement";
    EXPECT_EQ(c->impl()->direct_tries() - tries, 9u) << rank_tag();
  }
  EXPECT_EQ(c->impl()->direct_calls(), before) << rank_tag() << ": went direct although rank " << n - 1
                                               << " may not use cross-memory attach";
}

}  // namespace
}  // namespace cclz::mpitest
