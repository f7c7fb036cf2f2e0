// stderr logging for CCLZ_DEBUG (see log.hpp). Cost: one string build and
// one write(2) per line, only when enabled.
#include "log.hpp"

#include <unistd.h>

#include <string>

namespace cclz::detail::log {

const char* level_name(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::none: return "NONE";
    case LogLevel::warn: return "WARN";
    case LogLevel::info: return "INFO";
    case LogLevel::trace: return "TRACE";
  }
  return "?";
}

void write(LogLevel level, int rank, std::string_view message) noexcept {
  try {
    std::string line = rank >= 0 ? "cclz rank " + std::to_string(rank) + ": " : std::string("cclz: ");
    line += level_name(level);
    line += ' ';
    line += message;
    line += '\n';
    // One write(2): stderr is unbuffered and lines from several threads or
    // processes must not be cut into each other.
    const char* p = line.data();
    std::size_t left = line.size();
    while (left > 0) {
      const ssize_t n = ::write(STDERR_FILENO, p, left);
      if (n <= 0) break;
      p += n;
      left -= static_cast<std::size_t>(n);
    }
  } catch (...) {
    // Out of memory while logging: drop the line rather than fail the caller.
  }
}

}  // namespace cclz::detail::log
