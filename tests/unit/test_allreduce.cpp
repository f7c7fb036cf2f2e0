// All-reduce algorithms (ring, tree, rabenseifner, hierarchical) and the
// tuner, with ranks as threads over the in-process transport.
//
// Inputs are small integers chosen per (rank, element) so that every partial
// result is exact in every dtype (sum: |x| <= 4 per rank; prod: 1, -1 and at
// most two 2s per element; min/max: |x| <= 6; unsigned types nonnegative).
// The expected output is computed here in double, independently of the
// library's kernels, encoded by hand, and compared bitwise. Inexact random
// floats are used separately to check that all ranks agree bitwise, which
// only holds if each element is reduced once and copied.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "algorithm.hpp"
#include "allreduce/common.hpp"
#include "allreduce/handoffs.hpp"
#include "group.hpp"
#include "kernels.hpp"
#include "shm_nodes.hpp"
#include "slot_stores.hpp"
#include "thread_transport.hpp"

namespace cclz {
namespace {

using coll::AlgorithmDesc;
using coll::CollArgs;
using coll::CollKind;
using coll::Group;
using coll::ScratchPool;

constexpr double kTimeoutS = 20.0;
constexpr std::size_t kLarge = 65536 + 3;
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max};

std::vector<int> flat_nodes(int n) { return std::vector<int>(static_cast<std::size_t>(n), 0); }

Group make_group(detail::Transport& t, const std::vector<int>& nodes, std::uint64_t seq, ScratchPool& pool,
                 double timeout_s = kTimeoutS) {
  std::vector<int> members(nodes.size());
  for (std::size_t i = 0; i < members.size(); ++i) members[i] = static_cast<int>(i);
  auto deadline = detail::Clock::now() + std::chrono::duration_cast<detail::Clock::duration>(
                                             std::chrono::duration<double>(timeout_s));
  return Group(t, members, nodes, t.rank(), seq, deadline, pool);
}

const AlgorithmDesc& algo(const char* name) {
  const AlgorithmDesc* d = coll::find_algorithm(CollKind::all_reduce, name);
  EXPECT_NE(d, nullptr) << name;
  return *d;
}

// ---- exact values, encoded without the library ----------------------------

// Binary16 bits of a small integer (|v| <= 2048, so exactly representable).
std::uint16_t f16_of_int(double v) {
  if (v == 0) return 0;
  const std::uint16_t sign = v < 0 ? 0x8000 : 0;
  auto a = static_cast<std::uint32_t>(std::fabs(v));
  int e = 0;
  while ((a >> (e + 1)) != 0) ++e;
  const std::uint32_t mant = ((a << 10) >> e) & 0x3ffu;  // exact: a has <= 11 significant bits
  return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(e + 15) << 10 | mant);
}

// bfloat16 bits of a small integer (|v| <= 256): the top half of the float.
std::uint16_t bf16_of_int(double v) {
  const auto bits = std::bit_cast<std::uint32_t>(static_cast<float>(v));
  return static_cast<std::uint16_t>(bits >> 16);
}

void store(std::byte* p, DataType dt, double v) {
  auto put = [p](auto x) { std::memcpy(p, &x, sizeof x); };
  switch (dt) {
    case DataType::i8: put(static_cast<std::int8_t>(v)); break;
    case DataType::u8: put(static_cast<std::uint8_t>(v)); break;
    case DataType::i32: put(static_cast<std::int32_t>(v)); break;
    case DataType::i64: put(static_cast<std::int64_t>(v)); break;
    case DataType::f16: put(f16_of_int(v)); break;
    case DataType::bf16: put(bf16_of_int(v)); break;
    case DataType::f32: put(static_cast<float>(v)); break;
    case DataType::f64: put(v); break;
  }
}

double input_value(int rank, std::size_t i, ReduceOp op, DataType dt) {
  const bool nonneg = dt == DataType::u8;
  const auto r = static_cast<std::size_t>(rank);
  switch (op) {
    case ReduceOp::sum: {
      const double v = static_cast<double>((i * 7 + r * 3) % 9);
      return nonneg ? v : v - 4;
    }
    case ReduceOp::prod:
      // (i + 3r) % 5 == 0 holds for at most two of any eight consecutive ranks.
      if ((i + 3 * r) % 5 == 0) return 2;
      return !nonneg && (i + r) % 3 == 0 ? -1 : 1;
    default: {
      const double v = static_cast<double>((i * 5 + r * 11) % 13);
      return nonneg ? v : v - 6;
    }
  }
}

double expected_value(int n, std::size_t i, ReduceOp op, DataType dt) {
  double acc = input_value(0, i, op, dt);
  for (int r = 1; r < n; ++r) {
    const double v = input_value(r, i, op, dt);
    switch (op) {
      case ReduceOp::sum: acc += v; break;
      case ReduceOp::prod: acc *= v; break;
      case ReduceOp::min: acc = std::min(acc, v); break;
      default: acc = std::max(acc, v); break;
    }
  }
  return acc;
}

// ---- the checking harness --------------------------------------------------

using RunFn = std::function<Status(Group&, const CollArgs&)>;

struct Case {
  DataType dt;
  ReduceOp op;
  std::size_t count;
  bool in_place;
};

std::string describe(const std::string& label, int n, const Case& c) {
  return label + " n=" + std::to_string(n) + " " + dtype_name(c.dt) + " " + op_name(c.op) +
         " count=" + std::to_string(c.count) + (c.in_place ? " in-place" : " out-of-place");
}

// Runs every case, one collective call each (sequence numbers 1, 2, ...),
// on n thread-ranks and checks every rank's output bitwise against the
// reference, and that an out-of-place sendbuf is untouched.
// Node-local shared-memory windows for a run: slot size and count.
struct ShmSetup {
  std::size_t slot_bytes = 4096;
  int slots = 3;
  int allreduce_handoffs = 0;  // 0: measured (HandoffChooser), 1 or 2: fixed
  std::uint64_t direct_min_bytes = detail::ShmWindow::kDirectOff;
  std::uint64_t llc_bytes = 0;  // 0: the host's
  int slot_stores = 0;          // 0: measured, 1: ordinary, 2: streaming (ShmWindow::Geometry)
};

