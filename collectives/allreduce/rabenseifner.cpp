// PLACEHOLDER: replaced by the real algorithm.
#include "algorithm.hpp"

namespace cclz::coll {
namespace {
Status run(Group&, const CollArgs&) { return {Result::internal_error, "rabenseifner not implemented yet"}; }
}  // namespace
extern const AlgorithmDesc allreduce_rabenseifner;
const AlgorithmDesc allreduce_rabenseifner = {CollKind::all_reduce, "rabenseifner", "not implemented yet", nullptr, run};
}  // namespace cclz::coll
