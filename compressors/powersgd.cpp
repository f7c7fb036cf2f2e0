// powersgd:rank=R,warmup=W[,min_rate=X][,ef=0|1][,seed=S]: PowerSGD (Vogels,
// Karimireddy, Jaggi 2019), one power-iteration step per training step with
// a warm start. The tensor is read as an n x m row-major matrix M
// (powersgd.hpp: the declared shape, else the most square factorisation),
// with error feedback M = g + e. Two rounds, both summable f32 payloads:
//   round 0: P = M Q                      (n x r)   -> all-reduce (sum)
//   round 1: P^ = orthonormalise(sum P);  Q = M^T P^ (m x r) -> all-reduce (sum)
//   finish:  out = alpha P^ (sum Q)^T;  e <- M - P^ Q_mine^T (the paper's
//            local decompression); Q <- sum Q, columns normalised, as the next
//            step's start (a zero column is drawn again).
// Sums, not averages: finish() then gives the sum over ranks of each rank's
// rank-r approximation P^ P^T M_rank (pass alpha = 1/world for the mean).
// Averaged payloads work too: orthonormalisation ignores P's scale, and an
// averaged Q gives the mean directly.
// Dense instead (one summable payload of the tensor in its own dtype) for
// the first W steps (warmup, default 0) and for every matrix where
// (n + m) r min_rate >= n m (min_rate default 2, PyTorch's rule), e.g.
// vectors, small or prime-sized tensors. rank default 4; ef default 1.
// Q starts as a normal draw seeded by (seed, n, m): the same on every rank.
//
// Cost per compressed step: wire (n + m) r f32 instead of n m; compute the
// three products M Q, M^T P^, P^ Q^T (2 n m r flops each, through OpenBLAS
// sgemm) plus, with error feedback, a fourth, P^ Q_mine^T subtracted from M.
// Memory traffic: begin reads g and M and writes M (the previous residual
// is folded in here, while a block of rows is in cache, rather than in a pass
// of its own in finish), next reads M, finish writes the output: five passes
// over n m floats with ef, four without (M is a copy: the protocol does not
// keep the gradient alive between rounds). State: Q (m r), M (n m), P (n r).
#include "compressors/powersgd.hpp"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <numbers>

#include "compressors/common.hpp"

