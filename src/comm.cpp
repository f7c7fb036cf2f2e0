// Comm and its progress engine (see comm_impl.hpp for the execution model).
//
// Follows NCCL's and MPI's contract: every rank issues the same collectives
// in the same order; a collective's sequence number (counted per
// communicator) is therefore the same on every rank and keys its tags. avg
// is sum followed by kernels::divide, on every rank's identical bytes or, in
// an algorithm that divides, on each share by its one owner, so the results
// stay bitwise identical.
//
// Cost per collective on top of the algorithm: argument checks and the
// tuner on the caller's thread (O(1), O(n) for all_to_allv), a Group built
// per call (O(n) copies), and with CCLZ_CHECK=1 one all-to-all exchange of a
// 24-byte record (n-1 sends and receives per rank) before the algorithm.
#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "comm_impl.hpp"
#include "kernels.hpp"
#include "log.hpp"
#include "shm_setup.hpp"

namespace cclz {

namespace detail {

namespace {

using coll::CollArgs;
using coll::CollKind;

std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string fmt_ms(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f ms", s * 1e3);
  return buf;
}

bool is_reducing(CollKind k) noexcept {
  return k == CollKind::all_reduce || k == CollKind::reduce_scatter || k == CollKind::reduce;
}

bool is_rooted(CollKind k) noexcept { return k == CollKind::broadcast || k == CollKind::reduce; }

// True when [a, a+na) and [b, b+nb) share a byte.
bool overlap(const void* a, std::size_t na, const void* b, std::size_t nb) noexcept {
  if (na == 0 || nb == 0 || a == nullptr || b == nullptr) return false;
  const auto pa = reinterpret_cast<std::uintptr_t>(a), pb = reinterpret_cast<std::uintptr_t>(b);
  return pa < pb + nb && pb < pa + na;
}

// x * y, or false on overflow.
bool mul(std::size_t x, std::size_t y, std::size_t* out) noexcept {
  if (y != 0 && x > std::numeric_limits<std::size_t>::max() / y) return false;
  *out = x * y;
  return true;
}

std::size_t total(std::span<const std::size_t> v) {
  std::size_t s = 0;
  for (std::size_t x : v) s += x;
  return s;
}

// Every rank sends `mine` (same length everywhere) to every other rank.
// Direct exchange: n-1 sends and receives per rank, one round trip. Used for
// split's (color, key) and CCLZ_CHECK's records, which are tiny.
Status exchange_all(coll::Group& g, std::span<const std::byte> mine, std::vector<std::byte>* all) {
  const int n = g.size(), me = g.rank();
  const std::size_t len = mine.size();
  all->assign(len * static_cast<std::size_t>(n), std::byte{0});
  if (len > 0) std::memcpy(all->data() + len * static_cast<std::size_t>(me), mine.data(), len);
  if (n == 1) return {};
  std::vector<Op> ops(2 * static_cast<std::size_t>(n - 1));
  std::vector<Op*> posted;
  posted.reserve(ops.size());
  std::size_t k = 0;
  Status st;
  for (int p = 0; p < n && st.ok(); ++p) {
    if (p == me) continue;
    st = g.irecv(p, 0, all->data() + len * static_cast<std::size_t>(p), len, &ops[k]);
    if (st.ok()) posted.push_back(&ops[k]);
    ++k;
  }
  for (int p = 0; p < n && st.ok(); ++p) {
    if (p == me) continue;
    st = g.isend(p, 0, mine.data(), len, &ops[k]);
    if (st.ok()) posted.push_back(&ops[k]);
    ++k;
  }
  if (!st.ok()) {
    // Let the group cancel what was posted: a wait with a passed deadline.
    (void)g.wait(posted);
    return st;
  }
  return g.wait(posted);
}

void put_u32(std::byte* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void put_u64(std::byte* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
std::uint32_t get_u32(const std::byte* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(p[i]) << (8 * i);
  return v;
}
std::uint64_t get_u64(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

// CCLZ_CHECK's per-rank record of a collective call.
struct CheckRecord {
  static constexpr std::size_t kBytes = 24;
  std::uint32_t kind = 0, dt = 0, op = 0, root = 0;
  std::uint64_t count = 0;

  void store(std::byte* p) const {
    put_u32(p, kind);
    put_u32(p + 4, dt);
    put_u32(p + 8, op);
    put_u32(p + 12, root);
    put_u64(p + 16, count);
  }
  static CheckRecord load(const std::byte* p) {
    return {get_u32(p), get_u32(p + 4), get_u32(p + 8), get_u32(p + 12), get_u64(p + 16)};
  }
  bool operator==(const CheckRecord&) const = default;
  std::string describe() const {
    const auto k = static_cast<CollKind>(kind);
    std::string s = std::string(coll::coll_name(k)) + " " + std::to_string(count) + " x " +
                    dtype_name(static_cast<DataType>(dt));
    if (is_reducing(k)) s += std::string(" ") + op_name(static_cast<ReduceOp>(op));
    if (is_rooted(k)) s += " root " + std::to_string(root);
    return s;
  }
};

// "rank 3" or "ranks 0, 1, 4"
std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// Errors after which this communicator's ranks may disagree on what was
// delivered. A send/recv length mismatch leaves the pair's counters in step,
// so it does not poison; anything else from a running operation does.
bool poisons_p2p(Result code) noexcept { return code != Result::invalid_usage && code != Result::invalid_argument; }

}  // namespace

std::string Task::describe() const {
  std::string s;
  switch (type) {
    case Type::collective: {
      const std::size_t count = args.kind == CollKind::all_to_allv ? total(args.send_counts) : args.count;
      s = std::string(coll::coll_name(args.kind)) + " #" + std::to_string(seq) + " (" +
          (algo != nullptr ? algo->name : "-") + ", " + std::to_string(count) + " x " + dtype_name(args.dt) + ")";
      break;
    }
    case Type::send:
    case Type::recv:
      s = std::string(type == Type::send ? "send #" : "recv #") + std::to_string(seq) +
          (type == Type::send ? " (to rank " : " (from rank ") + std::to_string(peer) + ", " +
          std::to_string(args.count) + " x " + dtype_name(args.dt) + ")";
      break;
    case Type::custom:
      s = std::string(name != nullptr ? name : "custom") + " #" + std::to_string(seq) + " (" + detail + ")";
      break;
  }
  return s;
}

// ------------------------------------------------------------------ Engine

Engine::Engine(int rank, std::unique_ptr<Transport> transport, std::unique_ptr<ShmWindow> shm,
               std::vector<int> node_of, const Config& cfg, bool oversubscribed)
    : rank_(rank),
      size_(transport->size()),
      transport_(std::move(transport)),
      shm_(std::move(shm)),
      transport_name_(transport_->name()),
      shape_(coll::Group::make_shape(
          [n = transport_->size()] {
            std::vector<int> m(static_cast<std::size_t>(n));
            for (int i = 0; i < n; ++i) m[static_cast<std::size_t>(i)] = i;
            return m;
          }(),
          std::move(node_of))),
      cfg_(cfg),
      oversubscribed_(oversubscribed),
      send_seq_(static_cast<std::size_t>(size_), 0),
      recv_seq_(static_cast<std::size_t>(size_), 0) {}

Engine::~Engine() {
  (void)shutdown();
  if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
}

Status Engine::start() {
  try {
    worker_ = std::thread([this] { worker_main(); });
  } catch (const std::exception& e) {
    return {Result::system_error, std::string("cannot start the progress thread: ") + e.what()};
  }
  return {};
}

std::string Engine::message(const Task& t, const std::string& cause) const {
  return "rank " + std::to_string(rank_) + ": " + t.describe() + ": " + cause;
}

std::uint64_t Engine::peek_seq(const Task& t) const {
  std::lock_guard lk(mu_);
  const auto p = static_cast<std::size_t>(t.peer);
  switch (t.type) {
    case Task::Type::send: return t.peer >= 0 && t.peer < size_ ? send_seq_[p] : 0;
    case Task::Type::recv: return t.peer >= 0 && t.peer < size_ ? recv_seq_[p] : 0;
    default: return next_seq_;
  }
}

Status Engine::rejection(const Task& t) const {
  if (destroyed_) return {Result::invalid_usage, message(t, "communicator was destroyed")};
  if (!async_error_.ok()) {
    return {async_error_.code(), message(t, "communicator failed earlier: " + async_error_.message())};
  }
  if (!accepting_) return {Result::invalid_usage, message(t, "communicator is shutting down")};
  return {};
}

Status Engine::check_open(Task& t) const {
  std::lock_guard lk(mu_);
  // The number this call would get, so its message reads like the others.
  const auto p = static_cast<std::size_t>(t.peer);
  const bool peer_ok = t.peer >= 0 && t.peer < size_;
  switch (t.type) {
    case Task::Type::send: t.seq = peer_ok ? send_seq_[p] : 0; break;
    case Task::Type::recv: t.seq = peer_ok ? recv_seq_[p] : 0; break;
    default: t.seq = next_seq_; break;
  }
  return rejection(t);
}

Status Engine::async_error() const {
  std::lock_guard lk(mu_);
  return async_error_;
}

bool Engine::destroyed() const {
  std::lock_guard lk(mu_);
  return destroyed_;
}

Request Engine::submit(std::unique_ptr<Task> t) {
  auto req = std::make_shared<RequestState>();
  req->engine = weak_from_this();
  t->req = req;
  bool wake = false;
  {
    std::lock_guard lk(mu_);
    const auto p = static_cast<std::size_t>(t->peer);
    switch (t->type) {
      case Task::Type::send: t->seq = send_seq_[p]; break;
      case Task::Type::recv: t->seq = recv_seq_[p]; break;
      default: t->seq = next_seq_; break;
    }
    if (Status why = rejection(*t); !why.ok()) {
      req->complete(std::move(why));
      return Request(std::move(req));
    }
    switch (t->type) {
      case Task::Type::send: ++send_seq_[p]; break;
      case Task::Type::recv: ++recv_seq_[p]; break;
      default: ++next_seq_; break;
    }
    if (log::enabled(cfg_.log_level, LogLevel::trace)) {
      log::write(LogLevel::trace, rank_, "queued " + t->describe());
    }
    t->submitted = Clock::now();
    queue_.push_back(std::move(t));
    // A running runner picks the task up and a polling worker finds it; a
    // worker asleep is woken, since the caller may never wait and the work
    // must still progress. But not while the program waits on its calls
    // (the last queued work was run by a waiter): a blocking call runs on
    // its waiter anyway, and the wake-up is a context switch per call on
    // the caller's core (with a rank bound to a core, the worker shares it),
    // a second when the worker's grace period ends, and the worker's
    // wake-ups landing in the middle of later calls stall the peers: on 2
    // bound ranks a 1 MB all-to-all took 38.3 us with it, 29.0 without.
    // Nor when this host's ranks outnumber its cores (4 KB all-reduce at 4
    // ranks on 2 cores: 47-67 us with it, 10-15 us without). A call nobody
    // waits on or tests then starts when the worker's idle wait ends
    // (kIdleProgress, 2 ms), and the worker running it turns the wake-ups
    // back on.
    wake = worker_sleeping_ && !runner_active_ && !oversubscribed_ && !waiters_run_;
    if (wake) ++worker_kicks_;
  }
  if (wake) worker_cv_.notify_one();
  return Request(std::move(req));
}

// The worker exists for calls nobody waits on (overlap with computation).
// Blocking calls are cheaper run by their waiter, so a queued call first gets
// a grace period for that; waking this thread on every call would cost a
// futex wake and a context switch per call, which on a host with more ranks
// than cores lands on another rank's critical path. So after the communicator
// was used the worker polls with timed sleeps (never a spin) whose interval
// doubles from kGrace to kMaxPoll, then sleeps until submit() kicks it (only
// when nobody waits on the calls, see submit()) or kIdleProgress passes: a
// handful of wake-ups per busy period instead of one per call. (Measured
// with tests/comm/cclz-comm-bench, 8 ranks on 2 cores, 4 KB all-reduce:
// polling every 100 us made blocking calls ~1.8x slower than the bare
// algorithm; with the back-off they are no slower.) An unwaited call starts
// between kGrace and about kMaxPoll after it was issued, at once if its
// request is polled with test(); a waited one runs on its waiter.
void Engine::worker_main() {
  constexpr auto kGrace = std::chrono::microseconds(100);
  constexpr auto kMaxPoll = std::chrono::microseconds(1600);
  constexpr auto kIdleProgress = std::chrono::milliseconds(2);
  std::unique_lock lk(mu_);
  auto poll = kGrace;
  for (;;) {
    if (stop_ && !has_work_locked() && !runner_active_) return;
    if (!runner_active_ && !closed_ && has_work_locked()) {
      // In-flight sends/receives and draining (destroy) do not wait.
      const bool due =
          stop_ || expedite_ || flights_n_ > 0 || Clock::now() - queue_.front()->submitted >= kGrace;
      if (due) {
        expedite_ = false;
        waiters_run_ = false;
        runner_active_ = true;
        runner_thread_ = std::this_thread::get_id();
        lk.unlock();
        run(nullptr);
        release_runner();
        lk.lock();
        poll = kGrace;
        continue;
      }
      worker_cv_.wait_until(lk, queue_.front()->submitted + kGrace);
      continue;
    }
    if (poll > kMaxPoll) {
      // Idle, yet the transport may owe peers protocol work (a rendezvous
      // acknowledgement for data this rank already took): progress it every
      // kIdleProgress, or a peer's send stalls while this rank's program is
      // busy elsewhere (seen: 64 MB ring all-reduce on 3-4 ranks).
      if (!runner_active_ && !closed_ && !stop_) {
        runner_active_ = true;
        runner_thread_ = std::this_thread::get_id();
        lk.unlock();
        transport_->progress();
        release_runner();
        lk.lock();
        if (has_work_locked()) continue;
      }
      worker_sleeping_ = true;
      worker_cv_.wait_for(lk, kIdleProgress);
      worker_sleeping_ = false;
      continue;
    }
    worker_cv_.wait_for(lk, poll);
    poll *= 2;
  }
}

void Engine::release_runner() {
  bool wake_worker = false, wake_idle = false;
  {
    std::lock_guard lk(mu_);
    runner_active_ = false;
    runner_thread_ = {};
    // An inline runner stops once its own request is done; whatever is left
    // goes back to the worker.
    wake_worker = has_work_locked() || stop_;
    wake_idle = idle_waiters_ > 0;
  }
  if (wake_worker) worker_cv_.notify_one();
  if (wake_idle) idle_cv_.notify_all();
}

std::uint64_t Engine::worker_kicks() const {
  std::lock_guard lk(mu_);
  return worker_kicks_;
}

void Engine::expedite() {
  bool wake = false;
  {
    std::lock_guard lk(mu_);
    // Someone polls test() instead of waiting: nobody will run the queue
    // inline, so the worker need not give the caller its grace period.
    if (!runner_active_ && !queue_.empty() && !expedite_) {
      expedite_ = true;
      wake = true;
    }
  }
  if (wake) worker_cv_.notify_one();
}

Status Engine::wait(RequestState& r) {
  for (;;) {
    if (r.done.load(std::memory_order_acquire)) return r.status;
    bool claimed = false;
    {
      std::lock_guard lk(mu_);
      if (runner_active_ && runner_thread_ == std::this_thread::get_id()) {
        return {Result::invalid_usage, "rank " + std::to_string(rank_) +
                                           ": waiting on a request of this communicator from inside its own "
                                           "progress engine would deadlock"};
      }
      if (!runner_active_ && !closed_ && has_work_locked()) {
        runner_active_ = true;
        runner_thread_ = std::this_thread::get_id();
        claimed = true;
        waiters_run_ = true;
      }
    }
    if (claimed) {
      run(&r);
      release_runner();
      continue;
    }
    // Another thread runs the queue and will complete r (bounded by
    // CCLZ_TIMEOUT); sleep on r's flag.
    r.done.wait(false, std::memory_order_acquire);
  }
}

void Engine::run(RequestState* target) {
  for (;;) {
    if (target != nullptr && target->done.load(std::memory_order_acquire)) return;
    std::unique_ptr<Task> t;
    {
      std::lock_guard lk(mu_);
      if (!queue_.empty()) {
        t = std::move(queue_.front());
        queue_.pop_front();
      }
    }
    if (t) {
      execute(std::move(t));
      if (!flights_.empty()) {
        // Notice finished sends/receives without waiting for them.
        std::vector<Op*> ops;
        for (auto& f : flights_) ops.push_back(&f->op);
        reap_flights(transport_->wait(ops, Clock::now()));
      }
      continue;
    }
    if (flights_.empty()) return;
    wait_flights(target);
  }
}

void Engine::fail_task(Task& t, const Status& st, bool poison_comm) {
  // Poison before completing: a caller woken by the failure must already see
  // it in async_error().
  if (poison_comm) poison(st);
  t.req->complete(st);
}

void Engine::record_error(const Status& st) {
  std::lock_guard lk(mu_);
  if (async_error_.ok()) async_error_ = st;
}

void Engine::poison(const Status& st) {
  std::deque<std::unique_ptr<Task>> dropped;
  {
    std::lock_guard lk(mu_);
    if (async_error_.ok()) async_error_ = st;
    dropped.swap(queue_);
  }
  if (log::enabled(cfg_.log_level, LogLevel::warn)) {
    log::write(LogLevel::warn, rank_, "communicator failed: " + st.message());
  }
  // Peers blocked on this rank in the shared-memory window stop at once
  // instead of waiting out their timeout. A timeout is not passed on: the
  // peers are waiting for the same late rank and report it themselves.
  if (shm_ && st.code() != Result::timeout) shm_->fail(st);
  const std::string why = "communicator failed earlier: " + st.message();
  for (auto& t : dropped) t->req->complete({st.code(), message(*t, why)});
  // The runner owns the flights; cancel them so their buffers are free.
  for (auto& f : flights_) {
    if (!f->op.done) transport_->cancel(&f->op);
    f->req->complete({st.code(), message(*f, why)});
  }
  flights_.clear();
  std::lock_guard lk(mu_);
  flights_n_ = 0;
}

void Engine::execute(std::unique_ptr<Task> t) {
  switch (t->type) {
    case Task::Type::collective:
    case Task::Type::custom: {
      Status st = run_collective(*t);
      if (st.ok()) {
        t->req->complete({});
      } else {
        std::string cause = st.message();
        if (st.code() == Result::timeout) cause += " (CCLZ_TIMEOUT=" + fmt_seconds(cfg_.timeout_s) + " s)";
        fail_task(*t, {st.code(), message(*t, cause)}, /*poison_comm=*/true);
      }
      return;
    }
    case Task::Type::send:
    case Task::Type::recv: {
      t->deadline = cfg_.deadline_from_now();
      const std::size_t bytes = t->args.count * dtype_size(t->args.dt);
      const std::uint64_t tag = t->seq & ((std::uint64_t{1} << Transport::kTagBits) - 1);
      const auto traffic = Transport::Traffic::point_to_point;
      Status st = t->type == Task::Type::send
                      ? transport_->post_send(t->peer, tag, t->args.sendbuf, bytes, &t->op, traffic)
                      : transport_->post_recv(t->peer, tag, t->args.recvbuf, bytes, &t->op, traffic);
      if (!st.ok()) {
        fail_task(*t, {st.code(), message(*t, st.message())}, poisons_p2p(st.code()));
        return;
      }
      flights_.push_back(std::move(t));
      std::lock_guard lk(mu_);
      ++flights_n_;
      return;
    }
  }
}

Status Engine::run_collective(Task& t) {
  const Clock::time_point deadline = cfg_.deadline_from_now();
  // Tags of a collective use seq 2s; its CCLZ_CHECK exchange and a split's
  // sub-connection use 2s+1, so neither can match the other's messages.
  coll::Group g(*transport_, shape_, rank_, 2 * t.seq, deadline, scratch_);
  g.attach_shm(shm_.get());
  if (t.type == Task::Type::custom) return t.body(g);
  if (cfg_.check) {
    // A mismatch is found by every rank before any data moves, but it means
    // the ranks' programs are out of step: the communicator is poisoned so
    // that the first cause is what every later call reports.
    if (Status st = check_args(t, deadline); !st.ok()) return st;
  }
  const bool avg = t.user_op == ReduceOp::avg, divides = avg && t.algo->divides;
  if (divides) t.args.divisor = size_;
  if (Status st = t.algo->run(g, t.args); !st.ok()) return st;
  if (avg && !divides) {
    const CollArgs& a = t.args;
    if (a.kind != CollKind::reduce || a.root == rank_) kernels::divide(a.recvbuf, a.count, a.dt, size_);
  }
  return {};
}

Status Engine::check_args(Task& t, Clock::time_point deadline) {
  const CollArgs& a = t.args;
  CheckRecord mine;
  mine.kind = static_cast<std::uint32_t>(a.kind);
  mine.dt = static_cast<std::uint32_t>(a.dt);
  mine.op = is_reducing(a.kind) ? static_cast<std::uint32_t>(t.user_op) : 0;
  mine.root = is_rooted(a.kind) ? static_cast<std::uint32_t>(a.root) : 0;
  // all_to_allv's counts legitimately differ between ranks.
  mine.count = (a.kind == CollKind::all_to_allv || a.kind == CollKind::barrier) ? 0 : a.count;
  std::byte buf[CheckRecord::kBytes];
  mine.store(buf);
  coll::Group g(*transport_, shape_, rank_, 2 * t.seq + 1, deadline, scratch_);
  std::vector<std::byte> all;
  if (Status st = exchange_all(g, buf, &all); !st.ok()) return st;
  // Group ranks by record, in order of first appearance.
  std::vector<std::pair<CheckRecord, std::vector<int>>> groups;
  for (int r = 0; r < size_; ++r) {
    const CheckRecord rec = CheckRecord::load(all.data() + CheckRecord::kBytes * static_cast<std::size_t>(r));
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g2) { return g2.first == rec; });
    if (it == groups.end()) {
      groups.push_back({rec, {r}});
    } else {
      it->second.push_back(r);
    }
  }
  if (groups.size() == 1) return {};
  // Name the fields that differ first, then every rank's call.
  std::string fields;
  auto differs = [&](auto field, const char* name) {
    for (const auto& g2 : groups) {
      if (field(g2.first) != field(groups[0].first)) {
        fields += (fields.empty() ? "" : ", ") + std::string(name);
        return;
      }
    }
  };
  differs([](const CheckRecord& x) { return x.kind; }, "collective");
  differs([](const CheckRecord& x) { return x.count; }, "count");
  differs([](const CheckRecord& x) { return x.dt; }, "data type");
  differs([](const CheckRecord& x) { return x.op; }, "op");
  differs([](const CheckRecord& x) { return x.root; }, "root");
  std::string cause = "CCLZ_CHECK: " + fields + " differ" + (fields.find(',') == std::string::npos ? "s" : "") +
                      " between ranks: ";
  for (std::size_t i = 0; i < groups.size(); ++i) {
    cause += (i ? "; " : "") + rank_list(groups[i].second) + ": " + groups[i].first.describe();
  }
  return {Result::invalid_usage, cause};
}

void Engine::wait_flights(RequestState* target) {
  std::vector<Op*> ops;
  Clock::time_point earliest = Clock::time_point::max();
  for (auto& f : flights_) {
    earliest = std::min(earliest, f->deadline);
    // An inline waiter only needs its own operation.
    if (target == nullptr || f->req.get() == target) ops.push_back(&f->op);
  }
  if (ops.empty()) {
    for (auto& f : flights_) ops.push_back(&f->op);
  }
  // Wait in slices, so work queued meanwhile starts soon; slices grow while
  // nothing happens (50 us to 2 ms) so an idle wait costs little CPU.
  const Clock::time_point until = std::min(earliest, Clock::now() + std::chrono::microseconds(slice_us_));
  const std::size_t before = flights_.size();
  reap_flights(transport_->wait(ops, until));
  bool queued;
  {
    std::lock_guard lk(mu_);
    queued = !queue_.empty();
  }
  slice_us_ = (flights_.size() != before || queued) ? 50 : std::min(2 * slice_us_, 2000);
}

void Engine::reap_flights(const Status& wait_status) {
  const Clock::time_point now = Clock::now();
  Status first_error;
  bool poison_comm = false;
  for (auto it = flights_.begin(); it != flights_.end();) {
    Task& f = **it;
    Status st;
    if (f.op.done) {
      if (!f.op.status.ok()) st = Status(f.op.status.code(), message(f, f.op.status.message()));
    } else if (now >= f.deadline) {
      transport_->cancel(&f.op);
      st = Status(Result::timeout, message(f, "timed out after " + fmt_seconds(cfg_.timeout_s) +
                                                  " s (CCLZ_TIMEOUT) waiting for rank " + std::to_string(f.peer)));
    } else {
      ++it;
      continue;
    }
    if (!st.ok()) {
      if (first_error.ok()) first_error = st;
      if (poisons_p2p(st.code())) {
        poison_comm = true;
        record_error(first_error);  // visible before the waiter wakes
      }
    }
    f.req->complete(std::move(st));
    it = flights_.erase(it);
  }
  if (first_error.ok() && !wait_status.ok() && wait_status.code() != Result::timeout && !flights_.empty()) {
    // The transport itself failed (abort, dead peer): nothing in flight will
    // finish. Blame the oldest operation; poison() fails the rest.
    Task& f = *flights_.front();
    transport_->cancel(&f.op);
    first_error = Status(wait_status.code(), message(f, wait_status.message()));
    record_error(first_error);
    f.req->complete(first_error);
    flights_.erase(flights_.begin());
    poison_comm = true;
  }
  {
    std::lock_guard lk(mu_);
    flights_n_ = flights_.size();
  }
  if (poison_comm) poison(first_error);
}

Status Engine::shutdown() {
  std::lock_guard close(close_mu_);
  {
    std::lock_guard lk(mu_);
    if (closed_) {
      destroyed_ = true;
      return {};
    }
    if (runner_thread_ == std::this_thread::get_id() || worker_.get_id() == std::this_thread::get_id()) {
      return {Result::invalid_usage,
              "rank " + std::to_string(rank_) + ": destroy called from inside the communicator's progress engine"};
    }
    accepting_ = false;
    stop_ = true;
    destroyed_ = true;
  }
  // The worker drains the queue and what is in flight (an inline waiter may
  // help), each wait bounded by CCLZ_TIMEOUT, then exits.
  ShutdownTimes times;
  Clock::time_point t0 = Clock::now();
  worker_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  times.worker_s = seconds_since(t0);
  t0 = Clock::now();
  {
    std::unique_lock lk(mu_);
    ++idle_waiters_;
    idle_cv_.wait(lk, [&] { return !runner_active_ && !has_work_locked(); });
    --idle_waiters_;
    closed_ = true;
  }
  times.idle_s = seconds_since(t0);
  t0 = Clock::now();
  transport_.reset();
  times.transport_s = seconds_since(t0);
  std::lock_guard lk(mu_);
  shutdown_times_ = times;
  return {};
}

Engine::ShutdownTimes Engine::shutdown_times() const {
  std::lock_guard lk(mu_);
  return shutdown_times_;
}

void Engine::abort(const Status& why) {
  std::lock_guard close(close_mu_);
  std::deque<std::unique_ptr<Task>> dropped;
  bool from_engine = false;
  {
    std::lock_guard lk(mu_);
    if (closed_) return;
    accepting_ = false;
    stop_ = true;
    if (async_error_.ok()) async_error_ = Status(why.code(), "rank " + std::to_string(rank_) + ": " + why.message());
    dropped.swap(queue_);
    from_engine =
        runner_thread_ == std::this_thread::get_id() || worker_.get_id() == std::this_thread::get_id();
  }
  worker_cv_.notify_all();
  // Thread-safe by the Transport contract: a wait in progress returns `why`.
  transport_->fail(why);
  if (shm_) shm_->fail(why);
  for (auto& t : dropped) t->req->complete({why.code(), message(*t, why.message())});
  if (from_engine) return;  // the rest happens when the runner unwinds and destroy() runs
  if (worker_.joinable()) worker_.join();
  {
    std::unique_lock lk(mu_);
    ++idle_waiters_;
    idle_cv_.wait(lk, [&] { return !runner_active_; });
    --idle_waiters_;
    closed_ = true;
  }
  // Nobody runs any more: fail what is still in flight.
  for (auto& f : flights_) {
    if (!f->op.done) transport_->cancel(&f->op);
    f->req->complete({why.code(), message(*f, why.message())});
  }
  flights_.clear();
  {
    std::lock_guard lk(mu_);
    flights_n_ = 0;
  }
  transport_.reset();
}

// ---------------------------------------------------------------- CommImpl

CommImpl::CommImpl(World world, Topology topo, const Config& cfg, SubgroupConnector connect,
                   std::unique_ptr<ShmWindow> shm)
    : rank_(world.transport->rank()),
      size_(world.transport->size()),
      ranks_(std::move(world.ranks)),
      topo_(std::move(topo)),
      cfg_(cfg),
      connect_(connect ? std::move(connect) : SubgroupConnector(connect_subgroup)) {
  std::vector<int> members(static_cast<std::size_t>(size_));
  for (int i = 0; i < size_; ++i) members[static_cast<std::size_t>(i)] = i;
  Transport& t = *world.transport;
  tune_group_ = std::make_unique<coll::Group>(t, members, topo_.node_of, rank_, 0, Clock::now(), tune_scratch_);
  tune_group_->attach_shm(shm.get());  // the engine owns it for as long as this group exists
  const bool oversubscribed = host_oversubscribed(ranks_, rank_);
  engine_ = std::make_shared<Engine>(rank_, std::move(world.transport), std::move(shm), topo_.node_of, cfg_,
                                     oversubscribed);
}

CommImpl::~CommImpl() {
  if (engine_) (void)engine_->shutdown();
}

Status CommImpl::create(World world, Topology topo, const Config& cfg, SubgroupConnector connect,
                        std::unique_ptr<Comm>* out, double connect_s) {
  if (!world.transport) return {Result::invalid_argument, "communicator: world has no transport"};
  const int n = world.transport->size(), r = world.transport->rank();
  if (world.ranks.empty()) world.ranks.resize(static_cast<std::size_t>(n));
  if (world.ranks.size() != static_cast<std::size_t>(n) || topo.node_of.size() != static_cast<std::size_t>(n)) {
    return {Result::internal_error, "rank " + std::to_string(r) + ": communicator: " +
                                        std::to_string(world.ranks.size()) + " rank infos for " +
                                        std::to_string(n) + " ranks"};
  }
  SetupTimes times;
  times.connect_s = connect_s;
  std::unique_ptr<ShmWindow> shm;
  std::string no_shm;
  const Clock::time_point shm_t0 = Clock::now();
  const Status shm_st = setup_shm_window(*world.transport, topo, world.ranks, cfg, &shm, &no_shm);
  times.shm_s = seconds_since(shm_t0);
  if (Status st = shm_st; !st.ok()) {
    return {st.code(), "rank " + std::to_string(r) + ": communicator: setting up node-local shared memory: " +
                           st.message()};
  }
  if (!no_shm.empty() && log::enabled(cfg.log_level, LogLevel::warn)) {
    log::write(LogLevel::warn, r, "no node-local shared memory (" + no_shm + "); the node's ranks use the transport");
  }
  if (shm && log::enabled(cfg.log_level, LogLevel::info)) {
    log::write(LogLevel::info, r,
               std::string("node-local shared memory: ") + std::to_string(shm->size()) + " ranks, " +
                   std::to_string(shm->slots()) + " slots of " + std::to_string(shm->slot_bytes() >> 10) +
                   " KiB; " +
                   (shm->oversubscribed() ? "more ranks than CPUs on the host: waits yield, then sleep"
                                          : "the host's ranks have CPUs of their own: waits spin first") +
                   "; CCLZ_SHM_ALLREDUCE_HANDOFFS=" +
                   (shm->allreduce_handoffs() != 0 ? std::to_string(shm->allreduce_handoffs()) : std::string("auto")) +
                   "; CCLZ_SHM_SLOT_STORES=" +
                   (shm->slot_stores() == 0 ? "auto" : shm->slot_stores() == 1 ? "cache" : "memory") +
                   "; CCLZ_SHM_DIRECT_KB=" +
                   (shm->direct_min_bytes() == ShmWindow::kDirectOff ? std::string("off")
                                                                     : std::to_string(shm->direct_min_bytes() >> 10)) +
                   "; CCLZ_SHM_CMA=" + (shm->cma() ? "1" : "0") + "; caches: L2 " + std::to_string(shm->l2_bytes() >> 10) + " KiB, last level " +
                   std::to_string(shm->llc_bytes() >> 10) + " KiB");
  }
  std::unique_ptr<CommImpl> impl;
  try {
    impl = std::make_unique<CommImpl>(std::move(world), std::move(topo), cfg, std::move(connect), std::move(shm));
  } catch (const std::bad_alloc&) {
    return {Result::system_error, "rank " + std::to_string(r) + ": communicator: out of memory"};
  }
  const Clock::time_point start_t0 = Clock::now();
  if (Status st = impl->engine_->start(); !st.ok()) {
    return {st.code(), "rank " + std::to_string(r) + ": communicator: " + st.message()};
  }
  times.start_s = seconds_since(start_t0);
  impl->setup_times_ = times;
  if (log::enabled(cfg.log_level, LogLevel::info)) {
    const Topology& t = impl->topo_;
    const auto me = static_cast<std::size_t>(r);
    const int node = t.node_of[me];
    log::write(LogLevel::info, r,
               std::string("transport ") + impl->engine_->transport_name() + ", rank " + std::to_string(r) +
                   " of " + std::to_string(n) + ", node " + std::to_string(node) + " of " +
                   std::to_string(t.num_nodes()) + " (local rank " + std::to_string(t.local_rank[me]) + " of " +
                   std::to_string(t.node_size[static_cast<std::size_t>(node)]) + ", nodes from " + t.source +
                   ", host " + impl->ranks_[me].hostname + "); set up in " +
                   fmt_ms(times.connect_s + times.shm_s + times.start_s) + " (connecting " +
                   fmt_ms(times.connect_s) + ", shared memory " + fmt_ms(times.shm_s) + ", worker " +
                   fmt_ms(times.start_s) + ")");
    if (r == 0) {
      log::write(LogLevel::info, r, "node layout: " + t.describe(impl->ranks_));
      log::write(LogLevel::info, r,
                 "CCLZ_TIMEOUT=" + fmt_seconds(cfg.timeout_s) + " s, CCLZ_CHECK=" + (cfg.check ? "1" : "0") +
                     ", CCLZ_ALGO=" + (cfg.algo_spec.empty() ? "(tuner)" : cfg.algo_spec));
    }
  }
  *out = std::unique_ptr<Comm>(new Comm(std::move(impl)));
  return {};
}

Request CommImpl::reject(std::unique_ptr<Task> t, Result code, const std::string& cause) const {
  t->seq = engine_->peek_seq(*t);
  return Request::failed({code, engine_->message(*t, cause)});
}

Status CommImpl::validate(const CollArgs& a, ReduceOp user_op) const {
  const auto bad = [](std::string s) { return Status(Result::invalid_argument, std::move(s)); };
  if (!dtype_valid(a.dt)) return bad("unknown data type " + std::to_string(static_cast<int>(a.dt)));
  if (is_reducing(a.kind) && !op_valid(user_op)) {
    return bad("unknown reduction op " + std::to_string(static_cast<int>(user_op)));
  }
  if (is_rooted(a.kind) && (a.root < 0 || a.root >= size_)) {
    return bad("root " + std::to_string(a.root) + " is not a rank of this communicator (size " +
               std::to_string(size_) + ")");
  }
  const std::size_t es = dtype_size(a.dt), n = static_cast<std::size_t>(size_);
  std::size_t bytes = 0, all_bytes = 0;
  if (!mul(a.count, es, &bytes) || !mul(bytes, n, &all_bytes)) {
    return bad("count " + std::to_string(a.count) + " overflows the address space");
  }
  const bool root = is_rooted(a.kind) && a.root == rank_;
  auto null_check = [&](const void* p, const char* what) -> Status {
    if (p == nullptr) return bad(std::string(what) + " is null but count is " + std::to_string(a.count));
    return {};
  };
  switch (a.kind) {
    case CollKind::all_reduce:
      if (bytes == 0) return {};
      if (Status s = null_check(a.sendbuf, "sendbuf"); !s.ok()) return s;
      if (Status s = null_check(a.recvbuf, "recvbuf"); !s.ok()) return s;
      if (a.sendbuf != a.recvbuf && overlap(a.sendbuf, bytes, a.recvbuf, bytes)) {
        return bad("sendbuf and recvbuf overlap without being equal (in place needs sendbuf == recvbuf)");
      }
      return {};
    case CollKind::reduce_scatter: {
      if (bytes == 0) return {};
      if (Status s = null_check(a.sendbuf, "sendbuf"); !s.ok()) return s;
      if (Status s = null_check(a.recvbuf, "recvbuf"); !s.ok()) return s;
      const auto* in_place = static_cast<const std::byte*>(a.sendbuf) + static_cast<std::size_t>(rank_) * bytes;
      if (a.recvbuf != in_place && overlap(a.sendbuf, all_bytes, a.recvbuf, bytes)) {
        return bad("recvbuf overlaps sendbuf without being in place (in place needs recvbuf == sendbuf + rank * "
                   "recvcount)");
      }
      return {};
    }
    case CollKind::all_gather: {
      if (bytes == 0) return {};
      if (Status s = null_check(a.sendbuf, "sendbuf"); !s.ok()) return s;
      if (Status s = null_check(a.recvbuf, "recvbuf"); !s.ok()) return s;
      const auto* in_place = static_cast<const std::byte*>(a.recvbuf) + static_cast<std::size_t>(rank_) * bytes;
      if (a.sendbuf != in_place && overlap(a.sendbuf, bytes, a.recvbuf, all_bytes)) {
        return bad("sendbuf overlaps recvbuf without being in place (in place needs sendbuf == recvbuf + rank * "
                   "sendcount)");
      }
      return {};
    }
    case CollKind::all_to_all:
      if (bytes == 0) return {};
      if (Status s = null_check(a.sendbuf, "sendbuf"); !s.ok()) return s;
      if (Status s = null_check(a.recvbuf, "recvbuf"); !s.ok()) return s;
      if (overlap(a.sendbuf, all_bytes, a.recvbuf, all_bytes)) {
        return bad("sendbuf and recvbuf overlap (all_to_all cannot run in place)");
      }
      return {};
    case CollKind::all_to_allv: {
      const std::span<const std::size_t>* arrays[] = {&a.send_counts, &a.send_displs, &a.recv_counts,
                                                       &a.recv_displs};
      const char* names[] = {"send_counts", "send_displs", "recv_counts", "recv_displs"};
      for (int i = 0; i < 4; ++i) {
        if (arrays[i]->size() != n) {
          return bad(std::string(names[i]) + " has " + std::to_string(arrays[i]->size()) + " entries, expected " +
                     std::to_string(n) + " (one per rank)");
        }
      }
      // Extents in bytes of the regions read and written.
      std::size_t send_end = 0, recv_end = 0;
      std::vector<std::pair<std::size_t, std::size_t>> segs;  // recv [begin, end) in bytes
      for (std::size_t p = 0; p < n; ++p) {
        std::size_t sb = 0, se = 0, rb = 0, re = 0;
        if (!mul(a.send_displs[p], es, &sb) || !mul(a.send_counts[p], es, &se) || sb + se < sb ||
            !mul(a.recv_displs[p], es, &rb) || !mul(a.recv_counts[p], es, &re) || rb + re < rb) {
          return bad("counts/displacements for rank " + std::to_string(p) + " overflow the address space");
        }
        if (se > 0) send_end = std::max(send_end, sb + se);
        if (re > 0) {
          recv_end = std::max(recv_end, rb + re);
          segs.emplace_back(rb, rb + re);
        }
      }
      if (send_end > 0 && a.sendbuf == nullptr) return bad("sendbuf is null but send_counts are not all 0");
      if (recv_end > 0 && a.recvbuf == nullptr) return bad("recvbuf is null but recv_counts are not all 0");
      if (overlap(a.sendbuf, send_end, a.recvbuf, recv_end)) {
        return bad("sendbuf and recvbuf regions overlap (all_to_allv cannot run in place)");
      }
      std::sort(segs.begin(), segs.end());
      for (std::size_t i = 1; i < segs.size(); ++i) {
        if (segs[i].first < segs[i - 1].second) {
          return bad("recv_displs/recv_counts make two peers' blocks overlap in recvbuf");
        }
      }
      return {};
    }
    case CollKind::broadcast:
      if (bytes == 0) return {};
      if (Status s = null_check(a.recvbuf, "recvbuf"); !s.ok()) return s;
      if (root) {
        if (Status s = null_check(a.sendbuf, "sendbuf (at the root)"); !s.ok()) return s;
        if (a.sendbuf != a.recvbuf && overlap(a.sendbuf, bytes, a.recvbuf, bytes)) {
          return bad("sendbuf and recvbuf overlap without being equal (in place needs sendbuf == recvbuf)");
        }
      }
      return {};
    case CollKind::reduce:
      if (bytes == 0) return {};
      if (Status s = null_check(a.sendbuf, "sendbuf"); !s.ok()) return s;
      if (root) {
        if (Status s = null_check(a.recvbuf, "recvbuf (at the root)"); !s.ok()) return s;
        if (a.sendbuf != a.recvbuf && overlap(a.sendbuf, bytes, a.recvbuf, bytes)) {
          return bad("sendbuf and recvbuf overlap without being equal (in place needs sendbuf == recvbuf)");
        }
      }
      return {};
    case CollKind::barrier: return {};
  }
  return bad("unknown collective");
}

Status CommImpl::choose_algorithm(const CollArgs& a, const CallOptions& opt, const coll::AlgorithmDesc** out,
                                  const char** source) const {
  const coll::Group& g = *tune_group_;
  auto supported = [&](const coll::AlgorithmDesc* d) { return d->supports == nullptr || d->supports(g, a); };
  auto supporting_names = [&] {
    std::string s;
    for (const coll::AlgorithmDesc* d : coll::all_algorithms()) {
      if (d->kind == a.kind && supported(d)) s += (s.empty() ? "" : ", ") + std::string(d->name);
    }
    return s.empty() ? std::string("(none)") : s;
  };
  const auto k = static_cast<std::size_t>(a.kind);
  std::string forced;
  if (!opt.algorithm.empty()) {
    forced = opt.algorithm;
    *source = "call option";
  } else if (!cfg_.algo.per_kind[k].empty()) {
    forced = cfg_.algo.per_kind[k];
    *source = "CCLZ_ALGO";
  }
  if (!forced.empty()) {
    const coll::AlgorithmDesc* d = coll::find_algorithm(a.kind, forced);
    if (d == nullptr) {
      return {Result::invalid_argument, std::string(*source) + ": " + coll::coll_name(a.kind) +
                                            " has no algorithm '" + forced +
                                            "' (valid: " + valid_algorithm_names(&a.kind) + ")"};
    }
    if (!supported(d)) {
      return {Result::invalid_argument, std::string(*source) + ": algorithm '" + forced +
                                            "' does not support this call on " + std::to_string(size_) +
                                            " ranks (valid here: " + supporting_names() + ")"};
    }
    *out = d;
    return {};
  }
  if (!cfg_.algo.any.empty()) {
    // A bare CCLZ_ALGO name applies where it exists and fits; elsewhere the
    // tuner decides.
    const coll::AlgorithmDesc* d = coll::find_algorithm(a.kind, cfg_.algo.any);
    if (d != nullptr && supported(d)) {
      *out = d;
      *source = "CCLZ_ALGO";
      return {};
    }
  }
  *source = "tuner";
  *out = coll::tune(g, a);
  if (*out == nullptr) {
    return {Result::internal_error, std::string("no algorithm supports this call (registered: ") +
                                        valid_algorithm_names(&a.kind) + ")"};
  }
  return {};
}

void CommImpl::log_choice(const CollArgs& a, const coll::AlgorithmDesc* d, const char* source) {
  if (!log::enabled(cfg_.log_level, LogLevel::info)) return;
  std::size_t bytes = a.count * dtype_size(a.dt);
  if (a.kind == CollKind::all_to_allv) bytes = total(a.send_counts) * dtype_size(a.dt);
  const int size_class = static_cast<int>(std::bit_width(bytes));  // bytes < 2^size_class
  {
    std::lock_guard lk(log_mu_);
    if (!logged_.emplace(static_cast<int>(a.kind), d, size_class).second) return;
  }
  const std::size_t lo = size_class == 0 ? 0 : std::size_t{1} << (size_class - 1);
  log::write(LogLevel::info, rank_,
             std::string(coll::coll_name(a.kind)) + ": algorithm " + d->name + " (" + source + ") for " +
                 std::to_string(lo) + "-" + std::to_string(lo == 0 ? 0 : 2 * lo - 1) + " bytes on " +
                 std::to_string(size_) + " ranks, " + std::to_string(topo_.num_nodes()) + " node(s)");
}

Request CommImpl::collective(CollArgs a, ReduceOp user_op, const CallOptions& opt) {
  auto t = std::make_unique<Task>();
  t->type = Task::Type::collective;
  t->args = a;
  t->user_op = user_op;
  if (Status why = engine_->check_open(*t); !why.ok()) return Request::failed(std::move(why));
  if (Status st = validate(a, user_op); !st.ok()) return reject(std::move(t), st.code(), st.message());
  if (a.kind == CollKind::all_to_allv) {
    // Keep copies: the caller's arrays need not outlive the call.
    const std::size_t n = static_cast<std::size_t>(size_);
    t->v_arrays.reserve(4 * n);
    for (auto s : {a.send_counts, a.send_displs, a.recv_counts, a.recv_displs}) {
      t->v_arrays.insert(t->v_arrays.end(), s.begin(), s.end());
    }
    const std::size_t* p = t->v_arrays.data();
    t->args.send_counts = {p, n};
    t->args.send_displs = {p + n, n};
    t->args.recv_counts = {p + 2 * n, n};
    t->args.recv_displs = {p + 3 * n, n};
  }
  if (user_op == ReduceOp::avg) t->args.op = ReduceOp::sum;
  const char* source = "";
  if (Status st = choose_algorithm(t->args, opt, &t->algo, &source); !st.ok()) {
    return reject(std::move(t), st.code(), st.message());
  }
  log_choice(t->args, t->algo, source);
  return engine_->submit(std::move(t));
}

Request CommImpl::point_to_point(bool is_send, void* buf, std::size_t count, DataType dt, int peer) {
  auto t = std::make_unique<Task>();
  t->type = is_send ? Task::Type::send : Task::Type::recv;
  t->peer = peer;
  t->args.count = count;
  t->args.dt = dt;
  if (is_send) {
    t->args.sendbuf = buf;
  } else {
    t->args.recvbuf = buf;
  }
  if (Status why = engine_->check_open(*t); !why.ok()) return Request::failed(std::move(why));
  const auto bad = [&](const std::string& cause) { return reject(std::move(t), Result::invalid_argument, cause); };
  if (peer < 0 || peer >= size_) {
    return bad("peer " + std::to_string(peer) + " is not a rank of this communicator (size " +
               std::to_string(size_) + ")");
  }
  if (!dtype_valid(dt)) return bad("unknown data type " + std::to_string(static_cast<int>(dt)));
  std::size_t bytes = 0;
  if (!mul(count, dtype_size(dt), &bytes)) return bad("count " + std::to_string(count) + " overflows the address space");
  if (bytes > 0 && buf == nullptr) return bad("buffer is null but count is " + std::to_string(count));
  return engine_->submit(std::move(t));
}

Request CommImpl::run_custom(const char* name, std::string detail, std::function<Status(coll::Group&)> body) {
  auto t = std::make_unique<Task>();
  t->type = Task::Type::custom;
  t->name = name;
  t->detail = std::move(detail);
  t->body = std::move(body);
  if (Status why = engine_->check_open(*t); !why.ok()) return Request::failed(std::move(why));
  return engine_->submit(std::move(t));
}

Status CommImpl::split(int color, int key, std::unique_ptr<Comm>* out) {
  if (out == nullptr) return {Result::invalid_argument, "rank " + std::to_string(rank_) + ": split: null output"};
  *out = nullptr;
  // Written by the task on the runner; read here after the request is done.
  auto result = std::make_shared<std::unique_ptr<Comm>>();
  auto body = [this, color, key, result](coll::Group& g) -> Status {
    std::byte mine[8];
    put_u32(mine, static_cast<std::uint32_t>(color));
    put_u32(mine + 4, static_cast<std::uint32_t>(key));
    std::vector<std::byte> all;
    if (Status st = exchange_all(g, mine, &all); !st.ok()) return st;
    if (color < 0) return {};
    struct Entry {
      int key, rank;
    };
    std::vector<Entry> same;
    for (int r = 0; r < size_; ++r) {
      const std::byte* p = all.data() + 8 * static_cast<std::size_t>(r);
      if (static_cast<int>(get_u32(p)) == color) same.push_back({static_cast<int>(get_u32(p + 4)), r});
    }
    std::sort(same.begin(), same.end(),
              [](const Entry& x, const Entry& y) { return x.key != y.key ? x.key < y.key : x.rank < y.rank; });
    std::vector<int> members, labels;
    for (const Entry& e : same) {
      members.push_back(e.rank);
      // The child keeps the parent's node ids, so CCLZ_LOCAL_SIZE and
      // CCLZ_NODE_ID mean the same physical layout in every sub-group.
      labels.push_back(topo_.node_of[static_cast<std::size_t>(e.rank)]);
    }
    const std::uint64_t seq = (g.seq() + 1) & ((std::uint64_t{1} << coll::Group::kSeqBits) - 1);
    const std::uint64_t tag_base = seq << (coll::Group::kStepTagBits + coll::Group::kSpaceBits);
    World w;
    const Clock::time_point t0 = Clock::now();
    if (Status st = connect_(engine_->transport(), members, tag_base, ranks_, g.deadline(), &w); !st.ok()) {
      return st;
    }
    return create(std::move(w), topology_from_labels(labels, "parent"), cfg_, connect_, result.get(),
                  seconds_since(t0));
  };
  Request r = run_custom("split", "color " + std::to_string(color) + ", key " + std::to_string(key), std::move(body));
  if (Status st = r.wait(); !st.ok()) return st;
  *out = std::move(*result);
  return {};
}

Status CommImpl::algorithm_for(CollArgs a, const CallOptions& opt, std::string* name, std::string* source) const {
  if (a.op == ReduceOp::avg) a.op = ReduceOp::sum;
  const coll::AlgorithmDesc* d = nullptr;
  const char* src = "";
  if (Status st = choose_algorithm(a, opt, &d, &src); !st.ok()) return st;
  if (name != nullptr) *name = d->name;
  if (source != nullptr) *source = src;
  return {};
}

Status CommImpl::destroy() { return engine_->shutdown(); }

void CommImpl::abort() {
  engine_->abort({Result::remote_error, "aborted by rank " + std::to_string(rank_)});
}

Status make_comm(World world, const Config& cfg, std::unique_ptr<Comm>* out, SubgroupConnector connect) {
  if (out == nullptr) return {Result::invalid_argument, "make_comm: null output"};
  if (!world.transport) return {Result::invalid_argument, "make_comm: world has no transport"};
  if (world.ranks.empty()) world.ranks.resize(static_cast<std::size_t>(world.transport->size()));
  Topology topo = compute_topology(world.ranks, cfg.local_size);
  return CommImpl::create(std::move(world), std::move(topo), cfg, std::move(connect), out);
}

}  // namespace detail

// -------------------------------------------------------------------- Comm

namespace {

using detail::Clock;
using detail::CommImpl;
using detail::Config;

// Drops a leading "rank R: " so init messages do not name the rank twice.
std::string strip_rank(const std::string& m, int rank) {
  const std::string p = "rank " + std::to_string(rank) + ": ";
  return m.compare(0, p.size(), p) == 0 ? m.substr(p.size()) : m;
}

Status init_error(const Status& st, int rank, const char* what) {
  return {st.code(), "rank " + std::to_string(rank) + ": " + what + ": " + strip_rank(st.message(), rank)};
}

bool env_int(const char* name, long lo, long hi, long* out, Status* err) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return false;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || errno != 0 || x < lo || x > hi) {
    *err = Status(Result::invalid_argument, std::string("init_from_env: ") + name + "='" + v +
                                                "' is not an integer in [" + std::to_string(lo) + ", " +
                                                std::to_string(hi) + "]");
    return false;
  }
  *out = x;
  return true;
}

}  // namespace

