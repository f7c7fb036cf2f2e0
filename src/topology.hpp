// Node layout of a communicator: which ranks share a node, from host names,
// with two overrides for testing hierarchical paths on one machine:
// CCLZ_NODE_ID (per rank, carried in RankInfo::node_override) and
// CCLZ_LOCAL_SIZE=k (node = rank / k). Nodes are numbered densely in order
// of their lowest rank. Cost: O(n log n) at creation.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "bootstrap.hpp"

namespace cclz::detail {

struct Topology {
  std::vector<int> node_of;     // per rank, 0..num_nodes-1
  std::vector<int> local_rank;  // per rank: index among its node's ranks
  std::vector<int> node_size;   // per node
  std::string source;           // "hostname", "CCLZ_NODE_ID", "CCLZ_LOCAL_SIZE=k", "parent"

  int num_nodes() const noexcept { return static_cast<int>(node_size.size()); }
  // "node 0: ranks 0-3 (hostA); node 1: ranks 4,6 (hostB)" — hostnames
  // when `ranks` is given.
  std::string describe(std::span<const RankInfo> ranks = {}) const;
};

// Any node labels (one per rank) -> a Topology numbered by lowest rank.
Topology topology_from_labels(const std::vector<int>& labels, std::string source);

// Precedence: CCLZ_NODE_ID when any rank set it (ranks without one are
// grouped by host name, apart from the numbered ones), else
// CCLZ_LOCAL_SIZE (`local_size` > 0), else host names.
Topology compute_topology(std::span<const RankInfo> ranks, int local_size);

// CPUs this process may run on (its affinity mask).
int usable_cpus() noexcept;
// This process's affinity mask as RankInfo::cpus holds it.
std::vector<std::byte> affinity_bitmap();
// Whether `rank`'s host runs more ranks than CPUs they may run on: the union
// of their affinity masks, so that ranks bound one per core are not counted
// as crowded (each one's own mask has a single CPU). Where a mask is
// unknown, the host's online CPUs stand in. Every rank of a host gets the
// same answer from the same table: the shared-memory algorithms choose
// their protocol by it, and ranks that disagreed would not meet.
bool host_oversubscribed(std::span<const RankInfo> ranks, int rank);

}  // namespace cclz::detail