std::unique_ptr<testing::ShmNodes> make_shm(const std::vector<int>& nodes, const ShmSetup* shm) {
  return shm == nullptr ? nullptr
                        : std::make_unique<testing::ShmNodes>(nodes, shm->slot_bytes, shm->slots,
                                                              shm->allreduce_handoffs, shm->direct_min_bytes,
                                                              shm->llc_bytes, shm->slot_stores);
}

// Runs on every rank right before each call (the rank's window, null without one).
using BeforeCall = std::function<void(int rank, detail::ShmWindow* window, const CollArgs& a)>;

void check_cases(const std::string& label, const std::vector<int>& nodes, const std::vector<Case>& cases,
                 const RunFn& fn, const ShmSetup* shm = nullptr, const BeforeCall& before_call = nullptr) {
  const int n = static_cast<int>(nodes.size());
  const auto windows = make_shm(nodes, shm);
  testing::run_ranks(n, [&](detail::Transport& t, int rank) {
    ScratchPool pool;
    const auto window = windows ? windows->window(rank) : nullptr;
    for (std::size_t k = 0; k < cases.size(); ++k) {
      const Case& c = cases[k];
      const std::size_t es = dtype_size(c.dt), bytes = c.count * es;
      std::vector<std::byte> send(bytes), recv(bytes, std::byte{0xa5}), expect(bytes);
      for (std::size_t i = 0; i < c.count; ++i) {
        store(send.data() + i * es, c.dt, input_value(rank, i, c.op, c.dt));
        store(expect.data() + i * es, c.dt, expected_value(n, i, c.op, c.dt));
      }
      const std::vector<std::byte> send_copy = send;
      if (c.in_place) recv = send;
      CollArgs a;
      a.kind = CollKind::all_reduce;
      a.sendbuf = c.in_place ? recv.data() : send.data();
      a.recvbuf = recv.data();
      a.count = c.count;
      a.dt = c.dt;
      a.op = c.op;
      Group g = make_group(t, nodes, k + 1, pool);
      g.attach_shm(window.get());
      if (before_call) before_call(rank, window.get(), a);
      const Status st = fn(g, a);
      // A failed rank stops here; the others then fail by timeout, not hang.
      ASSERT_TRUE(st.ok()) << describe(label, n, c) << " rank " << rank << ": " << st.to_string();
      if (recv != expect) {
        std::size_t i = 0;
        while (std::memcmp(recv.data() + i * es, expect.data() + i * es, es) == 0) ++i;
        ADD_FAILURE() << describe(label, n, c) << " rank " << rank << ": first wrong element " << i;
      }
      if (!c.in_place && send != send_copy) ADD_FAILURE() << describe(label, n, c) << ": sendbuf modified";
    }
    // With the direct path on, every call that reaches it must have run on
    // it (thread ranks can always read one another's buffers): a silent
    // fall back to the staged path would leave it untested.
    if (window && shm->direct_min_bytes != detail::ShmWindow::kDirectOff && n == window->size()) {
      std::uint64_t want = 0;
      for (const Case& c : cases) want += c.count != 0 && c.count * dtype_size(c.dt) >= shm->direct_min_bytes;
      EXPECT_EQ(window->direct_calls(), want) << label << " n=" << n << " rank " << rank;
    }
  });
}

std::vector<Case> small_cases(int n) {
  std::vector<std::size_t> counts = {0, 1, 2, static_cast<std::size_t>(n - 1), 1001};
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  std::vector<Case> cases;
  for (DataType dt : kAllDataTypes) {
    for (ReduceOp op : kOps) {
      for (std::size_t count : counts) {
        for (bool in_place : {false, true}) cases.push_back({dt, op, count, in_place});
      }
    }
  }
  return cases;
}

std::vector<Case> large_cases() {
  std::vector<Case> cases;
  for (bool in_place : {false, true}) {
    cases.push_back({DataType::f32, ReduceOp::sum, kLarge, in_place});
    cases.push_back({DataType::bf16, ReduceOp::sum, kLarge, in_place});
    cases.push_back({DataType::i8, ReduceOp::prod, kLarge, in_place});
    cases.push_back({DataType::f64, ReduceOp::max, kLarge, in_place});
    cases.push_back({DataType::u8, ReduceOp::min, kLarge, in_place});
  }
  return cases;
}

RunFn by_descriptor(const char* name) {
  const AlgorithmDesc* d = &algo(name);
  return [d](Group& g, const CollArgs& a) { return d->run(g, a); };
}

void check_flat(const char* name, const ShmSetup* shm = nullptr) {
  for (int n = 1; n <= 8; ++n) {
    if (!testing::sweep_group_size(n)) continue;
    check_cases(name, flat_nodes(n), small_cases(n), by_descriptor(name), shm);
    check_cases(name, flat_nodes(n), large_cases(), by_descriptor(name), shm);
  }
}

TEST(AllReduce, RingEveryDtypeOpSizeAndCount) { check_flat("ring"); }
TEST(AllReduce, TreeEveryDtypeOpSizeAndCount) { check_flat("tree"); }
TEST(AllReduce, RabenseifnerEveryDtypeOpSizeAndCount) { check_flat("rabenseifner"); }

// The shared-memory window with one-page slots (counts from 1001 up run many
// chunks and wrap the slot ring), two slots (the tightest ring), and the
// default geometry (the small-message path up to 2 KiB per peer, or 16 KiB
// with more ranks than cores as for n > 2 on a 2-CPU machine, then one chunk).
TEST(AllReduce, ShmEveryDtypeOpSizeAndCount) {
  const ShmSetup tiny{4096, 3}, two{4096, 2}, standard{256 << 10, 4};
  check_flat("shm", &tiny);
  check_flat("shm", &standard);
  for (int n : {2, 3, 5}) check_cases("shm two slots", flat_nodes(n), large_cases(), by_descriptor("shm"), &two);
}