Comm::Comm(std::unique_ptr<detail::CommImpl> impl) : impl_(std::move(impl)) {}

Comm::~Comm() {
  if (impl_) (void)impl_->destroy();
}

Status Comm::create_unique_id(UniqueId* id) {
  if (id == nullptr) return {Result::invalid_argument, "create_unique_id: null id"};
  return detail::make_unique_id(id);
}

Status Comm::init_rank(std::unique_ptr<Comm>* out, int nranks, const UniqueId& id, int rank) {
  if (out == nullptr) return {Result::invalid_argument, "init_rank: null output"};
  *out = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return {Result::invalid_argument, "init_rank: rank " + std::to_string(rank) + " is not in [0, nranks = " +
                                          std::to_string(nranks) + ")"};
  }
  Config cfg;
  if (Status st = detail::config_from_env(&cfg); !st.ok()) return init_error(st, rank, "init_rank");
  detail::World w;
  if (Status st = detail::connect_unique_id(id, nranks, rank, cfg.deadline_from_now(), &w); !st.ok()) {
    return init_error(st, rank, "init_rank");
  }
  if (Status st = detail::make_comm(std::move(w), cfg, out); !st.ok()) return init_error(st, rank, "init_rank");
  return {};
}

Status Comm::init_from_env(std::unique_ptr<Comm>* out) {
  if (out == nullptr) return {Result::invalid_argument, "init_from_env: null output"};
  *out = nullptr;
  Status err;
  long rank = -1, size = -1, port = -1, local_rank = -1;
  const long max_int = std::numeric_limits<int>::max();
  const char* hint = " (torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)";
  if (!env_int("WORLD_SIZE", 1, max_int, &size, &err)) {
    return err.ok() ? Status(Result::invalid_argument, std::string("init_from_env: WORLD_SIZE is not set") + hint)
                    : err;
  }
  if (!env_int("RANK", 0, size - 1, &rank, &err)) {
    return err.ok() ? Status(Result::invalid_argument, std::string("init_from_env: RANK is not set") + hint) : err;
  }
  const char* addr = std::getenv("MASTER_ADDR");
  if (addr == nullptr || *addr == '\0') {
    return {Result::invalid_argument, "rank " + std::to_string(rank) + ": init_from_env: MASTER_ADDR is not set" + hint};
  }
  // CCLZ_MASTER_PORT lets cclz rendezvous beside torch's store on MASTER_PORT.
  if (!env_int("CCLZ_MASTER_PORT", 1, 65535, &port, &err)) {
    if (!err.ok()) return err;
    if (!env_int("MASTER_PORT", 1, 65535, &port, &err)) {
      return err.ok() ? Status(Result::invalid_argument, "rank " + std::to_string(rank) +
                                                             ": init_from_env: MASTER_PORT is not set" + hint)
                      : err;
    }
  }
  const bool have_local = env_int("LOCAL_RANK", 0, max_int, &local_rank, &err);
  if (!err.ok()) return err;
  const int r = static_cast<int>(rank);
  Config cfg;
  if (Status st = detail::config_from_env(&cfg); !st.ok()) return init_error(st, r, "init_from_env");
  detail::World w;
  if (Status st = detail::connect_host_port(addr, static_cast<int>(port), static_cast<int>(size), r,
                                            cfg.deadline_from_now(), &w);
      !st.ok()) {
    return init_error(st, r, "init_from_env");
  }
  if (Status st = detail::make_comm(std::move(w), cfg, out); !st.ok()) return init_error(st, r, "init_from_env");
  if (have_local && local_rank != (*out)->local_rank() &&
      detail::log::enabled(cfg.log_level, detail::LogLevel::warn)) {
    detail::log::write(detail::LogLevel::warn, r,
                       "LOCAL_RANK=" + std::to_string(local_rank) + " but cclz's node layout gives local rank " +
                           std::to_string((*out)->local_rank()) +
                           " (set CCLZ_NODE_ID or CCLZ_LOCAL_SIZE if host names do not tell nodes apart)");
  }
  return {};
}

