// An example user compressor, built as a shared module and loaded through
// CCLZ_COMPRESSOR_PLUGIN: "example_scale:factor=F" sends F * x as f32 and
// decodes by dividing by F (summable in f32). It shows the whole surface a
// plugin needs: a Compressor subclass, a make function, a descriptor array
// and the extern "C" entry point.
#include <cstring>

#include "cclz/compress.hpp"

namespace {

class ExampleScale final : public cclz::Compressor {
 public:
  ExampleScale(cclz::CompressorSpec spec, float factor) : Compressor(std::move(spec)), factor_(factor) {}
  cclz::Aggregation aggregation() const noexcept override { return cclz::Aggregation::summable; }
  bool supports_dtype(cclz::DataType dt) const noexcept override { return dt == cclz::DataType::f32; }

 protected:
  cclz::Status on_begin(cclz::CompressorState&, std::span<const std::byte> grad, cclz::Payload* out) const override {
    out->bytes.resize(grad.size());
    const std::size_t n = grad.size() / 4;
    for (std::size_t i = 0; i < n; ++i) {
      float v;
      std::memcpy(&v, grad.data() + 4 * i, 4);
      v *= factor_;
      std::memcpy(out->bytes.data() + 4 * i, &v, 4);
    }
    out->aggregation = cclz::Aggregation::summable;
    out->sum_dtype = cclz::DataType::f32;
    out->last = true;
    return {};
  }

  cclz::Status on_decode_add(const cclz::CompressorState& state, std::span<const std::byte> payload,
                             std::span<float> acc, float alpha) const override {
    if (payload.size() != state.desc().count * 4) return error("payload size does not match the tensor");
    for (std::size_t i = 0; i < acc.size(); ++i) {
      float v;
      std::memcpy(&v, payload.data() + 4 * i, 4);
      acc[i] += alpha * (v / factor_);
    }
    return {};
  }

 private:
  float factor_;
};

cclz::Status make_example_scale(const cclz::CompressorSpec& spec, std::unique_ptr<cclz::Compressor>* out) {
  double factor = 0;
  if (cclz::Status s = cclz::spec_get_double(spec, "factor", 2.0, &factor); !s.ok()) return s;
  if (factor == 0) return cclz::spec_error(spec, "factor must not be 0");
  *out = std::make_unique<ExampleScale>(spec, static_cast<float>(factor));
  return {};
}

const cclz::CompressorDesc kDescs[] = {
    {"example_scale", "sends factor * x as f32 (an example plugin)", "factor", make_example_scale},
};

}  // namespace

extern "C" const cclz::CompressorDesc* cclz_compressor_plugin_v1(std::size_t* count) {
  *count = sizeof kDescs / sizeof kDescs[0];
  return kDescs;
}
