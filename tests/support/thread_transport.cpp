#include "thread_transport.hpp"

#include <pthread.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

namespace cclz::testing {

using detail::Op;

ThreadTransport::ThreadTransport(std::shared_ptr<ThreadFabric> fabric, int rank)
    : fabric_(std::move(fabric)), rank_(rank) {
  std::lock_guard lk(fabric_->mu_);
  if (fabric_->failed_.size() < static_cast<std::size_t>(fabric_->size_)) {
    fabric_->failed_.resize(static_cast<std::size_t>(fabric_->size_));
  }
}

ThreadTransport::~ThreadTransport() = default;

int ThreadTransport::size() const { return fabric_->size(); }

static void complete_recv(Op* op, const std::vector<unsigned char>& msg, void* buf, std::size_t bytes) {
  if (msg.size() != bytes) {
    op->status = Status(Result::invalid_usage, "message from rank " + std::to_string(op->peer) + " has " +
                                                   std::to_string(msg.size()) + " bytes, expected " +
                                                   std::to_string(bytes));
  } else if (bytes > 0) {
    std::memcpy(buf, msg.data(), bytes);
  }
  op->done = true;
}

Status ThreadTransport::post_send(int peer, std::uint64_t tag, const void* buf, std::size_t bytes, Op* op,
                                  Traffic traffic) {
  if (peer < 0 || peer >= size()) return {Result::invalid_argument, "bad peer " + std::to_string(peer)};
  *op = Op{};
  op->peer = peer;
  op->is_send = true;
  op->bytes = bytes;
  auto& f = *fabric_;
  std::lock_guard lk(f.mu_);
  if (!f.failed_[static_cast<std::size_t>(rank_)].ok()) return f.failed_[static_cast<std::size_t>(rank_)];
  const auto* p = static_cast<const unsigned char*>(buf);
  std::vector<unsigned char> msg(p, p + bytes);
  ThreadFabric::Key key{rank_, peer, static_cast<int>(traffic), tag};
  auto it = f.posted_.find(key);
  if (it != f.posted_.end() && !it->second.empty()) {
    ThreadFabric::PostedRecv r = it->second.front();
    it->second.pop_front();
    r.op->handle = nullptr;
    complete_recv(r.op, msg, r.buf, r.bytes);
  } else {
    f.unexpected_[key].push_back(std::move(msg));
  }
  op->done = true;  // eager: the data has been copied
  f.cv_.notify_all();
  return {};
}

Status ThreadTransport::post_recv(int peer, std::uint64_t tag, void* buf, std::size_t bytes, Op* op,
                                  Traffic traffic) {
  if (peer < 0 || peer >= size()) return {Result::invalid_argument, "bad peer " + std::to_string(peer)};
  *op = Op{};
  op->peer = peer;
  op->bytes = bytes;
  auto& f = *fabric_;
  std::lock_guard lk(f.mu_);
  if (!f.failed_[static_cast<std::size_t>(rank_)].ok()) return f.failed_[static_cast<std::size_t>(rank_)];
  ThreadFabric::Key key{peer, rank_, static_cast<int>(traffic), tag};
  auto it = f.unexpected_.find(key);
  if (it != f.unexpected_.end() && !it->second.empty()) {
    complete_recv(op, it->second.front(), buf, bytes);
    it->second.pop_front();
    return {};
  }
  f.posted_[key].push_back({buf, bytes, op});
  op->handle = op;  // marks "posted, not matched"
  return {};
}

Status ThreadTransport::wait(std::span<Op* const> ops, detail::Clock::time_point deadline) {
  auto& f = *fabric_;
  std::unique_lock lk(f.mu_);
  for (;;) {
    const Status& failed = f.failed_[static_cast<std::size_t>(rank_)];
    if (!failed.ok()) return failed;
    bool all = true;
    for (Op* op : ops) {
      if (op->done && !op->status.ok()) return op->status;
      all = all && op->done;
    }
    if (all) return {};
    if (f.cv_.wait_until(lk, deadline) == std::cv_status::timeout) {
      std::string who;
      for (Op* op : ops) {
        if (!op->done) who += (who.empty() ? "" : ", ") + std::to_string(op->peer);
      }
      return {Result::timeout, "timed out waiting for rank(s) " + who};
    }
  }
}

void ThreadTransport::cancel(Op* op) {
  auto& f = *fabric_;
  std::lock_guard lk(f.mu_);
  for (auto& [key, q] : f.posted_) {
    q.erase(std::remove_if(q.begin(), q.end(), [&](const ThreadFabric::PostedRecv& r) { return r.op == op; }),
            q.end());
  }
  op->handle = nullptr;
}

void ThreadTransport::fail(const Status& why) {
  auto& f = *fabric_;
  std::lock_guard lk(f.mu_);
  f.failed_[static_cast<std::size_t>(rank_)] = why;
  f.cv_.notify_all();
}

namespace {

// Rank threads get stacks of this size, not the default (the stack limit,
// 8 MiB here): glibc keeps up to 40 MiB of exited threads' stacks for reuse,
// so with 8 MiB stacks a sweep of 6-8 rank threads per case mapped fresh
// stacks for most threads of every case, and the page faults, the zeroing
// of their TLS and the unmapping's TLB shootdowns took about half of the
// unit suite's sweeps (reduce_binomial 7.0 -> 3.8 s). Ample for the ranks'
// frames, ASan's redzones included.
constexpr std::size_t kRankStackBytes = std::size_t{2} << 20;

struct RankThread {
  const std::function<void(detail::Transport&, int)>* fn;
  detail::Transport* transport;
  int rank;
};

extern "C" void* rank_thread_main(void* arg) noexcept {
  const auto* t = static_cast<const RankThread*>(arg);
  (*t->fn)(*t->transport, t->rank);
  return nullptr;
}

}  // namespace

void run_ranks(int n, const std::function<void(detail::Transport&, int rank)>& fn) {
  auto fabric = std::make_shared<ThreadFabric>(n);
  std::vector<std::unique_ptr<ThreadTransport>> ts;
  std::vector<RankThread> args;
  for (int r = 0; r < n; ++r) {
    ts.push_back(std::make_unique<ThreadTransport>(fabric, r));
    args.push_back({&fn, ts.back().get(), r});
  }
  pthread_attr_t attr;
  if (pthread_attr_init(&attr) != 0 || pthread_attr_setstacksize(&attr, kRankStackBytes) != 0) {
    throw std::runtime_error("cannot set a rank thread's stack size");
  }
  std::vector<pthread_t> threads(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    const auto i = static_cast<std::size_t>(r);
    if (const int e = pthread_create(&threads[i], &attr, rank_thread_main, &args[i]); e != 0) {
      // The started ranks may wait on this one forever: nothing to join.
      std::fprintf(stderr, "run_ranks: cannot start rank %d: %s\n", r, std::strerror(e));
      std::abort();
    }
  }
  pthread_attr_destroy(&attr);
  for (pthread_t t : threads) pthread_join(t, nullptr);
}

}  // namespace cclz::testing
