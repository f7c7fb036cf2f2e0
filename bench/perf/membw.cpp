// Concurrent copy bandwidth: the roofline's denominator. Threads copy
// private buffers so that only the memory bus is shared, as it is between
// the ranks of one host.
#include "membw.hpp"

#include "shm_pipeline.hpp"
#include "shm_window.hpp"

#include <sched.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace cclz::perf {

std::size_t last_level_cache_bytes() {
  // The library's figure: sysfs (not sysconf, which can report a VM host's
  // whole cache), at most detail::kLlcPerCpu per online CPU.
  return static_cast<std::size_t>(detail::host_cache_sizes().llc);
}

CopyBandwidth measure_copy_bandwidth(int copiers, std::size_t total_bytes, int reps, const cpu_set_t* cpus) {
  using clock = std::chrono::steady_clock;
  CopyBandwidth r;
  r.copiers = std::max(1, copiers);
  const auto n = static_cast<std::size_t>(r.copiers);
  r.bytes_per_copier = std::max<std::size_t>(total_bytes / n, std::size_t{64} << 20) / 64 * 64;

  struct Pair {
    std::unique_ptr<std::byte[]> src, dst;
  };
  std::vector<Pair> bufs(n);
  for (Pair& p : bufs) {
    p.src = std::make_unique_for_overwrite<std::byte[]>(r.bytes_per_copier);
    p.dst = std::make_unique_for_overwrite<std::byte[]>(r.bytes_per_copier);
  }

  // Rep 0 faults the pages in (first-touch happens on the copying thread,
  // which is where the memory should live) and is not timed. Each rep
  // times memcpy, then the streamed copy, every copier at once.
  std::vector<double> secs[2] = {std::vector<double>(static_cast<std::size_t>(reps) + 1, 0.0),
                                 std::vector<double>(static_cast<std::size_t>(reps) + 1, 0.0)};
  std::barrier sync(static_cast<std::ptrdiff_t>(n));
  auto worker = [&](std::size_t t) {
    Pair& p = bufs[t];
    std::memset(p.src.get(), static_cast<int>(t + 1), r.bytes_per_copier);
    for (int rep = 0; rep <= reps; ++rep) {
      for (int streamed = 0; streamed < 2; ++streamed) {
        sync.arrive_and_wait();
        const auto t0 = clock::now();
        if (streamed != 0) {
          coll::shm::copy_stream(p.dst.get(), p.src.get(), r.bytes_per_copier);
        } else {
          std::memcpy(p.dst.get(), p.src.get(), r.bytes_per_copier);
        }
        sync.arrive_and_wait();  // the run ends when the slowest copier ends
        if (t == 0) {
          secs[streamed][static_cast<std::size_t>(rep)] = std::chrono::duration<double>(clock::now() - t0).count();
        }
      }
    }
  };
  // Every copier, the calling thread too, may run on any of `cpus` while
  // it measures; the caller's own mask comes back afterwards.
  cpu_set_t own;
  const bool widen = cpus != nullptr && sched_getaffinity(0, sizeof own, &own) == 0 &&
                     sched_setaffinity(0, sizeof *cpus, cpus) == 0;
  std::vector<std::thread> threads;
  for (std::size_t t = 1; t < n; ++t) threads.emplace_back(worker, t);
  worker(0);
  for (std::thread& th : threads) th.join();
  if (widen) sched_setaffinity(0, sizeof own, &own);

  const double bytes = 2.0 * static_cast<double>(r.bytes_per_copier) * static_cast<double>(n);
  double* out[2] = {&r.memcpy_bytes_per_s, &r.streamed_bytes_per_s};
  for (int k = 0; k < 2; ++k) {
    double best = 0;
    for (int rep = 1; rep <= reps; ++rep) {
      const double s = secs[k][static_cast<std::size_t>(rep)];
      if (s > 0 && (best == 0 || s < best)) best = s;
    }
    if (best > 0) *out[k] = bytes / best;
  }
  r.bytes_per_s = std::max(r.memcpy_bytes_per_s, r.streamed_bytes_per_s);
  return r;
}

}  // namespace cclz::perf
