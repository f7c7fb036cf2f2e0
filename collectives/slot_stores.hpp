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
// first wait, for the rest of that call and their next ones.
#pragma once

#include "measured_choice.hpp"

namespace cclz::coll::shm {

enum class SlotStores : int { cache = 0, memory = 1 };

// Rank 0's timing of the two, per band (measured_choice.hpp): ordinary
// stores are tried first.
using SlotStoreChooser = MeasuredChoice<SlotStores>;

// What a rank keeps in its window (ShmWindow::local_state) across calls.
struct SlotStoreState {
  SlotStores in_effect = SlotStores::cache;  // ranks other than 0: rank 0's latest choice
  SlotStoreChooser chooser;                  // rank 0
};

}  // namespace cclz::coll::shm