// The direct path (ranks reduce straight from one another's buffers) for
// every call, and from 16 KiB: every dtype, op, count and group size, in
// and out of place, with chunks of a few KiB (slot ring of 3 x 4 KiB) that
// wrap the ring many times, and with the default geometry (one chunk).
TEST(AllReduce, ShmDirectEveryDtypeOpSizeAndCount) {
  const ShmSetup every{4096, 3, 0, 0}, from16k{4096, 2, 0, 16 << 10}, standard{256 << 10, 4, 0, 0};
  check_flat("shm", &every);
  check_flat("shm", &standard);
  for (int n : {2, 3, 5}) check_cases("shm direct from 16K", flat_nodes(n), large_cases(), by_descriptor("shm"), &from16k);
}

// Calls up to 64 KiB per peer with the protocol fixed either way
// (CCLZ_SHM_ALLREDUCE_HANDOFFS), whether or not the ranks fit the cores:
// count 1001 of every dtype is 1-8 KB per peer, and the one-page slots
// send the larger calls through the chunked pipeline.
TEST(AllReduce, ShmWithOneOrTwoHandOffs) {
  for (int h : {1, 2}) {
    const ShmSetup tiny{4096, 3, h}, standard{256 << 10, 4, h};
    check_flat("shm", &tiny);
    check_flat("shm", &standard);
  }
}

// Measured choice (the default) on 2 ranks, which fit this host's cores
// unless it has only one: a stream of calls in one band runs both protocols
// (the chooser warms up on each, then explores), every result exact.
TEST(AllReduce, ShmMeasuredHandOffsRunBothProtocols) {
  if (detail::usable_cpus() < 2) GTEST_SKIP() << "one CPU: 2 ranks are oversubscribed, the choice is fixed";
  const ShmSetup standard{256 << 10, 4};
  std::vector<Case> cases;
  for (int i = 0; i < 80; ++i) {
    cases.push_back({i % 2 ? DataType::f32 : DataType::bf16, ReduceOp::sum, 1501, i % 3 == 0});
  }
  // The protocol each call runs, as rank 0's chooser has it in effect.
  std::array<int, 2> ran{};
  auto count_protocol = [&](int rank, detail::ShmWindow* w, const CollArgs& a) {
    using coll::allreduce_impl::HandoffChooser;
    const int band = HandoffChooser::band(a.count * dtype_size(a.dt));
    ASSERT_GE(band, 0);
    if (rank == 0) ran[static_cast<std::size_t>(w->local_state<HandoffChooser>().handoffs(band) - 1)] += 1;
  };
  check_cases("shm measured", flat_nodes(2), cases, by_descriptor("shm"), &standard, count_protocol);
  EXPECT_GT(ran[0], 0) << "one hand-off never ran";
  EXPECT_GT(ran[1], 0) << "two hand-offs never ran";
}

// Streamed calls (a 64 KiB last level makes every call here streamed)
// with the slot stores measured (slot_stores.hpp): rank 0's chooser runs
// both in its warm-up, every other rank runs the stores rank 0 sent with
// its previous call, and every result is exact.
TEST(AllReduce, ShmStreamedCallsRunBothSlotStores) {
  ShmSetup streamed;
  streamed.llc_bytes = 64 << 10;
  std::vector<Case> cases;
  for (int i = 0; i < 24; ++i) {
    cases.push_back({i % 3 == 2 ? DataType::bf16 : DataType::f32, ReduceOp::sum, 20001, i % 2 == 0});
  }
  for (int n : {2, 3}) {
    std::array<std::atomic<int>, 32> picked{};
    std::array<int, 2> ran{};
    std::array<int, 3> calls{};
    auto follow = [&](int rank, detail::ShmWindow* w, const CollArgs& a) {
      auto& state = w->local_state<coll::shm::SlotStoreState>();
      const int k = calls[static_cast<std::size_t>(rank)]++;
      if (rank == 0) {
        const bool in_place = a.sendbuf == a.recvbuf;
        const auto band =
            coll::shm::SlotStoreChooser::band(static_cast<std::uint64_t>(a.kind), in_place, a.count * dtype_size(a.dt));
        const auto s = state.chooser.pick(band);
        picked[static_cast<std::size_t>(k)] = static_cast<int>(s);
        ++ran[static_cast<std::size_t>(s)];
      } else if (k > 0) {
        EXPECT_EQ(static_cast<int>(state.in_effect), picked[static_cast<std::size_t>(k - 1)].load())
            << "rank " << rank << " before call " << k;
      }
    };
    check_cases("shm streamed", flat_nodes(n), cases, by_descriptor("shm"), &streamed, follow);
    EXPECT_GT(ran[0], 0) << n << " ranks: ordinary slot stores never ran";
    EXPECT_GT(ran[1], 0) << n << " ranks: streamed slot stores never ran";
  }
}

// Streamed calls (a 64 KiB last level) with the slot stores fixed
// (1: ordinary, 2: streaming): every dtype and op, counts from one element
// to many chunks, in place and not, on 2, 3 and 5 ranks.
void check_streamed_every_dtype_and_op(const char* what, int slot_stores) {
  ShmSetup setup;
  setup.llc_bytes = 64 << 10;
  setup.slot_stores = slot_stores;
  std::vector<Case> cases;
  for (DataType dt : kAllDataTypes) {
    for (ReduceOp op : kOps) {
      for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{1001}, std::size_t{20001}}) {
        for (bool in_place : {false, true}) cases.push_back({dt, op, count, in_place});
      }
    }
  }
  auto fixed = [slot_stores](int, detail::ShmWindow* w, const CollArgs&) {
    ASSERT_EQ(w->slot_stores(), slot_stores);
  };
  for (int n : {2, 3, 5}) check_cases(what, flat_nodes(n), cases, by_descriptor("shm"), &setup, fixed);
}

// Slots written through memory: the reduced share goes to the slot and the
// output in one pass with streaming stores (kernels::reduce_many_stream)
// for f32, and for f16 and bf16 on 2 ranks; in two passes for the rest.
TEST(AllReduce, ShmThroughMemoryEveryDtypeAndOp) { check_streamed_every_dtype_and_op("shm through memory", 2); }

// Slots written through the cache: the reduced share goes to the slot with
// ordinary stores and to the output with streaming ones in one pass
// (kernels::reduce_many_stream, dst not streamed) where the kernel
// applies, otherwise reduced into the slot and streamed on from there.
TEST(AllReduce, ShmThroughCacheEveryDtypeAndOp) { check_streamed_every_dtype_and_op("shm through cache", 1); }

