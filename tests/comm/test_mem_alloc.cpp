// cclz::mem_alloc / mem_free, register_buffer / deregister_buffer and
// their C forms: sizes, alignment, zeroed memory, the registry lookup the
// direct path relies on, pages that really are shared while registered and
// private again after, and the errors (null result pointer, foreign or
// freed pointers, memory that cannot be registered) that must change
// nothing.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "cclz/cclz.h"
#include "cclz/cclz.hpp"
#include "shm_alloc.hpp"

namespace cclz {
namespace {

TEST(MemAlloc, ZeroedPageAlignedAndFound) {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  void* p = nullptr;
  ASSERT_TRUE(mem_alloc(&p, 10000).ok());
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % page, 0u);
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < 10000; ++i) ASSERT_EQ(b[i], 0) << i;
  std::memset(p, 0x5a, 10000);

  detail::SharedRange r;
  ASSERT_TRUE(detail::find_shared_range(static_cast<char*>(p) + 100, 900, &r));
  EXPECT_EQ(r.offset, 100u);
  EXPECT_GE(r.map_bytes, 10000u);
  EXPECT_EQ(r.map_bytes % page, 0u);
  EXPECT_GE(r.fd, 0);
  // Within the mapped pages, and not past them, nor before the allocation.
  EXPECT_TRUE(detail::find_shared_range(p, r.map_bytes, &r));
  EXPECT_FALSE(detail::find_shared_range(p, r.map_bytes + 1, &r));
  EXPECT_FALSE(detail::find_shared_range(static_cast<char*>(p) - 1, 2, &r));
  EXPECT_FALSE(detail::find_shared_range(p, 0, &r));
  int on_stack = 0;
  EXPECT_FALSE(detail::find_shared_range(&on_stack, sizeof on_stack, &r));

  ASSERT_TRUE(mem_free(p).ok());
  EXPECT_FALSE(detail::find_shared_range(p, 1, &r)) << "a freed buffer is still registered";
}

// Documented: the pages are shared with a child forked after the
// allocation, not copied on write.
TEST(MemAlloc, ForkedChildWritesIntoTheParentsBuffer) {
  void* p = nullptr;
  ASSERT_TRUE(mem_alloc(&p, 4096).ok());
  auto* bytes = static_cast<unsigned char*>(p);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    bytes[100] = 0x5a;
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(bytes[100], 0x5a);
  EXPECT_TRUE(mem_free(p).ok());
}

TEST(MemAlloc, IdsAreNeverReused) {
  void* a = nullptr;
  ASSERT_TRUE(mem_alloc(&a, 4096).ok());
  detail::SharedRange ra, rb;
  ASSERT_TRUE(detail::find_shared_range(a, 1, &ra));
  ASSERT_TRUE(mem_free(a).ok());
  void* b = nullptr;
  ASSERT_TRUE(mem_alloc(&b, 4096).ok());
  ASSERT_TRUE(detail::find_shared_range(b, 1, &rb));
  EXPECT_NE(ra.id, rb.id);
  ASSERT_TRUE(mem_free(b).ok());
}

TEST(MemAlloc, ZeroBytesAndNullPointers) {
  void* p = reinterpret_cast<void*>(0x1);
  ASSERT_TRUE(mem_alloc(&p, 0).ok());
  EXPECT_EQ(p, nullptr);
  EXPECT_TRUE(mem_free(nullptr).ok());
  const Status st = mem_alloc(nullptr, 64);
  EXPECT_EQ(st.code(), Result::invalid_argument);
}

TEST(MemAlloc, ForeignOrFreedPointersAreRefusedAndFreeNothing) {
  void* p = nullptr;
  ASSERT_TRUE(mem_alloc(&p, 8192).ok());
  std::vector<char> heap(64);
  Status st = mem_free(heap.data());
  EXPECT_EQ(st.code(), Result::invalid_argument);
  EXPECT_NE(st.message().find("mem_alloc"), std::string::npos) << st.message();
  // Inside the allocation but not its start: refused, and the buffer lives on.
  st = mem_free(static_cast<char*>(p) + 64);
  EXPECT_EQ(st.code(), Result::invalid_argument);
  std::memset(p, 1, 8192);
  ASSERT_TRUE(mem_free(p).ok());
  EXPECT_EQ(mem_free(p).code(), Result::invalid_argument) << "a second free was accepted";
}

TEST(MemAlloc, TooLargeIsAnErrorNotACrash) {
  void* p = nullptr;
  const Status st = mem_alloc(&p, std::size_t{1} << 62);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(p, nullptr);
}

