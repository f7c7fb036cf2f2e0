// PLACEHOLDER: replaced by the real algorithm.
#include "algorithm.hpp"

namespace cclz::coll {
namespace {
Status run(Group&, const CollArgs&) { return {Result::internal_error, "hierarchical not implemented yet"}; }
}  // namespace
extern const AlgorithmDesc allreduce_hierarchical;
const AlgorithmDesc allreduce_hierarchical = {CollKind::all_reduce, "hierarchical", "not implemented yet", nullptr, run};
}  // namespace cclz::coll
