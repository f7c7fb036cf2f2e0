// PLACEHOLDER: replaced by the real algorithm.
#include "algorithm.hpp"

namespace cclz::coll {
namespace {
Status run(Group&, const CollArgs&) { return {Result::internal_error, "doubling not implemented yet"}; }
}  // namespace
extern const AlgorithmDesc allgather_doubling;
const AlgorithmDesc allgather_doubling = {CollKind::all_gather, "doubling", "not implemented yet", nullptr, run};
}  // namespace cclz::coll