namespace cclz::compress {

namespace powersgd {

Shape matrix_shape(const TensorDesc& d) noexcept {
  if (d.rows != 0) return {d.rows, d.cols};
  if (d.count == 0) return {0, 0};
  auto r = static_cast<std::size_t>(std::sqrt(static_cast<double>(d.count)));
  while (r * r > d.count) --r;
  while ((r + 1) * (r + 1) <= d.count) ++r;
  while (d.count % r != 0) --r;
  return {r, d.count / r};
}

bool compresses(Shape s, std::size_t rank, double min_rate) noexcept {
  if (s.rows > INT_MAX || s.cols > INT_MAX) return false;  // sgemm takes int dimensions
  return static_cast<double>(s.rows + s.cols) * static_cast<double>(rank) * min_rate <
         static_cast<double>(s.rows) * static_cast<double>(s.cols);
}

void orthogonalise(float* p, std::size_t n, std::size_t r) noexcept {
  for (std::size_t j = 0; j < r; ++j) {
    for (int pass = 0; pass < 2; ++pass) {
      for (std::size_t k = 0; k < j; ++k) {
        double dot = 0;
        for (std::size_t i = 0; i < n; ++i) dot += static_cast<double>(p[i * r + j]) * p[i * r + k];
        for (std::size_t i = 0; i < n; ++i) p[i * r + j] = static_cast<float>(p[i * r + j] - dot * p[i * r + k]);
      }
    }
    double ss = 0;
    for (std::size_t i = 0; i < n; ++i) ss += static_cast<double>(p[i * r + j]) * p[i * r + j];
    const double norm = std::sqrt(ss);
    if (norm <= kZeroNorm) {
      for (std::size_t i = 0; i < n; ++i) p[i * r + j] = 0.0f;
    } else {
      const double inv = 1.0 / norm;
      for (std::size_t i = 0; i < n; ++i) p[i * r + j] = static_cast<float>(p[i * r + j] * inv);
    }
  }
}

}  // namespace powersgd

namespace {

using powersgd::Shape;

// Rows per block in the fused passes: about 256 KiB of M, so a block of M,
// of the gradient and of the output stay in L2 between the elementwise work
// and the sgemm that reads them.
std::size_t block_rows(std::size_t cols) noexcept { return std::max<std::size_t>(1, (std::size_t{1} << 16) / std::max<std::size_t>(1, cols)); }

// Standard normal draws (Box-Muller on splitmix64) filling x.
void fill_normal(std::uint64_t seed, std::span<float> x) {
  Rng rng(seed);
  for (std::size_t i = 0; i < x.size(); i += 2) {
    const double u1 = (static_cast<double>(rng.next() >> 11) + 1.0) * 0x1p-53;  // (0, 1]
    const double u2 = static_cast<double>(rng.next() >> 11) * 0x1p-53;
    const double rad = std::sqrt(-2.0 * std::log(u1));
    x[i] = static_cast<float>(rad * std::cos(2.0 * std::numbers::pi * u2));
    if (i + 1 < x.size()) x[i + 1] = static_cast<float>(rad * std::sin(2.0 * std::numbers::pi * u2));
  }
}

struct PsgdState final : CompressorState {
  PsgdState(const Compressor& owner, const TensorDesc& desc, Shape s, bool compress, std::size_t rank, bool ef)
      : CompressorState(owner, desc), shape(s), compress(compress), rank(rank), ef(ef) {
    if (compress) {
      q.resize(s.cols * rank);
      m.resize(s.rows * s.cols);
      p.resize(s.rows * rank);
      qloc.resize(s.cols * rank);
    }
  }
  Shape shape;
  bool compress;  // by the rate rule; false: always dense
  std::size_t rank;
  bool ef;
  std::vector<float> q;     // m x r: this step's start (sum Q of the last step, columns normalised)
  std::vector<float> m;     // n x m: M of the current or last step
  std::vector<float> p;     // n x r: P, then P^ after next()
  std::vector<float> qloc;  // m x r: this rank's M^T P^ (the residual's part)
  std::vector<float> conv;  // f16/bf16 widening / output scratch, one block
  bool have_m = false;      // m holds an M (ef: the residual is M, or M - P^ qloc^T when pending)
  bool pending = false;     // the residual still has to subtract P^ qloc^T
  bool dense_step = false;  // this step went out dense
  bool q_ready = false;     // q has been drawn

  // e = M - P^ qloc^T (or M, or 0) into out.
  void residual_into(std::vector<float>* out) const {
    out->assign(shape.rows * shape.cols, 0.0f);
    if (!compress || !ef || !have_m) return;
    std::copy(m.begin(), m.end(), out->begin());
    if (pending) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(shape.rows), static_cast<int>(shape.cols),
                  static_cast<int>(rank), -1.0f, p.data(), static_cast<int>(rank), qloc.data(), static_cast<int>(rank),
                  1.0f, out->data(), static_cast<int>(shape.cols));
    }
  }

  // Body: u64 rows, cols, rank; u8 ef; u8 q_ready; then (compressed
  // tensors) Q (cols * rank f32) and, with error feedback, e (rows * cols f32).
  void save_body(std::vector<std::byte>* out) const override {
    const std::uint64_t hdr[3] = {shape.rows, shape.cols, rank};
    const std::uint8_t flags[2] = {static_cast<std::uint8_t>(ef), static_cast<std::uint8_t>(q_ready)};
    state_put(out, hdr, sizeof hdr);
    state_put(out, flags, sizeof flags);
    if (!compress) return;
    state_put(out, q.data(), q.size() * 4);
    if (ef) {
      std::vector<float> e;
      residual_into(&e);
      state_put(out, e.data(), e.size() * 4);
    }
  }

