// The cast compressors: none (the input as it is), fp16 and bf16. The
// payload is the tensor in the wire dtype, an array with no header, summable
// by a plain all-reduce in that dtype (cclz's f16/bf16 reduction adds in f32
// and rounds once per hop). Cost: one pass each way; 2 bytes per element on
// the wire for fp16/bf16.
#include "compressors/common.hpp"

namespace cclz::compress {

namespace {

class CastCompressor final : public Compressor {
 public:
  CastCompressor(CompressorSpec spec, CastTo to) : Compressor(std::move(spec)), to_(to) {}
  Aggregation aggregation() const noexcept override { return Aggregation::summable; }

 protected:
  DataType wire(DataType in) const noexcept {
    switch (to_) {
      case CastTo::f16: return DataType::f16;
      case CastTo::bf16: return DataType::bf16;
      case CastTo::same: break;
    }
    return in;
  }

  Status on_begin(CompressorState& state, std::span<const std::byte> grad, Payload* out) const override {
    const TensorDesc& d = state.desc();
    const DataType w = wire(d.dtype);
    out->bytes.resize(d.count * dtype_size(w));
    convert(grad, d.dtype, out->bytes, w, d.count);
    out->aggregation = Aggregation::summable;
    out->sum_dtype = w;
    out->last = true;
    return {};
  }

  Status check(const TensorDesc& d, std::span<const std::byte> payload) const {
    const DataType w = wire(d.dtype);
    if (payload.size() != d.count * dtype_size(w)) {
      return error("payload is " + std::to_string(payload.size()) + " bytes, " + std::to_string(d.count) + " " +
                   dtype_name(w) + " need " + std::to_string(d.count * dtype_size(w)));
    }
    return {};
  }

  Status on_decode_add(const CompressorState& state, std::span<const std::byte> payload, std::span<float> acc,
                       float alpha) const override {
    if (Status s = check(state.desc(), payload); !s.ok()) return s;
    add_scaled(payload, wire(state.desc().dtype), acc, alpha);
    return {};
  }

  Status on_decode(const CompressorState& state, std::span<const std::byte> payload,
                   std::span<std::byte> out) const override {
    const TensorDesc& d = state.desc();
    if (Status s = check(d, payload); !s.ok()) return s;
    convert(payload, wire(d.dtype), out, d.dtype, d.count);
    return {};
  }

 private:
  CastTo to_;
};

}  // namespace

Status make_cast(const CompressorSpec& spec, CastTo to, std::unique_ptr<Compressor>* out) {
  *out = std::make_unique<CastCompressor>(spec, to);
  return {};
}

}  // namespace cclz::compress
