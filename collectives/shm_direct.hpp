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
//   - Where some rank's buffers cannot be mapped (heap memory), the
//     all-reduce, all-gather, all-to-all, reduce-scatter, broadcast and reduce may
//     go through cross-memory attach instead (process_vm_readv/writev on
//     the peers' own addresses): each rank offers it for calls of
//     cma_min_bytes() and more while cma_out_of_place() (the all-reduce in
//     place at any size), and where rank 0 measures the way (HeapPath
//     below) only for the calls it picked it for; if every rank offers
//     it, a first call reads a byte of each peer's buffer and the ranks
//     confirm in one hand-off (a kernel that refuses ends this rank's
//     offers for good).
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
#include <functional>
#include <map>
#include <type_traits>
#include <vector>

#include "measured_choice.hpp"
#include "shm_pipeline.hpp"

namespace cclz::coll::shm {

// The buffers of every rank of the window: sends are read, receive buffers
// read (all-gather, all-to-all) or written (all-reduce). Mapped here, or,
// with `cma`, reached through cross-memory attach: then the other ranks'
// entries are addresses in their own processes, never to be dereferenced
// here, only passed to peer_read()/peer_write().
struct PeerBuffers {
  std::vector<const std::byte*> send;  // indexed by local rank; this rank's own too
  std::vector<std::byte*> recv;
  bool cma = false;
  std::vector<int> pid;  // with cma: each local rank's process
};

// With PeerBuffers::cma, copies n bytes from peer r's `from` (as
// PeerBuffers holds it) to `to` here, or from `from` here to peer r's `to`,
// with process_vm_readv/writev. Errors: a range the peer's process does not
// have, as invalid_usage naming rank and range.
Status peer_read(const Group& g, const PeerBuffers& pb, int r, void* to, const std::byte* from, std::size_t n);
Status peer_write(const Group& g, const PeerBuffers& pb, int r, std::byte* to, const void* from, std::size_t n);

// The sources of a reduction through cross-memory attach (all-reduce,
// reduce-scatter), in rank order: `bytes` from byte `at` of every rank's
// send buffer, this rank's own in place and each peer's read into
// `scratch` (`stride` bytes apart, stride >= bytes; grown as needed).
// Errors: peer_read's.
Status read_sources(const Group& g, const PeerBuffers& pb, std::size_t at, std::size_t bytes, std::size_t stride,
                    std::vector<std::byte>& scratch, std::vector<const void*>& srcs);

// From cma_min_bytes() up (the call's largest buffer), calls whose buffers
// cannot be mapped by every rank (heap memory of processes) go through
// cross-memory attach, for the collectives that support it: one copy in the
// kernel per byte that crosses, against two through a slot. Below it the
// staged path is as fast or faster. With a rank per core the floors were
// first set at 32-128 KiB (docs/performance-log.md, "Cross-memory attach from
// 32-128 KiB"), when staged calls still paid for their slots' first
// writes. Once those were paid at setup (touch_pages), the staged calls
// won below 512 KiB for the all-gather, all-to-all, broadcast and
// reduce-scatter in the usual state of the host (128 and 256 KiB: 1.1-2.3x
// faster than through the kernel, 1.05-1.4x faster than measuring the way
// as it was then), and below 128 KiB for the all-reduce and reduce, which
// the kernel's way beats from 128-256 KiB (AMD host: all-reduce of 32 KiB
// 6.8 against 15.1 us, 256 KiB 40.1 against 36.1; "The all-reduce and
// reduce staged under 128 KiB", "Every heap call under 512 KiB staged but
// the reductions'"). But in the host's slow periods the staged calls take
// 3-5x as long and the kernel's copy does not slow down (2 bound ranks,
// all-to-all of 32, 64, 128 and 256 KiB: 9.4, 17.5, 34 and 64 us staged
// against 5.6, 7.0, 9.6 and 15 through the kernel and MPI's 8.4-15.5), and
// on other days the kernel's way won at 128 KiB (8.4 against 10.4 us, MPI
// 8.5). Since rank 0 measures these calls without costing the staged ones
// a hand-off (HeapPathPlan), the four go through the kernel, measured,
// from 32 KiB again (where the window lets them try the direct path:
// direct_probe_min_bytes()).
// Where the node's ranks outnumber its cores, each of a direct call's three
// hand-offs may wait for the scheduler, and only the all-to-all goes
// through the kernel, from 512 KiB. The floors set for the others (1 MiB
// for the reductions, 2 MiB for the all-gather; a broadcast never) were
// measured before the slots' first writes were paid at setup; measured
// again since (3, 4 and 8 ranks on 2 cores, interleaved, 1-64 MB), the
// slots ran the all-reduce, reduce-scatter and all-gather as fast or
// faster at every size the kernel took (4 ranks: all-reduce of 1-8 MB
// 0.59-0.80x the kernel's time out of place, reduce-scatter 0.41-0.61x,
// all-gather of 2 MB 0.51-0.54x; docs/performance-log.md, "More ranks than
// cores: the slots"), while the all-to-all's results were mixed (1 MB
// 0.76-0.83x on 3 and 4 ranks, 1.33x on 8).
// The reduce stays staged up to kReduceOneHandoffMaxBytes, where its
// single hand-off (reduce/shm.cpp) beat the kernel's way on the Zen 5
// host: 2 bound ranks, median call, 128 KiB 9.2-9.3 against 14.1-15.5 us,
// 256 KiB 15.6-16.5 against 19.5-22.9 (docs/performance-log.md, "A Zen 5
// host").
constexpr std::uint64_t kReduceOneHandoffMaxBytes = std::uint64_t{256} << 10;
constexpr std::uint64_t kCmaNever = ~std::uint64_t{0};
constexpr std::uint64_t cma_min_bytes(CollKind kind, bool oversubscribed) noexcept {
  if (!oversubscribed) {
    switch (kind) {
      case CollKind::all_reduce: return std::uint64_t{128} << 10;
      case CollKind::reduce: return kReduceOneHandoffMaxBytes + 1;
      default: return std::uint64_t{32} << 10;
    }
  }
  return kind == CollKind::all_to_all ? std::uint64_t{512} << 10 : kCmaNever;
}
// Bytes reduced at a time through cross-memory attach (all-reduce,
// reduce-scatter): each peer's block is read into a buffer of this process
// and reduced there while in the cache (and the all-reduce writes the
// result on into each peer's output); large enough that the system calls
// per peer and block cost little.
constexpr std::size_t kCmaBlockBytes = std::size_t{128} << 10;
// Whether an out-of-place call goes through cross-memory attach (the
// collectives pass it to run_if_direct as allow_cma): while the node's
// buffers (every rank's input and output) come to at most 64 MiB. Beyond,
// the kernel's copy, which stores through the cache and reads every output
// line from memory first, lost to the staged path, which streams its
// outputs (2 ranks: all-gather of 256 MB 45 against 36 ms, all-reduce of 64
// MB 18.9 against 17.2; 4 ranks: all-reduce of 16 MB 11.8-14.7 against 9.9).
// Where rank 0 measures the way (HeapPath below), at any size: in the
// host's slow periods for staged calls the kernel's way wins there too
// (AMD host, 2 ranks: reduce-scatter of 64 and 256 MB staged 17.7-19.2 and
// 70-77 ms in such runs; measured, 6.2-10.0 and 26.9-48.2 ms in every run).
// In place, the all-reduce writes lines it has just read and goes on
// winning at every size.
constexpr std::uint64_t kCmaMaxNodeBytes = std::uint64_t{64} << 20;
inline bool cma_out_of_place(const Group& g, std::size_t in_bytes, std::size_t out_bytes) noexcept {
  if (g.shm()->cma_measured()) return true;
  return static_cast<std::uint64_t>(g.size()) * (in_bytes + out_bytes) <= kCmaMaxNodeBytes;
}

// Agrees, with every rank of the window, whether this call runs direct.
// `send_bytes`/`recv_bytes` are this rank's buffer sizes; `cma_ok`: the
// collective can run on PeerBuffers reached through cross-memory attach.
// Sets *direct and, when true, *out (mapped when every rank's buffers can
// be, else cma) and *chunk to the window chunk of the agreement (each rank
// publishes it at once, or once it has read its peers' words).
// `while_waiting`, if set, runs when this rank, whose buffers the peers
// cannot map, has offered cross-memory attach and is about to wait for
// their answers. Errors: only the window's (a peer failed or the call
// disagrees), after which the communicator is poisoned as usual.
Status agree_direct(Group& g, const detail::ShmWindow::CallSig& sig, const void* send, std::size_t send_bytes,
                    const void* recv, std::size_t recv_bytes, bool cma_ok, bool* direct, PeerBuffers* out,
                    std::uint64_t* chunk, const std::function<void()>& while_waiting = {});

// Returns once every rank of the window has finished the direct call (so no
// peer reads or writes this rank's buffers any more). local() runs after this
// rank has said so and before it waits for the others: work on this rank's
// own buffers that no peer waits for.
template <class Local>
Status fence(Group& g, const detail::ShmWindow::CallSig& sig, const char* name, Local&& local) {
  return run_pipeline(
      g, sig, 1, 2, [](std::size_t, std::uint64_t, int) {}, [](int) { return Deps::all(); }, name,
      [&](std::size_t, std::uint64_t, int t) {
        if (t == 0) local();
      });
}

// A direct call's copy from this rank's own input into its own output
// (all-gather, all-to-all), which no peer waits for: own(half) copies half 0
// or 1 of it (copy_own_half), and run_if_direct runs the halves inside the
// call's two hand-offs instead of before them. NoOwnCopy: none.
struct NoOwnCopy {
  void operator()(int) const noexcept {}
};
// Half 0 or 1 of a block of `bytes` from src to dst, cut on a cache line;
// streamed when the call streams its outputs.
inline void copy_own_half(void* dst, const void* src, std::size_t bytes, int half, bool stream) noexcept {
  const std::size_t cut = bytes / 2 / 64 * 64, from = half == 0 ? 0 : cut, len = half == 0 ? cut : bytes - cut;
  (stream ? copy_stream : copy)(static_cast<std::byte*>(dst) + from, static_cast<const std::byte*>(src) + from, len);
}

// Below the window's threshold, calls from this size (largest buffer) up
// try the direct path while it is being taken (DirectHistory). Measured with
// mem_alloc buffers on 2 bound ranks in both of the test host's placements
// (interleaved against the staged path): from these sizes up the direct
// path was faster in both (all-reduce 32 KB 0.46-0.64x the staged time,
// reduce-scatter 64 KB 0.62-0.94x, all-gather 128 KB 0.56-0.72x, all-to-all
// 32 KB and broadcast 16 KB 0.3-0.6x); one step below, each lost in one of
// them. Where the ranks outnumber the cores, each of the direct call's
// three hand-offs may wait for the scheduler: the all-to-all and broadcast
// then keep 64 KB (4 ranks on 2 cores, 2 rounds: the broadcast of 16 KB
// took 1.7-6.5x as long direct, the all-to-all of 32 KB 1.7x in one).
constexpr std::uint64_t direct_probe_min_bytes(CollKind kind, bool oversubscribed) noexcept {
  switch (kind) {
    case CollKind::all_reduce: return std::uint64_t{32} << 10;
    case CollKind::all_gather: return std::uint64_t{128} << 10;
    case CollKind::all_to_all: return std::uint64_t{oversubscribed ? 64u : 32u} << 10;
    case CollKind::broadcast: return std::uint64_t{oversubscribed ? 64u : 16u} << 10;
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

// Heap buffers between processes, from cma_min_bytes() up: through the
// kernel's cross-memory attach (one copy per byte that crosses, made by
// the kernel at 7-8 GB/s here) or through the slots (two copies in user
// space through a cache-sized slot, each line handed between the cores).
// Which is faster changes with the collective, the size and the state of
// the machine: on 2 bound ranks of the test host, within minutes, the
// all-to-all of 1 MB took 68 us through the kernel against 38-42 staged in
// one period, while in the host's slow periods the staged calls of 256
// KB-4 MB take 3.5-6x as long and the kernel's copy does not move; the
// all-gather of 2 MB 122 against 508 us, the all-reduce 288 against 180
// (docs/performance-log.md). With CCLZ_SHM_CMA=auto, local rank 0 times its
// calls that could go through cross-memory attach per band
// (MeasuredChoice: the kernel first) and picks it only while it is the
// faster way for the band, one call ahead, which every rank follows
// (HeapPathPlan). Both ways give the same bits. Where the ranks outnumber
// the cores, a call's time is the scheduler's more than the way's (4 ranks
// on the 2 cores: the same 16 KB call took 9-156 us from run to run), and
// measured choices ran 2-17% slower at 16 MB than the kernel's way alone:
// there every call that can goes through cross-memory attach, as with
// CCLZ_SHM_CMA=1.
enum class HeapPath : int { cma = 0, staged = 1 };
// Below kCmaMeasuredMinBytes the kernel's way is taken unmeasured, from
// cma_min_bytes() up: the all-reduce of 128-512 KiB, the reduce of 256-512
// KiB. There the kernel's way can beat the staged calls by 1.4x, but after a stretch of
// staged calls it takes 5-10 calls to come back to speed (on the AMD test
// host, 4x slow at first), longer than a trial, so measuring kept the
// slower way for dozens of calls (the all-reduce of 256 KB out of place
// took 1.2-1.5x as long measured; docs/performance-log.md).
constexpr std::uint64_t kCmaMeasuredMinBytes = std::uint64_t{512} << 10;

// Whether rank 0 measures the way of a call whose largest buffer is
// `bytes` (from cma_min_bytes() up): the all-reduce and reduce from
// kCmaMeasuredMinBytes, the others at every size.
constexpr bool cma_measured(CollKind kind, std::uint64_t bytes) noexcept {
  return bytes >= kCmaMeasuredMinBytes || (kind != CollKind::all_reduce && kind != CollKind::reduce);
}

// Rank 0's chooser, kept in its window.
using HeapPathChooser = MeasuredChoice<HeapPath>;

// Where rank 0 measures, every rank offers cross-memory attach for a call
// only when rank 0 picked it for that call, one call of the band ahead:
// rank 0 picks the band's next way at the start of each call and writes it
// to its way word (ShmWindow::set_way_word) before its part of the
// agreement; the others read it at the end of the call, once rank 0 has
// published that part (timing_heap_path). So the ranks offer alike: a
// staged call's agreement costs no hand-off (no rank offers, and each
// knows the answer), and a call through the kernel copies half of its own
// block while it waits. Before, the others offered in every call, waited
// for rank 0's word, and copied their block only after it (a call that
// went staged would have copied it twice). A word the others miss
// (overwritten when rank 0 ran kWayWords calls ahead) leaves them staged,
// and a call is staged as soon as one rank does not offer: a slower way
// for a call, never a mismatch.
// Each rank's plan, by HeapPathChooser::band; staged until rank 0 says
// otherwise.
class HeapPathPlan {
 public:
  bool cma(std::uint32_t band) const {
    const auto it = cma_.find(band);
    return it != cma_.end() && it->second;
  }
  void set(std::uint32_t band, bool cma) { cma_[band] = cma; }

 private:
  std::map<std::uint32_t, bool> cma_;
};

// One call's timing, on the stack of timing_heap_path: run_if_direct fills
// it when the call's way was planned (rank 0: and is to be recorded).
// A staged call whose outputs are streamed also picks how it writes its
// slots (SlotStoreCall), by measurement too. While those stores are being
// measured the call's time does not stand for the staged way, and it is
// not recorded: on a 2-rank all-reduce of 16 MB (AMD host), the stores
// tried first took 7.4 and 8.9 ms where the staged way settles at 2.2-3.4,
// and the chooser, seeing those, kept the kernel's way at 3.8-6.0 ms.
struct HeapPathTiming {
  HeapPathPlan* plan = nullptr;        // set when the call's way was planned
  HeapPathChooser* chooser = nullptr;  // rank 0: set when the call is to be recorded
  std::uint32_t band = 0;
  std::uint64_t agreement = 0;  // the agreement's window chunk
  HeapPath path = HeapPath::cma;
  std::uint64_t bytes = 0;
  bool stores_measured = false;  // set by SlotStoreCall
};

// The registry's run() for a node-local collective whose heap calls may go
// through cross-memory attach: Run, where CCLZ_SHM_CMA=auto lets rank 0
// choose the way, timed there (a call that failed is not recorded), and
// followed elsewhere by reading rank 0's word for the band's next call.
template <Status (*Run)(Group&, const CollArgs&)>
Status timing_heap_path(Group& g, const CollArgs& a) {
  detail::ShmWindow* w = g.shm();
  if (w == nullptr || !w->cma_measured()) return Run(g, a);
  HeapPathTiming timing;
  g.set_heap_path_timing(&timing);
  const std::uint64_t start = ticks();
  Status st = Run(g, a);
  const std::uint64_t took = ticks() - start;
  g.set_heap_path_timing(nullptr);
  if (!st.ok() || timing.plan == nullptr) return st;
  if (g.rank() != 0) {
    // Rank 0 wrote its word before publishing its part of the agreement.
    // Ranks that waited for rank 0 in the call have seen that; the others
    // (a broadcast's or reduce's) wait for it here.
    constexpr auto K = static_cast<std::uint64_t>(detail::ShmWindow::kStages);
    const int rank0[1] = {0};
    st = w->wait(rank0, K * timing.agreement + 1, g.deadline(), [&g] { g.progress_transport(); },
                 "the heap path's plan");
    if (st.ok()) timing.plan->set(timing.band, w->way_word(g.seq()));
  } else if (timing.chooser != nullptr && timing.bytes != 0 && !timing.stores_measured) {
    timing.chooser->record(timing.band, timing.path, static_cast<double>(took) / static_cast<double>(timing.bytes));
    w->count_heap_path_timed(timing.path == HeapPath::staged);
  }
  return st;
}

// The direct path of one call, for the collectives' run(): when the call's
// largest buffer is at least the window's threshold, or in the probing band
// below it as DirectHistory says (the same answer on every rank), and the
// ranks agree, runs direct(sig, pb) (returning a Status or nothing) on the
// peers' buffers, then the fence, and sets *ran.
// `send_bytes`/`recv_bytes`: the sizes of this rank's buffers that peers
// use (0: not used). `cma_supported`: direct() handles PeerBuffers::cma, so
// heap buffers of cma_min_bytes() and more may go direct through cross-memory
// attach; `allow_cma`: this rank offers it for this call.
// `own`: the call's own copy (NoOwnCopy above), in two halves that each
// overlap a hand-off: half 0 while this rank waits for the peers' answers in
// the agreement (heap buffers that offer cross-memory attach; should the
// call go staged after all, the staged path copies the block again), half 1
// inside the fence, once this rank is done with the peers' buffers (both
// there where the agreement did not run half 0). Not run when direct()
// fails. (2 bound ranks, heap buffers, all-to-all: 64 KB 4.66 -> 4.34 us,
// 256 KB 11.15 -> 10.72 us; docs/performance-log.md.)
// An error from direct() (a peer's buffer cross-memory attach could not
// reach) still waits for the fence, so that no peer is left waiting.
template <class Direct, class Own = NoOwnCopy>
Status run_if_direct(Group& g, const CollArgs& a, std::size_t largest, std::size_t send_bytes,
                     std::size_t recv_bytes, bool* ran, Direct&& direct, bool cma_supported = false,
                     bool allow_cma = false, Own&& own = Own{}) {
  *ran = false;
  detail::ShmWindow& w = *g.shm();
  const std::uint64_t bytes = largest, threshold = w.direct_min_bytes();
  const std::uint64_t floor = std::min(threshold, direct_probe_min_bytes(a.kind, w.oversubscribed()));
  if (threshold == detail::ShmWindow::kDirectOff || bytes < floor) {
    return {};
  }
  // A call cross-memory attach could take always asks (heap buffers then go
  // direct anyway); whether it may is the same on every rank, while what
  // each offers (allow_cma, e.g. by in place or not) may differ.
  const bool cma_possible = cma_supported && w.cma() && bytes >= cma_min_bytes(a.kind, w.oversubscribed());
  DirectHistory& history = w.local_state<DirectHistory>();
  if (bytes < threshold && !cma_possible && !history.try_below_threshold()) return {};
  const auto sig = call_sig(g, a, a.count);
  bool offer_cma = cma_possible && allow_cma;
  // CCLZ_SHM_CMA=auto, a core per rank: the way rank 0 planned (HeapPathPlan).
  HeapPathTiming* timing = offer_cma && cma_measured(a.kind, bytes) ? g.heap_path_timing() : nullptr;
  HeapPathChooser* chooser = nullptr;
  std::uint32_t band = 0;
  if (timing != nullptr) {
    HeapPathPlan& plan = w.local_state<HeapPathPlan>();
    band = HeapPathChooser::band(sig.shape, a.sendbuf == a.recvbuf, bytes);
    offer_cma = plan.cma(band);
    timing->plan = &plan;
    timing->band = band;
    if (g.rank() == 0) {
      chooser = &w.local_state<HeapPathChooser>();
      const HeapPath now = offer_cma ? HeapPath::cma : HeapPath::staged;
      const bool next_cma = chooser->pick(band, nullptr, &now) == HeapPath::cma;
      w.set_way_word(g.seq(), next_cma);
      plan.set(band, next_cma);
    }
  }
  PeerBuffers pb;
  std::uint64_t agreement = 0;
  w.count_direct_try();
  bool first_half_done = false;
  const std::function<void()> while_waiting = [&] {
    own(0);
    first_half_done = true;
  };
  Status agreed =
      agree_direct(g, sig, a.sendbuf, send_bytes, a.recvbuf, recv_bytes, offer_cma, ran, &pb, &agreement, while_waiting);
  if (!agreed.ok()) return agreed;
  history.record(*ran);
  if (timing != nullptr) timing->agreement = agreement;
  // Recorded as the way it went: a call whose buffers every rank could map
  // ran neither way.
  if (chooser != nullptr && (!*ran || pb.cma)) {
    timing->chooser = chooser;
    timing->path = *ran ? HeapPath::cma : HeapPath::staged;
    timing->bytes = bytes;
  }
  if (!*ran) return {};
  auto rest = [&] {
    if (!first_half_done) own(0);
    own(1);
  };
  if constexpr (std::is_void_v<decltype(direct(sig, pb))>) {
    direct(sig, pb);  // copies and reductions that cannot fail
    return fence(g, sig, coll_name(a.kind), rest);
  } else {
    Status st = direct(sig, pb);
    if (!st.ok()) {
      (void)fence(g, sig, coll_name(a.kind), [] {});
      return st;
    }
    return fence(g, sig, coll_name(a.kind), rest);
  }
}

}  // namespace cclz::coll::shm
