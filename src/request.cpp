// Request: the handle on one queued operation. Completion is an atomic flag
// waited on with C++20 atomic wait (a futex, with no syscall when nobody
// sleeps on it). A waiter first offers to run the engine's queue itself (see
// Engine::wait), which is what makes blocking calls cheap.
// Cost: test() is one atomic load; wait() on a finished request likewise.
#include <thread>

#include "comm_impl.hpp"

namespace cclz {

namespace detail {

void RequestState::complete(Status st) noexcept {
  status = std::move(st);
  done.store(true, std::memory_order_release);
  done.notify_all();
}

}  // namespace detail

Request Request::failed(Status st) {
  auto s = std::make_shared<detail::RequestState>();
  s->complete(std::move(st));
  return Request(std::move(s));
}

Status Request::wait() {
  if (!s_) return {};
  if (s_->done.load(std::memory_order_acquire)) return s_->status;
  if (auto e = s_->engine.lock()) return e->wait(*s_);
  // No engine any more: it completed every request before going away.
  s_->done.wait(false, std::memory_order_acquire);
  return s_->status;
}

bool Request::test(Status* st) {
  if (!s_) {
    if (st != nullptr) *st = Status{};
    return true;
  }
  if (!s_->done.load(std::memory_order_acquire)) {
    if (auto e = s_->engine.lock()) e->expedite();
    // A loop polling test() must not starve the thread that does the work
    // when ranks outnumber cores.
    std::this_thread::yield();
    return false;
  }
  if (st != nullptr) *st = s_->status;
  return true;
}

}  // namespace cclz
