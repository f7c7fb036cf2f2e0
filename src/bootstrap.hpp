// Bootstrap: how the ranks of a new communicator find each other and end up
// with a connected Transport. One-shot TCP rendezvous (root service started
// by create_unique_id, or by rank 0 on MASTER_PORT for the environment
// launch) exchanges each rank's host name, node override and transport
// address; a split exchanges them over the parent's transport instead.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cclz/cclz.hpp"
#include "transport.hpp"

namespace cclz::detail {

// What every rank learns about every other rank at creation.
struct RankInfo {
  std::string hostname;
  int node_override = -1;  // CCLZ_NODE_ID of that rank, -1 if unset
  std::vector<std::byte> cpus;  // its affinity mask as a bitmap (CPU i: bit i%8 of byte i/8); empty if unknown
};

struct World {
  std::unique_ptr<Transport> transport;
  std::vector<RankInfo> ranks;  // index = rank
};

// Makes a token holding a fresh rendezvous address and starts its root
// service (a thread in this process that serves one rendezvous and exits).
Status make_unique_id(UniqueId* id);

// Rendezvous at the address in `id`; fails with Result::timeout (naming the
// ranks that never arrived, on the ranks that did) when `deadline` passes.
Status connect_unique_id(const UniqueId& id, int nranks, int rank, Clock::time_point deadline, World* out);

// torchrun-style: rank 0 starts the root service on host:port (it binds
// host, or all interfaces if host does not resolve locally), everyone joins.
Status connect_host_port(const std::string& host, int port, int nranks, int rank, Clock::time_point deadline,
                         World* out);

// For split: `members` are parent ranks (in new-rank order) and include this
// rank; every member calls this with the same list and a `tag_base` unique to
// this split. Addresses travel over the parent transport.
Status connect_subgroup(Transport& parent, const std::vector<int>& members, std::uint64_t tag_base,
                        const std::vector<RankInfo>& parent_ranks, Clock::time_point deadline, World* out);

}  // namespace cclz::detail
