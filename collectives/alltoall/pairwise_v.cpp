// PLACEHOLDER: replaced by the real algorithm.
#include "algorithm.hpp"

namespace cclz::coll {
namespace {
Status run(Group&, const CollArgs&) { return {Result::internal_error, "pairwise not implemented yet"}; }
}  // namespace
extern const AlgorithmDesc alltoallv_pairwise;
const AlgorithmDesc alltoallv_pairwise = {CollKind::all_to_allv, "pairwise", "not implemented yet", nullptr, run};
}  // namespace cclz::coll