TEST(MemAlloc, CApi) {
  void* p = nullptr;
  ASSERT_EQ(cclzMemAlloc(&p, 1000), cclzSuccess);
  ASSERT_NE(p, nullptr);
  static_cast<char*>(p)[999] = 7;
  EXPECT_EQ(cclzMemFree(p), cclzSuccess);
  EXPECT_EQ(cclzMemFree(p), cclzInvalidArgument);
  EXPECT_NE(std::strstr(cclzGetLastError(nullptr), "mem_alloc"), nullptr) << cclzGetLastError(nullptr);
  EXPECT_EQ(cclzMemAlloc(nullptr, 10), cclzInvalidArgument);
  EXPECT_EQ(cclzMemFree(nullptr), cclzSuccess);
}

std::size_t page_size() { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }

// The path column of the /proc/self/maps line that holds `p` ("" for
// anonymous memory, "?" when no line does).
std::string mapping_of(const void* p) {
  std::ifstream maps("/proc/self/maps");
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  for (std::string line; std::getline(maps, line);) {
    unsigned long start = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &start, &end) != 2 || a < start || a >= end) continue;
    std::size_t field = 0, i = 0;
    while (i < line.size() && field < 5) {  // past range, perms, offset, dev, inode
      while (i < line.size() && line[i] != ' ') ++i;
      while (i < line.size() && line[i] == ' ') ++i;
      ++field;
    }
    return line.substr(i);
  }
  return "?";
}

