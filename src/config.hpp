// Communicator configuration from CCLZ_* environment variables, read once
// when a communicator is made (a split inherits its parent's). Parsing only;
// nothing here keeps global state. Cost: a handful of getenv calls per
// communicator creation.
//
//   CCLZ_TIMEOUT=<seconds>    bound on every blocking wait (default 300; 0 = none)
//   CCLZ_CHECK=1              exchange (kind, count, dtype, op, root) before each collective
//   CCLZ_DEBUG=WARN|INFO|TRACE  log to stderr with a "cclz rank R:" prefix
//   CCLZ_ALGO=ring | all_reduce=ring,all_gather=doubling
//   CCLZ_LOCAL_SIZE=k         node = rank / k (declares k ranks per "node")
//   CCLZ_SHM=0|1              node-local shared-memory window (default 1)
//   CCLZ_SHM_SLOT_KB=<KiB>    staging slot size, multiple of 4 (default: per node, 256..1024)
//   CCLZ_SHM_SLOTS=<n>        slots per rank, 1..64 (default 4)
//   CCLZ_SHM_ALLREDUCE_HANDOFFS=auto|1|2  node-local all-reduce of at most 64 KiB
//                             per peer: protocol chosen by measurement, or fixed
//                             (the node's first rank's setting applies)
//   CCLZ_SHM_SLOT_STORES=auto|cache|memory  how streamed node-local calls
//                             write what peers read from their slots: chosen by
//                             measurement, or fixed (the node's first rank's
//                             setting applies)
//   CCLZ_SHM_DIRECT_KB=<KiB>|off  node-local calls whose largest buffer is at
//                             least this large copy straight between the ranks'
//                             buffers when every rank's are mapped (mem_alloc;
//                             default 1024; the node's first rank's setting applies);
//                             from 32-128 KiB (per collective) up to it, calls
//                             do so while the last agreement went direct
//   CCLZ_SHM_CMA=0|1|auto     node-local calls of heap buffers from 32-128 KiB
//                             (per collective, where it supports it; with more
//                             ranks than cores the all-to-all only, from 512 KiB)
//                             copy between the ranks' processes with
//                             process_vm_readv/writev (default auto: measured
//                             against the slots with a core per rank; the node's
//                             first rank's setting applies)
//   CCLZ_SPIN_US, CCLZ_YIELD_US, CCLZ_POLL_MS  checked here, applied by the
//                             UCX transport (UcxWaitPolicy::from_env)
//   (CCLZ_NODE_ID is read by the bootstrap into RankInfo::node_override.)
#pragma once

#include <array>
#include <string>
#include <string_view>

#include "algorithm.hpp"
#include "cclz/types.hpp"
#include "transport.hpp"

namespace cclz::detail {

enum class LogLevel : int { none = 0, warn = 1, info = 2, trace = 3 };

// Parsed CCLZ_ALGO. `any` applies to every collective that has an algorithm
// of that name; `per_kind` names one algorithm for one collective and wins.
struct AlgoOverride {
  std::string any;
  std::array<std::string, coll::kNumCollKinds> per_kind{};
  bool empty() const noexcept;
};

struct Config {
  double timeout_s = 300.0;  // <= 0: no limit
  bool check = false;
  LogLevel log_level = LogLevel::none;
  std::string algo_spec;  // CCLZ_ALGO as given
  AlgoOverride algo;
  int local_size = 0;  // CCLZ_LOCAL_SIZE, 0 = unset
  bool shm = true;
  std::size_t shm_slot_bytes = 0;  // CCLZ_SHM_SLOT_KB; 0 = chosen per node (default_slot_bytes)
  int shm_slots = 4;
  int shm_allreduce_handoffs = 0;  // CCLZ_SHM_ALLREDUCE_HANDOFFS; 0 = auto
  int shm_slot_stores = 0;         // CCLZ_SHM_SLOT_STORES; 0 = auto, 1 = cache, 2 = memory
  std::uint64_t shm_direct_min_bytes = std::uint64_t{1024} << 10;  // CCLZ_SHM_DIRECT_KB; ~0 = off
  int shm_cma = 2;  // CCLZ_SHM_CMA: 0 = never, 1 = always where it applies, 2 = auto (measured)
  std::uint64_t shm_l2_bytes = 0;   // CCLZ_SHM_L2_KB; 0 = the host's (sysfs)
  std::uint64_t shm_llc_bytes = 0;  // CCLZ_SHM_LLC_KB; 0 = the host's (sysfs)

  // The deadline of an operation that starts now.
  Clock::time_point deadline_from_now() const noexcept;
};

// "ring" or "all_reduce=ring,all_gather=doubling" (spaces ignored; '-' and
// '_' optional in collective names). Every name must exist in the registry:
// an unknown collective or algorithm is invalid_argument listing valid names.
Status parse_algo_spec(std::string_view spec, AlgoOverride* out);

// Reads the CCLZ_* variables above. A malformed value is invalid_argument
// naming the variable; nothing is silently ignored.
Status config_from_env(Config* out);

// "WARN", "info", ... (case-insensitive); false for anything else.
bool parse_log_level(std::string_view s, LogLevel* out) noexcept;

// CCLZ_DEBUG for code that runs before a communicator exists (bootstrap);
// none when unset or malformed.
LogLevel log_level_from_env() noexcept;

// "ring, tree, ..." for one collective, or every distinct name when `kind`
// is null.
std::string valid_algorithm_names(const coll::CollKind* kind);

// Collective from its name ("all_reduce", "allreduce", "all-reduce").
bool parse_coll_kind(std::string_view s, coll::CollKind* out) noexcept;

}  // namespace cclz::detail
