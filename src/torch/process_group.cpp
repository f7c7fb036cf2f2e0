// torch.distributed backend "cclz": a c10d process group whose collectives
// run on a cclz::Comm, plus the compressed all-reduce behind the DDP
// communication hook (cclz.torch.hook). Python module cclz._C.
//
// Bootstrap: the constructor gets the c10d Store of init_process_group; rank
// 0 makes a cclz::UniqueId and sets its bytes under kUniqueIdKey, the others
// block on the store's get, then every rank calls Comm::init_rank.
//
// Completion: each collective issues cclz requests on the caller's thread
// (so the order on the Comm is the order of the calls, as cclz requires) and
// returns a Work. Work::wait() waits on the requests in the caller's thread,
// which lets cclz run the collective right there (no thread hop: the cheap
// path for blocking calls), then copies staged results into the caller's
// tensors. Work::getFuture() (DDP's reducer) hands the Work to one
// completion thread per process group, which does the same and completes
// the future. Errors become exceptions with cclz's message.
//
// DDP hook: cclz.torch.hook's compressed all-reduce of a bucket (averaged,
// compressor state per bucket index) runs on a second thread, the hook
// lane, FIFO, and completes the torch.futures.Future the hook returned. A
// collective issued while the lane is busy waits for it to drain, so that
// the order of operations on the Comm is the call order on every rank.
//
// Versions: written against the c10d of Debian's PyTorch 1.13.1, where the
// base class is c10d::ProcessGroup and c10d::Work already lives in Work.hpp;
// in PyTorch 2.x the base is c10d::Backend (a ProcessGroup wraps backends per
// device) and register_backend takes the device list. CI builds and tests
// the 1.13 branch; the 2.x branch was built (-Werror) against Debian's 2.6.0
// and 2.14.1 headers and passed the torch suite on 2.14.1, by hand.
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#if __has_include(<torch/csrc/distributed/c10d/Work.hpp>)
#include <torch/csrc/distributed/c10d/Work.hpp>
#define CCLZ_TORCH_WORK_HPP 1
#endif
#include <c10/core/CPUAllocator.h>
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "cclz/cclz.hpp"
#include "cclz/compress.hpp"
#include "cclz/compressed.hpp"
#include "comm_impl.hpp"
#include "shm_alloc.hpp"
#include "shm_pool.hpp"

namespace cclz_torch {

#if TORCH_VERSION_MAJOR >= 2
using BaseGroup = c10d::Backend;
#else
using BaseGroup = c10d::ProcessGroup;
#endif
// Debian's 1.13 (a later snapshot than upstream 1.13.0) and 2.x have
// c10d::Work in Work.hpp; upstream 1.13.0 nests it in ProcessGroup.
#ifdef CCLZ_TORCH_WORK_HPP
using WorkBase = c10d::Work;
#else
using WorkBase = c10d::ProcessGroup::Work;
#endif

// ReduceOp is a plain enum in older c10d and a struct holding one (op_) in
// newer ones.
template <typename Op>
int reduce_op_code(const Op& op) {
  if constexpr (std::is_enum_v<Op>)
    return static_cast<int>(op);
  else
    return static_cast<int>(op.op_);
}

constexpr const char* kUniqueIdKey = "cclz_unique_id";

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error("cclz backend: " + what); }

void check_status(const cclz::Status& st, const char* op) {
  if (!st.ok()) fail(std::string(op) + ": " + st.to_string());
}

cclz::DataType to_cclz(at::ScalarType t, const char* op) {
  switch (t) {
    case at::kFloat: return cclz::DataType::f32;
    case at::kDouble: return cclz::DataType::f64;
    case at::kHalf: return cclz::DataType::f16;
    case at::kBFloat16: return cclz::DataType::bf16;
    case at::kInt: return cclz::DataType::i32;
    case at::kLong: return cclz::DataType::i64;
    case at::kChar: return cclz::DataType::i8;
    case at::kByte: return cclz::DataType::u8;
    default:
      fail(std::string(op) + ": unsupported dtype " + std::string(c10::toString(t)) +
           " (supported: float32, float64, float16, bfloat16, int32, int64, int8, uint8)");
  }
}

cclz::ReduceOp to_cclz(const c10d::ReduceOp& op, const char* name) {
  switch (reduce_op_code(op)) {
    case static_cast<int>(c10d::ReduceOp::SUM): return cclz::ReduceOp::sum;
    case static_cast<int>(c10d::ReduceOp::AVG): return cclz::ReduceOp::avg;
    case static_cast<int>(c10d::ReduceOp::PRODUCT): return cclz::ReduceOp::prod;
    case static_cast<int>(c10d::ReduceOp::MIN): return cclz::ReduceOp::min;
    case static_cast<int>(c10d::ReduceOp::MAX): return cclz::ReduceOp::max;
    default:
      fail(std::string(name) + ": unsupported reduce op " + std::to_string(reduce_op_code(op)) +
           " (supported: SUM, AVG, PRODUCT, MIN, MAX)");
  }
}

// Rejects what cclz cannot move: non-CPU tensors (the CUDA path is the NCCL
// ABI's), unsupported dtypes. Returns the cclz dtype.
cclz::DataType check_tensor(const at::Tensor& t, const char* op) {
  if (!t.device().is_cpu())
    fail(std::string(op) + ": tensor on " + t.device().str() + "; the cclz backend takes CPU tensors only");
  if (t.is_sparse()) fail(std::string(op) + ": sparse tensors are not supported");
  return to_cclz(t.scalar_type(), op);
}

