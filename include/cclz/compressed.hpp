// Compressed collectives: all-reduce, reduce-scatter and all-gather of one
// tensor through a Compressor (cclz/compress.hpp), running its round
// protocol across the ranks of a Comm.
//
// Each call is collective and blocking: every rank of the communicator calls
// it, in the same order as its other collectives, with the same compressor
// spec, a state made by that compressor for the same TensorDesc, and the
// same options. The result is bitwise the same on every rank.
//
// How a round's payload is aggregated (Payload::aggregation, per round):
//   summable       Comm::all_reduce (op sum) of the payload in
//                  Payload::sum_dtype; the tuner picks the algorithm.
//   requantizable  the payload is cut into one chunk per rank on block
//                  boundaries (the chunk rule below) and reduced by decode,
//                  add and re-encode, by one of two schemes
//                  (CompressedOptions::requant):
//       scatter_reduce_allgather (default; CGX, Markov et al. 2022): an
//           all-to-all sends chunk j of every rank's payload to rank j,
//           which decodes the n chunks in rank order, adds them in f32 and
//           encodes the sum once; an all-gather of the encoded chunks. The
//           result carries two quantisations whatever the number of ranks:
//           the ranks' own and the owner's.
//       ring: a ring reduce-scatter (n-1 hops) in which every hop decodes
//           the incoming partial sum, adds its own decoded chunk and
//           encodes again, then a ring all-gather of the encoded chunks;
//           n quantisations along each chunk's path, so the error grows with
//           the number of ranks (the test prints both against n).
//       Both send 2 (n-1)/n of the payload per rank.
//   gather_only    an all-gather of the payload sizes (8 bytes per rank),
//                  then of the payloads (Comm::all_to_allv, variable sizes);
//                  every rank decodes and adds them in rank order.
//
// Chunk rule (requantizable): with b = block_elems() and B = ceil(count / b)
// blocks, rank j's chunk of an all-reduce holds blocks [floor(j B / n),
// floor((j+1) B / n)), i.e. elements [min(count, that * b), ...); its bytes
// are [payload_bytes(lo), payload_bytes(hi)) of the payload. For a
// reduce-scatter, rank j's chunk is the smallest run of whole blocks that
// covers its shard [j count/n, (j+1) count/n) (neighbouring chunks may share
// one block).
//
// Wire accounting (CompressedReport): bytes this rank sends. The schedules of
// this library's own (ring, the all-to-alls) are counted exactly: the sum of
// the sizes of the messages this rank posts to other ranks. A Comm::all_reduce
// of S bytes (summable payloads, the dense path) counts as the
// bandwidth-optimal ring/Rabenseifner schedule does, floor(2 (n-1) S / n);
// a Comm::all_gather of s bytes per rank as (n-1) s. The tuner may run a tree
// or the node-local shared-memory window instead, which move the same data
// along other paths; the count is the model, the same for dense and
// compressed. The dense equivalent is that count for the dense collective of
// the same tensor: floor(2 (n-1) S / n) for an all-reduce,
// floor((n-1) S / n) for a reduce-scatter, (n-1) S for an all-gather, S the
// tensor's bytes (for the all-gather: this rank's part).
//
// auto:<spec> (CompressorSpec::auto_select): per call and tensor, compress
// only when encode + decode + compressed transfer is predicted faster than
// the dense transfer:
//   t_compressed = compute + wire_compressed * s,  t_dense = wire_dense * s
// where `compute` comes from running two steps of the protocol on a fresh
// state of this TensorDesc on this rank (synthetic data, timed once per
// process per (spec, TensorDesc), the second step counted) scaled to n ranks
// by the aggregation kind (gather-only decodes n payloads, a chunk owner
// decodes n chunks and encodes one, a ring hop decodes two chunks and
// encodes one), wire_* are the wire counts above for the predicted payload
// sizes, and s the link's seconds per byte: 8 / (link_gbit * 1e9) from
// CompressedOptions::link_gbit, else from CCLZ_LINK_GBIT, else measured once
// per process and communicator shape (size, nodes) by timing a dense 4 MiB
// f32 all-reduce. So that every rank takes the same decision, the ranks agree
// on (compute, wire, s) by an all-reduce (max) of five doubles on every auto
// call (a latency-bound 40-byte all-reduce). The dense path is
// Comm::all_reduce / reduce_scatter / all_gather of the tensor itself, and
// leaves the compressor state untouched. With CCLZ_DEBUG=INFO each rank
// logs, once per (tensor, decision), which tensors it compressed and the
// predicted times behind the decision.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "cclz/cclz.hpp"
#include "cclz/compress.hpp"