int Comm::rank() const noexcept { return impl_->rank_; }
int Comm::size() const noexcept { return impl_->size_; }
int Comm::local_rank() const noexcept {
  return impl_->topology().local_rank[static_cast<std::size_t>(impl_->rank_)];
}
int Comm::local_size() const noexcept {
  const auto& t = impl_->topology();
  return t.node_size[static_cast<std::size_t>(t.node_of[static_cast<std::size_t>(impl_->rank_)])];
}
int Comm::node_id() const noexcept { return impl_->topology().node_of[static_cast<std::size_t>(impl_->rank_)]; }
int Comm::num_nodes() const noexcept { return impl_->topology().num_nodes(); }
int Comm::node_of(int r) const noexcept {
  if (r < 0 || r >= impl_->size_) return -1;
  return impl_->topology().node_of[static_cast<std::size_t>(r)];
}

Status Comm::split(int color, int key, std::unique_ptr<Comm>* out) { return impl_->split(color, key, out); }
Status Comm::destroy() { return impl_->destroy(); }
void Comm::abort() { impl_->abort(); }
Status Comm::async_error() const { return impl_->async_error(); }

Request Comm::all_reduce(const void* sendbuf, void* recvbuf, std::size_t count, DataType dt, ReduceOp op,
                         const CallOptions& opt) {
  coll::CollArgs a;
  a.kind = coll::CollKind::all_reduce;
  a.sendbuf = sendbuf;
  a.recvbuf = recvbuf;
  a.count = count;
  a.dt = dt;
  a.op = op;
  return impl_->collective(a, op, opt);
}

