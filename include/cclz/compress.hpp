// Gradient compressors: the public C++ interface (built-in and user ones).
//
// A compressor is made from a spec string, is immutable afterwards (one may
// serve many tensors and threads) and keeps everything that changes from
// step to step in a per-tensor CompressorState (error-feedback residual,
// PowerSGD's Q, DGC's momentum, the step counter). A state is used by one
// thread at a time.
//
// Spec grammar
//   spec      := [ "auto:" ] [ "ef+" | "ef21+" ] name [ ":" params ]
//   params    := key "=" value { "," key "=" value }
//   name, key := [a-z0-9_]+        value := any characters but ',' and '='
// e.g. "topk:ratio=0.01", "ef+topk:ratio=0.01,approx=1", "auto:ef21+randk:ratio=0.1".
// "ef+" and "ef21+" wrap the named compressor in error feedback (at most one
// decorator). "auto:" sets CompressorSpec::auto_select for the compressed
// collectives (compress a tensor only where it pays off); the compressor
// itself is the same. Errors name the full spec and the problem: unknown
// name, unknown or repeated key, malformed or out-of-range value.
//
// Round protocol (what a driver, e.g. a compressed all-reduce, runs for one
// tensor and one step; every rank runs it with the same compressor spec and
// a state made for the same TensorDesc):
//
//   Payload p;
//   c.begin(state, grad, &p);                 // round 0: encode this rank's gradient
//   for (;;) {
//     Aggregate a = aggregate(p);             // across ranks, as p.aggregation says
//     if (p.last) { c.finish(state, a, out); break; }   // out = sum over ranks
//     c.next(state, a, &p);                   // uses the aggregate, makes the next round's payload
//   }
//
// aggregate(p) by p.aggregation:
//   summable       p.bytes is an array of p.sum_dtype (no header), the same
//                  size on every rank; all-reduce it with op sum in that
//                  dtype (Comm::all_reduce). Aggregate = { the summed bytes }.
//   requantizable  the payload is block-separable (see block_elems()): split
//                  it into chunks on block boundaries, reduce each chunk by
//                  decode_chunk_add + add + encode_chunk (ring, or
//                  scatter-reduce-allgather), and put the re-encoded chunks
//                  back in order. Aggregate = { the concatenated re-encoded sum }.
//   gather_only    all-gather the payloads (their sizes may differ by rank).
//                  Aggregate = { rank 0's payload, rank 1's, ... } in rank order.
// Single-round compressors set p.last in begin() and never see next().
// finish() writes the sum over ranks of what every rank contributed (for
// error feedback: of the compressed values) into a dense tensor of the
// state's dtype; gather-only payloads are decoded and added in rank order
// so every rank gets bitwise the same result. Every round of one step sees
// the same state.step(); begin() is what advances it.
//
// Wire accounting: Payload::bytes.size() per round; CompressorState::wire()
// keeps this rank's payload bytes and the dense equivalent per step and in
// total.
//
// User compressors: derive from Compressor (and, for per-tensor data, from
// CompressorState), export a CompressorDesc, and either add it to the
// registry (compressors/registry.cpp, one line) or build a shared object
// that exports
//   extern "C" const cclz::CompressorDesc* cclz_compressor_plugin_v1(std::size_t* count);
// returning an array of *count descriptors that live as long as the process.
// Name it in CCLZ_COMPRESSOR_PLUGIN (one path; loaded with dlopen the first
// time make_compressor runs with it set, never unloaded) or load it with
// load_compressor_plugin(). Its names must not clash with built-in ones. It
// must be built with the same compiler and cclz headers as the program.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cclz/types.hpp"

namespace cclz {

class Compressor;

// ---------------------------------------------------------------- spec

enum class Feedback : int {
  none = 0,
  ef = 1,    // "ef+":   e <- (e + g) - C(e + g)
  ef21 = 2,  // "ef21+": EF21 (Richtarik et al. 2021)
};

struct CompressorSpec {
  std::string text;  // the spec as written; quoted by every error message
  bool auto_select = false;
  Feedback feedback = Feedback::none;
  std::string name;  // "topk"
  std::vector<std::pair<std::string, std::string>> params;  // in written order, keys unique

