// Re-quantizable aggregation by a ring that decodes, adds and re-encodes at
// every hop (the scheme of QSGD-style quantized ring all-reduces): a ring
// reduce-scatter in which rank r, at step s = 0 .. n-2, sends chunk
// (r-s-1) mod n to rank r+1 and receives chunk (r-s-2) mod n from rank r-1,
// decodes the incoming partial sum, adds its own decoded chunk (both with
// decode_chunk_add, in f32, incoming first) and encodes the result
// (encode_chunk) for the next step; at the last step it receives its own
// chunk r, whose f32 sum is its reduce-scatter result. For an all-reduce the
// owner encodes that sum, and a ring all-gather (step s: send chunk (r-s)
// mod n, receive (r-s-1) mod n) hands every rank every encoded chunk.
// Every partial sum is quantised again at each hop, so a chunk's result
// carries n quantisations (1 with one rank), against two for
// scatter-reduce-allgather; the test prints both errors against n.
//
// Runs as one custom task of the communicator (CommImpl::run_custom), in
// order with its other collectives and bounded by CCLZ_TIMEOUT; tags: step
// s of the reduce-scatter uses s, of the all-gather n + s.
//
// Cost per rank (P = payload bytes): 2 (n-1) steps; sent (n-1)/n P in each
// half (exactly: the bytes of the chunks it forwards); compute per hop: two
// chunk decodes and one chunk encode of 1/n of the tensor; memory: two
// encoded chunks and one f32 chunk. Transfers and compute do not overlap
// (no pipelining inside a step).
#include <algorithm>

#include "comm_impl.hpp"
#include "compressors/compressed_internal.hpp"

namespace cclz::compress::cc {

namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

}  // namespace

Status requant_ring(Call& k, std::span<const std::byte> payload, const Chunks& ch, std::vector<float>* mine,
                    std::vector<std::byte>* full) {
  const int n = k.size, r = k.rank;
  const auto ur = static_cast<std::size_t>(r);
  const Compressor& c = k.c;
  const CompressorState& state = k.state;
  mine->assign(ch.elems(r), 0.0f);
  if (full != nullptr) full->resize(ch.bhi[static_cast<std::size_t>(n - 1)]);
  if (n == 1) {
    const std::span<const std::byte> own = payload.subspan(ch.blo[0], ch.bytes(0));
    if (Status s = c.decode_chunk_add(state, own, ch.lo[0], *mine); !s.ok()) return k.fail(s);
    if (full != nullptr) {
      if (Status s = c.encode_chunk(state, *mine, ch.lo[0], *full); !s.ok()) return k.fail(s);
    }
    return {};
  }

  std::vector<std::byte> sendb(ch.max_bytes()), recvb(ch.max_bytes());
  std::vector<float> acc(ch.max_elems());
  std::uint64_t sent = 0;
  const int right = mod(r + 1, n), left = mod(r - 1, n);

  // One step: send `sbytes` from sp to the right, receive `rbytes` from the left into rp.
  auto step = [&](coll::Group& g, std::uint32_t tag, const std::byte* sp, std::size_t sbytes, std::byte* rp,
                  std::size_t rbytes) -> Status {
    detail::Op ops[2];
    detail::Op* posted[2];
    std::size_t np = 0;
    if (rbytes > 0) {
      if (Status s = g.irecv(left, tag, rp, rbytes, &ops[np]); !s.ok()) return s;
      posted[np] = &ops[np];
      ++np;
    }
    if (sbytes > 0) {
      Status s = g.isend(right, tag, sp, sbytes, &ops[np]);
      if (!s.ok()) {
        if (np > 0) (void)g.wait(std::span<detail::Op* const>(posted, np));
        return s;
      }
      posted[np] = &ops[np];
      ++np;
      sent += sbytes;
    }
    if (np == 0) return {};
    return g.wait(std::span<detail::Op* const>(posted, np));
  };

  auto body = [&](coll::Group& g) -> Status {
    if (g.size() != n || g.rank() != r) {
      return {Result::internal_error, "the custom task's group is not the communicator"};
    }
    // Reduce-scatter. Step 0 forwards this rank's own encoded chunk r-1.
    const std::byte* sp = payload.data() + ch.blo[static_cast<std::size_t>(mod(r - 1, n))];
    for (int s = 0; s + 1 < n; ++s) {
      const int cs = mod(r - s - 1, n), cr = mod(r - s - 2, n);
      const auto ucr = static_cast<std::size_t>(cr);
      if (Status st = step(g, static_cast<std::uint32_t>(s), sp, ch.bytes(cs), recvb.data(), ch.bytes(cr)); !st.ok()) {
        return st;
      }
      const std::span<float> a(acc.data(), ch.elems(cr));
      std::fill(a.begin(), a.end(), 0.0f);
      if (Status st = c.decode_chunk_add(state, std::span<const std::byte>(recvb.data(), ch.bytes(cr)), ch.lo[ucr], a);
          !st.ok()) {
        return Status(st.code(), "chunk " + std::to_string(cr) + " from rank " + std::to_string(left) + ": " +
                                     st.message());
      }
      if (Status st = c.decode_chunk_add(state, payload.subspan(ch.blo[ucr], ch.bytes(cr)), ch.lo[ucr], a);
          !st.ok()) {
        return st;
      }
      if (s + 2 < n) {
        if (Status st = c.encode_chunk(state, a, ch.lo[ucr], std::span<std::byte>(sendb.data(), ch.bytes(cr)));
            !st.ok()) {
          return st;
        }
        sp = sendb.data();
      }
    }
    // The last step received chunk r (r - n ≡ r): acc holds its sum.
    std::copy(acc.begin(), acc.begin() + static_cast<std::ptrdiff_t>(ch.elems(r)), mine->begin());
    if (full == nullptr) return {};
    if (Status st = c.encode_chunk(state, *mine, ch.lo[ur], std::span<std::byte>(*full).subspan(ch.blo[ur], ch.bytes(r)));
        !st.ok()) {
      return st;
    }
    for (int s = 0; s + 1 < n; ++s) {
      const auto cs = static_cast<std::size_t>(mod(r - s, n)), cr = static_cast<std::size_t>(mod(r - s - 1, n));
      if (Status st = step(g, static_cast<std::uint32_t>(n + s), full->data() + ch.blo[cs], ch.bytes(static_cast<int>(cs)),
                           full->data() + ch.blo[cr], ch.bytes(static_cast<int>(cr)));
          !st.ok()) {
        return st;
      }
    }
    return {};
  };
  const std::string detail = k.what + ", " + std::to_string(payload.size()) + " payload bytes";
  Status s = k.comm.impl()->run_custom("compressed_ring", detail, body).wait();
  k.wire += sent;
  return k.fail(s);
}

}  // namespace cclz::compress::cc