void check_single(const std::vector<at::Tensor>& ts, const char* op) {
  if (ts.size() != 1) fail(std::string(op) + ": expects exactly one tensor per call, got " + std::to_string(ts.size()));
}

std::size_t elems(const at::Tensor& t) { return static_cast<std::size_t>(t.numel()); }

// Releases the GIL for its scope when this thread holds it (a blocking wait
// on a thread that takes the GIL must not hold it).
class ReleaseGilIfHeld {
 public:
  ReleaseGilIfHeld() {
    if (Py_IsInitialized() && PyGILState_Check()) state_ = PyEval_SaveThread();
  }
  ~ReleaseGilIfHeld() {
    if (state_ != nullptr) PyEval_RestoreThread(state_);
  }
  ReleaseGilIfHeld(const ReleaseGilIfHeld&) = delete;
  ReleaseGilIfHeld& operator=(const ReleaseGilIfHeld&) = delete;

 private:
  PyThreadState* state_ = nullptr;
};

class CclzWork;

// The thread that completes the futures of Works whose getFuture() was
// asked for (DDP's reducer, async callers chaining then()); works that are
// only wait()ed on never reach it. Works hold it weakly, so the last
// reference is the process group's.
class Completer {
 public:
  Completer() : thread_([this] { loop(); }) {}
  ~Completer() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void push(c10::intrusive_ptr<CclzWork> work) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(work));
    }
    cv_.notify_one();
  }

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<c10::intrusive_ptr<CclzWork>> queue_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after the members it uses
};

// One issued collective: its requests and what to do after them (copy staged
// results back). Run once, by whichever comes first: the caller's
// Work::wait() (which then drives cclz's engine itself, the cheap path for
// blocking calls) or the completion thread (for futures nobody waits on).
struct Job {
  std::vector<cclz::Request> requests;
  std::function<void()> finish;
  std::string op;
  std::mutex mu;
  bool done = false;

  void run(CclzWork& work);
};

