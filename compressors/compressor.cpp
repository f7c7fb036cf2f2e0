// The compressor framework: spec parsing, the per-tensor state and its saved
// form, and the checks the public round-protocol functions make before they
// call a compressor's implementation.
#include <charconv>
#include <cmath>
#include <cstring>

#include "cclz/compress.hpp"
#include "compressors/common.hpp"

namespace cclz {

// ---------------------------------------------------------------- spec

namespace {

bool is_ident_char(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; }

bool is_ident(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!is_ident_char(c)) return false;
  }
  return true;
}

Status bad_spec(std::string_view text, std::string_view problem) {
  return {Result::invalid_argument, "compressor spec '" + std::string(text) + "': " + std::string(problem)};
}

}  // namespace

const std::string* CompressorSpec::find(std::string_view key) const noexcept {
  for (const auto& [k, v] : params) {
    if (k == key) return &v;
  }
  return nullptr;
}

Status parse_compressor_spec(std::string_view text, CompressorSpec* out) {
  CompressorSpec spec;
  spec.text = std::string(text);
  std::string_view rest = text;
  if (rest.empty()) return bad_spec(text, "empty spec");
  if (rest.starts_with("auto:")) {
    spec.auto_select = true;
    rest.remove_prefix(5);
  }
  if (rest.starts_with("ef21+")) {
    spec.feedback = Feedback::ef21;
    rest.remove_prefix(5);
  } else if (rest.starts_with("ef+")) {
    spec.feedback = Feedback::ef;
    rest.remove_prefix(3);
  }
  if (rest.starts_with("ef+") || rest.starts_with("ef21+")) {
    return bad_spec(text, "at most one error-feedback decorator (ef+ or ef21+)");
  }
  if (rest.starts_with("auto:")) return bad_spec(text, "'auto:' must come first");
  const std::size_t colon = rest.find(':');
  const std::string_view name = rest.substr(0, colon);
  if (name.empty()) return bad_spec(text, "missing compressor name");
  if (!is_ident(name)) {
    return bad_spec(text, "bad compressor name '" + std::string(name) + "' (letters a-z, digits, '_')");
  }
  spec.name = std::string(name);
  if (colon != std::string_view::npos) {
    std::string_view params = rest.substr(colon + 1);
    if (params.empty()) return bad_spec(text, "empty parameter list after ':'");
    while (true) {
      const std::size_t comma = params.find(',');
      const std::string_view item = params.substr(0, comma);
      const std::size_t eq = item.find('=');
      if (eq == std::string_view::npos) {
        return bad_spec(text, "parameter '" + std::string(item) + "' is not key=value");
      }
      const std::string_view key = item.substr(0, eq);
      const std::string_view value = item.substr(eq + 1);
      if (!is_ident(key)) return bad_spec(text, "bad parameter key '" + std::string(key) + "'");
      if (value.empty()) return bad_spec(text, "parameter '" + std::string(key) + "' has no value");
      if (value.find('=') != std::string_view::npos) {
        return bad_spec(text, "parameter '" + std::string(item) + "' has more than one '='");
      }
      if (spec.find(key) != nullptr) return bad_spec(text, "parameter '" + std::string(key) + "' given twice");
      spec.params.emplace_back(std::string(key), std::string(value));
      if (comma == std::string_view::npos) break;
      params.remove_prefix(comma + 1);
    }
  }
  *out = std::move(spec);
  return {};
}

Status spec_error(const CompressorSpec& spec, std::string_view problem) { return bad_spec(spec.text, problem); }

Status spec_get_double(const CompressorSpec& spec, std::string_view key, double def, double* out) {
  const std::string* v = spec.find(key);
  if (v == nullptr) {
    *out = def;
    return {};
  }
  double d = 0;
  const auto [ptr, ec] = std::from_chars(v->data(), v->data() + v->size(), d);
  if (ec != std::errc() || ptr != v->data() + v->size() || !std::isfinite(d)) {
    return spec_error(spec, std::string(key) + "=" + *v + " is not a finite number");
  }
  *out = d;
  return {};
}

