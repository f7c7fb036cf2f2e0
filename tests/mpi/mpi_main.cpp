// main() of the mpiexec-launched GoogleTest binaries.
//
// Every rank runs the same tests in the same order. Rank 0 keeps gtest's
// normal printer; every rank prints its own failures with a "[rank r/n]"
// prefix, so a failure seen on rank 3 only is not lost. After each test the
// ranks compare pass/fail over MPI and rank 0 names the failing ranks; at
// the end every rank exits non-zero if any rank failed, so mpiexec's exit
// status is non-zero whichever process hydra reports.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>

#include "cclz/mpi.hpp"
#include "harness.hpp"

namespace {

using cclz::mpitest::rank_tag;

class RankListener : public ::testing::EmptyTestEventListener {
 public:
  explicit RankListener(bool rank_zero) : rank_zero_(rank_zero) {}

  // The test's name is kept from OnTestStart: asking gtest for the current
  // test inside OnTestPartResult takes a lock gtest already holds there.
  void OnTestStart(const ::testing::TestInfo& t) override {
    current_ = std::string(t.test_suite_name()) + "." + t.name();
  }

  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[%s] FAILURE in %s at %s:%d\n%s\n", rank_tag().c_str(), current_.c_str(),
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
    std::fflush(stderr);
  }

  void OnTestEnd(const ::testing::TestInfo& t) override {
    const bool failed = t.result()->Failed();
    std::vector<int> all = cclz::mpitest::allgather_int(failed ? 1 : 0);
    std::string who;
    for (std::size_t i = 0; i < all.size(); ++i) {
      if (all[i] != 0) who += (who.empty() ? "" : ", ") + std::to_string(i);
    }
    if (!who.empty()) {
      any_failed_ = true;
      if (rank_zero_) {
        std::fprintf(stderr, "[cross-rank] %s.%s failed on rank(s) %s\n", t.test_suite_name(), t.name(), who.c_str());
      }
    }
  }

  bool any_failed() const { return any_failed_; }

 private:
  bool rank_zero_;
  bool any_failed_ = false;
  std::string current_;
};

}  // namespace

int main(int argc, char** argv) {
  // Threads of cclz never call MPI; the funnelled level is enough and keeps
  // MPICH's locking out of the way.
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  const int rank = cclz::mpitest::world_rank();

  ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) delete listeners.Release(listeners.default_result_printer());
  auto* rl = new RankListener(rank == 0);
  listeners.Append(rl);  // gtest owns it

  // The world communicator every suite splits from. Creation is itself under
  // test (see test_comm.cpp), so a failure here is reported, not asserted.
  std::unique_ptr<cclz::Comm> w;
  cclz::Status st = cclz::comm_from_mpi(MPI_COMM_WORLD, &w);
  if (!st.ok() || !w) {
    std::fprintf(stderr, "[%s] comm_from_mpi(MPI_COMM_WORLD) failed: %s\n", rank_tag().c_str(), st.to_string().c_str());
  }
  // Everyone must agree before any rank enters a collective.
  if (!cclz::mpitest::all_true(st.ok() && w != nullptr)) {
    if (rank == 0) std::fprintf(stderr, "world communicator could not be made on every rank; no tests run\n");
    w.reset();
    MPI_Finalize();
    return 1;
  }
  cclz::mpitest::set_world(std::move(w));

  int rc = RUN_ALL_TESTS();
  const bool failed = rc != 0 || rl->any_failed();

  // Release cclz before MPI goes away: comm_from_mpi may have borrowed MPI.
  cclz::Status dst = cclz::mpitest::world().destroy();
  if (!dst.ok()) std::fprintf(stderr, "[%s] destroying the world communicator: %s\n", rank_tag().c_str(), dst.to_string().c_str());
  cclz::mpitest::set_world(nullptr);

  const bool all_ok = cclz::mpitest::all_true(!failed && dst.ok());
  MPI_Finalize();
  return all_ok ? 0 : 1;
}