TEST(HandoffChooser, Bands) {
  using coll::allreduce_impl::HandoffChooser;
  EXPECT_EQ(HandoffChooser::band(0), -1);
  EXPECT_EQ(HandoffChooser::band(2048), -1);
  EXPECT_EQ(HandoffChooser::band(2049), 0);
  EXPECT_EQ(HandoffChooser::band(4096), 0);
  EXPECT_EQ(HandoffChooser::band(4097), 1);
  EXPECT_EQ(HandoffChooser::band(16384), 2);
  EXPECT_EQ(HandoffChooser::band(16385), 3);
  EXPECT_EQ(HandoffChooser::band(65536), 4);
  EXPECT_EQ(HandoffChooser::band(65537), -1);
}

// The chooser on a simulated machine: each call runs the protocol in
// effect, takes rank 0's wanted choices (as every rank does during a call)
// and is recorded with the time `cost` gives it.
struct SimulatedBand {
  coll::allreduce_impl::HandoffChooser c;
  int band = 1, previous = 0;
  std::array<int, 2> ran{};
  // cost(protocol, whether the previous call ran the other one)
  template <class Cost>
  void run(int calls, Cost cost) {
    ran = {};
    for (int k = 0; k < calls; ++k) {
      const int h = c.handoffs(band);
      c.take(c.wanted());
      c.record(band, h, cost(h, previous != 0 && previous != h));
      previous = h;
      ++ran[static_cast<std::size_t>(h - 1)];
    }
  }
};

TEST(HandoffChooser, RunsTheFasterProtocolAndTriesTheOther) {
  using coll::allreduce_impl::HandoffChooser;
  SimulatedBand sim;
  for (int b = 0; b < HandoffChooser::kBands; ++b) EXPECT_EQ(sim.c.handoffs(b), 2) << "band " << b;
  // Warm-up samples both, then the first decision.
  sim.run(2 * HandoffChooser::kDecide, [](int h, bool) { return h == 1 ? 100u : 200u; });
  EXPECT_GT(sim.ran[0], 4);
  EXPECT_GT(sim.ran[1], 4);
  // Then one hand-off runs, and two only in the exploring bursts.
  sim.run(1024, [](int h, bool) { return h == 1 ? 100u : 200u; });
  EXPECT_EQ(sim.ran[1], static_cast<int>(1024 / HandoffChooser::kExplore * HandoffChooser::kBurst));
  EXPECT_EQ(sim.c.handoffs(0), 2) << "another band changed";
  // A few disturbed calls do not move it.
  sim.run(3, [](int, bool) { return 5000u; });
  sim.run(8, [](int h, bool) { return h == 1 ? 100u : 200u; });
  EXPECT_EQ(sim.ran[0], 8);
  // The machine changes: one hand-off becomes the slower. Within a few
  // decisions two hand-offs run, and then keep running.
  sim.run(HandoffChooser::kSamples + HandoffChooser::kDecide, [](int h, bool) { return h == 1 ? 500u : 200u; });
  EXPECT_EQ(sim.c.handoffs(1), 2);
  sim.run(512, [](int h, bool) { return h == 1 ? 500u : 200u; });
  EXPECT_EQ(sim.ran[0], static_cast<int>(512 / HandoffChooser::kExplore * HandoffChooser::kBurst));
}

// A call right after a switch of protocol is not counted: here a lone
// one-hand-off call looks fast, a run of them is slow.
TEST(HandoffChooser, IgnoresTheCallAfterASwitch) {
  using coll::allreduce_impl::HandoffChooser;
  SimulatedBand sim;
  auto cost = [](int h, bool switched) { return h == 2 ? 100u : switched ? 50u : 150u; };
  sim.run(2 * HandoffChooser::kDecide, cost);
  sim.run(1024, cost);
  EXPECT_EQ(sim.ran[0], static_cast<int>(1024 / HandoffChooser::kExplore * HandoffChooser::kBurst));
}

TEST(HandoffChooser, ChoicesTakeEffectWhenTaken) {
  coll::allreduce_impl::HandoffChooser c;
  EXPECT_EQ(c.handoffs(1), 2);
  c.take(0);
  EXPECT_EQ(c.handoffs(1), 1);
  EXPECT_EQ(c.handoffs(4), 1);
  c.take(~std::uint64_t{0});
  EXPECT_EQ(c.handoffs(4), 2);
}

TEST(AllReduce, ShmDeclinesGroupsWithoutAWindow) {
  const AlgorithmDesc& d = algo("shm");
  auto fabric = std::make_shared<testing::ThreadFabric>(4);
  testing::ThreadTransport t(fabric, 0);
  ScratchPool pool;
  CollArgs a;
  a.count = 100;
  Group g = make_group(t, flat_nodes(4), 1, pool);
  EXPECT_FALSE(d.supports(g, a));
  // A window of other members (here: a two-node layout's node 0) does not fit
  // the four-rank group either.
  testing::ShmNodes nodes({0, 0, 1, 1});
  const auto w = nodes.window(0);
  g.attach_shm(w.get());
  EXPECT_FALSE(d.supports(g, a));
  Group g2 = make_group(t, {0, 0, 1, 1}, 1, pool);
  g2.attach_shm(w.get());
  EXPECT_FALSE(d.supports(g2, a));  // the whole group spans two nodes
  const std::vector<int> local = {0, 1};
  EXPECT_TRUE(d.supports(g2.subgroup(local, 1), a));  // its node-local part fits
}

// Small pipeline slices / chunks, including ones that are not a multiple of
// the element size, so blocks are cut into many slices (some short or empty).
TEST(AllReduce, RingAndTreeWithManyPipelineSlices) {
  for (std::size_t slice : {std::size_t{1}, std::size_t{100}, std::size_t{4096}}) {
    RunFn ring = [slice](Group& g, const CollArgs& a) { return coll::allreduce_impl::ring_allreduce(g, a, slice); };
    RunFn tree = [slice](Group& g, const CollArgs& a) { return coll::allreduce_impl::tree_allreduce(g, a, slice); };
    for (int n : {2, 3, 5, 8}) {
      std::vector<Case> cases;
      for (DataType dt : {DataType::f64, DataType::bf16, DataType::i32, DataType::u8}) {
        for (bool in_place : {false, true}) {
          cases.push_back({dt, ReduceOp::sum, slice == 1 ? std::size_t{37} : std::size_t{1001}, in_place});
          cases.push_back({dt, ReduceOp::min, static_cast<std::size_t>(n + 1), in_place});
          // Many slices per block on the large count, without the per-message
          // cost of tiny slices dominating the test's runtime.
          if (slice >= 4096) cases.push_back({dt, ReduceOp::prod, kLarge, in_place});
        }
      }
      const std::string s = " slice=" + std::to_string(slice);
      check_cases("ring" + s, flat_nodes(n), cases, ring);
      check_cases("tree" + s, flat_nodes(n), cases, tree);
    }
  }
}

