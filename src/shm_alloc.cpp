#include "shm_alloc.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "cclz/cclz.hpp"
#include "log.hpp"

namespace cclz {
namespace detail {
namespace {

struct Allocation {
  std::size_t bytes = 0;  // mapped, whole pages
  int fd = -1;
  std::uint64_t id = 0;
  // register_buffer: the caller's pages, moved into the memfd in place, and
  // how many registrations hold them (0: a mem_alloc allocation).
  unsigned registrations = 0;
  // A registered range found no longer backed by its memfd (freed without
  // deregister_buffer): never offered to peers again.
  bool stale = false;
  std::uint32_t lookups = 0;  // of a registered range: when find_shared_range checks it
};

// The process's live allocations and registered ranges by base address.
struct Registry {
  std::mutex mu;
  std::map<std::uintptr_t, Allocation> live;
  std::uint64_t next_id = 1;
  int pagemap = -2;  // /proc/self/pagemap, opened at the first check; -1: unreadable
};

// Never destroyed: a buffer may be freed after static destructors have
// begun (a torch tensor's deleter during interpreter exit, an atexit
// handler), and mem_free must still find its entry then.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

std::size_t page_size() { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }

// Whether the page at `page` still maps shared memory (the registration's
// memfd), as far as this process can tell without writing to it: its
// pagemap entry says "file page or shared anonymous" (bit 61), or, not
// present in the page table, the page is resident (mincore) as a shared
// page that was dropped from the table would be. A range freed without
// deregister_buffer and mapped again privately fails both. Unreadable
// pagemap: assumed still mapped (the check is a guard, not the contract).
bool still_shared(Registry& r, std::uintptr_t page) noexcept {
  if (r.pagemap == -2) r.pagemap = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (r.pagemap < 0) return true;
  std::uint64_t e = 0;
  const auto at = static_cast<off_t>(page / page_size() * sizeof e);
  if (pread(r.pagemap, &e, sizeof e, at) != static_cast<ssize_t>(sizeof e)) return true;
  constexpr std::uint64_t kPresent = std::uint64_t{1} << 63, kSwapped = std::uint64_t{1} << 62,
                          kFileOrShared = std::uint64_t{1} << 61;
  if ((e & kPresent) != 0) return (e & kFileOrShared) != 0;
  if ((e & kSwapped) != 0) return false;  // swapped anonymous memory is private
  unsigned char resident = 0;
  return mincore(reinterpret_cast<void*>(page), page_size(), &resident) == 0 && (resident & 1) != 0;
}

// The registry entry holding [a, a + bytes), or end().
std::map<std::uintptr_t, Allocation>::iterator holding(Registry& r, std::uintptr_t a, std::size_t bytes) {
  auto it = r.live.upper_bound(a);
  if (it == r.live.begin()) return r.live.end();
  --it;
  const std::size_t off = a - it->first;
  if (off >= it->second.bytes || bytes > it->second.bytes - off) return r.live.end();
  return it;
}

}  // namespace

bool find_shared_range(const void* p, std::size_t bytes, SharedRange* out) noexcept {
  if (p == nullptr || bytes == 0) return false;
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = holding(r, a, bytes);
  if (it == r.live.end() || it->second.stale) return false;
  // The check costs a read of /proc/self/pagemap (1-2 us): every lookup of
  // 4 MiB or more, every 64th of less.
  const bool check = it->second.registrations != 0 &&
                     (bytes >= (std::size_t{4} << 20) || it->second.lookups++ % 64 == 0);
  if (check && !still_shared(r, it->first)) {
    it->second.stale = true;
    char msg[200];
    std::snprintf(msg, sizeof msg,
                  "the buffer registered at %p is no longer mapped from its shared memory (freed or unmapped "
                  "without deregister_buffer): it goes the staged way from now on",
                  p);
    log::write(LogLevel::warn, -1, msg);
    return false;
  }
  *out = {it->second.fd, it->second.id, a - it->first, it->second.bytes};
  return true;
}

// A memfd of `bytes` (whole pages) with its pages reserved now, so that an
// exhausted shared-memory limit is an error here, not a SIGBUS on first
// touch inside a collective. `who` names the caller in errors.
Status reserved_memfd(const char* name, std::size_t bytes, const std::string& who, int* fd_out) {
  auto fail = [&](const char* what, int fd) {
    const int e = errno;
    if (fd >= 0) close(fd);
    return Status(Result::system_error, who + ": " + what + ": " + std::strerror(e));
  };
  const int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return fail("memfd_create", -1);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) return fail("ftruncate", fd);
  if (const int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); rc != 0) {
    errno = rc;
    return fail("reserving the pages", fd);
  }
  *fd_out = fd;
  return {};
}