class CclzWork : public WorkBase {
 public:
  CclzWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, std::shared_ptr<Job> job,
           std::weak_ptr<Completer> completer)
      : WorkBase(rank, type),
        outputs_(std::move(outputs)),
        job_(std::move(job)),
        completer_(std::move(completer)),
        future_(c10::make_intrusive<at::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

  bool isCompleted() override {
    if (future_->completed()) return true;
    // Poll the requests; finish here when they are all done.
    for (cclz::Request& r : job_->requests)
      if (!r.test()) return false;
    job_->run(*this);
    return true;
  }
  bool isSuccess() const override { return future_->completed() && !future_->hasError(); }
  std::exception_ptr exception() const override {
    return future_->completed() && future_->hasError() ? future_->exception_ptr() : nullptr;
  }
  std::vector<at::Tensor> result() override { return outputs_; }
  bool wait(std::chrono::milliseconds timeout) override {
    if (timeout == kNoTimeout) {
      job_->run(*this);
    } else {
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      while (!isCompleted()) {
        if (std::chrono::steady_clock::now() > deadline)
          fail(job_->op + ": Work::wait timed out after " + std::to_string(timeout.count()) + " ms");
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    future_->wait();
    if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
    return true;
  }
  void synchronize() override {}
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    bool expected = false;
    if (!future_->completed() && handed_over_.compare_exchange_strong(expected, true)) {
      if (auto c = completer_.lock()) {
        c->push(c10::intrusive_ptr<CclzWork>::reclaim_copy(this));
      } else {
        job_->run(*this);  // the group is gone: its requests are complete
      }
    }
    return future_;
  }

  void complete(std::exception_ptr error) {
    if (error)
      future_->setError(error);
    else
      future_->markCompleted(c10::IValue(outputs_));
  }
  const std::shared_ptr<Job>& job() const { return job_; }

 private:
  std::vector<at::Tensor> outputs_;
  std::shared_ptr<Job> job_;
  std::weak_ptr<Completer> completer_;
  std::atomic<bool> handed_over_{false};
  c10::intrusive_ptr<at::ivalue::Future> future_;
};

void Completer::loop() {
  for (;;) {
    c10::intrusive_ptr<CclzWork> work;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    work->job()->run(*work);
  }
}

void Job::run(CclzWork& work) {
  // Waited on outside the lock: two threads may wait on one request.
  cclz::Status first_error;
  for (cclz::Request& r : requests) {
    const cclz::Status st = r.wait();
    if (!st.ok() && first_error.ok()) first_error = st;
  }
  std::lock_guard<std::mutex> lock(mu);
  if (done) return;
  std::exception_ptr error;
  try {
    if (!first_error.ok()) fail(op + ": " + first_error.to_string());
    if (finish) finish();
  } catch (...) {
    error = std::current_exception();
  }
  finish = nullptr;  // drop staged buffers before waking anyone
  done = true;
  work.complete(error);
}

// What a collective builds before submitting: the Work and its Job.
struct Pending {
  c10::intrusive_ptr<CclzWork> work;
  Job& job() { return *work->job(); }
};

class ProcessGroupCclz : public BaseGroup {
 public:
  ProcessGroupCclz(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size) : BaseGroup(rank, size) {
    cclz::UniqueId id{};
    if (rank == 0) {
      check_status(cclz::Comm::create_unique_id(&id), "create_unique_id");
      std::vector<uint8_t> bytes(sizeof(id.internal));
      std::memcpy(bytes.data(), id.internal, bytes.size());
      store->set(kUniqueIdKey, bytes);
    } else {
      std::vector<uint8_t> bytes = store->get(kUniqueIdKey);
      if (bytes.size() != sizeof(id.internal))
        fail("the unique id in the store has " + std::to_string(bytes.size()) + " bytes, expected " +
             std::to_string(sizeof(id.internal)));
      std::memcpy(id.internal, bytes.data(), bytes.size());
    }
    check_status(cclz::Comm::init_rank(&comm_, size, id, rank), "init_rank");
    completer_ = std::make_shared<Completer>();
  }

  ~ProcessGroupCclz() override {
    stop_hook_lane();
    completer_.reset();  // completes what was handed to it
    if (comm_) (void)comm_->destroy();
  }

  const std::string getBackendName() const override { return "cclz"; }

  // Sequence numbers, as gloo's and NCCL's: 0 on every rank, one per
  // collective (send/recv involve only two ranks). 2.x wraps plugins too in a
  // ProcessGroupWrapper under TORCH_DISTRIBUTED_DEBUG=DETAIL, whose desync
  // check reads them before every collective: the base class's throw.
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }
  cclz::Comm& comm() { return *comm_; }

  c10::intrusive_ptr<WorkBase> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    check_single(tensors, "allreduce");
    return allreduce_many(tensors, opts.reduceOp, c10d::OpType::ALLREDUCE, "allreduce");
  }

  c10::intrusive_ptr<WorkBase> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    return allreduce_many(tensors, opts.reduceOp, c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced");
  }

  c10::intrusive_ptr<WorkBase> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    check_single(tensors, "broadcast");
    const cclz::DataType dt = check_tensor(tensors[0], "broadcast");
    Staged s = stage(tensors[0]);
    Pending p = start(c10d::OpType::BROADCAST, tensors, "broadcast");
    p.job().requests.push_back(comm_->broadcast(s.buf.data_ptr(), s.buf.data_ptr(), elems(s.buf), dt,
                                          static_cast<int>(opts.rootRank)));
    p.job().finish = s.copy_back;
    return submit(std::move(p));
  }

  c10::intrusive_ptr<WorkBase> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    check_single(tensors, "reduce");
    const cclz::DataType dt = check_tensor(tensors[0], "reduce");
    const cclz::ReduceOp op = to_cclz(opts.reduceOp, "reduce");
    Staged s = stage(tensors[0]);
    Pending p = start(c10d::OpType::REDUCE, tensors, "reduce");
    p.job().requests.push_back(comm_->reduce(s.buf.data_ptr(), s.buf.data_ptr(), elems(s.buf), dt, op,
                                       static_cast<int>(opts.rootRank)));
    p.job().finish = s.copy_back;
    return submit(std::move(p));
  }

  c10::intrusive_ptr<WorkBase> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& /*opts*/) override {
    check_single(inputs, "allgather");
    if (outputs.size() != 1 || outputs[0].size() != static_cast<std::size_t>(getSize()))
      fail("allgather: expects one output list of " + std::to_string(getSize()) + " tensors");
    const at::Tensor& in = inputs[0];
    const cclz::DataType dt = check_tensor(in, "allgather");
    for (const at::Tensor& o : outputs[0]) {
      check_tensor(o, "allgather");
      if (o.numel() != in.numel() || o.scalar_type() != in.scalar_type())
        fail("allgather: every output tensor must have the input's numel and dtype");
    }
    at::Tensor src = in.contiguous();
    at::Tensor flat = at::empty({static_cast<int64_t>(getSize()) * in.numel()}, in.options());
    Pending p = start(c10d::OpType::ALLGATHER, outputs[0], "allgather");
    p.job().requests.push_back(comm_->all_gather(src.data_ptr(), flat.data_ptr(), elems(in), dt));
    std::vector<at::Tensor> outs = outputs[0];
    p.job().finish = [src, flat, outs, n = in.numel()]() mutable {
      for (std::size_t r = 0; r < outs.size(); ++r)
        outs[r].copy_(flat.narrow(0, static_cast<int64_t>(r) * n, n).view(outs[r].sizes()));
    };
    return submit(std::move(p));
  }

  c10::intrusive_ptr<WorkBase> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& /*opts*/) override {
    const cclz::DataType dt = check_tensor(input, "allgather_into_tensor");
    check_tensor(output, "allgather_into_tensor");
    if (output.numel() != input.numel() * getSize() || output.scalar_type() != input.scalar_type())
      fail("allgather_into_tensor: the output must have world_size * input.numel() elements of the input's dtype");
    at::Tensor src = input.contiguous();
    Staged s = stage(output);
    std::vector<at::Tensor> outs{output};
    Pending p = start(c10d::OpType::_ALLGATHER_BASE, outs, "allgather_into_tensor");
    p.job().requests.push_back(comm_->all_gather(src.data_ptr(), s.buf.data_ptr(), elems(input), dt));
    p.job().finish = [src, cb = s.copy_back] { cb(); };
    return submit(std::move(p));
  }

  c10::intrusive_ptr<WorkBase> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    check_single(outputs, "reduce_scatter");
    if (inputs.size() != 1 || inputs[0].size() != static_cast<std::size_t>(getSize()))
      fail("reduce_scatter: expects one input list of " + std::to_string(getSize()) + " tensors");
    at::Tensor& out = outputs[0];
    const cclz::DataType dt = check_tensor(out, "reduce_scatter");
    const cclz::ReduceOp op = to_cclz(opts.reduceOp, "reduce_scatter");
    std::vector<at::Tensor> flat_parts;
    for (const at::Tensor& t : inputs[0]) {
      check_tensor(t, "reduce_scatter");
      if (t.numel() != out.numel() || t.scalar_type() != out.scalar_type())
        fail("reduce_scatter: every input tensor must have the output's numel and dtype");
      flat_parts.push_back(t.reshape({-1}));
    }
    at::Tensor src = at::cat(flat_parts);
    Staged s = stage(out);
    Pending p = start(c10d::OpType::REDUCE_SCATTER, outputs, "reduce_scatter");
    p.job().requests.push_back(comm_->reduce_scatter(src.data_ptr(), s.buf.data_ptr(), elems(out), dt, op));
    p.job().finish = [src, cb = s.copy_back] { cb(); };
    return submit(std::move(p));
  }

  c10::intrusive_ptr<WorkBase> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    const cclz::DataType dt = check_tensor(input, "reduce_scatter_tensor");
    check_tensor(output, "reduce_scatter_tensor");
    const cclz::ReduceOp op = to_cclz(opts.reduceOp, "reduce_scatter_tensor");
    if (input.numel() != output.numel() * getSize() || output.scalar_type() != input.scalar_type())
      fail("reduce_scatter_tensor: the input must have world_size * output.numel() elements of the output's dtype");
    at::Tensor src = input.contiguous();
    Staged s = stage(output);
    std::vector<at::Tensor> outs{output};
    Pending p = start(c10d::OpType::_REDUCE_SCATTER_BASE, outs, "reduce_scatter_tensor");
    p.job().requests.push_back(comm_->reduce_scatter(src.data_ptr(), s.buf.data_ptr(), elems(output), dt, op));
    p.job().finish = [src, cb = s.copy_back] { cb(); };
    return submit(std::move(p));
  }

  c10::intrusive_ptr<WorkBase> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& /*opts*/) override {
    const cclz::DataType dt = check_tensor(input, "alltoall_base");
    check_tensor(output, "alltoall_base");
    if (output.scalar_type() != input.scalar_type()) fail("alltoall_base: input and output dtypes differ");
    const std::size_t n = static_cast<std::size_t>(getSize());
    at::Tensor src = input.contiguous();
    Staged s = stage(output);
    std::vector<at::Tensor> outs{output};
    Pending p = start(c10d::OpType::ALLTOALL_BASE, outs, "alltoall_base");
    if (input_splits.empty() && output_splits.empty()) {
      if (input.numel() % static_cast<int64_t>(n) != 0 || output.numel() != input.numel())
        fail("alltoall_base: equal splits need input.numel() divisible by world_size and output.numel() == input.numel()");
      p.job().requests.push_back(comm_->all_to_all(src.data_ptr(), s.buf.data_ptr(), elems(input) / n, dt));
    } else {
      auto counts = [&](const std::vector<int64_t>& splits, const at::Tensor& t, const char* which) {
        std::vector<std::size_t> c(n), d(n);
        const int64_t rows = t.dim() > 0 ? t.size(0) : 1;
        const int64_t row_elems = rows > 0 ? t.numel() / rows : 0;
        std::size_t off = 0;
        for (std::size_t r = 0; r < n; ++r) {
          const int64_t k = splits.empty() ? rows / static_cast<int64_t>(n) : splits[r];
          c[r] = static_cast<std::size_t>(k * row_elems);
          d[r] = off;
          off += c[r];
        }
        if ((!splits.empty() && splits.size() != n) || off != elems(t))
          fail(std::string("alltoall_base: ") + which + " splits do not cover the " + which + " tensor's first dimension");
        return std::make_pair(c, d);
      };
      auto [sc, sd] = counts(input_splits, input, "input");
      auto [rc, rd] = counts(output_splits, output, "output");
      p.job().requests.push_back(comm_->all_to_allv(src.data_ptr(), sc, sd, s.buf.data_ptr(), rc, rd, dt));
    }
    p.job().finish = [src, cb = s.copy_back] { cb(); };
    return submit(std::move(p));
  }

  // gather and scatter as point-to-point with the root: each non-root rank
  // moves only its own part (cclz has no rooted gather/scatter collective).
  c10::intrusive_ptr<WorkBase> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                      const c10d::GatherOptions& opts) override {
    check_single(inputs, "gather");
    const int root = static_cast<int>(opts.rootRank);
    const at::Tensor& in = inputs[0];
    const cclz::DataType dt = check_tensor(in, "gather");
    at::Tensor src = in.contiguous();
    if (getRank() != root) {
      if (!outputs.empty() && !outputs[0].empty()) fail("gather: only the root rank takes output tensors");
      Pending p = start(c10d::OpType::GATHER, {}, "gather");
      p.job().requests.push_back(comm_->send(src.data_ptr(), elems(src), dt, root));
      p.job().finish = [src] {};
      return submit(std::move(p));
    }
    if (outputs.size() != 1 || outputs[0].size() != static_cast<std::size_t>(getSize()))
      fail("gather: the root expects one output list of " + std::to_string(getSize()) + " tensors");
    std::vector<Staged> staged;
    for (const at::Tensor& o : outputs[0]) {
      check_tensor(o, "gather");
      if (o.numel() != in.numel() || o.scalar_type() != in.scalar_type())
        fail("gather: every output tensor must have the input's numel and dtype");
      staged.push_back(stage(o));
    }
    Pending p = start(c10d::OpType::GATHER, outputs[0], "gather");
    std::vector<std::function<void()>> backs;
    for (int r = 0; r < getSize(); ++r) {
      if (r == root) continue;  // its own part is copied in finish
      p.job().requests.push_back(comm_->recv(staged[r].buf.data_ptr(), elems(src), dt, r));
      backs.push_back(staged[r].copy_back);
    }
    at::Tensor own = outputs[0][root];
    p.job().finish = [src, own, backs]() mutable {
      own.copy_(src.view(own.sizes()));
      for (const auto& b : backs) b();
    };
    return submit(std::move(p));
  }

  c10::intrusive_ptr<WorkBase> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                       const c10d::ScatterOptions& opts) override {
    check_single(outputs, "scatter");
    const int root = static_cast<int>(opts.rootRank);
    at::Tensor& out = outputs[0];
    const cclz::DataType dt = check_tensor(out, "scatter");
    Staged s = stage(out);
    Pending p = start(c10d::OpType::SCATTER, outputs, "scatter");
    if (getRank() != root) {
      if (!inputs.empty() && !inputs[0].empty()) fail("scatter: only the root rank takes input tensors");
      p.job().requests.push_back(comm_->recv(s.buf.data_ptr(), elems(out), dt, root));
      p.job().finish = s.copy_back;
      return submit(std::move(p));
    }
    if (inputs.size() != 1 || inputs[0].size() != static_cast<std::size_t>(getSize()))
      fail("scatter: the root expects one input list of " + std::to_string(getSize()) + " tensors");
    std::vector<at::Tensor> srcs;
    for (const at::Tensor& t : inputs[0]) {
      check_tensor(t, "scatter");
      if (t.numel() != out.numel() || t.scalar_type() != out.scalar_type())
        fail("scatter: every input tensor must have the output's numel and dtype");
      srcs.push_back(t.contiguous());
    }
    for (int r = 0; r < getSize(); ++r)
      if (r != root) p.job().requests.push_back(comm_->send(srcs[r].data_ptr(), elems(srcs[r]), dt, r));
    at::Tensor own = out;
    p.job().finish = [srcs, own, root]() mutable { own.copy_(srcs[root].view(own.sizes())); };
    return submit(std::move(p));
  }

  c10::intrusive_ptr<WorkBase> barrier(const c10d::BarrierOptions& /*opts*/) override {
    std::vector<at::Tensor> none;
    Pending p = start(c10d::OpType::BARRIER, none, "barrier");
    p.job().requests.push_back(comm_->barrier());
    return submit(std::move(p));
  }

  c10::intrusive_ptr<WorkBase> send(std::vector<at::Tensor>& tensors, int dst, int /*tag*/) override {
    check_single(tensors, "send");
    const cclz::DataType dt = check_tensor(tensors[0], "send");
    at::Tensor src = tensors[0].contiguous();
    Pending p = start(c10d::OpType::SEND, tensors, "send");
    p.job().requests.push_back(comm_->send(src.data_ptr(), elems(src), dt, dst));
    p.job().finish = [src] {};
    return submit(std::move(p));
  }

  c10::intrusive_ptr<WorkBase> recv(std::vector<at::Tensor>& tensors, int src_rank, int /*tag*/) override {
    check_single(tensors, "recv");
    const cclz::DataType dt = check_tensor(tensors[0], "recv");
    Staged s = stage(tensors[0]);
    Pending p = start(c10d::OpType::RECV, tensors, "recv");
    p.job().requests.push_back(comm_->recv(s.buf.data_ptr(), elems(s.buf), dt, src_rank));
    p.job().finish = s.copy_back;
    return submit(std::move(p));
  }

  // The DDP hook's all-reduce: compressed, averaged, in place, blocking.
  // State per bucket index; a bucket whose size changed (DDP rebuilds its
  // buckets after the first step) gets a fresh state.
  void compressed_allreduce(at::Tensor& bucket, const std::string& spec, int64_t bucket_index) {
    const cclz::DataType dt = check_tensor(bucket, "compressed allreduce");
    if (!bucket.is_contiguous()) fail("compressed allreduce: the bucket buffer is not contiguous");
    std::lock_guard<std::mutex> lock(hook_mu_);
    auto& comp = compressors_[spec];
    if (!comp) check_status(cclz::make_compressor(spec, &comp), "compressor spec");
    cclz::TensorDesc desc;
    desc.count = elems(bucket);
    desc.dtype = dt;
    auto& state = states_[{spec, bucket_index}];
    if (!state || state->desc().count != desc.count || state->desc().dtype != desc.dtype)
      check_status(comp->make_state(desc, &state), "compressor state");
    cclz::CompressedOptions opt;
    opt.average = true;
    opt.name = "ddp bucket " + std::to_string(bucket_index);
    check_status(cclz::compressed_all_reduce(*comm_, bucket.data_ptr(), desc, *comp, *state, opt),
                 "compressed allreduce");
  }

  // The hook's path: the compressed all-reduce of a bucket runs on the hook
  // lane (one thread per group, FIFO), so backward goes on meanwhile; `fut`
  // (a torch.futures.Future) gets the bucket, or a RuntimeError with cclz's
  // message. Called with the GIL held.
  void compressed_allreduce_async(at::Tensor bucket, std::string spec, int64_t bucket_index, pybind11::object fut) {
    namespace py = pybind11;
    // The Python objects are only touched, and released, under the GIL.
    auto* py_fut = new py::object(std::move(fut));
    auto task = [this, bucket, spec = std::move(spec), bucket_index, py_fut]() mutable {
      std::string error;
      try {
        compressed_allreduce(bucket, spec, bucket_index);
      } catch (const std::exception& e) {
        error = e.what();
      }
      py::gil_scoped_acquire gil;
      try {
        if (error.empty())
          py_fut->attr("set_result")(py::cast(bucket));
        else
          py_fut->attr("set_exception")(py::module_::import("builtins").attr("RuntimeError")(error));
      } catch (py::error_already_set& e) {
        e.restore();
        PyErr_Print();  // nowhere else to report it: the future stays pending
      }
      delete py_fut;
    };
    {
      std::lock_guard<std::mutex> lock(lane_mu_);
      if (!lane_thread_.joinable()) {
        lane_thread_ = std::thread([this] { hook_lane(); });
        lane_thread_id_.store(lane_thread_.get_id());
      }
      lane_.push_back(std::move(task));
      lane_pending_.fetch_add(1);
    }
    lane_cv_.notify_all();
  }

 private:
  // A contiguous buffer for a collective to write into, and how to put its
  // result back into the caller's tensor (nothing when it is the tensor).
  struct Staged {
    at::Tensor buf;
    std::function<void()> copy_back;
  };
  static Staged stage(const at::Tensor& t) {
    if (t.is_contiguous()) return {t, [] {}};
    at::Tensor buf = t.contiguous();
    at::Tensor dst = t;
    return {buf, [buf, dst]() mutable { dst.copy_(buf); }};
  }

  Pending start(c10d::OpType type, const std::vector<at::Tensor>& outputs, const char* op) {
    wait_for_hook_lane();
    if (type != c10d::OpType::SEND && type != c10d::OpType::RECV) seq_.fetch_add(1);
    auto job = std::make_shared<Job>();
    job->op = op;
    return Pending{c10::make_intrusive<CclzWork>(getRank(), type, outputs, std::move(job), completer_)};
  }

  c10::intrusive_ptr<WorkBase> allreduce_many(std::vector<at::Tensor>& tensors, const c10d::ReduceOp& rop,
                                                c10d::OpType type, const char* name) {
    const cclz::ReduceOp op = to_cclz(rop, name);
    std::vector<cclz::DataType> dts;
    for (const at::Tensor& t : tensors) dts.push_back(check_tensor(t, name));
    Pending p = start(type, tensors, name);
    std::vector<std::function<void()>> backs;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      Staged s = stage(tensors[i]);
      p.job().requests.push_back(comm_->all_reduce(s.buf.data_ptr(), s.buf.data_ptr(), elems(s.buf), dts[i], op));
      backs.push_back(s.copy_back);
    }
    p.job().finish = [backs] {
      for (const auto& b : backs) b();
    };
    return submit(std::move(p));
  }

  static c10::intrusive_ptr<WorkBase> submit(Pending p) { return p.work; }

  std::unique_ptr<cclz::Comm> comm_;
  std::shared_ptr<Completer> completer_;
  std::atomic<uint64_t> seq_{0};

  // A collective issued while compressed hook all-reduces are queued would
  // reach the Comm before them on one rank and after them on another: it
  // waits for the lane to drain first. Free when no hook is in flight.
  void wait_for_hook_lane() {
    if (lane_pending_.load() == 0) return;
    // On the lane itself (a callback of a hook's future issuing a
    // collective): it is already in order, and waiting would never end.
    if (std::this_thread::get_id() == lane_thread_id_.load()) return;
    ReleaseGilIfHeld no_gil;
    std::unique_lock<std::mutex> lock(lane_mu_);
    lane_cv_.wait(lock, [this] { return lane_pending_.load() == 0; });
  }
  void hook_lane() {
    std::unique_lock<std::mutex> lock(lane_mu_);
    for (;;) {
      lane_cv_.wait(lock, [this] { return lane_stop_ || !lane_.empty(); });
      if (lane_.empty()) return;
      auto task = std::move(lane_.front());
      lane_.pop_front();
      lock.unlock();
      task();
      lock.lock();
      lane_pending_.fetch_sub(1);
      lane_cv_.notify_all();
    }
  }
  void stop_hook_lane() {
    {
      std::lock_guard<std::mutex> lock(lane_mu_);
      lane_stop_ = true;
    }
    lane_cv_.notify_all();
    if (lane_thread_.joinable()) {
      // Its tasks take the GIL: do not hold it while joining.
      ReleaseGilIfHeld no_gil;
      lane_thread_.join();
    }
  }
  std::mutex lane_mu_;
  std::condition_variable lane_cv_;
  std::deque<std::function<void()>> lane_;
  std::atomic<std::size_t> lane_pending_{0};
  bool lane_stop_ = false;
  std::thread lane_thread_;
  std::atomic<std::thread::id> lane_thread_id_{};

  std::mutex hook_mu_;
  std::map<std::string, std::unique_ptr<cclz::Compressor>> compressors_;
  std::map<std::pair<std::string, int64_t>, std::unique_ptr<cclz::CompressorState>> states_;
};