Status spec_get_int(const CompressorSpec& spec, std::string_view key, std::int64_t def, std::int64_t* out) {
  const std::string* v = spec.find(key);
  if (v == nullptr) {
    *out = def;
    return {};
  }
  std::int64_t i = 0;
  const auto [ptr, ec] = std::from_chars(v->data(), v->data() + v->size(), i);
  if (ec != std::errc() || ptr != v->data() + v->size()) {
    return spec_error(spec, std::string(key) + "=" + *v + " is not an integer");
  }
  *out = i;
  return {};
}

Status spec_get_bool(const CompressorSpec& spec, std::string_view key, bool def, bool* out) {
  const std::string* v = spec.find(key);
  if (v == nullptr) {
    *out = def;
  } else if (*v == "1" || *v == "true") {
    *out = true;
  } else if (*v == "0" || *v == "false") {
    *out = false;
  } else {
    return spec_error(spec, std::string(key) + "=" + *v + " is not 0, 1, true or false");
  }
  return {};
}

const char* aggregation_name(Aggregation a) noexcept {
  switch (a) {
    case Aggregation::summable: return "summable";
    case Aggregation::requantizable: return "requantizable";
    case Aggregation::gather_only: return "gather_only";
  }
  return "unknown";
}

// ---------------------------------------------------------------- state

namespace {
constexpr char kStateMagic[4] = {'C', 'Z', 'S', '1'};
}

CompressorState::CompressorState(const Compressor& owner, const TensorDesc& desc) : owner_(&owner), desc_(desc) {}
CompressorState::~CompressorState() = default;

void state_put(std::vector<std::byte>* out, const void* data, std::size_t bytes) {
  const auto* p = static_cast<const std::byte*>(data);
  out->insert(out->end(), p, p + bytes);
}

bool state_get(std::span<const std::byte>* in, void* data, std::size_t bytes) {
  if (in->size() < bytes) return false;
  if (bytes != 0) std::memcpy(data, in->data(), bytes);
  *in = in->subspan(bytes);
  return true;
}

void CompressorState::save_body(std::vector<std::byte>*) const {}

Status CompressorState::load_body(std::span<const std::byte> in) {
  if (!in.empty()) return owner_->error("saved state has a body this compressor does not keep");
  return {};
}

Status CompressorState::save(std::vector<std::byte>* out) const {
  const std::string name = owner_->name();
  const auto name_len = static_cast<std::uint32_t>(name.size());
  const std::uint64_t count = desc_.count, rows = desc_.rows, cols = desc_.cols;
  const auto dt = static_cast<std::int32_t>(desc_.dtype);
  state_put(out, kStateMagic, 4);
  state_put(out, &name_len, sizeof name_len);
  state_put(out, name.data(), name.size());
  state_put(out, &count, 8);
  state_put(out, &dt, 4);
  state_put(out, &rows, 8);
  state_put(out, &cols, 8);
  state_put(out, &step_, 8);
  const std::size_t len_at = out->size();
  std::uint64_t body_len = 0;
  state_put(out, &body_len, 8);
  save_body(out);
  body_len = out->size() - len_at - 8;
  std::memcpy(out->data() + len_at, &body_len, 8);
  return {};
}

Status CompressorState::load(std::span<const std::byte> in) {
  const Compressor& c = *owner_;
  char magic[4];
  std::uint32_t name_len = 0;
  if (!state_get(&in, magic, 4) || std::memcmp(magic, kStateMagic, 4) != 0) {
    return c.error("saved state does not start with 'CZS1'");
  }
  if (!state_get(&in, &name_len, 4) || in.size() < name_len) return c.error("saved state truncated");
  const std::string name(reinterpret_cast<const char*>(in.data()), name_len);
  in = in.subspan(name_len);
  std::uint64_t count = 0, rows = 0, cols = 0, step = 0, body_len = 0;
  std::int32_t dt = 0;
  if (!state_get(&in, &count, 8) || !state_get(&in, &dt, 4) || !state_get(&in, &rows, 8) ||
      !state_get(&in, &cols, 8) || !state_get(&in, &step, 8) || !state_get(&in, &body_len, 8)) {
    return c.error("saved state truncated");
  }
  if (name != c.name()) {
    return c.error("saved state is for compressor '" + name + "', not '" + c.name() + "'");
  }
  if (count != desc_.count || rows != desc_.rows || cols != desc_.cols ||
      dt != static_cast<std::int32_t>(desc_.dtype)) {
    return c.error("saved state is for a tensor of " + std::to_string(count) + " " +
                                  dtype_name(static_cast<DataType>(dt)) + " (" + std::to_string(rows) + "x" +
                                  std::to_string(cols) + "), this one has " + std::to_string(desc_.count) + " " +
                                  dtype_name(desc_.dtype) + " (" + std::to_string(desc_.rows) + "x" +
                                  std::to_string(desc_.cols) + ")");
  }
  if (in.size() != body_len) {
    return c.error("saved state body is " + std::to_string(in.size()) + " bytes, its header says " +
                                  std::to_string(body_len));
  }
  if (Status st = load_body(in); !st.ok()) return st;
  step_ = step;
  round_ = -1;
  return {};
}

