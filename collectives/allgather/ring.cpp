// PLACEHOLDER: replaced by the real algorithm.
#include "algorithm.hpp"

namespace cclz::coll {
namespace {
Status run(Group&, const CollArgs&) { return {Result::internal_error, "ring not implemented yet"}; }
}  // namespace
extern const AlgorithmDesc allgather_ring;
const AlgorithmDesc allgather_ring = {CollKind::all_gather, "ring", "not implemented yet", nullptr, run};
}  // namespace cclz::coll