c10::intrusive_ptr<BaseGroup> create(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                     std::chrono::milliseconds /*timeout*/) {
  return c10::make_intrusive<ProcessGroupCclz>(store, rank, size);
}

// Called with the GIL held.
ProcessGroupCclz& as_cclz(const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
  std::string name = pg->getBackendName();
#if TORCH_VERSION_MAJOR >= 2
  // The group's CPU backend (the group's own name is "custom" for any
  // plugin). TORCH_DISTRIBUTED_DEBUG=DETAIL wraps it in a ProcessGroupWrapper,
  // whose header needs gloo's: unwrapped through its binding's wrapped_pg.
  ProcessGroupCclz* p = nullptr;
  try {
    c10::intrusive_ptr<c10d::Backend> b = pg->getBackend(c10::DeviceType::CPU);
    name = b->getBackendName();
    p = dynamic_cast<ProcessGroupCclz*>(b.get());
    if (p == nullptr) {
      pybind11::object o = pybind11::cast(b);
      if (pybind11::hasattr(o, "wrapped_pg"))
        p = dynamic_cast<ProcessGroupCclz*>(o.attr("wrapped_pg").cast<c10::intrusive_ptr<c10d::Backend>>().get());
    }
  } catch (const c10::Error&) {
    // no CPU backend (an NCCL-only group)
  }
#else
  auto* p = dynamic_cast<ProcessGroupCclz*>(pg.get());
#endif
  if (p == nullptr)
    throw std::invalid_argument("cclz.torch.hook: the DDP process group is not a cclz one (backend \"" + name +
                                "\"); use init_process_group(backend=\"cclz\")");
  return *p;
}

