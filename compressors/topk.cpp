// topk:ratio=R[,approx=1][,seed=S]: the k = ceil(R n) coordinates of largest
// magnitude (Aji & Heafield 2017; Stich et al. 2018 with error feedback).
// Exact: radix select, three reads of the tensor (select.cpp). approx=1: the
// threshold comes from a random sample as in Deep Gradient Compression (Lin
// et al. 2018), and the count is guaranteed to lie in [ceil(0.8 k),
// floor(1.3 k)] (outside it the exact select runs instead); one read when
// the estimate holds. Payload: sparse (common.hpp), values in the input
// dtype, 4 + 2|4 bytes per kept coordinate; gather-only.
#include "compressors/common.hpp"

namespace cclz::compress {

namespace {

struct TopkState final : CompressorState {
  using CompressorState::CompressorState;
  SelectScratch sel;
  std::vector<float> xf;  // f16/bf16 input widened
  std::vector<std::uint32_t> idx;
};

class Topk final : public Compressor {
 public:
  Topk(CompressorSpec spec, double ratio, bool approx, std::uint64_t seed)
      : Compressor(std::move(spec)), ratio_(ratio), approx_(approx), seed_(seed) {}
  Aggregation aggregation() const noexcept override { return Aggregation::gather_only; }

 protected:
  Status on_make_state(const TensorDesc& desc, std::unique_ptr<CompressorState>* out) const override {
    if (Status s = check_u32_count(*this, desc); !s.ok()) return s;
    *out = std::make_unique<TopkState>(*this, desc);
    return {};
  }

  Status on_begin(CompressorState& state, std::span<const std::byte> grad, Payload* out) const override {
    auto& st = static_cast<TopkState&>(state);
    const TensorDesc& d = st.desc();
    const std::span<const float> x = f32_view(grad, d.dtype, d.count, st.xf);
    const std::size_t k = count_for_ratio(ratio_, d.count);
    if (approx_) {
      topk_sampled(x, k, mix_seed(seed_, st.step(), 0), st.sel, &st.idx);
    } else {
      topk_exact(x, k, st.sel, &st.idx);
    }
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
  double ratio_;
  bool approx_;
  std::uint64_t seed_;
};

Status make(const CompressorSpec& spec, std::unique_ptr<Compressor>* out) {
  double ratio = 0;
  bool approx = false;
  std::int64_t seed = 0;
  if (Status s = get_ratio(spec, 0.01, &ratio); !s.ok()) return s;
  if (Status s = spec_get_bool(spec, "approx", false, &approx); !s.ok()) return s;
  if (Status s = spec_get_int(spec, "seed", 0, &seed); !s.ok()) return s;
  *out = std::make_unique<Topk>(spec, ratio, approx, static_cast<std::uint64_t>(seed));
  return {};
}

}  // namespace

extern const CompressorDesc compressor_topk = {
    "topk", "largest-magnitude k = ceil(ratio n) coordinates; approx=1 samples the threshold", "ratio,approx,seed",
    make};

}  // namespace cclz::compress
