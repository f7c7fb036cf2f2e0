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
#include <linux/membarrier.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
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

// Where the ranks outnumber the cores, a waiter's yields that run nothing
// else (as quick as the quickest yield it has seen, within 2x) make it
// sleep: a few in a row while the rank it waits for is queued on its CPU
// (there and not asleep), or kAloneFor of them wherever that rank is. A yield that ran something
// (2x the quickest or more) starts the count again.
TEST(YieldWatch, SleepsAfterYieldsThatRanNothingElse) {
  using std::chrono::nanoseconds;
  const nanoseconds empty{1300}, ran{9000};
  const Clock::time_point t0{};
  const auto us = [&](int n) { return t0 + std::chrono::microseconds(n); };
  YieldWatch w;
  w.start();
  for (int i = 1; i < YieldWatch::kEmptyInARow; ++i) EXPECT_FALSE(w.after_yield(empty, us(i), 1, 1, false)) << i;
  EXPECT_TRUE(w.after_yield(empty, us(YieldWatch::kEmptyInARow), 1, 1, false));
  w.start();
  EXPECT_FALSE(w.after_yield(empty, us(100), 1, 1, false)) << "a new wait counts again";

  YieldWatch reset;
  reset.start();
  for (int i = 1; i < YieldWatch::kEmptyInARow; ++i) EXPECT_FALSE(reset.after_yield(empty, us(i), 1, 1, false));
  EXPECT_FALSE(reset.after_yield(ran, us(10), 1, 1, false)) << "a yield that ran another thread starts the count again";
  for (int i = 1; i < YieldWatch::kEmptyInARow; ++i) EXPECT_FALSE(reset.after_yield(empty, us(10 + i), 1, 1, false)) << i;
  EXPECT_TRUE(reset.after_yield(empty, us(20), 1, 1, false));

  // What counts as empty is relative to the quickest yield seen: where
  // every yield takes 9 us, they ran nothing; one of 1 us later shows that
  // they did.
  YieldWatch slow_host;
  slow_host.start();
  for (int i = 1; i < YieldWatch::kEmptyInARow; ++i) EXPECT_FALSE(slow_host.after_yield(ran, us(9 * i), 1, 1, false)) << i;
  EXPECT_TRUE(slow_host.after_yield(ran, us(9 * YieldWatch::kEmptyInARow), 1, 1, false));
  slow_host.start();
  EXPECT_FALSE(slow_host.after_yield(nanoseconds(1000), us(100), 1, 1, false));
  for (int i = 0; i < 3 * YieldWatch::kEmptyInARow; ++i) EXPECT_FALSE(slow_host.after_yield(ran, us(101 + 9 * i), 1, 1, false));

  // The rank waited for last ran on another CPU (0) or has not said (-1):
  // the yields go on until the run of empty ones has lasted kAloneFor.
  const int alone = static_cast<int>(YieldWatch::kAloneFor.count());
  for (const int lag_cpu : {0, -1}) {
    YieldWatch elsewhere;
    elsewhere.start();
    int t = 0;
    for (; t < alone; t += 7) EXPECT_FALSE(elsewhere.after_yield(empty, us(t), 1, lag_cpu, false)) << lag_cpu << " " << t;
    EXPECT_TRUE(elsewhere.after_yield(empty, us(alone), 1, lag_cpu, false)) << lag_cpu;

    YieldWatch interrupted;
    interrupted.start();
    for (t = 0; t < alone; t += 7) EXPECT_FALSE(interrupted.after_yield(empty, us(t), 1, lag_cpu, false));
    EXPECT_FALSE(interrupted.after_yield(ran, us(t), 1, lag_cpu, false)) << "the run is over";
    EXPECT_FALSE(interrupted.after_yield(empty, us(t + 1), 1, lag_cpu, false)) << "and a new one starts";
    EXPECT_FALSE(interrupted.after_yield(empty, us(t + alone), 1, lag_cpu, false)) << "(its first yield ran nothing";
    EXPECT_TRUE(interrupted.after_yield(empty, us(t + 1 + alone), 1, lag_cpu, false)) << " from t + 1)";
  }

  // The rank waited for is on this CPU but asleep in a wait of its own: it
  // gains nothing from the CPU, so only the long run puts this rank to sleep.
  YieldWatch chained;
  chained.start();
  for (int t = 0; t < alone; t += 7) EXPECT_FALSE(chained.after_yield(empty, us(t), 1, 1, true)) << t;
  EXPECT_TRUE(chained.after_yield(empty, us(alone), 1, 1, true));

  YieldWatch unknown;
  unknown.start();
  for (int i = 0; i < 3 * YieldWatch::kEmptyInARow; ++i) {
    EXPECT_FALSE(unknown.after_yield(empty, us(1000 * i), -1, -1, false)) << "no CPU of its own to give up";
  }
}

