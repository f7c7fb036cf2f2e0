#include "shm_window.hpp"

#include "topology.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <fstream>
#include <new>
#include <random>
#include <string_view>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace cclz::detail {
namespace {

constexpr std::uint64_t kMagic = 0x636c7a73686d3038ULL;  // "clzshm08"
constexpr std::size_t kPage = 4096;
constexpr std::size_t kLine = 64;
constexpr std::size_t kSlotPad = 4096;

// Where slot `idx` starts within its page. Slots start at offsets 448 bytes
// apart (nine in turn), so that a slot, its peers' and the caller's buffers
// do not all share their low 12 address bits: a load whose address matches
// an earlier, still pending store's in those bits waits for it (4K
// aliasing), which stalls copies and reductions. And no slot starts within
// 256 bytes of a page's start, either way: most large buffers start in a
// page's first line (page-aligned ones at 0, glibc's mmap'd malloc chunks at
// 16, 64-byte aligned ones at 64), and a slot 48 bytes past its source (the
// first slot here was at 64) made copies into it stall: 2 bound ranks,
// std::vector buffers, 4 MB all-to-all 226-269 -> 186-190 us,
// reduce-scatter 221-231 -> 164-166 us (docs/performance-log.md, "Slots
// off the start of a page").
constexpr std::size_t slot_page_offset(std::size_t idx) { return (idx * 7 % 63 + 4) * kLine; }
static_assert(slot_page_offset(0) >= 256 && slot_page_offset(8) + 256 <= kPage, "slots keep off page starts");

// Writes once to every page of a new mapping of the window, leaving its
// bytes as they are. Where the hypervisor keeps shadow page tables (the
// AMD test host runs under PVM), a process's first write to a page costs
// 5-9 us even after MAP_POPULATE, whose kernel-side fill the shadow tables
// do not see (a first read 1.5-2 us, and the write after it 6 more). Left
// to the collectives, staged calls paid it on each slot's first use: the
// first two 2-rank all-to-alls of each size from 256 KB took 0.4-3 ms
// against 11-90 us after, and a chooser that measured the staged way then
// saw it as slow (cclz-perf -n 20 -w 3, 2 ranks: the 1 MB all-to-all 105
// -> 58 us with this). A locked add of zero is a write, and one that
// cannot undo a peer's concurrent store.
void touch_pages(std::byte* base, std::size_t bytes) noexcept {
  for (std::size_t off = 0; off < bytes; off += kPage) {
    auto* word = reinterpret_cast<std::uint64_t*>(base + off);
    std::atomic_ref<std::uint64_t>(*word).fetch_add(0, std::memory_order_relaxed);
  }
}

// Layout: Header (one page), then one RankCtl per rank, one CallSig line per
// (rank, slot), one wake-up threshold per (rank, waiter), then the data
// (page aligned), rank-major.
struct Header {
  std::uint64_t magic;
  std::int32_t local_size;
  std::int32_t slots;
  std::uint64_t slot_bytes;
  std::uint64_t total_bytes;
  std::int32_t allreduce_handoffs;
  std::uint64_t direct_min_bytes;
  std::uint64_t l2_bytes;
  std::uint64_t llc_bytes;
  std::int32_t slot_stores;
  std::int32_t cma;
};

struct alignas(kLine) RankCtl {
  // Line 0: read by every waiter, written by its owner only.
  std::atomic<std::uint64_t> progress;
  char pad0[kLine - sizeof(std::atomic<std::uint64_t>)];
  // Line 1: the futex word and its bookkeeping. `sleepers` counts ranks
  // asleep on `event`; each one's threshold is in the wants region, so a
  // publish wakes them only when it reaches one (not on every stage).
  std::atomic<std::uint32_t> event;
  std::atomic<std::uint32_t> sleepers;
  std::atomic<std::uint32_t> aborted;
  std::atomic<std::int32_t> pid;
  // Where the ranks outnumber the cores: the CPU the owner last attached,
  // waited or published on (note_cpu).
  std::atomic<std::int32_t> cpu;
  // Where the ranks outnumber the cores: 1 while the owner sleeps on a
  // peer's futex (YieldWatch).
  std::atomic<std::uint32_t> asleep;
  // 1 when the owner publishes without a fence (ShmWindow::publish): its
  // waiters run a global barrier before they sleep.
  std::atomic<std::uint32_t> fenceless;
  char pad1[kLine - 7 * sizeof(std::uint32_t)];
  // Line 2: the owner's way words of its last kWayWords calls (set_way_word).
  std::array<std::atomic<std::uint64_t>, ShmWindow::kWayWords> way_words;
};
static_assert(sizeof(RankCtl) == 3 * kLine);
static_assert(std::atomic<std::uint64_t>::is_always_lock_free && std::atomic<std::uint32_t>::is_always_lock_free);

struct alignas(kLine) SigLine {
  ShmWindow::CallSig sig;
  std::uint64_t hint;
  std::byte agreement[ShmWindow::kAgreementBytes];
};

std::size_t round_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

struct Offsets {
  std::size_t ctl, sig, want, data, total;
};
constexpr std::uint64_t kNoWant = ~std::uint64_t{0};

Offsets offsets(const ShmWindow::Geometry& g) {
  Offsets o{};
  const auto L = static_cast<std::size_t>(g.local_size), S = static_cast<std::size_t>(g.slots);
  o.ctl = kPage;
  o.sig = o.ctl + L * sizeof(RankCtl);
  o.want = o.sig + L * S * sizeof(SigLine);
  o.data = round_up(o.want + L * L * sizeof(std::uint64_t), kPage);
  o.total = o.data + L * S * (g.slot_bytes + kSlotPad);
  return o;
}

Status errno_status(const std::string& what) {
  return {Result::system_error, what + ": " + std::strerror(errno)};
}

long futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t val, const timespec* ts) {
  return syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, val, ts, nullptr, 0);
}

