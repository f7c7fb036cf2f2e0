// Double binary tree all-reduce (Sanders, Speck & Träff 2009, "Two-tree
// algorithms for full bandwidth broadcast, reduction and scan"; the scheme
// NCCL uses for its tree all-reduce).
//
// Tree A is the in-order binary tree over positions 1..n-1 hung under
// position 0: the level of position p is its lowest set bit, its parent is p
// with that bit cleared and the next one set (or just cleared when that
// falls off the end), so odd positions are leaves. Tree B is tree A with the
// ranks relabelled so its leaves are A's inner ranks: mirrored
// (rank = n-1-pos) for even n, shifted (rank = pos+1 mod n) for odd n. Each
// rank is thus a leaf in one tree and has at most two children in the other.
//
// The buffer's first half goes through tree A, the second through tree B.
// In each tree a chunk is reduced up to the root (a node combines its
// children's partials with its own, lower child first) and the root's
// result is broadcast down. Chunks of both trees are interleaved and
// pipelined: reduction of chunk i overlaps the broadcast of chunk i-kLag.
// Each element is reduced along one fixed tree and copied down from one root,
// so all ranks get bitwise-identical results.
//
// Cost: 2 * ceil(log2 n) steps of latency plus one step per chunk of
// pipeline fill; each rank sends and receives about 2 * bytes in total
// (as a leaf in one tree: half up, half down; as an inner node in the
// other: 2 halves in, 1 out going up, 1 in, 2 out going down). Latency-
// optimal for small messages; twice the ring's volume for large ones.
#include <array>

#include "allreduce/common.hpp"

