// PLACEHOLDER: replaced by the real algorithm.
#include "algorithm.hpp"

namespace cclz::coll {
namespace {
Status run(Group&, const CollArgs&) { return {Result::internal_error, "binomial not implemented yet"}; }
}  // namespace
extern const AlgorithmDesc broadcast_binomial;
const AlgorithmDesc broadcast_binomial = {CollKind::broadcast, "binomial", "not implemented yet", nullptr, run};
}  // namespace cclz::coll
