// PLACEHOLDER: replaced by the real algorithm.
#include "algorithm.hpp"

namespace cclz::coll {
namespace {
Status run(Group&, const CollArgs&) { return {Result::internal_error, "dissemination not implemented yet"}; }
}  // namespace
extern const AlgorithmDesc barrier_dissemination;
const AlgorithmDesc barrier_dissemination = {CollKind::barrier, "dissemination", "not implemented yet", nullptr, run};
}  // namespace cclz::coll