namespace cclz::coll {
namespace allreduce_impl {
namespace {

constexpr std::size_t kDepth = 4;  // chunks whose child partials are in flight
constexpr std::size_t kLag = 4;    // broadcast of chunk i runs at iteration i + kLag
constexpr std::size_t kMaxChunksPerTree = 1024;

// Parent of position p (p >= 1) in tree A over n positions; 0 is the root.
int parent_position(int p, int n) {
  const int bit = p & -p;
  const int up = (p ^ bit) | (bit << 1);
  return up < n ? up : (p ^ bit);
}

struct TreeRole {
  int parent = -1;  // group rank, -1 at the root
  std::array<int, 2> kids = {-1, -1};
  int nkids = 0;
};

TreeRole role_in(int tree, int rank, int n) {
  auto rank_of = [&](int pos) {
    if (tree == 0) return pos;
    return n % 2 == 0 ? n - 1 - pos : (pos + 1) % n;
  };
  auto pos_of = [&](int r) {
    if (tree == 0) return r;
    return n % 2 == 0 ? n - 1 - r : (r + n - 1) % n;
  };
  TreeRole t;
  const int me = pos_of(rank);
  if (me != 0) t.parent = rank_of(parent_position(me, n));
  // Children found by inverting the parent function, so parent and child
  // always agree; lower positions first fixes the reduction order.
  for (int q = 1; q < n; ++q) {
    if (parent_position(q, n) == me && t.nkids < 2) t.kids[static_cast<std::size_t>(t.nkids++)] = rank_of(q);
  }
  return t;
}

}  // namespace

Status tree_allreduce(Group& g, const CollArgs& a, std::size_t chunk_bytes) {
  if (Status st = check_args(a, "tree"); !st.ok()) return st;
  if (a.count == 0) return {};
  const int n = g.size(), rank = g.rank();
  const std::size_t es = a.elem_size();
  const auto* src = static_cast<const std::byte*>(a.sendbuf);
  auto* dst = static_cast<std::byte*>(a.recvbuf);
  if (n == 1) {
    if (src != dst) std::memcpy(dst, src, a.count * es);
    return {};
  }

  const TreeRole roles[2] = {role_in(0, rank, n), role_in(1, rank, n)};
  // Elements [0, half0) ride tree A, [half0, count) tree B.
  const std::size_t half0 = a.count - a.count / 2;
  const std::size_t base[2] = {0, half0};
  const std::size_t len[2] = {half0, a.count - half0};
  std::size_t per = std::max<std::size_t>(1, chunk_bytes / es);
  std::size_t chunks = (half0 + per - 1) / per;
  if (chunks > kMaxChunksPerTree) chunks = kMaxChunksPerTree;  // bounds the op arrays
  chunks = std::max<std::size_t>(1, chunks);
  const std::size_t celems = (half0 + chunks - 1) / chunks;
  const std::size_t units = 2 * chunks;  // unit u = chunk u/2 of tree u%2

  struct Piece {
    const TreeRole* role;
    std::size_t off, len;  // elements
  };
  auto piece = [&](std::size_t u) {
    const int t = static_cast<int>(u % 2);
    const std::size_t c = u / 2;
    const std::size_t f = std::min(len[t], c * celems);
    return Piece{&roles[t], base[t] + f, std::min(celems, len[t] - f)};
  };
  auto up_tag = [](std::size_t u) { return phase_tag(0, u); };
  auto down_tag = [](std::size_t u) { return phase_tag(kTagHalf, u); };

  std::byte* tmp = g.scratch(0, kDepth * 2 * std::max<std::size_t>(1, celems) * es);
  auto kid_buf = [&](std::size_t u, int k) {
    return tmp + ((u % kDepth) * 2 + static_cast<std::size_t>(k)) * celems * es;
  };
  PostedOps kid_recvs(kDepth * 2);  // slot (u % kDepth) * 2 + k
  PostedOps up_sends(units);
  PostedOps down_sends(units * 2);  // slot u * 2 + k

  auto post_kid_recvs = [&](std::size_t u) -> Status {
    const Piece p = piece(u);
    if (p.len == 0) return {};
    for (int k = 0; k < p.role->nkids; ++k) {
      const std::size_t s = (u % kDepth) * 2 + static_cast<std::size_t>(k);
      Status st = g.irecv(p.role->kids[static_cast<std::size_t>(k)], up_tag(u), kid_buf(u, k), p.len * es,
                          kid_recvs.slot(s));
      if (!st.ok()) return st;
      kid_recvs.posted(s);
    }
    return {};
  };
  auto post_down_sends = [&](std::size_t u, const Piece& p) -> Status {
    for (int k = 0; k < p.role->nkids; ++k) {
      const std::size_t s = u * 2 + static_cast<std::size_t>(k);
      Status st = g.isend(p.role->kids[static_cast<std::size_t>(k)], down_tag(u), dst + p.off * es, p.len * es,
                          down_sends.slot(s));
      if (!st.ok()) return st;
      down_sends.posted(s);
    }
    return {};
  };

  Status st;
  for (std::size_t u = 0; u < units && u < kDepth && st.ok(); ++u) st = post_kid_recvs(u);
  for (std::size_t i = 0; i < units + kLag && st.ok(); ++i) {
    // Reduce-up of unit i.
    if (i < units) {
      const std::size_t u = i;
      const Piece p = piece(u);
      if (p.len > 0) {
        const std::byte* partial = src + p.off * es;  // a leaf forwards its own input
        for (int k = 0; k < p.role->nkids && st.ok(); ++k) {
          st = kid_recvs.wait(g, (u % kDepth) * 2 + static_cast<std::size_t>(k));
          if (!st.ok()) break;
          kernels::reduce(dst + p.off * es, kid_buf(u, k), partial, p.len, a.dt, a.op);
          partial = dst + p.off * es;
        }
        if (!st.ok()) break;
        if (p.role->parent >= 0) {
          st = g.isend(p.role->parent, up_tag(u), partial, p.len * es, up_sends.slot(u));
          if (st.ok()) up_sends.posted(u);
        } else {
          st = post_down_sends(u, p);  // the root's result is final
        }
      }
      if (st.ok() && u + kDepth < units) st = post_kid_recvs(u + kDepth);
    }
    // Broadcast-down of unit i - kLag.
    if (st.ok() && i >= kLag) {
      const std::size_t u = i - kLag;
      const Piece p = piece(u);
      if (p.len > 0 && p.role->parent >= 0) {
        // The result lands where the partial was sent from (in place, or an
        // inner node's accumulator): only once that send has completed.
        if (up_sends.live(u)) st = up_sends.wait(g, u);
        if (st.ok()) st = g.recv(p.role->parent, down_tag(u), dst + p.off * es, p.len * es);
        if (st.ok()) st = post_down_sends(u, p);
      }
    }
  }
  st = kid_recvs.finish(g, st);
  st = up_sends.finish(g, st);
  return down_sends.finish(g, st);
}

}  // namespace allreduce_impl

namespace {
Status run(Group& g, const CollArgs& a) { return allreduce_impl::tree_allreduce(g, a, allreduce_impl::kTreeChunkBytes); }
}  // namespace

extern const AlgorithmDesc allreduce_tree;
const AlgorithmDesc allreduce_tree = {CollKind::all_reduce, "tree",
                                      "double binary tree (two complementary trees, half the data each), pipelined, "
                                      "2 log2 n steps",
                                      nullptr, run};

}  // namespace cclz::coll