// ---------------------------------------------------------------- compressor

Compressor::~Compressor() = default;

std::string Compressor::name() const { return spec_.name; }

bool Compressor::supports_dtype(DataType dt) const noexcept {
  return dt == DataType::f32 || dt == DataType::f16 || dt == DataType::bf16;
}

Status Compressor::error(std::string_view problem) const { return spec_error(spec_, problem); }

Status Compressor::check_state(const CompressorState& state, const char* fn) const {
  if (state.owner_ != this) {
    return error(std::string(fn) + ": the state was made by compressor '" + state.owner_->spec().text +
                 "', not this one");
  }
  return {};
}

Status Compressor::check_size(const CompressorState& state, std::size_t bytes, std::size_t elem,
                              const char* what) const {
  const std::size_t want = state.desc_.count * elem;
  if (bytes != want) {
    return error(std::string(what) + " is " + std::to_string(bytes) + " bytes, the tensor needs " +
                 std::to_string(want));
  }
  return {};
}

Status Compressor::make_state(const TensorDesc& desc, std::unique_ptr<CompressorState>* out) const {
  if (!supports_dtype(desc.dtype)) {
    return error(std::string("dtype ") + dtype_name(desc.dtype) + " is not supported by " + name());
  }
  if ((desc.rows == 0) != (desc.cols == 0) || (desc.rows != 0 && desc.rows * desc.cols != desc.count)) {
    return error("shape " + std::to_string(desc.rows) + "x" + std::to_string(desc.cols) + " does not hold " +
                 std::to_string(desc.count) + " elements");
  }
  std::unique_ptr<CompressorState> st;
  if (Status s = on_make_state(desc, &st); !s.ok()) return s;
  if (!st || st->owner_ != this) return error("internal: make_state returned a state of another compressor");
  *out = std::move(st);
  return {};
}

Status Compressor::on_make_state(const TensorDesc& desc, std::unique_ptr<CompressorState>* out) const {
  *out = std::make_unique<CompressorState>(*this, desc);
  return {};
}

namespace {
Status check_payload(const Compressor& c, const Payload& p) {
  if (p.aggregation == Aggregation::summable) {
    const std::size_t es = dtype_size(p.sum_dtype);
    if (es == 0 || p.bytes.size() % es != 0) {
      return spec_error(c.spec(), "internal: summable payload of " + std::to_string(p.bytes.size()) +
                                      " bytes is not an array of " + dtype_name(p.sum_dtype));
    }
  }
  return {};
}
}  // namespace

Status Compressor::begin(CompressorState& state, std::span<const std::byte> grad, Payload* out) const {
  if (Status s = check_state(state, "begin"); !s.ok()) return s;
  if (Status s = check_size(state, grad.size(), dtype_size(state.desc_.dtype), "gradient"); !s.ok()) return s;
  ++state.step_;
  state.round_ = -1;
  if (Status s = on_begin(state, grad, out); !s.ok()) return s;
  if (Status s = check_payload(*this, *out); !s.ok()) return s;
  out->round = 0;
  state.round_ = 0;
  state.last_ = out->last;
  WireStats& w = state.wire_;
  w.last_payload_bytes = out->bytes.size();
  w.last_dense_bytes = state.desc_.dense_bytes();
  w.total_payload_bytes += out->bytes.size();
  w.total_dense_bytes += state.desc_.dense_bytes();
  ++w.steps;
  return {};
}

