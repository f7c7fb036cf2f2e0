// The re-quantizable block quantizers behind qsgd, terngrad, int8 and int4:
// the tensor is cut into blocks of `block_elems()` elements, each encoded
// alone with its own scale (layouts and kernels in quant.hpp), so a ring
// hop or a chunk owner can decode a chunk, add, and encode the sum again
// with encode_chunk. Cost: one read of the input and one write of the
// payload per encode (f16/bf16 are widened 8192 elements at a time on the
// stack-sized scratch of the state), one payload read and one f32
// read-modify-write per decode.
//
// Randomness (qsgd, terngrad, int8/int4 with stochastic=1): the counter-based
// draw of quant.hpp, keyed by (seed, step, tensor size) and each block's
// index and scale: reruns with the same seed and data draw the same
// numbers; each step, each block and each partial sum draws afresh.
#include "compressors/common.hpp"
#include "compressors/quant.hpp"

namespace cclz::compress {

namespace {

using quant::Norm;

struct BlockState final : CompressorState {
  using CompressorState::CompressorState;
  std::vector<float> xf;  // f16/bf16 input widened, one piece at a time
};

class BlockQuantizer : public Compressor {
 public:
  BlockQuantizer(CompressorSpec spec, std::size_t block, std::uint64_t seed)
      : Compressor(std::move(spec)), block_(block), seed_(seed) {}

  Aggregation aggregation() const noexcept override { return Aggregation::requantizable; }
  std::size_t block_elems() const noexcept override { return block_; }
  std::size_t payload_bytes(std::size_t elems) const noexcept override {
    return quant::blocked_bytes(elems, block_, [this](std::size_t n) { return block_bytes(n); });
  }

  Status encode_chunk(const CompressorState& state, std::span<const float> x, std::size_t first_elem,
                      std::span<std::byte> out) const override {
    if (Status s = check_chunk(state, x.size(), first_elem, out.size(), "encode_chunk"); !s.ok()) return s;
    encode(state, x, first_elem, out.data());
    return {};
  }

  Status decode_chunk_add(const CompressorState& state, std::span<const std::byte> chunk, std::size_t first_elem,
                          std::span<float> acc) const override {
    if (Status s = check_chunk(state, acc.size(), first_elem, chunk.size(), "decode_chunk_add"); !s.ok()) return s;
    decode_add_blocks(chunk.data(), acc.size(), 1.0f, acc.data());
    return {};
  }

 protected:
  // One block of n (1 <= n <= block_) elements.
  virtual std::size_t block_bytes(std::size_t n) const noexcept = 0;
  virtual void encode_block(const float* x, std::size_t n, std::uint64_t stream, std::uint64_t block_index,
                            std::byte* out) const noexcept = 0;
  virtual void decode_block_add(const std::byte* in, std::size_t n, float alpha, float* acc) const noexcept = 0;

  Status on_make_state(const TensorDesc& desc, std::unique_ptr<CompressorState>* out) const override {
    *out = std::make_unique<BlockState>(*this, desc);
    return {};
  }

  Status on_begin(CompressorState& state, std::span<const std::byte> grad, Payload* out) const override {
    auto& st = static_cast<BlockState&>(state);
    const TensorDesc& d = st.desc();
    out->bytes.resize(payload_bytes(d.count));
    if (d.dtype == DataType::f32) {
      encode(st, as_f32(grad), 0, out->bytes.data());
    } else {
      // Widen a whole number of blocks at a time (chunk payloads concatenate).
      const std::size_t piece = block_ * std::max<std::size_t>(1, 8192 / block_);
      st.xf.resize(std::min(piece, d.count));
      const std::size_t es = dtype_size(d.dtype);
      for (std::size_t at = 0; at < d.count; at += piece) {
        const std::size_t len = std::min(piece, d.count - at);
        std::span<float> x(st.xf.data(), len);
        load_f32(grad.subspan(at * es, len * es), d.dtype, x);
        encode(st, x, at, out->bytes.data() + payload_bytes(at));
      }
    }
    out->aggregation = Aggregation::requantizable;
    out->last = true;
    return {};
  }

  Status on_decode_add(const CompressorState& state, std::span<const std::byte> payload, std::span<float> acc,
                       float alpha) const override {
    const std::size_t want = payload_bytes(state.desc().count);
    if (payload.size() != want) {
      return error("payload is " + std::to_string(payload.size()) + " bytes, " + std::to_string(state.desc().count) +
                   " elements in blocks of " + std::to_string(block_) + " need " + std::to_string(want));
    }
    decode_add_blocks(payload.data(), acc.size(), alpha, acc.data());
    return {};
  }

 private:
  Status check_chunk(const CompressorState& state, std::size_t elems, std::size_t first_elem, std::size_t bytes,
                     const char* fn) const {
    if (&state.owner() != this) {
      return error(std::string(fn) + ": the state was made by compressor '" + state.owner().spec().text +
                   "', not this one");
    }
    const std::size_t count = state.desc().count;
    if (first_elem % block_ != 0 || first_elem > count || elems > count - first_elem ||
        (elems % block_ != 0 && first_elem + elems != count)) {
      return error(std::string(fn) + ": chunk [" + std::to_string(first_elem) + ", " +
                   std::to_string(first_elem + elems) + ") of a " + std::to_string(count) +
                   "-element tensor is not on block boundaries (block " + std::to_string(block_) + ")");
    }
    if (bytes != payload_bytes(elems)) {
      return error(std::string(fn) + ": chunk payload is " + std::to_string(bytes) + " bytes, " +
                   std::to_string(elems) + " elements need " + std::to_string(payload_bytes(elems)));
    }
    return {};
  }

