// dgc:ratio=R[,momentum=M][,clip=C][,warmup=W][,seed=S]: Deep Gradient
// Compression (Lin et al. 2018). Per step, on each rank:
//   g <- g * min(1, C / ||g||_2)        local gradient clipping (C = 0: off;
//                                       the paper uses the global bound / sqrt(ranks))
//   u <- M u + g;  v <- v + u           momentum correction (M default 0.9)
//   send v at the k largest |v|, k = ceil(density(step) n), sampled threshold,
//   count within [ceil(0.8 k), floor(1.3 k)] (select.cpp)
//   v, u <- 0 where sent                momentum factor masking
// The sum over ranks of what is sent is the update itself: apply it with
// plain SGD (the momentum already happened here).
// Warm-up (step counted from 1, W default 1000): steps 1..W are four equal
// stages with density 25%, 6.25%, 1.5625%, 0.4% (never below R), then R
// (R default 0.001, the paper's 99.9% sparsity). Stage s (0-based) of step t
// is floor((t - 1) * 4 / W).
// Payload: sparse (common.hpp) with f32 values (v is f32 whatever the input);
// gather-only. State: u and v (f32, saved). Cost: clipping and momentum one
// pass each, selection one more when the sampled threshold holds.
#include <cmath>

#include "compressors/common.hpp"

namespace cclz::compress {

double dgc_density(std::uint64_t step, std::int64_t warmup, double ratio) noexcept {
  static constexpr double kStages[4] = {0.25, 0.0625, 0.015625, 0.004};
  if (warmup <= 0 || step == 0 || step > static_cast<std::uint64_t>(warmup)) return ratio;
  const std::uint64_t stage = (step - 1) * 4 / static_cast<std::uint64_t>(warmup);
  return std::max(kStages[stage], ratio);
}

namespace {

struct DgcState final : CompressorState {
  using CompressorState::CompressorState;
  std::vector<float> u, v, xf;
  SelectScratch sel;
  std::vector<std::uint32_t> idx;

  void save_body(std::vector<std::byte>* out) const override {
    state_put(out, u.data(), u.size() * 4);
    state_put(out, v.data(), v.size() * 4);
  }
  Status load_body(std::span<const std::byte> in) override {
    if (in.size() != 8 * desc().count) {
      return owner().error("saved dgc state body is " + std::to_string(in.size()) + " bytes, expected " +
                           std::to_string(8 * desc().count) + " (u and v)");
    }
    (void)state_get(&in, u.data(), u.size() * 4);
    (void)state_get(&in, v.data(), v.size() * 4);
    return {};
  }
};

class Dgc final : public Compressor {
 public:
  Dgc(CompressorSpec spec, double ratio, float momentum, double clip, std::int64_t warmup, std::uint64_t seed)
      : Compressor(std::move(spec)), ratio_(ratio), momentum_(momentum), clip_(clip), warmup_(warmup), seed_(seed) {}
  Aggregation aggregation() const noexcept override { return Aggregation::gather_only; }

 protected:
  Status on_make_state(const TensorDesc& desc, std::unique_ptr<CompressorState>* out) const override {
    if (Status s = check_u32_count(*this, desc); !s.ok()) return s;
    auto st = std::make_unique<DgcState>(*this, desc);
    st->u.assign(desc.count, 0.0f);
    st->v.assign(desc.count, 0.0f);
    *out = std::move(st);
    return {};
  }

  Status on_begin(CompressorState& state, std::span<const std::byte> grad, Payload* out) const override {
    auto& st = static_cast<DgcState&>(state);
    const TensorDesc& d = st.desc();
    const std::size_t n = d.count;
    const float* g = f32_view(grad, d.dtype, n, st.xf).data();
    float scale = 1.0f;
    if (clip_ > 0) {
      double ss = 0;
      for (std::size_t i = 0; i < n; ++i) ss += double{g[i]} * g[i];
      const double norm = std::sqrt(ss);
      if (norm > clip_) scale = static_cast<float>(clip_ / norm);
    }
    float* u = st.u.data();
    float* v = st.v.data();
    const float m = momentum_;
    for (std::size_t i = 0; i < n; ++i) {
      u[i] = m * u[i] + scale * g[i];
      v[i] += u[i];
    }
    const std::size_t k = count_for_ratio(dgc_density(st.step(), warmup_, ratio_), n);
    topk_sampled(st.v, k, mix_seed(seed_, st.step(), 2), st.sel, &st.idx);
    sparse_write(st.idx, std::as_bytes(std::span<const float>(st.v)), DataType::f32, &out->bytes);
    for (std::uint32_t i : st.idx) {
      v[i] = 0.0f;
      u[i] = 0.0f;
    }
    out->aggregation = Aggregation::gather_only;
    out->last = true;
    return {};
  }

  Status on_decode_add(const CompressorState&, std::span<const std::byte> payload, std::span<float> acc,
                       float alpha) const override {
    return sparse_decode_add(*this, payload, DataType::f32, acc, alpha);
  }

 private:
  double ratio_;
  float momentum_;
  double clip_;
  std::int64_t warmup_;
  std::uint64_t seed_;
};

Status make(const CompressorSpec& spec, std::unique_ptr<Compressor>* out) {
  double ratio = 0, momentum = 0, clip = 0;
  std::int64_t warmup = 0, seed = 0;
  if (Status s = get_ratio(spec, 0.001, &ratio); !s.ok()) return s;
  if (Status s = spec_get_double(spec, "momentum", 0.9, &momentum); !s.ok()) return s;
  if (!(momentum >= 0 && momentum < 1)) return spec_error(spec, "momentum must be in [0, 1), got " + *spec.find("momentum"));
  if (Status s = spec_get_double(spec, "clip", 0, &clip); !s.ok()) return s;
  if (clip < 0) return spec_error(spec, "clip must be >= 0 (0: no clipping), got " + *spec.find("clip"));
  if (Status s = spec_get_int(spec, "warmup", 1000, &warmup); !s.ok()) return s;
  if (warmup < 0) return spec_error(spec, "warmup must be >= 0 steps, got " + *spec.find("warmup"));
  if (Status s = spec_get_int(spec, "seed", 0, &seed); !s.ok()) return s;
  *out = std::make_unique<Dgc>(spec, ratio, static_cast<float>(momentum), clip, warmup,
                               static_cast<std::uint64_t>(seed));
  return {};
}

}  // namespace

extern const CompressorDesc compressor_dgc = {
    "dgc", "Deep Gradient Compression: momentum correction and masking, clipping, warm-up, sampled top-k",
    "ratio,momentum,clip,warmup,seed", make};

}  // namespace cclz::compress
