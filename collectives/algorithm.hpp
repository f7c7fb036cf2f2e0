// What an algorithm is: a descriptor (collective, name, description,
// supports(), run()) over a coll::Group. One file per algorithm exports one
// descriptor; collectives/registry.cpp lists them.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

#include "cclz/types.hpp"
#include "group.hpp"

namespace cclz::coll {

enum class CollKind : int {
  all_reduce,
  reduce_scatter,
  all_gather,
  all_to_all,
  all_to_allv,
  broadcast,
  reduce,
  barrier,
};
inline constexpr int kNumCollKinds = 8;
const char* coll_name(CollKind k) noexcept;  // "all_reduce", ...

// Arguments as the algorithm sees them. Counts are in elements and follow
// NCCL: all_reduce/broadcast/reduce `count` = whole buffer; reduce_scatter
// `count` = per-rank result; all_gather `count` = per-rank input; all_to_all
// `count` = per peer. `op` is never avg: the communicator turns avg into sum
// and divides the result by the group size, itself after the algorithm, or,
// for an algorithm whose descriptor `divides`, by passing that size as
// `divisor`. In-place calls follow NCCL's conventions (see cclz.hpp);
// algorithms must handle them.
struct CollArgs {
  CollKind kind = CollKind::all_reduce;
  const void* sendbuf = nullptr;
  void* recvbuf = nullptr;
  std::size_t count = 0;
  DataType dt = DataType::f32;
  ReduceOp op = ReduceOp::sum;
  int root = 0;  // group rank of the root (broadcast, reduce)
  // Under avg, for an algorithm that `divides`: the result is the sum
  // divided by this, bitwise as kernels::divide on the sum. 1: no division.
  int divisor = 1;
  // all_to_allv only, in elements, one entry per group rank.
  std::span<const std::size_t> send_counts, send_displs, recv_counts, recv_displs;

  std::size_t elem_size() const noexcept { return dtype_size(dt); }
};

struct AlgorithmDesc {
  CollKind kind;
  const char* name;         // short, unique within its collective: "ring"
  const char* description;  // one line
  // Whether this algorithm can run this call on this group; null = always.
  bool (*supports)(const Group& g, const CollArgs& a);
  Status (*run)(Group& g, const CollArgs& a);
  // Whether run() applies CollArgs::divisor itself: where each share of the
  // result has one owner, the owner divides it while it is in the cache,
  // instead of every rank making another pass over its whole output.
  bool divides = false;
};

// The registry (registry.cpp).
std::span<const AlgorithmDesc* const> all_algorithms() noexcept;
const AlgorithmDesc* find_algorithm(CollKind kind, std::string_view name) noexcept;

// The tuner (tuner.cpp): the default algorithm for this call on this group.
const AlgorithmDesc* tune(const Group& g, const CollArgs& a) noexcept;

}  // namespace cclz::coll
