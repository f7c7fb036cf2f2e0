// The auto:<spec> break-even rule of the compressed collectives
// (compressed.hpp): compress one call's tensor only where
//   compute + wire_compressed * s  <  wire_dense * s
// with s the link's seconds per byte.
//
// compute: two steps of the round protocol run on a fresh state of the
// tensor's TensorDesc, as one rank (each round's aggregate is the rank's own
// payload), on synthetic data (a fixed uniform draw in [-1, 1)); the second
// step is timed: encode (begin), the middle rounds (next), decode (finish).
// Measured once per process per (spec, TensorDesc) under a lock, so ranks
// that are threads of one process measure once and not concurrently. For n
// ranks it is scaled by the aggregation kind of each round (D = the finish
// time, a decode of one payload; E = the encode time):
//   summable                  E + D
//   gather-only               E + n D            (every payload decoded)
//   re-quantizable, SRA       E + E/n + 2 D      (owner: n chunks of 1/n decoded, one encoded; finish)
//   re-quantizable, ring      E + (n-1)/n (E + 2 D) + D
// wire_*: the wire counts of compressed.hpp for the measured payload sizes.
//
// s: 8 / (link_gbit * 1e9) from the options, else CCLZ_LINK_GBIT, else
// measured: a dense all-reduce of 4 MiB of f32, one warm-up and three timed
// runs, s = the fastest run / its wire count; once per process and
// communicator shape (size, number of nodes).
//
// Agreement: every auto call all-reduces (max) five doubles: [any rank needs
// the link measured, s, compute, wire_compressed, wire_dense]; when the first
// is set all ranks measure the link and all-reduce s (max) once more. Every
// rank then decides from the same numbers.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include "comm_impl.hpp"
#include "compressors/common.hpp"
#include "compressors/compressed_internal.hpp"
#include "log.hpp"

