// PLACEHOLDER: replaced by the real algorithm.
#include "algorithm.hpp"

namespace cclz::coll {
namespace {
Status run(Group&, const CollArgs&) { return {Result::internal_error, "halving not implemented yet"}; }
}  // namespace
extern const AlgorithmDesc reduce_scatter_halving;
const AlgorithmDesc reduce_scatter_halving = {CollKind::reduce_scatter, "halving", "not implemented yet", nullptr, run};
}  // namespace cclz::coll