// membarrier(2) with MEMBARRIER_CMD_GLOBAL_EXPEDITED: a full memory barrier
// on every CPU that runs a thread of a process registered for it. With it a
// waiter about to sleep pays for the ordering that a publisher would
// otherwise pay on every publish (the asymmetric Dekker pattern). This
// process registers once; false where the kernel or a seccomp policy
// refuses.
bool register_global_barrier() noexcept {
  static const bool ok = [] {
    const long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    if (cmds < 0 || (cmds & MEMBARRIER_CMD_GLOBAL_EXPEDITED) == 0 ||
        (cmds & MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) == 0) {
      return false;
    }
    return syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) == 0;
  }();
  return ok;
}
bool global_barrier() noexcept { return syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) == 0; }

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

}  // namespace

class ShmSegment {
 public:
  ShmSegment(std::byte* base, std::size_t bytes, bool one_process = false)
      : base_(base), bytes_(bytes), one_process_(one_process) {}
  // An anonymous mapping: every rank on it is a thread of this process.
  bool one_process() const noexcept { return one_process_; }
  ~ShmSegment() { munmap(base_, bytes_); }
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  Header& header() const { return *reinterpret_cast<Header*>(base_); }
  RankCtl& ctl(int r) const { return reinterpret_cast<RankCtl*>(base_ + ctl_off_)[r]; }
  // The progress rank `waiter` sleeps for on `target`'s futex (kNoWant: none).
  std::atomic<std::uint64_t>& want(int target, int waiter) const {
    const auto L = static_cast<std::size_t>(header().local_size);
    return reinterpret_cast<std::atomic<std::uint64_t>*>(base_ + want_off_)[static_cast<std::size_t>(target) * L +
                                                                             static_cast<std::size_t>(waiter)];
  }
  SigLine& sig(int r, std::uint64_t s) const {
    const Header& h = header();
    const auto idx = static_cast<std::size_t>(r) * static_cast<std::size_t>(h.slots) +
                     static_cast<std::size_t>(s % static_cast<std::uint64_t>(h.slots));
    return reinterpret_cast<SigLine*>(base_ + sig_off_)[idx];
  }
  std::byte* slot(int r, std::uint64_t s) const {
    const Header& h = header();
    const auto idx = static_cast<std::size_t>(r) * static_cast<std::size_t>(h.slots) +
                     static_cast<std::size_t>(s % static_cast<std::uint64_t>(h.slots));
    return base_ + data_off_ + idx * (h.slot_bytes + kSlotPad) + slot_page_offset(idx);
  }
  ShmWindow::Geometry geometry() const {
    const Header& h = header();
    return {h.local_size,  h.slot_bytes, h.slots,       h.allreduce_handoffs, h.direct_min_bytes,
            h.l2_bytes,    h.llc_bytes,  h.slot_stores, h.cma};
  }
  void cache_offsets() {
    const Offsets o = offsets(geometry());
    ctl_off_ = o.ctl;
    sig_off_ = o.sig;
    want_off_ = o.want;
    data_off_ = o.data;
  }