// Uniform multi-node layouts, contiguous and interleaved, 1 to 4 ranks per node.
const std::vector<std::vector<int>> kUniformLayouts = {
    {0, 1},          {0, 1, 2},          {0, 0, 1, 1},          {0, 1, 0, 1},
    {0, 0, 0, 1, 1, 1}, {0, 0, 1, 1, 2, 2}, {0, 0, 0, 0, 1, 1, 1, 1}, {0, 0, 1, 1, 2, 2, 3, 3},
    {3, 1, 3, 1, 2, 2},  // node ids need not be dense or ordered
};

std::string layout_name(const std::vector<int>& nodes) {
  std::string s = "hierarchical {";
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(nodes[i]);
  }
  return s + "}";
}

TEST(AllReduce, HierarchicalOnUniformNodes) {
  const ShmSetup tiny{4096, 3};
  for (const auto& nodes : kUniformLayouts) {
    check_cases(layout_name(nodes), nodes, small_cases(static_cast<int>(nodes.size())), by_descriptor("hierarchical"));
    check_cases(layout_name(nodes), nodes, large_cases(), by_descriptor("hierarchical"));
    // With a window per node the intra-node phases go through shared memory.
    check_cases(layout_name(nodes) + " shm", nodes, small_cases(static_cast<int>(nodes.size())),
                by_descriptor("hierarchical"), &tiny);
    check_cases(layout_name(nodes) + " shm", nodes, large_cases(), by_descriptor("hierarchical"), &tiny);
  }
  // Small slices through the intra-node phases.
  RunFn sliced = [](Group& g, const CollArgs& a) { return coll::allreduce_impl::hierarchical_allreduce(g, a, 100); };
  check_cases("hierarchical slice=100", {0, 0, 0, 1, 1, 1},
              {{DataType::f32, ReduceOp::sum, 1001, false}, {DataType::i64, ReduceOp::max, 1001, true}}, sliced);
}

TEST(AllReduce, HierarchicalSupportsOnlyUniformMultiNode) {
  const AlgorithmDesc& h = algo("hierarchical");
  ASSERT_NE(h.supports, nullptr);
  auto fabric = std::make_shared<testing::ThreadFabric>(8);
  testing::ThreadTransport t(fabric, 0);
  ScratchPool pool;
  CollArgs a;
  a.count = 1 << 20;
  for (const auto& nodes : kUniformLayouts) {
    EXPECT_TRUE(h.supports(make_group(t, nodes, 1, pool), a)) << layout_name(nodes);
  }
  const std::vector<std::vector<int>> rejected = {
      {0}, {0, 0}, {0, 0, 0, 0}, {0, 0, 1}, {0, 1, 1, 1}, {0, 0, 1, 1, 1, 2}, {5, 5, 5, 7},
  };
  for (const auto& nodes : rejected) {
    EXPECT_FALSE(h.supports(make_group(t, nodes, 1, pool), a)) << layout_name(nodes);
  }
  // Called anyway, it reports the misuse instead of computing garbage.
  testing::run_ranks(3, [&](detail::Transport& tt, int) {
    ScratchPool p;
    Group g = make_group(tt, {0, 0, 1}, 1, p);
    float x = 1, y = 0;
    CollArgs b;
    b.sendbuf = &x;
    b.recvbuf = &y;
    b.count = 1;
    EXPECT_EQ(h.run(g, b).code(), Result::invalid_usage);
  });
}

// Negative control for the agreement test: every rank gathers all inputs
// and folds them starting from its own, so ranks reduce in different orders.
Status naive_rotated_allreduce(Group& g, const CollArgs& a) {
  const int n = g.size(), r = g.rank();
  const std::size_t bytes = a.count * a.elem_size();
  std::vector<std::vector<std::byte>> all(static_cast<std::size_t>(n), std::vector<std::byte>(bytes));
  std::memcpy(all[static_cast<std::size_t>(r)].data(), a.sendbuf, bytes);
  for (int d = 1; d < n; ++d) {
    const int to = (r + d) % n, from = (r - d + n) % n;
    Status st = g.sendrecv(to, a.sendbuf, bytes, from, all[static_cast<std::size_t>(from)].data(), bytes,
                           static_cast<std::uint32_t>(d));
    if (!st.ok()) return st;
  }
  std::vector<std::byte> acc = all[static_cast<std::size_t>(r)];
  for (int d = 1; d < n; ++d) {
    kernels::reduce(acc.data(), acc.data(), all[static_cast<std::size_t>((r + d) % n)].data(), a.count, a.dt, a.op);
  }
  std::memcpy(a.recvbuf, acc.data(), bytes);
  return {};
}

