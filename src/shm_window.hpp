// Node-local shared-memory window: the intra-host path of the collectives.
//
// The L ranks of one node map one segment. Each rank owns `slots` staging
// buffers of `slot_bytes` (a ring the pipelined collectives cycle through)
// and a control block with one monotonically growing progress counter.
// Collectives copy a chunk of their input into their own slot, publish, and
// read the other ranks' slots directly (reducing while the data is still in
// the shared last-level cache), so a byte crosses the memory bus about as
// often as the memory roofline allows instead of travelling through a
// transport's send and receive copies.
//
// Progress protocol. Every collective on the window is a sequence of chunks
// numbered globally (the same numbers on every rank, since every rank runs
// the same collectives with the same counts). A chunk has up to kStages
// stages; after stage t of chunk c a rank publishes kStages*c + t + 1, and
// after its last stage kStages*(c+1). A slot may be rewritten for chunk c
// once every rank has published kStages*(c - slots + 1) (done with the
// chunk that used it last). Waiting spins briefly when the node's ranks fit
// on its cores, yields, then sleeps on a futex in the waited-for rank's
// control block; a publisher wakes sleepers only when there are any.
//
// Failure. A wait ends with remote_error when a waited-for rank's process
// has exited (pidfd, checked while sleeping) or has aborted (a flag in its
// control block), with timeout at the deadline, and with the local failure
// after fail(). The caller poisons the communicator: after an error the
// counters are out of step and the window is not used again.
#pragma once

#include <algorithm>
#include <any>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cclz/types.hpp"
#include "transport.hpp"

namespace cclz::detail {

class ShmSegment;

// The sizes of a CPU's level-2 and last-level (data or unified) caches, as
// sysfs describes them under `cpu_cache_dir` (index<i>/level, type and
// size, e.g. "1024K"); glibc's sysconf overstates the L3 of AMD's parts
// with several core complexes (384 MiB for one 32 MiB complex). A size
// sysfs does not give keeps its default here.
struct CacheSizes {
  std::uint64_t l2 = std::uint64_t{1} << 20;
  std::uint64_t llc = std::uint64_t{32} << 20;
};
CacheSizes read_cache_sizes(const std::string& cpu_cache_dir);
// The part of a last level of `llc` bytes that a host of `cpus` CPUs can
// count on: at most kLlcPerCpu per CPU. A virtual machine's sysfs describes
// the whole shared cache of the physical part (480 MiB on a 2-vCPU guest,
// shared with every other tenant), and no server part has more than a few
// MiB per core, so bare metal keeps its figure.
inline constexpr std::uint64_t kLlcPerCpu = std::uint64_t{16} << 20;
std::uint64_t llc_share(std::uint64_t llc, long cpus) noexcept;
// cpu0's, read once, the last level as llc_share() of the online CPUs.
const CacheSizes& host_cache_sizes();

// Where a node's ranks outnumber its cores, when a waiter stops yielding
// and sleeps on the futex. The scheduler (EEVDF, Linux 6.6 and later) runs
// on a yield only a task that is eligible, one that has not had more than
// its share of the CPU lately; a peer queued behind the waiter that has
// (it did the work while the waiter slept, or spun in MPI) is passed over,
// yield after yield, until the waiter's own spinning has used up the
// difference: milliseconds. And a waiter that has its CPU to itself keeps
// it looking busy, so the balancer does not bring it a peer starved on
// another CPU. Sleeping takes the waiter off the CPU, and the peer runs.
// So the waiter sleeps after yields that ran nothing else (each about as
// quick as the quickest yield it has seen; one that switched to another
// thread and back takes several times as long):
// - kEmptyInARow of them in a row while the rank it waits for last ran on
//   this CPU and is not asleep itself (so it is queued here, passed over;
//   a peer asleep in its own wait would gain nothing from the CPU), or
// - a run of them that has lasted kAloneFor, wherever that rank is (it is
//   not about to finish on another CPU).
// A yield that ran another thread starts the count again. Emptiness was
// once a fixed 1 us; on the Zen 5 host an empty yield takes 1.3-1.8 us, so
// the rule never fired there and one run of 20 back-to-back 4 KB
// all-reduces on 4 ranks in about seven spent 2 ms on every call
// (docs/performance-log.md, "The 2 ms cliff, found").
class YieldWatch {
 public:
  static constexpr int kEmptyInARow = 4;
  static constexpr std::chrono::microseconds kAloneFor{100};
  // A new wait.
  void start() noexcept { empty_ = 0; }
  // One yield: how long it took, when it returned, this rank's CPU (-1
  // unknown), the CPU the rank waited for last ran on and whether it is
  // asleep in a wait of its own. True: sleep now.
  bool after_yield(Clock::duration took, Clock::time_point now, int my_cpu, int lag_cpu, bool lag_asleep) noexcept {
    fastest_ = std::min(fastest_, took);
    if (took >= 2 * fastest_) {  // it ran another thread
      empty_ = 0;
      return false;
    }
    if (empty_++ == 0) alone_since_ = now;
    if (my_cpu < 0) return false;
    return (empty_ >= kEmptyInARow && lag_cpu == my_cpu && !lag_asleep) || now - alone_since_ >= kAloneFor;
  }