  // Placement-constructs the header and control blocks of a fresh mapping.
  void init(const ShmWindow::Geometry& g, std::size_t total) {
    const CacheSizes& host = host_cache_sizes();
    auto* h = new (base_) Header{kMagic,
                                 g.local_size,
                                 g.slots,
                                 g.slot_bytes,
                                 total,
                                 g.allreduce_handoffs,
                                 g.direct_min_bytes,
                                 g.l2_bytes != 0 ? g.l2_bytes : host.l2,
                                 g.llc_bytes != 0 ? g.llc_bytes : host.llc,
                                 g.slot_stores,
                                 g.cma};
    (void)h;
    const Offsets o = offsets(g);
    for (int r = 0; r < g.local_size; ++r) {
      auto* c = new (base_ + o.ctl + static_cast<std::size_t>(r) * sizeof(RankCtl)) RankCtl;
      c->progress.store(0, std::memory_order_relaxed);
      c->event.store(0, std::memory_order_relaxed);
      c->sleepers.store(0, std::memory_order_relaxed);
      c->fenceless.store(0, std::memory_order_relaxed);
      c->aborted.store(0, std::memory_order_relaxed);
      c->pid.store(0, std::memory_order_relaxed);
      for (auto& word : c->way_words) word.store(~std::uint64_t{0}, std::memory_order_relaxed);
      c->cpu.store(-1, std::memory_order_relaxed);
      c->asleep.store(0, std::memory_order_relaxed);
    }
    cache_offsets();
    for (int t = 0; t < g.local_size; ++t) {
      for (int w = 0; w < g.local_size; ++w) new (&want(t, w)) std::atomic<std::uint64_t>(kNoWant);
    }
    std::atomic_thread_fence(std::memory_order_release);
  }

 private:
  std::byte* base_;
  std::size_t bytes_;
  bool one_process_;
  std::size_t ctl_off_ = 0, sig_off_ = 0, want_off_ = 0, data_off_ = 0;
};

namespace {

Status check_geometry(const ShmWindow::Geometry& g) {
  if (g.local_size < 1 || g.local_size > 512 || g.slots < 1 || g.slots > 64 || g.slot_bytes == 0 ||
      g.slot_bytes % kPage != 0 || g.slot_bytes > (std::size_t{1} << 30) || g.allreduce_handoffs < 0 ||
      g.allreduce_handoffs > 2 || g.slot_stores < 0 || g.slot_stores > 2 || g.cma < 0 || g.cma > 2) {
    return {Result::invalid_argument, "shared-memory window: bad geometry (" + std::to_string(g.local_size) +
                                          " ranks, " + std::to_string(g.slots) + " slots of " +
                                          std::to_string(g.slot_bytes) + " bytes, all-reduce hand-offs " +
                                          std::to_string(g.allreduce_handoffs) + ", slot stores " +
                                          std::to_string(g.slot_stores) + ", cross-memory attach " +
                                          std::to_string(g.cma) + ")"};
  }
  return {};
}

}  // namespace