// Runs sum and prod of random, inexact floats (every float dtype) in place
// and returns, per case, whether all ranks' outputs are bitwise equal.
std::vector<bool> ranks_agree(const std::string& name, const RunFn& fn, const std::vector<int>& nodes,
                              const ShmSetup* shm = nullptr) {
  const DataType dts[] = {DataType::f32, DataType::f64, DataType::f16, DataType::bf16};
  const ReduceOp ops[] = {ReduceOp::sum, ReduceOp::prod};
  const std::size_t count = 4099;
  const int n = static_cast<int>(nodes.size());
  // outputs[case][rank]
  std::vector<std::vector<std::vector<std::byte>>> outputs(std::size(dts) * std::size(ops),
                                                           std::vector<std::vector<std::byte>>(nodes.size()));
  const auto windows = make_shm(nodes, shm);
  testing::run_ranks(n, [&](detail::Transport& t, int rank) {
    ScratchPool pool;
    const auto window = windows ? windows->window(rank) : nullptr;
    std::mt19937 rng(static_cast<unsigned>(1234 + rank));
    std::uniform_real_distribution<float> mag(0.5f, 2.0f);
    std::uniform_int_distribution<int> exp2(-8, 8), sign(0, 1);
    std::size_t k = 0;
    for (DataType dt : dts) {
      for (ReduceOp op : ops) {
        const std::size_t es = dtype_size(dt);
        std::vector<std::byte> buf(count * es);
        for (std::size_t i = 0; i < count; ++i) {
          // Products stay near 1 so they neither overflow nor flush to 0.
          const float v =
              op == ReduceOp::prod ? mag(rng) : std::ldexp(mag(rng), exp2(rng)) * (sign(rng) ? 1.f : -1.f);
          if (dt == DataType::f32) std::memcpy(buf.data() + i * es, &v, es);
          if (dt == DataType::f64) {
            const double d = static_cast<double>(v) * (1.0 + 1e-9 * static_cast<double>(i % 97));
            std::memcpy(buf.data() + i * es, &d, es);
          }
          if (dt == DataType::f16 || dt == DataType::bf16) {
            const std::uint16_t h = dt == DataType::f16 ? kernels::float_to_half(v) : kernels::float_to_bf16(v);
            std::memcpy(buf.data() + i * es, &h, es);
          }
        }
        CollArgs a;
        a.sendbuf = a.recvbuf = buf.data();  // in place
        a.count = count;
        a.dt = dt;
        a.op = op;
        Group g = make_group(t, nodes, k + 1, pool);
        g.attach_shm(window.get());
        const Status st = fn(g, a);
        ASSERT_TRUE(st.ok()) << name << " " << st.to_string();
        outputs[k][static_cast<std::size_t>(rank)] = std::move(buf);
        ++k;
      }
    }
  });
  std::vector<bool> agree;
  for (const auto& per_rank : outputs) {
    agree.push_back(std::all_of(per_rank.begin(), per_rank.end(), [&](const auto& o) { return o == per_rank[0]; }));
  }
  return agree;
}

// Random, inexact floats: sums and products now depend on the order of
// operations, so equal outputs on all ranks show that every element was
// reduced once and copied, not recomputed per rank in a different order.
TEST(AllReduce, RanksAgreeBitwiseOnInexactFloats) {
  struct Setup {
    std::string name;
    RunFn fn;
    std::vector<int> nodes;
  };
  std::vector<Setup> setups;
  for (const char* name : {"ring", "tree", "rabenseifner"}) {
    for (int n : {3, 5, 8}) setups.push_back({name, by_descriptor(name), flat_nodes(n)});
  }
  setups.push_back({"ring slice=100",
                    [](Group& g, const CollArgs& a) { return coll::allreduce_impl::ring_allreduce(g, a, 100); },
                    flat_nodes(7)});
  setups.push_back({"tree chunk=100",
                    [](Group& g, const CollArgs& a) { return coll::allreduce_impl::tree_allreduce(g, a, 100); },
                    flat_nodes(7)});
  setups.push_back({"hierarchical", by_descriptor("hierarchical"), {0, 0, 0, 1, 1, 1}});
  setups.push_back({"hierarchical", by_descriptor("hierarchical"), {0, 1, 2, 3, 0, 1, 2, 3}});
  for (const Setup& s : setups) {
    const std::vector<bool> agree = ranks_agree(s.name, s.fn, s.nodes);
    for (std::size_t k = 0; k < agree.size(); ++k) {
      EXPECT_TRUE(agree[k]) << s.name << " n=" << s.nodes.size() << " case " << k << ": ranks differ";
    }
  }
  // The shared-memory window: the small path (every rank reduces the whole
  // buffer, in rank order) and the chunked one (share owners reduce).
  const ShmSetup tiny{4096, 3}, standard{256 << 10, 4};
  for (const ShmSetup* shm : {&tiny, &standard}) {
    for (const Setup& s : {Setup{"shm", by_descriptor("shm"), flat_nodes(3)},
                           Setup{"shm", by_descriptor("shm"), flat_nodes(8)},
                           Setup{"hierarchical shm", by_descriptor("hierarchical"), {0, 0, 0, 1, 1, 1}}}) {
      const std::vector<bool> agree = ranks_agree(s.name, s.fn, s.nodes, shm);
      for (std::size_t k = 0; k < agree.size(); ++k) {
        EXPECT_TRUE(agree[k]) << s.name << " n=" << s.nodes.size() << " slot=" << shm->slot_bytes << " case " << k
                              << ": ranks differ";
      }
    }
  }
  // The data must be order-sensitive for this to mean anything: a schedule
  // that folds in a different order per rank has to be caught.
  const std::vector<bool> naive = ranks_agree("naive", naive_rotated_allreduce, flat_nodes(5));
  EXPECT_EQ(std::count(naive.begin(), naive.end(), true), 0) << "inputs too tame to detect disagreement";
}

TEST(AllReduce, RejectsAvgAndBadDtype) {
  for (const char* name : {"ring", "tree", "rabenseifner"}) {
    testing::run_ranks(2, [&](detail::Transport& t, int) {
      ScratchPool pool;
      Group g = make_group(t, flat_nodes(2), 1, pool);
      float x[4] = {}, y[4] = {};
      CollArgs a;
      a.sendbuf = x;
      a.recvbuf = y;
      a.count = 4;
      a.op = ReduceOp::avg;
      EXPECT_EQ(algo(name).run(g, a).code(), Result::invalid_argument) << name;
      a.op = ReduceOp::sum;
      a.dt = static_cast<DataType>(3);
      EXPECT_EQ(algo(name).run(g, a).code(), Result::invalid_argument) << name;
    });
  }
}

// ---- rendezvous semantics ----------------------------------------------------

// The thread transport completes a send as soon as it is posted (eager).
// Real transports complete large sends only once the receiver has matched
// them (UCX rendezvous), which is where pipelined schedules deadlock if a
// rank waits for a send before posting a receive its peer needs. This
// decorator holds every send open until the matching receive has completed
// and the receiving rank has been in wait() since (its "progress"), so such
// a schedule times out here instead of passing.
struct RendezvousBoard {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::tuple<int, int, std::uint64_t>, std::deque<detail::Op*>> open_sends;  // src, dst, tag
};

