// PLACEHOLDER: replaced by the real algorithm.
#include "algorithm.hpp"

namespace cclz::coll {
namespace {
Status run(Group&, const CollArgs&) { return {Result::internal_error, "ring not implemented yet"}; }
}  // namespace
extern const AlgorithmDesc allreduce_ring;
const AlgorithmDesc allreduce_ring = {CollKind::all_reduce, "ring", "not implemented yet", nullptr, run};
}  // namespace cclz::coll
