// The MPI call that matches each cclz collective, for cclz-perf's baseline
// columns: MPI_Allreduce, MPI_Reduce_scatter_block, MPI_Allgather,
// MPI_Alltoall, MPI_Alltoallv, MPI_Bcast, MPI_Reduce.
#pragma once

#include <mpi.h>

#include <string>

#include "coll_desc.hpp"

namespace cclz::perf {

class MpiBaseline {
 public:
  explicit MpiBaseline(MPI_Comm comm);
  ~MpiBaseline();
  MpiBaseline(const MpiBaseline&) = delete;
  MpiBaseline& operator=(const MpiBaseline&) = delete;

  // Whether MPI can run this case at all (and, if not, why in *why).
  bool available(const testing::CollCase& c, std::string* why) const;
  // One blocking call, out of place. Returns MPI's error code.
  int run(const testing::CollCase& c, const testing::VLayout* v, const void* sendbuf, void* recvbuf) const;

 private:
  MPI_Datatype datatype(DataType dt) const;
  MPI_Op op(const testing::CollCase& c) const;

  MPI_Comm comm_;
  MPI_Op half_ops_[2][4];  // [f16, bf16][sum, prod, max, min], user-defined
};

}  // namespace cclz::perf
