// cclz::comm_from_mpi: a cclz communicator over the ranks of an MPI
// communicator (same ranks, same order). Header-only so that libcclz does
// not depend on MPI; include it from code that already links MPI.
//
// Follows NCCL's recipe: rank 0 makes the unique id, MPI_Bcast spreads it,
// every rank calls Comm::init_rank. Rank 0's outcome travels with the id, so
// if it cannot make one the others fail at once with its message instead of
// waiting for a rendezvous that will never start. Afterwards the ranks agree
// over MPI on success: either every rank has a communicator or none keeps
// one. MPI is called only from the calling thread (MPI_THREAD_FUNNELED is
// enough). Cost: one broadcast of ~700 bytes, the rendezvous, two small
// MPI collectives.
#pragma once

#include <mpi.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cclz/cclz.hpp"

namespace cclz {

inline Status comm_from_mpi(MPI_Comm mpi_comm, std::unique_ptr<Comm>* out) {
  if (out == nullptr) return {Result::invalid_argument, "comm_from_mpi: null output"};
  *out = nullptr;
  int rank = -1, size = 0;
  if (MPI_Comm_rank(mpi_comm, &rank) != MPI_SUCCESS || MPI_Comm_size(mpi_comm, &size) != MPI_SUCCESS) {
    return {Result::invalid_argument, "comm_from_mpi: not a valid MPI communicator"};
  }
  const std::string me = "rank " + std::to_string(rank) + ": comm_from_mpi: ";

  struct Root {
    int code;
    UniqueId id;
    char message[512];
  };
  Root root{};
  if (rank == 0) {
    const Status st = Comm::create_unique_id(&root.id);
    root.code = static_cast<int>(st.code());
    std::strncpy(root.message, st.message().c_str(), sizeof root.message - 1);
  }
  if (MPI_Bcast(&root, static_cast<int>(sizeof root), MPI_BYTE, 0, mpi_comm) != MPI_SUCCESS) {
    return {Result::system_error, me + "MPI_Bcast of the unique id failed"};
  }
  if (root.code != 0) {
    return {static_cast<Result>(root.code),
            me + (rank == 0 ? "" : "rank 0 could not create the unique id: ") + std::string(root.message)};
  }

  std::unique_ptr<Comm> c;
  const Status st = Comm::init_rank(&c, size, root.id, rank);

  // Agree: a rank whose init succeeded must not keep a communicator that
  // some other rank lacks (its first collective would only time out).
  int ok = st.ok() ? 1 : 0;
  std::vector<int> all(static_cast<std::size_t>(size), 0);
  if (MPI_Allgather(&ok, 1, MPI_INT, all.data(), 1, MPI_INT, mpi_comm) != MPI_SUCCESS) {
    if (c) (void)c->destroy();
    return {Result::system_error, me + "MPI_Allgather of the init results failed"};
  }
  std::string failed;
  for (int r = 0; r < size; ++r) {
    if (all[static_cast<std::size_t>(r)] == 0) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!st.ok()) return st;
  if (!failed.empty()) {
    (void)c->destroy();
    return {Result::remote_error, me + "init_rank failed on rank(s) " + failed};
  }
  *out = std::move(c);
  return {};
}

}  // namespace cclz