  Status load_body(std::span<const std::byte> in) override {
    std::uint64_t hdr[3];
    std::uint8_t flags[2];
    if (!state_get(&in, hdr, sizeof hdr) || !state_get(&in, flags, sizeof flags)) {
      return owner().error("saved state body truncated");
    }
    if (hdr[0] != shape.rows || hdr[1] != shape.cols || hdr[2] != rank || flags[0] != static_cast<std::uint8_t>(ef)) {
      return owner().error("saved state is for a " + std::to_string(hdr[0]) + "x" + std::to_string(hdr[1]) +
                           " matrix at rank " + std::to_string(hdr[2]) + " (ef " + std::to_string(flags[0]) +
                           "), this one is " + std::to_string(shape.rows) + "x" + std::to_string(shape.cols) +
                           " at rank " + std::to_string(rank) + " (ef " + std::to_string(int{ef}) + ")");
    }
    const std::size_t want = compress ? (q.size() + (ef ? m.size() : 0)) * 4 : 0;
    if (in.size() != want) {
      return owner().error("saved state body has " + std::to_string(in.size()) + " bytes of Q and residual, " +
                           std::to_string(want) + " expected");
    }
    if (compress) {
      (void)state_get(&in, q.data(), q.size() * 4);
      if (ef) (void)state_get(&in, m.data(), m.size() * 4);
      have_m = ef;
    }
    q_ready = flags[1] != 0;
    pending = false;
    dense_step = false;
    return {};
  }
};

class PowerSgd final : public Compressor {
 public:
  PowerSgd(CompressorSpec spec, std::size_t rank, std::uint64_t warmup, double min_rate, bool ef, std::uint64_t seed)
      : Compressor(std::move(spec)), rank_(rank), warmup_(warmup), min_rate_(min_rate), ef_(ef), seed_(seed) {}

  Aggregation aggregation() const noexcept override { return Aggregation::summable; }
  bool multi_round() const noexcept override { return true; }

 protected:
  Status on_make_state(const TensorDesc& desc, std::unique_ptr<CompressorState>* out) const override {
    const Shape s = powersgd::matrix_shape(desc);
    *out = std::make_unique<PsgdState>(*this, desc, s, powersgd::compresses(s, rank_, min_rate_), rank_, ef_);
    return {};
  }

