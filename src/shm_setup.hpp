// Making a communicator's node-local shared-memory window (shm_window.hpp).
// Collective over the ranks of each node, run by every rank when a
// communicator is created: the node's first rank creates the segment and
// sends its name to the others over the transport; they map it and
// acknowledge; the first rank unlinks the name (so nothing is left in
// /dev/shm even if a process dies later) and tells everyone whether all
// succeeded. The node then uses the window only if every rank has it, so the
// ranks always agree. Cost: three message rounds inside each node.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "bootstrap.hpp"
#include "config.hpp"
#include "shm_window.hpp"
#include "topology.hpp"

namespace cclz::detail {

// *out stays null when the node has one rank, when CCLZ_SHM=0 on any of its
// ranks, or when the segment cannot be made or mapped (then *why says so,
// for the log). Errors are transport failures during the exchange only.
Status setup_shm_window(Transport& t, const Topology& topo, std::span<const RankInfo> ranks, const Config& cfg,
                        std::unique_ptr<ShmWindow>* out, std::string* why);

}  // namespace cclz::detail
