// Error-feedback decorators around a single-round compressor C (fed f32).
//
// ef+C (Stich et al. 2018; Karimireddy et al. 2019), residual e per tensor:
//   a = e + g;  send C(a);  e <- a - decode(C(a))
// Every rank sends C(a); the receiver sums the decoded payloads, which is
// what finish() writes. Invariant per rank: sum of everything decoded from
// its payloads so far + e == sum of its gradients so far.
//
// ef21+C (EF21, Richtarik et al. 2021), per rank a gradient estimate h, and
// on every rank the same running sum H of all ranks' estimates:
//   c = C(g - h);  send c;  h <- h + decode(c)
//   receiver: H <- H + sum over ranks of decode(c_r);  output H
// Invariants: h == sum of this rank's decoded payloads; H == sum over ranks
// of h (both to float rounding). The output is the sum of the estimates,
// not of the gradients; with a contractive C, h tracks g.
//
// Both keep f32 vectors of n (ef: e; ef21: h and H) in the state, saved
// with the inner compressor's state. C sees an f32 tensor whatever the
// input dtype, so a sparsifier's values are f32 on the wire.
#include "compressors/common.hpp"

namespace cclz::compress {

namespace {

struct EfState final : CompressorState {
  EfState(const Compressor& owner, const TensorDesc& desc, std::unique_ptr<CompressorState> in, bool ef21)
      : CompressorState(owner, desc), inner(std::move(in)) {
    e.assign(desc.count, 0.0f);
    if (ef21) sum.assign(desc.count, 0.0f);
  }
  std::unique_ptr<CompressorState> inner;  // for the f32 tensor C sees
  std::vector<float> e;                    // ef: residual; ef21: this rank's estimate h
  std::vector<float> sum;                  // ef21: H
  std::vector<float> tmp;

  void save_body(std::vector<std::byte>* out) const override {
    state_put(out, e.data(), e.size() * 4);
    state_put(out, sum.data(), sum.size() * 4);
    (void)inner->save(out);
  }
  Status load_body(std::span<const std::byte> in) override {
    const std::size_t want = (e.size() + sum.size()) * 4;
    if (in.size() < want) {
      return owner().error("saved state body is " + std::to_string(in.size()) + " bytes, the error-feedback " +
                           "vectors alone need " + std::to_string(want));
    }
    // The inner state first, so a failure leaves this one unchanged.
    if (Status s = inner->load(in.subspan(want)); !s.ok()) return s;
    (void)state_get(&in, e.data(), e.size() * 4);
    (void)state_get(&in, sum.data(), sum.size() * 4);
    return {};
  }
};

class ErrorFeedback final : public Compressor {
 public:
  ErrorFeedback(CompressorSpec spec, std::unique_ptr<Compressor> inner)
      : Compressor(std::move(spec)), inner_(std::move(inner)), ef21_(this->spec().feedback == Feedback::ef21) {}

  std::string name() const override { return (ef21_ ? "ef21+" : "ef+") + inner_->name(); }
  Aggregation aggregation() const noexcept override { return inner_->aggregation(); }

  std::size_t block_elems() const noexcept override { return inner_->block_elems(); }
  std::size_t payload_bytes(std::size_t elems) const noexcept override { return inner_->payload_bytes(elems); }
  Status encode_chunk(const CompressorState& state, std::span<const float> x, std::size_t first_elem,
                      std::span<std::byte> out) const override {
    return inner_->encode_chunk(*static_cast<const EfState&>(state).inner, x, first_elem, out);
  }
  Status decode_chunk_add(const CompressorState& state, std::span<const std::byte> chunk, std::size_t first_elem,
                          std::span<float> acc) const override {
    return inner_->decode_chunk_add(*static_cast<const EfState&>(state).inner, chunk, first_elem, acc);
  }

 protected:
  Status on_make_state(const TensorDesc& desc, std::unique_ptr<CompressorState>* out) const override {
    TensorDesc in = desc;
    in.dtype = DataType::f32;
    std::unique_ptr<CompressorState> inner;
    if (Status s = inner_->make_state(in, &inner); !s.ok()) return s;
    *out = std::make_unique<EfState>(*this, desc, std::move(inner), ef21_);
    return {};
  }

  Status on_begin(CompressorState& state, std::span<const std::byte> grad, Payload* out) const override {
    auto& st = static_cast<EfState&>(state);
    const TensorDesc& d = st.desc();
    if (!ef21_) {
      add_scaled(grad, d.dtype, st.e, 1.0f);  // e = e + g
      if (Status s = inner_->begin(*st.inner, std::as_bytes(std::span<const float>(st.e)), out); !s.ok()) return s;
      return inner_->decode_add(*st.inner, out->bytes, st.e, -1.0f);  // e = a - C(a)
    }
    st.tmp.resize(d.count);
    load_f32(grad, d.dtype, st.tmp);
    const float* h = st.e.data();
    float* t = st.tmp.data();
    for (std::size_t i = 0; i < d.count; ++i) t[i] -= h[i];  // g - h
    if (Status s = inner_->begin(*st.inner, std::as_bytes(std::span<const float>(st.tmp)), out); !s.ok()) return s;
    return inner_->decode_add(*st.inner, out->bytes, st.e, 1.0f);  // h += C(g - h)
  }

  Status on_finish(CompressorState& state, Aggregate agg, std::span<std::byte> out, float alpha) const override {
    auto& st = static_cast<EfState&>(state);
    const TensorDesc& d = st.desc();
    if (!ef21_) {
      if (d.dtype == DataType::f32) return inner_->finish(*st.inner, agg, out, alpha);
      st.tmp.resize(d.count);
      if (Status s = inner_->finish(*st.inner, agg, std::as_writable_bytes(std::span<float>(st.tmp)), alpha);
          !s.ok()) {
        return s;
      }
      store_f32(st.tmp, d.dtype, out);
      return {};
    }
    st.tmp.resize(d.count);
    if (Status s = inner_->finish(*st.inner, agg, std::as_writable_bytes(std::span<float>(st.tmp)), 1.0f); !s.ok()) {
      return s;
    }
    float* H = st.sum.data();
    float* t = st.tmp.data();
    for (std::size_t i = 0; i < d.count; ++i) {
      H[i] += t[i];
      t[i] = alpha * H[i];
    }
    store_f32(st.tmp, d.dtype, out);
    return {};
  }

  Status on_decode_add(const CompressorState& state, std::span<const std::byte> payload, std::span<float> acc,
                       float alpha) const override {
    return inner_->decode_add(*static_cast<const EfState&>(state).inner, payload, acc, alpha);
  }

 private:
  std::unique_ptr<Compressor> inner_;
  bool ef21_;
};

}  // namespace

Status make_error_feedback(const CompressorSpec& spec, std::unique_ptr<Compressor> inner,
                           std::unique_ptr<Compressor>* out) {
  if (inner->multi_round()) {
    return spec_error(spec, std::string(spec.feedback == Feedback::ef21 ? "ef21+" : "ef+") + " needs a " +
                                "single-round compressor; " + inner->name() + " runs several rounds (and keeps " +
                                "its own error feedback)");
  }
  *out = std::make_unique<ErrorFeedback>(spec, std::move(inner));
  return {};
}

}  // namespace cclz::compress
