// The data-parallel trainer behind cclz-train: every rank holds the whole
// model, trains on its shard of the global batch, and the ranks average
// their gradients every step (or their parameters every H steps with local
// SGD) over a cclz communicator.
//
// Gradient buckets. The gradient buffer is cut into buckets of whole
// parameter groups, walked from the last group (the head) backwards, each
// at least `bucket_kb` KiB (the last one takes what is left). Backward
// reports each group as soon as its gradients are final (Gpt::backward's
// hook); when the lowest group of a bucket is reported, the bucket's
// reduction is launched at once and runs while backward goes on through
// the earlier layers:
//   - dense (`none`): Comm::all_reduce with ReduceOp::avg, a non-blocking
//     Request served by the communicator's progress engine;
//   - compressed: compressed_all_reduce (blocking) with averaging, on the
//     trainer's communication thread, which takes ready buckets in order.
// Every rank launches the same buckets in the same order, so the
// communicator sees the same sequence of collectives everywhere. The
// compressor keeps one state per bucket (error-feedback residuals,
// PowerSGD's Q); averaging divides the aggregated sum by the number of
// ranks after decoding (CompressedOptions::average), so every rank applies
// the same averaged, compressed gradient.
//
// Checkpoints (dp.cpp has the format): every rank writes its own file
// (parameters, optimizer state, compressor states, sampler position, step)
// to a temporary name, fsyncs and renames it; after a barrier rank 0
// records the step in DIR/latest the same way. A crash at any point leaves
// `latest` naming a complete set. Resuming checks the model shape, the
// number of ranks, the batch, the compressor spec and the bucket layout
// before the first step.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cclz/cclz.hpp"
#include "local.hpp"
#include "options.hpp"

namespace cclz::train {

struct DpOptions {
  std::string compressor = "none";  // a cclz compressor spec for the gradient buckets
  int bucket_kb = 256;              // minimum bucket size in KiB (the default model gets 5)
  int local_steps = 1;              // > 1: local SGD, parameters averaged every H steps
  std::string checkpoint;           // directory; empty: no checkpoints
  int checkpoint_every = 0;         // steps; 0: only at the end (when a directory is given)
  bool resume = false;              // start from DIR/latest
  int stop_after = 0;               // > 0: stop (with a checkpoint) after this step, as if killed
};

struct DpResult {
  TrainResult train;                    // train_loss: the global mean per step
  std::vector<std::uint64_t> bytes_sent;  // this rank's wire bytes per step
  std::vector<std::uint64_t> dense_bytes;  // what dense f32 averaging would send per step
  int first_step = 0;                   // steps done before this run (resume)
  int buckets = 0;
  double comm_wait_s = 0;  // time the main thread waited for reductions after backward (exposed)
  double comm_busy_s = 0;  // time reductions ran (compressed path; hidden = busy - exposed)
};

// Parses cclz-train's own flags (--compressor, --bucket-kb, --local-steps,
// --checkpoint, --checkpoint-every, --resume, --stop-after) and hands the
// rest to parse_train_args.
Status parse_dp_args(int argc, const char* const* argv, TrainOptions* train, DpOptions* dp, bool* help);
std::string dp_usage(const char* program);

// Runs the training on every rank of comm. Rank 0 writes the CSV and the
// progress lines (log may be null); every rank checks its input first and
// the ranks agree before training starts, so bad input fails on all of them.
Status train_dp(Comm& comm, const TrainOptions& opts, const DpOptions& dp, std::FILE* log, DpResult* result);

}  // namespace cclz::train