namespace cclz {

enum class RequantScheme : int {
  scatter_reduce_allgather = 0,  // the default
  ring = 1,
};
const char* requant_scheme_name(RequantScheme s) noexcept;  // "sra", "ring"
// "sra" / "scatter_reduce_allgather", "ring".
bool parse_requant_scheme(std::string_view s, RequantScheme* out) noexcept;

struct CompressedOptions {
  RequantScheme requant = RequantScheme::scatter_reduce_allgather;
  // false: the result is the sum over ranks; true: the sum divided by the
  // number of ranks (finish()'s alpha = 1/n, applied in f32 before the
  // conversion to the tensor's dtype; the dense path uses ReduceOp::avg).
  bool average = false;
  // auto: the link's bandwidth per rank and direction in Gbit/s (1e9 bits/s,
  // as tc and NICs state it); 0: CCLZ_LINK_GBIT, else measured.
  double link_gbit = 0.0;
  // Named in error messages and the CCLZ_DEBUG log; empty: "<count> x <dtype>".
  std::string name;
};

struct CompressedReport {
  bool compressed = false;  // false: no payload was made (auto chose the dense path)
  Aggregation aggregation = Aggregation::summable;  // of the last round (compressed only)
  RequantScheme requant = RequantScheme::scatter_reduce_allgather;  // used where requantizable
  int rounds = 0;                      // protocol rounds run (0 on the dense path)
  std::uint64_t payload_bytes = 0;     // this rank's payloads from begin()/next(), all rounds
  std::uint64_t wire_bytes = 0;        // bytes this rank sent (see "Wire accounting")
  std::uint64_t dense_bytes = 0;       // the tensor's bytes on this rank (its input)
  std::uint64_t dense_wire_bytes = 0;  // what the dense collective would have sent
  // auto only: the agreed prediction, in seconds (0 otherwise).
  double predicted_compressed_s = 0.0;
  double predicted_dense_s = 0.0;
  std::string reason;  // auto only: one line, as CCLZ_DEBUG=INFO prints it
};

// In place: `tensor` holds desc.count elements of desc.dtype, this rank's
// gradient on entry and the sum over ranks (of what every rank's compressor
// contributed: for error feedback, the compressed values) on return, or the
// mean with opt.average. desc must equal state.desc(); state must have been
// made by c. report may be null.
Status compressed_all_reduce(Comm& comm, void* tensor, const TensorDesc& desc, const Compressor& c,
                             CompressorState& state, const CompressedOptions& opt = {},
                             CompressedReport* report = nullptr);

// sendbuf: this rank's whole tensor (desc.count elements, desc = the state's
// desc, desc.count divisible by the number of ranks n). recvbuf: count / n
// elements, elements [r count/n, (r+1) count/n) of the sum over ranks (or the
// mean), for rank r. Re-quantizable payloads run only the reduce-scatter half
// of the chosen scheme (sending (n-1)/n of the payload, plus at most one
// block per chunk edge) and the owner writes its f32 sum of the decoded
// chunks, without a final re-encode and without calling finish() (the
// default finish's arithmetic). Every other case (summable, gather-only,
// multi-round, and ef21+, whose finish keeps a running sum) runs the
// compressed all-reduce into a temporary tensor and keeps this rank's shard:
// correct, but no cheaper than the all-reduce. recvbuf may be
// sendbuf + r * count/n (NCCL's in-place convention).
Status compressed_reduce_scatter(Comm& comm, const void* sendbuf, void* recvbuf, const TensorDesc& desc,
                                 const Compressor& c, CompressorState& state, const CompressedOptions& opt = {},
                                 CompressedReport* report = nullptr);

// sendbuf: this rank's part (desc.count elements, desc = the state's desc).
// recvbuf: n * desc.count elements: part r = decode(rank r's payload), in
// rank order, the same bytes on every rank (this rank's part too is its
// decoded payload, not its input). Every rank encodes its part with begin()
// and decodes every payload with decode(); finish() is not called. Needs a
// single-round compressor whose payload decodes to the value (not ef21+,
// whose payload is a difference against a per-rank estimate). opt.average
// is ignored. recvbuf may be such that sendbuf == recvbuf + r * count.
Status compressed_all_gather(Comm& comm, const void* sendbuf, void* recvbuf, const TensorDesc& desc,
                             const Compressor& c, CompressorState& state, const CompressedOptions& opt = {},
                             CompressedReport* report = nullptr);

}  // namespace cclz
