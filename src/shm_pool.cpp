#include "shm_pool.hpp"

#include <unistd.h>

#include "cclz/cclz.hpp"

namespace cclz::detail {

ShmPool::ShmPool(std::size_t arena_bytes) : page_(static_cast<std::size_t>(sysconf(_SC_PAGESIZE))) {
  arena_bytes_ = (arena_bytes + page_ - 1) / page_ * page_;
}

ShmPool::~ShmPool() {
  for (auto& a : arenas_) (void)mem_free(a->base);
}

void* ShmPool::allocate(std::size_t bytes) noexcept {
  if (bytes == 0 || bytes > (std::size_t{1} << 46)) return nullptr;
  const std::size_t length = (bytes + page_ - 1) / page_ * page_;
  std::lock_guard<std::mutex> lock(mu_);
  // Records the block first (the one step that can throw), then shrinks the
  // free range in place: a failure leaves the pool as it was.
  auto take = [&](Arena& a, std::map<std::size_t, std::size_t>::iterator it) {
    const std::size_t offset = it->first, room = it->second;
    void* p = a.base + offset;
    live_.emplace(p, Live{&a, offset, length});
    live_bytes_ += length;
    auto node = a.free.extract(it);
    if (room > length) {
      node.key() = offset + length;
      node.mapped() = room - length;
      a.free.insert(std::move(node));
    }
    return p;
  };
  try {
    for (auto& a : arenas_) {
      for (auto it = a->free.begin(); it != a->free.end(); ++it) {
        if (it->second >= length) return take(*a, it);
      }
    }
    auto a = std::make_unique<Arena>();
    a->bytes = std::max(arena_bytes_, length);
    void* base = nullptr;
    if (!mem_alloc(&base, a->bytes).ok()) return nullptr;
    a->base = static_cast<char*>(base);
    auto it = a->free.emplace(0, a->bytes).first;
    arenas_.push_back(std::move(a));
    return take(*arenas_.back(), it);
  } catch (...) {  // bad_alloc from the bookkeeping: the caller falls back
    return nullptr;
  }
}

bool ShmPool::free(void* p) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  auto found = live_.find(p);
  if (found == live_.end()) return false;
  const Live l = found->second;
  live_.erase(found);
  live_bytes_ -= l.length;
  auto& free = l.arena->free;
  std::size_t offset = l.offset, length = l.length;
  // Merge with the free neighbours so that large blocks can be had again.
  auto next = free.lower_bound(offset);
  if (next != free.end() && next->first == offset + length) {
    length += next->second;
    next = free.erase(next);
  }
  if (next != free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += length;
      return true;
    }
  }
  free.emplace_hint(next, offset, length);
  return true;
}

ShmPool::Stats ShmPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s;
  s.arenas = arenas_.size();
  for (const auto& a : arenas_) s.arena_bytes += a->bytes;
  s.live_bytes = live_bytes_;
  s.live_blocks = live_.size();
  return s;
}

}  // namespace cclz::detail
