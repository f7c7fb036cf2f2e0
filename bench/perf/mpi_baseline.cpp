// MPI baseline calls for cclz-perf. f16 and bf16 reduce through a
// user-defined commutative op over 16-bit words that widens to f32 and rounds
// back, the same arithmetic cclz's kernels do: MPI has no bf16 type, and
// MPICH 4.0.2 asserts (aborts, rather than returning an error) when asked to
// reduce its MPIX_C_FLOAT16. avg has no MPI op: the
// baseline runs MPI_SUM and leaves out the final local division.
#include "mpi_baseline.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace cclz::perf {
namespace {

template <bool kBf16>
float widen(std::uint16_t v) {
  return kBf16 ? testing::from_bf16_bits(v) : testing::from_f16_bits(v);
}
template <bool kBf16>
std::uint16_t narrow(float f) {
  return kBf16 ? testing::to_bf16_bits(f) : testing::to_f16_bits(f);
}

template <bool kBf16, int kOp>
void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = widen<kBf16>(a[i]);
    const float y = widen<kBf16>(b[i]);
    float r = 0;
    switch (kOp) {
      case 0: r = x + y; break;
      case 1: r = x * y; break;
      case 2: r = std::max(x, y); break;
      default: r = std::min(x, y); break;
    }
    b[i] = narrow<kBf16>(r);
  }
}

MPI_User_function* const kHalfFns[2][4] = {
    {half_op<false, 0>, half_op<false, 1>, half_op<false, 2>, half_op<false, 3>},
    {half_op<true, 0>, half_op<true, 1>, half_op<true, 2>, half_op<true, 3>},
};

int op_index(ReduceOp op) {
  switch (op) {
    case ReduceOp::prod: return 1;
    case ReduceOp::max: return 2;
    case ReduceOp::min: return 3;
    default: return 0;  // sum, avg
  }
}

std::vector<int> to_int(const std::vector<std::size_t>& v) {
  std::vector<int> out;
  out.reserve(v.size());
  for (std::size_t x : v) out.push_back(static_cast<int>(x));
  return out;
}

}  // namespace

MpiBaseline::MpiBaseline(MPI_Comm comm) : comm_(comm) {
  for (int t = 0; t < 2; ++t) {
    for (int o = 0; o < 4; ++o) MPI_Op_create(kHalfFns[t][o], 1, &half_ops_[t][o]);
  }
}

MpiBaseline::~MpiBaseline() {
  for (auto& row : half_ops_) {
    for (MPI_Op& o : row) MPI_Op_free(&o);
  }
}

MPI_Datatype MpiBaseline::datatype(DataType dt) const {
  switch (dt) {
    case DataType::i8: return MPI_INT8_T;
    case DataType::u8: return MPI_UINT8_T;
    case DataType::i32: return MPI_INT32_T;
    case DataType::i64: return MPI_INT64_T;
    case DataType::f32: return MPI_FLOAT;
    case DataType::f64: return MPI_DOUBLE;
    case DataType::f16:
    case DataType::bf16: return MPI_UINT16_T;
  }
  return MPI_BYTE;
}

MPI_Op MpiBaseline::op(const testing::CollCase& c) const {
  const bool user = c.dt == DataType::bf16 || c.dt == DataType::f16;
  if (user) return half_ops_[c.dt == DataType::bf16 ? 1 : 0][op_index(c.op)];
  switch (c.op) {
    case ReduceOp::prod: return MPI_PROD;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
    default: return MPI_SUM;
  }
}

bool MpiBaseline::available(const testing::CollCase& c, std::string* why) const {
  // MPI counts are int.
  const testing::BufferCounts bc = testing::buffer_counts(c);
  if (std::max(bc.send, bc.recv) > static_cast<std::size_t>(INT32_MAX)) {
    *why = "count exceeds MPI's int";
    return false;
  }
  return true;
}

int MpiBaseline::run(const testing::CollCase& c, const testing::VLayout* v, const void* sendbuf,
                     void* recvbuf) const {
  const MPI_Datatype t = datatype(c.dt);
  const int n = static_cast<int>(c.count);
  switch (c.kind) {
    case testing::CollKind::all_reduce: return MPI_Allreduce(sendbuf, recvbuf, n, t, op(c), comm_);
    case testing::CollKind::reduce_scatter: return MPI_Reduce_scatter_block(sendbuf, recvbuf, n, t, op(c), comm_);
    case testing::CollKind::all_gather: return MPI_Allgather(sendbuf, n, t, recvbuf, n, t, comm_);
    case testing::CollKind::all_to_all: return MPI_Alltoall(sendbuf, n, t, recvbuf, n, t, comm_);
    case testing::CollKind::all_to_allv: {
      const std::vector<int> sc = to_int(v->send_counts), sd = to_int(v->send_displs);
      const std::vector<int> rc = to_int(v->recv_counts), rd = to_int(v->recv_displs);
      return MPI_Alltoallv(sendbuf, sc.data(), sd.data(), t, recvbuf, rc.data(), rd.data(), t, comm_);
    }
    case testing::CollKind::broadcast: {
      // MPI_Bcast is in place: the root sends straight from its sendbuf (no
      // extra copy charged to MPI), the others receive into recvbuf.
      int rank = 0;
      MPI_Comm_rank(comm_, &rank);
      void* buf = rank == c.root ? const_cast<void*>(sendbuf) : recvbuf;
      return MPI_Bcast(buf, n, t, c.root, comm_);
    }
    case testing::CollKind::reduce: return MPI_Reduce(sendbuf, recvbuf, n, t, op(c), c.root, comm_);
    case testing::CollKind::barrier: return MPI_Barrier(comm_);
  }
  return MPI_ERR_OTHER;
}

}  // namespace cclz::perf
