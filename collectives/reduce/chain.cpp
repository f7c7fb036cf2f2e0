// PLACEHOLDER: replaced by the real algorithm.
#include "algorithm.hpp"

namespace cclz::coll {
namespace {
Status run(Group&, const CollArgs&) { return {Result::internal_error, "chain not implemented yet"}; }
}  // namespace
extern const AlgorithmDesc reduce_chain;
const AlgorithmDesc reduce_chain = {CollKind::reduce, "chain", "not implemented yet", nullptr, run};
}  // namespace cclz::coll
