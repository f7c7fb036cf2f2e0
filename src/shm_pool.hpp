// Blocks carved out of a few large mem_alloc allocations (arenas), for
// callers that allocate many buffers and want each to be one the node's
// peers can map (the direct path) without one memfd per buffer: the torch
// backend's CPU allocator (cclz.torch.use_shared_memory).
//
// Blocks are whole pages, first fit by address, and coalesce with free
// neighbours when freed. Arenas are never returned: a block freed and
// allocated again stays in the same allocation, so the peers' cached
// mappings of it stay valid. Thread safe.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace cclz::detail {

class ShmPool {
 public:
  // New arenas are at least `arena_bytes` (rounded up to whole pages).
  explicit ShmPool(std::size_t arena_bytes);
  ShmPool(const ShmPool&) = delete;
  ShmPool& operator=(const ShmPool&) = delete;
  ~ShmPool();

  // A zeroed-or-reused block of at least `bytes` (> 0), page aligned;
  // nullptr when no arena has room and a new one cannot be had.
  void* allocate(std::size_t bytes) noexcept;
  // A pointer allocate returned; false (and nothing freed) for any other.
  bool free(void* p) noexcept;

  struct Stats {
    std::size_t arenas = 0;
    std::size_t arena_bytes = 0;  // mapped by the arenas in all
    std::size_t live_bytes = 0;   // in blocks handed out
    std::size_t live_blocks = 0;
  };
  Stats stats() const;

 private:
  struct Arena {
    char* base = nullptr;
    std::size_t bytes = 0;
    std::map<std::size_t, std::size_t> free;  // offset -> length, disjoint, never adjacent
  };
  struct Live {
    Arena* arena;
    std::size_t offset;
    std::size_t length;
  };

  mutable std::mutex mu_;
  std::size_t page_;
  std::size_t arena_bytes_;
  std::vector<std::unique_ptr<Arena>> arenas_;
  std::unordered_map<const void*, Live> live_;
  std::size_t live_bytes_ = 0;
};

}  // namespace cclz::detail
