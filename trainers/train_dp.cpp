// cclz-train: the data-parallel trainer, launched with mpiexec -n N. MPI
// only starts the ranks and carries the communicator's unique id
// (cclz::comm_from_mpi); every collective of the training runs on cclz.
// Exit status: 0 trained, 1 failed while training, 2 bad command line or
// input (data, compressor spec, checkpoint), with the message from rank 0.
#include <mpi.h>

#include <cstdio>

#include "cclz/mpi.hpp"
#include "dp.hpp"

namespace {

int finish(int code) {
  MPI_Finalize();
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  cclz::train::TrainOptions opts;
  cclz::train::DpOptions dp;
  bool help = false;
  if (cclz::Status s = cclz::train::parse_dp_args(argc, argv, &opts, &dp, &help); !s.ok()) {
    if (rank == 0) std::fprintf(stderr, "cclz-train: %s\n", s.to_string().c_str());
    return finish(2);
  }
  if (help) {
    if (rank == 0) std::fputs(cclz::train::dp_usage(argv[0]).c_str(), stdout);
    return finish(0);
  }
  std::unique_ptr<cclz::Comm> comm;
  if (cclz::Status s = cclz::comm_from_mpi(MPI_COMM_WORLD, &comm); !s.ok()) {
    std::fprintf(stderr, "cclz-train: rank %d: %s\n", rank, s.to_string().c_str());
    return finish(1);
  }
  cclz::train::DpResult result;
  const cclz::Status s = cclz::train::train_dp(*comm, opts, dp, stdout, &result);
  if (!s.ok()) {
    std::fflush(stdout);
    // Input errors are agreed by all ranks: rank 0 speaks for them, unless the
    // failure is this rank's own.
    const bool input = s.code() == cclz::Result::invalid_argument;
    if (rank == 0 || !input || s.message().rfind("another rank", 0) != 0) {
      if (rank == 0 || !input) std::fprintf(stderr, "cclz-train: rank %d: %s\n", rank, s.to_string().c_str());
    }
    comm.reset();
    return finish(input ? 2 : 1);
  }
  const auto& t = result.train;
  if (rank == 0 && !t.train_loss.empty()) {
    const double steps = static_cast<double>(t.train_loss.size());
    std::printf("done     %zu steps in %.1f s (%.1f ms/step), train loss %.4f -> %.4f", t.train_loss.size(), t.seconds,
                1e3 * t.step_seconds / steps, static_cast<double>(t.train_loss.front()),
                static_cast<double>(t.train_loss.back()));
    if (!t.val.empty()) std::printf(", val loss %.4f", static_cast<double>(t.val.back().loss));
    std::uint64_t sent = 0;
    for (auto b : result.bytes_sent) sent += b;
    std::printf("; %.3f MB sent per step; waited %.1f ms/step for reductions after backward", sent / steps / 1e6,
                1e3 * result.comm_wait_s / steps);
    if (result.comm_busy_s > 0) std::printf(" (they ran %.1f ms/step)", 1e3 * result.comm_busy_s / steps);
    std::printf("\n");
  }
  comm.reset();
  return finish(0);
}
