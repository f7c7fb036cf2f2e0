// The single-process training loop behind cclz-train-local, as a library
// call so tests can run it: per step, sample the batch, forward, backward,
// clip, schedule, optimizer step; validation every eval_every steps.
// Everything is seeded from TrainOptions::seed, so two runs with the same
// options (and the same OpenBLAS thread count) give bitwise equal losses.
#pragma once

#include <cstdio>
#include <vector>

#include "cclz/types.hpp"
#include "options.hpp"

namespace cclz::train {

struct ValPoint {
  int step;  // updates done when it was measured
  float loss;
};

struct TrainResult {
  std::vector<float> train_loss;  // per step, of that step's batch before its update
  std::vector<float> grad_norm;   // per step, before clipping
  std::vector<ValPoint> val;      // step 0 (before training), every eval_every, and the end
  double seconds = 0;             // wall time of the loop (evaluation included)
  double step_seconds = 0;        // wall time of the training steps alone
  std::size_t num_params = 0;
};

// Runs the whole training; progress and validation lines go to `log` (null
// for none). Fails before training on bad data, options or a CSV path that
// cannot be written, and mid-way if the loss or gradient becomes non-finite.
Status train_local(const TrainOptions& opts, std::FILE* log, TrainResult* result);

}  // namespace cclz::train