  // The value of key, or nullptr.
  const std::string* find(std::string_view key) const noexcept;
};

// Parses the grammar only (names and keys are not checked against the registry).
Status parse_compressor_spec(std::string_view text, CompressorSpec* out);

// invalid_argument "compressor spec '<text>': <problem>".
Status spec_error(const CompressorSpec& spec, std::string_view problem);
// Typed parameter readers for compressor authors: absent -> def; malformed
// -> spec_error naming the key and the value. Range checks are the caller's.
Status spec_get_double(const CompressorSpec& spec, std::string_view key, double def, double* out);
Status spec_get_int(const CompressorSpec& spec, std::string_view key, std::int64_t def, std::int64_t* out);
Status spec_get_bool(const CompressorSpec& spec, std::string_view key, bool def, bool* out);  // 0/1/true/false

// ---------------------------------------------------------------- tensors and payloads

struct TensorDesc {
  std::size_t count = 0;
  DataType dtype = DataType::f32;
  // Optional 2-D shape (PowerSGD): both 0 (none) or rows * cols == count.
  std::size_t rows = 0;
  std::size_t cols = 0;

  std::size_t dense_bytes() const noexcept { return count * dtype_size(dtype); }
};

enum class Aggregation : int {
  summable = 0,       // plain all-reduce (sum) of the payload in Payload::sum_dtype
  requantizable = 1,  // decode, add, re-encode (block-separable payloads)
  gather_only = 2,    // all-gather payloads, decode and add locally in rank order
};
const char* aggregation_name(Aggregation a) noexcept;  // "summable", ...

// One round's output of one rank.
struct Payload {
  std::vector<std::byte> bytes;  // reused across calls: pass the same Payload each step
  Aggregation aggregation = Aggregation::gather_only;
  DataType sum_dtype = DataType::f32;  // summable only: element type for the all-reduce
  bool last = true;                    // the final round of this step
  int round = 0;                       // 0 for begin(), then 1, 2, ...
};

// What the driver hands back after aggregating a round (see the protocol).
using Aggregate = std::span<const std::span<const std::byte>>;

// Bytes of this rank's payloads (all rounds) against the dense tensor.
struct WireStats {
  std::uint64_t last_payload_bytes = 0;  // the most recent step
  std::uint64_t last_dense_bytes = 0;
  std::uint64_t total_payload_bytes = 0;  // since the state was made (not saved)
  std::uint64_t total_dense_bytes = 0;
  std::uint64_t steps = 0;
};

// ---------------------------------------------------------------- state

// Per-tensor state. Compressors with data of their own derive from it and
// override save_body/load_body. Saved form (host byte order): "CZS1",
// compressor name, TensorDesc, step, then the body; load() checks that the
// name and TensorDesc match the state it is loaded into.
class CompressorState {
 public:
  CompressorState(const Compressor& owner, const TensorDesc& desc);
  virtual ~CompressorState();
  CompressorState(const CompressorState&) = delete;
  CompressorState& operator=(const CompressorState&) = delete;

  const TensorDesc& desc() const noexcept { return desc_; }
  const Compressor& owner() const noexcept { return *owner_; }
  // Number of begin() calls so far (so 1 during the first step's rounds).
  std::uint64_t step() const noexcept { return step_; }
  const WireStats& wire() const noexcept { return wire_; }

  // Appends the saved form to *out.
  Status save(std::vector<std::byte>* out) const;
  Status load(std::span<const std::byte> in);

 protected:
  virtual void save_body(std::vector<std::byte>* out) const;
  // in is exactly the body that save_body wrote.
  virtual Status load_body(std::span<const std::byte> in);

 private:
  friend class Compressor;
  const Compressor* owner_;
  TensorDesc desc_;
  std::uint64_t step_ = 0;
  int round_ = -1;     // the current round of the open step; -1: none open
  bool last_ = false;  // the current round is the last
  WireStats wire_;
  std::vector<float> finish_sum_;  // the default finish's f32 sum for f16/bf16 tensors
};

// Helpers for save_body/load_body: little records of raw bytes.
void state_put(std::vector<std::byte>* out, const void* data, std::size_t bytes);
// Reads `bytes` from *in into data and advances *in; false when too short.
bool state_get(std::span<const std::byte>* in, void* data, std::size_t bytes);

// ---------------------------------------------------------------- compressor

class Compressor {
 public:
  explicit Compressor(CompressorSpec spec) : spec_(std::move(spec)) {}
  virtual ~Compressor();
  Compressor(const Compressor&) = delete;
  Compressor& operator=(const Compressor&) = delete;

  const CompressorSpec& spec() const noexcept { return spec_; }
  // "topk", "ef+topk": what a saved state records.
  virtual std::string name() const;
  virtual Aggregation aggregation() const noexcept = 0;
  // More than one round per step (PowerSGD); ef+ needs a single-round compressor.
  virtual bool multi_round() const noexcept { return false; }
  // Default: f32, f16, bf16.
  virtual bool supports_dtype(DataType dt) const noexcept;
  // spec_error(spec(), problem): invalid_argument "compressor spec '<text>': <problem>"
  Status error(std::string_view problem) const;

