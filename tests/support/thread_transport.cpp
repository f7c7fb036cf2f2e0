#include "thread_transport.hpp"

#include <pthread.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

// The rank threads persist between run_ranks calls. A unit sweep runs
// thousands of short cases of 1-8 rank threads each; starting and ending a
// thread per rank and case cost more than the cases (on this 2-vCPU host,
// whose shadow page tables make every fresh mapping slow): glibc keeps
// only 40 MiB of exited threads' stacks, so most 8 MiB stacks were mapped
// anew, their TLS zeroed and their unmapping shot down the TLBs, and under
// AddressSanitizer each thread's own structures were mapped and unmapped
// too. Held threads: reduce_binomial 7.0 -> 3.0 s, the unit suite 76 ->
// 42 s, and 146 -> 97 s under AddressSanitizer.
class RankPool {
 public:
  static RankPool& instance() {
    // Never destroyed: the workers wait in it until the process exits.
    static RankPool* pool = new RankPool;
    return *pool;
  }

  // Runs job(0) .. job(n-1), each on its own thread, and returns when all
  // have returned. Calls from a rank thread itself (a rank that starts
  // ranks) would wait on their own pool, so they get threads of their own.
  void run(int n, const std::function<void(int)>& job) {
    if (t_in_pool) {
      run_fresh(n, job);
      return;
    }
    std::lock_guard one(run_mu_);
    std::unique_lock lk(mu_);
    while (workers_ < n) start_worker(workers_++);
    job_ = &job;
    want_ = n;
    pending_ = n;
    ++generation_;
    work_cv_.notify_all();
    done_cv_.wait(lk, [&] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  RankPool() = default;

  struct Start {
    RankPool* pool;
    int index;
  };

  static void* worker_main(void* arg) noexcept {
    const Start s = *static_cast<Start*>(arg);
    delete static_cast<Start*>(arg);
    t_in_pool = true;
    s.pool->serve(s.index);
    return nullptr;
  }

  void serve(int index) {
    std::uint64_t seen = 0;
    std::unique_lock lk(mu_);
    for (;;) {
      work_cv_.wait(lk, [&] { return generation_ != seen; });
      seen = generation_;
      if (index >= want_) continue;
      const std::function<void(int)>* job = job_;
      lk.unlock();
      (*job)(index);
      lk.lock();
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }

  void start_worker(int index) {
    pthread_t th;
    auto* s = new Start{this, index};
    if (const int e = pthread_create(&th, nullptr, worker_main, s); e != 0) {
      std::fprintf(stderr, "run_ranks: cannot start rank thread %d: %s\n", index, std::strerror(e));
      std::abort();
    }
    pthread_detach(th);
  }

  static void run_fresh(int n, const std::function<void(int)>& job) {
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) threads.emplace_back([&job, r] { job(r); });
    for (auto& t : threads) t.join();
  }

  static thread_local bool t_in_pool;
  std::mutex run_mu_;  // one run at a time
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  const std::function<void(int)>* job_ = nullptr;
  std::uint64_t generation_ = 0;
  int want_ = 0, pending_ = 0, workers_ = 0;
};

thread_local bool RankPool::t_in_pool = false;

}  // namespace

void run_ranks(int n, const std::function<void(detail::Transport&, int rank)>& fn) {
  auto fabric = std::make_shared<ThreadFabric>(n);
  std::vector<std::unique_ptr<ThreadTransport>> ts;
  for (int r = 0; r < n; ++r) ts.push_back(std::make_unique<ThreadTransport>(fabric, r));
  RankPool::instance().run(n, [&](int r) { fn(*ts[static_cast<std::size_t>(r)], r); });
}

}  // namespace cclz::testing
