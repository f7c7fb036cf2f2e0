// Communicator internals: the progress engine that runs one communicator's
// operations in issue order, and CommImpl, which validates calls on the
// caller's thread, picks algorithms and formats errors.
//
// Execution model. Every call becomes a Task in the engine's queue. Whoever
// holds the engine's runner role executes queued tasks in order: normally
// the engine's worker thread, but a thread blocked in Request::wait() takes
// the role itself when it is free, so a blocking call runs on the caller's
// thread without a hand-off. Sends and receives are posted in order and then
// stay "in flight" while later tasks run, so pairs of point-to-point calls
// cannot deadlock on each other. Every transport wait is bounded by
// CCLZ_TIMEOUT; a timeout or remote error poisons the communicator.
//
// Cost per call: two small allocations (request, task) and a few
// uncontended lock round trips; no thread hand-off and no wake-up when the
// caller waits at once (see Engine::worker_main for how the worker stays
// out of the way).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "algorithm.hpp"
#include "bootstrap.hpp"
#include "cclz/cclz.hpp"
#include "config.hpp"
#include "group.hpp"
#include "shm_window.hpp"
#include "topology.hpp"
#include "transport.hpp"

struct cclzComm;  // the C API's handle (c_api.cpp)

namespace cclz::detail {

class Engine;

struct RequestState {
  std::atomic<bool> done{false};
  Status status;                 // valid once done
  std::weak_ptr<Engine> engine;  // lets wait() run queued work itself

  // Sets the status, then done (release), and wakes waiters.
  void complete(Status st) noexcept;
};

// How a split connects its members' new transport: connect_subgroup by
// default; tests substitute one that makes in-process transports.
using SubgroupConnector =
    std::function<Status(Transport& parent, const std::vector<int>& members, std::uint64_t tag_base,
                         const std::vector<RankInfo>& parent_ranks, Clock::time_point deadline, World* out)>;

struct Task {
  enum class Type : std::uint8_t { collective, send, recv, custom };
  Type type = Type::collective;
  coll::CollArgs args;  // collective: op is never avg (see user_op)
  ReduceOp user_op = ReduceOp::sum;
  const coll::AlgorithmDesc* algo = nullptr;
  std::uint64_t seq = 0;  // collective number, or per-peer message number for send/recv
  int peer = -1;          // send/recv
  std::vector<std::size_t> v_arrays;  // all_to_allv: copies of the four arrays (args' spans point here)
  const char* name = nullptr;         // custom: what it is called in messages
  std::string detail;                 // custom: what goes in the parentheses
  std::function<Status(coll::Group&)> body;  // custom
  std::shared_ptr<RequestState> req;
  Clock::time_point submitted;  // when queued
  Op op;                       // send/recv once posted
  Clock::time_point deadline;  // send/recv once posted

  // "all_reduce #7 (ring, 1024 x f32)"; the "rank R: " prefix is the engine's.
  std::string describe() const;
};

class Engine : public std::enable_shared_from_this<Engine> {
 public:
  // `oversubscribed`: this host runs more of the communicator's ranks than
  // this process has cores (see submit()).
  Engine(int rank, std::unique_ptr<Transport> transport, std::unique_ptr<ShmWindow> shm, std::vector<int> node_of,
         const Config& cfg, bool oversubscribed);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  Status start();  // spawns the worker

  // Queues `t` and gives its sequence number (collective/custom: the next
  // collective number; send/recv: the next message number for that peer),
  // or fails it at once when the communicator is destroyed or has failed.
  Request submit(std::unique_ptr<Task> t);
  // What submit() would assign now (for messages of calls rejected earlier).
  std::uint64_t peek_seq(const Task& t) const;
  // Why a call for `t` would be refused now (destroyed, failed), or success.
  Status check_open(Task& t) const;

  Status async_error() const;
  bool destroyed() const;
  // Drains queued work, stops the worker, releases the transport.
  Status shutdown();
  // How long the last shutdown() took on this rank, in seconds, by phase:
  // the worker's draining and exit, the wait for an inline runner, the
  // transport's release (goodbyes, flushes, closes).
  struct ShutdownTimes {
    double worker_s = 0, idle_s = 0, transport_s = 0;
  };
  ShutdownTimes shutdown_times() const;
  // Fails the transport with `why`, fails pending work, stops, releases.
  void abort(const Status& why);

