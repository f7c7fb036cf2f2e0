// cclz::mem_alloc / mem_free and their C forms: sizes, alignment, zeroed
// memory, the registry lookup the direct path relies on, and the errors
// (null result pointer, foreign or freed pointers) that must free nothing.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
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

}  // namespace
}  // namespace cclz
