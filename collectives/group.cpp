#include "group.hpp"

#include <algorithm>
#include <cassert>
#include <map>

namespace cclz::coll {

std::byte* ScratchPool::get(int slot, std::size_t bytes) {
  assert(slot >= 0 && slot < kSlots);
  Buffer& b = slots_[slot];
  if (b.bytes < bytes || !b.mem) {
    // Grow geometrically so a sweep of sizes does not reallocate every call.
    std::size_t want = std::max<std::size_t>({bytes, b.bytes + b.bytes / 2, 4096});
    want = (want + 63) / 64 * 64;
    // Plain new[] (unique_ptr<byte[]> frees with plain delete[]; an aligned
    // new[] would need the aligned delete[]), over-allocated by 63 bytes and
    // aligned by hand.
    b.mem.reset(new std::byte[want + 63]);
    b.bytes = want;
  }
  const auto p = reinterpret_cast<std::uintptr_t>(b.mem.get());
  return b.mem.get() + ((64 - p % 64) % 64);
}

std::shared_ptr<const Group::Shape> Group::make_shape(std::vector<int> members, std::vector<int> node_of_member) {
  assert(members.size() == node_of_member.size());
  auto sh = std::make_shared<Shape>();
  sh->members = std::move(members);
  sh->nodes = std::move(node_of_member);
  // Renumber nodes densely in order of first appearance so sub-groups see
  // 0..num_nodes-1 whatever the communicator's numbering was.
  std::map<int, int> dense;
  std::map<int, int> per_node;
  for (int& n : sh->nodes) {
    auto it = dense.try_emplace(n, static_cast<int>(dense.size())).first;
    n = it->second;
    ++per_node[n];
  }
  sh->num_nodes = std::max<int>(1, static_cast<int>(dense.size()));
  sh->nodes_uniform = true;
  for (auto& [n, c] : per_node) {
    if (c != per_node.begin()->second) sh->nodes_uniform = false;
  }
  return sh;
}

Group::Group(detail::Transport& t, std::vector<int> members, std::vector<int> node_of_member, int my_index,
             std::uint64_t seq, detail::Clock::time_point deadline, ScratchPool& scratch, int space)
    : Group(t, make_shape(std::move(members), std::move(node_of_member)), my_index, seq, deadline, scratch, space) {}

Group::Group(detail::Transport& t, std::shared_ptr<const Shape> shape, int my_index, std::uint64_t seq,
             detail::Clock::time_point deadline, ScratchPool& scratch, int space)
    : t_(&t), shape_(std::move(shape)), me_(my_index), seq_(seq), deadline_(deadline), scratch_(&scratch), space_(space) {}

std::uint64_t Group::make_tag(std::uint32_t tag) const noexcept {
  const std::uint64_t step = tag & ((1u << kStepTagBits) - 1);
  const std::uint64_t space = static_cast<std::uint64_t>(space_) & ((1u << kSpaceBits) - 1);
  const std::uint64_t seq = seq_ & ((std::uint64_t{1} << kSeqBits) - 1);
  return (seq << (kStepTagBits + kSpaceBits)) | (space << kStepTagBits) | step;
}

Status Group::isend(int peer, std::uint32_t tag, const void* buf, std::size_t bytes, detail::Op* op) {
  return t_->post_send(global_rank(peer), make_tag(tag), buf, bytes, op);
}

Status Group::irecv(int peer, std::uint32_t tag, void* buf, std::size_t bytes, detail::Op* op) {
  return t_->post_recv(global_rank(peer), make_tag(tag), buf, bytes, op);
}

Status Group::wait(std::span<detail::Op* const> ops) {
  Status st = t_->wait(ops, deadline_);
  if (!st.ok()) {
    for (detail::Op* op : ops) {
      if (op->handle != nullptr && !op->done) t_->cancel(op);
    }
  }
  return st;
}

Status Group::send(int peer, std::uint32_t tag, const void* buf, std::size_t bytes) {
  detail::Op op;
  if (Status st = isend(peer, tag, buf, bytes, &op); !st.ok()) return st;
  return wait(&op);
}

Status Group::recv(int peer, std::uint32_t tag, void* buf, std::size_t bytes) {
  detail::Op op;
  if (Status st = irecv(peer, tag, buf, bytes, &op); !st.ok()) return st;
  return wait(&op);
}

Status Group::sendrecv(int dst, const void* sbuf, std::size_t sbytes, int src, void* rbuf, std::size_t rbytes,
                       std::uint32_t tag) {
  detail::Op r, s;
  if (Status st = irecv(src, tag, rbuf, rbytes, &r); !st.ok()) return st;
  if (Status st = isend(dst, tag, sbuf, sbytes, &s); !st.ok()) {
    t_->cancel(&r);
    return st;
  }
  detail::Op* ops[] = {&r, &s};
  return wait(ops);
}

Group Group::subgroup(std::span<const int> indices, int space) const {
  std::vector<int> members, nodes;
  int me = -1;
  for (int i : indices) {
    if (i == me_) me = static_cast<int>(members.size());
    members.push_back(shape_->members[static_cast<std::size_t>(i)]);
    nodes.push_back(shape_->nodes[static_cast<std::size_t>(i)]);
  }
  assert(me >= 0);
  Group sub(*t_, std::move(members), std::move(nodes), me, seq_, deadline_, *scratch_, space);
  sub.attach_shm(shm_);
  return sub;
}

void Group::attach_shm(detail::ShmWindow* w) noexcept {
  shm_ = w;
  shm_usable_ = w != nullptr && w->index() == me_ && w->members() == shape_->members;
}

}  // namespace cclz::coll