// cclz.torch.empty: a CPU tensor whose storage is cclz::mem_alloc memory
// (zeroed, page-aligned), freed with the storage. The node's other ranks can
// map it, so collectives whose tensors are all such memory take the direct
// path (docs/performance.md) instead of staging through shared slots.
at::Tensor shared_empty(const std::vector<int64_t>& sizes, const pybind11::object& dtype) {
  if (!THPDtype_Check(dtype.ptr()))
    throw pybind11::type_error("cclz.torch.empty: dtype must be a torch.dtype, got " +
                               std::string(pybind11::str(pybind11::type::of(dtype).attr("__name__"))));
  const at::ScalarType st = reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type;
  const at::TensorOptions options = at::TensorOptions().dtype(st).device(at::kCPU);
  std::size_t bytes = c10::elementSize(st);
  bool empty = false;
  for (int64_t s : sizes) {
    if (s < 0) throw std::invalid_argument("cclz.torch.empty: negative dimension " + std::to_string(s));
    empty = empty || s == 0;
    if (!empty && __builtin_mul_overflow(bytes, static_cast<std::size_t>(s), &bytes))
      throw std::invalid_argument("cclz.torch.empty: the tensor's size in bytes overflows");
  }
  if (empty) return at::empty(sizes, options);  // no bytes to share
  void* p = nullptr;
  const cclz::Status st_alloc = cclz::mem_alloc(&p, bytes);
  if (!st_alloc.ok()) throw std::runtime_error("cclz.torch.empty: " + st_alloc.to_string());
  return at::from_blob(p, sizes, [](void* q) { (void)cclz::mem_free(q); }, options);
}

