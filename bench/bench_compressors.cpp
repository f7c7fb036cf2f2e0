// Compressor throughput (Google Benchmark): encode (begin() of one step on a
// persistent state) and decode (decode_add of that payload into an f32
// accumulator, what the compressed collectives do per received payload) for
// every spec in kSpecs, at 1M, 16M and 64M f32 elements, next to memcpy of
// the same dense buffer.
//
// Counters: dense_GBps = dense input bytes (4 per element) per second, for
// memcpy too (each byte counted once, not read + write), so the ratio of
// the two is "this compressor processes a tensor at X% of the speed the
// machine copies it". copy_frac is that ratio directly, against a memcpy of
// the same size timed at start-up (best of 5). One thread throughout.
// Inputs are N(0, 1) floats from a fixed seed.
//
// PowerSGD (two rounds, so not in kSpecs): powersgd_step times one whole
// step of rank 4 on 4096 x 4096 (with and without error feedback) and
// powersgd_sgemm3 its three matrix products alone, OpenBLAS on one thread
// (openblas_set_num_threads(1)).
//
// To add a compressor: one line in kSpecs. Filter with --benchmark_filter,
// e.g. 'encode/topk.*/16M|copy/16M'.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <cblas.h>

#include "cclz/compress.hpp"

namespace {

// Every spec benchmarked. Specs that need a 2-D shape can say so in `rows`
// (0: a flat tensor); the tensor is then rows x (n / rows).
struct BenchSpec {
  const char* spec;
  std::size_t rows = 0;
};
const BenchSpec kSpecs[] = {
    {"none"},
    {"fp16"},
    {"bf16"},
    {"topk:ratio=0.01"},
    {"topk:ratio=0.01,approx=1"},
    {"randk:ratio=0.01"},
    {"threshold:tau=2.576"},  // about 1% of N(0, 1)
    {"dgc:ratio=0.01,warmup=0"},
    {"ef+topk:ratio=0.01"},  // the slow-link benchmark's spec
    {"ef+topk:ratio=0.01,approx=1"},
    {"qsgd"},  // 4 bits, bucket 512
    {"qsgd:bits=8"},
    {"terngrad"},
    {"int8"},
    {"int8:stochastic=1"},
    {"int4"},
    {"sign"},
    {"signum"},
};

constexpr std::size_t kSizes[] = {1u << 20, 16u << 20, 64u << 20};

std::string size_name(std::size_t n) { return std::to_string(n >> 20) + "M"; }

const std::vector<float>& input(std::size_t n) {
  static std::vector<float> data;  // shared by every benchmark, grown once to the largest size
  if (data.size() < n) {
    std::mt19937 gen(12345);
    std::normal_distribution<float> d(0.0f, 1.0f);
    const std::size_t old = data.size();
    data.resize(n);
    for (std::size_t i = old; i < n; ++i) data[i] = d(gen);
  }
  return data;
}

// memcpy bandwidth (dense bytes per second) for n floats, best of 5.
double copy_bw(std::size_t n) {
  const std::vector<float>& src = input(n);
  std::vector<float> dst(n, 0.0f);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), n * 4);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(n * 4) / s);
  }
  return best;
}

void set_counters(benchmark::State& st, std::size_t n, double copy) {
  const double bytes = static_cast<double>(n * 4) * static_cast<double>(st.iterations());
  st.counters["dense_GBps"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsRate);
  // copy_frac = (bytes / time) / copy: a rate of bytes / copy.
  st.counters["copy_frac"] = benchmark::Counter(bytes / copy, benchmark::Counter::kIsRate);
}