 private:
  int empty_ = 0;
  Clock::time_point alone_since_;
  // The fastest yield seen, one that ran nothing else: a yield that takes
  // twice as long switched to another thread and back.
  Clock::duration fastest_ = Clock::duration::max();
};

class ShmWindow {
 public:
  static constexpr int kStages = 4;
  // Waiting: spin kSpinUs when the ranks fit on the cores, then yield for
  // kYieldUs (as long as the transport's default CCLZ_YIELD_US; where the
  // ranks outnumber the cores, less as YieldWatch says), then sleep
  // in naps of at most kNapMs (between naps: checks for aborted or exited
  // peers, the deadline, and the transport's progress).
  static constexpr int kSpinUs = 50;
  static constexpr int kYieldUs = 2000;
  static constexpr int kNapMs = 2;
  // A nap's length where the global barrier that orders a fenceless
  // publisher failed (its wake-up may then be missed).
  static constexpr std::chrono::microseconds kUnfencedNap{100};

  struct Geometry {
    int local_size = 0;
    std::size_t slot_bytes = 0;  // multiple of 4096
    int slots = 0;
    // How the all-reduce runs calls of at most 64 KiB per peer (see
    // collectives/allreduce/handoffs.hpp): 0 = chosen by measurement, 1 or 2
    // = always that many hand-offs (CCLZ_SHM_ALLREDUCE_HANDOFFS). Part of
    // the window so that every rank runs the same protocol.
    int allreduce_handoffs = 0;
    // Calls whose largest buffer has at least this many bytes try the
    // direct path: ranks copy straight from one another's buffers when the
    // buffers on every rank of the node can be mapped (mem_alloc memory, or
    // ranks that are threads of one process); see collectives/shm_direct.hpp.
    // From the node's first rank (CCLZ_SHM_DIRECT_KB), so that every rank
    // makes the same exchange; kDirectOff: never.
    std::uint64_t direct_min_bytes = kDirectMinBytes;
    // The cache sizes the node's collectives cut their chunks and choose
    // their stores by (collectives/shm_pipeline.hpp); 0 = this host's
    // (host_cache_sizes()). From the node's first rank (CCLZ_SHM_L2_KB,
    // CCLZ_SHM_LLC_KB), so that every rank cuts a call into the same chunks.
    std::uint64_t l2_bytes = 0;
    std::uint64_t llc_bytes = 0;
    // How streamed calls write what their peers read from their slots (see
    // collectives/slot_stores.hpp): 0 = chosen by measurement on the node's
    // first rank, 1 = ordinary stores, 2 = streaming stores
    // (CCLZ_SHM_SLOT_STORES).
    int slot_stores = 0;
    // Whether calls whose buffers cannot be mapped (heap memory of
    // processes) may go direct through cross-memory attach
    // (process_vm_readv/writev; collectives/shm_direct.hpp): 0 = never,
    // 1 = wherever it applies, 2 = where it applies and rank 0 measured it
    // faster than the slots. From the node's first rank (CCLZ_SHM_CMA).
    int cma = 2;
  };
  static constexpr std::uint64_t kDirectMinBytes = std::uint64_t{1024} << 10;
  static constexpr std::uint64_t kDirectOff = ~std::uint64_t{0};

  // The slot size when CCLZ_SHM_SLOT_KB is unset. One pipeline chunk fills a
  // slot, and every chunk costs a cross-core hand-off per stage (a peer
  // seeing a published counter: microseconds on a virtual machine), so
  // larger chunks amortise it: on 2 bound ranks 1 MiB slots made 1-16 MB
  // all-to-alls about 2x and 64-256 MB all-reduces 1.5x faster than 256
  // KiB. The node's slots should still stay in the last-level cache: at most
  // kSlotBudget of them in all, each between 256 KiB and 1 MiB.
  static constexpr std::size_t kSlotBudget = std::size_t{16} << 20;
  static std::size_t default_slot_bytes(int local_size, int slots) noexcept;

