// The one list of algorithms. Adding an algorithm: one new file exporting a
// descriptor, plus one line here (and its file in collectives/meson.build).
#include <array>

#include "algorithm.hpp"

namespace cclz::coll {

extern const AlgorithmDesc allreduce_ring;
extern const AlgorithmDesc allreduce_tree;
extern const AlgorithmDesc allreduce_rabenseifner;
extern const AlgorithmDesc allreduce_hierarchical;
extern const AlgorithmDesc reduce_scatter_ring;
extern const AlgorithmDesc reduce_scatter_halving;
extern const AlgorithmDesc allgather_ring;
extern const AlgorithmDesc allgather_doubling;
extern const AlgorithmDesc alltoall_pairwise;
extern const AlgorithmDesc alltoall_bruck;
extern const AlgorithmDesc alltoallv_pairwise;
extern const AlgorithmDesc broadcast_binomial;
extern const AlgorithmDesc broadcast_chain;
extern const AlgorithmDesc reduce_binomial;
extern const AlgorithmDesc reduce_chain;
extern const AlgorithmDesc barrier_dissemination;
extern const AlgorithmDesc allreduce_shm;
extern const AlgorithmDesc reduce_scatter_shm;
extern const AlgorithmDesc allgather_shm;
extern const AlgorithmDesc alltoall_shm;
extern const AlgorithmDesc broadcast_shm;
extern const AlgorithmDesc reduce_shm;
extern const AlgorithmDesc barrier_shm;

namespace {
const std::array<const AlgorithmDesc*, 23> kRegistry = {
    &allreduce_ring,      &allreduce_tree,         &allreduce_rabenseifner, &allreduce_hierarchical,
    &allreduce_shm,       &reduce_scatter_ring,    &reduce_scatter_halving, &reduce_scatter_shm,
    &allgather_ring,      &allgather_doubling,     &allgather_shm,          &alltoall_pairwise,
    &alltoall_bruck,      &alltoall_shm,           &alltoallv_pairwise,     &broadcast_binomial,
    &broadcast_chain,     &broadcast_shm,          &reduce_binomial,        &reduce_chain,
    &reduce_shm,          &barrier_dissemination,  &barrier_shm,
};
}  // namespace

std::span<const AlgorithmDesc* const> all_algorithms() noexcept { return kRegistry; }

const AlgorithmDesc* find_algorithm(CollKind kind, std::string_view name) noexcept {
  for (const AlgorithmDesc* d : kRegistry) {
    if (d->kind == kind && name == d->name) return d;
  }
  return nullptr;
}

const char* coll_name(CollKind k) noexcept {
  switch (k) {
    case CollKind::all_reduce: return "all_reduce";
    case CollKind::reduce_scatter: return "reduce_scatter";
    case CollKind::all_gather: return "all_gather";
    case CollKind::all_to_all: return "all_to_all";
    case CollKind::all_to_allv: return "all_to_allv";
    case CollKind::broadcast: return "broadcast";
    case CollKind::reduce: return "reduce";
    case CollKind::barrier: return "barrier";
  }
  return "unknown";
}

}  // namespace cclz::coll
