// Shared pieces of the multi-rank tests that run as real processes under
// mpiexec: the world communicator, per-rank failure reporting, cross-rank
// agreement helpers and message checks.
//
// MPI is used only for setup and for comparing results between ranks (never
// inside a collective under test), because MPICH's waits spin and the suites
// run up to 8 ranks on 2 cores; everything under test goes through cclz.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cclz/cclz.hpp"

namespace cclz::mpitest {

int world_rank();
int world_size();

// The cclz communicator over MPI_COMM_WORLD, made once by main().
Comm& world();
void set_world(std::unique_ptr<Comm> c);

// A communicator of its own for one test (a split of world() with the same
// ranks), so an error that poisons it cannot spill into the next test.
// Null (with a gtest failure recorded) if the split fails.
std::unique_ptr<Comm> fresh_comm();
// Destroys `c` now (its queued work first; a failure is a gtest failure).
void destroy_comm(std::unique_ptr<Comm>& c);
// parent.split and c.destroy, which print "[slow split]" or "[slow destroy]"
// with `what` and the phases (CommImpl::setup_times, shutdown_times) when
// they take longer than kSlowSetupSeconds, so that a stalled run's log says
// which step waited (how the harness's spinning MPI waits were found).
// fresh_comm and destroy_comm go through them.
inline constexpr double kSlowSetupSeconds = 2.0;
Status timed_split(Comm& parent, int color, int key, std::unique_ptr<Comm>* out, const char* what);
Status timed_destroy(Comm& c, const char* what);

// MPI_COMM_WORLD collectives for the tests' own bookkeeping, waited for
// without spinning (mpi_wait). MPICH's blocking calls poll in a tight loop,
// and with more ranks than cores the ranks spinning there kept the CPU from
// the threads of the rank they waited for: this host's scheduler left such
// a thread (a communicator's worker, which destroy joins) runnable for 10-80
// s without running it, and the test that took a second took that long.
void mpi_wait(MPI_Request* req);
void world_allgather(const void* send, int count, MPI_Datatype type, void* recv);
void world_allreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op);
void world_bcast(void* buf, int count, MPI_Datatype type, int root);
void world_barrier();

// One value from every rank (MPI, outside anything timed).
std::vector<std::uint64_t> allgather_u64(std::uint64_t v);
std::vector<int> allgather_int(int v);
// True on every rank iff `v` is true on every rank.
bool all_true(bool v);

// Environment helpers: the integer value of `name`, or `fallback` if unset
// or not an integer.
int env_int(const char* name, int fallback);

// Whether `msg` mentions rank `r` as a whole number ("rank 3", "ranks 1, 3",
// "rank=3", "[3]"), i.e. the digits of r not glued to other digits.
bool names_rank(std::string_view msg, int r);

// "rank 2/4" prefix for this process's lines.
std::string rank_tag();

// Where a test buffer lives: the heap; cclz::mem_alloc, whose buffers the
// node's ranks read in place; or the heap made readable in place by
// cclz::register_buffer.
enum class Memory { heap, mem_alloc, registered_heap };

// A test buffer with guard bytes on both sides, so writes past either end
// show; filled with 0xA5. `registered`: mem_alloc memory.
class Guarded {
 public:
  static constexpr std::size_t kGuard = 64;
  static constexpr unsigned char kGuardByte = 0xC3;
  static constexpr unsigned char kFillByte = 0xA5;

  explicit Guarded(std::size_t bytes, bool registered = false)
      : Guarded(bytes, registered ? Memory::mem_alloc : Memory::heap) {}
  Guarded(std::size_t bytes, Memory memory);
  ~Guarded();
  Guarded(const Guarded&) = delete;
  Guarded& operator=(const Guarded&) = delete;

  std::byte* data() { return mem_ + kGuard; }
  std::size_t bytes() const { return bytes_; }
  bool guards_intact() const;

 private:
  std::size_t bytes_;
  Memory memory_;
  std::unique_ptr<std::byte[]> heap_;
  std::byte* mem_ = nullptr;
};

}  // namespace cclz::mpitest
