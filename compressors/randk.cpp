// randk:ratio=R[,seed=S]: k = ceil(R n) coordinates chosen uniformly without
// replacement (Stich et al. 2018), the same ones on every rank: the choice
// depends only on (seed, step, n), where step is the state's step counter
// (state.step(), advanced by begin() and saved with the state) and seed the
// spec key (default 0). So the payload needs no indices and is summable: k
// f32 values, in ascending index order, summed by a plain f32 all-reduce.
// Values are not rescaled by n/k (biased, contractive: meant for ef+/ef21+).
// Indices: Floyd's algorithm (k draws) into a bitmap, read back in order;
// cached per step so decoding in the same step does not redraw them.
#include "compressors/common.hpp"

namespace cclz::compress {

namespace {

struct RandkState final : CompressorState {
  using CompressorState::CompressorState;
  // The indices of step idx_step (decoding is logically const).
  mutable std::vector<std::uint64_t> bits;
  mutable std::vector<std::uint32_t> idx;
  mutable std::uint64_t idx_step = ~std::uint64_t{0};
};

class Randk final : public Compressor {
 public:
  Randk(CompressorSpec spec, double ratio, std::uint64_t seed)
      : Compressor(std::move(spec)), ratio_(ratio), seed_(seed) {}
  Aggregation aggregation() const noexcept override { return Aggregation::summable; }

 protected:
  Status on_make_state(const TensorDesc& desc, std::unique_ptr<CompressorState>* out) const override {
    if (Status s = check_u32_count(*this, desc); !s.ok()) return s;
    *out = std::make_unique<RandkState>(*this, desc);
    return {};
  }

  const std::vector<std::uint32_t>& indices(const RandkState& st) const {
    if (st.idx_step == st.step()) return st.idx;
    const std::size_t n = st.desc().count;
    const std::size_t k = count_for_ratio(ratio_, n);
    st.bits.assign((n + 63) / 64, 0);
    std::uint64_t* b = st.bits.data();
    Rng rng(mix_seed(seed_, st.step(), 1));
    // Floyd: for j = n-k .. n-1 draw t in [0, j]; take t, or j if t is taken.
    for (std::size_t j = n - k; j < n; ++j) {
      const std::size_t t = rng.below(static_cast<std::uint32_t>(j + 1));
      const bool taken = (b[t >> 6] >> (t & 63)) & 1u;
      const std::size_t pick = taken ? j : t;
      b[pick >> 6] |= std::uint64_t{1} << (pick & 63);
    }
    st.idx.resize(k);
    std::size_t c = 0;
    for (std::size_t w = 0; w < st.bits.size(); ++w) {
      for (std::uint64_t word = b[w]; word != 0; word &= word - 1) {
        st.idx[c++] = static_cast<std::uint32_t>(w * 64 + static_cast<std::size_t>(__builtin_ctzll(word)));
      }
    }
    st.idx_step = st.step();
    return st.idx;
  }

  Status on_begin(CompressorState& state, std::span<const std::byte> grad, Payload* out) const override {
    auto& st = static_cast<RandkState&>(state);
    const DataType dt = st.desc().dtype;
    const std::vector<std::uint32_t>& idx = indices(st);
    out->bytes.resize(idx.size() * 4);
    float* v = as_f32(std::span<std::byte>(out->bytes)).data();
    if (dt == DataType::f32) {
      const float* x = as_f32(grad).data();
      for (std::size_t j = 0; j < idx.size(); ++j) v[j] = x[idx[j]];
    } else {
      for (std::size_t j = 0; j < idx.size(); ++j) {
        load_f32(grad.subspan(std::size_t{idx[j]} * 2, 2), dt, std::span<float>(v + j, 1));
      }
    }
    out->aggregation = Aggregation::summable;
    out->sum_dtype = DataType::f32;
    out->last = true;
    return {};
  }

  Status on_decode_add(const CompressorState& state, std::span<const std::byte> payload, std::span<float> acc,
                       float alpha) const override {
    const auto& st = static_cast<const RandkState&>(state);
    const std::vector<std::uint32_t>& idx = indices(st);
    if (payload.size() != idx.size() * 4) {
      return error("payload is " + std::to_string(payload.size()) + " bytes, " + std::to_string(idx.size()) +
                   " f32 values need " + std::to_string(idx.size() * 4));
    }
    const float* v = as_f32(payload).data();
    float* a = acc.data();
    for (std::size_t j = 0; j < idx.size(); ++j) a[idx[j]] += alpha * v[j];
    return {};
  }

 private:
  double ratio_;
  std::uint64_t seed_;
};

Status make(const CompressorSpec& spec, std::unique_ptr<Compressor>* out) {
  double ratio = 0;
  std::int64_t seed = 0;
  if (Status s = get_ratio(spec, 0.01, &ratio); !s.ok()) return s;
  if (Status s = spec_get_int(spec, "seed", 0, &seed); !s.ok()) return s;
  *out = std::make_unique<Randk>(spec, ratio, static_cast<std::uint64_t>(seed));
  return {};
}

}  // namespace

extern const CompressorDesc compressor_randk = {
    "randk", "k = ceil(ratio n) coordinates drawn from a seed shared by all ranks; summable", "ratio,seed", make};

}  // namespace cclz::compress
