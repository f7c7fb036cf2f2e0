// Compressed all-reduce, reduce-scatter and all-gather (cclz/compressed.hpp):
// argument checks, the round-protocol driver (begin, aggregate by the
// payload's kind, next ..., finish), the auto rule's dense path, and the
// chunk layout of re-quantizable payloads. The schemes are in
// aggregate_summable (here: one Comm::all_reduce), aggregate_gather.cpp,
// aggregate_requant_sra.cpp and aggregate_requant_ring.cpp.
//
// Cost per call, beyond the compressor's own encode/decode and the schemes'
// transfers (compressed.hpp has the wire counts): one allocation per
// aggregate buffer (the summed payload, the gathered payloads, the
// re-encoded payload), and for a reduce-scatter that cannot run the
// re-quantizable half-scheme, a temporary tensor of the whole input.
#include <algorithm>
#include <cstring>

#include "compressors/common.hpp"
#include "compressors/compressed_internal.hpp"

namespace cclz {

const char* requant_scheme_name(RequantScheme s) noexcept {
  switch (s) {
    case RequantScheme::scatter_reduce_allgather: return "sra";
    case RequantScheme::ring: return "ring";
  }
  return "unknown";
}

bool parse_requant_scheme(std::string_view s, RequantScheme* out) noexcept {
  if (s == "sra" || s == "scatter_reduce_allgather") {
    *out = RequantScheme::scatter_reduce_allgather;
  } else if (s == "ring") {
    *out = RequantScheme::ring;
  } else {
    return false;
  }
  return true;
}

namespace compress::cc {

Status Call::fail(Result code, const std::string& cause) const {
  const std::string prefix = "rank " + std::to_string(rank) + ": ";
  const std::string rest = cause.starts_with(prefix) ? cause.substr(prefix.size()) : cause;
  return {code, prefix + coll + " (" + what + "): " + rest};
}

std::size_t Chunks::max_elems() const noexcept {
  std::size_t m = 0;
  for (std::size_t j = 0; j < lo.size(); ++j) m = std::max(m, hi[j] - lo[j]);
  return m;
}

std::size_t Chunks::max_bytes() const noexcept {
  std::size_t m = 0;
  for (std::size_t j = 0; j < blo.size(); ++j) m = std::max(m, bhi[j] - blo[j]);
  return m;
}

namespace {

void set_bytes(const Compressor& c, Chunks* ch) {
  ch->blo.resize(ch->lo.size());
  ch->bhi.resize(ch->lo.size());
  for (std::size_t j = 0; j < ch->lo.size(); ++j) {
    ch->blo[j] = c.payload_bytes(ch->lo[j]);
    ch->bhi[j] = c.payload_bytes(ch->hi[j]);
  }
}

}  // namespace

Chunks balanced_chunks(const Compressor& c, std::size_t count, int n) {
  const std::size_t b = c.block_elems();
  const std::size_t blocks = (count + b - 1) / b;
  const auto un = static_cast<std::size_t>(n);
  Chunks ch;
  ch.lo.resize(un);
  ch.hi.resize(un);
  for (std::size_t j = 0; j < un; ++j) {
    // floor(j B / n) without overflow for any realistic B (B < 2^58).
    ch.lo[j] = std::min(count, (j * blocks / un) * b);
    ch.hi[j] = std::min(count, ((j + 1) * blocks / un) * b);
  }
  set_bytes(c, &ch);
  return ch;
}

Chunks shard_chunks(const Compressor& c, std::size_t count, int n) {
  const std::size_t b = c.block_elems();
  const auto un = static_cast<std::size_t>(n);
  const std::size_t shard = count / un;
  Chunks ch;
  ch.lo.resize(un);
  ch.hi.resize(un);
  for (std::size_t j = 0; j < un; ++j) {
    ch.lo[j] = (j * shard) / b * b;
    ch.hi[j] = std::min(count, ((j + 1) * shard + b - 1) / b * b);
    if (shard == 0) ch.hi[j] = ch.lo[j] = 0;
  }
  set_bytes(c, &ch);
  return ch;
}

namespace {

std::string describe(const TensorDesc& d, const Compressor& c, const CompressedOptions& opt) {
  std::string s = opt.name.empty() ? "tensor" : "tensor '" + opt.name + "'";
  s += " (" + std::to_string(d.count) + " x " + dtype_name(d.dtype);
  if (d.rows != 0) s += ", " + std::to_string(d.rows) + "x" + std::to_string(d.cols);
  s += "), spec '" + c.spec().text + "'";
  return s;
}

bool same_desc(const TensorDesc& a, const TensorDesc& b) {
  return a.count == b.count && a.dtype == b.dtype && a.rows == b.rows && a.cols == b.cols;
}

std::string desc_text(const TensorDesc& d) {
  std::string s = std::to_string(d.count) + " x " + dtype_name(d.dtype);
  if (d.rows != 0) s += " (" + std::to_string(d.rows) + "x" + std::to_string(d.cols) + ")";
  return s;
}

// Checks shared by the three collectives.
Status check_common(const Call& k, const TensorDesc& desc, const CompressedOptions& opt, const void* in,
                    const void* out) {
  const Compressor& c = k.c;
  if (&k.state.owner() != &c) {
    return k.fail(Result::invalid_argument, "the state was made by compressor '" + k.state.owner().spec().text +
                                                "', not by this one ('" + c.spec().text + "')");
  }
  if (!dtype_valid(desc.dtype) || !c.supports_dtype(desc.dtype)) {
    return k.fail(Result::invalid_argument,
                  std::string("dtype ") + dtype_name(desc.dtype) + " is not supported by " + c.name());
  }
  if (!same_desc(desc, k.state.desc())) {
    return k.fail(Result::invalid_argument, "the tensor is " + desc_text(desc) + " but the state was made for " +
                                                desc_text(k.state.desc()));
  }
  if (desc.count > 0 && (in == nullptr || out == nullptr)) {
    return k.fail(Result::invalid_argument, "null buffer for " + std::to_string(desc.count) + " elements");
  }
  if (!(opt.link_gbit >= 0.0) || opt.link_gbit > 1e9) {
    return k.fail(Result::invalid_argument, "link_gbit = " + std::to_string(opt.link_gbit) +
                                                " is not a bandwidth (>= 0 Gbit/s, 0 = measure)");
  }
  return {};
}

Status wait_comm(Call& k, Request q) { return k.fail(q.wait()); }

// Runs the rest of the protocol for a begun payload p: aggregate each round,
// next() until the last, then finish() into out (desc elements) with alpha.
Status drive(Call& k, Payload& p, std::span<std::byte> out, float alpha, RequantScheme scheme,
             CompressedReport* rep) {
  const Compressor& c = k.c;
  const TensorDesc& d = k.state.desc();
  std::vector<std::byte> buf;  // the round's aggregate
  std::vector<std::size_t> offs;
  std::vector<std::span<const std::byte>> agg;
  std::vector<float> mine;
  for (;;) {
    ++rep->rounds;
    rep->payload_bytes += p.bytes.size();
    rep->aggregation = p.aggregation;
    agg.clear();
    switch (p.aggregation) {
      case Aggregation::summable: {
        const std::size_t es = dtype_size(p.sum_dtype);
        buf.resize(p.bytes.size());
        const std::size_t elems = es == 0 ? 0 : p.bytes.size() / es;
        if (Status s = wait_comm(k, k.comm.all_reduce(p.bytes.data(), buf.data(), elems, p.sum_dtype, ReduceOp::sum));
            !s.ok()) {
          return s;
        }
        k.wire += cc::all_reduce_wire(p.bytes.size(), k.size);
        agg.emplace_back(buf);
        break;
      }
      case Aggregation::requantizable: {
        if (c.block_elems() == 0) {
          return k.fail(Result::internal_error, "a re-quantizable payload from a compressor whose block_elems() is 0");
        }
        if (p.bytes.size() != c.payload_bytes(d.count)) {
          return k.fail(Result::internal_error,
                        "re-quantizable payload of round " + std::to_string(p.round) + " is " +
                            std::to_string(p.bytes.size()) + " bytes, payload_bytes(" + std::to_string(d.count) +
                            ") says " + std::to_string(c.payload_bytes(d.count)));
        }
        const Chunks ch = balanced_chunks(c, d.count, k.size);
        rep->requant = scheme;
        Status s = scheme == RequantScheme::ring ? requant_ring(k, p.bytes, ch, &mine, &buf)
                                                 : requant_sra(k, p.bytes, ch, &mine, &buf);
        if (!s.ok()) return s;
        agg.emplace_back(buf);
        break;
      }
      case Aggregation::gather_only: {
        if (Status s = gather_payloads(k, p.bytes, &buf, &offs); !s.ok()) return s;
        for (int j = 0; j < k.size; ++j) {
          const auto u = static_cast<std::size_t>(j);
          agg.emplace_back(std::span<const std::byte>(buf).subspan(offs[u], offs[u + 1] - offs[u]));
        }
        break;
      }
      default:
        return k.fail(Result::internal_error,
                      "payload of round " + std::to_string(p.round) + " has an unknown aggregation kind " +
                          std::to_string(static_cast<int>(p.aggregation)));
    }
    if (p.last) return k.fail(c.finish(k.state, agg, out, alpha));
    if (Status s = c.next(k.state, agg, &p); !s.ok()) return k.fail(s);
  }
}

float alpha_for(const CompressedOptions& opt, int n) { return opt.average ? 1.0f / static_cast<float>(n) : 1.0f; }

// The auto rule when the spec asks for it; *dense = true: run the dense collective.
Status maybe_auto(Call& k, cc::Coll coll, const TensorDesc& desc, const CompressedOptions& opt, bool* dense,
                  CompressedReport* rep) {
  *dense = false;
  if (!k.c.spec().auto_select) return {};
  AutoChoice choice;
  if (Status s = auto_choose(k, coll, desc, opt, &choice); !s.ok()) return s;
  rep->predicted_compressed_s = choice.t_compressed;
  rep->predicted_dense_s = choice.t_dense;
  rep->reason = choice.reason;
  *dense = !choice.compress;
  return {};
}

}  // namespace

}  // namespace compress::cc

using compress::cc::Call;

Status compressed_all_reduce(Comm& comm, void* tensor, const TensorDesc& desc, const Compressor& c,
                             CompressorState& state, const CompressedOptions& opt, CompressedReport* report) {
  CompressedReport local;
  CompressedReport& rep = report != nullptr ? *report : local;
  rep = CompressedReport{};
  rep.requant = opt.requant;
  Call k(comm, c, state, "compressed_all_reduce", compress::cc::describe(desc, c, opt));
  if (Status s = compress::cc::check_common(k, desc, opt, tensor, tensor); !s.ok()) return s;
  const std::size_t bytes = desc.dense_bytes();
  rep.dense_bytes = bytes;
  rep.dense_wire_bytes = compress::cc::all_reduce_wire(bytes, k.size);
  bool dense = false;
  if (Status s = compress::cc::maybe_auto(k, compress::cc::Coll::all_reduce, desc, opt, &dense, &rep); !s.ok()) {
    return s;
  }
  if (dense) {
    const ReduceOp op = opt.average ? ReduceOp::avg : ReduceOp::sum;
    if (Status s = compress::cc::wait_comm(k, comm.all_reduce(tensor, tensor, desc.count, desc.dtype, op)); !s.ok()) {
      return s;
    }
    rep.wire_bytes = compress::cc::all_reduce_wire(bytes, k.size);
    return {};
  }
  rep.compressed = true;
  const std::span<std::byte> t(static_cast<std::byte*>(tensor), bytes);
  Payload p;
  if (Status s = c.begin(state, t, &p); !s.ok()) return k.fail(s);
  Status s = compress::cc::drive(k, p, t, compress::cc::alpha_for(opt, k.size), opt.requant, &rep);
  rep.wire_bytes = k.wire;
  return s;
}

Status compressed_reduce_scatter(Comm& comm, const void* sendbuf, void* recvbuf, const TensorDesc& desc,
                                 const Compressor& c, CompressorState& state, const CompressedOptions& opt,
                                 CompressedReport* report) {
  CompressedReport local;
  CompressedReport& rep = report != nullptr ? *report : local;
  rep = CompressedReport{};
  rep.requant = opt.requant;
  Call k(comm, c, state, "compressed_reduce_scatter", compress::cc::describe(desc, c, opt));
  if (Status s = compress::cc::check_common(k, desc, opt, sendbuf, recvbuf); !s.ok()) return s;
  const auto un = static_cast<std::size_t>(k.size);
  if (desc.count % un != 0) {
    return k.fail(Result::invalid_argument, "count " + std::to_string(desc.count) + " is not divisible by the " +
                                                std::to_string(k.size) + " ranks");
  }
  const std::size_t shard = desc.count / un;
  const std::size_t es = dtype_size(desc.dtype);
  const std::size_t bytes = desc.dense_bytes();
  rep.dense_bytes = bytes;
  rep.dense_wire_bytes = compress::cc::reduce_scatter_wire(bytes, k.size);
  bool dense = false;
  if (Status s = compress::cc::maybe_auto(k, compress::cc::Coll::reduce_scatter, desc, opt, &dense, &rep);
      !s.ok()) {
    return s;
  }
  if (dense) {
    const ReduceOp op = opt.average ? ReduceOp::avg : ReduceOp::sum;
    if (Status s = compress::cc::wait_comm(k, comm.reduce_scatter(sendbuf, recvbuf, shard, desc.dtype, op));
        !s.ok()) {
      return s;
    }
    rep.wire_bytes = compress::cc::reduce_scatter_wire(bytes, k.size);
    return {};
  }
  rep.compressed = true;
  const float alpha = compress::cc::alpha_for(opt, k.size);
  const std::span<const std::byte> in(static_cast<const std::byte*>(sendbuf), bytes);
  auto* out = static_cast<std::byte*>(recvbuf);
  Payload p;
  if (Status s = c.begin(state, in, &p); !s.ok()) return k.fail(s);
  const bool half = p.last && p.aggregation == Aggregation::requantizable && c.block_elems() > 0 &&
                    c.spec().feedback != Feedback::ef21 && p.bytes.size() == c.payload_bytes(desc.count);
  if (!half) {
    // The all-reduce into a temporary tensor, then this rank's shard.
    std::vector<std::byte> full(bytes);
    Status s = compress::cc::drive(k, p, full, alpha, opt.requant, &rep);
    rep.wire_bytes = k.wire;
    if (!s.ok()) return s;
    if (shard > 0) std::memmove(out, full.data() + static_cast<std::size_t>(k.rank) * shard * es, shard * es);
    return {};
  }
  rep.rounds = 1;
  rep.payload_bytes = p.bytes.size();
  rep.aggregation = p.aggregation;
  const compress::cc::Chunks ch = compress::cc::shard_chunks(c, desc.count, k.size);
  std::vector<float> mine;
  Status s = opt.requant == RequantScheme::ring ? compress::cc::requant_ring(k, p.bytes, ch, &mine, nullptr)
                                                : compress::cc::requant_sra(k, p.bytes, ch, &mine, nullptr);
  rep.wire_bytes = k.wire;
  if (!s.ok()) return s;
  if (shard == 0) return {};
  const auto ur = static_cast<std::size_t>(k.rank);
  std::span<float> part(mine.data() + (ur * shard - ch.lo[ur]), shard);
  if (alpha != 1.0f) {
    for (float& x : part) x *= alpha;
  }
  compress::store_f32(part, desc.dtype, std::span<std::byte>(out, shard * es));
  return {};
}

Status compressed_all_gather(Comm& comm, const void* sendbuf, void* recvbuf, const TensorDesc& desc,
                             const Compressor& c, CompressorState& state, const CompressedOptions& opt,
                             CompressedReport* report) {
  CompressedReport local;
  CompressedReport& rep = report != nullptr ? *report : local;
  rep = CompressedReport{};
  rep.requant = opt.requant;
  Call k(comm, c, state, "compressed_all_gather", compress::cc::describe(desc, c, opt));
  if (Status s = compress::cc::check_common(k, desc, opt, sendbuf, recvbuf); !s.ok()) return s;
  if (c.multi_round()) {
    return k.fail(Result::invalid_argument,
                  c.name() + " runs several rounds per step; an all-gather needs a single-round compressor");
  }
  if (c.spec().feedback == Feedback::ef21) {
    return k.fail(Result::invalid_argument,
                  "an ef21+ payload encodes a difference against a per-rank estimate, not the value: it cannot be "
                  "gathered");
  }
  const std::size_t bytes = desc.dense_bytes();
  rep.dense_bytes = bytes;
  rep.dense_wire_bytes = compress::cc::all_gather_wire(bytes, k.size);
  bool dense = false;
  if (Status s = compress::cc::maybe_auto(k, compress::cc::Coll::all_gather, desc, opt, &dense, &rep); !s.ok()) {
    return s;
  }
  if (dense) {
    if (Status s = compress::cc::wait_comm(k, comm.all_gather(sendbuf, recvbuf, desc.count, desc.dtype)); !s.ok()) {
      return s;
    }
    rep.wire_bytes = compress::cc::all_gather_wire(bytes, k.size);
    return {};
  }
  rep.compressed = true;
  Payload p;
  if (Status s = c.begin(state, std::span<const std::byte>(static_cast<const std::byte*>(sendbuf), bytes), &p);
      !s.ok()) {
    return k.fail(s);
  }
  if (!p.last) {
    return k.fail(Result::invalid_argument, "the compressor asked for a second round; an all-gather has one");
  }
  rep.rounds = 1;
  rep.payload_bytes = p.bytes.size();
  rep.aggregation = p.aggregation;
  std::vector<std::byte> all;
  std::vector<std::size_t> offs;
  Status s = compress::cc::gather_payloads(k, p.bytes, &all, &offs);
  rep.wire_bytes = k.wire;
  if (!s.ok()) return s;
  auto* out = static_cast<std::byte*>(recvbuf);
  for (std::size_t j = 0; j < static_cast<std::size_t>(k.size); ++j) {
    const std::span<const std::byte> pj(all.data() + offs[j], offs[j + 1] - offs[j]);
    if (Status e = c.decode(state, pj, std::span<std::byte>(out + j * bytes, bytes)); !e.ok()) {
      return k.fail(e.code(), "rank " + std::to_string(j) + "'s payload: " + e.message());
    }
  }
  return {};
}

}  // namespace cclz
