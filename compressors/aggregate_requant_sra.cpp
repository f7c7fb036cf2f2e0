// Re-quantizable aggregation by scatter-reduce-allgather, as CGX does
// (Markov et al., "CGX: Adaptive System Support for Communication-Efficient
// Deep Learning", Middleware 2022): every rank has encoded its whole tensor
// (begin()); an all-to-allv sends chunk j of each payload to rank j; rank j
// decodes the n encoded chunks in rank order into an f32 sum (its result for
// a reduce-scatter) and, for an all-reduce, encodes that sum once
// (encode_chunk) and an all-to-allv hands every rank every encoded chunk.
// The all-reduce's result thus carries exactly two quantisations: each
// rank's own and the chunk owner's, whatever n.
//
// Cost per rank (P = payload bytes): sent (n-1)/n P in the scatter and, for
// an all-reduce, (n-1)/n P in the gather (exactly: the other ranks' chunk
// bytes, then (n-1) times its own chunk's); compute: decode of n chunks of
// 1/n of the tensor (one tensor's worth) and one encode of 1/n of it;
// memory: n chunks of encoded bytes and one chunk of f32.
#include <algorithm>

#include "compressors/compressed_internal.hpp"

namespace cclz::compress::cc {

Status requant_sra(Call& k, std::span<const std::byte> payload, const Chunks& ch, std::vector<float>* mine,
                   std::vector<std::byte>* full) {
  const int n = k.size, r = k.rank;
  const auto un = static_cast<std::size_t>(n), ur = static_cast<std::size_t>(r);
  const std::size_t my_bytes = ch.bytes(r);

  // Scatter: chunk j of this payload to rank j; chunk r of every payload here.
  std::vector<std::size_t> sc(un), sd(un), rc(un), rd(un);
  for (std::size_t j = 0; j < un; ++j) {
    sc[j] = ch.bytes(static_cast<int>(j));
    sd[j] = ch.blo[j];
    rc[j] = my_bytes;
    rd[j] = j * my_bytes;
    if (j != ur) k.wire += sc[j];
  }
  std::vector<std::byte> recv(un * my_bytes);
  if (Status s = k.fail(k.comm.all_to_allv(payload.data(), sc, sd, recv.data(), rc, rd, DataType::u8).wait());
      !s.ok()) {
    return s;
  }

  // Reduce: decode the n encoded chunks in rank order.
  const std::size_t elems = ch.elems(r);
  mine->assign(elems, 0.0f);
  for (std::size_t j = 0; j < un; ++j) {
    const std::span<const std::byte> cj(recv.data() + j * my_bytes, my_bytes);
    if (Status s = k.c.decode_chunk_add(k.state, cj, ch.lo[ur], *mine); !s.ok()) {
      return k.fail(s.code(), "rank " + std::to_string(j) + "'s chunk " + std::to_string(r) + ": " + s.message());
    }
  }
  if (full == nullptr) return {};

  // Encode the sum once; gather every owner's encoded chunk.
  std::vector<std::byte> enc(my_bytes);
  if (Status s = k.c.encode_chunk(k.state, *mine, ch.lo[ur], enc); !s.ok()) return k.fail(s);
  full->resize(ch.bhi[un - 1]);
  for (std::size_t j = 0; j < un; ++j) {
    sc[j] = my_bytes;
    sd[j] = 0;
    rc[j] = ch.bytes(static_cast<int>(j));
    rd[j] = ch.blo[j];
  }
  if (Status s = k.fail(k.comm.all_to_allv(enc.data(), sc, sd, full->data(), rc, rd, DataType::u8).wait());
      !s.ok()) {
    return s;
  }
  k.wire += all_gather_wire(my_bytes, n);
  return {};
}

}  // namespace cclz::compress::cc
