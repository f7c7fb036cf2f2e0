// cclz-perf --compressor SPEC: the compressed all-reduce (cclz/compressed.hpp)
// timed beside the dense all-reduce of the same tensor in the same run.
#pragma once

#include <string>
#include <vector>

#include "cclz/cclz.hpp"
#include "options.hpp"
#include "report.hpp"

namespace cclz::perf {

// Prints, on rank 0, one row per (size, spec): the dense all-reduce's time
// and algbw, then the compressed all-reduce's time, its effective bandwidth
// (dense bytes / time), the speed-up over dense, the compression ratio
// (dense bytes / payload bytes) and the wire ratio (dense wire bytes /
// compressed wire bytes, as CompressedReport counts them), and the relative
// L2 error of the result against the dense all-reduce's. False when a call
// failed on some rank (the communicator is then unusable).
bool run_compressed_tables(const Options& o, Comm& comm, const RunInfo& info);

}  // namespace cclz::perf
