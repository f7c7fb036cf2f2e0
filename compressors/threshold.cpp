// threshold:tau=T: every coordinate with |g| >= T (Strom 2015), NaNs too.
// One read of the tensor. The count depends on the data, so payload sizes
// differ by rank and step. Payload: sparse (common.hpp), values in the input
// dtype; gather-only.
#include <cmath>

#include "compressors/common.hpp"

namespace cclz::compress {

namespace {

struct ThresholdState final : CompressorState {
  using CompressorState::CompressorState;
  std::vector<float> xf;
  std::vector<std::uint32_t> idx;
};

class Threshold final : public Compressor {
 public:
  Threshold(CompressorSpec spec, float tau) : Compressor(std::move(spec)), tau_(tau) {}
  Aggregation aggregation() const noexcept override { return Aggregation::gather_only; }

 protected:
  Status on_make_state(const TensorDesc& desc, std::unique_ptr<CompressorState>* out) const override {
    if (Status s = check_u32_count(*this, desc); !s.ok()) return s;
    *out = std::make_unique<ThresholdState>(*this, desc);
    return {};
  }

  Status on_begin(CompressorState& state, std::span<const std::byte> grad, Payload* out) const override {
    auto& st = static_cast<ThresholdState&>(state);
    const TensorDesc& d = st.desc();
    const std::span<const float> x = f32_view(grad, d.dtype, d.count, st.xf);
    select_at_least(x, tau_, &st.idx);
    sparse_write(st.idx, grad, d.dtype, &out->bytes);
    out->aggregation = Aggregation::gather_only;
    out->last = true;
    return {};
  }

  Status on_decode_add(const CompressorState& state, std::span<const std::byte> payload, std::span<float> acc,
                       float alpha) const override {
    return sparse_decode_add(*this, payload, state.desc().dtype, acc, alpha);
  }

 private:
  float tau_;
};

Status make(const CompressorSpec& spec, std::unique_ptr<Compressor>* out) {
  if (spec.find("tau") == nullptr) return spec_error(spec, "threshold needs tau (keep |g| >= tau)");
  double tau = 0;
  if (Status s = spec_get_double(spec, "tau", 0, &tau); !s.ok()) return s;
  if (!(tau > 0) || tau > 3.4e38) return spec_error(spec, "tau must be > 0 and a finite f32, got " + *spec.find("tau"));
  *out = std::make_unique<Threshold>(spec, static_cast<float>(tau));
  return {};
}

}  // namespace

extern const CompressorDesc compressor_threshold = {"threshold", "every coordinate with |g| >= tau", "tau", make};

}  // namespace cclz::compress
