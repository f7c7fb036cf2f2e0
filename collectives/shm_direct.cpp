#include "shm_direct.hpp"

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

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

// This process's read-only mappings of the peers' buffers, per window
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
    // Writable: the all-reduce writes its results into the peers' outputs.
    void* p = mmap(nullptr, d.map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
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

}  // namespace

Status agree_direct(Group& g, const detail::ShmWindow::CallSig& sig, const void* send, std::size_t send_bytes,
                    const void* recv, std::size_t recv_bytes, bool* direct, PeerBuffers* out) {
  detail::ShmWindow& w = *g.shm();
  constexpr auto K = static_cast<std::uint64_t>(detail::ShmWindow::kStages);
  const int n = g.size(), me = g.rank();
  const std::function<void()> idle = [&g] { g.progress_transport(); };
  *direct = false;
  // Whether the peers can read this rank's buffers: every buffer of a
  // thread rank, only mem_alloc memory of a process.
  const Descs mine{describe(send, send_bytes), describe(recv, recv_bytes)};
  auto readable = [&](const BufDesc& d) { return d.bytes == 0 || w.one_process() || d.id != 0; };
  const std::uint64_t mine_readable = readable(mine.send) && readable(mine.recv) ? 1 : 0;

  // One chunk: descriptors and the readable bit into this rank's slot,
  // stage 1 published. A rank whose own buffers cannot be read knows the
  // answer (staged) and does not wait: it publishes the chunk as done at
  // once, which also satisfies the others' wait, so heap buffers cost no
  // hand-off. The others wait, read every rank's bit and decide alike.
  const std::uint64_t G = w.next_chunk();
  const auto slots = static_cast<std::uint64_t>(w.slots());
  if (G >= slots) {
    if (Status st = w.wait({}, K * (G - slots + 1), g.deadline(), idle, "direct-path agreement"); !st.ok()) return st;
  }
  w.set_call_sig(G, sig);
  std::byte* slot = w.slot(me, G);
  std::memcpy(slot, &mine, sizeof mine);
  std::memcpy(slot + sizeof mine, &mine_readable, sizeof mine_readable);
  w.advance(1);
  if (mine_readable == 0) {
    w.publish(K * (G + 1));
    return {};
  }
  w.publish(K * G + 1);
  if (Status st = w.wait({}, K * G + 1, g.deadline(), idle, "direct-path agreement"); !st.ok()) return st;
  std::vector<Descs> descs(static_cast<std::size_t>(n));
  bool all_readable = true;
  for (int r = 0; r < n; ++r) {
    if (r != me) {
      if (const auto theirs = w.call_sig(r, G); !(theirs == sig)) return sig_mismatch(g, r, sig, theirs);
    }
    std::uint64_t bit = 0;
    std::memcpy(&descs[static_cast<std::size_t>(r)], w.slot(r, G), sizeof(Descs));
    std::memcpy(&bit, w.slot(r, G) + sizeof(Descs), sizeof bit);
    all_readable = all_readable && bit == 1;
  }
  w.publish(K * (G + 1));
  if (!all_readable) return {};

  out->send.assign(static_cast<std::size_t>(n), nullptr);
  out->recv.assign(static_cast<std::size_t>(n), nullptr);
  bool mapped = true;
  PeerMaps& maps = *w.local_state<PeerMapsHolder>().maps;
  // Rank r's buffer `desc` as mapped here; clears `mapped` when it cannot be.
  auto resolve = [&](int r, const BufDesc& desc) -> std::byte* {
    if (desc.bytes == 0 || !mapped) return nullptr;
    std::byte* p = nullptr;
    if (r == me || w.one_process()) {
      p = reinterpret_cast<std::byte*>(desc.addr);
    } else if (std::byte* base = maps.map(r, w.pid(r), desc, g.seq()); base != nullptr) {
      p = base + desc.offset;
    }
    mapped = p != nullptr;
    return p;
  };
  for (int r = 0; r < n && mapped; ++r) {
    const Descs& d = descs[static_cast<std::size_t>(r)];
    out->send[static_cast<std::size_t>(r)] = resolve(r, d.send);
    out->recv[static_cast<std::size_t>(r)] = resolve(r, d.recv);
  }
  if (w.one_process()) {
    *direct = true;  // nothing was mapped: every rank succeeded alike
    w.count_direct();
    return {};
  }
  // Whether every rank mapped everything: one more hand-off.
  bool all_mapped = true;
  auto agree = [&](std::size_t, std::uint64_t s, int t) {
    if (t == 0) {
      *reinterpret_cast<volatile std::uint64_t*>(w.slot(me, s)) = mapped ? 1 : 0;
      return;
    }
    for (int r = 0; r < n; ++r) {
      all_mapped = all_mapped && *reinterpret_cast<const volatile std::uint64_t*>(w.slot(r, s)) == 1;
    }
  };
  if (Status st = run_pipeline(g, sig, 1, 2, agree, [](int) { return Deps::all(); }, "direct-path agreement");
      !st.ok()) {
    return st;
  }
  *direct = all_mapped;
  if (all_mapped) w.count_direct();
  return {};
}

Status fence(Group& g, const detail::ShmWindow::CallSig& sig, const char* name) {
  return run_pipeline(g, sig, 1, 2, [](std::size_t, std::uint64_t, int) {}, [](int) { return Deps::all(); }, name);
}

}  // namespace cclz::coll::shm