class RendezvousTransport final : public detail::Transport {
 public:
  RendezvousTransport(detail::Transport& inner, RendezvousBoard& board) : inner_(inner), board_(board) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const char* name() const override { return "threads+rendezvous"; }

  Status post_send(int peer, std::uint64_t tag, const void* buf, std::size_t bytes, detail::Op* op,
                   Traffic traffic) override {
    std::lock_guard lk(board_.mu);
    Status st = inner_.post_send(peer, tag, buf, bytes, op, traffic);
    if (!st.ok()) return st;
    op->done = false;  // until the receiver has taken it
    op->handle = op;
    board_.open_sends[{rank(), peer, tag}].push_back(op);
    return {};
  }
  Status post_recv(int peer, std::uint64_t tag, void* buf, std::size_t bytes, detail::Op* op,
                   Traffic traffic) override {
    Status st = inner_.post_recv(peer, tag, buf, bytes, op, traffic);
    if (st.ok()) recvs_.push_back({op, peer, tag});
    return st;
  }
  Status wait(std::span<detail::Op* const> ops, detail::Clock::time_point deadline) override {
    for (;;) {
      release_completed_receives();
      std::unique_lock lk(board_.mu);
      bool all = true;
      for (detail::Op* op : ops) {
        // A receive counts as done only once released: the inner transport
        // may finish it at any moment, and returning without releasing its
        // send would leave the sender waiting for a rank that has moved on.
        if (std::any_of(recvs_.begin(), recvs_.end(), [op](const Recv& r) { return r.op == op; })) {
          all = false;
          continue;
        }
        if (op->done && !op->status.ok()) return op->status;
        all = all && op->done;
      }
      if (all) return {};
      if (detail::Clock::now() > deadline) return {Result::timeout, "rendezvous: timed out"};
      board_.cv.wait_for(lk, std::chrono::microseconds(200));
    }
  }
  void cancel(detail::Op* op) override {
    inner_.cancel(op);
    std::erase_if(recvs_, [op](const Recv& r) { return r.op == op; });
    std::lock_guard lk(board_.mu);
    for (auto& [key, q] : board_.open_sends) std::erase(q, op);
  }
  void fail(const Status& why) override { inner_.fail(why); }

 private:
  struct Recv {
    detail::Op* op;
    int peer;
    std::uint64_t tag;
  };
  // Completes the sends behind every receive of this rank that the inner
  // transport has finished (checked with an already-passed deadline).
  void release_completed_receives() {
    for (auto it = recvs_.begin(); it != recvs_.end();) {
      detail::Op* op = it->op;
      if (inner_.wait(std::span<detail::Op* const>(&op, 1), detail::Clock::now()).code() == Result::timeout) {
        ++it;
        continue;
      }
      std::lock_guard lk(board_.mu);
      auto& q = board_.open_sends[{it->peer, rank(), it->tag}];
      if (!q.empty()) {
        q.front()->done = true;
        q.front()->handle = nullptr;
        q.pop_front();
      }
      board_.cv.notify_all();
      it = recvs_.erase(it);
    }
  }

  detail::Transport& inner_;
  RendezvousBoard& board_;
  std::vector<Recv> recvs_;
};

TEST(AllReduce, NoDeadlockWithRendezvousSends) {
  struct Setup {
    std::string name;
    RunFn fn;
    std::vector<int> nodes;
  };
  std::vector<Setup> setups;
  for (const char* name : {"ring", "tree", "rabenseifner"}) {
    for (int n : {2, 3, 5, 8}) setups.push_back({name, by_descriptor(name), flat_nodes(n)});
  }
  for (int n : {3, 8}) {
    setups.push_back({"ring slice=256",
                      [](Group& g, const CollArgs& a) { return coll::allreduce_impl::ring_allreduce(g, a, 256); },
                      flat_nodes(n)});
    setups.push_back({"tree chunk=256",
                      [](Group& g, const CollArgs& a) { return coll::allreduce_impl::tree_allreduce(g, a, 256); },
                      flat_nodes(n)});
  }
  setups.push_back({"hierarchical slice=256",
                    [](Group& g, const CollArgs& a) { return coll::allreduce_impl::hierarchical_allreduce(g, a, 256); },
                    {0, 0, 0, 1, 1, 1}});
  const std::vector<Case> cases = {{DataType::f32, ReduceOp::sum, 4099, false},
                                   {DataType::i32, ReduceOp::max, 4099, true},
                                   {DataType::u8, ReduceOp::prod, 7, false}};
  // The decorator must catch the classic head-to-head blocking send.
  {
    RendezvousBoard board;
    testing::run_ranks(2, [&](detail::Transport& t, int rank) {
      RendezvousTransport rt(t, board);
      ScratchPool pool;
      Group g = make_group(rt, flat_nodes(2), 1, pool, 0.3);
      int out = rank, in = -1;
      Status st = g.send(1 - rank, 0, &out, sizeof out);
      if (st.ok()) st = g.recv(1 - rank, 0, &in, sizeof in);
      EXPECT_EQ(st.code(), Result::timeout) << "send-send-recv-recv must deadlock under rendezvous";
    });
  }
  for (const Setup& s : setups) {
    RendezvousBoard board;
    const RunFn via_rendezvous = [&](Group& g, const CollArgs& a) { return s.fn(g, a); };
    const int n = static_cast<int>(s.nodes.size());
    testing::run_ranks(n, [&](detail::Transport& t, int rank) {
      RendezvousTransport rt(t, board);
      ScratchPool pool;
      for (std::size_t k = 0; k < cases.size(); ++k) {
        const Case& c = cases[k];
        const std::size_t es = dtype_size(c.dt);
        std::vector<std::byte> send(c.count * es), recv(c.count * es), expect(c.count * es);
        for (std::size_t i = 0; i < c.count; ++i) {
          store(send.data() + i * es, c.dt, input_value(rank, i, c.op, c.dt));
          store(expect.data() + i * es, c.dt, expected_value(n, i, c.op, c.dt));
        }
        if (c.in_place) recv = send;
        CollArgs a;
        a.sendbuf = c.in_place ? recv.data() : send.data();
        a.recvbuf = recv.data();
        a.count = c.count;
        a.dt = c.dt;
        a.op = c.op;
        Group g = make_group(rt, s.nodes, k + 1, pool, 10.0);
        const Status st = via_rendezvous(g, a);
        ASSERT_TRUE(st.ok()) << describe(s.name, n, c) << " rank " << rank << ": " << st.to_string();
        EXPECT_TRUE(recv == expect) << describe(s.name, n, c) << " rank " << rank;
      }
    });
  }
}

