// cclz basic vocabulary: result codes, statuses, data types and reduction ops.
// Numeric values of the enums match NCCL's so that an NCCL-shaped C ABI can
// pass them through unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace cclz {

enum class Result : int {
  success = 0,
  unhandled_cuda_error = 1,
  system_error = 2,
  internal_error = 3,
  invalid_argument = 4,
  invalid_usage = 5,
  remote_error = 6,  // a peer failed, aborted or disappeared
  in_progress = 7,
  timeout = 8,       // a collective or the rendezvous stalled past CCLZ_TIMEOUT
};

const char* result_name(Result r) noexcept;

// A result code with a human-readable message. Messages name the rank, the
// collective, its sequence number and the cause.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Result code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok_status() { return {}; }

  bool ok() const noexcept { return code_ == Result::success; }
  Result code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }
  // "<result name>: <message>"
  std::string to_string() const;

 private:
  Result code_ = Result::success;
  std::string message_;
};

enum class DataType : int {
  i8 = 0,
  u8 = 1,
  i32 = 2,
  i64 = 4,
  f16 = 6,
  f32 = 7,
  f64 = 8,
  bf16 = 9,
};

inline constexpr DataType kAllDataTypes[] = {DataType::f32, DataType::f64, DataType::f16, DataType::bf16,
                                              DataType::i8,  DataType::u8,  DataType::i32, DataType::i64};

enum class ReduceOp : int {
  sum = 0,
  prod = 1,
  max = 2,
  min = 3,
  avg = 4,  // sum divided by the group size (integer types: truncating division)
};

inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::max, ReduceOp::min,
                                             ReduceOp::avg};

// 0 for an unknown value.
std::size_t dtype_size(DataType t) noexcept;
bool dtype_valid(DataType t) noexcept;
bool dtype_is_float(DataType t) noexcept;
const char* dtype_name(DataType t) noexcept;  // "f32", "bf16", ...; "unknown" otherwise
bool parse_dtype(std::string_view s, DataType* out) noexcept;

bool op_valid(ReduceOp o) noexcept;
const char* op_name(ReduceOp o) noexcept;  // "sum", ...
bool parse_op(std::string_view s, ReduceOp* out) noexcept;

}  // namespace cclz