CacheSizes read_cache_sizes(const std::string& cpu_cache_dir) {
  CacheSizes c;
  int llc_level = 0;
  for (int i = 0;; ++i) {
    const std::string dir = cpu_cache_dir + "/index" + std::to_string(i) + "/";
    std::ifstream level_file(dir + "level"), type_file(dir + "type"), size_file(dir + "size");
    int level = 0;
    if (!(level_file >> level)) break;
    std::string type, size;
    if (!(type_file >> type) || type == "Instruction" || !(size_file >> size)) continue;
    std::uint64_t bytes = 0;
    const auto [end, err] = std::from_chars(size.data(), size.data() + size.size(), bytes);
    if (err != std::errc{}) continue;
    const std::string_view unit(end, static_cast<std::size_t>(size.data() + size.size() - end));
    if (unit == "K") {
      bytes <<= 10;
    } else if (unit == "M") {
      bytes <<= 20;
    } else if (!unit.empty()) {
      continue;
    }
    if (bytes == 0) continue;
    if (level == 2) c.l2 = bytes;
    if (level >= 2 && level >= llc_level) {
      llc_level = level;
      c.llc = bytes;
    }
  }
  return c;
}

std::uint64_t llc_share(std::uint64_t llc, long cpus) noexcept {
  return std::min(llc, static_cast<std::uint64_t>(std::max(1L, cpus)) * kLlcPerCpu);
}

const CacheSizes& host_cache_sizes() {
  static const CacheSizes sizes = [] {
    CacheSizes c = read_cache_sizes("/sys/devices/system/cpu/cpu0/cache");
    c.llc = llc_share(c.llc, sysconf(_SC_NPROCESSORS_ONLN));
    return c;
  }();
  return sizes;
}

Status ShmWindow::create_named(const Geometry& g, std::string* name, std::shared_ptr<ShmSegment>* out) {
  if (Status st = check_geometry(g); !st.ok()) return st;
  const std::size_t total = offsets(g).total;
  std::random_device rd;
  int fd = -1;
  std::string n;
  for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
    n = "/cclz-" + std::to_string(getpid()) + "-" + std::to_string(rd());
    fd = shm_open(n.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 && errno != EEXIST) return errno_status("shm_open " + n);
  }
  if (fd < 0) return errno_status("shm_open " + n);
  // posix_fallocate reserves the pages now, so a full /dev/shm is an error
  // here rather than a SIGBUS in the middle of a collective.
  int rc = ftruncate(fd, static_cast<off_t>(total));
  if (rc == 0) rc = posix_fallocate(fd, 0, static_cast<off_t>(total)) == 0 ? 0 : -1;
  if (rc != 0) {
    Status st = errno_status("sizing shared memory " + n + " to " + std::to_string(total) + " bytes");
    if (errno == 0 || errno == ENOSPC) st = {Result::system_error, "no room in /dev/shm for " + std::to_string(total) +
                                                                       " bytes (" + n + ")"};
    close(fd);
    shm_unlink(n.c_str());
    return st;
  }
  // MAP_POPULATE maps every page now (8 MiB for 2 ranks: 1-3 ms, once);
  // otherwise a slot's first use in a collective faults on each of its
  // pages (about 200 us per 1 MiB slot, measured on 2 bound ranks). The
  // other mappings below do the same, and each process touches its mapping
  // (touch_pages).
  void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    Status st = errno_status("mmap " + n);
    shm_unlink(n.c_str());
    return st;
  }
  touch_pages(static_cast<std::byte*>(p), total);
  auto seg = std::make_shared<ShmSegment>(static_cast<std::byte*>(p), total);
  seg->init(g, total);
  *name = n;
  *out = std::move(seg);
  return {};
}

