// cclz-perf: nccl-tests-style bandwidth benchmark for cclz collectives,
// launched with mpiexec. For each size it times cclz out-of-place and
// in-place, checks the results against coll_desc's exact expectation, times
// the matching MPI call in the same run, and for all_reduce on one host
// relates busbw to the memory-copy roofline (docs/performance.md).
#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "algo_query.hpp"
#include "cclz/cclz.hpp"
#include "cclz/mpi.hpp"
#include "coll_desc.hpp"
#include "compressed.hpp"
#include "mpi_baseline.hpp"
#include "membw.hpp"
#include "options.hpp"
#include "report.hpp"

#ifndef CCLZ_VERSION_STRING
#define CCLZ_VERSION_STRING "unknown"
#endif

namespace cclz::perf {
namespace {

using testing::CollCase;
using testing::CollKind;

constexpr double kGB = 1e9;

// 64-byte aligned, zero-length-safe byte buffer: heap memory, with -R 1
// cclz::mem_alloc memory (page aligned), with -R 2 heap memory registered
// with cclz::register_buffer.
struct BufferFree {
  BufferKind kind = BufferKind::heap;
  void operator()(std::byte* p) const {
    switch (kind) {
      case BufferKind::heap: ::operator delete[](p, std::align_val_t{64}); break;
      case BufferKind::mem_alloc: (void)mem_free(p); break;
      case BufferKind::registered_heap:
        (void)deregister_buffer(p);
        std::free(p);
        break;
    }
  }
};
struct Buffer {
  using Free = BufferFree;
  std::unique_ptr<std::byte[], Free> mem;
  std::size_t bytes = 0;
  BufferKind kind = BufferKind::heap;
  std::size_t offset = 0;  // where data() starts in mem (--offset)

  void reserve(std::size_t want) {
    want += offset;
    if (want <= bytes && mem) return;
    want = std::max<std::size_t>(want, 64);
    mem.reset();
    void* p = nullptr;
    switch (kind) {
      case BufferKind::heap: p = new (std::align_val_t{64}) std::byte[want]; break;
      case BufferKind::mem_alloc:
        if (Status st = mem_alloc(&p, want); !st.ok()) throw std::runtime_error(st.to_string());
        break;
      case BufferKind::registered_heap: {
        // register_buffer takes whole pages.
        const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
        want = (want + page - 1) / page * page;
        p = std::aligned_alloc(page, want);
        if (p == nullptr) throw std::bad_alloc();
        break;
      }
    }
    // Fault the pages in outside any timing (and register what is there).
    std::memset(p, 0, want);
    if (kind == BufferKind::registered_heap) {
      if (Status st = register_buffer(p, want); !st.ok()) {
        std::free(p);
        throw std::runtime_error(st.to_string());
      }
    }
    mem = std::unique_ptr<std::byte[], Free>(static_cast<std::byte*>(p), Free{kind});
    bytes = want;
  }
  std::byte* data() const { return mem.get() + offset; }
  std::byte* at(std::size_t elems, DataType dt) const { return data() + elems * dtype_size(dt); }
};

// Waits on an MPI request without spinning: MPICH's blocking waits poll a
// core, which would steal it from rank 0's copy-bandwidth measurement.
void idle_wait(MPI_Request* req) {
  int done = 0;
  while (true) {
    MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// The CPUs this host's ranks may run on together: the union of their
// affinity masks (a rank bound to one core sees only its own core).
cpu_set_t host_cpus() {
  cpu_set_t mine, all;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof mine, &mine) != 0) {
    for (int c = 0; c < static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); ++c) CPU_SET(c, &mine);
  }
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  MPI_Allreduce(&mine, &all, static_cast<int>(sizeof mine), MPI_BYTE, MPI_BOR, local);
  MPI_Comm_free(&local);
  return all;
}

// The collective's buffers, shared by every size of a sweep.
struct Buffers {
  Buffer send, recv, inplace;
};

// What --touch does to a call's buffers before it is timed: writes one
// byte of every cache line of the input (its own value back, so the data
// stay as filled) and reads one of every line of the output, as a training
// step's backward writes the gradients and its optimizer reads the result.
struct Touch {
  std::byte* in = nullptr;
  std::size_t in_bytes = 0;
  const std::byte* out = nullptr;
  std::size_t out_bytes = 0;