void bm_copy(benchmark::State& st, std::size_t n, double copy) {
  const std::vector<float>& src = input(n);
  std::vector<float> dst(n, 0.0f);
  for (auto _ : st) {
    std::memcpy(dst.data(), src.data(), n * 4);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  set_counters(st, n, copy);
}

struct Setup {
  std::unique_ptr<cclz::Compressor> c;
  std::unique_ptr<cclz::CompressorState> state;
};

bool setup(benchmark::State& st, const BenchSpec& b, std::size_t n, Setup* s) {
  cclz::Status r = cclz::make_compressor(b.spec, &s->c);
  if (r.ok()) {
    const std::size_t rows = b.rows;
    r = s->c->make_state(cclz::TensorDesc{n, cclz::DataType::f32, rows, rows != 0 ? n / rows : 0}, &s->state);
  }
  if (!r.ok()) st.SkipWithError(r.to_string().c_str());
  return r.ok();
}

void bm_encode(benchmark::State& st, const BenchSpec& b, std::size_t n, double copy) {
  Setup s;
  if (!setup(st, b, n, &s)) return;
  const auto grad = std::as_bytes(std::span(input(n)).first(n));
  cclz::Payload p;
  for (auto _ : st) {
    const cclz::Status r = s.c->begin(*s.state, grad, &p);
    if (!r.ok()) {
      st.SkipWithError(r.to_string().c_str());
      return;
    }
    benchmark::DoNotOptimize(p.bytes.data());
  }
  set_counters(st, n, copy);
  st.counters["payload_frac"] = static_cast<double>(p.bytes.size()) / static_cast<double>(n * 4);
}

void bm_decode(benchmark::State& st, const BenchSpec& b, std::size_t n, double copy) {
  Setup s;
  if (!setup(st, b, n, &s)) return;
  const auto grad = std::as_bytes(std::span(input(n)).first(n));
  cclz::Payload p;
  if (cclz::Status r = s.c->begin(*s.state, grad, &p); !r.ok()) {
    st.SkipWithError(r.to_string().c_str());
    return;
  }
  std::vector<float> acc(n, 0.0f);
  for (auto _ : st) {
    const cclz::Status r = s.c->decode_add(*s.state, p.bytes, acc);
    if (!r.ok()) {
      st.SkipWithError(r.to_string().c_str());
      return;
    }
    benchmark::DoNotOptimize(acc.data());
    benchmark::ClobberMemory();
  }
  set_counters(st, n, copy);
}

// PowerSGD, one whole step (begin, next, finish) on one rank of an
// rows x cols f32 matrix (the all-reduces of one rank are the identity),
// against its three matrix products alone through OpenBLAS: P = M Q,
// Q' = M^T P, out = P Q'^T. OpenBLAS runs on one thread (main sets it).
constexpr std::size_t kPsgdDim = 4096;

void bm_powersgd_step(benchmark::State& st, const char* spec) {
  const std::size_t n = kPsgdDim, m = kPsgdDim;
  Setup s;
  if (!setup(st, BenchSpec{spec, n}, n * m, &s)) return;
  const auto grad = std::as_bytes(std::span(input(n * m)).first(n * m));
  std::vector<float> out(n * m);
  cclz::Payload p;
  std::vector<std::byte> agg_bytes;
  for (auto _ : st) {
    cclz::Status r = s.c->begin(*s.state, grad, &p);
    while (r.ok() && !p.last) {
      agg_bytes = p.bytes;  // the summed payload of one rank
      const std::span<const std::byte> part(agg_bytes);
      r = s.c->next(*s.state, cclz::Aggregate(&part, 1), &p);
    }
    if (r.ok()) {
      const std::span<const std::byte> part(p.bytes);
      r = s.c->finish(*s.state, cclz::Aggregate(&part, 1), std::as_writable_bytes(std::span(out)));
    }
    if (!r.ok()) {
      st.SkipWithError(r.to_string().c_str());
      return;
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  st.counters["rank"] = 4;
}

void bm_powersgd_sgemm3(benchmark::State& st) {
  const int n = kPsgdDim, m = kPsgdDim, r = 4;
  const float* mat = input(kPsgdDim * kPsgdDim).data();
  std::vector<float> q(static_cast<std::size_t>(m) * r, 0.01f), p(static_cast<std::size_t>(n) * r);
  std::vector<float> out(static_cast<std::size_t>(n) * m);
  for (auto _ : st) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, r, m, 1.0f, mat, m, q.data(), r, 0.0f, p.data(), r);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, r, n, 1.0f, mat, m, p.data(), r, 0.0f, q.data(), r);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, m, r, 1.0f, p.data(), r, q.data(), r, 0.0f, out.data(), m);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
    // Keep the values bounded across iterations (q grows by |M| each time).
    const float inv = 1.0f / (1.0f + std::fabs(q[0]));
    for (float& v : q) v *= inv;
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  openblas_set_num_threads(1);  // single-threaded like everything else here (PowerSGD's sgemm)
  for (std::size_t n : kSizes) {
    const double copy = copy_bw(n);
    std::printf("copy bandwidth at %s f32: %.2f GB/s (memcpy, best of 5)\n", size_name(n).c_str(), copy / 1e9);
    benchmark::RegisterBenchmark(("copy/" + size_name(n)).c_str(), bm_copy, n, copy)
        ->Unit(benchmark::kMillisecond);
    for (const BenchSpec& b : kSpecs) {
      benchmark::RegisterBenchmark(("encode/" + std::string(b.spec) + "/" + size_name(n)).c_str(), bm_encode, b, n,
                                   copy)
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("decode/" + std::string(b.spec) + "/" + size_name(n)).c_str(), bm_decode, b, n,
                                   copy)
          ->Unit(benchmark::kMillisecond);
    }
  }
  const std::string dim = std::to_string(kPsgdDim) + "x" + std::to_string(kPsgdDim);
  benchmark::RegisterBenchmark(("powersgd_sgemm3/rank=4/" + dim).c_str(), bm_powersgd_sgemm3)
      ->Unit(benchmark::kMillisecond);
  for (const char* spec : {"powersgd:rank=4", "powersgd:rank=4,ef=0"}) {
    benchmark::RegisterBenchmark(("powersgd_step/" + std::string(spec) + "/" + dim).c_str(), bm_powersgd_step, spec)
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
