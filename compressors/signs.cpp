// The 1-bit compressors behind sign and signum: one f32 scale for the
// tensor (the mean |x| of what is signed) and one sign bit per element
// (layout in quant.hpp). Gather-only: signs of different ranks do not add
// without decoding. Cost: one read of the input (signum: plus a
// read-modify-write of the momentum), n/8 bytes written; decode one read of
// the payload and one f32 read-modify-write.
#include "compressors/common.hpp"
#include "compressors/quant.hpp"

namespace cclz::compress {

namespace {

// Widen f16/bf16 this many elements at a time: a multiple of the kernels'
// f64 summing chunk, so the scale is the same as for the whole tensor at once.
constexpr std::size_t kPiece = 4096 * 4;

struct SignState final : CompressorState {
  SignState(const Compressor& owner, const TensorDesc& desc, bool momentum) : CompressorState(owner, desc) {
    if (momentum) m.assign(desc.count, 0.0f);
  }
  std::vector<float> xf;
  std::vector<float> m;  // signum's momentum

  void save_body(std::vector<std::byte>* out) const override { state_put(out, m.data(), m.size() * 4); }
  Status load_body(std::span<const std::byte> in) override {
    if (in.size() != m.size() * 4) {
      return owner().error("saved state body is " + std::to_string(in.size()) + " bytes, the momentum needs " +
                           std::to_string(m.size() * 4));
    }
    (void)state_get(&in, m.data(), m.size() * 4);
    return {};
  }
};

class Sign final : public Compressor {
 public:
  Sign(CompressorSpec spec, bool momentum, float beta) : Compressor(std::move(spec)), momentum_(momentum), beta_(beta) {}
  Aggregation aggregation() const noexcept override { return Aggregation::gather_only; }

 protected:
  Status on_make_state(const TensorDesc& desc, std::unique_ptr<CompressorState>* out) const override {
    *out = std::make_unique<SignState>(*this, desc, momentum_);
    return {};
  }

  Status on_begin(CompressorState& state, std::span<const std::byte> grad, Payload* out) const override {
    auto& st = static_cast<SignState&>(state);
    const TensorDesc& d = st.desc();
    const quant::Kernels& k = quant::best();
    out->bytes.resize(quant::sign_bytes(d.count));
    std::byte* bits = out->bytes.data() + 4;
    double sum = 0;
    if (d.dtype == DataType::f32) {
      const float* g = as_f32(grad).data();
      sum = momentum_ ? k.momentum_sign_pack(g, st.m.data(), d.count, beta_, bits) : k.sign_pack(g, d.count, bits);
    } else {
      st.xf.resize(std::min(kPiece, d.count));
      const std::size_t es = dtype_size(d.dtype);
      for (std::size_t at = 0; at < d.count; at += kPiece) {
        const std::size_t len = std::min(kPiece, d.count - at);
        load_f32(grad.subspan(at * es, len * es), d.dtype, std::span<float>(st.xf.data(), len));
        sum += momentum_ ? k.momentum_sign_pack(st.xf.data(), st.m.data() + at, len, beta_, bits + at / 8)
                         : k.sign_pack(st.xf.data(), len, bits + at / 8);
      }
    }
    quant::write_scale(out->bytes.data(), d.count == 0 ? 0.0f : static_cast<float>(sum / static_cast<double>(d.count)));
    out->aggregation = Aggregation::gather_only;
    out->last = true;
    return {};
  }

  Status on_decode_add(const CompressorState& state, std::span<const std::byte> payload, std::span<float> acc,
                       float alpha) const override {
    const std::size_t n = state.desc().count;
    if (payload.size() != quant::sign_bytes(n)) {
      return error("payload is " + std::to_string(payload.size()) + " bytes, " + std::to_string(n) +
                   " sign bits and a scale need " + std::to_string(quant::sign_bytes(n)));
    }
    quant::best().sign_decode_add(payload.data() + 4, n, alpha * quant::read_scale(payload.data()), acc.data());
    return {};
  }

 private:
  bool momentum_;
  float beta_;
};

}  // namespace

namespace quant {

Status make_sign(const CompressorSpec& spec, bool momentum, std::unique_ptr<Compressor>* out) {
  double beta = 0;
  if (momentum) {
    if (Status s = spec_get_double(spec, "beta", 0.9, &beta); !s.ok()) return s;
    if (!(beta >= 0.0 && beta < 1.0)) return spec_error(spec, "beta must be in [0, 1), got " + *spec.find("beta"));
  }
  *out = std::make_unique<Sign>(spec, momentum, static_cast<float>(beta));
  return {};
}

}  // namespace quant

}  // namespace cclz::compress
