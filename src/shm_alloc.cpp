#include "shm_alloc.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <string>

#include "cclz/cclz.hpp"

namespace cclz {
namespace detail {
namespace {

struct Allocation {
  std::size_t bytes = 0;  // mapped, whole pages
  int fd = -1;
  std::uint64_t id = 0;
};

// The process's live allocations by base address.
struct Registry {
  std::mutex mu;
  std::map<std::uintptr_t, Allocation> live;
  std::uint64_t next_id = 1;
};

// Never destroyed: a buffer may be freed after static destructors have
// begun (a torch tensor's deleter during interpreter exit, an atexit
// handler), and mem_free must still find its entry then.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

}  // namespace

bool find_shared_range(const void* p, std::size_t bytes, SharedRange* out) noexcept {
  if (p == nullptr || bytes == 0) return false;
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.live.upper_bound(a);
  if (it == r.live.begin()) return false;
  --it;
  const std::size_t off = a - it->first;
  if (off >= it->second.bytes || bytes > it->second.bytes - off) return false;
  *out = {it->second.fd, it->second.id, off, it->second.bytes};
  return true;
}

}  // namespace detail

Status mem_alloc(void** ptr, std::size_t bytes) {
  if (ptr == nullptr) return {Result::invalid_argument, "mem_alloc: null result pointer"};
  *ptr = nullptr;
  if (bytes == 0) return {};
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  if (bytes > (std::size_t{1} << 46)) {
    return {Result::invalid_argument, "mem_alloc: " + std::to_string(bytes) + " bytes is more than any host has"};
  }
  const std::size_t mapped = (bytes + page - 1) / page * page;
  auto fail = [&](const char* what, int fd) {
    const int e = errno;
    if (fd >= 0) close(fd);
    return Status(Result::system_error, std::string("mem_alloc of ") + std::to_string(bytes) + " bytes: " + what +
                                            ": " + std::strerror(e));
  };
  const int fd = memfd_create("cclz-buffer", MFD_CLOEXEC);
  if (fd < 0) return fail("memfd_create", -1);
  if (ftruncate(fd, static_cast<off_t>(mapped)) != 0) return fail("ftruncate", fd);
  // Reserve the pages now: an exhausted shared-memory limit is an error
  // here, not a SIGBUS on first touch inside a collective.
  if (const int rc = posix_fallocate(fd, 0, static_cast<off_t>(mapped)); rc != 0) {
    errno = rc;
    return fail("reserving the pages", fd);
  }
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail("mmap", fd);
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
    if (it == r.live.end()) {
      return {Result::invalid_argument, "mem_free: the pointer was not returned by mem_alloc, or was freed already"};
    }
    a = it->second;
    r.live.erase(it);
  }
  munmap(ptr, a.bytes);
  close(a.fd);
  return {};
}

}  // namespace cclz
