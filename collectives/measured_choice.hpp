// Rank 0's bookkeeping for a choice between two ways of running a
// node-local call that give the same bytes but whose speeds depend on the
// machine, and on a virtual machine can change while a job runs: how
// streamed calls write their slots (slot_stores.hpp), and whether heap
// buffers cross between processes through the kernel's cross-memory
// attach or through the slots (shm_direct.hpp). Calls are timed per band
// (collective, in place or not, size within a factor of 2) and each band
// runs the way whose recent times are lower. It does not communicate: the
// caller makes every rank of a call run the way rank 0 picked.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <map>

namespace cclz::coll::shm {

// `Choice`: an enum whose two values are 0 (tried first) and 1.
template <class Choice>
class MeasuredChoice {
 public:
  // A way's time in a band is the least of its last kKeep calls made in
  // the band's last kFresh calls (a low one: a disturbed call is only ever
  // slower), once there are kMin of them; a way with fewer is run until it
  // has kMin, so the way not in use is tried again for kMin calls in every
  // kFresh. kStrikes calls in a row of the same way that each take more
  // than kJump times its time mean the machine may have changed: every
  // other time is dropped, so the slow calls stand for their way and the
  // other is measured again. One slow call alone is more often the host
  // taking the core away for a moment (16 MB all-gathers on the test host:
  // one call in 150-450 took 2-5x its time); when it dropped the times, the
  // kMin calls of the other way it brought (the slot stores, 1.5-2x slower)
  // cost a 20-call benchmark 5-10%.
  static constexpr int kKeep = 3;
  static constexpr int kMin = 2;
  static constexpr int kStrikes = 2;
  static constexpr std::uint64_t kFresh = 64;
  static constexpr double kJump = 1.5;
  static_assert(kStrikes >= 1 && kStrikes <= kKeep, "the strikes are kept as the way's times");

  // A band: the collective (CallSig's shape, low byte), in place or not,
  // and the bytes' power of two.
  static std::uint32_t band(std::uint64_t kind, bool in_place, std::uint64_t bytes) noexcept {
    const auto log2 = static_cast<unsigned>(std::bit_width(bytes | 1) - 1);
    return static_cast<std::uint32_t>((kind & 0xff) << 8 | (in_place ? 0x80u : 0u) | log2);
  }

  // The way the next call in `band` should run: one with fewer than kMin
  // fresh times first (way 0 before way 1), else the faster. *measuring,
  // if given, says which: true when the way was picked to be measured.
  // `in_flight`, if given, is the way of a call that runs before that one
  // and has not been recorded yet: it counts towards its way's kMin (a
  // caller that picks one call ahead; shm_direct.hpp).
  Choice pick(std::uint32_t band, bool* measuring = nullptr, const Choice* in_flight = nullptr) {
    const Band& b = bands_[band];
    Fresh w0 = fresh(b, 0), w1 = fresh(b, 1);
    if (in_flight != nullptr) ++(static_cast<std::size_t>(*in_flight) == 0 ? w0 : w1).count;
    const bool short0 = w0.count < kMin, short1 = w1.count < kMin;
    if (measuring != nullptr) *measuring = short0 || short1;
    if (short0) return Choice{0};
    if (short1) return Choice{1};
    return w1.least < w0.least ? Choice{1} : Choice{0};
  }

  // A call in `band` ran `choice` in `cost` (time per byte, any steady unit).
  void record(std::uint32_t band, Choice choice, double cost) {
    Band& b = bands_[band];
    ++b.calls;
    const auto way = static_cast<std::size_t>(choice);
    auto& mine = b.times[way];
    const Fresh before = fresh(b, way);
    if (before.count >= kMin && cost > kJump * before.least) {
      b.strikes = b.strike_way == way ? b.strikes + 1 : 1;
      b.strike_way = way;
    } else {
      b.strikes = 0;
    }
    if (b.strikes == kStrikes) {
      // The earlier strikes are this band's last calls.
      for (Time& t : mine) {
        if (t.call + kStrikes <= b.calls) t = {};
      }
      for (Time& t : b.times[1 - way]) t = {};
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
    int strikes = 0;  // slow calls in a row, all of strike_way
    std::size_t strike_way = 0;
  };
  struct Fresh {
    int count = 0;
    double least = 0;
  };
  static Fresh fresh(const Band& b, std::size_t way) {
    Fresh f;
    for (const Time& t : b.times[way]) {
      if (t.call == 0 || b.calls - t.call >= kFresh) continue;
      f.least = f.count == 0 ? t.cost : std::min(f.least, t.cost);
      ++f.count;
    }
    return f;
  }

  std::map<std::uint32_t, Band> bands_;
};

}  // namespace cclz::coll::shm