Status ShmWindow::open_named(const std::string& name, std::shared_ptr<ShmSegment>* out) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) return errno_status("shm_open " + name);
  struct stat sb {};
  if (fstat(fd, &sb) != 0 || sb.st_size < static_cast<off_t>(kPage)) {
    close(fd);
    return {Result::system_error, "shared memory " + name + " is too small"};
  }
  const auto bytes = static_cast<std::size_t>(sb.st_size);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return errno_status("mmap " + name);
  touch_pages(static_cast<std::byte*>(p), bytes);
  auto seg = std::make_shared<ShmSegment>(static_cast<std::byte*>(p), bytes);
  const Header& h = seg->header();
  if (h.magic != kMagic || h.total_bytes != bytes || !check_geometry(seg->geometry()).ok()) {
    return {Result::system_error, "shared memory " + name + " is not a cclz window"};
  }
  seg->cache_offsets();
  *out = std::move(seg);
  return {};
}

void ShmWindow::unlink_named(const std::string& name) noexcept { shm_unlink(name.c_str()); }

Status ShmWindow::create_anonymous(const Geometry& g, std::shared_ptr<ShmSegment>* out) {
  if (Status st = check_geometry(g); !st.ok()) return st;
  const std::size_t total = offsets(g).total;
  void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) return errno_status("mmap of " + std::to_string(total) + " bytes");
  touch_pages(static_cast<std::byte*>(p), total);
  auto seg = std::make_shared<ShmSegment>(static_cast<std::byte*>(p), total, true);
  seg->init(g, total);
  *out = std::move(seg);
  return {};
}

ShmWindow::ShmWindow(std::shared_ptr<ShmSegment> seg, std::vector<int> members, int index, bool oversubscribed)
    : seg_(std::move(seg)),
      members_(std::move(members)),
      index_(index),
      oversubscribed_(oversubscribed),
      // Where the ranks outnumber the cores, waiters sleep often, and a
      // global barrier before each sleep would cost more than the fences.
      fenceless_(!oversubscribed && register_global_barrier()),
      pidfds_(members_.size(), -2),
      pids_(members_.size(), 0) {
  seg_->ctl(index_).fenceless.store(fenceless_ ? 1 : 0, std::memory_order_relaxed);
  seg_->ctl(index_).pid.store(static_cast<std::int32_t>(getpid()), std::memory_order_release);
  note_cpu();
}

ShmWindow::~ShmWindow() {
  for (int fd : pidfds_) {
    if (fd >= 0) close(fd);
  }
}

std::size_t ShmWindow::slot_bytes() const noexcept { return seg_->header().slot_bytes; }

std::size_t ShmWindow::default_slot_bytes(int local_size, int slots) noexcept {
  const auto per = kSlotBudget / (static_cast<std::size_t>(std::max(1, local_size)) *
                                  static_cast<std::size_t>(std::max(1, slots)));
  return std::clamp(per, std::size_t{256} << 10, std::size_t{1} << 20) / 4096 * 4096;
}
int ShmWindow::slots() const noexcept { return seg_->header().slots; }
int ShmWindow::allreduce_handoffs() const noexcept { return seg_->header().allreduce_handoffs; }
int ShmWindow::slot_stores() const noexcept { return seg_->header().slot_stores; }
std::uint64_t ShmWindow::direct_min_bytes() const noexcept { return seg_->header().direct_min_bytes; }
bool ShmWindow::cma() const noexcept { return seg_->header().cma != 0; }
bool ShmWindow::cma_measured() const noexcept { return seg_->header().cma == 2 && !oversubscribed_; }
std::uint64_t ShmWindow::l2_bytes() const noexcept { return seg_->header().l2_bytes; }
std::uint64_t ShmWindow::llc_bytes() const noexcept { return seg_->header().llc_bytes; }
int ShmWindow::pid(int r) const noexcept { return seg_->ctl(r).pid.load(std::memory_order_acquire); }
std::uint32_t ShmWindow::sleepers_on(int r) const noexcept {
  return seg_->ctl(r).sleepers.load(std::memory_order_seq_cst);
}
int ShmWindow::last_cpu(int r) const noexcept { return seg_->ctl(r).cpu.load(std::memory_order_relaxed); }
bool ShmWindow::one_process() const noexcept { return seg_->one_process(); }
std::byte* ShmWindow::slot(int r, std::uint64_t s) const noexcept {
  return seg_->slot(r, data_chunks_ + (s - next_chunk_));
}

