// cclz-perf command-line parsing. Spellings follow nccl-tests so that users'
// scripts carry over; -A picks cclz's algorithm because nccl-tests already
// uses -a (averaging mode across ranks).
#include "options.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <iterator>
#include <string_view>

namespace cclz::perf {
namespace {

bool parse_int(const std::string& s, long lo, long hi, int* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *out = static_cast<int>(v);
  return true;
}

// -d and -o: "all", or one name or several, comma-separated, each once
// (tables come out in the order given). `parse` reads one name.
template <class T, class Parse, std::size_t N>
bool parse_list(const std::string& v, const char* what, Parse parse, const T (&all)[N], std::vector<T>* out,
                std::string* error) {
  out->clear();
  if (v == "all") {
    out->assign(std::begin(all), std::end(all));
    return true;
  }
  for (std::size_t at = 0;;) {
    const std::size_t comma = v.find(',', at);
    const std::string name = v.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    T t{};
    if (name.empty()) return *error = std::string("empty name in the ") + what + " list: '" + v + "'", false;
    if (!parse(name, &t)) return *error = std::string("unknown ") + what + ": " + name, false;
    if (std::find(out->begin(), out->end(), t) != out->end()) {
      return *error = std::string(what) + " " + name + " given twice in '" + v + "'", false;
    }
    out->push_back(t);
    if (comma == std::string::npos) return true;
    at = comma + 1;
  }
}

}  // namespace

bool parse_bytes(const std::string& s, std::size_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (errno != 0 || end == s.c_str()) return false;
  std::string_view suffix(end);
  unsigned long long mult = 1;
  if (suffix == "" || suffix == "B" || suffix == "b") {
    mult = 1;
  } else if (suffix == "K" || suffix == "k" || suffix == "KB" || suffix == "KiB") {
    mult = 1ull << 10;
  } else if (suffix == "M" || suffix == "m" || suffix == "MB" || suffix == "MiB") {
    mult = 1ull << 20;
  } else if (suffix == "G" || suffix == "g" || suffix == "GB" || suffix == "GiB") {
    mult = 1ull << 30;
  } else {
    return false;
  }
  *out = static_cast<std::size_t>(v * mult);
  return true;
}

std::string usage(const char* argv0) {
  std::string u = "usage: mpiexec -n N ";
  u += argv0;
  u += R"( <collective> [options]

Collectives: all_reduce, reduce_scatter, all_gather, all_to_all, all_to_allv,
broadcast, reduce (nccl-tests spellings such as allreduce, reducescatter,
allgather, alltoall, bcast are accepted too).

Options (as nccl-tests unless marked cclz):
  -b, --minbytes SIZE     smallest size (default 4K); K, M, G suffixes
  -e, --maxbytes SIZE     largest size (default 64M)
  -f, --stepfactor F      multiply the size by F each step (default 4)
  -i, --stepbytes SIZE    add SIZE each step instead of multiplying
  -n, --iters N           timed iterations per size (default 20)
  -w, --warmup_iters N    untimed iterations before timing (default 5)
  -c, --check 0|1         fill exact inputs and count wrong outputs (default 1)
  -d, --datatype T|all    f32 f64 f16 bf16 i8 u8 i32 i64 (or float, half,
                          bfloat16, int8, ...); all = every type (default f32);
                          cclz: a comma-separated list, e.g. f32,bf16,f16
  -o, --op OP|all         sum prod max min avg; all = every op (default sum);
                          cclz: a comma-separated list too. With several
                          types or ops, each size is measured for all of
                          them before the next size (nccl-tests sweeps each
                          type's sizes in turn)
  -r, --root R            root of broadcast and reduce (default 0)
  -A, --algorithm NAME    cclz: force an algorithm (e.g. ring); "all" runs every
                          registered algorithm for the collective (all of them
                          at one size before the next size), then prints one
                          table each and a per-size summary of the fastest
                          against the tuner's default. Default: the tuner's
                          choice.
                          (nccl-tests' -a is averaging mode, hence -A.)
  -R, --register 0|1|2    1: buffers from cclz::mem_alloc, which the ranks of
                          a node read from one another in place (large calls
                          then copy each byte once); 2: heap buffers made so
                          by cclz::register_buffer; MPI gets the same
                          buffers (default 0: plain heap memory)
      --offset B          cclz: buffers start B bytes past a 64-byte boundary
                          (0-56, a multiple of 8; default 0). malloc's large
                          blocks sit 16 bytes past a page.
      --touch             cclz: before each timed call, every rank writes each
                          cache line of its input and reads each line of its
                          output (as a training step's compute does between
                          collectives); each call is then timed alone after a
                          barrier, touch and barrier untimed. Default: calls
                          back to back, as nccl-tests times them, on buffers
                          the previous call left in the caches.
      --per-call          cclz: also time each call on its own and print the
                          median (p50) and 99th percentile (p99) of the
                          slowest rank's time per call, for cclz out of
                          place and for MPI (--json and --csv: in place
                          too); with fewer than 100 calls p99 is the
                          slowest call
      --json FILE         cclz: also write every row as JSON (rank 0)
      --csv FILE          cclz: also write every row as CSV (rank 0)
      --no-mpi            cclz: skip the MPI baseline columns
      --no-roofline       cclz: skip the copy-bandwidth measurement at start
                          (a few seconds) and the %roof column
      --compressor SPEC   cclz: all_reduce only; instead of the table above,
                          time the compressed all-reduce of SPEC (e.g.
                          ef+topk:ratio=0.01, powersgd:rank=4, auto:int8)
                          beside the dense one: effective bandwidth (dense
                          bytes / time), compression and wire ratios, error.
                          Repeatable.
      --requant sra|ring  cclz: scheme for re-quantizable compressors
                          (default sra: scatter-reduce-allgather)
  -h, --help              this text

Columns: time is the per-iteration average on each rank, then the maximum
over ranks (the slowest rank bounds the collective). algbw = size / time,
busbw = algbw * factor (all_reduce 2(n-1)/n; reduce_scatter, all_gather,
all_to_all (n-1)/n; broadcast, reduce 1), GB = 1e9 bytes. "algo" is the
algorithm that ran, "mpi" the matching MPI call measured in the same run,
"%roof" (one host) busbw as a share of the memory-copy roofline: the call's
least memory traffic (all_reduce, all_to_all 2*n*size; the others
(n+1)*size) at the copy bandwidth of the run (docs/performance.md). Exits
non-zero if any element was wrong.
)";
  return u;
}

bool parse_options(int argc, char** argv, Options* out, std::string* error) {
  Options o;
  bool have_coll = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    // Options that take a value accept "-b 4K", "--minbytes 4K" and "--minbytes=4K".
    std::string name = a;
    std::string value;
    bool inline_value = false;
    if (a.rfind("--", 0) == 0) {
      if (auto eq = a.find('='); eq != std::string::npos) {
        name = a.substr(0, eq);
        value = a.substr(eq + 1);
        inline_value = true;
      }
    }
    auto take = [&](std::string* v) {
      if (inline_value) {
        *v = value;
        return true;
      }
      if (i + 1 >= argc) {
        *error = "option " + name + " needs a value";
        return false;
      }
      *v = argv[++i];
      return true;
    };
    std::string v;
    if (name == "-h" || name == "--help") {
      o.help = true;
    } else if (name == "--no-mpi") {
      o.mpi_baseline = false;
    } else if (name == "--no-roofline") {
      o.roofline = false;
    } else if (name == "--touch") {
      o.touch = true;
    } else if (name == "--per-call") {
      o.per_call = true;
    } else if (name == "-b" || name == "--minbytes") {
      if (!take(&v)) return false;
      if (!parse_bytes(v, &o.min_bytes)) return *error = "bad size for -b: " + v, false;
    } else if (name == "-e" || name == "--maxbytes") {
      if (!take(&v)) return false;
      if (!parse_bytes(v, &o.max_bytes)) return *error = "bad size for -e: " + v, false;
    } else if (name == "-f" || name == "--stepfactor") {
      if (!take(&v)) return false;
      int f = 0;
      if (!parse_int(v, 2, 1 << 20, &f)) return *error = "bad step factor (want >= 2): " + v, false;
      o.step_factor = static_cast<std::size_t>(f);
      o.step_bytes = 0;
    } else if (name == "-i" || name == "--stepbytes") {
      if (!take(&v)) return false;
      if (!parse_bytes(v, &o.step_bytes) || o.step_bytes == 0) return *error = "bad step for -i: " + v, false;
    } else if (name == "-n" || name == "--iters") {
      if (!take(&v)) return false;
      if (!parse_int(v, 1, 1 << 30, &o.iters)) return *error = "bad iteration count: " + v, false;
    } else if (name == "-w" || name == "--warmup_iters") {
      if (!take(&v)) return false;
      if (!parse_int(v, 0, 1 << 30, &o.warmup)) return *error = "bad warm-up count: " + v, false;
    } else if (name == "-R" || name == "--register") {
      if (!take(&v)) return false;
      int r = 0;
      if (!parse_int(v, 0, 2, &r)) return *error = "bad value for -R (0, 1 or 2): " + v, false;
      o.buffers = static_cast<BufferKind>(r);
    } else if (name == "--offset") {
      if (!take(&v)) return false;
      int b = 0;
      if (!parse_int(v, 0, 56, &b) || b % 8 != 0) return *error = "bad --offset (0-56, a multiple of 8): " + v, false;
      o.offset = static_cast<std::size_t>(b);
    } else if (name == "-c" || name == "--check") {
      if (!take(&v)) return false;
      int c = 0;
      if (!parse_int(v, 0, 1 << 30, &c)) return *error = "bad -c value: " + v, false;
      o.check = c != 0;
    } else if (name == "-d" || name == "--datatype") {
      if (!take(&v)) return false;
      if (!parse_list(v, "data type", parse_dtype, kAllDataTypes, &o.dtypes, error)) return false;
    } else if (name == "-o" || name == "--op") {
      if (!take(&v)) return false;
      if (!parse_list(v, "reduction op", parse_op, kAllReduceOps, &o.ops, error)) return false;
    } else if (name == "-r" || name == "--root") {
      if (!take(&v)) return false;
      if (!parse_int(v, 0, 1 << 30, &o.root)) return *error = "bad root: " + v, false;
    } else if (name == "-A" || name == "--algorithm") {
      if (!take(&v)) return false;
      o.algorithm = v;
    } else if (name == "--compressor") {
      if (!take(&v)) return false;
      o.compressors.push_back(v);
    } else if (name == "--requant") {
      if (!take(&v)) return false;
      if (!parse_requant_scheme(v, &o.requant)) return *error = "bad --requant (sra or ring): " + v, false;
    } else if (name == "--json") {
      if (!take(&o.json_path)) return false;
    } else if (name == "--csv") {
      if (!take(&o.csv_path)) return false;
    } else if (!a.empty() && a[0] == '-') {
      *error = "unknown option: " + a;
      return false;
    } else if (!have_coll) {
      auto k = testing::parse_coll(a);
      if (!k) return *error = "unknown collective: " + a, false;
      o.kind = *k;
      have_coll = true;
    } else {
      *error = "unexpected argument: " + a;
      return false;
    }
  }
  if (!o.help && !have_coll) return *error = "missing collective (e.g. all_reduce)", false;
  if (o.min_bytes > o.max_bytes) return *error = "-b is larger than -e", false;
  if (!o.compressors.empty() && o.kind != testing::CollKind::all_reduce) {
    return *error = "--compressor times the compressed all_reduce only", false;
  }
  if (!o.compressors.empty() && o.per_call) {
    return *error = "--per-call times the tables' calls, which --compressor replaces", false;
  }
  *out = std::move(o);
  return true;
}

std::vector<std::size_t> sweep_sizes(const Options& o) {
  std::vector<std::size_t> sizes;
  for (std::size_t s = o.min_bytes; s <= o.max_bytes;) {
    sizes.push_back(s);
    const std::size_t next = o.step_bytes != 0 ? s + o.step_bytes : s * o.step_factor;
    if (next <= s) break;  // 0-byte start with a factor, or overflow
    s = next;
  }
  if (sizes.empty()) sizes.push_back(o.min_bytes);
  return sizes;
}

std::vector<Point> sweep_points(const Options& o) {
  const bool reduces = testing::coll_info(o.kind).reduces;
  const std::vector<ReduceOp> sum_only{ReduceOp::sum};
  std::vector<Point> points;
  for (std::size_t bytes : sweep_sizes(o)) {
    for (DataType dt : o.dtypes) {
      for (ReduceOp op : reduces ? o.ops : sum_only) points.push_back({dt, op, bytes});
    }
  }
  return points;
}

}  // namespace cclz::perf
