// detail::ShmPool: blocks of a few mem_alloc arenas. Checked: alignment,
// that every block lies in one mem_alloc allocation (what the direct path
// looks up), no two live blocks overlap, freed neighbours coalesce so an
// arena can be handed out whole again, blocks larger than an arena, the
// refusal of foreign and freed pointers, and a random sequence against a
// model of the live blocks, from two threads.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "shm_alloc.hpp"
#include "shm_pool.hpp"

namespace cclz::detail {
namespace {

std::size_t page() { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }

TEST(ShmPool, BlocksAreAlignedSharedAndDisjoint) {
  ShmPool pool(64 * page());
  std::vector<std::pair<char*, std::size_t>> blocks;
  for (std::size_t bytes : {std::size_t{1}, page(), page() + 1, 5 * page() - 3, std::size_t{100}}) {
    auto* p = static_cast<char*>(pool.allocate(bytes));
    ASSERT_NE(p, nullptr) << bytes;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % page(), 0u) << bytes;
    SharedRange r;
    EXPECT_TRUE(find_shared_range(p, bytes, &r)) << bytes;
    std::memset(p, static_cast<int>(blocks.size() + 1), bytes);
    blocks.emplace_back(p, bytes);
  }
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const auto [p, n] = blocks[i];
    EXPECT_TRUE(std::all_of(p, p + n, [&](char c) { return c == static_cast<char>(i + 1); })) << "block " << i;
  }
  EXPECT_EQ(pool.stats().arenas, 1u);
  EXPECT_EQ(pool.stats().live_blocks, blocks.size());
  for (const auto& b : blocks) EXPECT_TRUE(pool.free(b.first));
  EXPECT_EQ(pool.stats().live_bytes, 0u);
}

TEST(ShmPool, FreedNeighboursCoalesce) {
  const std::size_t pg = page();
  ShmPool pool(16 * pg);
  void* a = pool.allocate(4 * pg);
  void* b = pool.allocate(8 * pg);
  void* c = pool.allocate(4 * pg);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(pool.stats().arenas, 1u);
  // Every order of freeing three neighbours leaves the arena whole.
  EXPECT_TRUE(pool.free(b));
  EXPECT_TRUE(pool.free(a));
  EXPECT_TRUE(pool.free(c));
  void* whole = pool.allocate(16 * pg);
  EXPECT_EQ(whole, a);
  EXPECT_EQ(pool.stats().arenas, 1u);
  EXPECT_TRUE(pool.free(whole));

  a = pool.allocate(4 * pg), b = pool.allocate(8 * pg), c = pool.allocate(4 * pg);
  EXPECT_TRUE(pool.free(a));
  EXPECT_TRUE(pool.free(c));
  EXPECT_TRUE(pool.free(b));
  EXPECT_EQ(pool.allocate(16 * pg), a);
  EXPECT_EQ(pool.stats().arenas, 1u);
}

TEST(ShmPool, LargerThanAnArenaAndBadPointers) {
  const std::size_t pg = page();
  ShmPool pool(4 * pg);
  void* big = pool.allocate(10 * pg + 7);
  ASSERT_NE(big, nullptr);
  SharedRange r;
  EXPECT_TRUE(find_shared_range(big, 10 * pg + 7, &r));
  EXPECT_EQ(pool.stats().arena_bytes, 11 * pg);
  EXPECT_EQ(pool.allocate(0), nullptr);
  int local = 0;
  EXPECT_FALSE(pool.free(&local));
  EXPECT_FALSE(pool.free(static_cast<char*>(big) + pg));  // inside a block, not its start
  EXPECT_TRUE(pool.free(big));
  EXPECT_FALSE(pool.free(big));  // twice
  EXPECT_EQ(pool.stats().live_blocks, 0u);
}

// Random allocations and frees of 1-40 pages from two threads, each block
// filled with its own byte and checked before it is freed: an overlap or a
// block handed out twice corrupts some other block's bytes.
TEST(ShmPool, RandomSequenceFromTwoThreads) {
  const std::size_t pg = page();
  ShmPool pool(256 * pg);
  std::atomic<std::size_t> live_bytes{0}, peak{0};
  auto worker = [&](unsigned seed, bool* ok) {
    std::mt19937 rng(seed);
    std::vector<std::tuple<char*, std::size_t, char>> live;
    for (int step = 0; step < 4000; ++step) {
      if (live.empty() || (live.size() < 24 && rng() % 2 == 0)) {
        const std::size_t bytes = (rng() % 40 + 1) * pg - rng() % pg;
        auto* p = static_cast<char*>(pool.allocate(bytes));
        if (p == nullptr) return;
        const char fill = static_cast<char>(rng());
        std::memset(p, fill, bytes);
        live.emplace_back(p, bytes, fill);
        const std::size_t now = live_bytes += (bytes + pg - 1) / pg * pg;
        for (std::size_t old = peak.load(); now > old && !peak.compare_exchange_weak(old, now);) {
        }
      } else {
        const std::size_t i = rng() % live.size();
        const auto [p, n, fill] = live[i];
        if (!std::all_of(p, p + n, [&](char c) { return c == fill; })) return;
        if (!pool.free(p)) return;
        live_bytes -= (n + pg - 1) / pg * pg;
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
    for (const auto& [p, n, fill] : live) {
      if (!std::all_of(p, p + n, [&](char c) { return c == fill; }) || !pool.free(p)) return;
    }
    *ok = true;
  };
  bool ok1 = false, ok2 = false;
  std::thread t1(worker, 1u, &ok1), t2(worker, 2u, &ok2);
  t1.join();
  t2.join();
  EXPECT_TRUE(ok1);
  EXPECT_TRUE(ok2);
  const ShmPool::Stats s = pool.stats();
  EXPECT_EQ(s.live_blocks, 0u);
  EXPECT_EQ(s.live_bytes, 0u);
  // Coalescing keeps fragmentation bounded: the arenas hold at most twice
  // the most that was ever live, plus one arena.
  EXPECT_LE(s.arena_bytes, 2 * peak.load() + 256 * pg);
  std::printf("ShmPool random sequence: %zu arenas, %zu KiB for a peak of %zu KiB live\n", s.arenas,
              s.arena_bytes >> 10, peak.load() >> 10);
}

}  // namespace
}  // namespace cclz::detail
