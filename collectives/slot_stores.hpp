// How a streamed node-local call (one whose outputs bypass the cache; see
// shm::stream_outputs) writes what its peers read from its slots: with
// ordinary stores, so that the peers read the lines out of this core's
// cache, or with streaming stores, so that they go to memory and the peers
// read them from there.
//
// Which is faster depends on how the cores reach each other, and on a
// virtual machine that changes with where the host places the vCPUs. In a
// 2-thread model of the pipelines on this project's test host, while two
// copiers shared 62 GB/s (the vCPUs sharing a last-level cache), a 16 MB
// all-gather took 0.84 ms through the cache and 1.31 ms through memory;
// while each core had its own path to memory (two copiers at 115 GB/s),
// 1.84 ms against 0.72, and a 64 MB all-reduce 11.4 ms against 4.9
// (docs/performance.md). The host moved between the two within seconds.
// So local rank 0 times its streamed calls per band (collective, in place
// or not, size within a factor of 2), and each band runs the stores whose
// recent times are lower.
//
// The stores only change where a chunk passes on its way, never the bytes:
// ranks may even disagree on them for a call. Rank 0 sends its choice with
// each call (ShmWindow's call hint) and the others take it after their
// first wait, for the rest of that call and their next ones. This class is
// rank 0's bookkeeping; it does not communicate.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <map>

namespace cclz::coll::shm {

enum class SlotStores : int { cache = 0, memory = 1 };

class SlotStoreChooser {
 public:
  // A stores' time in a band is the least of their last kKeep calls made
  // in the band's last kFresh calls (a low one: a disturbed call is only
  // ever slower), once there are kMin of them; stores with fewer are run
  // until they have kMin, so the stores not in use are tried again for kMin
  // calls in every kFresh. kStrikes calls in a row of the same stores that
  // each take more than kJump times their time mean the machine may have
  // changed: every other time is dropped, so the slow calls stand for their
  // stores and the other stores are measured again. One slow call alone is
  // more often the host taking the core away for a moment (16 MB
  // all-gathers on the test host: one call in 150-450 took 2-5x its time);
  // when it dropped the times, the kMin calls of the other stores it brought
  // (1.5-2x slower) cost a 20-call benchmark 5-10%.
  static constexpr int kKeep = 3;
  static constexpr int kMin = 2;
  static constexpr int kStrikes = 2;
  static constexpr std::uint64_t kFresh = 64;
  static constexpr double kJump = 1.5;
  static_assert(kStrikes >= 1 && kStrikes <= kKeep, "the strikes are kept as the stores' times");

  // A band: the collective (CallSig's shape, low byte), in place or not,
  // and the bytes' power of two.
  static std::uint32_t band(std::uint64_t kind, bool in_place, std::uint64_t bytes) noexcept {
    const auto log2 = static_cast<unsigned>(std::bit_width(bytes | 1) - 1);
    return static_cast<std::uint32_t>((kind & 0xff) << 8 | (in_place ? 0x80u : 0u) | log2);
  }

  // The stores the next call in `band` should run: ones with fewer than
  // kMin fresh times first (ordinary stores before streaming ones), else the
  // faster.
  SlotStores pick(std::uint32_t band) {
    const Band& b = bands_[band];
    const Fresh c = fresh(b, SlotStores::cache), m = fresh(b, SlotStores::memory);
    if (c.count < kMin) return SlotStores::cache;
    if (m.count < kMin) return SlotStores::memory;
    return m.least < c.least ? SlotStores::memory : SlotStores::cache;
  }

  // A call in `band` ran `stores` in `cost` (time per byte, any steady unit).
  void record(std::uint32_t band, SlotStores stores, double cost) {
    Band& b = bands_[band];
    ++b.calls;
    auto& mine = b.times[static_cast<std::size_t>(stores)];
    const Fresh before = fresh(b, stores);
    if (before.count >= kMin && cost > kJump * before.least) {
      b.strikes = b.strike_stores == stores ? b.strikes + 1 : 1;
      b.strike_stores = stores;
    } else {
      b.strikes = 0;
    }
    if (b.strikes == kStrikes) {
      // The earlier strikes are this band's last calls.
      for (Time& t : mine) {
        if (t.call + kStrikes <= b.calls) t = {};
      }
      for (Time& t : b.times[1 - static_cast<std::size_t>(stores)]) t = {};
      b.strikes = 0;
    }
    // Replace the oldest.
    *std::min_element(mine.begin(), mine.end(), [](const Time& x, const Time& y) { return x.call < y.call; }) =
        Time{b.calls, cost};
  }

 private:
  struct Time {
    std::uint64_t call = 0;  // the band's call count when it was taken; 0 = none
    double cost = 0;
  };
  struct Band {
    std::uint64_t calls = 0;
    std::array<std::array<Time, kKeep>, 2> times{};
    int strikes = 0;  // slow calls in a row, all of strike_stores
    SlotStores strike_stores = SlotStores::cache;
  };
  struct Fresh {
    int count = 0;
    double least = 0;
  };
  static Fresh fresh(const Band& b, SlotStores stores) {
    Fresh f;
    for (const Time& t : b.times[static_cast<std::size_t>(stores)]) {
      if (t.call == 0 || b.calls - t.call >= kFresh) continue;
      f.least = f.count == 0 ? t.cost : std::min(f.least, t.cost);
      ++f.count;
    }
    return f;
  }

  std::map<std::uint32_t, Band> bands_;
};

// What a rank keeps in its window (ShmWindow::local_state) across calls.
struct SlotStoreState {
  SlotStores in_effect = SlotStores::cache;  // ranks other than 0: rank 0's latest choice
  SlotStoreChooser chooser;                  // rank 0
};

}  // namespace cclz::coll::shm
