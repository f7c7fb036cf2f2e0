// cclz-perf output. The first columns are nccl-tests' (size, count, type,
// redop, root, then time/algbw/busbw/#wrong for out-of-place and in-place)
// so their readers need no key; cclz's columns follow on the right.
#include "report.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

namespace cclz::perf {
namespace {

constexpr double kGB = 1e9;

// One of m's times in microseconds (a negative one was not measured).
std::string fmt_us(const Measure& m, double us) {
  if (!m.valid || us < 0) return "n/a";
  char b[32];
  std::snprintf(b, sizeof b, us < 1e6 ? "%.2f" : "%.0f", us);
  return b;
}
std::string fmt_bw(const Measure& m, double v) {
  if (!m.valid) return "n/a";
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", v);
  return b;
}
std::string fmt_wrong(const Measure& m) {
  if (!m.valid || m.wrong < 0) return "N/A";
  return std::to_string(m.wrong);
}

// `s` centred in `width` columns (for the group labels above the columns).
std::string centre(const std::string& s, std::size_t width) {
  if (s.size() >= width) return s;
  const std::size_t left = (width - s.size()) / 2;
  return std::string(left, ' ') + s + std::string(width - s.size() - left, ' ');
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o.push_back('\\');
    o.push_back(c);
  }
  return o;
}

std::string num(double v) {
  if (!std::isfinite(v)) return "null";
  char b[64];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

// A figure that may be unmeasured (negative): null in JSON, empty in CSV.
std::string opt_num(double v, const char* none = "null") { return v < 0 ? none : num(v); }

void json_measure(std::FILE* f, const char* name, const Measure& m) {
  if (!m.valid) {
    std::fprintf(f, "\"%s\": null", name);
    return;
  }
  std::fprintf(f, "\"%s\": {\"time_us\": %s, \"algbw_gbs\": %s, \"busbw_gbs\": %s, \"wrong\": %lld, ", name,
               num(m.time_us).c_str(), num(m.algbw).c_str(), num(m.busbw).c_str(), m.wrong);
  std::fprintf(f, "\"p50_us\": %s, \"p99_us\": %s}", opt_num(m.p50_us).c_str(), opt_num(m.p99_us).c_str());
}

}  // namespace

double percentile(const std::vector<double>& sorted, double pct) {
  if (sorted.empty()) return -1;
  const auto n = static_cast<double>(sorted.size());
  const auto rank = static_cast<std::size_t>(std::ceil(pct * n / 100.0));
  return sorted[std::clamp<std::size_t>(rank, 1, sorted.size()) - 1];
}

void print_header(std::FILE* f, const RunInfo& i) {
  std::fprintf(f, "# cclz-perf %s: %s\n", i.version.c_str(), i.collective.c_str());
  std::fprintf(f, "# nRanks %d nNodes %d localRanks %d cores %d minBytes %zu maxBytes %zu step: ", i.nranks, i.nodes,
               i.local_ranks, i.cores, i.min_bytes, i.max_bytes);
  if (i.step_bytes != 0) {
    std::fprintf(f, "%zu(bytes)", i.step_bytes);
  } else {
    std::fprintf(f, "%zu(factor)", i.step_factor);
  }
  std::fprintf(f, " warmup iters: %d iters: %d validation: %d\n", i.warmup, i.iters, i.check ? 1 : 0);
  std::fprintf(f, "# dtype %s  op %s  root %d  algorithm %s  baseline %s\n", i.dtypes.c_str(), i.ops.c_str(),
               i.root, i.algorithm.c_str(), i.mpi ? "MPI (same run)" : "none");
  std::fprintf(f, "# host %s  buffers %s, %zu bytes past a 64-byte boundary\n", i.host.c_str(),
               i.buffers == BufferKind::mem_alloc   ? "cclz::mem_alloc (-R 1: node-local peers read them in place)"
               : i.buffers == BufferKind::heap ? "heap (-R 0)"
                                               : "heap, cclz::register_buffer (-R 2: node-local peers read them in place)",
               i.offset);
  if (i.copy_measured) {
    std::fprintf(f, "# copy bandwidth (bytes read + written, the faster of memcpy and a streamed copy, best of 3 each, "
                 "%zu MB per copier): 1 copier %.2f GB/s, %d concurrent %.2f GB/s (memcpy %.2f, streamed %.2f)\n",
                 i.copy_bytes >> 20, i.copy_bw_1 / kGB, i.copiers_n, i.copy_bw_n / kGB, i.copy_bw_n_memcpy / kGB,
                 i.copy_bw_n_streamed / kGB);
  } else {
    std::fprintf(f, "# copy bandwidth not measured (--no-roofline)\n");
  }
  if (i.touch) {
    std::fprintf(f, "# time = per-call average on each rank, max over ranks; GB = 1e9 bytes; --touch: before each "
                 "call every rank wrote its input's cache lines and read its output's, then a barrier (untimed)\n");
  } else {
    std::fprintf(f, "# time = per-iteration average on each rank, max over ranks; GB = 1e9 bytes\n");
  }
  if (i.per_call) {
    std::fprintf(f, "# --per-call: p50, p99 = median and 99th percentile (nearest rank) over the timed calls of the "
                 "slowest rank's time per call (each rank's call from the end of the one before); out-of-place, "
                 "then MPI's\n");
  }
  if (i.roof) {
    std::fprintf(f, "# %%roof = busbw(out-of-place) / roofline busbw; roofline time = %s / (%d-copier "
                 "bandwidth): the least memory traffic of the call (docs/performance.md)\n",
                 i.roof_traffic.c_str(), i.copiers_n);
    std::fprintf(f, "# %%roof marked * : the traffic %s fits in the last-level cache (%zu MB), where "
                 "the memory roofline does not bind\n",
                 i.roof_traffic.c_str(), i.llc_bytes >> 20);
  }
  std::fprintf(f, "#\n");
}

void print_table_header(std::FILE* f, const RunInfo& i, const std::string& algorithm) {
  std::fprintf(f, "# Algorithm: %s\n", algorithm.c_str());
  // Widths follow print_row: 49 columns of row key, 38 per timed group,
  // 16 for algo, 30 for the MPI group.
  std::fprintf(f, "#%48s  %s  %s  %14s", "", centre("out-of-place", 38).c_str(), centre("in-place", 38).c_str(), "");
  if (i.mpi) std::fprintf(f, "  %s", centre("MPI baseline", 30).c_str());
  if (i.per_call) {
    if (i.roof) std::fprintf(f, "  %7s", "");
    std::fprintf(f, "  %s", centre("per call", 22).c_str());
    if (i.mpi) std::fprintf(f, "  %s", centre("MPI per call", 22).c_str());
  }
  std::fprintf(f, "\n");
  std::fprintf(f, "#%11s  %12s  %6s  %6s  %5s  %10s  %8s  %8s  %6s  %10s  %8s  %8s  %6s  %14s", "size", "count",
               "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong",
               "algo");
  if (i.mpi) std::fprintf(f, "  %10s  %8s  %8s", "time", "busbw", "cclz/mpi");
  if (i.roof) std::fprintf(f, "  %7s", "%roof");
  if (i.per_call) {
    for (int k = 0; k < (i.mpi ? 2 : 1); ++k) std::fprintf(f, "  %10s  %10s", "p50", "p99");
  }
  std::fprintf(f, "\n");
  std::fprintf(f, "#%11s  %12s  %6s  %6s  %5s  %10s  %8s  %8s  %6s  %10s  %8s  %8s  %6s  %14s", "(B)",
               "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", "");
  if (i.mpi) std::fprintf(f, "  %10s  %8s  %8s", "(us)", "(GB/s)", "busbw");
  if (i.roof) std::fprintf(f, "  %7s", "");
  if (i.per_call) {
    for (int k = 0; k < (i.mpi ? 4 : 2); ++k) std::fprintf(f, "  %10s", "(us)");
  }
  std::fprintf(f, "\n");
  std::fflush(f);
}

void print_row(std::FILE* f, const RunInfo& i, const Row& r) {
  std::fprintf(f, "%12zu  %12zu  %6s  %6s  %5d", r.bytes, r.count, dtype_name(r.dt), r.has_op ? op_name(r.op) : "none",
               r.root);
  if (!r.supported) {
    std::fprintf(f, "  %-74s  %14s\n", "  (algorithm does not support this call; skipped)", r.algo.c_str());
    std::fflush(f);
    return;
  }
  for (const Measure* m : {&r.oop, &r.ip}) {
    std::fprintf(f, "  %10s  %8s  %8s  %6s", fmt_us(*m, m->time_us).c_str(), fmt_bw(*m, m->algbw).c_str(),
                 fmt_bw(*m, m->busbw).c_str(), fmt_wrong(*m).c_str());
  }
  std::fprintf(f, "  %14s", r.algo.c_str());
  if (i.mpi) {
    std::string ratio = "n/a";
    if (r.mpi.valid && r.oop.valid && r.mpi.busbw > 0) {
      char b[32];
      std::snprintf(b, sizeof b, "%.2f", r.oop.busbw / r.mpi.busbw);
      ratio = b;
    }
    std::fprintf(f, "  %10s  %8s  %8s", fmt_us(r.mpi, r.mpi.time_us).c_str(), fmt_bw(r.mpi, r.mpi.busbw).c_str(),
                 ratio.c_str());
  }
  if (i.roof) {
    if (r.has_roof && r.oop.valid && r.roof_busbw > 0) {
      std::fprintf(f, "  %5.1f%%%s", 100.0 * r.oop.busbw / r.roof_busbw, r.roof_cached ? "*" : " ");
    } else {
      std::fprintf(f, "  %7s", "n/a");
    }
  }
  if (i.per_call) {
    auto per_call = [&](const Measure& m) {
      std::fprintf(f, "  %10s  %10s", fmt_us(m, m.p50_us).c_str(), fmt_us(m, m.p99_us).c_str());
    };
    per_call(r.oop);
    if (i.mpi) per_call(r.mpi);
  }
  std::fprintf(f, "\n");
  std::fflush(f);
}

void print_table_footer(std::FILE* f, const RunInfo& i, const std::vector<Row>& rows) {
  double sum = 0, mpi_sum = 0;
  int n = 0, mpi_n = 0;
  long long wrong = 0;
  for (const Row& r : rows) {
    for (const Measure* m : {&r.oop, &r.ip}) {
      if (!m->valid) continue;
      sum += m->busbw;
      ++n;
      if (m->wrong > 0) wrong += m->wrong;
    }
    if (r.mpi.valid) {
      mpi_sum += r.mpi.busbw;
      ++mpi_n;
    }
  }
  std::fprintf(f, "# Out of bounds values : %lld %s\n", wrong, wrong == 0 ? "OK" : "FAILED");
  std::fprintf(f, "# Avg bus bandwidth    : %.4g\n", n > 0 ? sum / n : 0.0);
  if (i.mpi) std::fprintf(f, "# Avg bus bandwidth (MPI) : %.4g\n", mpi_n > 0 ? mpi_sum / mpi_n : 0.0);
  std::fprintf(f, "#\n");
  std::fflush(f);
}

void print_summary(std::FILE* f, const std::vector<Row>& rows) {
  // Key: type, op, size. Value: the rows of every algorithm, in table order.
  using Key = std::tuple<int, int, std::size_t>;
  std::map<Key, std::vector<const Row*>> by_size;
  std::vector<Key> order;
  for (const Row& r : rows) {
    Key k{static_cast<int>(r.dt), r.has_op ? static_cast<int>(r.op) : -1, r.bytes};
    auto [it, fresh] = by_size.try_emplace(k);
    if (fresh) order.push_back(k);
    it->second.push_back(&r);
  }
  std::fprintf(f, "# Fastest algorithm per size (out-of-place time) against the tuner's default\n");
  std::fprintf(f, "#%11s  %6s  %6s  %14s  %10s  %14s  %10s  %10s\n", "size", "type", "redop", "tuner", "time(us)",
               "fastest", "time(us)", "tuner/best");
  for (const Key& k : order) {
    const std::vector<const Row*>& rs = by_size[k];
    const Row* best = nullptr;
    const Row* tuned = nullptr;
    for (const Row* r : rs) {
      if (!r->supported || !r->oop.valid) continue;
      if (best == nullptr || r->oop.time_us < best->oop.time_us) best = r;
      if (r->algo == r->tuned) tuned = r;
    }
    const Row& any = *rs.front();
    std::fprintf(f, "%12zu  %6s  %6s  %14s", any.bytes, dtype_name(any.dt), any.has_op ? op_name(any.op) : "none",
                 any.tuned.empty() ? "-" : any.tuned.c_str());
    if (tuned != nullptr) {
      std::fprintf(f, "  %10.2f", tuned->oop.time_us);
    } else {
      std::fprintf(f, "  %10s", "n/a");
    }
    if (best != nullptr) {
      std::fprintf(f, "  %14s  %10.2f", best->algo.c_str(), best->oop.time_us);
    } else {
      std::fprintf(f, "  %14s  %10s", "-", "n/a");
    }
    if (best != nullptr && tuned != nullptr && best->oop.time_us > 0) {
      std::fprintf(f, "  %10.2f\n", tuned->oop.time_us / best->oop.time_us);
    } else {
      std::fprintf(f, "  %10s\n", "n/a");
    }
  }
  std::fprintf(f, "#\n");
  std::fflush(f);
}

bool write_json(const std::string& path, const RunInfo& i, const std::vector<Row>& rows, std::string* error) {
  // Copy bandwidths in GB/s; null where --no-roofline left them unmeasured.
  auto copy_num = [&](double bytes_per_s) { return i.copy_measured ? num(bytes_per_s / kGB) : std::string("null"); };
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    *error = "cannot open " + path + " for writing";
    return false;
  }
  std::fprintf(f, "{\n  \"tool\": \"cclz-perf\", \"version\": \"%s\", \"collective\": \"%s\",\n",
               json_escape(i.version).c_str(), i.collective.c_str());
  std::fprintf(f, "  \"ranks\": %d, \"nodes\": %d, \"local_ranks\": %d, \"cores\": %d, \"host\": \"%s\",\n", i.nranks,
               i.nodes, i.local_ranks, i.cores, json_escape(i.host).c_str());
  std::fprintf(f, "  \"iters\": %d, \"warmup\": %d, \"check\": %s, \"touch\": %s, \"per_call\": %s,\n", i.iters,
               i.warmup, i.check ? "true" : "false", i.touch ? "true" : "false", i.per_call ? "true" : "false");
  std::fprintf(f,
               "  \"copy_bw_1_gbs\": %s, \"copy_bw_n_gbs\": %s, \"copy_bw_n_memcpy_gbs\": %s, "
               "\"copy_bw_n_streamed_gbs\": %s, \"copiers_n\": %d, \"llc_bytes\": %zu,\n",
               copy_num(i.copy_bw_1).c_str(), copy_num(i.copy_bw_n).c_str(), copy_num(i.copy_bw_n_memcpy).c_str(),
               copy_num(i.copy_bw_n_streamed).c_str(), i.copiers_n, i.llc_bytes);
  std::fprintf(f, "  \"time\": \"per-iteration average per rank, max over ranks\",\n  \"rows\": [\n");
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const Row& r = rows[k];
    std::fprintf(f, "    {\"requested\": \"%s\", \"algo\": \"%s\", \"tuned\": \"%s\", \"supported\": %s, ",
                 json_escape(r.requested.empty() ? "tuner" : r.requested).c_str(), json_escape(r.algo).c_str(),
                 json_escape(r.tuned).c_str(), r.supported ? "true" : "false");
    std::fprintf(f, "\"bytes\": %zu, \"count\": %zu, \"type\": \"%s\", \"redop\": \"%s\", \"root\": %d, ", r.bytes,
                 r.count, dtype_name(r.dt), r.has_op ? op_name(r.op) : "none", r.root);
    json_measure(f, "out_of_place", r.oop);
    std::fprintf(f, ", ");
    json_measure(f, "in_place", r.ip);
    std::fprintf(f, ", ");
    json_measure(f, "mpi", r.mpi);
    std::fprintf(f, ", \"roof_busbw_gbs\": %s, \"roof_cached\": %s}%s\n",
                 r.has_roof ? num(r.roof_busbw).c_str() : "null", r.roof_cached ? "true" : "false",
                 k + 1 < rows.size() ? "," : "");
  }
  std::fprintf(f, "  ]\n}\n");
  const bool ok = std::fclose(f) == 0;
  if (!ok) *error = "error writing " + path;
  return ok;
}

