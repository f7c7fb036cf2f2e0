// cclz-perf --compressor SPEC (repeatable): for each size, the dense
// all-reduce (Comm::all_reduce, op sum, in place) and then the compressed
// all-reduce of each spec (compressed_all_reduce, in place), timed the same
// way: each iteration restores the rank's gradient from a pristine copy
// (untimed), then times one call; warm-up iterations first (they also warm
// the compressor's state: error-feedback residuals, PowerSGD's Q, DGC's
// warm-up steps), then `iters` timed ones; the per-call average on each
// rank, max over ranks. The gradient is a fixed pseudo-random draw per rank,
// uniform in [-1, 1) (f32, f16 or bf16 by -d). Only all_reduce.
//
// Effective bandwidth = dense bytes / time (what the caller sees: the tensor
// reduced per second), GB = 1e9 bytes. The relative error is that of the
// last timed call's result (rank 0's, identical everywhere) against the
// dense all-reduce of the same gradients: with error feedback a single step
// is far from the dense sum by design (the residual carries the rest).
#include "compressed.hpp"

#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

#include "cclz/compressed.hpp"
#include "kernels.hpp"

namespace cclz::perf {
namespace {

using Clock = std::chrono::steady_clock;

// splitmix64: the same gradient on every run.
std::uint64_t mix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// count elements of dt (f32, f16, bf16) uniform in [-1, 1); the 16-bit
// types by truncating the f32 bits' mantissa (bf16) or rounding to half.
void fill(std::vector<std::byte>* out, std::size_t count, DataType dt, int rank) {
  out->resize(count * dtype_size(dt));
  std::uint64_t s = 0xc0ffee + static_cast<std::uint64_t>(rank) * 7919;
  for (std::size_t i = 0; i < count; ++i) {
    const float x = static_cast<float>(static_cast<double>(mix(s) >> 40) * 0x1p-23 - 1.0);
    if (dt == DataType::f32) {
      std::memcpy(out->data() + 4 * i, &x, 4);
    } else if (dt == DataType::bf16) {
      std::uint32_t u;
      std::memcpy(&u, &x, 4);
      const auto h = static_cast<std::uint16_t>(u >> 16);
      std::memcpy(out->data() + 2 * i, &h, 2);
    } else {
      const std::uint16_t h = kernels::float_to_half(x);
      std::memcpy(out->data() + 2 * i, &h, 2);
    }
  }
}

float load(const std::byte* p, DataType dt, std::size_t i) {
  if (dt == DataType::f32) {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  }
  if (dt == DataType::bf16) {
    std::uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    const std::uint32_t u = std::uint32_t{h} << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  std::uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return kernels::half_to_float(h);
}

bool any_rank(bool v) {
  int in = v ? 1 : 0, out = 0;
  MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return out != 0;
}

// Warm-up, then `iters` timed calls of fn (restore() before each, untimed).
// Per-call seconds, max over ranks; *failed on every rank if any failed.
template <class Restore, class Fn>
double timed(const Options& o, Comm& comm, Restore&& restore, Fn&& fn, bool* failed) {
  bool bad = false;
  for (int i = 0; i < o.warmup && !bad; ++i) {
    restore();
    bad = !fn();
  }
  if (any_rank(bad)) return *failed = true, 0.0;
  MPI_Barrier(MPI_COMM_WORLD);
  if (!comm.barrier().wait().ok()) return *failed = true, 0.0;
  double total = 0;
  for (int i = 0; i < o.iters && !bad; ++i) {
    restore();
    const auto t0 = Clock::now();
    bad = !fn();
    total += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  if (!bad) bad = !comm.barrier().wait().ok();
  const double local = total / o.iters;
  double worst = 0;
  MPI_Allreduce(&local, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  *failed = any_rank(bad);
  return worst;
}

}  // namespace

bool run_compressed_tables(const Options& o, Comm& comm, const RunInfo& info) {
  const int rank = comm.rank();
  (void)info;
  std::vector<std::unique_ptr<Compressor>> cs;
  for (const std::string& spec : o.compressors) {
    std::unique_ptr<Compressor> c;
    if (Status st = make_compressor(spec, &c); !st.ok()) {
      if (rank == 0) std::fprintf(stderr, "cclz-perf: --compressor: %s\n", st.to_string().c_str());
      return false;
    }
    cs.push_back(std::move(c));
  }
  CompressedOptions copt;
  copt.requant = o.requant;
  if (rank == 0) {
    std::printf("# compressed all_reduce, in place; effbw = dense bytes / time; x-dense = dense time / time;\n");
    std::printf("# ratio = dense bytes / payload bytes; wire = dense wire bytes / wire bytes (per rank, as\n");
    std::printf("# CompressedReport counts them); relerr = ||result - dense sum|| / ||dense sum||; re-quantizable\n");
    std::printf("# payloads by %s\n", requant_scheme_name(o.requant));
    std::printf("#\n# %10s %11s %5s %11s %9s  %-28s %11s %9s %8s %8s %8s %9s %s\n", "size", "count", "type",
                "dense(us)", "algbw", "compressor", "time(us)", "effbw", "x-dense", "ratio", "wire", "relerr", "");
    std::printf("# %10s %11s %5s %11s %9s  %-28s %11s %9s %8s %8s %8s %9s\n", "(B)", "(elements)", "", "",
                "(GB/s)", "", "", "(GB/s)", "", "", "", "");
    std::fflush(stdout);
  }
  for (DataType dt : o.dtypes) {
    if (dt != DataType::f32 && dt != DataType::f16 && dt != DataType::bf16) {
      if (rank == 0) std::printf("# %s: skipped (compressors take f32, f16, bf16)\n", dtype_name(dt));
      continue;
    }
    const std::size_t es = dtype_size(dt);
    for (std::size_t bytes : sweep_sizes(o)) {
      const std::size_t count = bytes / es;
      const std::size_t nbytes = count * es;
      std::vector<std::byte> grad, work(nbytes), dense(nbytes);
      fill(&grad, count, dt, rank);
      auto restore = [&] {
        if (nbytes > 0) std::memcpy(work.data(), grad.data(), nbytes);
      };
      bool failed = false;
      Status derr;
      const double t_dense = timed(
          o, comm, restore,
          [&] {
            derr = comm.all_reduce(work.data(), work.data(), count, dt, ReduceOp::sum).wait();
            return derr.ok();
          },
          &failed);
      if (failed) {
        std::fprintf(stderr, "cclz-perf: rank %d: dense all_reduce of %zu bytes failed: %s\n", rank, nbytes,
                     derr.ok() ? "(a peer failed)" : derr.to_string().c_str());
        return false;
      }
      dense = work;
      for (std::size_t k = 0; k < cs.size(); ++k) {
        const Compressor& c = *cs[k];
        const TensorDesc desc{count, dt, 0, 0};
        std::unique_ptr<CompressorState> st;
        Status err = c.make_state(desc, &st);
        if (any_rank(!err.ok())) {
          if (rank == 0) {
            std::printf("  %10zu %11zu %5s %11s %9s  %-28s %s\n", nbytes, count, dtype_name(dt), "", "",
                        c.spec().text.c_str(), err.ok() ? "(a peer failed)" : err.to_string().c_str());
          }
          continue;
        }
        CompressedReport rep;
        const double t = timed(
            o, comm, restore,
            [&] {
              err = compressed_all_reduce(comm, work.data(), desc, c, *st, copt, &rep);
              return err.ok();
            },
            &failed);
        if (failed) {
          std::fprintf(stderr, "cclz-perf: rank %d: %s: %s\n", rank, c.spec().text.c_str(),
                       err.ok() ? "(a peer failed)" : err.to_string().c_str());
          return false;
        }
        double num = 0, den = 0;
        for (std::size_t i = 0; i < count; ++i) {
          const double d = load(dense.data(), dt, i), x = load(work.data(), dt, i);
          num += (x - d) * (x - d);
          den += d * d;
        }
        if (rank == 0) {
          const double dbytes = static_cast<double>(nbytes);
          char ratio[32], wire[32];
          if (rep.compressed && rep.payload_bytes > 0) {
            std::snprintf(ratio, sizeof ratio, "%.1f", dbytes / static_cast<double>(rep.payload_bytes));
          } else {
            std::snprintf(ratio, sizeof ratio, "%s", rep.compressed ? "inf" : "dense");
          }
          if (rep.wire_bytes > 0) {
            std::snprintf(wire, sizeof wire, "%.1f",
                          static_cast<double>(rep.dense_wire_bytes) / static_cast<double>(rep.wire_bytes));
          } else {
            std::snprintf(wire, sizeof wire, "-");
          }
          std::printf("  %10zu %11zu %5s %11.1f %9.3f  %-28s %11.1f %9.3f %8.2f %8s %8s %9.2e %s\n", nbytes, count,
                      dtype_name(dt), t_dense * 1e6, t_dense > 0 ? dbytes / t_dense / 1e9 : 0.0,
                      c.spec().text.c_str(), t * 1e6, t > 0 ? dbytes / t / 1e9 : 0.0, t > 0 ? t_dense / t : 0.0,
                      ratio, wire, den > 0 ? std::sqrt(num / den) : 0.0,
                      c.spec().auto_select ? (rep.compressed ? "(auto: compressed)" : "(auto: dense)") : "");
          std::fflush(stdout);
        }
      }
    }
  }
  if (rank == 0) std::printf("#\n");
  return true;
}

}  // namespace cclz::perf
