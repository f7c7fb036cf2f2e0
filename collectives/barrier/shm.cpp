// Node-local barrier over the shared-memory window: every rank publishes its
// arrival and waits until all have (one pipeline chunk of two empty stages).
// Cost: one store and a wait on n counters.
#include "shm_pipeline.hpp"

namespace cclz::coll {
namespace {

Status run(Group& g, const CollArgs& a) {
  auto body = [](std::size_t, std::uint64_t, int) {};
  return shm::run_pipeline(g, shm::call_sig(g, a, 0), 1, 2, body, [](int) { return shm::Deps::all(); }, "barrier");
}

bool supports(const Group& g, const CollArgs&) { return g.shm() != nullptr; }

}  // namespace

extern const AlgorithmDesc barrier_shm;
const AlgorithmDesc barrier_shm = {CollKind::barrier, "shm", "node-local shared memory: arrival counters", supports,
                                   run};

}  // namespace cclz::coll
