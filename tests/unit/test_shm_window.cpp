// detail::ShmWindow's mappings: every page of every rank's slots is mapped
// in this process as soon as the window exists (MAP_POPULATE), for the
// creator's mapping, a second process's (open_named) and the anonymous one.
// Otherwise a collective that uses a slot for the first time takes a page
// fault per page: about 200 us per 1 MiB slot, which fell on the first
// timed calls of a benchmark whenever a barrier shifted the slot rotation.
// Whether a page is mapped is read from /proc/self/pagemap (bit 63,
// "present", which needs no privilege).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
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

}  // namespace
}  // namespace cclz::detail