// cclz.torch.share_memory_: moves an existing CPU tensor's storage into
// cclz::mem_alloc memory, as torch's Tensor.share_memory_ moves one into a
// shared file: every tensor viewing the storage sees the new memory, with
// the same bytes. A storage that is mem_alloc memory already (cclz.torch.empty,
// the use_shared_memory pool, a registered buffer) is left where it is.
at::Tensor share_memory(const at::Tensor& tensor) {
  if (!tensor.defined()) throw std::invalid_argument("cclz.torch.share_memory_: the tensor is undefined");
  if (!tensor.device().is_cpu())
    throw std::invalid_argument("cclz.torch.share_memory_: only CPU tensors can move, this one is on " +
                                tensor.device().str());
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  const std::size_t bytes = storage->nbytes();
  void* old = storage->data_ptr().get();
  cclz::detail::SharedRange range;
  if (bytes == 0 || cclz::detail::find_shared_range(old, bytes, &range)) return tensor;
  void* p = nullptr;
  const cclz::Status st = cclz::mem_alloc(&p, bytes);
  if (!st.ok()) throw std::runtime_error("cclz.torch.share_memory_: " + st.to_string());
  std::memcpy(p, old, bytes);
  // The old memory is released as the returned DataPtr goes out of scope.
  (void)storage->set_data_ptr(c10::DataPtr(p, p, [](void* q) { (void)cclz::mem_free(q); }, c10::Device(c10::kCPU)));
  return tensor;
}