  Status on_begin(CompressorState& state, std::span<const std::byte> grad, Payload* out) const override {
    auto& st = static_cast<PsgdState&>(state);
    const TensorDesc& d = st.desc();
    st.dense_step = !st.compress || st.step() <= warmup_;
    out->aggregation = Aggregation::summable;
    if (st.dense_step) {
      out->bytes.assign(grad.begin(), grad.end());
      out->sum_dtype = d.dtype;
      out->last = true;
      return {};
    }
    const std::size_t n = st.shape.rows, m = st.shape.cols, r = rank_;
    if (!st.q_ready) {
      fill_normal(mix_seed(seed_, n, m), st.q);
      st.q_ready = true;
    }
    // Row block by row block: M = g (+ the residual), then P = M Q while
    // the block is in cache.
    const std::size_t bh = block_rows(m);
    const std::size_t es = dtype_size(d.dtype);
    const bool keep = st.ef && st.have_m;
    for (std::size_t i0 = 0; i0 < n; i0 += bh) {
      const std::size_t h = std::min(bh, n - i0);
      float* mb = st.m.data() + i0 * m;
      const std::span<const std::byte> gb = grad.subspan(i0 * m * es, h * m * es);
      if (keep && st.pending) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(h), static_cast<int>(m),
                    static_cast<int>(r), -1.0f, st.p.data() + i0 * r, static_cast<int>(r), st.qloc.data(),
                    static_cast<int>(r), 1.0f, mb, static_cast<int>(m));
      }
      std::span<float> mspan(mb, h * m);
      if (keep) {
        add_scaled(gb, d.dtype, mspan, 1.0f);
      } else {
        load_f32(gb, d.dtype, mspan);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(h), static_cast<int>(r),
                  static_cast<int>(m), 1.0f, mb, static_cast<int>(m), st.q.data(), static_cast<int>(r), 0.0f,
                  st.p.data() + i0 * r, static_cast<int>(r));
    }
    st.have_m = true;
    st.pending = false;
    out->bytes.resize(n * r * 4);
    std::memcpy(out->bytes.data(), st.p.data(), n * r * 4);
    out->sum_dtype = DataType::f32;
    out->last = false;
    return {};
  }

  Status on_next(CompressorState& state, Aggregate agg, Payload* out) const override {
    auto& st = static_cast<PsgdState&>(state);
    const std::size_t n = st.shape.rows, m = st.shape.cols, r = rank_;
    if (Status s = check_agg(agg, n * r, "P (round 0)"); !s.ok()) return s;
    std::memcpy(st.p.data(), agg[0].data(), n * r * 4);
    powersgd::orthogonalise(st.p.data(), n, r);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(r), static_cast<int>(n),
                1.0f, st.m.data(), static_cast<int>(m), st.p.data(), static_cast<int>(r), 0.0f, st.qloc.data(),
                static_cast<int>(r));
    st.pending = st.ef;
    out->bytes.resize(m * r * 4);
    std::memcpy(out->bytes.data(), st.qloc.data(), m * r * 4);
    out->aggregation = Aggregation::summable;
    out->sum_dtype = DataType::f32;
    out->last = true;
    return {};
  }

  Status on_finish(CompressorState& state, Aggregate agg, std::span<std::byte> out, float alpha) const override {
    auto& st = static_cast<PsgdState&>(state);
    if (st.dense_step) return Compressor::on_finish(state, agg, out, alpha);
    const TensorDesc& d = st.desc();
    const std::size_t n = st.shape.rows, m = st.shape.cols, r = rank_;
    if (Status s = check_agg(agg, m * r, "Q (round 1)"); !s.ok()) return s;
    const float* qs = reinterpret_cast<const float*>(agg[0].data());
    const std::size_t bh = block_rows(m);
    if (d.dtype != DataType::f32) st.conv.resize(std::min(bh, n) * m);
    const std::size_t es = dtype_size(d.dtype);
    for (std::size_t i0 = 0; i0 < n; i0 += bh) {
      const std::size_t h = std::min(bh, n - i0);
      float* ob = d.dtype == DataType::f32 ? as_f32(out).data() + i0 * m : st.conv.data();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(h), static_cast<int>(m),
                  static_cast<int>(r), alpha, st.p.data() + i0 * r, static_cast<int>(r), qs, static_cast<int>(r), 0.0f,
                  ob, static_cast<int>(m));
      if (d.dtype != DataType::f32) store_f32(std::span<const float>(ob, h * m), d.dtype, out.subspan(i0 * m * es, h * m * es));
    }
    warm_start(st, qs);
    return {};
  }

  Status on_decode_add(const CompressorState& state, std::span<const std::byte> payload, std::span<float> acc,
                       float alpha) const override {
    const auto& st = static_cast<const PsgdState&>(state);
    const TensorDesc& d = st.desc();
    if (st.dense_step) {
      if (payload.size() != d.dense_bytes()) {
        return error("dense payload is " + std::to_string(payload.size()) + " bytes, the tensor has " +
                     std::to_string(d.dense_bytes()));
      }
      add_scaled(payload, d.dtype, acc, alpha);
      return {};
    }
    const std::size_t n = st.shape.rows, m = st.shape.cols, r = rank_;
    if (payload.size() != m * r * 4) {
      return error("payload is " + std::to_string(payload.size()) + " bytes; decoding takes the final round's Q of " +
                   std::to_string(m) + "x" + std::to_string(r) + " f32 (" + std::to_string(m * r * 4) + " bytes)");
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(m), static_cast<int>(r),
                alpha, st.p.data(), static_cast<int>(r), reinterpret_cast<const float*>(payload.data()),
                static_cast<int>(r), 1.0f, acc.data(), static_cast<int>(m));
    return {};
  }

 private:
  Status check_agg(Aggregate agg, std::size_t floats, const char* what) const {
    if (agg.size() != 1 || agg[0].size() != floats * 4) {
      return error(std::string("aggregate of ") + what + " must be one summed array of " + std::to_string(floats) +
                   " f32 (" + std::to_string(floats * 4) + " bytes); got " + std::to_string(agg.size()) +
                   " part(s), the first of " + std::to_string(agg.empty() ? 0 : agg[0].size()) + " bytes");
    }
    return {};
  }

  // Q <- sum Q with unit columns (P's span, hence P^, does not depend on
  // their scale, and P = M Q then stays at M's magnitude instead of its
  // square); a zero column is drawn again, or it would stay zero for ever.
  // Every rank holds the same sum Q, so every rank gets the same Q.
  void warm_start(PsgdState& st, const float* qs) const {
    const std::size_t m = st.shape.cols, r = rank_;
    std::vector<float> col(m);
    for (std::size_t j = 0; j < r; ++j) {
      double ss = 0;
      for (std::size_t i = 0; i < m; ++i) ss += static_cast<double>(qs[i * r + j]) * qs[i * r + j];
      const double norm = std::sqrt(ss);
      if (norm > powersgd::kZeroNorm && std::isfinite(norm)) {
        for (std::size_t i = 0; i < m; ++i) st.q[i * r + j] = static_cast<float>(qs[i * r + j] / norm);
      } else {
        fill_normal(mix_seed(seed_ ^ 0x5eed, st.step(), j), col);
        for (std::size_t i = 0; i < m; ++i) st.q[i * r + j] = col[i];
      }
    }
  }

  std::size_t rank_;
  std::uint64_t warmup_;
  double min_rate_;
  bool ef_;
  std::uint64_t seed_;
};

