// Command-line options of the reference trainers: model shape, batch,
// optimizer, schedule, data, evaluation and logging. cclz-train-local uses
// all of them; the parallel trainers add their own on top.
#pragma once

#include <cstdint>
#include <string>

#include "cclz/types.hpp"
#include "model/config.hpp"
#include "optim/optimizer.hpp"
#include "optim/schedule.hpp"

namespace cclz::train {

struct TrainOptions {
  ModelConfig model;  // vocab stays 256: the data is bytes
  int batch = 16;     // sequences per step (global batch); seq length = model.context
  int steps = 1000;
  OptimizerConfig optim;
  LrSchedule schedule{ScheduleKind::cosine, 1e-3f, 1e-4f, 50, 1000};  // total is set to steps
  float clip = 1.0f;    // global gradient norm limit; 0 = off
  std::uint64_t seed = 1;
  std::string data;  // empty: the default corpus (data/corpus.hpp)
  double val_fraction = 0.1;
  int eval_every = 100;  // steps; 0 = only at the end
  int eval_batches = 0;  // 0 = the whole validation split
  int log_every = 10;    // steps between progress lines
  std::string csv;       // per-step CSV log; empty = none
  int threads = 0;       // OpenBLAS threads; 0 = OpenBLAS's default (OPENBLAS_NUM_THREADS or all cores)
  bool quiet = false;    // no progress lines (errors still reported)
};

// Parses argv[1..argc) into *out (which holds the defaults on entry) and
// validates the result. *help is set when --help was given.
Status parse_train_args(int argc, const char* const* argv, TrainOptions* out, bool* help);
std::string train_usage(const char* program);

}  // namespace cclz::train
