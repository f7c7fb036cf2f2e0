// Node-local broadcast over the shared-memory window (see shm_pipeline.hpp).
// Chunk by chunk: (0) the root copies its chunk into its slot (and, out of
// place, to its own output: in the same pass when streamed, after
// publishing otherwise); (1) every other rank copies it out, waiting for
// the root only. Ranks run up to `slots` chunks behind the root.
//
// Cost: 2 stages per chunk, chunks = bytes / chunk (a slot or less,
// shm::chunk_bytes); the root reads its input once, every other rank
// writes its output once.
//
// Direct path (shm_direct.hpp; the root's buffer from mem_alloc, or thread
// ranks): every other rank copies straight from the root's input, one copy
// instead of two. Only the root's input is read by peers, so the others'
// buffers may be any memory. A root's heap buffer is read the same way
// through cross-memory attach (one kernel copy into each output), where
// shm::cma_out_of_place allows it.
#include "shm_direct.hpp"
#include "shm_pipeline.hpp"

namespace cclz::coll {
namespace {

// Unlike the other collectives' outputs (shm::stream_outputs), a
// broadcast's are streamed from an eighth of the last-level cache on (4 MB
// of 32): on 2 ranks, ordinary stores made 8-16 MB broadcasts 1.1-2.2x
// slower even where the node's buffers fit in the cache.
bool stream_broadcast(const Group& g, std::size_t bytes) { return bytes > g.shm()->llc_bytes() / 8; }

Status run(Group& g, const CollArgs& a) {
  if (a.count == 0) return {};
  const int me = g.rank(), root = a.root;
  const std::size_t bytes = a.count * a.elem_size();
  bool ran = false;
  Status direct = shm::run_if_direct(
      g, a, bytes, me == root ? bytes : 0, 0, &ran,
      [&](const auto&, const auto& pb) -> Status {
        const std::byte* from =
            me == root ? static_cast<const std::byte*>(a.sendbuf) : pb.send[static_cast<std::size_t>(root)];
        if (pb.cma && me != root) return shm::peer_read(g, pb, root, a.recvbuf, from, bytes);
        if (from != a.recvbuf) (stream_broadcast(g, bytes) ? shm::copy_stream : shm::copy)(a.recvbuf, from, bytes);
        return {};
      },
      true, shm::cma_out_of_place(g, bytes, bytes));
  if (!direct.ok() || ran) return direct;
  detail::ShmWindow& w = *g.shm();
  const std::size_t es = a.elem_size(), unit = shm::line_elems(es);
  const bool stream = stream_broadcast(g, a.count * es);
  std::size_t C = shm::chunk_bytes(w, stream, a.count * es, shm::ChunkUse::copy) / es;
  C = std::max(unit, C / unit * unit);
  const std::size_t chunks = (a.count + C - 1) / C;
  const auto* in = static_cast<const std::byte*>(a.sendbuf);
  auto* out = static_cast<std::byte*>(a.recvbuf);
  auto out_copy = stream ? shm::copy_stream : shm::copy;
  auto body = [&](std::size_t c, std::uint64_t slot, int t) {
    const std::size_t first = c * C, m = std::min(C, a.count - first);
    if (t == 0 && me == root) {
      if (in != out && stream) {
        shm::copy_and_stream(w.slot(root, slot), out + first * es, in + first * es, m * es);
      } else {
        (stream ? shm::copy_in : shm::copy)(w.slot(root, slot), in + first * es, m * es);
      }
    } else if (t == 1 && me != root) {
      out_copy(out + first * es, w.slot(root, slot), m * es);
    }
  };
  // A small out-of-place root copies its own output after publishing (the
  // input is still in the cache then).
  auto root_own = [&](std::size_t c, std::uint64_t, int t) {
    if (t != 0 || me != root || in == out || stream) return;
    const std::size_t first = c * C, m = std::min(C, a.count - first);
    shm::copy(out + first * es, in + first * es, m * es);
  };
  auto deps = [&](int) { return me == root ? shm::Deps::none() : shm::Deps::one(root); };
  return shm::run_pipeline(g, shm::call_sig(g, a, a.count), chunks, 2, body, deps, "broadcast", root_own);
}

bool supports(const Group& g, const CollArgs&) { return g.shm() != nullptr; }

}  // namespace

extern const AlgorithmDesc broadcast_shm;
const AlgorithmDesc broadcast_shm = {CollKind::broadcast, "shm",
                                     "node-local shared memory: the root stages chunks, the others copy them out",
                                     supports, shm::timing_heap_path<run>};

}  // namespace cclz::coll