// The CPU a rank runs on is published only where the ranks outnumber the
// cores, for the peers' YieldWatch: from attaching, and again at each wait
// and each publish (where a rank that moved is seen next).
TEST(ShmWindow, PublishesTheCpuWhereRanksOutnumberCores) {
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
  std::vector<int> allowed;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &before)) allowed.push_back(c);
  }
  ASSERT_FALSE(allowed.empty());
  auto pin = [](int cpu) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    return sched_setaffinity(0, sizeof one, &one) == 0;
  };
  const int first = allowed.front(), second = allowed.back();

  ASSERT_TRUE(pin(first));
  std::shared_ptr<ShmSegment> seg;
  ASSERT_TRUE(ShmWindow::create_anonymous(geometry(), &seg).ok());
  ShmWindow crowded(seg, {0, 1, 2}, 0, true), peer(seg, {0, 1, 2}, 1, true), roomy(seg, {0, 1, 2}, 2, false);
  EXPECT_EQ(crowded.last_cpu(0), first) << "from attaching";
  EXPECT_EQ(crowded.last_cpu(1), first);
  EXPECT_EQ(crowded.last_cpu(2), -1) << "rank 2's ranks fit on the cores";

  // Move (where there is another CPU to move to): the peers see it at the
  // next publish and the next wait.
  ASSERT_TRUE(pin(second));
  peer.publish(1);
  const int r1 = 1;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  const Status a = crowded.wait(std::span<const int>(&r1, 1), 1, deadline, {}, "test");
  const Status b = roomy.wait(std::span<const int>(&r1, 1), 1, deadline, {}, "test");
  ASSERT_EQ(sched_setaffinity(0, sizeof before, &before), 0);
  ASSERT_TRUE(a.ok()) << a.to_string();
  ASSERT_TRUE(b.ok()) << b.to_string();
  EXPECT_EQ(roomy.last_cpu(1), second) << "at the publish";
  EXPECT_EQ(roomy.last_cpu(0), second) << "at the wait";
  EXPECT_EQ(roomy.last_cpu(2), -1);
}

// Where the ranks fit on the cores, a rank publishes without a fence when
// the kernel offers membarrier(2)'s global barrier, and a waiter runs that
// barrier before it sleeps (ShmWindow::publish). The publisher then reads
// the count of sleepers with no fence of its own; it must still see a
// waiter asleep on it and wake it (a missed wake-up would cost the waiter
// up to a nap, 2 ms). Ranks that outnumber the cores keep the fence.
TEST(ShmWindow, FencelessPublishWakesASleepingWaiter) {
  std::shared_ptr<ShmSegment> seg;
  ASSERT_TRUE(ShmWindow::create_anonymous(geometry(), &seg).ok());
  ShmWindow waiter(seg, {0, 1, 2}, 0, false), publisher(seg, {0, 1, 2}, 1, false), crowded(seg, {0, 1, 2}, 2, true);
  const long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  const bool offered = cmds >= 0 && (cmds & MEMBARRIER_CMD_GLOBAL_EXPEDITED) != 0 &&
                       (cmds & MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) != 0;
  EXPECT_EQ(publisher.fenceless(), offered);
  EXPECT_FALSE(crowded.fenceless());

  const int r1 = 1;
  for (std::uint64_t round = 1; round <= 5; ++round) {
    Status st;
    std::thread t([&] {
      st = waiter.wait(std::span<const int>(&r1, 1), round, Clock::now() + std::chrono::seconds(30), {}, "test");
    });
    // The waiter spins, yields for 2 ms, then sleeps on rank 1.
    const auto give_up = Clock::now() + std::chrono::seconds(10);
    while (publisher.sleepers_on(1) == 0 && Clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    const bool asleep = publisher.sleepers_on(1) != 0;
    const std::uint64_t before = publisher.wakes_sent();
    publisher.publish(round);
    t.join();
    ASSERT_TRUE(asleep) << "round " << round << ": the waiter never slept";
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(publisher.wakes_sent(), before + 1) << "round " << round << ": the publish did not wake the sleeper";
  }
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
