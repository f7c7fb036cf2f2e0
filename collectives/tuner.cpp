// The tuner: the default algorithm for a call on a group, from one table of
// rules. The first rule of the call's collective whose conditions hold and
// whose algorithm is registered and supports() the call wins; if none does,
// the first registered algorithm that supports the call. Names are looked up
// through find_algorithm, so a rule for an algorithm that is not there (or
// not finished: a placeholder without supports() still counts) is skipped
// rather than breaking the build.
//
// The thresholds are first guesses from the algorithms' cost models
// (latency-bound below tens of KiB, bandwidth-bound above about a MiB) and
// are meant to be re-tuned from cclz-perf measurements: edit the table only.
#include <cstddef>
#include <limits>

#include "algorithm.hpp"

namespace cclz::coll {
namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;
constexpr std::size_t kAny = std::numeric_limits<std::size_t>::max();

// `bytes` below is the size that drives the cost model of each collective:
//   all_reduce, broadcast, reduce: the whole buffer;
//   reduce_scatter: the whole input (count * n); all_gather: the whole output
//   (count * n); all_to_all(v): the block sent to one peer; barrier: 0.
struct Rule {
  CollKind kind;
  const char* algorithm;
  std::size_t min_bytes;  // rule applies when min_bytes <= bytes <= max_bytes
  std::size_t max_bytes;
  int min_ranks;          // and the group has at least this many ranks
  bool multi_node;        // and (if set) >1 node, uniform, >1 rank per node
};

constexpr Rule kRules[] = {
    // One node: the shared-memory window beats any message schedule (no
    // transport copies; reductions read the peers' data in the shared
    // cache). Its algorithms support() only groups that are exactly the
    // ranks sharing a window. That holds for the smallest broadcasts and
    // reduces too with a core per rank (2 bound ranks, 256 B-8 KiB, medians
    // of 5 interleaved runs: the transport's binomial tree took 1.09-1.30x
    // the window's time for a broadcast, 0.95-1.41x for a reduce). With
    // more ranks than cores neither is ahead: 3-8 ranks on 2 cores, the
    // tree's mean time for a broadcast was 0.43-1.08x the window's at 1-8
    // KiB in runs of each algorithm alone, 0.50-2.12x at 4 KiB in `-A all`
    // runs that alternate them (docs/performance.md, "The tuner's table").
    {CollKind::all_reduce, "shm", 0, kAny, 2, false},
    {CollKind::reduce_scatter, "shm", 0, kAny, 2, false},
    {CollKind::all_gather, "shm", 0, kAny, 2, false},
    {CollKind::all_to_all, "shm", 0, kAny, 2, false},
    {CollKind::broadcast, "shm", 0, kAny, 2, false},
    {CollKind::reduce, "shm", 0, kAny, 2, false},
    {CollKind::barrier, "shm", 0, kAny, 2, false},
    // all_reduce: two levels when the network is the bottleneck; a double
    // binary tree for tiny messages (2 log n latency, no extra pair-up steps
    // for odd n); halving-doubling for medium (log latency, ~ring volume);
    // the pipelined ring for large (bandwidth-optimal).
    {CollKind::all_reduce, "hierarchical", 1 * MiB, kAny, 4, true},
    {CollKind::all_reduce, "tree", 0, 16 * KiB, 3, false},
    {CollKind::all_reduce, "rabenseifner", 0, 1 * MiB, 2, false},
    {CollKind::all_reduce, "ring", 0, kAny, 1, false},
    // reduce_scatter / all_gather: recursive halving / doubling while latency
    // dominates, ring when bandwidth does.
    {CollKind::reduce_scatter, "halving", 0, 256 * KiB, 2, false},
    {CollKind::reduce_scatter, "ring", 0, kAny, 1, false},
    {CollKind::all_gather, "doubling", 0, 256 * KiB, 2, false},
    {CollKind::all_gather, "ring", 0, kAny, 1, false},
    // all_to_all: Bruck's log n rounds pay off only for small blocks (it
    // forwards each byte log n / 2 times); pairwise exchange otherwise.
    {CollKind::all_to_all, "bruck", 0, 1 * KiB, 3, false},
    {CollKind::all_to_all, "pairwise", 0, kAny, 1, false},
    {CollKind::all_to_allv, "pairwise", 0, kAny, 1, false},
    // broadcast / reduce: binomial tree (log n steps, whole buffer per step)
    // for small, pipelined chain (n-1 + chunks steps, bytes once) for large.
    {CollKind::broadcast, "binomial", 0, 256 * KiB, 1, false},
    {CollKind::broadcast, "chain", 0, kAny, 1, false},
    {CollKind::reduce, "binomial", 0, 256 * KiB, 1, false},
    {CollKind::reduce, "chain", 0, kAny, 1, false},
    {CollKind::barrier, "dissemination", 0, kAny, 1, false},
};

std::size_t cost_bytes(const Group& g, const CollArgs& a) {
  const std::size_t es = dtype_size(a.dt);
  const auto n = static_cast<std::size_t>(g.size());
  switch (a.kind) {
    case CollKind::reduce_scatter:
    case CollKind::all_gather: return a.count * es * n;
    case CollKind::all_to_allv: {
      // The average block per peer.
      std::size_t total = 0;
      for (std::size_t c : a.send_counts) total += c;
      return n == 0 ? 0 : total * es / n;
    }
    case CollKind::barrier: return 0;
    default: return a.count * es;
  }
}

bool usable(const AlgorithmDesc* d, const Group& g, const CollArgs& a) {
  return d != nullptr && (d->supports == nullptr || d->supports(g, a));
}

}  // namespace

const AlgorithmDesc* tune(const Group& g, const CollArgs& a) noexcept {
  const std::size_t bytes = cost_bytes(g, a);
  const bool several_nodes =
      g.num_nodes() > 1 && g.nodes_uniform() && g.size() / g.num_nodes() > 1;
  for (const Rule& r : kRules) {
    if (r.kind != a.kind || bytes < r.min_bytes || bytes > r.max_bytes || g.size() < r.min_ranks) continue;
    if (r.multi_node && !several_nodes) continue;
    const AlgorithmDesc* d = find_algorithm(a.kind, r.algorithm);
    if (usable(d, g, a)) return d;
  }
  for (const AlgorithmDesc* d : all_algorithms()) {
    if (d->kind == a.kind && usable(d, g, a)) return d;
  }
  return nullptr;
}

}  // namespace cclz::coll