// cclz.torch.use_shared_memory: torch's CPU allocator, serving tensors of at
// least min_bytes from a pool of shared-memory arenas (detail::ShmPool) and
// the rest from the allocator it replaced. Tensors torch allocates itself,
// DDP's gradient buckets among them, then qualify for the direct path.
// Arenas are never returned, so a freed block allocated again keeps the
// peers' mappings of it valid. Immortal: tensors may be freed at any time,
// interpreter exit included.
class SharedCpuAllocator final : public c10::Allocator {
 public:
  static constexpr std::size_t kArenaBytes = std::size_t{32} << 20;

  static SharedCpuAllocator* install(std::size_t min_bytes) {
    static std::mutex mu;
    std::lock_guard<std::mutex> lock(mu);
    if (instance_ == nullptr) {
      instance_ = new SharedCpuAllocator(c10::GetCPUAllocator());
      c10::SetCPUAllocator(instance_, std::numeric_limits<uint8_t>::max());
      // The arenas are MAP_SHARED: a forked child (a DataLoader worker)
      // allocating from its copy of the free lists would hand out the
      // blocks its parent hands out too. Children use the old allocator.
      pthread_atfork(nullptr, nullptr, [] { instance_->forked_.store(true); });
    }
    instance_->min_bytes_.store(min_bytes);
    return instance_;
  }
  static SharedCpuAllocator* instance() { return instance_; }