  void apply() const noexcept {
    each_line(in, in_bytes, [](std::byte* p) {
      volatile std::byte* v = p;
      *v = *v;
    });
    unsigned sum = 0;
    each_line(out, out_bytes,
              [&](const std::byte* p) { sum += static_cast<unsigned>(*static_cast<volatile const std::byte*>(p)); });
    sink = sum;
  }

 private:
  // One byte in each 64-byte line that [p, p + n) overlaps.
  template <class Byte, class F>
  static void each_line(Byte* p, std::size_t n, F&& f) noexcept {
    if (n == 0) return;
    const auto first = reinterpret_cast<std::uintptr_t>(p);
    for (std::uintptr_t line = first & ~std::uintptr_t{63}; line < first + n; line += 64) {
      f(p + (std::max(line, first) - first));
    }
  }
  static inline volatile unsigned sink = 0;
};

class Bench {
 public:
  Bench(const Options& o, Comm& comm, MpiBaseline* mpi, const RunInfo& info, Buffers& buf)
      : o_(o), comm_(comm), mpi_(mpi), info_(info), query_(comm), buf_(buf) {
    rank_ = comm.rank();
    n_ = comm.size();
  }

  // Runs one table: every dtype, op and size for `algorithm` ("" = tuner).
  // Returns false when a collective failed (the communicator is then
  // unusable and the run stops).
  bool run_table(const std::string& algorithm, bool footer, std::vector<Row>* rows);

  // One row of `algorithm`'s table. Returns false when a collective failed
  // (reported on stderr by every rank; the communicator is then unusable).
  bool run_point(const std::string& algorithm, const Point& p, Row* row);

 private:
  Row measure(const std::string& algorithm, DataType dt, ReduceOp op, std::size_t bytes, bool has_op);
  Status call(const CollCase& c, const testing::VLayout& v, const void* s, void* r, const CallOptions& opt);
  // What time_loop measured, in seconds.
  struct Timing {
    double mean = 0;           // per-iteration average on each rank, max over ranks
    double p50 = -1, p99 = -1; // --per-call: of the slowest rank's time per call
  };
  // Times `iters` calls of `fn` after `warmup` untimed ones. Sets *failed
  // (on every rank) if any rank failed. With --touch, `touch` is applied
  // before each timed call (see Touch).
  template <class Fn>
  Timing time_loop(Fn&& fn, bool* failed, bool cclz_start, const Touch& touch);
  long long sum_over_ranks(long long v) const;
  bool any_rank(bool v) const;

