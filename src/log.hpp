// Diagnostics to stderr for CCLZ_DEBUG: one line per message, prefixed
// "cclz rank R: LEVEL", written with a single write() so lines from ranks
// and threads do not interleave. Cost: nothing when the level is off (the
// caller tests enabled() before building the message).
#pragma once

#include <string_view>

#include "config.hpp"

namespace cclz::detail::log {

inline bool enabled(LogLevel configured, LogLevel wanted) noexcept {
  return wanted != LogLevel::none && static_cast<int>(configured) >= static_cast<int>(wanted);
}

// rank < 0: no rank yet ("cclz: ...").
void write(LogLevel level, int rank, std::string_view message) noexcept;

const char* level_name(LogLevel level) noexcept;

}  // namespace cclz::detail::log
