#include "shm_direct.hpp"

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <utility>

#include "shm_alloc.hpp"

namespace cclz::coll::shm {
namespace {

// What a rank writes into its slot about one of its buffers.
struct BufDesc {
  std::uint64_t addr = 0;       // in its own address space
  std::uint64_t bytes = 0;      // 0: peers do not read this buffer
  std::uint64_t id = 0;         // mem_alloc allocation id (0: none)
  std::uint64_t offset = 0;     // within the allocation
  std::uint64_t map_bytes = 0;  // the allocation's size
  std::int32_t fd = -1;         // the allocation's memfd in the owner's process
  std::int32_t pad = 0;
};
struct Descs {
  BufDesc send, recv;
};
static_assert(sizeof(Descs) + sizeof(std::uint64_t) <= detail::ShmWindow::kAgreementBytes);

// Maps a peer's buffer (fd, `bytes`, whole pages), writable: the all-reduce
// writes its results into the peers' outputs. From 2 MiB up, at a page
// offset within 2 MiB of room drawn from `seed`, not where the kernel
// would put it: the kernel stacks equal-sized mappings, so a view landed
// at the same place modulo its size as this rank's own buffer of the same
// call, and on the development host that made the in-place 256 MB
// all-reduce of two ranks 2.5x slower (docs/performance.md).
void* map_colored(int fd, std::size_t bytes, std::uint64_t seed) {
  constexpr int kProt = PROT_READ | PROT_WRITE;
  constexpr std::size_t kRoom = std::size_t{2} << 20;
  if (bytes < kRoom) return mmap(nullptr, bytes, kProt, MAP_SHARED | MAP_POPULATE, fd, 0);
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  void* area = mmap(nullptr, bytes + kRoom, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (area == MAP_FAILED) return MAP_FAILED;
  const auto lo = reinterpret_cast<std::uintptr_t>(area);
  const std::uintptr_t at = lo + (seed >> 32) % (kRoom / page) * page;
  void* p = mmap(reinterpret_cast<void*>(at), bytes, kProt, MAP_SHARED | MAP_POPULATE | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {
    munmap(area, bytes + kRoom);
    return MAP_FAILED;
  }
  // The room not used goes back.
  if (at > lo) munmap(area, at - lo);
  if (const std::uintptr_t end = at + bytes, top = lo + bytes + kRoom; end < top) {
    munmap(reinterpret_cast<void*>(end), top - end);
  }
  return p;
}

// This process's mappings of the peers' buffers, per window
// (ShmWindow::local_state), unmapped when the window goes. Bounded: the
// least recently used mapping not needed by the current call goes first.
class PeerMaps {
 public:
  static constexpr std::size_t kMaxMaps = 64;

  PeerMaps() = default;
  PeerMaps(const PeerMaps&) = delete;
  PeerMaps& operator=(const PeerMaps&) = delete;
  ~PeerMaps() {
    for (auto& [key, m] : maps_) munmap(m.base, m.bytes);
    for (auto& [r, fd] : pidfds_) close(fd);
  }

  // The base of local rank r's allocation `d`, mapped here; nullptr when it
  // cannot be (no pidfd support, no permission to take the peer's
  // descriptor, or a descriptor that does not match): the call then goes
  // staged on every rank.
  std::byte* map(int r, int pid, const BufDesc& d, std::uint64_t call) {
    const std::pair<int, std::uint64_t> key{r, d.id};
    if (auto it = maps_.find(key); it != maps_.end()) {
      it->second.used = call;
      return it->second.base;
    }
    evict(call);
    int pidfd = -1;
    if (auto it = pidfds_.find(r); it != pidfds_.end()) {
      pidfd = it->second;
    } else {
      pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
      if (pidfd < 0) return nullptr;
      pidfds_[r] = pidfd;
    }
    const int fd = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, d.fd, 0));
    if (fd < 0) return nullptr;
    struct stat sb {};
    if (fstat(fd, &sb) != 0 || sb.st_size < 0 || static_cast<std::uint64_t>(sb.st_size) < d.map_bytes) {
      close(fd);
      return nullptr;
    }
    void* p = map_colored(fd, d.map_bytes, d.id * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(pid));
    close(fd);
    if (p == MAP_FAILED) return nullptr;
    auto* base = static_cast<std::byte*>(p);
    maps_[key] = {base, d.map_bytes, call};
    return base;
  }

 private:
  struct Map {
    std::byte* base = nullptr;
    std::size_t bytes = 0;
    std::uint64_t used = 0;
  };
  void evict(std::uint64_t call) {
    while (maps_.size() >= kMaxMaps) {
      auto oldest = maps_.end();
      for (auto it = maps_.begin(); it != maps_.end(); ++it) {
        if (it->second.used != call && (oldest == maps_.end() || it->second.used < oldest->second.used)) oldest = it;
      }
      if (oldest == maps_.end()) return;
      munmap(oldest->second.base, oldest->second.bytes);
      maps_.erase(oldest);
    }
  }

  std::map<std::pair<int, std::uint64_t>, Map> maps_;
  std::map<int, int> pidfds_;
};

// ShmWindow::local_state keeps copyable objects (std::any).
struct PeerMapsHolder {
  std::shared_ptr<PeerMaps> maps = std::make_shared<PeerMaps>();
};

BufDesc describe(const void* p, std::size_t bytes) {
  BufDesc d;
  d.addr = reinterpret_cast<std::uintptr_t>(p);
  d.bytes = bytes;
  detail::SharedRange r;
  if (bytes != 0 && detail::find_shared_range(p, bytes, &r)) {
    d.id = r.id;
    d.offset = r.offset;
    d.map_bytes = r.map_bytes;
    d.fd = r.fd;
  }
  return d;
}

// Cross-memory attach as this process has found it, per window: whether each
// peer's process has been read once (the probe), and whether the kernel
// refused it for good (no permission, or no such system call), after which
// this rank no longer offers it.
struct CmaState {
  std::vector<char> probed;
  bool refused = false;
};

// One process_vm_readv/writev of n bytes, repeated over partial transfers.
// Returns 0 or the errno.
int cma_move(bool write, int pid, void* local, std::uint64_t remote, std::size_t n) {
  auto* here = static_cast<std::byte*>(local);
  while (n != 0) {
    iovec l{here, n};
    iovec r{reinterpret_cast<void*>(remote), n};
    const ssize_t got = write ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return got < 0 ? errno : EFAULT;
    here += got;
    remote += static_cast<std::uint64_t>(got);
    n -= static_cast<std::size_t>(got);
  }
  return 0;
}

Status cma_error(const Group& g, int r, bool write, std::uint64_t remote, std::size_t n, int err) {
  char range[64];
  std::snprintf(range, sizeof range, "%#llx (%zu bytes)", static_cast<unsigned long long>(remote), n);
  return {Result::invalid_usage, std::string("cross-memory attach could not ") + (write ? "write" : "read") +
                                     " rank " + std::to_string(g.global_rank(r)) + "'s buffer at " + range + ": " +
                                     std::strerror(err) + " (is the buffer as large as the call says?)"};
}

}  // namespace

Status peer_read(const Group& g, const PeerBuffers& pb, int r, void* to, const std::byte* from, std::size_t n) {
  if (n == 0) return {};
  const auto remote = reinterpret_cast<std::uintptr_t>(from);
  const int err = cma_move(false, pb.pid[static_cast<std::size_t>(r)], to, remote, n);
  return err == 0 ? Status{} : cma_error(g, r, false, remote, n, err);
}

Status peer_write(const Group& g, const PeerBuffers& pb, int r, std::byte* to, const void* from, std::size_t n) {
  if (n == 0) return {};
  const auto remote = reinterpret_cast<std::uintptr_t>(to);
  const int err = cma_move(true, pb.pid[static_cast<std::size_t>(r)], const_cast<void*>(from), remote, n);
  return err == 0 ? Status{} : cma_error(g, r, true, remote, n, err);
}

Status read_sources(const Group& g, const PeerBuffers& pb, std::size_t at, std::size_t bytes, std::size_t stride,
                    std::vector<std::byte>& scratch, std::vector<const void*>& srcs) {
  const int n = g.size(), me = g.rank();
  const std::size_t want = stride * static_cast<std::size_t>(n - 1);
  if (scratch.size() < want) scratch.resize(want);
  srcs.resize(static_cast<std::size_t>(n));
  std::byte* buf = scratch.data();
  for (int q = 0; q < n; ++q) {
    const std::byte* from = pb.send[static_cast<std::size_t>(q)] + at;
    if (q == me) {
      srcs[static_cast<std::size_t>(q)] = from;
      continue;
    }
    if (Status st = peer_read(g, pb, q, buf, from, bytes); !st.ok()) return st;
    srcs[static_cast<std::size_t>(q)] = buf;
    buf += stride;
  }
  return {};
}

Status agree_direct(Group& g, const detail::ShmWindow::CallSig& sig, const void* send, std::size_t send_bytes,
                    const void* recv, std::size_t recv_bytes, bool cma_ok, bool* direct, PeerBuffers* out,
                    std::uint64_t* chunk, const std::function<void()>& while_waiting) {
  detail::ShmWindow& w = *g.shm();
  constexpr auto K = static_cast<std::uint64_t>(detail::ShmWindow::kStages);
  const int n = g.size(), me = g.rank();
  const std::function<void()> idle = [&g] { g.progress_transport(); };
  *direct = false;
  // What this rank offers: its buffers mapped by the peers (every buffer of
  // a thread rank, only mem_alloc memory of a process), cross-memory attach
  // (any memory of a process, where the collective takes it), and whether
  // it has already read every peer's process that way.
  constexpr std::uint64_t kMappable = 1, kCma = 2, kCmaProbed = 4;
  const Descs mine{describe(send, send_bytes), describe(recv, recv_bytes)};
  auto readable = [&](const BufDesc& d) { return d.bytes == 0 || w.one_process() || d.id != 0; };
  CmaState* cma = nullptr;
  if (cma_ok && !w.one_process()) {
    cma = &w.local_state<CmaState>();
    if (cma->probed.empty()) cma->probed.assign(static_cast<std::size_t>(n), 0);
    if (cma->refused) cma = nullptr;
  }
  std::uint64_t mine_bits = readable(mine.send) && readable(mine.recv) ? kMappable : 0;
  if (cma != nullptr) {
    mine_bits |= kCma;
    bool all_probed = true;
    for (int r = 0; r < n; ++r) all_probed = all_probed && (r == me || cma->probed[static_cast<std::size_t>(r)] != 0);
    if (all_probed) mine_bits |= kCmaProbed;
  }

  // One chunk: descriptors and the bits into this rank's slot, stage 1
  // published. A rank that offers nothing knows the answer (staged) and
  // does not wait: it publishes the chunk as done at once, which also
  // satisfies the others' wait, so heap buffers below cma_min_bytes cost no
  // hand-off. The others wait, read every rank's bits and decide alike.
  const std::uint64_t G = w.next_chunk();
  *chunk = G;
  const auto slots = static_cast<std::uint64_t>(w.slots());
  if (G >= slots) {
    if (Status st = w.wait({}, K * (G - slots + 1), g.deadline(), idle, "direct-path agreement"); !st.ok()) return st;
  }
  w.set_call_sig(G, sig);
  std::byte* words = w.agreement(me, G);
  std::memcpy(words, &mine, sizeof mine);
  std::memcpy(words + sizeof mine, &mine_bits, sizeof mine_bits);
  w.advance_agreement();
  if ((mine_bits & (kMappable | kCma)) == 0) {
    w.publish(K * (G + 1));
    return {};
  }
  w.publish(K * G + 1);
  // Heap buffers: every rank offering cross-memory attach is about to wait.
  if ((mine_bits & kMappable) == 0 && while_waiting) while_waiting();
  if (Status st = w.wait({}, K * G + 1, g.deadline(), idle, "direct-path agreement"); !st.ok()) return st;
  std::vector<Descs> descs(static_cast<std::size_t>(n));
  std::uint64_t all_bits = kMappable | kCma | kCmaProbed;
  for (int r = 0; r < n; ++r) {
    if (r != me) {
      if (const auto theirs = w.call_sig(r, G); !(theirs == sig)) return sig_mismatch(g, r, sig, theirs);
    }
    std::uint64_t bits = 0;
    std::memcpy(&descs[static_cast<std::size_t>(r)], w.agreement(r, G), sizeof(Descs));
    std::memcpy(&bits, w.agreement(r, G) + sizeof(Descs), sizeof bits);
    all_bits &= bits;
  }
  w.publish(K * (G + 1));
  const bool via_cma = (all_bits & kMappable) == 0;
  if (via_cma && (all_bits & kCma) == 0) return {};

  out->send.assign(static_cast<std::size_t>(n), nullptr);
  out->recv.assign(static_cast<std::size_t>(n), nullptr);
  bool reached = true;
  if (via_cma) {
    // Every rank offered cross-memory attach: the peers' addresses as they
    // are. A first call reads a byte of each peer's buffer, and the ranks
    // agree, in one more hand-off, that every one of them could.
    out->cma = true;
    out->pid.assign(static_cast<std::size_t>(n), 0);
    for (int r = 0; r < n; ++r) {
      const Descs& d = descs[static_cast<std::size_t>(r)];
      out->send[static_cast<std::size_t>(r)] = reinterpret_cast<const std::byte*>(d.send.addr);
      out->recv[static_cast<std::size_t>(r)] = reinterpret_cast<std::byte*>(d.recv.addr);
      out->pid[static_cast<std::size_t>(r)] = w.pid(r);
    }
    if ((all_bits & kCmaProbed) != 0) {
      *direct = true;
      w.count_direct(false);
      return {};
    }
    for (int r = 0; r < n && reached; ++r) {
      const Descs& d = descs[static_cast<std::size_t>(r)];
      const BufDesc& probe = d.send.bytes != 0 ? d.send : d.recv;
      if (r == me || probe.bytes == 0) continue;
      std::byte b{};
      const int err = cma_move(false, w.pid(r), &b, probe.addr, 1);
      if (err == 0) {
        cma->probed[static_cast<std::size_t>(r)] = 1;
      } else {
        reached = false;
        // Refused for good: stop offering it; a bad address is this call's.
        if (err == EPERM || err == ENOSYS || err == ESRCH) cma->refused = true;
      }
    }
  } else {
    PeerMaps& maps = *w.local_state<PeerMapsHolder>().maps;
    // Rank r's buffer `desc` as mapped here; clears `reached` when it cannot be.
    auto resolve = [&](int r, const BufDesc& desc) -> std::byte* {
      if (desc.bytes == 0 || !reached) return nullptr;
      std::byte* p = nullptr;
      if (r == me || w.one_process()) {
        p = reinterpret_cast<std::byte*>(desc.addr);
      } else if (std::byte* base = maps.map(r, w.pid(r), desc, g.seq()); base != nullptr) {
        p = base + desc.offset;
      }
      reached = p != nullptr;
      return p;
    };
    for (int r = 0; r < n && reached; ++r) {
      const Descs& d = descs[static_cast<std::size_t>(r)];
      out->send[static_cast<std::size_t>(r)] = resolve(r, d.send);
      out->recv[static_cast<std::size_t>(r)] = resolve(r, d.recv);
    }
    if (w.one_process()) {
      *direct = true;  // nothing was mapped: every rank succeeded alike
      w.count_direct(true);
      return {};
    }
  }
  // Whether every rank reached everything: one more hand-off.
  bool all_reached = true;
  auto agree = [&](std::size_t, std::uint64_t s, int t) {
    if (t == 0) {
      *reinterpret_cast<volatile std::uint64_t*>(w.slot(me, s)) = reached ? 1 : 0;
      return;
    }
    for (int r = 0; r < n; ++r) {
      all_reached = all_reached && *reinterpret_cast<const volatile std::uint64_t*>(w.slot(r, s)) == 1;
    }
  };
  if (Status st = run_pipeline(g, sig, 1, 2, agree, [](int) { return Deps::all(); }, "direct-path agreement");
      !st.ok()) {
    return st;
  }
  *direct = all_reached;
  if (all_reached) w.count_direct(!via_cma);
  return {};
}

}  // namespace cclz::coll::shm