std::byte* ShmWindow::agreement(int r, std::uint64_t s) const noexcept { return seg_->sig(r, s).agreement; }

std::uint64_t ShmWindow::progress(int r) const noexcept {
  return seg_->ctl(r).progress.load(std::memory_order_acquire);
}

int ShmWindow::note_cpu() noexcept {
  if (!oversubscribed_) return -1;
  const int cpu = sched_getcpu();
  // Written only when it changed: the peers read this line after each
  // yield, and ranks rarely move.
  std::atomic<std::int32_t>& mine = seg_->ctl(index_).cpu;
  if (mine.load(std::memory_order_relaxed) != cpu) mine.store(cpu, std::memory_order_relaxed);
  return cpu;
}

void ShmWindow::publish(std::uint64_t value) noexcept {
  note_cpu();
  RankCtl& c = seg_->ctl(index_);
  if (fenceless_) {
    // No fence between the store and the read of `sleepers`: a waiter
    // that goes to sleep on this rank counts itself among the sleepers and
    // then runs a global barrier (wait()), which either makes this store
    // visible to the waiter's last look at the progress or lets this read
    // count the waiter. A fence here waits for the progress line to come
    // back from the core spinning on it: on the Zen 5 host, most of a 4 KB
    // broadcast's root.
    c.progress.store(value, std::memory_order_release);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    if (c.sleepers.load(std::memory_order_relaxed) == 0) return;
    c.event.fetch_add(1, std::memory_order_seq_cst);
  } else {
    c.progress.store(value, std::memory_order_seq_cst);
    c.event.fetch_add(1, std::memory_order_seq_cst);
    if (c.sleepers.load(std::memory_order_seq_cst) == 0) return;
  }
  for (int w = 0; w < size(); ++w) {
    if (seg_->want(index_, w).load(std::memory_order_seq_cst) <= value) {
      futex(&c.event, FUTEX_WAKE, INT_MAX, nullptr);
      ++wakes_sent_;
      return;
    }
  }
}

void ShmWindow::set_call_sig(std::uint64_t slot, const CallSig& sig) noexcept { seg_->sig(index_, slot).sig = sig; }

ShmWindow::CallSig ShmWindow::call_sig(int r, std::uint64_t slot) const noexcept { return seg_->sig(r, slot).sig; }

void ShmWindow::set_call_hint(std::uint64_t slot, std::uint64_t hint) noexcept { seg_->sig(index_, slot).hint = hint; }

void ShmWindow::set_way_word(std::uint64_t seq, bool cma) noexcept {
  seg_->ctl(index_).way_words[seq % kWayWords].store(seq << 1 | (cma ? 1u : 0u), std::memory_order_release);
}

bool ShmWindow::way_word(std::uint64_t seq) const noexcept {
  const std::uint64_t v = seg_->ctl(0).way_words[seq % kWayWords].load(std::memory_order_acquire);
  return v == (seq << 1 | 1u);
}

std::uint64_t ShmWindow::call_hint(int r, std::uint64_t slot) const noexcept { return seg_->sig(r, slot).hint; }