Request Comm::reduce_scatter(const void* sendbuf, void* recvbuf, std::size_t recvcount, DataType dt, ReduceOp op,
                             const CallOptions& opt) {
  coll::CollArgs a;
  a.kind = coll::CollKind::reduce_scatter;
  a.sendbuf = sendbuf;
  a.recvbuf = recvbuf;
  a.count = recvcount;
  a.dt = dt;
  a.op = op;
  return impl_->collective(a, op, opt);
}

Request Comm::all_gather(const void* sendbuf, void* recvbuf, std::size_t sendcount, DataType dt,
                         const CallOptions& opt) {
  coll::CollArgs a;
  a.kind = coll::CollKind::all_gather;
  a.sendbuf = sendbuf;
  a.recvbuf = recvbuf;
  a.count = sendcount;
  a.dt = dt;
  return impl_->collective(a, ReduceOp::sum, opt);
}

Request Comm::all_to_all(const void* sendbuf, void* recvbuf, std::size_t count, DataType dt,
                         const CallOptions& opt) {
  coll::CollArgs a;
  a.kind = coll::CollKind::all_to_all;
  a.sendbuf = sendbuf;
  a.recvbuf = recvbuf;
  a.count = count;
  a.dt = dt;
  return impl_->collective(a, ReduceOp::sum, opt);
}

