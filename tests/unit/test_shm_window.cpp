// detail::ShmWindow's mappings: every page of every rank's slots is mapped
// in this process as soon as the window exists (MAP_POPULATE), for the
// creator's mapping, a second process's (open_named) and the anonymous one.
// Otherwise a collective that uses a slot for the first time takes a page
// fault per page: about 200 us per 1 MiB slot, which fell on the first
// timed calls of a benchmark whenever a barrier shifted the slot rotation.
// Whether a page is mapped is read from /proc/self/pagemap (bit 63,
// "present", which needs no privilege). A first write from user space
// still costs microseconds per page where the hypervisor shadows the page
// tables, so each mapping is also written once (shm_window.cpp,
// touch_pages); nothing a process sees shows that, and these tests check
// only that it changes no byte.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "shm_window.hpp"

namespace cclz::detail {
namespace {

std::size_t page() { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }

// Pages of [p, p + bytes) not mapped in this process; -1 if pagemap cannot be read.
long unmapped_pages(const std::byte* p, std::size_t bytes) {
  const int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  long missing = 0;
  const auto first = reinterpret_cast<std::uintptr_t>(p) / page();
  const auto last = (reinterpret_cast<std::uintptr_t>(p) + bytes - 1) / page();
  for (std::uintptr_t pg = first; pg <= last; ++pg) {
    std::uint64_t entry = 0;
    if (pread(fd, &entry, sizeof entry, static_cast<off_t>(pg * sizeof entry)) != sizeof entry) {
      close(fd);
      return -1;
    }
    if ((entry >> 63) == 0) ++missing;
  }
  close(fd);
  return missing;
}

ShmWindow::Geometry geometry() {
  ShmWindow::Geometry g;
  g.local_size = 3;
  g.slots = 4;
  g.slot_bytes = 64 * page();
  return g;
}

// Every slot of every rank, as this window maps them.
void expect_slots_mapped(const ShmWindow& w, const char* which) {
  const ShmWindow::Geometry g = geometry();
  for (int r = 0; r < g.local_size; ++r) {
    for (int s = 0; s < g.slots; ++s) {
      const long missing = unmapped_pages(w.slot(r, static_cast<std::uint64_t>(s)), g.slot_bytes);
      ASSERT_GE(missing, 0) << "cannot read /proc/self/pagemap";
      EXPECT_EQ(missing, 0) << which << ": rank " << r << " slot " << s << " has " << missing
                            << " unmapped pages";
    }
  }
}

TEST(ShmWindow, NamedSlotsAreMappedAtCreationAndOpen) {
  std::string name;
  std::shared_ptr<ShmSegment> created, opened;
  ASSERT_TRUE(ShmWindow::create_named(geometry(), &name, &created).ok());
  const Status st = ShmWindow::open_named(name, &opened);
  ShmWindow::unlink_named(name);
  ASSERT_TRUE(st.ok()) << st.to_string();
  const ShmWindow first(created, {0, 1, 2}, 0, false);
  const ShmWindow second(opened, {0, 1, 2}, 1, false);
  expect_slots_mapped(first, "creator");
  expect_slots_mapped(second, "opener");
}

TEST(ShmWindow, AnonymousSlotsAreMappedAtCreation) {
  std::shared_ptr<ShmSegment> seg;
  ASSERT_TRUE(ShmWindow::create_anonymous(geometry(), &seg).ok());
  const ShmWindow w(seg, {0, 1, 2}, 0, false);
  expect_slots_mapped(w, "anonymous");
}

// Where the slots start within their pages (shm_window.cpp,
// slot_page_offset): no two of a rank's consecutive slots, nor the same slot
// of two neighbouring ranks, at the same offset, and none within 256 bytes
// of a page's start either way, where most large buffers start (0, 16 or 64
// bytes in): a slot starting 48 bytes past its source's offset made copies
// into it stall on 4K aliasing.
TEST(ShmWindow, SlotsStartAwayFromWhereBuffersStart) {
  ShmWindow::Geometry g = geometry();
  g.local_size = 8;  // 32 slots: every one of the nine offsets, several times
  std::shared_ptr<ShmSegment> seg;
  ASSERT_TRUE(ShmWindow::create_anonymous(g, &seg).ok());
  const ShmWindow w(seg, {0, 1, 2, 3, 4, 5, 6, 7}, 0, false);
  auto offset = [&](int r, int s) {
    return reinterpret_cast<std::uintptr_t>(w.slot(r, static_cast<std::uint64_t>(s))) % page();
  };
  for (int r = 0; r < g.local_size; ++r) {
    for (int s = 0; s < g.slots; ++s) {
      const std::uintptr_t off = offset(r, s);
      EXPECT_GE(off, 256u) << "rank " << r << " slot " << s;
      EXPECT_LE(off + 256, page()) << "rank " << r << " slot " << s;
      EXPECT_EQ(off % 64, 0u) << "rank " << r << " slot " << s;
      if (s + 1 < g.slots) {
        EXPECT_NE(off, offset(r, s + 1)) << "rank " << r << " slot " << s;
      }
      if (r + 1 < g.local_size) {
        EXPECT_NE(off, offset(r + 1, s)) << "rank " << r << " slot " << s;
      }
    }
  }
}

// Each process writes once to every page it maps (touch_pages, for hosts
// whose hypervisor shadows the page tables); the bytes stay as they were:
// a second mapping, opened after the creator filled every slot, reads the
// same bytes, and so does the creator.
TEST(ShmWindow, OpeningLeavesTheBytesAsTheyWere) {
  std::string name;
  std::shared_ptr<ShmSegment> created, opened;
  ASSERT_TRUE(ShmWindow::create_named(geometry(), &name, &created).ok());
  const ShmWindow first(created, {0, 1, 2}, 0, false);
  const ShmWindow::Geometry g = geometry();
  auto pattern = [](int r, int s, std::size_t i) {
    const auto seed = static_cast<std::size_t>(r) * 131 + static_cast<std::size_t>(s) * 17;
    return static_cast<std::byte>((seed + i * 7) % 251 + 1);
  };
  for (int r = 0; r < g.local_size; ++r) {
    for (int s = 0; s < g.slots; ++s) {
      std::byte* p = first.slot(r, static_cast<std::uint64_t>(s));
      for (std::size_t i = 0; i < g.slot_bytes; ++i) p[i] = pattern(r, s, i);
    }
  }
  const Status st = ShmWindow::open_named(name, &opened);
  ShmWindow::unlink_named(name);
  ASSERT_TRUE(st.ok()) << st.to_string();
  const ShmWindow second(opened, {0, 1, 2}, 1, false);
  for (int r = 0; r < g.local_size; ++r) {
    for (int s = 0; s < g.slots; ++s) {
      const std::byte* a = first.slot(r, static_cast<std::uint64_t>(s));
      const std::byte* b = second.slot(r, static_cast<std::uint64_t>(s));
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < g.slot_bytes; ++i) wrong += (a[i] != pattern(r, s, i)) + (b[i] != pattern(r, s, i));
      EXPECT_EQ(wrong, 0u) << "rank " << r << " slot " << s;
    }
  }
  EXPECT_EQ(second.l2_bytes(), first.l2_bytes());
}

// The cache sizes the collectives plan with travel in the window from its
// creator: every rank must cut a call into the same chunks.
TEST(ShmWindow, CarriesTheCreatorsCacheSizesAndSlotStores) {
  ShmWindow::Geometry g = geometry();
  g.l2_bytes = std::uint64_t{2} << 20;
  g.llc_bytes = std::uint64_t{96} << 20;
  g.slot_stores = 2;
  std::string name;
  std::shared_ptr<ShmSegment> created, opened;
  ASSERT_TRUE(ShmWindow::create_named(g, &name, &created).ok());
  const Status st = ShmWindow::open_named(name, &opened);
  ShmWindow::unlink_named(name);
  ASSERT_TRUE(st.ok()) << st.to_string();
  const ShmWindow second(opened, {0, 1, 2}, 1, false);
  EXPECT_EQ(second.l2_bytes(), std::uint64_t{2} << 20);
  EXPECT_EQ(second.llc_bytes(), std::uint64_t{96} << 20);
  EXPECT_EQ(second.slot_stores(), 2);

  std::shared_ptr<ShmSegment> seg;
  ASSERT_TRUE(ShmWindow::create_anonymous(geometry(), &seg).ok());  // 0: the host's
  const ShmWindow w(seg, {0, 1, 2}, 0, false);
  EXPECT_EQ(w.l2_bytes(), host_cache_sizes().l2);
  EXPECT_EQ(w.llc_bytes(), host_cache_sizes().llc);
  EXPECT_EQ(w.slot_stores(), 0);

  // Only 0 (measured), 1 (cache) and 2 (memory) are stores.
  for (int bad : {-1, 3}) {
    ShmWindow::Geometry b = geometry();
    b.slot_stores = bad;
    std::shared_ptr<ShmSegment> none;
    const Status st = ShmWindow::create_anonymous(b, &none);
    EXPECT_EQ(st.code(), Result::invalid_argument) << bad;
    EXPECT_NE(st.message().find("slot stores " + std::to_string(bad)), std::string::npos) << st.message();
  }
}

// Where the ranks outnumber the cores, a waiter's yields that keep coming
// back at once while the rank it waits for is queued on its CPU make it
// sleep; yields that ran something, or a peer elsewhere, do not.
TEST(YieldWatch, SleepsAfterEmptyYieldsOnlyWhileThePeerSharesTheCpu) {
  using std::chrono::nanoseconds;
  const nanoseconds empty{200}, ran{20000};
  YieldWatch w;
  for (int i = 1; i < YieldWatch::kEmptyInARow; ++i) EXPECT_FALSE(w.after_yield(empty, 1, 1)) << i;
  EXPECT_TRUE(w.after_yield(empty, 1, 1));

  YieldWatch reset;
  for (int i = 1; i < YieldWatch::kEmptyInARow; ++i) EXPECT_FALSE(reset.after_yield(empty, 1, 1));
  EXPECT_FALSE(reset.after_yield(ran, 1, 1)) << "a yield that ran another thread starts the count again";
  for (int i = 1; i < YieldWatch::kEmptyInARow; ++i) EXPECT_FALSE(reset.after_yield(empty, 1, 1)) << i;
  EXPECT_TRUE(reset.after_yield(empty, 1, 1));

  YieldWatch elsewhere;
  for (int i = 0; i < 3 * YieldWatch::kEmptyInARow; ++i) {
    EXPECT_FALSE(elsewhere.after_yield(empty, 1, 0)) << "the peer waited last on another CPU";
    EXPECT_FALSE(elsewhere.after_yield(empty, 1, -1)) << "the peer has not waited yet";
  }
  EXPECT_TRUE(elsewhere.after_yield(empty, 1, 1)) << "then it is queued here";

  YieldWatch unknown;
  for (int i = 0; i < 3 * YieldWatch::kEmptyInARow; ++i) EXPECT_FALSE(unknown.after_yield(empty, -1, -1));
}

// The CPU a rank waited on is published only where the ranks outnumber the
// cores, for the peers' YieldWatch.
TEST(ShmWindow, PublishesTheCpuOfWaitsWhereRanksOutnumberCores) {
  std::shared_ptr<ShmSegment> seg;
  ASSERT_TRUE(ShmWindow::create_anonymous(geometry(), &seg).ok());
  ShmWindow crowded(seg, {0, 1, 2}, 0, true), peer(seg, {0, 1, 2}, 1, true), roomy(seg, {0, 1, 2}, 2, false);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(crowded.last_wait_cpu(r), -1) << r;

  // Stay on one CPU while the waits run.
  cpu_set_t before, one;
  ASSERT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
  const int cpu = sched_getcpu();
  ASSERT_GE(cpu, 0);
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  peer.publish(1);
  const int r1 = 1;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  const Status a = crowded.wait(std::span<const int>(&r1, 1), 1, deadline, {}, "test");
  const Status b = roomy.wait(std::span<const int>(&r1, 1), 1, deadline, {}, "test");
  ASSERT_EQ(sched_setaffinity(0, sizeof before, &before), 0);
  ASSERT_TRUE(a.ok()) << a.to_string();
  ASSERT_TRUE(b.ok()) << b.to_string();
  EXPECT_EQ(peer.last_wait_cpu(0), cpu);
  EXPECT_EQ(peer.last_wait_cpu(1), -1) << "rank 1 has not waited";
  EXPECT_EQ(peer.last_wait_cpu(2), -1) << "rank 2's ranks fit on the cores";
}

// A sysfs cache directory written by the test.
class CacheDir {
 public:
  CacheDir() {
    char tmpl[] = "/tmp/cclz-cache-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    root_ = tmpl;
  }
  ~CacheDir() { std::filesystem::remove_all(root_); }
  void add(int index, const std::string& level, const std::string& type, const std::string& size) {
    const std::filesystem::path dir = root_ / ("index" + std::to_string(index));
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "level") << level << "\n";
    std::ofstream(dir / "type") << type << "\n";
    if (!size.empty()) std::ofstream(dir / "size") << size << "\n";
  }
  std::string path() const { return root_.string(); }