void ShmWindow::fail(const Status& why) {
  if (failed_.load(std::memory_order_acquire)) return;
  fail_status_ = why;
  failed_.store(true, std::memory_order_release);
  seg_->ctl(index_).aborted.store(1, std::memory_order_seq_cst);
  for (int r = 0; r < size(); ++r) {
    RankCtl& c = seg_->ctl(r);
    c.event.fetch_add(1, std::memory_order_seq_cst);
    futex(&c.event, FUTEX_WAKE, INT_MAX, nullptr);
  }
}

bool ShmWindow::rank_gone(int r, std::string* why) {
  const auto i = static_cast<std::size_t>(r);
  if (r == index_) return false;
  if (pidfds_[i] == -2) {
    pids_[i] = seg_->ctl(r).pid.load(std::memory_order_acquire);
    if (pids_[i] == 0) return false;  // not attached yet
    pidfds_[i] = -1;
    if (pids_[i] != getpid()) pidfds_[i] = static_cast<int>(syscall(SYS_pidfd_open, pids_[i], 0));
    if (pidfds_[i] < 0 && pids_[i] != getpid() && kill(pids_[i], 0) != 0 && errno == ESRCH) {
      *why = "its process (pid " + std::to_string(pids_[i]) + ") has exited";
      return true;
    }
  }
  if (pidfds_[i] >= 0) {
    pollfd p{pidfds_[i], POLLIN, 0};
    if (poll(&p, 1, 0) > 0) {
      *why = "its process (pid " + std::to_string(pids_[i]) + ") has exited";
      return true;
    }
  } else if (pids_[i] != getpid() && kill(pids_[i], 0) != 0 && errno == ESRCH) {
    *why = "its process (pid " + std::to_string(pids_[i]) + ") has exited";
    return true;
  }
  return false;
}

