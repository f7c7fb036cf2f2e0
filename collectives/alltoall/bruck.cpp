// PLACEHOLDER: replaced by the real algorithm.
#include "algorithm.hpp"

namespace cclz::coll {
namespace {
Status run(Group&, const CollArgs&) { return {Result::internal_error, "bruck not implemented yet"}; }
}  // namespace
extern const AlgorithmDesc alltoall_bruck;
const AlgorithmDesc alltoall_bruck = {CollKind::all_to_all, "bruck", "not implemented yet", nullptr, run};
}  // namespace cclz::coll