 private:
  std::filesystem::path root_;
};

TEST(CacheSizes, ReadsLevelTwoAndTheLastLevelFromSysfs) {
  struct Entry {
    const char *level, *type, *size;
  };
  struct Case {
    std::vector<Entry> entries;
    std::uint64_t l2, llc;
  };
  const Case cases[] = {
      {{{"1", "Data", "48K"}, {"1", "Instruction", "32K"}, {"2", "Unified", "2048K"}, {"3", "Unified", "96M"}},
       std::uint64_t{2} << 20,
       std::uint64_t{96} << 20},
      // No level 3: the level 2 is the last level.
      {{{"1", "Data", "32K"}, {"2", "Unified", "512K"}}, std::uint64_t{512} << 10, std::uint64_t{512} << 10},
  };
  for (const Case& k : cases) {
    CacheDir d;
    for (std::size_t i = 0; i < k.entries.size(); ++i) {
      d.add(static_cast<int>(i), k.entries[i].level, k.entries[i].type, k.entries[i].size);
    }
    const CacheSizes c = read_cache_sizes(d.path());
    EXPECT_EQ(c.l2, k.l2);
    EXPECT_EQ(c.llc, k.llc);
  }
}

// A guest's sysfs may describe the physical part's whole shared cache: the
// share counted is at most kLlcPerCpu per online CPU; bare metal keeps its
// figure.
TEST(CacheSizes, LastLevelShareOfAHost) {
  EXPECT_EQ(llc_share(std::uint64_t{480} << 20, 2), std::uint64_t{32} << 20);  // 2-vCPU guest of a 480 MiB part
  EXPECT_EQ(llc_share(std::uint64_t{32} << 20, 2), std::uint64_t{32} << 20);   // one 32 MiB complex
  EXPECT_EQ(llc_share(std::uint64_t{480} << 20, 128), std::uint64_t{480} << 20);
  EXPECT_EQ(llc_share(std::uint64_t{96} << 20, 0), kLlcPerCpu);  // no count: one CPU
  EXPECT_LE(host_cache_sizes().llc, read_cache_sizes("/sys/devices/system/cpu/cpu0/cache").llc);
}

TEST(CacheSizes, WhatSysfsDoesNotSayKeepsTheDefaults) {
  const CacheSizes defaults;
  const CacheSizes none = read_cache_sizes("/nonexistent/cclz/cache");
  EXPECT_EQ(none.l2, defaults.l2);
  EXPECT_EQ(none.llc, defaults.llc);

  CacheDir d;
  d.add(0, "2", "Unified", "lots");   // not a size
  d.add(1, "3", "Unified", "");       // no size file
  d.add(2, "3", "Instruction", "8M");  // not data
  d.add(3, "3", "Unified", "0K");
  const CacheSizes c = read_cache_sizes(d.path());
  EXPECT_EQ(c.l2, defaults.l2);
  EXPECT_EQ(c.llc, defaults.llc);
}

}  // namespace
}  // namespace cclz::detail