  // What a rank's collective call was, compared across ranks so that a count
  // mismatch is an error rather than a desynchronised window.
  struct CallSig {
    std::uint64_t seq = 0;
    std::uint64_t shape = 0;  // kind, dtype, op, root packed
    std::uint64_t count = 0;
    bool operator==(const CallSig&) const = default;
  };

  // A named segment for processes: the creator makes and sizes it and gets
  // its name; the others open it by name; once all have it open the creator
  // unlinks the name (the mapping lives on). Errors: system_error with errno.
  static Status create_named(const Geometry& g, std::string* name, std::shared_ptr<ShmSegment>* out);
  static Status open_named(const std::string& name, std::shared_ptr<ShmSegment>* out);
  static void unlink_named(const std::string& name) noexcept;
  // One anonymous shared mapping for ranks that are threads of one process.
  static Status create_anonymous(const Geometry& g, std::shared_ptr<ShmSegment>* out);

  // `members`: the communicator ranks of the node in local order; `index`:
  // this rank's position in it; `oversubscribed`: the host runs more of the
  // communicator's processes than they have CPUs (waits never spin).
  // Records this process in the control block.
  ShmWindow(std::shared_ptr<ShmSegment> seg, std::vector<int> members, int index, bool oversubscribed);
  ~ShmWindow();
  ShmWindow(const ShmWindow&) = delete;
  ShmWindow& operator=(const ShmWindow&) = delete;

  int size() const noexcept { return static_cast<int>(members_.size()); }
  int index() const noexcept { return index_; }
  const std::vector<int>& members() const noexcept { return members_; }
  std::size_t slot_bytes() const noexcept;
  int slots() const noexcept;
  // Whether the node's ranks outnumber its cores (then waits never spin).
  bool oversubscribed() const noexcept { return oversubscribed_; }
  // Whether this rank publishes without a fence: where the ranks fit on
  // the cores and the kernel offers membarrier(2)'s global barrier.
  bool fenceless() const noexcept { return fenceless_; }
  // How many ranks sleep on rank r's futex now, and how many times this
  // rank's publish() has woken sleepers (for tests).
  std::uint32_t sleepers_on(int r) const noexcept;
  std::uint64_t wakes_sent() const noexcept { return wakes_sent_; }
  int allreduce_handoffs() const noexcept;
  int slot_stores() const noexcept;
  std::uint64_t direct_min_bytes() const noexcept;
  // Cross-memory attach may be used (CCLZ_SHM_CMA 1 or auto)...
  bool cma() const noexcept;
  // ...and is chosen per call by measurement (auto), which needs a core
  // per rank: where ranks outnumber cores a call's time is the scheduler's
  // (collectives/shm_direct.hpp).
  bool cma_measured() const noexcept;
  std::uint64_t l2_bytes() const noexcept;
  std::uint64_t llc_bytes() const noexcept;
  // The process id of local rank r (0 until it has attached).
  int pid(int r) const noexcept;
  // Where the ranks outnumber the cores: the CPU local rank r was on when
  // it last attached, waited or published (-1: not attached yet, or a
  // window that fits its cores).
  int last_cpu(int r) const noexcept;
  // Whether the window's ranks are threads of this process (an anonymous
  // segment), sharing one address space.
  bool one_process() const noexcept;
  // Calls of this rank that ran on the direct path (shm_direct.hpp), and of
  // those the ones that mapped the peers' buffers (not cross-memory
  // attach): for tests and diagnostics.
  void count_direct(bool mapped) noexcept {
    direct_calls_.fetch_add(1, std::memory_order_relaxed);
    if (mapped) mapped_calls_.fetch_add(1, std::memory_order_relaxed);
  }
  std::uint64_t direct_calls() const noexcept { return direct_calls_.load(std::memory_order_relaxed); }
  std::uint64_t mapped_calls() const noexcept { return mapped_calls_.load(std::memory_order_relaxed); }
  // Calls of this rank that took part in the direct path's agreement,
  // whichever way it went.
  void count_direct_try() noexcept { direct_tries_.fetch_add(1, std::memory_order_relaxed); }
  std::uint64_t direct_tries() const noexcept { return direct_tries_.load(std::memory_order_relaxed); }
  // Calls the node's first rank timed to choose the heap buffers' way
  // (CCLZ_SHM_CMA=auto; shm_direct.hpp), through cross-memory attach and
  // staged.
  void count_heap_path_timed(bool staged) noexcept {
    heap_path_timed_[staged ? 1 : 0].fetch_add(1, std::memory_order_relaxed);
  }
  std::uint64_t heap_path_timed(bool staged) const noexcept {
    return heap_path_timed_[staged ? 1 : 0].load(std::memory_order_relaxed);
  }

