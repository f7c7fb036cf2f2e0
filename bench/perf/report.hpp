// cclz-perf output: the nccl-tests-shaped table (plus cclz's algo, MPI and
// roofline columns), the per-size algorithm summary, and JSON/CSV files.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include "coll_desc.hpp"

namespace cclz::perf {

// Where the benchmark's buffers come from (-R).
enum class BufferKind { heap = 0, mem_alloc = 1, registered_heap = 2 };

// One timed variant (out-of-place, in-place or MPI) of one row.
struct Measure {
  bool valid = false;   // measured (false: n/a or skipped)
  double time_us = 0;   // per-iteration average on each rank, max over ranks
  double algbw = 0;     // GB/s, GB = 1e9
  double busbw = 0;     // GB/s
  long long wrong = -1; // elements wrong over all ranks; -1 = not checked
  // --per-call: over the timed calls, the median and 99th percentile
  // (nearest rank) of the slowest rank's time per call; -1 = not measured.
  double p50_us = -1;
  double p99_us = -1;
};

struct Row {
  std::string collective;
  std::string requested;  // -A value for this table ("" = tuner)
  std::string algo;       // the algorithm that ran
  std::string tuned;      // what the tuner picks for this call
  bool supported = true;
  std::size_t bytes = 0;  // nccl-tests size column
  std::size_t count = 0;  // nccl-tests count column (elements)
  DataType dt = DataType::f32;
  bool has_op = false;
  ReduceOp op = ReduceOp::sum;
  int root = -1;          // -1 for collectives without a root
  Measure oop, ip, mpi;
  bool has_roof = false;
  double roof_busbw = 0;  // GB/s: the memory-copy roofline's busbw for this size
  bool roof_cached = false;  // working set fits in the last-level cache
};

// What the header says about the run.
struct RunInfo {
  std::string collective;
  std::string version;
  std::string host;
  int nranks = 1;
  int nodes = 1;
  int local_ranks = 1;
  int cores = 1;
  std::size_t min_bytes = 0, max_bytes = 0, step_factor = 0, step_bytes = 0;
  int iters = 0, warmup = 0;
  bool check = false;
  std::string dtypes, ops, algorithm;
  int root = 0;
  double copy_bw_1 = 0;       // bytes/s, one copier
  double copy_bw_n = 0;       // bytes/s, copiers_n concurrent copiers
  double copy_bw_n_memcpy = 0;    // of which memcpy's
  double copy_bw_n_streamed = 0;  // and the streamed copy's (copy_bw_n is the faster)
  int copiers_n = 1;
  std::size_t copy_bytes = 0; // per copier, single-copier run
  std::size_t llc_bytes = 0;  // last-level cache size (0 if unknown)
  bool mpi = true;
  BufferKind buffers = BufferKind::heap;  // -R
  std::size_t offset = 0;     // --offset: bytes past a 64-byte boundary
  bool touch = false;         // --touch: buffers touched between calls, each call timed alone
  bool per_call = false;      // --per-call: p50 and p99 columns
  bool copy_measured = true;  // false with --no-roofline: the copy_bw fields are 0
  bool roof = false;          // roofline column printed (one host)
  std::string roof_traffic;   // the least memory traffic, as the header prints it: "2*n*size"
};

// The nearest-rank percentile `pct` (0-100] of `sorted` (ascending): the
// smallest value that at least pct% of the values do not exceed; -1 if
// there are none.
double percentile(const std::vector<double>& sorted, double pct);

void print_header(std::FILE* f, const RunInfo& info);
void print_table_header(std::FILE* f, const RunInfo& info, const std::string& algorithm);
void print_row(std::FILE* f, const RunInfo& info, const Row& r);
// Averages over the rows given (nccl-tests averages busbw over every
// out-of-place and in-place measurement).
void print_table_footer(std::FILE* f, const RunInfo& info, const std::vector<Row>& rows);
// -A all: per (type, op, size), the fastest algorithm against the tuner's.
void print_summary(std::FILE* f, const std::vector<Row>& rows);

bool write_json(const std::string& path, const RunInfo& info, const std::vector<Row>& rows, std::string* error);
bool write_csv(const std::string& path, const std::vector<Row>& rows, std::string* error);

}  // namespace cclz::perf
