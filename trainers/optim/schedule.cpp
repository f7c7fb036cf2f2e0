// Warm-up + cosine (or constant) learning-rate schedule; see schedule.hpp.
#include "optim/schedule.hpp"

#include <cmath>
#include <cstdio>
#include <numbers>

namespace cclz::train {

const char* schedule_name(ScheduleKind k) noexcept { return k == ScheduleKind::cosine ? "cosine" : "constant"; }

bool parse_schedule(std::string_view s, ScheduleKind* out) noexcept {
  if (s == "cosine") {
    *out = ScheduleKind::cosine;
  } else if (s == "constant") {
    *out = ScheduleKind::constant;
  } else {
    return false;
  }
  return true;
}

float LrSchedule::at(int step) const noexcept {
  if (step < warmup) return max_lr * static_cast<float>(step + 1) / static_cast<float>(warmup);
  if (kind == ScheduleKind::constant) return max_lr;
  if (step >= total) return min_lr;
  const double p = static_cast<double>(step - warmup) / static_cast<double>(total - warmup);
  return static_cast<float>(min_lr + (static_cast<double>(max_lr) - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * p)));
}

Status validate(const LrSchedule& s) {
  char buf[200];
  if (!(s.max_lr > 0.0f) || !(s.min_lr >= 0.0f) || s.min_lr > s.max_lr) {
    std::snprintf(buf, sizeof buf, "schedule: want 0 <= min_lr <= max_lr and max_lr > 0, got min_lr %g, max_lr %g",
                  static_cast<double>(s.min_lr), static_cast<double>(s.max_lr));
    return {Result::invalid_argument, buf};
  }
  if (s.warmup < 0 || s.total < 1 || (s.kind == ScheduleKind::cosine && s.warmup >= s.total)) {
    std::snprintf(buf, sizeof buf, "schedule: want 0 <= warmup (%d) < total (%d) steps", s.warmup, s.total);
    return {Result::invalid_argument, buf};
  }
  return {};
}

}  // namespace cclz::train
