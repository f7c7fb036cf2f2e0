// PLACEHOLDER: replaced by the real algorithm.
#include "algorithm.hpp"

namespace cclz::coll {
namespace {
Status run(Group&, const CollArgs&) { return {Result::internal_error, "binomial not implemented yet"}; }
}  // namespace
extern const AlgorithmDesc reduce_binomial;
const AlgorithmDesc reduce_binomial = {CollKind::reduce, "binomial", "not implemented yet", nullptr, run};
}  // namespace cclz::coll
