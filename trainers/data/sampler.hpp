// Batches for the trainers, designed so data parallelism does not change
// the data: the GLOBAL batch of step s is B windows of T+1 bytes of the
// training split, window i starting at
//     offset(s, i) = uniform_below(hash(seed, s, i), n - T)
// (counter-based: no RNG stream to advance, any window computable alone),
// and rank r of W takes windows [r B/W, (r+1) B/W). Concatenated in rank
// order the local batches are exactly the 1-process batch, for every W
// dividing B. inputs = window[0..T), targets = window[1..T+1).
//
// The sampler's state is (seed, step) plus what identifies the data and the
// shapes, so a checkpoint restores it exactly and refuses a different
// corpus or batch shape.
//
// Evaluation uses the validation split in order: window w starts at w*T
// (non-overlapping targets), batch j holds windows [j B, (j+1) B), sharded
// over ranks the same way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "cclz/types.hpp"

namespace cclz::train {

struct SamplerState {
  std::uint64_t seed = 0;
  std::uint64_t step = 0;
  std::uint64_t data_size = 0;
  std::uint64_t data_hash = 0;  // fingerprint() of the training split
  std::int32_t global_batch = 0;
  std::int32_t seq_len = 0;
};
// Fixed little-endian layout with a magic and version, 48 bytes.
std::vector<std::uint8_t> serialize(const SamplerState& s);
Status deserialize(std::span<const std::uint8_t> bytes, SamplerState* out);

// Checks 1 <= seq_len, 1 <= global_batch, 0 <= rank < world and that world
// divides global_batch (equal shards keep the global batch independent of W).
Status validate_shard(int global_batch, int seq_len, int rank, int world);

class BatchSampler {
 public:
  // data must outlive the sampler and hold at least seq_len + 1 bytes.
  static Status create(std::span<const std::uint8_t> data, int global_batch, int seq_len, int rank, int world,
                       std::uint64_t seed, BatchSampler* out);

  int local_batch() const noexcept { return local_batch_; }
  int seq_len() const noexcept { return T_; }
  // Fills inputs and targets, (local_batch, T) each, with this rank's part
  // of the current step's global batch, then advances the step.
  void next(int* inputs, int* targets);
  // The same for any step, without moving.
  void batch_at(std::uint64_t step, int* inputs, int* targets) const;
  // Start offset in the data of window i of the global batch at step s.
  std::size_t window_offset(std::uint64_t step, int i) const noexcept;

  std::uint64_t step() const noexcept { return step_; }
  SamplerState state() const;
  // Continues from a saved state; fails if it was made for other data,
  // another seed or other batch shape.
  Status restore(const SamplerState& s);

 private:
  std::span<const std::uint8_t> data_;
  std::uint64_t data_hash_ = 0;
  int global_batch_ = 0, local_batch_ = 0, first_ = 0, T_ = 0;
  std::uint64_t seed_ = 0, step_ = 0;
};

// Number of full evaluation batches in a validation split (0 if none fits).
int eval_batch_count(std::size_t val_size, int global_batch, int seq_len) noexcept;
// This rank's part of evaluation batch j (see the note above); the shard
// must validate and j must be below eval_batch_count.
void eval_batch(std::span<const std::uint8_t> val, int j, int global_batch, int seq_len, int rank, int world,
                int* inputs, int* targets);

}  // namespace cclz::train
