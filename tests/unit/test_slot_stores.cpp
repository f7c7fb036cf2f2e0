// The slot-store chooser (collectives/slot_stores.hpp) on simulated
// machines: each call runs the stores it picks and is recorded with the
// time the machine gives them.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "slot_stores.hpp"

namespace cclz {
namespace {

using coll::shm::SlotStoreChooser;
using coll::shm::SlotStores;

struct SimulatedBand {
  SlotStoreChooser c;
  std::uint32_t band = SlotStoreChooser::band(1, false, std::uint64_t{16} << 20);
  std::array<int, 2> ran{};
  template <class Cost>
  void run(int calls, Cost cost) {
    ran = {};
    for (int k = 0; k < calls; ++k) {
      const SlotStores s = c.pick(band);
      c.record(band, s, cost(s));
      ++ran[static_cast<std::size_t>(s)];
    }
  }
  SlotStores next() { return c.pick(band); }
};

double memory_faster(SlotStores s) { return s == SlotStores::memory ? 1.0 : 2.0; }
double cache_faster(SlotStores s) { return s == SlotStores::cache ? 1.0 : 2.0; }

TEST(SlotStoreChooser, Bands) {
  const auto band = SlotStoreChooser::band;
  EXPECT_EQ(band(3, false, 1 << 24), band(3, false, (1 << 25) - 1));
  EXPECT_NE(band(3, false, 1 << 24), band(3, false, 1 << 25));
  EXPECT_NE(band(3, false, 1 << 24), band(3, true, 1 << 24));
  EXPECT_NE(band(3, false, 1 << 24), band(4, false, 1 << 24));
  // Only the shape's low byte (the collective) counts, not its dtype or op.
  EXPECT_EQ(band(3, false, 1 << 24), band(3 | 0x0502 << 8, false, 1 << 24));
  EXPECT_EQ(band(3, false, 0), band(3, false, 1));
  EXPECT_NE(band(3, false, ~std::uint64_t{0}), band(3, false, 1));
}

TEST(SlotStoreChooser, MeasuresBothThenRunsTheFaster) {
  SimulatedBand sim;
  // Warm-up: kMin calls of ordinary stores, then kMin streamed.
  std::array<SlotStores, 4> first{};
  for (SlotStores& s : first) {
    s = sim.next();
    sim.c.record(sim.band, s, memory_faster(s));
  }
  EXPECT_EQ(first, (std::array{SlotStores::cache, SlotStores::cache, SlotStores::memory, SlotStores::memory}));
  EXPECT_EQ(sim.next(), SlotStores::memory);
  // Then the streamed stores, and the others for kMin calls in about every
  // kFresh.
  const int calls = 20 * static_cast<int>(SlotStoreChooser::kFresh);
  sim.run(calls, memory_faster);
  EXPECT_GE(sim.ran[0], 18 * SlotStoreChooser::kMin);
  EXPECT_LE(sim.ran[0], 21 * SlotStoreChooser::kMin);
  // Another band is measured on its own.
  EXPECT_EQ(sim.c.pick(SlotStoreChooser::band(1, true, std::uint64_t{16} << 20)), SlotStores::cache);
}

// pick() says when it picks a way to measure it: the warm-up, and the
// kMin calls of the way not in use in every kFresh. The heap path's
// chooser does not time staged calls while their stores are measured.
TEST(SlotStoreChooser, SaysWhenItMeasures) {
  SimulatedBand sim;
  std::vector<bool> measuring;
  const int calls = 3 * static_cast<int>(SlotStoreChooser::kFresh);
  for (int k = 0; k < calls; ++k) {
    bool m = false;
    const SlotStores s = sim.c.pick(sim.band, &m);
    if (!m) {
      EXPECT_EQ(s, SlotStores::memory) << "call " << k << ": a settled pick is the faster way";
    }
    measuring.push_back(m);
    sim.c.record(sim.band, s, memory_faster(s));
  }
  const int warm_up = 2 * SlotStoreChooser::kMin;
  for (int k = 0; k < warm_up; ++k) EXPECT_TRUE(measuring[static_cast<std::size_t>(k)]) << "call " << k;
  EXPECT_FALSE(measuring[static_cast<std::size_t>(warm_up)]);
  const auto measured = std::count(measuring.begin(), measuring.end(), true);
  // The warm-up, then kMin calls in about every kFresh.
  EXPECT_GE(measured, warm_up + 2 * SlotStoreChooser::kMin);
  EXPECT_LE(measured, warm_up + 3 * SlotStoreChooser::kMin);
}

// A caller that picks one call ahead (the heap path's plan) passes the way
// of the call running meanwhile, not yet recorded: it counts towards its
// way's kMin, so each way's trial is kMin calls, not one more, and the
// picks settle on the faster way as soon as both have kMin calls.
TEST(SlotStoreChooser, PickingOneCallAhead) {
  SimulatedBand sim;
  constexpr int kMin = SlotStoreChooser::kMin;
  SlotStores running = SlotStores::memory;  // the first call's way, before any pick
  std::vector<SlotStores> ran;
  for (int k = 0; k < 2 * kMin + 4; ++k) {
    const SlotStores next = sim.c.pick(sim.band, nullptr, &running);
    sim.c.record(sim.band, running, cache_faster(running));
    ran.push_back(running);
    running = next;
  }
  // The first call (memory), kMin of cache, then memory until it has kMin
  // calls, then the faster: cache.
  std::vector<SlotStores> want{SlotStores::memory};
  for (int k = 0; k < kMin; ++k) want.push_back(SlotStores::cache);
  for (int k = 1; k < kMin; ++k) want.push_back(SlotStores::memory);
  while (want.size() < ran.size()) want.push_back(SlotStores::cache);
  EXPECT_EQ(ran, want);
}

TEST(SlotStoreChooser, FollowsTheMachineWhenItChanges) {
  SimulatedBand sim;
  sim.run(100, cache_faster);
  EXPECT_GT(sim.ran[0], 90);
  // The ordinary stores become 3x slower, the streamed ones faster: the
  // second slow call in a row drops the other times, the streamed stores
  // are measured again (kMin calls), and they run from then on.
  auto changed = [](SlotStores s) { return s == SlotStores::cache ? 3.0 : 1.5; };
  sim.run(SlotStoreChooser::kStrikes + SlotStoreChooser::kMin, changed);
  EXPECT_EQ(sim.ran[1], SlotStoreChooser::kMin);
  EXPECT_EQ(sim.next(), SlotStores::memory);
  sim.run(100, changed);
  EXPECT_GE(sim.ran[1], 96);
  // And back, the streamed stores 2x slower.
  sim.run(SlotStoreChooser::kStrikes + SlotStoreChooser::kMin,
          [](SlotStores s) { return s == SlotStores::cache ? 1.0 : 3.0; });
  EXPECT_EQ(sim.next(), SlotStores::cache);
}

TEST(SlotStoreChooser, MeasuresAgainWhenEverythingSlowsDown) {
  SimulatedBand sim;
  sim.run(100, memory_faster);
  // Both stores 3x slower: after the strikes the ordinary stores are
  // measured again, lose, and the streamed ones keep running at their new
  // time (the slow calls stand for it, so nothing jumps again).
  auto slower = [](SlotStores s) { return 3.0 * memory_faster(s); };
  sim.run(SlotStoreChooser::kStrikes + SlotStoreChooser::kMin, slower);
  EXPECT_EQ(sim.ran[0], SlotStoreChooser::kMin);
  sim.run(30, slower);
  EXPECT_EQ(sim.ran[0], 0);
}

// A call 3x its usual time (the host took the core for a moment) makes no
// difference to what runs after it: the same calls as a band that was not
// disturbed.
TEST(SlotStoreChooser, OneSlowCallMeasuresNothingAgain) {
  for (SlotStores usual : {SlotStores::cache, SlotStores::memory}) {
    auto machine = usual == SlotStores::cache ? cache_faster : memory_faster;
    SimulatedBand quiet, disturbed;
    quiet.run(100, machine);
    disturbed.run(100, machine);
    quiet.run(20, machine);
    int call = 0;
    disturbed.run(20, [&](SlotStores s) { return (call++ == 3 ? 3.0 : 1.0) * machine(s); });
    EXPECT_EQ(disturbed.ran, quiet.ran);
    EXPECT_EQ(disturbed.next(), usual);
  }
}

TEST(SlotStoreChooser, OneDisturbedCallDoesNotMoveIt) {
  SimulatedBand sim;
  sim.run(100, memory_faster);
  bool disturbed = false;
  // One streamed call takes 1.6x as long (a preemption, say): it counts as
  // one time of kMin, and the least of the next ones is the usual 1.0.
  sim.run(10, [&](SlotStores s) {
    if (s == SlotStores::memory && !disturbed) {
      disturbed = true;
      return 1.6;
    }
    return memory_faster(s);
  });
  EXPECT_LE(sim.ran[0], SlotStoreChooser::kMin);
  EXPECT_EQ(sim.next(), SlotStores::memory);
}

}  // namespace
}  // namespace cclz
