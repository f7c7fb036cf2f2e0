// cclz-perf command line: nccl-tests' options (-b -e -f -i -n -w -c -d -o -r)
// plus cclz's own (-A algorithm, --json, --csv, --no-mpi).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "cclz/compressed.hpp"
#include "cclz/types.hpp"
#include "coll_desc.hpp"
#include "report.hpp"

namespace cclz::perf {

struct Options {
  testing::CollKind kind = testing::CollKind::all_reduce;
  std::size_t min_bytes = 4096;
  std::size_t max_bytes = 64u << 20;
  std::size_t step_factor = 4;  // used when step_bytes == 0
  std::size_t step_bytes = 0;   // nccl-tests -i: linear steps instead of a factor
  int iters = 20;
  int warmup = 5;
  bool check = true;
  std::vector<DataType> dtypes{DataType::f32};
  std::vector<ReduceOp> ops{ReduceOp::sum};
  int root = 0;
  std::string algorithm;  // "" = the tuner's choice, "all" = every registered one
  std::string json_path;
  std::string csv_path;
  bool mpi_baseline = true;
  // -R 1: buffers from cclz::mem_alloc, which node-local peers read in
  // place (nccl-tests' -R 1 allocates them with ncclMemAlloc the same way);
  // -R 2: heap buffers registered with cclz::register_buffer (as -R 2 has
  // nccl-tests register them with ncclCommRegister). MPI uses them too.
  BufferKind buffers = BufferKind::heap;
  // --offset B: every buffer starts B bytes past a 64-byte boundary (the
  // alignment of a program's own arrays: glibc's large blocks sit 16 bytes
  // past a page).
  std::size_t offset = 0;
  // --touch: before each timed call every rank writes each cache line of
  // its input and reads each line of its output, as the compute between a
  // training step's collectives does, so that a call finds its inputs in
  // the writer's cache and not in the reader's from the call before; each
  // call is then timed alone, after a barrier (touch and barrier untimed).
  bool touch = false;
  // --per-call: each timed call's time is kept (each rank: from the end of
  // the call before, or the start, to the end of this one), and the median
  // and 99th percentile of the slowest rank's time per call are printed
  // beside the mean: with more ranks than cores a rank the scheduler leaves
  // off its core holds a call back by a slice, and a mean of few calls
  // cannot tell that tail from a slow path.
  bool per_call = false;
  // --no-roofline: no copy-bandwidth measurement at start (about 3 s of
  // 256 MB copies on rank 0), so no %roof column; for runs that check
  // results rather than measure (tests/perf).
  bool roofline = true;
  // --compressor SPEC (repeatable): time the compressed all-reduce instead
  // of the dense table (bench/perf/compressed.cpp); --requant picks the
  // re-quantizable scheme.
  std::vector<std::string> compressors;
  RequantScheme requant = RequantScheme::scatter_reduce_allgather;
  bool help = false;
};

// Parses argv. On error returns false and sets *error; --help sets help.
bool parse_options(int argc, char** argv, Options* out, std::string* error);
std::string usage(const char* argv0);

// "4K" -> 4096, "1M", "2G", plain numbers; false on garbage.
bool parse_bytes(const std::string& s, std::size_t* out);

// The sizes a sweep visits, in bytes, as nccl-tests does.
std::vector<std::size_t> sweep_sizes(const Options& o);

// One row of a sweep, in the order they are measured and printed: every
// size, and at each size every dtype, then every op (sum only for
// collectives that do not reduce). Types and ops are compared at one size
// within seconds of each other, so that a change in the host during a run
// (this project's test host moves its vCPUs within minutes) falls on all of
// them alike rather than on whole tables, as -A all does for algorithms.
struct Point {
  DataType dt;
  ReduceOp op;
  std::size_t bytes;
};
std::vector<Point> sweep_points(const Options& o);

}  // namespace cclz::perf