// Why [lo, hi) cannot be registered, from /proc/self/maps: "" when every
// page of it lies in private anonymous read-write mappings (the heap,
// anonymous mmap), the only memory whose pages can move into a memfd
// without changing what the program sees, or in registered ranges. Files,
// the stack, read-only and huge-page mappings, and holes are refused.
std::string unregistrable(std::uintptr_t lo, std::uintptr_t hi) {
  std::FILE* f = std::fopen("/proc/self/maps", "re");
  if (f == nullptr) return std::string("cannot read /proc/self/maps: ") + std::strerror(errno);
  std::uintptr_t covered = lo;
  char line[4096];
  std::string why;
  while (covered < hi && why.empty() && std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long start = 0, end = 0, inode = 0;
    char perms[8] = {}, dev[16] = {};
    unsigned long long offset = 0;
    int path_at = 0;
    if (std::sscanf(line, "%lx-%lx %7s %llx %15s %lu %n", &start, &end, perms, &offset, dev, &inode, &path_at) < 6) {
      continue;
    }
    if (end <= covered) continue;
    if (start > covered) {
      why = "it is not mapped at " + std::to_string(covered - lo) + " bytes past its first page";
      break;
    }
    std::string_view path(line + path_at);
    while (!path.empty() && (path.back() == '\n' || path.back() == ' ')) path.remove_suffix(1);
    const bool anonymous = inode == 0 && (path.empty() || path == "[heap]" || path.starts_with("[anon:"));
    // A registered range being merged with this one.
    const bool ours = std::string_view(perms) == "rw-s" && path == "/memfd:cclz-registered (deleted)";
    if (!ours && (std::string_view(perms) != "rw-p" || !anonymous)) {
      why = "it lies in a mapping that is not private anonymous read-write memory (";
      why.append(perms);
      if (!path.empty()) why.append(" ").append(path);
      why.append(")");
      break;
    }
    covered = end;
  }
  std::fclose(f);
  if (why.empty() && covered < hi) why = "its end is not mapped";
  return why;
}

}  // namespace detail

Status mem_alloc(void** ptr, std::size_t bytes) {
  if (ptr == nullptr) return {Result::invalid_argument, "mem_alloc: null result pointer"};
  *ptr = nullptr;
  if (bytes == 0) return {};
  const std::size_t page = detail::page_size();
  if (bytes > (std::size_t{1} << 46)) {
    return {Result::invalid_argument, "mem_alloc: " + std::to_string(bytes) + " bytes is more than any host has"};
  }
  const std::size_t mapped = (bytes + page - 1) / page * page;
  const std::string who = "mem_alloc of " + std::to_string(bytes) + " bytes";
  int fd = -1;
  if (Status st = detail::reserved_memfd("cclz-buffer", mapped, who, &fd); !st.ok()) return st;
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    close(fd);
    return {Result::system_error, who + ": mmap: " + std::strerror(e)};
  }
  detail::Registry& r = detail::registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.live[reinterpret_cast<std::uintptr_t>(p)] = {mapped, fd, r.next_id++};
  }
  *ptr = p;
  return {};
}

Status mem_free(void* ptr) {
  if (ptr == nullptr) return {};
  detail::Registry& r = detail::registry();
  detail::Allocation a;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.live.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == r.live.end() || it->second.registrations != 0) {
      return {Result::invalid_argument, "mem_free: the pointer was not returned by mem_alloc, or was freed already"};
    }
    a = it->second;
    r.live.erase(it);
  }
  munmap(ptr, a.bytes);
  close(a.fd);
  return {};
}