  const Options& o_;
  Comm& comm_;
  MpiBaseline* mpi_;
  const RunInfo& info_;
  AlgoQuery query_;
  Buffers& buf_;
  int rank_ = 0, n_ = 1;
  std::string error_;   // this rank's first failure
  bool failed_ = false; // a call failed on some rank (every rank agrees)
};

long long Bench::sum_over_ranks(long long v) const {
  long long out = 0;
  MPI_Allreduce(&v, &out, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  return out;
}

bool Bench::any_rank(bool v) const {
  int in = v ? 1 : 0, out = 0;
  MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return out != 0;
}

Status Bench::call(const CollCase& c, const testing::VLayout& v, const void* s, void* r, const CallOptions& opt) {
  switch (c.kind) {
    case CollKind::all_reduce: return comm_.all_reduce(s, r, c.count, c.dt, c.op, opt).wait();
    case CollKind::reduce_scatter: return comm_.reduce_scatter(s, r, c.count, c.dt, c.op, opt).wait();
    case CollKind::all_gather: return comm_.all_gather(s, r, c.count, c.dt, opt).wait();
    case CollKind::all_to_all: return comm_.all_to_all(s, r, c.count, c.dt, opt).wait();
    case CollKind::all_to_allv:
      return comm_.all_to_allv(s, v.send_counts, v.send_displs, r, v.recv_counts, v.recv_displs, c.dt, opt).wait();
    case CollKind::broadcast: return comm_.broadcast(s, r, c.count, c.dt, c.root, opt).wait();
    case CollKind::reduce: return comm_.reduce(s, r, c.count, c.dt, c.op, c.root, opt).wait();
    case CollKind::barrier: return comm_.barrier(opt).wait();
  }
  return {Result::invalid_argument, "cclz-perf: unknown collective"};
}

// `cclz_start`: bracket the timed loop with cclz barriers. With more ranks
// than cores MPICH busy-polls: ranks that left MPI_Barrier first would time
// their calls against peers still spinning in it, and a rank that finished
// its loop first would spin in the MPI_Allreduce below while its peers are
// still timing (each costs a scheduler slice, milliseconds). Each library
// is timed between its own barriers.
// With --touch each call is timed alone, after this rank has touched its
// buffers and every rank has passed the library's own barrier (cclz's for
// cclz, MPI's for MPI), so that no rank's touch is timed as its peers' wait.
template <class Fn>
Bench::Timing Bench::time_loop(Fn&& fn, bool* failed, bool cclz_start, const Touch& touch) {
  using clock = std::chrono::steady_clock;
  Timing timing;
  bool bad = false;
  for (int i = 0; i < o_.warmup && !bad; ++i) bad = !fn();
  // Everyone starts together; the barrier is outside the timed region.
  // Between cclz's warm-up and its timed calls only cclz runs: MPICH's
  // reductions and barriers busy-poll, and with more ranks than cores the
  // scheduler then passed over the ranks that spun there in cclz's first
  // timed calls (4 ranks on 2 cores: 0.6-4.9 ms each in 6 of 8 runs,
  // none after cclz's barrier alone; docs/performance-log.md).
  if (cclz_start) {
    const std::int32_t mine = bad ? 1 : 0;
    std::int32_t any = 0;
    if (!comm_.all_reduce(&mine, &any, 1, DataType::i32, ReduceOp::max).wait().ok() || any != 0 ||
        !comm_.barrier().wait().ok()) {
      *failed = true;
      return timing;
    }
  } else {
    if (any_rank(bad)) {
      *failed = true;
      return timing;
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  // --per-call: this rank's seconds for each timed call, by index (a call
  // that did not run stays 0).
  std::vector<double> calls(o_.per_call ? static_cast<std::size_t>(o_.iters) : 0, 0.0);
  double local = 0;
  if (o_.touch) {
    for (int i = 0; i < o_.iters && !bad; ++i) {
      touch.apply();
      if (cclz_start) {
        bad = !comm_.barrier().wait().ok();
      } else {
        MPI_Barrier(MPI_COMM_WORLD);
      }
      const auto t0 = clock::now();
      if (!bad) bad = !fn();
      const double secs = std::chrono::duration<double>(clock::now() - t0).count();
      local += secs;
      if (!calls.empty()) calls[static_cast<std::size_t>(i)] = secs;
    }
    local /= o_.iters;
  } else {
    // Back to back: a call's time runs from the end of the one before.
    const auto t0 = clock::now();
    auto last = t0;
    for (int i = 0; i < o_.iters && !bad; ++i) {
      bad = !fn();
      if (!calls.empty()) {
        const auto now = clock::now();
        calls[static_cast<std::size_t>(i)] = std::chrono::duration<double>(now - last).count();
        last = now;
      }
    }
    // With --per-call the mean ends where the last call's time ends.
    const auto end = calls.empty() ? clock::now() : last;
    local = std::chrono::duration<double>(end - t0).count() / o_.iters;
  }
  // And nobody enters MPI (busy-polling) while a peer is still timing.
  if (cclz_start && !bad) bad = !comm_.barrier().wait().ok();
  MPI_Allreduce(&local, &timing.mean, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (!calls.empty()) {
    // A call is as slow as its slowest rank.
    std::vector<double> slowest(calls.size());
    MPI_Allreduce(calls.data(), slowest.data(), static_cast<int>(calls.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    std::sort(slowest.begin(), slowest.end());
    timing.p50 = percentile(slowest, 50);
    timing.p99 = percentile(slowest, 99);
  }
  *failed = any_rank(bad);
  return timing;
}

Row Bench::measure(const std::string& algorithm, DataType dt, ReduceOp op, std::size_t bytes, bool has_op) {
  const testing::CollInfo& ci = testing::coll_info(o_.kind);
  Row row;
  row.collective = ci.name;
  row.requested = algorithm;
  row.dt = dt;
  row.has_op = has_op;
  row.op = op;
  row.root = ci.has_root ? o_.root : -1;

  CollCase c;
  c.kind = o_.kind;
  c.dt = dt;
  c.op = op;
  c.count = testing::count_for_bytes(o_.kind, bytes, dt, n_);
  c.root = o_.root;
  c.nranks = n_;
  row.count = testing::row_count(o_.kind, c.count, n_);
  row.bytes = row.count * dtype_size(dt);
  const testing::VLayout v = o_.kind == CollKind::all_to_allv ? testing::alltoallv_layout(c.count, rank_, n_)
                                                              : testing::VLayout{};

  // Ask the registry and tuner what the communicator would do.
  coll::CollArgs a;
  a.kind = o_.kind;
  a.count = c.count;
  a.dt = dt;
  a.op = op == ReduceOp::avg ? ReduceOp::sum : op;  // the comm runs avg as sum
  a.root = c.root;
  a.send_counts = v.send_counts;
  a.send_displs = v.send_displs;
  a.recv_counts = v.recv_counts;
  a.recv_displs = v.recv_displs;
  row.tuned = query_.tuned(a);
  row.algo = algorithm.empty() ? row.tuned : algorithm;
  if (!algorithm.empty() && !query_.supports(algorithm, a)) {
    row.supported = false;
    return row;
  }
  CallOptions opt;
  opt.algorithm = algorithm;

  const testing::BufferCounts bc = testing::buffer_counts(c, rank_);
  const std::size_t es = dtype_size(dt);
  buf_.send.reserve(bc.send * es);
  buf_.recv.reserve(bc.recv * es);
  std::byte* s = buf_.send.data();
  std::byte* r = buf_.recv.data();
  const double factor = testing::busbw_factor(o_.kind, n_);
  auto finish = [&](Measure* m, const Timing& t) {
    m->valid = true;
    m->time_us = t.mean * 1e6;
    m->algbw = t.mean > 0 ? static_cast<double>(row.bytes) / t.mean / kGB : 0;
    m->busbw = m->algbw * factor;
    if (t.p50 >= 0) {
      m->p50_us = t.p50 * 1e6;
      m->p99_us = t.p99 * 1e6;
    }
  };
  auto fail = [&](const Status& st) {
    if (!st.ok() && error_.empty()) error_ = st.to_string();
    return st.ok();
  };
  bool failed = false;

  // Out of place: fill, check one call, then time.
  testing::fill_input(c, rank_, s);
  if (o_.check) {
    std::memset(r, 0xA5, bc.recv * es);  // a call that writes nothing must not pass
    const bool ok = fail(call(c, v, s, r, opt));
    if (any_rank(!ok)) return failed_ = true, row;
    row.oop.wrong = sum_over_ranks(static_cast<long long>(testing::check_output(c, rank_, r)));
  }
  const Touch oop_touch{s, bc.send * es, r, bc.recv * es};
  Timing t = time_loop([&] { return fail(call(c, v, s, r, opt)); }, &failed, true, oop_touch);
  if (failed) return failed_ = true, row;
  long long oop_wrong = row.oop.wrong;
  // The timed calls ran on touched inputs: their output must still be exact.
  if (o_.check && o_.touch) oop_wrong += sum_over_ranks(static_cast<long long>(testing::check_output(c, rank_, r)));
  finish(&row.oop, t);
  row.oop.wrong = oop_wrong;

  // In place, NCCL's layout: one buffer, sendbuf/recvbuf at offsets in it.
  if (ci.has_in_place) {
    const testing::InPlaceLayout ip = testing::in_place_layout(c, rank_);
    buf_.inplace.reserve(ip.buffer_count * es);
    std::byte* base = buf_.inplace.data();
    std::byte* is = buf_.inplace.at(ip.send_offset, dt);
    std::byte* ir = buf_.inplace.at(ip.recv_offset, dt);
    if (o_.check) std::memset(base, 0xA5, ip.buffer_count * es);
    testing::fill_input(c, rank_, is);
    long long wrong = -1;
    if (o_.check) {
      const bool ok = fail(call(c, v, is, ir, opt));
      if (any_rank(!ok)) return failed_ = true, row;
      wrong = sum_over_ranks(static_cast<long long>(testing::check_output(c, rank_, ir)));
    }
    t = time_loop([&] { return fail(call(c, v, is, ir, opt)); }, &failed, true,
                  Touch{is, bc.send * es, ir, bc.recv * es});
    if (failed) return failed_ = true, row;
    finish(&row.ip, t);
    row.ip.wrong = wrong;
  }

  // The matching MPI call on the same buffers and sizes.
  std::string why;
  if (mpi_ != nullptr && mpi_->available(c, &why)) {
    testing::fill_input(c, rank_, s);
    t = time_loop([&] { return mpi_->run(c, &v, s, r) == MPI_SUCCESS; }, &failed, false, oop_touch);
    if (!failed) {
      finish(&row.mpi, t);
    }
  }

  if (info_.roof && row.bytes > 0 && info_.copy_bw_n > 0) {
    // At least T = traffic * S bytes cross the memory bus (all-reduce: 2 n S;
    // coll_desc.hpp, docs/performance.md).
    const double traffic = testing::memory_traffic_factor(o_.kind, n_) * static_cast<double>(row.bytes);
    const double t_roof = traffic / info_.copy_bw_n;
    row.has_roof = true;
    row.roof_busbw = factor * static_cast<double>(row.bytes) / t_roof / kGB;
    row.roof_cached = traffic <= static_cast<double>(info_.llc_bytes);
  }
  return row;
}

bool Bench::run_point(const std::string& algorithm, const Point& p, Row* row) {
  const testing::CollInfo& ci = testing::coll_info(o_.kind);
  *row = measure(algorithm, p.dt, p.op, p.bytes, ci.reduces);
  if (!failed_) return true;
  // Every rank knows a call failed; each says what it saw.
  std::fprintf(stderr, "cclz-perf: rank %d: %s %s %s %s %zu bytes failed: %s\n", rank_, ci.name,
               algorithm.empty() ? "(tuner)" : algorithm.c_str(), dtype_name(p.dt), ci.reduces ? op_name(p.op) : "",
               row->bytes, error_.empty() ? "(a peer failed)" : error_.c_str());
  return false;
}

bool Bench::run_table(const std::string& algorithm, bool footer, std::vector<Row>* rows) {
  if (rank_ == 0) print_table_header(stdout, info_, algorithm.empty() ? "tuner's choice per size" : algorithm);
  std::vector<Row> table;
  bool ok = true;
  for (const Point& p : sweep_points(o_)) {
    Row row;
    if (!run_point(algorithm, p, &row)) {
      ok = false;
      break;
    }
    if (rank_ == 0) print_row(stdout, info_, row);
    table.push_back(row);
  }
  if (rank_ == 0 && footer) print_table_footer(stdout, info_, table);
  rows->insert(rows->end(), table.begin(), table.end());
  return ok;
}

std::string join_dtypes(const std::vector<DataType>& v) {
  std::string s;
  for (DataType t : v) {
    if (!s.empty()) s.push_back(',');
    s.append(dtype_name(t));
  }
  return s;
}
std::string join_ops(const std::vector<ReduceOp>& v) {
  std::string s;
  for (ReduceOp o : v) {
    if (!s.empty()) s.push_back(',');
    s.append(op_name(o));
  }
  return s;
}

int run(int argc, char** argv) {
  int rank = 0, nranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);

  Options o;
  std::string err;
  if (!parse_options(argc, argv, &o, &err)) {
    if (rank == 0) std::fprintf(stderr, "cclz-perf: %s\n\n%s", err.c_str(), usage(argv[0]).c_str());
    return 2;
  }
  if (o.help) {
    if (rank == 0) std::fputs(usage(argv[0]).c_str(), stdout);
    return 0;
  }
  const testing::CollInfo& ci = testing::coll_info(o.kind);
  if (ci.has_root && o.root >= nranks) {
    if (rank == 0) std::fprintf(stderr, "cclz-perf: root %d is not a rank of %d\n", o.root, nranks);
    return 2;
  }
  std::vector<std::string> algorithms;
  if (o.algorithm.empty()) {
    algorithms.emplace_back();
  } else if (o.algorithm == "all") {
    algorithms = algorithms_for(o.kind);
  } else if (coll::find_algorithm(o.kind, o.algorithm) != nullptr) {
    algorithms.push_back(o.algorithm);
  } else {
    if (rank == 0) {
      std::string known;
      for (const std::string& a : algorithms_for(o.kind)) {
        known.push_back(' ');
        known.append(a);
      }
      std::fprintf(stderr, "cclz-perf: no algorithm '%s' for %s (registered:%s)\n", o.algorithm.c_str(), ci.name,
                   known.c_str());
    }
    return 2;
  }

  std::unique_ptr<Comm> comm;
  Status st = comm_from_mpi(MPI_COMM_WORLD, &comm);
  if (!st.ok()) {
    std::fprintf(stderr, "cclz-perf: rank %d: communicator: %s\n", rank, st.to_string().c_str());
    return 3;
  }

  RunInfo info;
  info.collective = ci.name;
  info.version = CCLZ_VERSION_STRING;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  info.host = host;
  info.nranks = nranks;
  info.nodes = comm->num_nodes();
  info.local_ranks = comm->local_size();
  const cpu_set_t cpus = host_cpus();
  info.cores = CPU_COUNT(&cpus);
  info.llc_bytes = last_level_cache_bytes();
  info.min_bytes = o.min_bytes;
  info.max_bytes = o.max_bytes;
  info.step_factor = o.step_factor;
  info.step_bytes = o.step_bytes;
  info.iters = o.iters;
  info.warmup = o.warmup;
  info.check = o.check;
  info.dtypes = join_dtypes(o.dtypes);
  info.ops = ci.reduces ? join_ops(o.ops) : "none";
  info.root = o.root;
  if (!o.algorithm.empty()) {
    info.algorithm = o.algorithm;
  } else if (const char* env = std::getenv("CCLZ_ALGO"); env != nullptr && *env != '\0') {
    info.algorithm = std::string("tuner with CCLZ_ALGO=") + env;
  } else {
    info.algorithm = "tuner";
  }
  info.mpi = o.mpi_baseline;
  info.buffers = o.buffers;
  info.offset = o.offset;
  info.touch = o.touch;
  info.per_call = o.per_call;
  info.roof = o.roofline && info.nodes == 1;
  info.roof_traffic = testing::memory_traffic_formula(o.kind);
  info.copy_measured = o.roofline;
  info.copiers_n = std::max(1, std::min(info.local_ranks, info.cores));

  // Copy bandwidth, measured once by rank 0 while the others sleep.
  {
    double bw[5] = {0, 0, 0, 0, 0};
    if (rank == 0 && info.copy_measured) {
      const CopyBandwidth one = measure_copy_bandwidth(1, std::size_t{256} << 20, 3, &cpus);
      const CopyBandwidth many =
          info.copiers_n == 1 ? one : measure_copy_bandwidth(info.copiers_n, std::size_t{256} << 20, 3, &cpus);
      bw[0] = one.bytes_per_s;
      bw[1] = many.bytes_per_s;
      bw[2] = static_cast<double>(one.bytes_per_copier);
      bw[3] = many.memcpy_bytes_per_s;
      bw[4] = many.streamed_bytes_per_s;
    }
    MPI_Request req;
    MPI_Ibcast(bw, 5, MPI_DOUBLE, 0, MPI_COMM_WORLD, &req);
    idle_wait(&req);
    info.copy_bw_1 = bw[0];
    info.copy_bw_n = bw[1];
    info.copy_bw_n_memcpy = bw[3];
    info.copy_bw_n_streamed = bw[4];
    info.copy_bytes = static_cast<std::size_t>(bw[2]);
  }
  if (rank == 0) print_header(stdout, info);

  std::unique_ptr<MpiBaseline> mpi;
  if (o.mpi_baseline) mpi = std::make_unique<MpiBaseline>(MPI_COMM_WORLD);
  std::vector<Row> rows;
  bool ok = true;
  Buffers buffers;
  for (Buffer* b : {&buffers.send, &buffers.recv, &buffers.inplace}) {
    b->kind = o.buffers;
    b->offset = o.offset;
  }
  if (!o.compressors.empty()) {
    // --compressor: the compressed all-reduce beside the dense one, instead of the table.
    algorithms.clear();
    ok = run_compressed_tables(o, *comm, info);
  }
  // A failed collective leaves the communicator in error; a fresh one lets
  // the remaining algorithms of -A all still be measured.
  auto renew_comm = [&]() -> bool {
    comm->abort();
    comm.reset();
    st = comm_from_mpi(MPI_COMM_WORLD, &comm);
    if (st.ok()) return true;
    std::fprintf(stderr, "cclz-perf: rank %d: new communicator after a failure: %s\n", rank, st.to_string().c_str());
    return false;
  };
  if (algorithms.size() == 1) {
    Bench bench(o, *comm, mpi.get(), info, buffers);
    ok = bench.run_table(algorithms[0], false, &rows);
    if (!ok) renew_comm();
  } else if (algorithms.size() > 1) {
    // -A all measures every algorithm at one size before the next size, so
    // that a change in the host during the run (this project's test host
    // moves its vCPUs within minutes, which changes small-message times 3x)
    // falls on all algorithms of a size alike rather than on whole tables.
    // The tables are printed once everything is measured.
    if (rank == 0) std::printf("# Algorithms measured in turn at each size; the tables follow once all are done.\n");
    std::vector<std::vector<Row>> tables(algorithms.size());
    std::vector<bool> stopped(algorithms.size(), false);
    bool have_comm = true;
    for (const Point& p : sweep_points(o)) {
      for (std::size_t i = 0; i < algorithms.size() && have_comm; ++i) {
        if (stopped[i]) continue;
        Bench bench(o, *comm, mpi.get(), info, buffers);
        Row row;
        if (bench.run_point(algorithms[i], p, &row)) {
          tables[i].push_back(row);
          continue;
        }
        ok = false;
        stopped[i] = true;  // that algorithm's table stops here
        have_comm = renew_comm();
      }
    }
    for (std::size_t i = 0; i < algorithms.size(); ++i) {
      if (rank == 0) {
        print_table_header(stdout, info, algorithms[i]);
        for (const Row& r : tables[i]) print_row(stdout, info, r);
        print_table_footer(stdout, info, tables[i]);
      }
      rows.insert(rows.end(), tables[i].begin(), tables[i].end());
    }
  }
  bool io_ok = true;
  long long wrong = 0;
  double sum = 0, mpi_sum = 0;
  int nbw = 0, nmpi = 0;
  for (const Row& r : rows) {
    for (const Measure* m : {&r.oop, &r.ip}) {
      if (m->valid && m->wrong > 0) wrong += m->wrong;
      if (m->valid) {
        sum += m->busbw;
        ++nbw;
      }
    }
    if (r.mpi.valid) {
      mpi_sum += r.mpi.busbw;
      ++nmpi;
    }
  }
  if (rank == 0) {
    if (algorithms.size() > 1) print_summary(stdout, rows);
    std::printf("# Out of bounds values : %lld %s\n", wrong, wrong == 0 && ok ? "OK" : "FAILED");
    if (o.compressors.empty()) {  // --compressor prints no busbw table
      std::printf("# Avg bus bandwidth    : %.4g\n", nbw > 0 ? sum / nbw : 0.0);
      if (o.mpi_baseline) std::printf("# Avg bus bandwidth (MPI) : %.4g\n", nmpi > 0 ? mpi_sum / nmpi : 0.0);
    }
    if (!ok) std::printf("# A collective failed; see the messages above (that table stopped there).\n");
    std::printf("#\n");
    std::fflush(stdout);
    if (!o.json_path.empty() && !write_json(o.json_path, info, rows, &err)) {
      std::fprintf(stderr, "cclz-perf: %s\n", err.c_str());
      io_ok = false;
    }
    if (!o.csv_path.empty() && !write_csv(o.csv_path, rows, &err)) {
      std::fprintf(stderr, "cclz-perf: %s\n", err.c_str());
      io_ok = false;
    }
  }
  mpi.reset();
  if (comm) {
    st = comm->destroy();
    if (!st.ok()) std::fprintf(stderr, "cclz-perf: rank %d: destroy: %s\n", rank, st.to_string().c_str());
    comm.reset();
  }
  if (!ok || !io_ok) return 2;
  return wrong != 0 ? 1 : 0;
}

}  // namespace
}  // namespace cclz::perf

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const int rc = cclz::perf::run(argc, argv);
  // Every rank reports the worst exit status so mpiexec's is meaningful.
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
