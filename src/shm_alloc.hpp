// Host buffers that the other processes of a node can map: the allocator
// behind cclz::mem_alloc, and the lookup the node-local collectives use to
// tell whether a call's buffers came from it.
//
// Each allocation is its own memfd, mapped shared in the allocating process
// and kept open there, so that a peer can take a duplicate of the descriptor
// (pidfd_getfd) and map the same pages. The registry of live allocations is
// process-wide (a registry, guarded by a mutex); allocation ids are never
// reused, so a peer's cached mapping of a freed buffer is never mistaken for
// a new one.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cclz::detail {

// Where a byte range of this process lives, as a peer needs it to map it.
struct SharedRange {
  int fd = -1;               // the memfd, open in this process
  std::uint64_t id = 0;      // the allocation's id, unique within this process
  std::size_t offset = 0;    // of the range's first byte within the allocation
  std::size_t map_bytes = 0; // the allocation's mapped size (whole pages)
};

// Whether [p, p + bytes) lies inside one live mem_alloc allocation of this
// process; fills *out when it does. bytes == 0 never does.
bool find_shared_range(const void* p, std::size_t bytes, SharedRange* out) noexcept;

}  // namespace cclz::detail
