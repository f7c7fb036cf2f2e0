// Memory-copy bandwidth of this machine, the yardstick for cclz-perf's
// roofline (docs/performance.md): `copiers` threads each copy their own
// buffer at the same time, once with memcpy and once with streaming stores
// (the library's shm::copy_stream), and the faster counts: a roofline must
// bound what the host can do, and which copy that is depends on the host
// (glibc's memcpy streams only past a threshold it derives from the cache
// size sysfs reports, which a VM may inflate). Bandwidth = bytes read +
// bytes written / time.
#pragma once

#include <sched.h>

#include <cstddef>

namespace cclz::perf {

struct CopyBandwidth {
  int copiers = 1;
  std::size_t bytes_per_copier = 0;  // size of each copy
  double bytes_per_s = 0;            // read + written, all copiers together, best run of the faster copy
  double memcpy_bytes_per_s = 0;     // the same, memcpy only
  double streamed_bytes_per_s = 0;   // the same, streaming stores only
};

// Best of `reps` timed runs of each copy after one untimed run that faults
// the pages in.
// Buffers are at least 64 MiB per copier so they miss every cache level.
// The copier threads run on `cpus` (when given), not on the caller's own
// affinity, which a rank bound to one core would share with all of them.
CopyBandwidth measure_copy_bandwidth(int copiers, std::size_t total_bytes, int reps, const cpu_set_t* cpus = nullptr);

// The last-level cache the library plans with (detail::host_cache_sizes():
// CPU 0's from sysfs, at most 16 MiB per online CPU). Below it a "memory"
// roofline does not bind: the data never leaves the cache.
std::size_t last_level_cache_bytes();

}  // namespace cclz::perf