  // Request::wait(): runs queued work on this thread when no one else does.
  Status wait(RequestState& r);
  // Request::test() on an unfinished request: start queued work now.
  void expedite();
  // How often submit() woke the sleeping worker (for tests and diagnostics).
  std::uint64_t worker_kicks() const;

  // "rank R: " + t.describe() + ": " + cause
  std::string message(const Task& t, const std::string& cause) const;
  int rank() const noexcept { return rank_; }
  const char* transport_name() const noexcept { return transport_name_.c_str(); }
  const Config& config() const noexcept { return cfg_; }
  // For split's sub-connection (runner only).
  Transport& transport() noexcept { return *transport_; }

 private:
  void worker_main();
  bool has_work_locked() const noexcept { return !queue_.empty() || flights_n_ > 0; }
  void release_runner();
  // As runner: executes queued tasks until `target` is done, or (target
  // null) until nothing is queued or in flight.
  void run(RequestState* target);
  void execute(std::unique_ptr<Task> t);
  Status run_collective(Task& t);
  Status check_args(Task& t, Clock::time_point deadline);
  void wait_flights(RequestState* target);
  void reap_flights(const Status& wait_status);
  void fail_task(Task& t, const Status& st, bool poison);
  void poison(const Status& st);
  // Sets async_error_ to `st` unless an earlier error is there.
  void record_error(const Status& st);
  Status rejection(const Task& t) const;  // why submit refuses t (caller holds mu_)

  const int rank_;
  const int size_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<ShmWindow> shm_;  // null: no node-local peers, or CCLZ_SHM=0
  ShutdownTimes shutdown_times_;    // under mu_
  std::string transport_name_;
  const std::shared_ptr<const coll::Group::Shape> shape_;  // all ranks, for the per-call Group
  const Config cfg_;
  const bool oversubscribed_;

  mutable std::mutex mu_;
  std::condition_variable worker_cv_;  // worker: work arrived, or stop
  std::condition_variable idle_cv_;    // shutdown/abort: the runner let go
  std::deque<std::unique_ptr<Task>> queue_;
  std::size_t flights_n_ = 0;
  std::uint64_t next_seq_ = 1;
  std::vector<std::uint64_t> send_seq_, recv_seq_;  // per peer
  Status async_error_;
  bool accepting_ = true;
  bool stop_ = false;
  bool closed_ = false;
  bool destroyed_ = false;
  bool runner_active_ = false;
  bool worker_sleeping_ = false;  // until kicked (not polling)
  bool waiters_run_ = false;      // the last queued work was run by a waiter, not the worker (see submit())
  std::uint64_t worker_kicks_ = 0;  // wake-ups of a sleeping worker by submit()
  bool expedite_ = false;         // test() asked for the queue to start now
  int idle_waiters_ = 0;
  std::thread::id runner_thread_;
  std::thread worker_;
  std::mutex close_mu_;  // one shutdown/abort at a time

  // Runner only.
  std::vector<std::unique_ptr<Task>> flights_;
  coll::ScratchPool scratch_;
  int slice_us_ = 50;
};

struct CommImpl {
  CommImpl(World world, Topology topo, const Config& cfg, SubgroupConnector connect,
           std::unique_ptr<ShmWindow> shm);
  ~CommImpl();

  // Every communicator is made here: from a bootstrap's World, a split, or a
  // test's World of in-process transports.
  // `connect_s`: the time a split took to connect `world` (SetupTimes).
  static Status create(World world, Topology topo, const Config& cfg, SubgroupConnector connect,
                       std::unique_ptr<Comm>* out, double connect_s = 0);

  Request collective(coll::CollArgs a, ReduceOp user_op, const CallOptions& opt);
  Request point_to_point(bool is_send, void* buf, std::size_t count, DataType dt, int peer);
  // Runs `body` on the progress engine in order with the collectives, as a
  // collective of this communicator (every rank must call it in the same
  // order). For compressors' own schedules. `detail` goes in messages.
  Request run_custom(const char* name, std::string detail, std::function<Status(coll::Group&)> body);
  Status split(int color, int key, std::unique_ptr<Comm>* out);
  // Which algorithm a call with these arguments would run and who chose it
  // ("call option", "CCLZ_ALGO", "tuner"); errors as the call would report
  // them (without the "rank R: ..." prefix).
  Status algorithm_for(coll::CollArgs a, const CallOptions& opt, std::string* name, std::string* source) const;
  Status destroy();
  void abort();
  Status async_error() const { return engine_->async_error(); }

