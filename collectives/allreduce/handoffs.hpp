// How many hand-offs the node-local all-reduce (allreduce/shm.cpp) spends
// on a call that fits one slot: one (every rank stages its whole buffer and
// reduces all n of them) or two (each rank reduces a 1/n share, then copies
// the other shares' results). One hand-off reads n-1 whole buffers per rank,
// two read 2(n-1)/n of one but wait for the peers twice.
//
// Which is faster depends on what a cross-core hand-off costs, and on a
// virtual machine that changes with where the host places the vCPUs. On 2
// bound ranks of this project's test host a 16 KB call took 2.72 us (one)
// against 1.57 us (two) in one period and 4.34-4.67 against 5.35-5.77 us in
// another (docs/performance-log.md). So calls between kOneUpTo and kChooseUpTo
// bytes per peer are timed on local rank 0, per size band, and each band
// runs the protocol whose recent times are lower, trying the other one
// every kExplore-th call to notice when the machine changes.
//
// Both protocols apply the same kernel to the same operands in the same
// order: the choice changes the time of a call, never its result.
//
// Every rank must run the same protocol for a call. Rank 0 sends its
// choices for every band with each timed call (ShmWindow's call hint); every
// rank reads them after its first wait in that call and uses them from its
// next one. This class is the bookkeeping; it does not communicate.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>

namespace cclz::coll::allreduce_impl {

class HandoffChooser {
 public:
  // Bytes per peer (the call's bytes times n-1): at or below kOneUpTo always
  // one hand-off, above kChooseUpTo always two, in between by measurement.
  static constexpr std::size_t kOneUpTo = std::size_t{2} << 10;
  static constexpr std::size_t kChooseUpTo = std::size_t{64} << 10;
  // Bands (2,4], (4,8], (8,16], (16,32], (32,64] KiB per peer.
  static constexpr int kBands = 5;
  // A protocol's time in a band: the first quartile of its last kSamples
  // calls (a low quantile, because a preempted or disturbed call is only
  // ever slower). A call that runs a different protocol from the band's
  // previous call is not counted: it finds the slots as the other protocol
  // left them, and on 2 ranks a lone one-hand-off call among two-hand-off
  // ones timed faster than a run of them, which made the chooser switch
  // back and forth. So the protocol not in use is tried in bursts of kBurst
  // calls every kExplore calls. The times are compared every kDecide calls.
  static constexpr int kSamples = 16;
  static constexpr unsigned kExplore = 128;
  static constexpr unsigned kBurst = 4;
  static constexpr unsigned kDecide = 32;

  // The band of a call moving `peer_bytes` bytes per peer; -1 outside
  // (kOneUpTo, kChooseUpTo].
  static int band(std::size_t peer_bytes) noexcept {
    if (peer_bytes <= kOneUpTo || peer_bytes > kChooseUpTo) return -1;
    const int b = std::bit_width((peer_bytes - 1) / kOneUpTo) - 1;  // (2,4] KiB -> 0
    return std::min(b, kBands - 1);
  }

  // The protocol (1 or 2 hand-offs) calls in `band` run now.
  int handoffs(int band) const noexcept { return (in_effect_ >> band) & 1 ? 2 : 1; }

  // The choices rank 0 sends with a call, and what every rank does with
  // them once it has read them in that call.
  std::uint64_t wanted() const noexcept { return wanted_; }
  void take(std::uint64_t choices) noexcept { in_effect_ = choices & kAllBands; }

  // Rank 0: a call in `band` ran `handoffs` hand-offs in `ticks` (any
  // steady unit). Updates wanted() for that band.
  void record(int band, int handoffs, std::uint64_t ticks) noexcept {
    Band& b = bands_[static_cast<std::size_t>(band)];
    const auto p = static_cast<std::size_t>(handoffs - 1);
    if (handoffs == b.last) {
      b.samples[p][static_cast<std::size_t>(b.next[p])] = ticks;
      b.next[p] = (b.next[p] + 1) % kSamples;
      b.filled[p] = std::min(b.filled[p] + 1, kSamples);
    }
    b.last = handoffs;
    ++b.calls;
    int pick;
    if (b.filled[0] < kWarmUp || b.filled[1] < kWarmUp) {
      pick = b.filled[0] <= b.filled[1] ? 1 : 2;  // warming up: the protocol with fewer samples
    } else {
      if (b.calls % kDecide == 0) b.choice = quartile(b, 0) <= quartile(b, 1) ? 1 : 2;
      pick = (b.calls + kBurst) % kExplore < kBurst ? 3 - b.choice : b.choice;
    }
    const std::uint64_t bit = std::uint64_t{1} << band;
    wanted_ = pick == 2 ? wanted_ | bit : wanted_ & ~bit;
  }

 private:
  static constexpr int kWarmUp = 4;
  static constexpr std::uint64_t kAllBands = (std::uint64_t{1} << kBands) - 1;
  struct Band {
    std::array<std::array<std::uint64_t, kSamples>, 2> samples{};
    std::array<int, 2> filled{}, next{};
    unsigned calls = 0;
    int choice = 2;
    int last = 0;  // the protocol of the band's previous call
  };
  static std::uint64_t quartile(const Band& b, std::size_t p) noexcept {
    std::array<std::uint64_t, kSamples> s = b.samples[p];
    const auto q = s.begin() + b.filled[p] / 4;
    std::nth_element(s.begin(), q, s.begin() + b.filled[p]);
    return *q;
  }

  // Two hand-offs everywhere until measured: the faster protocol on this
  // project's test host in its quicker periods.
  std::uint64_t in_effect_ = kAllBands, wanted_ = kAllBands;
  std::array<Band, kBands> bands_{};
};

}  // namespace cclz::coll::allreduce_impl
