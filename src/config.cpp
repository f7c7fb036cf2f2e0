// CCLZ_* environment parsing for communicators (see config.hpp).
// Cost: creation-time only.
#include "config.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

namespace cclz::detail {

namespace {

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return r;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Collective names without '_' and '-' so "allreduce" and "all-reduce" work.
std::string squash(std::string_view s) {
  std::string r;
  for (char c : lower(s)) {
    if (c != '_' && c != '-') r += c;
  }
  return r;
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

bool has_algorithm_named(std::string_view name) {
  for (const coll::AlgorithmDesc* d : coll::all_algorithms()) {
    if (name == d->name) return true;
  }
  return false;
}

std::string all_kind_names() {
  std::string r;
  for (int k = 0; k < coll::kNumCollKinds; ++k) {
    r += (r.empty() ? "" : ", ") + std::string(coll::coll_name(static_cast<coll::CollKind>(k)));
  }
  return r;
}

}  // namespace

bool AlgoOverride::empty() const noexcept {
  if (!any.empty()) return false;
  for (const std::string& s : per_kind) {
    if (!s.empty()) return false;
  }
  return true;
}

Clock::time_point Config::deadline_from_now() const noexcept {
  // "No limit" is a century, so deadline arithmetic never overflows.
  const double s = timeout_s > 0 ? timeout_s : 100.0 * 365 * 24 * 3600;
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

bool parse_coll_kind(std::string_view s, coll::CollKind* out) noexcept {
  const std::string want = squash(s);
  for (int k = 0; k < coll::kNumCollKinds; ++k) {
    const auto kind = static_cast<coll::CollKind>(k);
    if (squash(coll::coll_name(kind)) == want) {
      *out = kind;
      return true;
    }
  }
  return false;
}

std::string valid_algorithm_names(const coll::CollKind* kind) {
  std::vector<std::string> names;
  for (const coll::AlgorithmDesc* d : coll::all_algorithms()) {
    if (kind != nullptr && d->kind != *kind) continue;
    bool seen = false;
    for (const std::string& n : names) seen = seen || n == d->name;
    if (!seen) names.emplace_back(d->name);
  }
  std::string r;
  for (const std::string& n : names) r += (r.empty() ? "" : ", ") + n;
  return r.empty() ? "(none)" : r;
}

Status parse_algo_spec(std::string_view spec, AlgoOverride* out) {
  AlgoOverride r;
  std::string_view rest = spec;
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    std::string_view item = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    if (item.empty()) continue;
    const auto eq = item.find('=');
    if (eq == std::string_view::npos) {
      // A bare name: meant for every collective that has it.
      if (!r.any.empty()) {
        return {Result::invalid_argument, "CCLZ_ALGO='" + std::string(spec) + "': more than one bare algorithm name"};
      }
      if (!has_algorithm_named(item)) {
        return {Result::invalid_argument, "CCLZ_ALGO='" + std::string(spec) + "': no collective has an algorithm '" +
                                              std::string(item) + "' (valid: " + valid_algorithm_names(nullptr) + ")"};
      }
      r.any = std::string(item);
      continue;
    }
    const std::string_view key = trim(item.substr(0, eq));
    const std::string_view name = trim(item.substr(eq + 1));
    coll::CollKind kind{};
    if (!parse_coll_kind(key, &kind)) {
      return {Result::invalid_argument, "CCLZ_ALGO='" + std::string(spec) + "': unknown collective '" +
                                            std::string(key) + "' (valid: " + all_kind_names() + ")"};
    }
    if (coll::find_algorithm(kind, name) == nullptr) {
      return {Result::invalid_argument, "CCLZ_ALGO='" + std::string(spec) + "': " + coll::coll_name(kind) +
                                            " has no algorithm '" + std::string(name) +
                                            "' (valid: " + valid_algorithm_names(&kind) + ")"};
    }
    r.per_kind[static_cast<std::size_t>(kind)] = std::string(name);
  }
  *out = std::move(r);
  return {};
}

bool parse_log_level(std::string_view s, LogLevel* out) noexcept {
  struct Name {
    std::string_view name;
    LogLevel level;
  };
  static constexpr Name kNames[] = {{"none", LogLevel::none}, {"off", LogLevel::none},   {"warn", LogLevel::warn},
                                    {"info", LogLevel::info}, {"trace", LogLevel::trace}, {"version", LogLevel::warn}};
  std::string l;
  for (char c : s) l += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  for (const Name& n : kNames) {
    if (l == n.name) {
      *out = n.level;
      return true;
    }
  }
  return false;
}

LogLevel log_level_from_env() noexcept {
  LogLevel l = LogLevel::none;
  if (const char* v = env("CCLZ_DEBUG"); v != nullptr && !parse_log_level(v, &l)) return LogLevel::none;
  return l;
}

Status config_from_env(Config* out) {
  Config c;
  if (const char* v = env("CCLZ_TIMEOUT")) {
    char* end = nullptr;
    errno = 0;
    const double s = std::strtod(v, &end);
    if (end == v || !trim(end).empty() || errno != 0 || !std::isfinite(s) || s < 0) {
      return {Result::invalid_argument, std::string("CCLZ_TIMEOUT='") + v + "' is not a number of seconds >= 0"};
    }
    c.timeout_s = s;
  }
  if (const char* v = env("CCLZ_CHECK")) {
    const std::string l = lower(v);
    if (l == "1" || l == "true" || l == "yes" || l == "on") {
      c.check = true;
    } else if (l == "0" || l == "false" || l == "no" || l == "off") {
      c.check = false;
    } else {
      return {Result::invalid_argument, std::string("CCLZ_CHECK='") + v + "' is not 0 or 1"};
    }
  }
  if (const char* v = env("CCLZ_DEBUG"); v != nullptr && !parse_log_level(v, &c.log_level)) {
    return {Result::invalid_argument, std::string("CCLZ_DEBUG='") + v + "' is not one of NONE, WARN, INFO, TRACE"};
  }
  if (const char* v = env("CCLZ_ALGO")) {
    c.algo_spec = v;
    if (Status st = parse_algo_spec(v, &c.algo); !st.ok()) return st;
  }
  if (const char* v = env("CCLZ_LOCAL_SIZE")) {
    char* end = nullptr;
    errno = 0;
    const long k = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || errno != 0 || k <= 0 || k > std::numeric_limits<int>::max()) {
      return {Result::invalid_argument, std::string("CCLZ_LOCAL_SIZE='") + v + "' is not a positive integer"};
    }
    c.local_size = static_cast<int>(k);
  }
  if (const char* v = env("CCLZ_SHM")) {
    const std::string l = lower(v);
    if (l == "1" || l == "true" || l == "yes" || l == "on") {
      c.shm = true;
    } else if (l == "0" || l == "false" || l == "no" || l == "off") {
      c.shm = false;
    } else {
      return {Result::invalid_argument, std::string("CCLZ_SHM='") + v + "' is not 0 or 1"};
    }
  }
  auto int_in = [](const char* name, const char* v, long lo, long hi, long step, long* out) -> Status {
    char* end = nullptr;
    errno = 0;
    const long k = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || errno != 0 || k < lo || k > hi || k % step != 0) {
      return {Result::invalid_argument, std::string(name) + "='" + v + "' is not an integer in [" +
                                            std::to_string(lo) + ", " + std::to_string(hi) + "]" +
                                            (step > 1 ? " divisible by " + std::to_string(step) : std::string())};
    }
    *out = k;
    return {};
  };
  if (const char* v = env("CCLZ_SHM_SLOT_KB")) {
    long k = 0;
    if (Status st = int_in("CCLZ_SHM_SLOT_KB", v, 4, 1 << 20, 4, &k); !st.ok()) return st;
    c.shm_slot_bytes = static_cast<std::size_t>(k) << 10;
  }
  if (const char* v = env("CCLZ_SHM_SLOTS")) {
    long k = 0;
    if (Status st = int_in("CCLZ_SHM_SLOTS", v, 1, 64, 1, &k); !st.ok()) return st;
    c.shm_slots = static_cast<int>(k);
  }
  if (const char* v = env("CCLZ_SHM_ALLREDUCE_HANDOFFS")) {
    const std::string l = lower(v);
    if (l == "auto") {
      c.shm_allreduce_handoffs = 0;
    } else if (l == "1" || l == "2") {
      c.shm_allreduce_handoffs = l[0] - '0';
    } else {
      return {Result::invalid_argument, std::string("CCLZ_SHM_ALLREDUCE_HANDOFFS='") + v + "' is not auto, 1 or 2"};
    }
  }
  if (const char* v = env("CCLZ_SHM_SLOT_STORES")) {
    const std::string l = lower(v);
    if (l == "auto") {
      c.shm_slot_stores = 0;
    } else if (l == "cache") {
      c.shm_slot_stores = 1;
    } else if (l == "memory") {
      c.shm_slot_stores = 2;
    } else {
      return {Result::invalid_argument, std::string("CCLZ_SHM_SLOT_STORES='") + v + "' is not auto, cache or memory"};
    }
  }
  for (auto [name, out] :
       {std::pair{"CCLZ_SHM_L2_KB", &c.shm_l2_bytes}, std::pair{"CCLZ_SHM_LLC_KB", &c.shm_llc_bytes}}) {
    if (const char* v = env(name)) {
      long k = 0;
      if (Status st = int_in(name, v, 64, 1L << 30, 1, &k); !st.ok()) return st;
      *out = static_cast<std::uint64_t>(k) << 10;
    }
  }
  if (const char* v = env("CCLZ_SHM_DIRECT_KB")) {
    if (lower(v) == "off") {
      c.shm_direct_min_bytes = ~std::uint64_t{0};
    } else {
      long k = 0;
      if (Status st = int_in("CCLZ_SHM_DIRECT_KB", v, 0, 1L << 30, 1, &k); !st.ok()) {
        return {st.code(), st.message() + " or off"};
      }
      c.shm_direct_min_bytes = static_cast<std::uint64_t>(k) << 10;
    }
  }
  if (const char* v = env("CCLZ_SHM_CMA")) {
    const std::string l = lower(v);
    if (l == "0" || l == "1") {
      c.shm_cma = l[0] - '0';
    } else if (l == "auto") {
      c.shm_cma = 2;
    } else {
      return {Result::invalid_argument, std::string("CCLZ_SHM_CMA='") + v + "' is not auto, 0 or 1"};
    }
  }
  // The transport reads the wait back-off itself (UcxWaitPolicy::from_env);
  // checking the values here makes a malformed one fail the communicator's
  // creation instead of silently becoming the default.
  for (const auto& [name, lo] : {std::pair{"CCLZ_SPIN_US", 0L}, std::pair{"CCLZ_YIELD_US", 0L},
                                 std::pair{"CCLZ_POLL_MS", 1L}}) {
    if (const char* v = env(name)) {
      long k = 0;
      if (Status st = int_in(name, v, lo, 1000000000L, 1, &k); !st.ok()) return st;
    }
  }
  *out = std::move(c);
  return {};
}

}  // namespace cclz::detail