bool write_csv(const std::string& path, const std::vector<Row>& rows, std::string* error) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    *error = "cannot open " + path + " for writing";
    return false;
  }
  std::fprintf(f, "collective,requested,algo,tuned,supported,bytes,count,type,redop,root,"
               "oop_time_us,oop_algbw_gbs,oop_busbw_gbs,oop_wrong,ip_time_us,ip_algbw_gbs,ip_busbw_gbs,ip_wrong,"
               "mpi_time_us,mpi_busbw_gbs,roof_busbw_gbs,roof_cached,"
               "oop_p50_us,oop_p99_us,ip_p50_us,ip_p99_us,mpi_p50_us,mpi_p99_us\n");
  auto m3 = [&](const Measure& m) {
    if (!m.valid) {
      std::fprintf(f, ",,,,");
      return;
    }
    std::fprintf(f, ",%s,%s,%s,", num(m.time_us).c_str(), num(m.algbw).c_str(), num(m.busbw).c_str());
    if (m.wrong >= 0) std::fprintf(f, "%lld", m.wrong);
  };
  for (const Row& r : rows) {
    std::fprintf(f, "%s,%s,%s,%s,%d,%zu,%zu,%s,%s,%d", r.collective.c_str(),
                 r.requested.empty() ? "tuner" : r.requested.c_str(), r.algo.c_str(), r.tuned.c_str(),
                 r.supported ? 1 : 0, r.bytes, r.count, dtype_name(r.dt), r.has_op ? op_name(r.op) : "none", r.root);
    m3(r.oop);
    m3(r.ip);
    if (r.mpi.valid) {
      std::fprintf(f, ",%s,%s", num(r.mpi.time_us).c_str(), num(r.mpi.busbw).c_str());
    } else {
      std::fprintf(f, ",,");
    }
    std::fprintf(f, ",%s,%s", r.has_roof ? num(r.roof_busbw).c_str() : "", r.has_roof && r.roof_cached ? "1" : "0");
    for (const Measure* m : {&r.oop, &r.ip, &r.mpi}) {
      std::fprintf(f, ",%s,%s", opt_num(m->p50_us, "").c_str(), opt_num(m->p99_us, "").c_str());
    }
    std::fprintf(f, "\n");
  }
  const bool ok = std::fclose(f) == 0;
  if (!ok) *error = "error writing " + path;
  return ok;
}

}  // namespace cclz::perf
