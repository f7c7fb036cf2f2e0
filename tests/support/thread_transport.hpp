// In-process transport for unit tests: every rank is a thread and messages
// are copied through a shared mailbox. It follows the Transport contract
// (matching order, exact lengths, deadlines, cancel, fail) so algorithms can
// be tested for every rank count without processes.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "transport.hpp"

namespace cclz::testing {

class ThreadFabric;

class ThreadTransport final : public detail::Transport {
 public:
  ThreadTransport(std::shared_ptr<ThreadFabric> fabric, int rank);
  ~ThreadTransport() override;
  int rank() const override { return rank_; }
  int size() const override;
  const char* name() const override { return "threads"; }
  Status post_send(int peer, std::uint64_t tag, const void* buf, std::size_t bytes, detail::Op* op,
                   Traffic traffic) override;
  Status post_recv(int peer, std::uint64_t tag, void* buf, std::size_t bytes, detail::Op* op,
                   Traffic traffic) override;
  Status wait(std::span<detail::Op* const> ops, detail::Clock::time_point deadline) override;
  void cancel(detail::Op* op) override;
  void fail(const Status& why) override;

 private:
  std::shared_ptr<ThreadFabric> fabric_;
  int rank_;
};

class ThreadFabric {
 public:
  explicit ThreadFabric(int size) : size_(size) {}
  int size() const { return size_; }

 private:
  friend class ThreadTransport;
  using Key = std::tuple<int, int, int, std::uint64_t>;  // src, dst, traffic, tag
  struct PostedRecv {
    void* buf;
    std::size_t bytes;
    detail::Op* op;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<Key, std::deque<std::vector<unsigned char>>> unexpected_;
  std::map<Key, std::deque<PostedRecv>> posted_;
  std::vector<Status> failed_ = {};
  int size_;
};

// Runs fn(transport, rank) on `n` threads over one fabric and returns when
// every one has returned. The threads are held for the next call: a rank's
// thread_local state may outlive the call.
void run_ranks(int n, const std::function<void(detail::Transport&, int rank)>& fn);

// Whether the sweeps over group sizes 1-8 take this size. Under
// AddressSanitizer (scripts/test.sh runs the unit suite there a second
// time, at about five times the cost) they take 1-5: every size up to 4 and
// a non-power of two above it. The release run takes all eight.
constexpr bool sweep_group_size(int n) {
#if defined(__SANITIZE_ADDRESS__)
  return n <= 5;
#else
  return n >= 1;
#endif
}

}  // namespace cclz::testing
