// Counter-based batch sampler and validation batches; see sampler.hpp.
#include "data/sampler.hpp"

#include <string>

#include "common/rng.hpp"
#include "data/corpus.hpp"

namespace cclz::train {

namespace {

constexpr std::uint32_t kMagic = 0x53504c43;  // "CLPS" little-endian: cclz sampler
constexpr std::uint32_t kVersion = 1;
constexpr std::size_t kStateBytes = 48;

void put(std::vector<std::uint8_t>& b, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
std::uint64_t get(std::span<const std::uint8_t> b, std::size_t at, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(b[at + static_cast<std::size_t>(i)]) << (8 * i);
  return v;
}

void fill(const std::uint8_t* w, int T, int* inputs, int* targets) {
  for (int t = 0; t < T; ++t) {
    inputs[t] = w[t];
    targets[t] = w[t + 1];
  }
}

}  // namespace

std::vector<std::uint8_t> serialize(const SamplerState& s) {
  std::vector<std::uint8_t> b;
  b.reserve(kStateBytes);
  put(b, kMagic, 4);
  put(b, kVersion, 4);
  put(b, s.seed, 8);
  put(b, s.step, 8);
  put(b, s.data_size, 8);
  put(b, s.data_hash, 8);
  put(b, static_cast<std::uint32_t>(s.global_batch), 4);
  put(b, static_cast<std::uint32_t>(s.seq_len), 4);
  return b;
}

Status deserialize(std::span<const std::uint8_t> b, SamplerState* out) {
  if (b.size() != kStateBytes)
    return {Result::invalid_argument, "sampler state: " + std::to_string(b.size()) + " bytes, want " +
                                          std::to_string(kStateBytes)};
  if (get(b, 0, 4) != kMagic) return {Result::invalid_argument, "sampler state: bad magic (not a sampler state)"};
  if (get(b, 4, 4) != kVersion)
    return {Result::invalid_argument, "sampler state: version " + std::to_string(get(b, 4, 4)) + ", want 1"};
  SamplerState s;
  s.seed = get(b, 8, 8);
  s.step = get(b, 16, 8);
  s.data_size = get(b, 24, 8);
  s.data_hash = get(b, 32, 8);
  s.global_batch = static_cast<std::int32_t>(get(b, 40, 4));
  s.seq_len = static_cast<std::int32_t>(get(b, 44, 4));
  *out = s;
  return {};
}

Status validate_shard(int global_batch, int seq_len, int rank, int world) {
  if (seq_len < 1) return {Result::invalid_argument, "data: sequence length " + std::to_string(seq_len) + " < 1"};
  if (global_batch < 1) return {Result::invalid_argument, "data: batch " + std::to_string(global_batch) + " < 1"};
  if (world < 1 || rank < 0 || rank >= world)
    return {Result::invalid_argument,
            "data: rank " + std::to_string(rank) + " outside a world of " + std::to_string(world)};
  if (global_batch % world != 0)
    return {Result::invalid_argument, "data: global batch " + std::to_string(global_batch) +
                                          " is not divisible by the " + std::to_string(world) +
                                          " ranks (every rank takes an equal share)"};
  return {};
}

Status BatchSampler::create(std::span<const std::uint8_t> data, int global_batch, int seq_len, int rank, int world,
                            std::uint64_t seed, BatchSampler* out) {
  if (Status s = validate_shard(global_batch, seq_len, rank, world); !s.ok()) return s;
  if (data.size() < static_cast<std::size_t>(seq_len) + 1)
    return {Result::invalid_argument, "data: " + std::to_string(data.size()) +
                                          " bytes of training data, need at least sequence length + 1 = " +
                                          std::to_string(seq_len + 1)};
  BatchSampler b;
  b.data_ = data;
  b.data_hash_ = fingerprint(data);
  b.global_batch_ = global_batch;
  b.local_batch_ = global_batch / world;
  b.first_ = rank * b.local_batch_;
  b.T_ = seq_len;
  b.seed_ = seed;
  *out = b;
  return {};
}

std::size_t BatchSampler::window_offset(std::uint64_t step, int i) const noexcept {
  const std::uint64_t choices = data_.size() - static_cast<std::size_t>(T_);  // starts 0 .. n - T - 1
  return static_cast<std::size_t>(uniform_below(hash_combine(seed_, step, static_cast<std::uint64_t>(i)), choices));
}

void BatchSampler::batch_at(std::uint64_t step, int* inputs, int* targets) const {
  for (int k = 0; k < local_batch_; ++k) {
    const std::size_t off = window_offset(step, first_ + k);
    const std::size_t row = static_cast<std::size_t>(k) * T_;
    fill(data_.data() + off, T_, inputs + row, targets + row);
  }
}

void BatchSampler::next(int* inputs, int* targets) {
  batch_at(step_, inputs, targets);
  ++step_;
}

SamplerState BatchSampler::state() const {
  SamplerState s;
  s.seed = seed_;
  s.step = step_;
  s.data_size = data_.size();
  s.data_hash = data_hash_;
  s.global_batch = global_batch_;
  s.seq_len = T_;
  return s;
}

Status BatchSampler::restore(const SamplerState& s) {
  if (s.data_size != data_.size() || s.data_hash != data_hash_)
    return {Result::invalid_argument, "sampler state: made for other training data (" +
                                          std::to_string(s.data_size) + " bytes, a different fingerprint)"};
  if (s.global_batch != global_batch_ || s.seq_len != T_)
    return {Result::invalid_argument, "sampler state: made for batch " + std::to_string(s.global_batch) +
                                          " x length " + std::to_string(s.seq_len) + ", this run uses " +
                                          std::to_string(global_batch_) + " x " + std::to_string(T_)};
  if (s.seed != seed_) return {Result::invalid_argument, "sampler state: made with another data seed"};
  step_ = s.step;
  return {};
}

int eval_batch_count(std::size_t val_size, int global_batch, int seq_len) noexcept {
  if (val_size < static_cast<std::size_t>(seq_len) + 1 || global_batch < 1 || seq_len < 1) return 0;
  const std::size_t windows = (val_size - 1) / static_cast<std::size_t>(seq_len);
  return static_cast<int>(windows / static_cast<std::size_t>(global_batch));
}

void eval_batch(std::span<const std::uint8_t> val, int j, int global_batch, int seq_len, int rank, int world,
                int* inputs, int* targets) {
  const int local = global_batch / world;
  for (int k = 0; k < local; ++k) {
    const std::size_t w = static_cast<std::size_t>(j) * global_batch + static_cast<std::size_t>(rank) * local + k;
    const std::size_t row = static_cast<std::size_t>(k) * seq_len;
    fill(val.data() + w * static_cast<std::size_t>(seq_len), seq_len, inputs + row, targets + row);
  }
}

}  // namespace cclz::train
