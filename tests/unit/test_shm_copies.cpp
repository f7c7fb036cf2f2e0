// The node-local path's copies (collectives/shm_pipeline.hpp): every
// length around the page-interleaved loop's boundaries, every alignment of
// source and destinations, byte for byte against the source, and nothing
// written outside the destination ranges.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "shm_pipeline.hpp"
#include "shm_window.hpp"

namespace cclz {
namespace {

constexpr std::size_t kGuard = 64;
constexpr std::byte kUntouched{0xa5};

// The lengths that cross the loops' edges: a line, the 1-8 KiB that copy
// moves with `rep movsb`, four pages side by side (16 KiB) and the 32 KiB
// from which copy_in interleaves them.
std::vector<std::size_t> lengths() {
  std::vector<std::size_t> n = {0,    1,    15,   63,   64,   65,   255,  256,  257,
                                1023, 1024, 1025, 4095, 4096, 4097, 8191, 8192, 8193};
  for (std::size_t base : {std::size_t{16} << 10, std::size_t{32} << 10, std::size_t{48} << 10,
                           std::size_t{200} << 10}) {
    for (std::size_t d : {std::size_t{0}, std::size_t{1}, std::size_t{64}, std::size_t{4096} + 17}) {
      n.push_back(base - d);
      n.push_back(base + d);
    }
  }
  return n;
}

// A destination with guard bytes on both sides, at `offset` from a 64-byte
// boundary.
struct Dest {
  std::vector<std::byte> buf;
  std::size_t offset;
  Dest(std::size_t n, std::size_t off) : buf(n + 2 * kGuard + 64, kUntouched), offset(off) {}
  std::byte* data() {
    const auto p = reinterpret_cast<std::uintptr_t>(buf.data()) + kGuard;
    return buf.data() + ((64 - p % 64) % 64 + kGuard + offset);
  }
  // Empty when the n bytes at data() equal src and everything else is untouched.
  std::string check(const std::byte* src, std::size_t n) {
    const std::byte* d = data();
    for (std::size_t i = 0; i < n; ++i) {
      if (d[i] != src[i]) return "byte " + std::to_string(i) + " differs";
    }
    for (const std::byte* p = buf.data(); p < buf.data() + buf.size(); ++p) {
      if ((p < d || p >= d + n) && *p != kUntouched) {
        return "byte at " + std::to_string(p - d) + " outside the destination written";
      }
    }
    return {};
  }
};

std::vector<std::byte> pattern(std::size_t n) {
  std::vector<std::byte> v(n);
  std::uint32_t x = 12345;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<std::byte>(x >> 24);
  }
  return v;
}

// Both forms of the large copies' lines (set_wide_copies): 128-bit
// vectors everywhere, 256-bit ones where the CPU has AVX2.
TEST(ShmCopies, EveryLengthAndAlignment) {
  const std::size_t longest = (std::size_t{200} << 10) + 4096 + 17;
  const std::vector<std::byte> source = pattern(longest + 64);
  for (bool wide : {false, true}) {
    if (!coll::shm::set_wide_copies(wide)) {
      std::cout << "[ NOTE     ] no AVX2 on this CPU: the 256-bit copies are not built to run here\n";
      continue;
    }
    const std::string form = wide ? ", wide" : ", narrow";
    for (std::size_t n : lengths()) {
      for (std::size_t src_off : {0, 1, 16, 33}) {
        for (std::size_t dst_off : {0, 5, 16, 48, 63}) {
          const std::byte* src = source.data() + src_off;
          const std::string at = "n " + std::to_string(n) + ", src +" + std::to_string(src_off) + ", dst +" +
                                 std::to_string(dst_off) + form;
          Dest plain(n, dst_off), in(n, dst_off), stream(n, dst_off);
          coll::shm::copy(plain.data(), src, n);
          EXPECT_EQ(plain.check(src, n), "") << "copy, " << at;
          coll::shm::copy_in(in.data(), src, n);
          EXPECT_EQ(in.check(src, n), "") << "copy_in, " << at;
          coll::shm::copy_stream(stream.data(), src, n);
          EXPECT_EQ(stream.check(src, n), "") << "copy_stream, " << at;
          // The slot aligned like the output (one pass) and not (two): 8 or
          // 16 bytes apart, alike mod 16 but on different line offsets.
          for (std::size_t slot_off : {dst_off, dst_off + 8, dst_off + 16}) {
            for (bool slot_streamed : {false, true}) {
              Dest slot(n, slot_off), out(n, dst_off);
              coll::shm::copy_and_stream(slot.data(), out.data(), src, n, slot_streamed);
              const std::string which = std::string(slot_streamed ? "streamed" : "cached") + " slot +" +
                                        std::to_string(slot_off) + ", " + at;
              EXPECT_EQ(slot.check(src, n), "") << "copy_and_stream slot, " << which;
              EXPECT_EQ(out.check(src, n), "") << "copy_and_stream output, " << which;
            }
          }
        }
      }
    }
  }
  coll::shm::set_wide_copies(true);  // back to the default where the CPU has AVX2
}

// How a call is cut into chunks (shm::chunk_bytes), on 1 MiB slots and a
// 1 MiB level 2: past one slot into half-level-2 chunks; within one slot,
// only a copying call where the ranks outnumber the cores, so that peers
// start on the first chunk while the next is written; a streamed call
// fills whole slots.
TEST(ShmChunks, CopyingCallsWithMoreRanksThanCoresAreCutWithinOneSlot) {
  detail::ShmWindow::Geometry g;
  g.local_size = 2;
  g.slots = 4;
  g.slot_bytes = std::size_t{1} << 20;
  g.l2_bytes = std::uint64_t{1} << 20;
  g.llc_bytes = std::uint64_t{32} << 20;
  std::shared_ptr<detail::ShmSegment> seg;
  ASSERT_TRUE(detail::ShmWindow::create_anonymous(g, &seg).ok());
  const detail::ShmWindow bound(seg, {0, 1}, 0, false), crowded(seg, {0, 1}, 0, true);
  constexpr std::size_t KiB = 1024;
  using coll::shm::chunk_bytes;
  using coll::shm::ChunkUse;
  for (std::size_t call : {std::size_t{600} * KiB, std::size_t{1024} * KiB}) {
    EXPECT_EQ(chunk_bytes(crowded, false, call, ChunkUse::copy), 512 * KiB) << call;
    EXPECT_EQ(chunk_bytes(crowded, false, call, ChunkUse::reduce), 1024 * KiB) << call;
    EXPECT_EQ(chunk_bytes(bound, false, call, ChunkUse::copy), 1024 * KiB) << call;
    EXPECT_EQ(chunk_bytes(bound, false, call, ChunkUse::reduce), 1024 * KiB) << call;
  }
  for (const detail::ShmWindow* w : {&bound, &crowded}) {
    EXPECT_EQ(chunk_bytes(*w, false, 4096 * KiB, ChunkUse::reduce), 512 * KiB);
    EXPECT_EQ(chunk_bytes(*w, false, 4096 * KiB, ChunkUse::copy), 512 * KiB);
    EXPECT_EQ(chunk_bytes(*w, true, 1024 * KiB, ChunkUse::copy), 1024 * KiB);
    EXPECT_EQ(chunk_bytes(*w, true, 4096 * KiB, ChunkUse::reduce), 1024 * KiB);
  }
}

}  // namespace
}  // namespace cclz