// ---- tuner ------------------------------------------------------------------

TEST(AllReduceTuner, ReturnsASupportedAlgorithmForEveryKindAndSize) {
  auto fabric = std::make_shared<testing::ThreadFabric>(16);
  testing::ThreadTransport t(fabric, 0);
  ScratchPool pool;
  std::vector<std::vector<int>> layouts;
  for (int n = 1; n <= 16; ++n) {
    layouts.push_back(flat_nodes(n));
    std::vector<int> two(static_cast<std::size_t>(n)), uneven(static_cast<std::size_t>(n), 0);
    for (int i = 0; i < n; ++i) two[static_cast<std::size_t>(i)] = i % 2;
    uneven.back() = 1;
    layouts.push_back(two);
    layouts.push_back(uneven);
  }
  const std::size_t counts[] = {0, 1, 3, 100, 1000, 4096, 100000, 1 << 20, std::size_t{1} << 26};
  for (const auto& nodes : layouts) {
    Group g = make_group(t, nodes, 1, pool);
    const std::vector<std::size_t> per_peer(nodes.size(), 10), displs(nodes.size(), 0);
    for (int k = 0; k < coll::kNumCollKinds; ++k) {
      for (std::size_t count : counts) {
        for (DataType dt : {DataType::i8, DataType::f32, DataType::f64}) {
          CollArgs a;
          a.kind = static_cast<CollKind>(k);
          a.count = count;
          a.dt = dt;
          a.send_counts = a.recv_counts = per_peer;
          a.send_displs = a.recv_displs = displs;
          const AlgorithmDesc* d = coll::tune(g, a);
          ASSERT_NE(d, nullptr) << coll::coll_name(a.kind) << " n=" << nodes.size() << " count=" << count;
          EXPECT_EQ(d->kind, a.kind);
          EXPECT_TRUE(d->supports == nullptr || d->supports(g, a))
              << coll::coll_name(a.kind) << " picked unsupported " << d->name;
        }
      }
    }
  }
}

TEST(AllReduceTuner, AllReduceChoicesFollowSizeAndTopology) {
  auto fabric = std::make_shared<testing::ThreadFabric>(8);
  testing::ThreadTransport t(fabric, 0);
  ScratchPool pool;
  auto pick = [&](const std::vector<int>& nodes, std::size_t bytes) {
    CollArgs a;
    a.count = bytes / 4;
    a.dt = DataType::f32;
    return std::string(coll::tune(make_group(t, nodes, 1, pool), a)->name);
  };
  for (int n = 2; n <= 8; ++n) {
    const std::string small = pick(flat_nodes(n), 64);
    EXPECT_TRUE(small == "tree" || small == "rabenseifner") << n << ": " << small;
    EXPECT_EQ(pick(flat_nodes(n), 64 << 20), "ring") << n;
  }
  EXPECT_EQ(pick({0, 0, 0, 0, 1, 1, 1, 1}, 64 << 20), "hierarchical");
  EXPECT_EQ(pick({0, 1, 0, 1}, 64 << 20), "hierarchical");
  EXPECT_NE(pick({0, 0, 0, 1}, 64 << 20), "hierarchical");  // not uniform
  EXPECT_NE(pick({0, 1, 2, 3}, 64 << 20), "hierarchical");  // one rank per node: nothing to save
}

// Broadcasts and reduces of a group that shares a window take the window
// at every size, whether or not its ranks outnumber the cores; without a
// window, the transport's binomial tree up to 256 KiB and the chain above.
TEST(AllReduceTuner, BroadcastAndReduceTakeTheWindowOnOneNode) {
  auto fabric = std::make_shared<testing::ThreadFabric>(4);
  testing::ThreadTransport t(fabric, 0);
  ScratchPool pool;
  for (int n : {2, 3, 4}) {
    std::shared_ptr<detail::ShmSegment> seg;
    const detail::ShmWindow::Geometry geo{n, 4096, 3, 0, detail::ShmWindow::kDirectOff, 0, 0, 0};
    ASSERT_TRUE(detail::ShmWindow::create_anonymous(geo, &seg).ok());
    std::vector<int> members(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) members[static_cast<std::size_t>(i)] = i;
    for (const CollKind kind : {CollKind::broadcast, CollKind::reduce}) {
      const std::string name(coll::coll_name(kind));
      auto pick = [&](const Group& g, std::size_t bytes) {
        CollArgs a;
        a.kind = kind;
        a.count = bytes / 4;
        a.dt = DataType::f32;
        return std::string(coll::tune(g, a)->name);
      };
      const Group bare = make_group(t, flat_nodes(n), 1, pool);
      EXPECT_EQ(pick(bare, 4), "binomial") << name << " n=" << n;
      EXPECT_EQ(pick(bare, 256 << 10), "binomial") << name << " n=" << n;
      EXPECT_EQ(pick(bare, 1 << 20), "chain") << name << " n=" << n;
      for (const bool crowded : {false, true}) {
        detail::ShmWindow w(seg, members, 0, crowded);
        Group g = make_group(t, flat_nodes(n), 1, pool);
        g.attach_shm(&w);
        ASSERT_EQ(g.shm(), &w);
        const std::string at = name + " n=" + std::to_string(n) + (crowded ? " crowded" : "");
        for (const std::size_t bytes : {std::size_t{4}, std::size_t{8} << 10, std::size_t{16} << 10,
                                        std::size_t{64} << 20}) {
          EXPECT_EQ(pick(g, bytes), "shm") << at << " bytes=" << bytes;
        }
      }
    }
  }
}

}  // namespace
}  // namespace cclz
