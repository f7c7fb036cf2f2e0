// PLACEHOLDER tuner: first supported algorithm.
#include "algorithm.hpp"

namespace cclz::coll {
const AlgorithmDesc* tune(const Group& g, const CollArgs& a) noexcept {
  for (const AlgorithmDesc* d : all_algorithms()) {
    if (d->kind == a.kind && (d->supports == nullptr || d->supports(g, a))) return d;
  }
  return nullptr;
}
}  // namespace cclz::coll
