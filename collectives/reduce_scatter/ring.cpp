// PLACEHOLDER: replaced by the real algorithm.
#include "algorithm.hpp"

namespace cclz::coll {
namespace {
Status run(Group&, const CollArgs&) { return {Result::internal_error, "ring not implemented yet"}; }
}  // namespace
extern const AlgorithmDesc reduce_scatter_ring;
const AlgorithmDesc reduce_scatter_ring = {CollKind::reduce_scatter, "ring", "not implemented yet", nullptr, run};
}  // namespace cclz::coll