  // A fresh state for one tensor (zero residuals, step 0). Errors: a dtype
  // the compressor does not take, a bad shape, a count it cannot index.
  Status make_state(const TensorDesc& desc, std::unique_ptr<CompressorState>* out) const;

  // The round protocol (see the top of this file). grad and out hold
  // desc().count elements of desc().dtype.
  Status begin(CompressorState& state, std::span<const std::byte> grad, Payload* out) const;
  Status next(CompressorState& state, Aggregate agg, Payload* out) const;
  // out = alpha * (sum over ranks), overwritten, in the state's dtype.
  Status finish(CompressorState& state, Aggregate agg, std::span<std::byte> out, float alpha = 1.0f) const;

  // One payload of the final round (this rank's or another's): acc +=
  // alpha * decoded, in f32 (decode_add), or out = decoded in the state's
  // dtype (decode). Decoding reads the state (random-k's step, PowerSGD's P)
  // but does not change it.
  Status decode_add(const CompressorState& state, std::span<const std::byte> payload, std::span<float> acc,
                    float alpha = 1.0f) const;
  Status decode(const CompressorState& state, std::span<const std::byte> payload, std::span<std::byte> out) const;

  // Re-quantizable compressors only. The payload of n elements is a run of
  // blocks of block_elems() elements (the last one possibly partial); the
  // payload of elements [a, b), a a multiple of block_elems() and b one too
  // or n, is bytes [payload_bytes(a), payload_bytes(b)) of the whole
  // payload, and encode_chunk of those elements gives such bytes.
  // first_elem (the chunk's offset in the tensor) lets stochastic rounding
  // draw independent numbers per chunk.
  virtual std::size_t block_elems() const noexcept { return 0; }
  virtual std::size_t payload_bytes(std::size_t elems) const noexcept;
  virtual Status encode_chunk(const CompressorState& state, std::span<const float> x, std::size_t first_elem,
                              std::span<std::byte> out) const;
  virtual Status decode_chunk_add(const CompressorState& state, std::span<const std::byte> chunk,
                                  std::size_t first_elem, std::span<float> acc) const;

 protected:
  // Implementations. The public functions have already checked that the
  // state is this compressor's, buffer sizes match desc(), and (begin)
  // advanced state.step(); they set Payload::round and the wire counters.
  // on_begin/on_next set bytes, aggregation, sum_dtype and last.
  virtual Status on_make_state(const TensorDesc& desc, std::unique_ptr<CompressorState>* out) const;
  virtual Status on_begin(CompressorState& state, std::span<const std::byte> grad, Payload* out) const = 0;
  virtual Status on_next(CompressorState& state, Aggregate agg, Payload* out) const;  // default: error
  // Default: zero an f32 sum, decode_add every aggregated payload in order,
  // scale by alpha, convert to the state's dtype.
  virtual Status on_finish(CompressorState& state, Aggregate agg, std::span<std::byte> out, float alpha) const;
  // Must check the payload (size, indices in range) and fail, not crash, on a bad one.
  virtual Status on_decode_add(const CompressorState& state, std::span<const std::byte> payload,
                               std::span<float> acc, float alpha) const = 0;
  // Default: decode_add into zeros, convert.
  virtual Status on_decode(const CompressorState& state, std::span<const std::byte> payload,
                           std::span<std::byte> out) const;

 private:
  Status check_state(const CompressorState& state, const char* fn) const;
  Status check_size(const CompressorState& state, std::size_t bytes, std::size_t elem, const char* what) const;
  CompressorSpec spec_;
};

// ---------------------------------------------------------------- registry

struct CompressorDesc {
  const char* name;         // "topk"
  const char* description;  // one line
  const char* keys;         // accepted keys, comma-separated ("ratio,approx,seed"); "" for none
  // Builds the compressor; spec.feedback is none (decorators are applied
  // around it) and every key is one of `keys`.
  Status (*make)(const CompressorSpec& spec, std::unique_ptr<Compressor>* out);
};

// The entry point a plugin exports (see the top of this file).
inline constexpr const char* kCompressorPluginSymbol = "cclz_compressor_plugin_v1";
using CompressorPluginFn = const CompressorDesc* (*)(std::size_t* count);

// Built-in descriptors, then those of loaded plugins.
std::vector<const CompressorDesc*> compressor_descs();
// Loads CCLZ_COMPRESSOR_PLUGIN if set (and not loaded yet), then builds the
// compressor (with its ef+/ef21+ decorator) for spec.
Status make_compressor(std::string_view spec, std::unique_ptr<Compressor>* out);
// dlopen(path) and register its descriptors; loading the same path twice is a no-op.
Status load_compressor_plugin(const std::string& path);

}  // namespace cclz