Request Comm::all_to_allv(const void* sendbuf, std::span<const std::size_t> send_counts,
                          std::span<const std::size_t> send_displs, void* recvbuf,
                          std::span<const std::size_t> recv_counts, std::span<const std::size_t> recv_displs,
                          DataType dt, const CallOptions& opt) {
  coll::CollArgs a;
  a.kind = coll::CollKind::all_to_allv;
  a.sendbuf = sendbuf;
  a.recvbuf = recvbuf;
  a.dt = dt;
  a.send_counts = send_counts;
  a.send_displs = send_displs;
  a.recv_counts = recv_counts;
  a.recv_displs = recv_displs;
  return impl_->collective(a, ReduceOp::sum, opt);
}

Request Comm::broadcast(const void* sendbuf, void* recvbuf, std::size_t count, DataType dt, int root,
                        const CallOptions& opt) {
  coll::CollArgs a;
  a.kind = coll::CollKind::broadcast;
  a.sendbuf = sendbuf;
  a.recvbuf = recvbuf;
  a.count = count;
  a.dt = dt;
  a.root = root;
  return impl_->collective(a, ReduceOp::sum, opt);
}

Request Comm::reduce(const void* sendbuf, void* recvbuf, std::size_t count, DataType dt, ReduceOp op, int root,
                     const CallOptions& opt) {
  coll::CollArgs a;
  a.kind = coll::CollKind::reduce;
  a.sendbuf = sendbuf;
  a.recvbuf = recvbuf;
  a.count = count;
  a.dt = dt;
  a.op = op;
  a.root = root;
  return impl_->collective(a, op, opt);
}

Request Comm::barrier(const CallOptions& opt) {
  coll::CollArgs a;
  a.kind = coll::CollKind::barrier;
  a.dt = DataType::u8;
  return impl_->collective(a, ReduceOp::sum, opt);
}

Request Comm::send(const void* buf, std::size_t count, DataType dt, int peer) {
  return impl_->point_to_point(true, const_cast<void*>(buf), count, dt, peer);
}

Request Comm::recv(void* buf, std::size_t count, DataType dt, int peer) {
  return impl_->point_to_point(false, buf, count, dt, peer);
}

}  // namespace cclz
