// Shared helpers for the compressor tests: building compressors and states,
// typed buffers, a one-process "ranks" driver for the round protocol, and a
// reader for the saved-state format of compress.hpp.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cclz/compress.hpp"
#include "kernels.hpp"

namespace cclz::test {

inline std::unique_ptr<Compressor> make(const std::string& spec) {
  std::unique_ptr<Compressor> c;
  const Status s = make_compressor(spec, &c);
  EXPECT_TRUE(s.ok()) << spec << ": " << s.to_string();
  return c;
}

inline std::unique_ptr<CompressorState> state_for(const Compressor& c, std::size_t n, DataType dt = DataType::f32) {
  std::unique_ptr<CompressorState> st;
  const Status s = c.make_state(TensorDesc{n, dt, 0, 0}, &st);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return st;
}

inline std::vector<float> normal(std::size_t n, std::uint32_t seed, float sigma = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

// A tensor of dtype dt holding xs (rounded to nearest even).
inline std::vector<std::byte> typed(const std::vector<float>& xs, DataType dt) {
  std::vector<std::byte> b(xs.size() * dtype_size(dt));
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (dt == DataType::f32) {
      std::memcpy(b.data() + 4 * i, &xs[i], 4);
    } else {
      const std::uint16_t h = dt == DataType::f16 ? kernels::float_to_half(xs[i]) : kernels::float_to_bf16(xs[i]);
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
  }
  return b;
}

inline std::vector<float> widen(std::span<const std::byte> b, DataType dt) {
  const std::size_t es = dtype_size(dt);
  std::vector<float> xs(b.size() / es);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (dt == DataType::f32) {
      std::memcpy(&xs[i], b.data() + 4 * i, 4);
    } else {
      std::uint16_t h;
      std::memcpy(&h, b.data() + 2 * i, 2);
      xs[i] = dt == DataType::f16 ? kernels::half_to_float(h) : kernels::bf16_to_float(h);
    }
  }
  return xs;
}

inline std::span<const std::byte> bytes_of(const std::vector<float>& v) { return std::as_bytes(std::span(v)); }

// Runs one step of the round protocol for every rank in one process, doing
// what a compressed all-reduce does between rounds: summable payloads are
// summed elementwise in their dtype (f16/bf16 through f32, in rank order),
// gather-only ones are handed over in rank order. Requantizable ones are not
// simulated here. outs[r] gets rank r's finish() output.
struct Step {
  std::vector<Payload> payloads;                 // each rank's payload of the last round
  std::vector<std::vector<std::byte>> outs;      // finish() output per rank
};
inline Step run_step(const Compressor& c, std::vector<std::unique_ptr<CompressorState>>& states,
                     const std::vector<std::vector<std::byte>>& grads) {
  const std::size_t nr = states.size();
  Step s;
  s.payloads.resize(nr);
  for (std::size_t r = 0; r < nr; ++r) {
    const Status st = c.begin(*states[r], grads[r], &s.payloads[r]);
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
  for (;;) {
    const Payload& p0 = s.payloads[0];
    std::vector<std::byte> summed;
    std::vector<std::span<const std::byte>> agg;
    if (p0.aggregation == Aggregation::summable) {
      std::vector<float> acc(p0.bytes.size() / dtype_size(p0.sum_dtype), 0.0f);
      for (std::size_t r = 0; r < nr; ++r) {
        EXPECT_EQ(s.payloads[r].bytes.size(), p0.bytes.size());
        const std::vector<float> w = widen(s.payloads[r].bytes, p0.sum_dtype);
        for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += w[i];
      }
      summed = typed(acc, p0.sum_dtype);
      agg.emplace_back(summed);
    } else {
      for (std::size_t r = 0; r < nr; ++r) agg.emplace_back(s.payloads[r].bytes);
    }
    if (p0.last) {
      s.outs.resize(nr);
      for (std::size_t r = 0; r < nr; ++r) {
        s.outs[r].resize(grads[r].size());
        const Status st = c.finish(*states[r], agg, s.outs[r]);
        EXPECT_TRUE(st.ok()) << st.to_string();
      }
      return s;
    }
    for (std::size_t r = 0; r < nr; ++r) {
      const Status st = c.next(*states[r], agg, &s.payloads[r]);
      EXPECT_TRUE(st.ok()) << st.to_string();
    }
  }
}

// The first `floats` f32 values of a saved state's body (error-feedback
// vectors: ef+ saves e, ef21+ saves h then H), read by the documented layout:
// "CZS1", u32 name length, name, u64 count, i32 dtype, u64 rows, u64 cols,
// u64 step, u64 body length, body.
inline std::vector<float> saved_body_floats(const CompressorState& st, std::size_t floats) {
  std::vector<std::byte> b;
  EXPECT_TRUE(st.save(&b).ok());
  std::uint32_t name_len = 0;
  std::memcpy(&name_len, b.data() + 4, 4);
  const std::size_t body = 4 + 4 + name_len + 8 + 4 + 8 + 8 + 8 + 8;
  EXPECT_GE(b.size(), body + floats * 4);
  std::vector<float> v(floats);
  std::memcpy(v.data(), b.data() + body, floats * 4);
  return v;
}

// Indices of the non-zero entries of a decoded payload.
inline std::vector<std::uint32_t> nonzero(const std::vector<float>& v) {
  std::vector<std::uint32_t> idx;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i] != 0.0f) idx.push_back(static_cast<std::uint32_t>(i));
  }
  return idx;
}

}  // namespace cclz::test