// Whether a child forked now sees its write to *b in the parent.
bool child_write_shows(unsigned char* b, unsigned char v) {
  const pid_t child = fork();
  if (child == 0) {
    *b = v;
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  return *b == v;
}

void fill(unsigned char* b, std::size_t n, unsigned seed) {
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>(i * 31 + seed);
}
bool filled(const unsigned char* b, std::size_t n, unsigned seed) {
  for (std::size_t i = 0; i < n; ++i) {
    if (b[i] != static_cast<unsigned char>(i * 31 + seed)) return false;
  }
  return true;
}

// A heap buffer of whole pages: registered, the same bytes at the same
// address, in pages shared with the memfd the peers map (a write through
// one shows through the other, and in a forked child's writes);
// deregistered, the same bytes in private pages again.
TEST(RegisterBuffer, SameBytesSharedPagesThenPrivateAgain) {
  const std::size_t page = page_size(), n = 3 * page;
  std::unique_ptr<unsigned char, decltype(&std::free)> owner(static_cast<unsigned char*>(std::aligned_alloc(page, n)),
                                                            &std::free);
  unsigned char* b = owner.get();
  fill(b, n, 7);
  ASSERT_TRUE(register_buffer(b, n).ok());
  EXPECT_TRUE(filled(b, n, 7));
  detail::SharedRange r;
  ASSERT_TRUE(detail::find_shared_range(b + 40, n - 40, &r));
  EXPECT_EQ(r.offset, 40u);
  ASSERT_TRUE(detail::find_shared_range(b, n, &r));
  EXPECT_EQ(r.offset, 0u);
  EXPECT_EQ(r.map_bytes, n);
  EXPECT_NE(mapping_of(b).find("cclz-registered"), std::string::npos) << mapping_of(b);
  b[5] = 0xee;
  unsigned char via_fd = 0;
  ASSERT_EQ(pread(r.fd, &via_fd, 1, static_cast<off_t>(r.offset + 5)), 1);
  EXPECT_EQ(via_fd, 0xee);
  const unsigned char from_fd = 0x11;
  ASSERT_EQ(pwrite(r.fd, &from_fd, 1, static_cast<off_t>(r.offset + n - 1)), 1);
  EXPECT_EQ(b[n - 1], 0x11);
  EXPECT_TRUE(child_write_shows(b + 9, 0x99)) << "registered pages should be shared with a forked child";

  ASSERT_TRUE(deregister_buffer(b + n / 2).ok());
  EXPECT_FALSE(detail::find_shared_range(b, 1, &r));
  EXPECT_EQ(mapping_of(b).find("memfd"), std::string::npos) << mapping_of(b);
  EXPECT_EQ(b[5], 0xee);
  EXPECT_EQ(b[9], 0x99);
  EXPECT_EQ(b[n - 1], 0x11);
  b[5] = static_cast<unsigned char>(5 * 31 + 7);
  b[9] = static_cast<unsigned char>(9 * 31 + 7);
  b[n - 1] = static_cast<unsigned char>((n - 1) * 31 + 7);
  EXPECT_TRUE(filled(b, n, 7));
  EXPECT_FALSE(child_write_shows(b + 9, 0x42)) << "deregistered pages should be copied on write again";
}

// Registrations nest: the same range or a part of it counts one more, and
// only the last deregistration makes the pages private. A mem_alloc
// buffer needs none: registering and deregistering it changes nothing.
TEST(RegisterBuffer, CountsRegistrationsAndAcceptsMemAlloc) {
  const std::size_t page = page_size();
  void* m = mmap(nullptr, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* b = static_cast<unsigned char*>(m);
  fill(b, 4 * page, 3);
  detail::SharedRange r;
  ASSERT_TRUE(register_buffer(b, 4 * page).ok());
  ASSERT_TRUE(register_buffer(b + page, 10).ok());
  ASSERT_TRUE(deregister_buffer(b).ok());
  EXPECT_TRUE(detail::find_shared_range(b, 4 * page, &r)) << "one registration is left";
  ASSERT_TRUE(deregister_buffer(b + page).ok());
  EXPECT_FALSE(detail::find_shared_range(b, 1, &r));
  EXPECT_EQ(deregister_buffer(b).code(), Result::invalid_argument);
  EXPECT_TRUE(filled(b, 4 * page, 3));
  munmap(m, 4 * page);

  void* p = nullptr;
  ASSERT_TRUE(mem_alloc(&p, 8192).ok());
  ASSERT_TRUE(register_buffer(static_cast<char*>(p) + 10, 100).ok());
  ASSERT_TRUE(deregister_buffer(static_cast<char*>(p) + 10).ok());
  EXPECT_TRUE(detail::find_shared_range(p, 8192, &r));
  EXPECT_TRUE(mem_free(p).ok());
}

// Overlapping registrations merge into one registered range holding all
// of them: each buffer, and all together, are found in one memfd; the
// pages turn private with the last deregistration.
TEST(RegisterBuffer, OverlappingRegistrationsMerge) {
  const std::size_t page = page_size();
  void* m = mmap(nullptr, 5 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* b = static_cast<unsigned char*>(m);
  fill(b, 5 * page, 9);
  unsigned char* first = b;             // pages 0-1
  unsigned char* second = b + page;     // pages 1-3
  unsigned char* third = b + 3 * page;  // page 3
  ASSERT_TRUE(register_buffer(first, 2 * page).ok());
  ASSERT_TRUE(register_buffer(third, page).ok());
  ASSERT_TRUE(register_buffer(second, 3 * page).ok());  // joins both
  detail::SharedRange r1, r2;
  ASSERT_TRUE(detail::find_shared_range(first + 100, 2 * page - 200, &r1));
  ASSERT_TRUE(detail::find_shared_range(third, 100, &r2));
  EXPECT_EQ(r1.id, r2.id);
  EXPECT_EQ(r1.map_bytes, 4 * page);
  EXPECT_EQ(r1.offset, 100u);
  EXPECT_TRUE(filled(b, 5 * page, 9));
  ASSERT_TRUE(deregister_buffer(first).ok());
  ASSERT_TRUE(deregister_buffer(second).ok());
  EXPECT_TRUE(detail::find_shared_range(third, 100, &r2));
  ASSERT_TRUE(deregister_buffer(third).ok());
  EXPECT_FALSE(detail::find_shared_range(third, 100, &r2));
  EXPECT_EQ(mapping_of(b).find("memfd"), std::string::npos) << mapping_of(b);
  EXPECT_TRUE(filled(b, 5 * page, 9));
  munmap(m, 5 * page);
}

// What cannot be registered is refused with a reason, and left as it was.
TEST(RegisterBuffer, RefusesWhatCannotMoveAndChangesNothing) {
  const std::size_t page = page_size();
  auto refused = [](void* p, std::size_t n, const char* why) {
    const Status st = register_buffer(p, n);
    EXPECT_EQ(st.code(), Result::invalid_argument) << why << ": " << st.to_string();
    EXPECT_NE(st.message().find("register_buffer"), std::string::npos) << st.message();
    detail::SharedRange r;
    if (p != nullptr && n != 0) {
      EXPECT_FALSE(detail::find_shared_range(p, n, &r)) << why;
    }
    return st.message();
  };
  std::vector<unsigned char> heap(100);
  refused(nullptr, 10, "null");
  refused(heap.data(), 0, "0 bytes");
  alignas(4096) unsigned char on_stack[4096] = {};
  if (page == sizeof on_stack) {
    EXPECT_NE(refused(on_stack, sizeof on_stack, "stack").find("[stack]"), std::string::npos);
  }

  // A file's pages, private or shared, and read-only anonymous memory.
  const int fd = memfd_create("register-test", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(2 * page)), 0);
  for (int flags : {MAP_PRIVATE, MAP_SHARED}) {
    void* f = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, flags, fd, 0);
    ASSERT_NE(f, MAP_FAILED);
    static_cast<unsigned char*>(f)[1] = 9;
    refused(f, 2 * page, "a file's pages");
    EXPECT_EQ(static_cast<unsigned char*>(f)[1], 9);
    munmap(f, 2 * page);
  }
  close(fd);
  void* ro = mmap(nullptr, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(ro, MAP_FAILED);
  EXPECT_NE(refused(ro, page, "read-only").find("r--p"), std::string::npos);
  munmap(ro, page);

  // A range running past its mapping, and one that is not mapped at all.
  void* m = mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* b = static_cast<unsigned char*>(m);
  ASSERT_EQ(munmap(b + 2 * page, page), 0);
  fill(b, 2 * page, 5);
  EXPECT_NE(refused(b, 3 * page, "past the end").find("not mapped"), std::string::npos);
  EXPECT_NE(refused(b + 2 * page, page, "unmapped").find("not mapped"), std::string::npos);
  // Not whole pages: the bytes around the buffer in its pages could be
  // another thread's.
  EXPECT_NE(refused(b + 64, page, "unaligned").find("multiples of the page size"), std::string::npos);
  EXPECT_NE(refused(b, page + 8, "part of a page").find("multiples of the page size"), std::string::npos);
  EXPECT_TRUE(filled(b, 2 * page, 5));
  EXPECT_EQ(mapping_of(b), "");

  // A registered range is not a mem_alloc allocation: mem_free refuses it.
  ASSERT_TRUE(register_buffer(b, page).ok());
  EXPECT_EQ(mem_free(b).code(), Result::invalid_argument);
  ASSERT_TRUE(deregister_buffer(b).ok());
  EXPECT_TRUE(filled(b, 2 * page, 5));
  // Pages that overlap a mem_alloc buffer in part.
  void* p = nullptr;
  ASSERT_TRUE(mem_alloc(&p, page).ok());
  EXPECT_NE(refused(p, 2 * page, "past mem_alloc").find("mem_alloc"), std::string::npos);
  EXPECT_TRUE(mem_free(p).ok());
  EXPECT_EQ(deregister_buffer(nullptr).code(), Result::invalid_argument);
  EXPECT_EQ(deregister_buffer(heap.data()).code(), Result::invalid_argument);
  munmap(m, 2 * page);
}

// A registered buffer unmapped without deregister_buffer, and private
// memory mapped in its place (touched or not): the lookup no longer offers
// it to peers (at once for 4 MiB or more, within 64 lookups for less), and
// registering the new memory works.
TEST(RegisterBuffer, FreedWithoutDeregisterIsNotOffered) {
  const std::size_t n = std::size_t{4} << 20;
  for (bool touch : {true, false}) {
    for (std::size_t looked : {n, std::size_t{4096}}) {
      void* m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      ASSERT_NE(m, MAP_FAILED);
      std::memset(m, 1, n);
      ASSERT_TRUE(register_buffer(m, n).ok());
      detail::SharedRange r;
      ASSERT_TRUE(detail::find_shared_range(m, looked, &r));
      ASSERT_EQ(mmap(m, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0), m);
      if (touch) std::memset(m, 2, n);
      int offered = 0;
      while (offered < 100 && detail::find_shared_range(m, looked, &r)) ++offered;
      EXPECT_EQ(offered, looked == n ? 0 : 63) << "touched: " << touch << ", " << looked << " bytes";
      EXPECT_FALSE(detail::find_shared_range(m, n, &r)) << "a stale range was offered again";
      std::memset(m, 3, n);
      ASSERT_TRUE(register_buffer(m, n).ok());
      EXPECT_TRUE(detail::find_shared_range(m, n, &r));
      EXPECT_EQ(static_cast<unsigned char*>(m)[n - 1], 3);
      ASSERT_TRUE(deregister_buffer(m).ok());
      munmap(m, n);
    }
  }
}

TEST(RegisterBuffer, CApi) {
  const std::size_t n = 3 * page_size();
  auto* heap = static_cast<unsigned char*>(std::aligned_alloc(page_size(), n));
  fill(heap, n, 1);
  ASSERT_EQ(cclzRegisterBuffer(heap, n), cclzSuccess);
  detail::SharedRange r;
  EXPECT_TRUE(detail::find_shared_range(heap, n, &r));
  EXPECT_EQ(cclzDeregisterBuffer(heap), cclzSuccess);
  EXPECT_TRUE(filled(heap, n, 1));
  EXPECT_EQ(cclzDeregisterBuffer(heap), cclzInvalidArgument);
  std::free(heap);
  EXPECT_NE(std::strstr(cclzGetLastError(nullptr), "deregister_buffer"), nullptr) << cclzGetLastError(nullptr);
  EXPECT_EQ(cclzRegisterBuffer(nullptr, 10), cclzInvalidArgument);
}

}  // namespace
}  // namespace cclz