  void encode(const CompressorState& state, std::span<const float> x, std::size_t first_elem, std::byte* out) const {
    const std::uint64_t stream = mix_seed(seed_, state.step(), state.desc().count);
    const std::uint64_t first_block = first_elem / block_;
    for (std::size_t at = 0, b = 0; at < x.size(); at += block_, ++b) {
      const std::size_t n = std::min(block_, x.size() - at);
      encode_block(x.data() + at, n, stream, first_block + b, out);
      out += block_bytes(n);
    }
  }

  void decode_add_blocks(const std::byte* in, std::size_t elems, float alpha, float* acc) const {
    for (std::size_t at = 0; at < elems; at += block_) {
      const std::size_t n = std::min(block_, elems - at);
      decode_block_add(in, n, alpha, acc + at);
      in += block_bytes(n);
    }
  }

  std::size_t block_;
  std::uint64_t seed_;
};

// qsgd / terngrad: stochastic levels of |x| / scale per bucket.
class Levels final : public BlockQuantizer {
 public:
  Levels(CompressorSpec spec, Norm norm, int bits, std::size_t bucket, std::uint64_t seed)
      : BlockQuantizer(std::move(spec), bucket, seed), norm_(norm), bits_(bits) {}

 protected:
  std::size_t block_bytes(std::size_t n) const noexcept override { return quant::level_block_bytes(bits_, n); }
  void encode_block(const float* x, std::size_t n, std::uint64_t stream, std::uint64_t block_index,
                    std::byte* out) const noexcept override {
    quant::best().level_encode(x, n, bits_, norm_, stream, block_index, out);
  }
  void decode_block_add(const std::byte* in, std::size_t n, float alpha, float* acc) const noexcept override {
    quant::best().level_decode_add(in, n, bits_, alpha, acc);
  }

 private:
  Norm norm_;
  int bits_;
};

// int8 / int4: absmax scale per block, round to nearest or stochastic.
class Absmax final : public BlockQuantizer {
 public:
  Absmax(CompressorSpec spec, int bits, std::size_t block, bool stochastic, std::uint64_t seed)
      : BlockQuantizer(std::move(spec), block, seed), bits_(bits), stochastic_(stochastic) {}

 protected:
  std::size_t block_bytes(std::size_t n) const noexcept override { return quant::absmax_block_bytes(bits_, n); }
  void encode_block(const float* x, std::size_t n, std::uint64_t stream, std::uint64_t block_index,
                    std::byte* out) const noexcept override {
    quant::best().absmax_encode(x, n, bits_, stochastic_, stream, block_index, out);
  }
  void decode_block_add(const std::byte* in, std::size_t n, float alpha, float* acc) const noexcept override {
    quant::best().absmax_decode_add(in, n, bits_, alpha, acc);
  }

 private:
  int bits_;
  bool stochastic_;
};

constexpr std::int64_t kMaxBlock = std::int64_t{1} << 24;

Status get_block(const CompressorSpec& spec, const char* key, std::int64_t def, std::size_t* out) {
  std::int64_t v = 0;
  if (Status s = spec_get_int(spec, key, def, &v); !s.ok()) return s;
  if (v < 1 || v > kMaxBlock) {
    return spec_error(spec, std::string(key) + "=" + std::to_string(v) + " is out of range [1, " +
                                std::to_string(kMaxBlock) + "]");
  }
  *out = static_cast<std::size_t>(v);
  return {};
}

Status get_seed(const CompressorSpec& spec, std::uint64_t* out) {
  std::int64_t seed = 0;
  if (Status s = spec_get_int(spec, "seed", 0, &seed); !s.ok()) return s;
  *out = static_cast<std::uint64_t>(seed);
  return {};
}

}  // namespace

namespace quant {

Status make_levels(const CompressorSpec& spec, Norm norm, std::unique_ptr<Compressor>* out) {
  std::int64_t bits = 1;
  if (norm == Norm::l2) {
    if (Status s = spec_get_int(spec, "bits", 4, &bits); !s.ok()) return s;
    if (bits < 1 || bits > 8) return spec_error(spec, "bits=" + std::to_string(bits) + " is out of range [1, 8]");
  }
  std::size_t bucket = 0;
  std::uint64_t seed = 0;
  if (Status s = get_block(spec, "bucket", 512, &bucket); !s.ok()) return s;
  if (Status s = get_seed(spec, &seed); !s.ok()) return s;
  *out = std::make_unique<Levels>(spec, norm, static_cast<int>(bits), bucket, seed);
  return {};
}

Status make_absmax(const CompressorSpec& spec, int bits, std::unique_ptr<Compressor>* out) {
  std::size_t block = 0;
  bool stochastic = false;
  std::uint64_t seed = 0;
  if (Status s = get_block(spec, "block", 256, &block); !s.ok()) return s;
  if (Status s = spec_get_bool(spec, "stochastic", false, &stochastic); !s.ok()) return s;
  if (Status s = get_seed(spec, &seed); !s.ok()) return s;
  *out = std::make_unique<Absmax>(spec, bits, block, stochastic, seed);
  return {};
}

}  // namespace quant

}  // namespace cclz::compress
