// PLACEHOLDER: replaced by the real algorithm.
#include "algorithm.hpp"

namespace cclz::coll {
namespace {
Status run(Group&, const CollArgs&) { return {Result::internal_error, "tree not implemented yet"}; }
}  // namespace
extern const AlgorithmDesc allreduce_tree;
const AlgorithmDesc allreduce_tree = {CollKind::all_reduce, "tree", "not implemented yet", nullptr, run};
}  // namespace cclz::coll