  // Local rank 0's word for call `seq`: the way it picked for the next call
  // of that call's band (collectives/shm_direct.hpp, HeapPathPlan), true for
  // cross-memory attach. Kept for the last kWayWords calls; way_word() is
  // false once the word has been overwritten, or before rank 0 has written it.
  static constexpr std::size_t kWayWords = 4;
  void set_way_word(std::uint64_t seq, bool cma) noexcept;
  bool way_word(std::uint64_t seq) const noexcept;

  // The slot of local rank `r` that chunk `s` of the running pipeline uses
  // (s from next_chunk(), before advance()). Pipelines' chunks take the
  // slots in turn; an agreement's chunk takes none, so that data rotates
  // through every slot however many chunks the calls' agreements take (with
  // an agreement and one data chunk per call, data alternated between two
  // of four slots, and a 2-rank staged all-to-all of 256 KB took 17-22 us
  // a call against 15-16 when it rotated through four).
  std::byte* slot(int r, std::uint64_t s) const noexcept;
  // The words of an agreement (collectives/shm_direct.cpp) in chunk `s`,
  // kAgreementBytes beside the chunk's CallSig.
  static constexpr std::size_t kAgreementBytes = 128;
  std::byte* agreement(int r, std::uint64_t s) const noexcept;

  // The global number of the next chunk; the caller advances it by the
  // chunks it used, identically on every rank: a pipeline's with advance(),
  // an agreement's with advance_agreement().
  std::uint64_t next_chunk() const noexcept { return next_chunk_; }
  void advance(std::uint64_t chunks) noexcept {
    next_chunk_ += chunks;
    data_chunks_ += chunks;
  }
  void advance_agreement() noexcept { ++next_chunk_; }

  // Publishes this rank's progress (monotonic) and wakes sleepers.
  void publish(std::uint64_t value) noexcept;
  std::uint64_t progress(int r) const noexcept;

  // Waits until every rank in `ranks` (all ranks when empty) has published
  // at least `value`. `idle` runs about every millisecond while sleeping
  // (the transport's progress). `what` names the step in errors.
  Status wait(std::span<const int> ranks, std::uint64_t value, Clock::time_point deadline,
              const std::function<void()>& idle, const char* what);

  void set_call_sig(std::uint64_t slot, const CallSig& sig) noexcept;
  CallSig call_sig(int r, std::uint64_t slot) const noexcept;
  // A word an algorithm sends with a call, in the same cache line as the
  // call's CallSig (which every peer reads anyway after its first wait): set
  // it before publishing the first stage of the chunk, read it after waiting
  // for that stage.
  void set_call_hint(std::uint64_t slot, std::uint64_t hint) noexcept;
  std::uint64_t call_hint(int r, std::uint64_t slot) const noexcept;

  // State an algorithm keeps in this process for this window across calls,
  // one object per type T, made on first use (and never moved: a deque).
  // Not shared with other ranks.
  template <class T>
  T& local_state() {
    for (std::any& a : local_state_) {
      if (T* t = std::any_cast<T>(&a)) return *t;
    }
    return *std::any_cast<T>(&local_state_.emplace_back(std::in_place_type<T>));
  }

  // Makes every pending and later wait() of this rank fail with `why`, and
  // marks this rank aborted so that peers waiting on it stop too.
  void fail(const Status& why);

 private:
  bool rank_gone(int r, std::string* why);
  // Where the ranks outnumber the cores: records the CPU this rank runs on
  // for the peers' YieldWatch and returns it (-1 otherwise).
  int note_cpu() noexcept;

  std::shared_ptr<ShmSegment> seg_;
  std::vector<int> members_;
  int index_;
  bool oversubscribed_;
  // publish() stores its progress without a fence (see there).
  bool fenceless_;
  std::uint64_t wakes_sent_ = 0;
  std::uint64_t next_chunk_ = 0;
  std::uint64_t data_chunks_ = 0;  // chunks that took a slot, of next_chunk_
  std::uint64_t all_seen_ = 0;  // every rank's progress is known to be at least this
  std::vector<int> pidfds_;  // per local rank; -1 for this process or when unavailable
  std::vector<int> pids_;
  std::atomic<bool> failed_{false};
  std::atomic<std::uint64_t> direct_calls_{0};
  std::atomic<std::uint64_t> mapped_calls_{0};
  std::atomic<std::uint64_t> direct_tries_{0};
  std::array<std::atomic<std::uint64_t>, 2> heap_path_timed_{};
  Status fail_status_;  // written before failed_ is set
  std::deque<std::any> local_state_;
  YieldWatch yield_watch_;
};

}  // namespace cclz::detail
