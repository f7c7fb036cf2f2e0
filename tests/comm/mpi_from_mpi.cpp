// comm_from_mpi (include/cclz/mpi.hpp) under mpiexec, one scenario per run:
//   ok          world and a reversed MPI sub-communicator, then an all-reduce
//   root-fails  rank 0 cannot make the unique id (it runs with a bad
//               CCLZ_SOCKET_IFNAME): every rank fails at once with rank 0's
//               reason instead of waiting for a rendezvous
//   one-fails   rank 1's init fails (bad CCLZ_TIMEOUT): the others time out
//               at the rendezvous and no rank keeps a communicator
// Every rank checks its own outcome; the exit status is non-zero on every
// rank if any rank failed. Plain main (no GoogleTest): MPI is the harness.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "cclz/mpi.hpp"

namespace {

int g_failed = 0;

void check(bool ok, int rank, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "rank %d: FAILED: %s\n", rank, what.c_str());
  g_failed = 1;
}

bool has(const std::string& s, const char* sub) { return s.find(sub) != std::string::npos; }

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const std::string mode = argc > 1 ? argv[1] : "ok";
  std::unique_ptr<cclz::Comm> c;
  const auto t0 = std::chrono::steady_clock::now();
  cclz::Status st = cclz::comm_from_mpi(MPI_COMM_WORLD, &c);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (mode == "ok") {
    check(st.ok() && c != nullptr, rank, "comm_from_mpi(world): " + st.to_string());
    if (c) {
      check(c->rank() == rank && c->size() == size, rank, "rank/size differ from MPI's");
      std::int64_t x = rank, y = -1;
      st = c->all_reduce(&x, &y, 1, cclz::DataType::i64, cclz::ReduceOp::sum).wait();
      check(st.ok() && y == std::int64_t{size} * (size - 1) / 2, rank, "all_reduce on world: " + st.to_string());
      check(c->destroy().ok(), rank, "destroy");
    }
    MPI_Comm sub;
    MPI_Comm_split(MPI_COMM_WORLD, 0, -rank, &sub);  // reversed order
    std::unique_ptr<cclz::Comm> s;
    st = cclz::comm_from_mpi(sub, &s);
    check(st.ok() && s != nullptr, rank, "comm_from_mpi(sub): " + st.to_string());
    if (s) {
      check(s->rank() == size - 1 - rank, rank, "sub rank does not follow MPI's order");
      std::int32_t v = s->rank() == 0 ? rank : -1, w = 0;
      // max over "my world rank if I am sub rank 0": the world rank of sub rank 0.
      st = s->all_reduce(&v, &w, 1, cclz::DataType::i32, cclz::ReduceOp::max).wait();
      check(st.ok() && w == size - 1, rank, "sub rank 0 is not the highest world rank");
      check(s->destroy().ok(), rank, "destroy sub");
    }
    MPI_Comm_free(&sub);
  } else if (mode == "root-fails") {
    check(!st.ok() && c == nullptr, rank, "expected an error, got " + st.to_string());
    check(secs < 5, rank, "took " + std::to_string(secs) + " s: the others waited instead of failing at once");
    check(has(st.message(), "CCLZ_SOCKET_IFNAME"), rank, "rank 0's reason is missing: " + st.message());
    if (rank != 0) check(has(st.message(), "rank 0 could not create the unique id"), rank, st.message());
  } else if (mode == "one-fails") {
    check(!st.ok() && c == nullptr, rank, "expected an error, got " + st.to_string());
    if (rank == 1) {
      check(has(st.message(), "CCLZ_TIMEOUT"), rank, st.message());
    } else {
      // Either its own rendezvous timeout naming rank 1, or the agreement.
      check(has(st.message(), "1"), rank, "rank 1 not named: " + st.message());
    }
  } else {
    check(false, rank, "unknown mode " + mode);
  }
  int any = 0;
  MPI_Allreduce(&g_failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) std::printf("%s: %s\n", mode.c_str(), any ? "FAILED" : "ok");
  MPI_Finalize();
  return any ? 1 : 0;
}