Status Compressor::next(CompressorState& state, Aggregate agg, Payload* out) const {
  if (Status s = check_state(state, "next"); !s.ok()) return s;
  if (state.round_ < 0) return error("next() without begin() in this step");
  if (state.last_) return error("next() after the last round (call finish())");
  if (agg.empty()) return error("next() with an empty aggregate");
  const int round = state.round_ + 1;
  if (Status s = on_next(state, agg, out); !s.ok()) return s;
  if (Status s = check_payload(*this, *out); !s.ok()) return s;
  out->round = round;
  state.round_ = round;
  state.last_ = out->last;
  state.wire_.last_payload_bytes += out->bytes.size();
  state.wire_.total_payload_bytes += out->bytes.size();
  return {};
}

Status Compressor::on_next(CompressorState&, Aggregate, Payload*) const {
  return error("internal: " + name() + " has one round, next() is not defined for it");
}

Status Compressor::finish(CompressorState& state, Aggregate agg, std::span<std::byte> out, float alpha) const {
  if (Status s = check_state(state, "finish"); !s.ok()) return s;
  if (state.round_ < 0) return error("finish() without begin() in this step");
  if (!state.last_) return error("finish() before the last round (call next())");
  if (agg.empty()) return error("finish() with an empty aggregate");
  if (Status s = check_size(state, out.size(), dtype_size(state.desc_.dtype), "output"); !s.ok()) return s;
  state.round_ = -1;
  return on_finish(state, agg, out, alpha);
}

Status Compressor::on_finish(CompressorState& state, Aggregate agg, std::span<std::byte> out, float alpha) const {
  const TensorDesc& d = state.desc_;
  std::span<float> sum;
  if (d.dtype == DataType::f32) {
    sum = compress::as_f32(out);
  } else {
    state.finish_sum_.resize(d.count);
    sum = state.finish_sum_;
  }
  std::fill(sum.begin(), sum.end(), 0.0f);
  for (std::span<const std::byte> p : agg) {
    if (Status s = decode_add(state, p, sum, alpha); !s.ok()) return s;
  }
  if (d.dtype != DataType::f32) compress::store_f32(sum, d.dtype, out);
  return {};
}

Status Compressor::decode_add(const CompressorState& state, std::span<const std::byte> payload, std::span<float> acc,
                              float alpha) const {
  if (Status s = check_state(state, "decode_add"); !s.ok()) return s;
  if (Status s = check_size(state, acc.size() * sizeof(float), sizeof(float), "accumulator"); !s.ok()) return s;
  return on_decode_add(state, payload, acc, alpha);
}

Status Compressor::decode(const CompressorState& state, std::span<const std::byte> payload,
                          std::span<std::byte> out) const {
  if (Status s = check_state(state, "decode"); !s.ok()) return s;
  if (Status s = check_size(state, out.size(), dtype_size(state.desc_.dtype), "output"); !s.ok()) return s;
  return on_decode(state, payload, out);
}

Status Compressor::on_decode(const CompressorState& state, std::span<const std::byte> payload,
                             std::span<std::byte> out) const {
  const TensorDesc& d = state.desc_;
  if (d.dtype == DataType::f32) {
    std::span<float> o = compress::as_f32(out);
    std::fill(o.begin(), o.end(), 0.0f);
    return on_decode_add(state, payload, o, 1.0f);
  }
  std::vector<float> tmp(d.count, 0.0f);
  if (Status s = on_decode_add(state, payload, tmp, 1.0f); !s.ok()) return s;
  compress::store_f32(tmp, d.dtype, out);
  return {};
}

std::size_t Compressor::payload_bytes(std::size_t) const noexcept { return 0; }

Status Compressor::encode_chunk(const CompressorState&, std::span<const float>, std::size_t,
                                std::span<std::byte>) const {
  return {Result::invalid_usage,
          "compressor spec '" + spec_.text + "': encode_chunk: " + name() + " is not re-quantizable"};
}

Status Compressor::decode_chunk_add(const CompressorState&, std::span<const std::byte>, std::size_t,
                                    std::span<float>) const {
  return {Result::invalid_usage,
          "compressor spec '" + spec_.text + "': decode_chunk_add: " + name() + " is not re-quantizable"};
}

}  // namespace cclz