  // Allocator::allocate is const in PyTorch 1.13 and not in later 2.x; one
  // of the two overrides it. copy_data is pure virtual in those.
  c10::DataPtr allocate(size_t n) const { return allocate_impl(n); }
  c10::DataPtr allocate(size_t n) { return allocate_impl(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const { std::memcpy(dest, src, count); }

  cclz::detail::ShmPool::Stats stats() const { return pool_.stats(); }

 private:
  explicit SharedCpuAllocator(c10::Allocator* fallback) : fallback_(fallback), pool_(kArenaBytes) {}

  c10::DataPtr allocate_impl(size_t n) const {
    if (n >= min_bytes_.load(std::memory_order_relaxed) && !forked_.load(std::memory_order_relaxed)) {
      if (void* p = pool_.allocate(n)) return {p, p, &release, c10::Device(c10::DeviceType::CPU)};
      // No shared memory to be had: heap memory still works (staged).
    }
    return fallback_->allocate(n);
  }
  static void release(void* p) { (void)instance_->pool_.free(p); }

  static inline SharedCpuAllocator* instance_ = nullptr;
  c10::Allocator* fallback_;
  std::atomic<std::size_t> min_bytes_{0};
  std::atomic<bool> forked_{false};
  mutable cclz::detail::ShmPool pool_;
};

}  // namespace cclz_torch

PYBIND11_MODULE(_C, m) {
  namespace py = pybind11;
  using cclz_torch::ProcessGroupCclz;
  m.doc() = "cclz torch.distributed backend (C++ part); import cclz.torch to register it";
  py::class_<ProcessGroupCclz, cclz_torch::BaseGroup, c10::intrusive_ptr<ProcessGroupCclz>>(m, "ProcessGroupCclz");
  m.def("create_process_group", &cclz_torch::create, py::arg("store"), py::arg("rank"), py::arg("size"),
        py::arg("timeout"), py::call_guard<py::gil_scoped_release>());
  m.def(
      "check_spec",
      [](const std::string& spec) {
        std::unique_ptr<cclz::Compressor> c;
        const cclz::Status st = cclz::make_compressor(spec, &c);
        if (!st.ok()) throw std::invalid_argument("cclz compressor spec '" + spec + "': " + st.message());
      },
      py::arg("spec"), "Raises ValueError naming the spec when cclz cannot make a compressor from it.");
  m.def(
      "compressed_allreduce_async",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& pg, at::Tensor bucket, std::string spec,
         int64_t bucket_index, py::object future) {
        cclz_torch::as_cclz(pg).compressed_allreduce_async(std::move(bucket), std::move(spec), bucket_index,
                                                           std::move(future));
      },
      py::arg("process_group"), py::arg("bucket"), py::arg("spec"), py::arg("bucket_index"), py::arg("future"),
      "In place, on the group's hook thread: the bucket becomes the mean over ranks of the compressed "
      "gradients; `future` (torch.futures.Future) then gets the bucket.");
  m.def("empty", &cclz_torch::shared_empty, py::arg("sizes"), py::arg("dtype"),
        "A CPU tensor in memory the node's ranks map from one another (cclz::mem_alloc), zeroed.");
  m.def("share_memory_", &cclz_torch::share_memory, py::arg("tensor"),
        "Moves a CPU tensor's storage into memory the node's ranks map from one another; returns the tensor.");
  m.def(
      "use_shared_memory",
      [](std::size_t min_bytes) { cclz_torch::SharedCpuAllocator::install(min_bytes); }, py::arg("min_bytes"),
      "From now on, CPU tensors of at least min_bytes are allocated in shared memory.");
  m.def(
      "shared_memory_stats",
      []() {
        py::dict d;
        auto* a = cclz_torch::SharedCpuAllocator::instance();
        const cclz::detail::ShmPool::Stats s = a ? a->stats() : cclz::detail::ShmPool::Stats{};
        d["arenas"] = s.arenas;
        d["arena_bytes"] = s.arena_bytes;
        d["live_bytes"] = s.live_bytes;
        d["live_blocks"] = s.live_blocks;
        return d;
      },
      "The shared-memory allocator's arenas and the blocks it has handed out.");
  m.def(
      "direct_calls",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
        return cclz_torch::as_cclz(pg).comm().impl()->direct_calls();
      },
      py::arg("process_group"),
      "How many collectives of this rank on the group read its node's peers' tensors in place (the direct path).");
}