  const Config& config() const noexcept { return cfg_; }
  const Topology& topology() const noexcept { return topo_; }
  // Calls of this rank that read the node's peers' buffers in place
  // (collectives/shm_direct.hpp); 0 without a shared-memory window.
  std::uint64_t direct_calls() const noexcept { return window() ? window()->direct_calls() : 0; }
  // Of those, the calls that mapped the peers' buffers (mem_alloc or
  // registered memory), not cross-memory attach.
  std::uint64_t mapped_calls() const noexcept { return window() ? window()->mapped_calls() : 0; }
  // How often a call woke this rank's sleeping worker thread (Engine::submit).
  std::uint64_t worker_kicks() const { return engine_->worker_kicks(); }
  // Calls of this rank that asked its node's peers whether to go direct.
  std::uint64_t direct_tries() const noexcept { return window() ? window()->direct_tries() : 0; }
  // From how many bytes (largest buffer) calls try that path, as the
  // node's first rank set it; ShmWindow::kDirectOff without a window.
  std::uint64_t direct_min_bytes() const noexcept {
    return window() ? window()->direct_min_bytes() : ShmWindow::kDirectOff;
  }
  // Whether heap buffers may go direct through cross-memory attach, as the
  // node's first rank set it (CCLZ_SHM_CMA); false without a window.
  bool shm_cma() const noexcept { return window() && window()->cma(); }
  // ...and chooses it per call by measurement (CCLZ_SHM_CMA=auto, a core
  // per rank).
  bool shm_cma_measured() const noexcept { return window() && window()->cma_measured(); }
  // Calls this rank timed for that choice (the node's first rank only),
  // through cross-memory attach or staged.
  std::uint64_t heap_path_timed(bool staged) const noexcept {
    return window() ? window()->heap_path_timed(staged) : 0;
  }
  // Whether this node runs more of the communicator's ranks than it has
  // cores (ShmWindow::oversubscribed); false without a window.
  bool shm_oversubscribed() const noexcept { return window() && window()->oversubscribed(); }
  const std::vector<RankInfo>& rank_infos() const noexcept { return ranks_; }
  // How long making this communicator took on this rank, in seconds, by
  // phase: a split's connecting of its ranks, the node's shared-memory
  // window (the node's first rank creates and maps the segment while the
  // others wait for its name), the start of the worker thread. CCLZ_DEBUG=INFO
  // prints them; the multi-rank tests print them when a creation is slow.
  struct SetupTimes {
    double connect_s = 0, shm_s = 0, start_s = 0;
  };
  const SetupTimes& setup_times() const noexcept { return setup_times_; }
  // The phases of destroy() (Engine::shutdown_times), zeros before it.
  Engine::ShutdownTimes shutdown_times() const { return engine_->shutdown_times(); }

  int rank_ = 0;
  int size_ = 0;

 private:
  Status validate(const coll::CollArgs& a, ReduceOp user_op) const;
  // The node-local window of the whole communicator, or null.
  const ShmWindow* window() const noexcept { return tune_group_ ? tune_group_->shm() : nullptr; }
  Status choose_algorithm(const coll::CollArgs& a, const CallOptions& opt, const coll::AlgorithmDesc** out,
                          const char** source) const;
  void log_choice(const coll::CollArgs& a, const coll::AlgorithmDesc* d, const char* source);
  Request reject(std::unique_ptr<Task> t, Result code, const std::string& cause) const;

  std::vector<RankInfo> ranks_;
  Topology topo_;
  Config cfg_;
  SubgroupConnector connect_;
  std::shared_ptr<Engine> engine_;
  // A Group for the tuner's and supports()' questions on callers' threads
  // (size, rank, nodes). Never used to move data.
  coll::ScratchPool tune_scratch_;
  std::unique_ptr<coll::Group> tune_group_;
  std::mutex log_mu_;
  std::set<std::tuple<int, const void*, int>> logged_;  // (kind, algorithm, size class)
  SetupTimes setup_times_;
};

// Testing door: a communicator over an already connected World (any
// Transport, e.g. in-process threads), with the topology computed from
// world.ranks and cfg.local_size as at a real creation. `connect` replaces
// connect_subgroup for split() (empty: the bootstrap's).
Status make_comm(World world, const Config& cfg, std::unique_ptr<Comm>* out, SubgroupConnector connect = {});

// Testing door for the C API (c_api.cpp): a C handle owning `c`.
struct cclzComm* c_handle_from_comm(std::unique_ptr<Comm> c);

}  // namespace cclz::detail
