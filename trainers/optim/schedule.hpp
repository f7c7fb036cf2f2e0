// Learning-rate schedule: linear warm-up then cosine decay (Loshchilov,
// Hutter 2017, without restarts), or constant after warm-up. Step s counts
// from 0:
//   s < warmup:          max_lr * (s + 1) / warmup
//   constant:            max_lr
//   cosine, s < total:   min_lr + (max_lr - min_lr) (1 + cos(pi p)) / 2,
//                        p = (s - warmup) / (total - warmup)
//   cosine, s >= total:  min_lr
// so lr(warmup - 1) = lr(warmup) = max_lr and lr(total) = min_lr.
#pragma once

#include <string_view>

#include "cclz/types.hpp"

namespace cclz::train {

enum class ScheduleKind { constant, cosine };
const char* schedule_name(ScheduleKind k) noexcept;
bool parse_schedule(std::string_view s, ScheduleKind* out) noexcept;

struct LrSchedule {
  ScheduleKind kind = ScheduleKind::cosine;
  float max_lr = 1e-3f;
  float min_lr = 1e-4f;
  int warmup = 0;  // steps
  int total = 1;   // steps; the cosine reaches min_lr here

  float at(int step) const noexcept;
};
Status validate(const LrSchedule& s);

}  // namespace cclz::train
