#include "shm_setup.hpp"

#include <cstring>
#include <vector>

namespace cclz::detail {
namespace {

// Raw tags below any collective's (collectives use sequence numbers >= 1 in
// the bits above the low 24).
constexpr std::uint64_t kTagName = 1, kTagAck = 2, kTagGo = 3;
constexpr std::size_t kNameMsg = 256;

Status exchange(Transport& t, bool send, int peer, std::uint64_t tag, void* buf, std::size_t bytes,
                Clock::time_point deadline) {
  Op op;
  Status st = send ? t.post_send(peer, tag, buf, bytes, &op) : t.post_recv(peer, tag, buf, bytes, &op);
  if (!st.ok()) return st;
  Op* ops[] = {&op};
  st = t.wait(ops, deadline);
  if (!st.ok() && !op.done) t.cancel(&op);
  return st;
}

}  // namespace

Status setup_shm_window(Transport& t, const Topology& topo, std::span<const RankInfo> ranks, const Config& cfg,
                        std::unique_ptr<ShmWindow>* out, std::string* why) {
  out->reset();
  const int me = t.rank();
  const int node = topo.node_of[static_cast<std::size_t>(me)];
  std::vector<int> members;
  for (int r = 0; r < t.size(); ++r) {
    if (topo.node_of[static_cast<std::size_t>(r)] == node) members.push_back(r);
  }
  if (members.size() < 2) return {};
  const bool crowded = host_oversubscribed(ranks, me);
  const int index = static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
  const int leader = members[0];
  const Clock::time_point deadline = cfg.deadline_from_now();

  if (me == leader) {
    std::string name;
    std::shared_ptr<ShmSegment> seg;
    char msg[kNameMsg] = {};
    if (!cfg.shm) {
      std::snprintf(msg + 1, sizeof msg - 1, "CCLZ_SHM=0 on rank %d", me);
    } else {
      const std::size_t slot_bytes = cfg.shm_slot_bytes != 0
                                         ? cfg.shm_slot_bytes
                                         : ShmWindow::default_slot_bytes(static_cast<int>(members.size()), cfg.shm_slots);
      const ShmWindow::Geometry geo{static_cast<int>(members.size()), slot_bytes, cfg.shm_slots,
                                    cfg.shm_allreduce_handoffs, cfg.shm_direct_min_bytes, cfg.shm_l2_bytes,
                                    cfg.shm_llc_bytes, cfg.shm_slot_stores, cfg.shm_cma};
      if (Status st = ShmWindow::create_named(geo, &name, &seg); !st.ok()) {
        std::snprintf(msg + 1, sizeof msg - 1, "rank %d: %s", me, st.message().c_str());
      } else {
        msg[0] = 1;
        std::snprintf(msg + 1, sizeof msg - 1, "%s", name.c_str());
      }
    }
    Status st;
    for (std::size_t i = 1; i < members.size() && st.ok(); ++i) {
      st = exchange(t, true, members[i], kTagName, msg, sizeof msg, deadline);
    }
    char go = msg[0];
    std::string failure = msg[0] != 0 ? std::string() : std::string(msg + 1);
    for (std::size_t i = 1; i < members.size() && st.ok(); ++i) {
      char ack[kNameMsg] = {};
      st = exchange(t, false, members[i], kTagAck, ack, sizeof ack, deadline);
      if (st.ok() && ack[0] == 0) {
        go = 0;
        if (failure.empty()) failure = ack + 1;
      }
    }
    if (!name.empty()) ShmWindow::unlink_named(name);
    for (std::size_t i = 1; i < members.size() && st.ok(); ++i) {
      st = exchange(t, true, members[i], kTagGo, &go, 1, deadline);
    }
    if (!st.ok()) return st;
    if (go != 0) {
      *out = std::make_unique<ShmWindow>(std::move(seg), members, index, crowded);
    } else {
      *why = failure;
    }
    return {};
  }

  char msg[kNameMsg] = {};
  if (Status st = exchange(t, false, leader, kTagName, msg, sizeof msg, deadline); !st.ok()) return st;
  msg[kNameMsg - 1] = '\0';
  std::unique_ptr<ShmWindow> w;
  char ack[kNameMsg] = {};
  if (msg[0] == 0) {
    std::snprintf(ack + 1, sizeof ack - 1, "%s", msg + 1);
  } else if (!cfg.shm) {
    std::snprintf(ack + 1, sizeof ack - 1, "CCLZ_SHM=0 on rank %d", me);
  } else {
    std::shared_ptr<ShmSegment> seg;
    if (Status st = ShmWindow::open_named(msg + 1, &seg); !st.ok()) {
      std::snprintf(ack + 1, sizeof ack - 1, "rank %d: %s", me, st.message().c_str());
    } else {
      // Attaching records this process in the control block before the ack,
      // so every rank's pid is there once the leader says go.
      w = std::make_unique<ShmWindow>(std::move(seg), members, index, crowded);
      ack[0] = 1;
    }
  }
  if (Status st = exchange(t, true, leader, kTagAck, ack, sizeof ack, deadline); !st.ok()) return st;
  char go = 0;
  if (Status st = exchange(t, false, leader, kTagGo, &go, 1, deadline); !st.ok()) return st;
  if (go != 0 && w) {
    *out = std::move(w);
  } else {
    *why = msg[0] == 0 ? std::string(msg + 1) : std::string(ack[0] == 0 ? ack + 1 : "a peer could not map it");
  }
  return {};
}

}  // namespace cclz::detail
