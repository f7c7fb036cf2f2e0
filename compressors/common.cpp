// Dtype conversion, seeds and the sparse payload format shared by the
// compressors (see common.hpp).
#include "compressors/common.hpp"

#include <algorithm>
#include <cmath>

#include "kernels.hpp"

namespace cclz::compress {

namespace {
// Conversion goes through a stack buffer this long: small enough for L1,
// long enough that the per-chunk call costs nothing.
constexpr std::size_t kChunk = 2048;

std::span<const std::uint16_t> as_u16(std::span<const std::byte> b) noexcept {
  return {reinterpret_cast<const std::uint16_t*>(b.data()), b.size() / 2};
}
std::span<std::uint16_t> as_u16(std::span<std::byte> b) noexcept {
  return {reinterpret_cast<std::uint16_t*>(b.data()), b.size() / 2};
}
}  // namespace

void load_f32(std::span<const std::byte> src, DataType dt, std::span<float> dst) noexcept {
  if (dst.empty()) return;  // memcpy must not see the null data() of an empty vector
  switch (dt) {
    case DataType::f32: std::memcpy(dst.data(), src.data(), dst.size() * 4); break;
    case DataType::f16: kernels::half_to_float(as_u16(src), dst); break;
    case DataType::bf16: kernels::bf16_to_float(as_u16(src), dst); break;
    default: break;
  }
}

std::span<const float> f32_view(std::span<const std::byte> src, DataType dt, std::size_t n,
                                std::vector<float>& widened) {
  if (dt == DataType::f32) return as_f32(src);
  widened.resize(n);
  load_f32(src, dt, widened);
  return widened;
}

void store_f32(std::span<const float> src, DataType dt, std::span<std::byte> dst) noexcept {
  if (src.empty()) return;
  switch (dt) {
    case DataType::f32: std::memcpy(dst.data(), src.data(), src.size() * 4); break;
    case DataType::f16: kernels::float_to_half(src, as_u16(dst)); break;
    case DataType::bf16: kernels::float_to_bf16(src, as_u16(dst)); break;
    default: break;
  }
}

void add_scaled(std::span<const std::byte> src, DataType dt, std::span<float> acc, float alpha) noexcept {
  const std::size_t n = acc.size();
  float* a = acc.data();
  if (dt == DataType::f32) {
    const float* s = as_f32(src).data();
    if (alpha == 1.0f) {
      for (std::size_t i = 0; i < n; ++i) a[i] += s[i];
    } else {
      for (std::size_t i = 0; i < n; ++i) a[i] += alpha * s[i];
    }
    return;
  }
  const std::span<const std::uint16_t> h = as_u16(src);
  float buf[kChunk];
  for (std::size_t at = 0; at < n; at += kChunk) {
    const std::size_t len = std::min(kChunk, n - at);
    if (dt == DataType::f16) {
      kernels::half_to_float(h.subspan(at, len), std::span<float>(buf, len));
    } else {
      kernels::bf16_to_float(h.subspan(at, len), std::span<float>(buf, len));
    }
    float* d = a + at;
    for (std::size_t i = 0; i < len; ++i) d[i] += alpha * buf[i];
  }
}

void convert(std::span<const std::byte> src, DataType sdt, std::span<std::byte> dst, DataType ddt,
             std::size_t n) noexcept {
  if (n == 0) return;
  if (sdt == ddt) {
    std::memcpy(dst.data(), src.data(), n * dtype_size(sdt));
  } else if (sdt == DataType::f32) {
    store_f32(as_f32(src).first(n), ddt, dst);
  } else if (ddt == DataType::f32) {
    load_f32(src, sdt, as_f32(dst).first(n));
  } else {
    float buf[kChunk];
    for (std::size_t at = 0; at < n; at += kChunk) {
      const std::size_t len = std::min(kChunk, n - at);
      load_f32(src.subspan(at * 2, len * 2), sdt, std::span<float>(buf, len));
      store_f32(std::span<const float>(buf, len), ddt, dst.subspan(at * 2, len * 2));
    }
  }
}

Status get_ratio(const CompressorSpec& spec, double def, double* out) {
  double r = 0;
  if (Status s = spec_get_double(spec, "ratio", def, &r); !s.ok()) return s;
  if (!(r > 0.0 && r <= 1.0)) {
    return spec_error(spec, "ratio must be in (0, 1], got " + *spec.find("ratio"));
  }
  *out = r;
  return {};
}

Status check_u32_count(const Compressor& c, const TensorDesc& desc) {
  if (desc.count > 0xffffffffu) {
    return c.error("count " + std::to_string(desc.count) + " exceeds the u32 indices of sparse payloads");
  }
  return {};
}

std::uint64_t mix_seed(std::uint64_t seed, std::uint64_t step, std::uint64_t stream) noexcept {
  Rng r(seed ^ 0x6a09e667f3bcc908ULL);
  r.s ^= r.next() ^ step * 0xd1b54a32d192ed03ULL;
  r.s ^= r.next() ^ stream * 0x8cb92ba72f3d8dd7ULL;
  return r.next();
}

// ---------------------------------------------------------------- sparse payload

void sparse_write(std::span<const std::uint32_t> idx, std::span<const std::byte> src, DataType dt,
                  std::vector<std::byte>* out) {
  const std::size_t k = idx.size();
  const std::size_t vs = dtype_size(dt);
  out->resize(sparse_bytes(k, dt));
  std::byte* p = out->data();
  if (k != 0) std::memcpy(p, idx.data(), k * 4);
  std::byte* v = p + k * 4;
  const std::byte* s = src.data();
  if (vs == 4) {
    for (std::size_t j = 0; j < k; ++j) std::memcpy(v + j * 4, s + std::size_t{idx[j]} * 4, 4);
  } else {
    for (std::size_t j = 0; j < k; ++j) std::memcpy(v + j * 2, s + std::size_t{idx[j]} * 2, 2);
  }
}

namespace {
void sparse_add(std::span<const std::byte> payload, DataType vdt, std::span<float> acc, float alpha) noexcept {
  const std::size_t vs = dtype_size(vdt);
  const std::size_t k = payload.size() / (4 + vs);
  const std::byte* ip = payload.data();
  const std::byte* vp = ip + k * 4;
  float* a = acc.data();
  for (std::size_t j = 0; j < k; ++j) {
    std::uint32_t i;
    std::memcpy(&i, ip + j * 4, 4);
    float v;
    if (vdt == DataType::f32) {
      std::memcpy(&v, vp + j * 4, 4);
    } else {
      std::uint16_t h;
      std::memcpy(&h, vp + j * 2, 2);
      v = vdt == DataType::f16 ? kernels::half_to_float(h) : kernels::bf16_to_float(h);
    }
    a[i] += alpha * v;
  }
}
}  // namespace

Status sparse_decode_add(const Compressor& c, std::span<const std::byte> payload, DataType vdt, std::span<float> acc,
                         float alpha) {
  const std::size_t rec = 4 + dtype_size(vdt);
  if (payload.size() % rec != 0) {
    return c.error("sparse payload of " + std::to_string(payload.size()) + " bytes is not a whole number of " +
                   std::to_string(rec) + "-byte records (u32 index + " + dtype_name(vdt) + " value)");
  }
  const std::size_t k = payload.size() / rec;
  // Check every index before adding any, so a bad payload leaves acc as it was.
  const std::byte* ip = payload.data();
  for (std::size_t j = 0; j < k; ++j) {
    std::uint32_t i;
    std::memcpy(&i, ip + j * 4, 4);
    if (i >= acc.size()) {
      return c.error("sparse payload index " + std::to_string(i) + " (record " + std::to_string(j) +
                     ") is out of range for " + std::to_string(acc.size()) + " elements");
    }
  }
  sparse_add(payload, vdt, acc, alpha);
  return {};
}

void sparse_add_trusted(std::span<const std::byte> payload, DataType vdt, std::span<float> acc, float alpha) noexcept {
  sparse_add(payload, vdt, acc, alpha);
}

}  // namespace cclz::compress