Status register_buffer(void* ptr, std::size_t bytes) {
  if (ptr == nullptr || bytes == 0) {
    return {Result::invalid_argument, "register_buffer: " + std::string(ptr == nullptr ? "null pointer" : "0 bytes")};
  }
  const std::size_t page = detail::page_size();
  const auto a = reinterpret_cast<std::uintptr_t>(ptr);
  if (bytes > (std::size_t{1} << 46) || a > UINTPTR_MAX - bytes - page) {
    return {Result::invalid_argument, "register_buffer: " + std::to_string(bytes) + " bytes at " +
                                          std::to_string(a) + " is past the end of the address space"};
  }
  const std::uintptr_t lo = a / page * page, hi = (a + bytes + page - 1) / page * page;  // overlap checks
  const std::string who = "register_buffer of " + std::to_string(bytes) + " bytes";
  detail::Registry& r = detail::registry();
  std::lock_guard<std::mutex> lock(r.mu);
  // A stale range (freed without deregister_buffer) overlapping this one is
  // forgotten: its pages are the program's again.
  for (auto it = r.live.begin(); it != r.live.end();) {
    if (it->second.stale && it->first < hi && it->first + it->second.bytes > lo) {
      close(it->second.fd);
      it = r.live.erase(it);
    } else {
      ++it;
    }
  }
  if (auto it = detail::holding(r, a, bytes); it != r.live.end()) {
    // Already readable in place: a mem_alloc buffer, or (part of) a range
    // registered before, which now has one registration more.
    if (it->second.registrations != 0) ++it->second.registrations;
    return {};
  }
  // Whole pages only: registering copies the pages and maps the copy over
  // them, and bytes of a page outside the buffer that another thread wrote
  // meanwhile (a neighbouring heap object, the allocator's own) would be lost.
  if (a % page != 0 || bytes % page != 0) {
    return {Result::invalid_argument,
            who + " at " + std::to_string(a) + ": the address and the size must be multiples of the page size (" +
                std::to_string(page) + " bytes), so that the pages moved hold nothing but the buffer " +
                "(allocate it with aligned_alloc or mmap)"};
  }
  // Registered ranges that overlap this one merge with it into one range,
  // one memfd, holding all their registrations: a peer maps one memfd per
  // buffer.
  std::uintptr_t ulo = lo, uhi = hi;
  unsigned held = 0;
  std::vector<std::map<std::uintptr_t, detail::Allocation>::iterator> merged;
  for (auto it = r.live.lower_bound(lo); it != r.live.begin();) {
    --it;
    if (it->first + it->second.bytes <= lo) break;
    merged.push_back(it);
  }
  for (auto it = r.live.lower_bound(lo); it != r.live.end() && it->first < hi; ++it) merged.push_back(it);
  for (auto it : merged) {
    if (it->second.registrations == 0) {
      return {Result::invalid_argument, who + ": its pages overlap, in part, a buffer allocated by mem_alloc"};
    }
    ulo = std::min(ulo, it->first);
    uhi = std::max(uhi, it->first + it->second.bytes);
    held += it->second.registrations;
  }
  if (std::string why = detail::unregistrable(ulo, uhi); !why.empty()) {
    return {Result::invalid_argument, who + ": " + why};
  }
  const std::size_t len = uhi - ulo;
  int fd = -1;
  if (Status st = detail::reserved_memfd("cclz-registered", len, who, &fd); !st.ok()) return st;
  // Copy the pages into the memfd, then map the memfd over them: the
  // program sees the same bytes at the same addresses, now in pages the
  // node's peers can map. Another thread must not write the range meanwhile.
  auto fail = [&](const char* what) {
    const int e = errno;
    close(fd);
    return Status(Result::system_error, who + ": " + what + ": " + std::strerror(e));
  };
  void* alias = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (alias == MAP_FAILED) return fail("mmap");
  auto* base = reinterpret_cast<void*>(ulo);
  std::memcpy(alias, base, len);
  const bool mapped =
      mmap(base, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE, fd, 0) != MAP_FAILED;
  const int map_errno = errno;
  if (!mapped) {
    // The old pages may be gone already: private ones back, with the bytes
    // (and the merged registrations with them).
    if (mmap(base, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED) {
      std::memcpy(base, alias, len);
    }
  }
  munmap(alias, len);
  for (auto it : merged) {
    close(it->second.fd);
    r.live.erase(it);
  }
  if (!mapped) {
    errno = map_errno;
    return fail(merged.empty() ? "mapping the memfd over the buffer"
                               : "mapping the memfd over the buffer (the registrations it shared pages with are gone)");
  }
  r.live[ulo] = {len, fd, r.next_id++, held + 1};
  return {};
}

Status deregister_buffer(void* ptr) {
  if (ptr == nullptr) return {Result::invalid_argument, "deregister_buffer: null pointer"};
  detail::Registry& r = detail::registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = detail::holding(r, reinterpret_cast<std::uintptr_t>(ptr), 1);
  if (it == r.live.end()) {
    return {Result::invalid_argument, "deregister_buffer: the pointer is not in a registered buffer"};
  }
  detail::Allocation& e = it->second;
  if (e.registrations == 0 || --e.registrations != 0) return {};  // mem_alloc memory, or still registered
  const std::uintptr_t lo = it->first;
  const std::size_t len = e.bytes;
  const int fd = e.fd;
  const bool stale = e.stale;
  r.live.erase(it);
  // A stale range's pages are no longer the registration's: leave them be.
  Status st;
  if (!stale) {
    // Private pages again, with the same bytes, copied from the memfd. (Not
    // mremap of a private copy: UCX's memory hooks pass mremap no new
    // address.)
    auto* base = reinterpret_cast<void*>(lo);
    auto fail = [&](const char* what) {
      st = {Result::system_error, std::string("deregister_buffer: ") + what + ": " + std::strerror(errno)};
    };
    void* alias = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (alias == MAP_FAILED) {
      // The buffer stays in shared pages, which the program reads and
      // writes as before; only a later fork() sees the difference.
      fail("could not map its pages a second time to copy them");
    } else {
      constexpr int kPrivate = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_POPULATE;
      if (mmap(base, len, PROT_READ | PROT_WRITE, kPrivate, -1, 0) != MAP_FAILED) {
        std::memcpy(base, alias, len);
      } else {
        fail("could not map private pages over it");
        (void)mmap(base, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
      }
      munmap(alias, len);
    }
  }
  close(fd);
  return st;
}

}  // namespace cclz
