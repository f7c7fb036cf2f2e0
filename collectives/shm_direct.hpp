// The direct path of the node-local collectives: ranks read (and the
// all-reduce writes) one another's buffers in place, with no staging slot
// in between (single copy, as NCCL's registered windows and MPI's
// cross-memory attach do, but with the reduction fused into the read).
//
// A peer's buffer can be read when it is mapped here: ranks that are threads
// of one process share their address space; processes map each other's
// cclz::mem_alloc buffers (memfds, duplicated through pidfd_getfd and
// cached). Whether a call goes direct is agreed per call, on one window
// chunk (see ShmWindow): every rank writes the descriptors of its send and
// receive buffers and whether its peers can read them into its slot.
//   - A rank whose own buffers cannot be read (heap memory of a process)
//     knows the answer, staged: it marks the chunk done at once and goes
//     on. With heap buffers everywhere the agreement costs no hand-off.
//   - The others wait for every rank's mark and read every rank's bit;
//     all of them decide alike. If all can be read, each maps the peers'
//     buffers (cache hits after the first call) and, between processes, a
//     second chunk's hand-off tells every rank whether all mappings worked.
// The collective then runs on the peers' buffers and ends with fence(): a
// rank returns only after every peer is done with its buffers, since the
// caller may reuse them at once.
//
// Cost: staged calls of heap buffers about a microsecond (a published
// chunk); direct calls 2 hand-offs to agree and 1 to fence, which is why
// calls of at least ShmWindow::direct_min_bytes try it every time, smaller
// ones from direct_probe_min_bytes up only while it is taken
// (DirectHistory); then each
// byte is copied once (all-gather, all-to-all), or reduced once by its
// share's owner and copied from there into each peer's output (all-reduce),
// against two or three passes through a slot on the staged path.
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "shm_pipeline.hpp"

namespace cclz::coll::shm {

// The buffers of every rank of the window, as mapped here: sends are read,
// receive buffers read (all-gather, all-to-all) or written (all-reduce).
struct PeerBuffers {
  std::vector<const std::byte*> send;  // indexed by local rank; this rank's own too
  std::vector<std::byte*> recv;
};

// Agrees, with every rank of the window, whether this call runs direct.
// `send_bytes`/`recv_bytes` are this rank's buffer sizes. Sets *direct and,
// when true, *out. Errors: only the window's (a peer failed or the call
// disagrees), after which the communicator is poisoned as usual.
Status agree_direct(Group& g, const detail::ShmWindow::CallSig& sig, const void* send, std::size_t send_bytes,
                    const void* recv, std::size_t recv_bytes, bool* direct, PeerBuffers* out);

// Returns once every rank of the window has finished the direct call (so no
// peer reads or writes this rank's buffers any more).
Status fence(Group& g, const detail::ShmWindow::CallSig& sig, const char* name);

// Below the window's threshold, calls from this size (largest buffer) up
// try the direct path while it is being taken (DirectHistory). Measured with
// mem_alloc buffers on 2 bound ranks in both of the test host's placements
// (interleaved against the staged path): from these sizes up the direct
// path was faster in both (all-reduce 32 KB 0.46-0.64x the staged time,
// reduce-scatter and all-to-all 64 KB 0.62-0.94x, all-gather 128 KB
// 0.56-0.72x); one step below, each lost in one of them (1.12-1.26x).
constexpr std::uint64_t direct_probe_min_bytes(CollKind kind) noexcept {
  switch (kind) {
    case CollKind::all_reduce: return std::uint64_t{32} << 10;
    case CollKind::all_gather: return std::uint64_t{128} << 10;
    default: return std::uint64_t{64} << 10;
  }
}

// Whether a call below the window's threshold (but at least
// direct_probe_min_bytes) asks its peers: yes while the last agreement went
// direct, otherwise once every kRetryAfter such calls (a program may move
// to mem_alloc buffers). Every rank of the window runs the same calls and
// learns the same outcome from each agreement (a heap rank knows it is
// staged, the others read its word), so all of them decide alike without
// an exchange, and a program of heap buffers asks once per kRetryAfter.
class DirectHistory {
 public:
  static constexpr unsigned kRetryAfter = 64;
  bool try_below_threshold() noexcept {
    if (last_direct_) return true;
    if (++skipped_ < kRetryAfter) return false;
    skipped_ = 0;
    return true;
  }
  void record(bool direct) noexcept {
    last_direct_ = direct;
    skipped_ = 0;
  }

 private:
  bool last_direct_ = true;
  unsigned skipped_ = 0;
};

// The direct path of one call, for the collectives' run(): when the call's
// largest buffer is at least the window's threshold, or in the probing band
// below it as DirectHistory says (the same answer on every rank), and the
// ranks agree, runs direct(sig, pb) (returning a Status or nothing) on the
// peers' buffers, then the fence, and sets *ran.
// `send_bytes`/`recv_bytes`: the sizes of this rank's buffers that peers
// use (0: not used).
template <class Direct>
Status run_if_direct(Group& g, const CollArgs& a, std::size_t largest, std::size_t send_bytes,
                     std::size_t recv_bytes, bool* ran, Direct&& direct) {
  *ran = false;
  detail::ShmWindow& w = *g.shm();
  const std::uint64_t bytes = largest, threshold = w.direct_min_bytes();
  if (threshold == detail::ShmWindow::kDirectOff || bytes < std::min(threshold, direct_probe_min_bytes(a.kind))) {
    return {};
  }
  DirectHistory& history = w.local_state<DirectHistory>();
  if (bytes < threshold && !history.try_below_threshold()) return {};
  const auto sig = call_sig(g, a, a.count);
  PeerBuffers pb;
  w.count_direct_try();
  Status agreed = agree_direct(g, sig, a.sendbuf, send_bytes, a.recvbuf, recv_bytes, ran, &pb);
  if (!agreed.ok()) return agreed;
  history.record(*ran);
  if (!*ran) return {};
  if constexpr (std::is_void_v<decltype(direct(sig, pb))>) {
    direct(sig, pb);  // copies and reductions that cannot fail
  } else if (Status st = direct(sig, pb); !st.ok()) {
    return st;
  }
  return fence(g, sig, coll_name(a.kind));
}

}  // namespace cclz::coll::shm