namespace cclz::compress::cc {

namespace {

using Seconds = std::chrono::duration<double>;
using SteadyClock = std::chrono::steady_clock;

struct Measure {
  double encode_s = 0, middle_s = 0, finish_s = 0;
  std::vector<std::pair<Aggregation, std::uint64_t>> rounds;  // kind and payload bytes of each round
};

// The measurement registry: process-wide, guarded by its mutex.
struct Registry {
  std::mutex mu;
  std::map<std::string, Measure> measures;   // key: spec and TensorDesc
  std::map<std::pair<int, int>, double> link;  // (size, nodes) -> seconds per byte
  std::set<std::string> logged;               // (rank, tensor, decision) lines already printed
};

Registry& registry() {
  static Registry r;
  return r;
}

double since(SteadyClock::time_point t0) { return Seconds(SteadyClock::now() - t0).count(); }

Status measure(const Compressor& c, const TensorDesc& desc, Measure* m) {
  std::unique_ptr<CompressorState> st;
  if (Status s = c.make_state(desc, &st); !s.ok()) return s;
  std::vector<float> x(desc.count);
  Rng rng(0x5eed);
  for (float& v : x) v = static_cast<float>(static_cast<double>(rng.next() >> 11) * 0x1p-52 - 1.0);
  std::vector<std::byte> grad(desc.dense_bytes()), out(desc.dense_bytes());
  store_f32(x, desc.dtype, grad);
  Payload p;
  std::vector<std::byte> agg_bytes;
  for (int step = 0; step < 2; ++step) {
    const bool timed = step == 1;
    Measure cur;
    auto t0 = SteadyClock::now();
    if (Status s = c.begin(*st, grad, &p); !s.ok()) return s;
    cur.encode_s = since(t0);
    for (;;) {
      cur.rounds.emplace_back(p.aggregation, p.bytes.size());
      agg_bytes = p.bytes;  // next() writes p
      const std::span<const std::byte> one(agg_bytes);
      const Aggregate agg(&one, 1);
      t0 = SteadyClock::now();
      if (p.last) {
        if (Status s = c.finish(*st, agg, out); !s.ok()) return s;
        cur.finish_s = since(t0);
        break;
      }
      if (Status s = c.next(*st, agg, &p); !s.ok()) return s;
      cur.middle_s += since(t0);
    }
    if (timed) *m = cur;
  }
  return {};
}

Status measured(const Compressor& c, const TensorDesc& desc, Measure* out) {
  const std::string key = c.spec().text + "|" + std::to_string(desc.count) + "|" +
                          std::to_string(static_cast<int>(desc.dtype)) + "|" + std::to_string(desc.rows) + "x" +
                          std::to_string(desc.cols);
  Registry& reg = registry();
  std::lock_guard lk(reg.mu);
  if (auto it = reg.measures.find(key); it != reg.measures.end()) {
    *out = it->second;
    return {};
  }
  Measure m;
  if (Status s = measure(c, desc, &m); !s.ok()) return s;
  reg.measures.emplace(key, m);
  *out = m;
  return {};
}

// CCLZ_LINK_GBIT: 0 when unset; an error when malformed.
Status link_from_env(double* gbit) {
  *gbit = 0;
  const char* v = std::getenv("CCLZ_LINK_GBIT");
  if (v == nullptr || *v == '\0') return {};
  char* end = nullptr;
  const double d = std::strtod(v, &end);
  if (end == v || *end != '\0' || !(d > 0) || !std::isfinite(d)) {
    return {Result::invalid_argument, std::string("CCLZ_LINK_GBIT='") + v + "' is not a bandwidth in Gbit/s (> 0)"};
  }
  *gbit = d;
  return {};
}

Status measure_link(Call& k, double* spb) {
  constexpr std::size_t kCount = std::size_t{1} << 20;  // 4 MiB of f32
  std::vector<float> a(kCount, 1.0f), b(kCount);
  double best = 0;
  for (int i = 0; i < 4; ++i) {
    const auto t0 = SteadyClock::now();
    if (Status s = k.fail(k.comm.all_reduce(a.data(), b.data(), kCount, DataType::f32, ReduceOp::sum).wait());
        !s.ok()) {
      return s;
    }
    const double t = since(t0);
    if (i == 1 || (i > 1 && t < best)) best = t;
  }
  *spb = best / static_cast<double>(all_reduce_wire(kCount * 4, k.size));
  return {};
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace

Status auto_choose(Call& k, Coll coll, const TensorDesc& desc, const CompressedOptions& opt, AutoChoice* out) {
  const int n = k.size;
  const auto dn = static_cast<double>(n);
  Measure m;
  if (Status s = measured(k.c, desc, &m); !s.ok()) return k.fail(s.code(), "auto: measuring: " + s.message());

  // Predicted compute and wire for n ranks.
  const double E = m.encode_s + m.middle_s, D = m.finish_s;
  double compute = m.encode_s + m.middle_s + m.finish_s;
  double wire_c = 0;
  const std::uint64_t dense = desc.dense_bytes();
  const double wire_d = static_cast<double>(coll == Coll::all_reduce       ? all_reduce_wire(dense, n)
                                            : coll == Coll::reduce_scatter ? reduce_scatter_wire(dense, n)
                                                                           : all_gather_wire(dense, n));
  for (const auto& [kind, bytes] : m.rounds) {
    if (coll == Coll::all_gather) {
      wire_c += static_cast<double>(all_gather_wire(8 + bytes, n));
      compute += (dn - 1) * D;
      continue;
    }
    switch (kind) {
      case Aggregation::summable: wire_c += static_cast<double>(all_reduce_wire(bytes, n)); break;
      case Aggregation::gather_only:
        wire_c += static_cast<double>(all_gather_wire(8 + bytes, n));
        compute += (dn - 1) * D;
        break;
      case Aggregation::requantizable:
        wire_c += static_cast<double>(coll == Coll::reduce_scatter ? reduce_scatter_wire(bytes, n)
                                                                   : all_reduce_wire(bytes, n));
        compute += opt.requant == RequantScheme::ring ? (dn - 1) / dn * (E + 2 * D) : E / dn + D;
        break;
    }
  }

  // The link: option, environment, cached measurement, or measure now.
  double gbit = opt.link_gbit;
  if (gbit <= 0) {
    if (Status s = link_from_env(&gbit); !s.ok()) return k.fail(s);
  }
  const std::pair<int, int> shape{n, k.comm.num_nodes()};
  double spb = gbit > 0 ? 8.0 / (gbit * 1e9) : 0.0;
  if (spb == 0 && n > 1) {
    Registry& reg = registry();
    std::lock_guard lk(reg.mu);
    if (auto it = reg.link.find(shape); it != reg.link.end()) spb = it->second;
  }
  double v[5] = {spb == 0 && n > 1 ? 1.0 : 0.0, spb, compute, wire_c, wire_d};
  if (Status s = k.fail(k.comm.all_reduce(v, v, 5, DataType::f64, ReduceOp::max).wait()); !s.ok()) return s;
  if (v[0] > 0) {
    double mine = 0;
    if (Status s = measure_link(k, &mine); !s.ok()) return s;
    double agreed = std::max(mine, v[1]);
    if (Status s = k.fail(k.comm.all_reduce(&agreed, &agreed, 1, DataType::f64, ReduceOp::max).wait()); !s.ok()) {
      return s;
    }
    v[1] = agreed;
    Registry& reg = registry();
    std::lock_guard lk(reg.mu);
    reg.link[shape] = agreed;
  }
  spb = v[1];
  compute = v[2];
  wire_c = v[3];
  out->t_compressed = compute + wire_c * spb;
  out->t_dense = v[4] * spb;
  out->compress = out->t_compressed < out->t_dense;
  const double gbit_used = spb > 0 ? 8.0 / spb / 1e9 : 0.0;
  out->reason = std::string(out->compress ? "compressed" : "dense") + ": predicted " +
                fmt("%.3g", out->t_compressed * 1e3) + " ms compressed (encode/decode " + fmt("%.3g", compute * 1e3) +
                " ms + " + fmt("%.0f", wire_c) + " B on the wire) " + (out->compress ? "<" : ">=") + " dense " +
                fmt("%.3g", out->t_dense * 1e3) + " ms (" + fmt("%.0f", v[4]) + " B) at " + fmt("%.3g", gbit_used) +
                " Gbit/s";

  const detail::Config& cfg = k.comm.impl()->config();
  if (detail::log::enabled(cfg.log_level, detail::LogLevel::info)) {
    const std::string line = std::string(k.coll) + " " + k.what + ": auto: " + out->reason;
    const std::string key = std::to_string(k.rank) + "|" + k.coll + "|" + k.what + "|" + (out->compress ? "c" : "d");
    bool first = false;
    {
      Registry& reg = registry();
      std::lock_guard lk(reg.mu);
      first = reg.logged.insert(key).second;
    }
    if (first) detail::log::write(detail::LogLevel::info, k.rank, line);
  }
  return {};
}

}  // namespace cclz::compress::cc
