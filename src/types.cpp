#include "cclz/types.hpp"

namespace cclz {

const char* result_name(Result r) noexcept {
  switch (r) {
    case Result::success: return "success";
    case Result::unhandled_cuda_error: return "unhandled CUDA error";
    case Result::system_error: return "system error";
    case Result::internal_error: return "internal error";
    case Result::invalid_argument: return "invalid argument";
    case Result::invalid_usage: return "invalid usage";
    case Result::remote_error: return "remote error";
    case Result::in_progress: return "in progress";
    case Result::timeout: return "timeout";
  }
  return "unknown result";
}

std::string Status::to_string() const {
  if (message_.empty()) return result_name(code_);
  return std::string(result_name(code_)) + ": " + message_;
}

std::size_t dtype_size(DataType t) noexcept {
  switch (t) {
    case DataType::i8:
    case DataType::u8: return 1;
    case DataType::f16:
    case DataType::bf16: return 2;
    case DataType::i32:
    case DataType::f32: return 4;
    case DataType::i64:
    case DataType::f64: return 8;
  }
  return 0;
}

bool dtype_valid(DataType t) noexcept { return dtype_size(t) != 0; }

bool dtype_is_float(DataType t) noexcept {
  return t == DataType::f16 || t == DataType::bf16 || t == DataType::f32 || t == DataType::f64;
}

const char* dtype_name(DataType t) noexcept {
  switch (t) {
    case DataType::i8: return "i8";
    case DataType::u8: return "u8";
    case DataType::i32: return "i32";
    case DataType::i64: return "i64";
    case DataType::f16: return "f16";
    case DataType::f32: return "f32";
    case DataType::f64: return "f64";
    case DataType::bf16: return "bf16";
  }
  return "unknown";
}

bool parse_dtype(std::string_view s, DataType* out) noexcept {
  struct Alias {
    std::string_view name;
    DataType t;
  };
  // Short names plus the spellings nccl-tests users type.
  static constexpr Alias kAliases[] = {
      {"i8", DataType::i8},     {"int8", DataType::i8},       {"u8", DataType::u8},
      {"uint8", DataType::u8},  {"i32", DataType::i32},       {"int32", DataType::i32},
      {"int", DataType::i32},   {"i64", DataType::i64},       {"int64", DataType::i64},
      {"f16", DataType::f16},   {"half", DataType::f16},      {"float16", DataType::f16},
      {"f32", DataType::f32},   {"float", DataType::f32},     {"float32", DataType::f32},
      {"f64", DataType::f64},   {"double", DataType::f64},    {"float64", DataType::f64},
      {"bf16", DataType::bf16}, {"bfloat16", DataType::bf16},
  };
  for (const Alias& a : kAliases) {
    if (a.name == s) {
      *out = a.t;
      return true;
    }
  }
  return false;
}

bool op_valid(ReduceOp o) noexcept {
  return o == ReduceOp::sum || o == ReduceOp::prod || o == ReduceOp::max || o == ReduceOp::min ||
         o == ReduceOp::avg;
}

const char* op_name(ReduceOp o) noexcept {
  switch (o) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::prod: return "prod";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
    case ReduceOp::avg: return "avg";
  }
  return "unknown";
}

bool parse_op(std::string_view s, ReduceOp* out) noexcept {
  for (ReduceOp o : kAllReduceOps) {
    if (s == op_name(o)) {
      *out = o;
      return true;
    }
  }
  return false;
}

}  // namespace cclz