Status make(const CompressorSpec& spec, std::unique_ptr<Compressor>* out) {
  std::int64_t rank = 0, warmup = 0, seed = 0;
  double min_rate = 0;
  bool ef = true;
  if (Status s = spec_get_int(spec, "rank", 4, &rank); !s.ok()) return s;
  if (rank < 1 || rank > 1024) return spec_error(spec, "rank=" + std::to_string(rank) + " is out of range [1, 1024]");
  if (Status s = spec_get_int(spec, "warmup", 0, &warmup); !s.ok()) return s;
  if (warmup < 0) return spec_error(spec, "warmup=" + std::to_string(warmup) + " must be >= 0");
  if (Status s = spec_get_double(spec, "min_rate", 2.0, &min_rate); !s.ok()) return s;
  if (!(min_rate > 0)) return spec_error(spec, "min_rate must be > 0, got " + *spec.find("min_rate"));
  if (Status s = spec_get_bool(spec, "ef", true, &ef); !s.ok()) return s;
  if (Status s = spec_get_int(spec, "seed", 0, &seed); !s.ok()) return s;
  *out = std::make_unique<PowerSgd>(spec, static_cast<std::size_t>(rank), static_cast<std::uint64_t>(warmup), min_rate,
                                    ef, static_cast<std::uint64_t>(seed));
  return {};
}

}  // namespace

Status powersgd::residual(const CompressorState& state, std::vector<float>* out) {
  const auto* st = dynamic_cast<const PsgdState*>(&state);
  if (st == nullptr) return {Result::invalid_argument, "powersgd::residual: not a powersgd state"};
  st->residual_into(out);
  return {};
}

extern const CompressorDesc compressor_powersgd = {
    "powersgd", "rank-r power iteration with warm start and error feedback (P and Q all-reduced; Vogels et al. 2019)",
    "rank,warmup,min_rate,ef,seed", make};

}  // namespace cclz::compress