Status ShmWindow::wait(std::span<const int> ranks, std::uint64_t value, Clock::time_point deadline,
                       const std::function<void()>& idle, const char* what) {
  // Every rank has been seen at all_seen_ or beyond: no need to read their
  // counters (lines the peers keep writing) again for anything below it.
  if (ranks.empty() && value <= all_seen_) return {};
  // Where the ranks outnumber the cores, peers look at this to tell
  // whether this rank is queued on their CPU (YieldWatch).
  note_cpu();
  const int n = ranks.empty() ? size() : static_cast<int>(ranks.size());
  auto rank_at = [&](int i) { return ranks.empty() ? i : ranks[static_cast<std::size_t>(i)]; };
  int lag = 0;  // the first rank not there yet; earlier ones stay there (monotonic)
  auto ready = [&] {
    for (; lag < n; ++lag) {
      if (seg_->ctl(rank_at(lag)).progress.load(std::memory_order_acquire) < value) return false;
    }
    if (ranks.empty()) all_seen_ = std::max(all_seen_, value);
    return true;
  };
  if (ready()) return {};
  auto local_failure = [&]() -> bool { return failed_.load(std::memory_order_acquire); };
  auto peer_status = [&](int r, const std::string& cause) {
    return Status(Result::remote_error, "rank " + std::to_string(members_[static_cast<std::size_t>(r)]) + " " +
                                            cause + " (node-local " + what + ")");
  };

  if (!oversubscribed_) {
    // The ranks fit on the cores: the peer is running and usually
    // microseconds away, less than a sleep and wake-up cost.
    const auto spin_end = Clock::now() + std::chrono::microseconds(kSpinUs);
    for (int i = 1;; ++i) {
      cpu_relax();
      if (ready()) return {};
      if ((i & 255) == 0 && (local_failure() || Clock::now() >= spin_end)) break;
    }
  }
  // Then yield for kYieldUs, ranks or no ranks to spare: with more ranks
  // than cores the yield hands the core to a peer that shares it, and a
  // futex wake-up costs tens of microseconds on a virtual machine (on the
  // 2-core host, 3-5 ranks, 1-64 KB all-reduce: 4-34 us yielding for 2 ms
  // against 23-99 us after three yields). Unless the yields stop handing
  // it over (YieldWatch).
  const auto yield_start = Clock::now(), yield_end = yield_start + std::chrono::microseconds(kYieldUs);
  yield_watch_.start();
  for (int i = 1; !local_failure(); ++i) {
    const auto before = oversubscribed_ ? Clock::now() : Clock::time_point{};
    sched_yield();
    if (ready()) return {};
    if (oversubscribed_) {
      const auto now = Clock::now();
      const int cpu = note_cpu();
      const RankCtl& lc = seg_->ctl(rank_at(lag));
      const int lag_cpu = lc.cpu.load(std::memory_order_relaxed);
      const bool lag_asleep = lc.asleep.load(std::memory_order_relaxed) != 0;
      if (yield_watch_.after_yield(now - before, now, cpu, lag_cpu, lag_asleep) || now >= yield_end) break;
    } else if ((i & 3) == 0 && Clock::now() >= yield_end) {
      break;
    }
  }
  // Sleep on the lagging rank's futex until it publishes what we need;
  // between naps (at most kNapMs) look for aborts, exits and the deadline,
  // first kNapMs after the yields began (a wait that YieldWatch sent to
  // sleep within microseconds does not pay for the checks and the
  // transport's progress at once).
  auto next_check = yield_start + std::chrono::milliseconds(kNapMs);
  for (;;) {
    if (local_failure()) return fail_status_;
    const int target = rank_at(lag);
    const auto now = Clock::now();
    if (now >= next_check || now >= deadline) {
      for (int r = 0; r < size(); ++r) {
        if (r != index_ && seg_->ctl(r).aborted.load(std::memory_order_acquire) != 0) {
          return peer_status(r, "stopped: its communicator failed or was aborted");
        }
      }
      std::string why;
      if (rank_gone(target, &why)) return peer_status(target, "failed: " + why);
      if (now >= deadline) {
        std::string who;
        for (int i = lag; i < n; ++i) {
          const int r = rank_at(i);
          if (seg_->ctl(r).progress.load(std::memory_order_acquire) < value) {
            who += (who.empty() ? "" : ", ") + std::to_string(members_[static_cast<std::size_t>(r)]);
          }
        }
        return {Result::timeout, std::string("timed out in the node-local ") + what + " waiting for rank(s) " + who};
      }
      if (idle) idle();
      next_check = now + std::chrono::milliseconds(kNapMs);
      if (ready()) return {};
      continue;  // `target` may have moved on
    }
    RankCtl& c = seg_->ctl(target);
    std::atomic<std::uint64_t>& want = seg_->want(target, index_);
    const std::uint32_t ev = c.event.load(std::memory_order_seq_cst);
    want.store(value, std::memory_order_seq_cst);
    c.sleepers.fetch_add(1, std::memory_order_seq_cst);
    // A target that publishes without a fence is ordered by this barrier
    // (publish). Should the barrier fail, its wake-up may be missed, so the
    // nap is kept short.
    const bool fenced = c.fenceless.load(std::memory_order_acquire) == 0 || global_barrier();
    if (c.progress.load(std::memory_order_seq_cst) < value) {
      auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(std::min(deadline, next_check) - now);
      if (!fenced) left = std::min<std::chrono::nanoseconds>(left, kUnfencedNap);
      const timespec ts{0, std::max<long>(1000, static_cast<long>(left.count()))};
      if (oversubscribed_) seg_->ctl(index_).asleep.store(1, std::memory_order_relaxed);
      futex(&c.event, FUTEX_WAIT, ev, &ts);
      if (oversubscribed_) seg_->ctl(index_).asleep.store(0, std::memory_order_relaxed);
    }
    c.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    want.store(kNoWant, std::memory_order_relaxed);
    if (ready()) return {};
  }
}

}  // namespace cclz::detail
