// Implementation of the multi-rank test helpers (see harness.hpp).
#include "harness.hpp"

#include <unistd.h>

#include <gtest/gtest.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>

#include "comm_impl.hpp"

namespace cclz::mpitest {
namespace {
std::unique_ptr<Comm>& world_slot() {
  static std::unique_ptr<Comm> w;
  return w;
}
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

Comm& world() { return *world_slot(); }
void set_world(std::unique_ptr<Comm> c) { world_slot() = std::move(c); }

Status timed_split(Comm& parent, int color, int key, std::unique_ptr<Comm>* out, const char* what) {
  const auto t0 = std::chrono::steady_clock::now();
  const Status st = parent.split(color, key, out);
  const double secs = seconds_since(t0);
  if (st.ok() && *out != nullptr && secs > kSlowSetupSeconds) {
    const detail::CommImpl::SetupTimes& t = (*out)->impl()->setup_times();
    std::printf("[slow split] %s: %s: %.2f s: connecting %.2f, node-local shared memory %.2f, worker %.2f, "
                "the rest (the colour exchange, the queue) %.2f\n",
                rank_tag().c_str(), what, secs, t.connect_s, t.shm_s, t.start_s,
                secs - t.connect_s - t.shm_s - t.start_s);
    std::fflush(stdout);
  } else if (st.ok() && secs > kSlowSetupSeconds) {
    std::printf("[slow split] %s: %s: %.2f s (no communicator for this rank)\n", rank_tag().c_str(), what, secs);
    std::fflush(stdout);
  }
  return st;
}

Status timed_destroy(Comm& c, const char* what) {
  const auto t0 = std::chrono::steady_clock::now();
  const Status st = c.destroy();
  const double secs = seconds_since(t0);
  if (secs > kSlowSetupSeconds) {
    const detail::Engine::ShutdownTimes t = c.impl()->shutdown_times();
    std::printf("[slow destroy] %s: %s: %.2f s: the worker's drain and exit %.2f, an inline runner %.2f, "
                "the transport's release %.2f\n",
                rank_tag().c_str(), what, secs, t.worker_s, t.idle_s, t.transport_s);
    std::fflush(stdout);
  }
  return st;
}

std::unique_ptr<Comm> fresh_comm() {
  std::unique_ptr<Comm> c;
  Status st = timed_split(world(), 0, world().rank(), &c, "a fresh communicator");
  EXPECT_TRUE(st.ok()) << rank_tag() << ": split for a fresh communicator failed: " << st.to_string();
  EXPECT_TRUE(!st.ok() || c != nullptr) << rank_tag() << ": split succeeded but gave no communicator";
  if (!st.ok()) return nullptr;
  return c;
}

void destroy_comm(std::unique_ptr<Comm>& c) {
  if (c == nullptr) return;
  const Status st = timed_destroy(*c, "the test's communicator");
  EXPECT_TRUE(st.ok()) << rank_tag() << ": destroy failed: " << st.to_string();
  c.reset();
}

void mpi_wait(MPI_Request* req) {
  // A few polls for the common case of peers already there, then a short
  // sleep between polls: the harness's exchanges are never timed.
  for (int polls = 0;; ++polls) {
    int done = 0;
    MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (done != 0) return;
    if (polls >= 16) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void world_allgather(const void* send, int count, MPI_Datatype type, void* recv) {
  MPI_Request req;
  MPI_Iallgather(send, count, type, recv, count, type, MPI_COMM_WORLD, &req);
  mpi_wait(&req);
}

void world_allreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op) {
  MPI_Request req;
  MPI_Iallreduce(send, recv, count, type, op, MPI_COMM_WORLD, &req);
  mpi_wait(&req);
}

void world_bcast(void* buf, int count, MPI_Datatype type, int root) {
  MPI_Request req;
  MPI_Ibcast(buf, count, type, root, MPI_COMM_WORLD, &req);
  mpi_wait(&req);
}

void world_barrier() {
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  mpi_wait(&req);
}

std::vector<std::uint64_t> allgather_u64(std::uint64_t v) {
  std::vector<std::uint64_t> all(static_cast<std::size_t>(world_size()));
  world_allgather(&v, 1, MPI_UINT64_T, all.data());
  return all;
}

std::vector<int> allgather_int(int v) {
  std::vector<int> all(static_cast<std::size_t>(world_size()));
  world_allgather(&v, 1, MPI_INT, all.data());
  return all;
}

bool all_true(bool v) {
  const int mine = v ? 1 : 0;
  int all = 0;
  world_allreduce(&mine, &all, 1, MPI_INT, MPI_MIN);
  return all == 1;
}

int env_int(const char* name, int fallback) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return fallback;
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0') return fallback;
  return static_cast<int>(v);
}

bool names_rank(std::string_view msg, int r) {
  // Look at every "rank"/"ranks"/"peer"/"peers" word and the list of numbers
  // that follows it ("ranks 1, 3 and 5", "rank=3", "ranks [1,3]").
  std::string lower(msg);
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (std::string_view word : {std::string_view("rank"), std::string_view("peer")}) {
    std::size_t pos = 0;
    while ((pos = lower.find(word, pos)) != std::string::npos) {
      std::size_t i = pos + word.size();
      pos = i;
      if (i < lower.size() && lower[i] == 's') ++i;
      for (;;) {
        while (i < lower.size() && (lower[i] == ' ' || lower[i] == ':' || lower[i] == '=' || lower[i] == '[' ||
                                    lower[i] == '(' || lower[i] == '{' || lower[i] == ',' || lower[i] == '#')) {
          ++i;
        }
        if (lower.compare(i, 4, "and ") == 0) {
          i += 4;
          continue;
        }
        if (i >= lower.size() || !std::isdigit(static_cast<unsigned char>(lower[i]))) break;
        long v = 0;
        while (i < lower.size() && std::isdigit(static_cast<unsigned char>(lower[i]))) {
          v = v * 10 + (lower[i] - '0');
          ++i;
        }
        if (v == r) return true;
        // "rank 2/4": the part after '/' is a size, not another rank.
        if (i < lower.size() && lower[i] == '/') {
          ++i;
          while (i < lower.size() && std::isdigit(static_cast<unsigned char>(lower[i]))) ++i;
        }
      }
    }
  }
  return false;
}

std::string rank_tag() { return "rank " + std::to_string(world_rank()) + "/" + std::to_string(world_size()); }

Guarded::Guarded(std::size_t bytes, Memory memory) : bytes_(bytes), memory_(memory) {
  const std::size_t total = bytes + 2 * kGuard;
  if (memory == Memory::mem_alloc) {
    void* p = nullptr;
    const Status st = mem_alloc(&p, total);
    if (!st.ok()) throw std::runtime_error(st.to_string());
    mem_ = static_cast<std::byte*>(p);
  } else if (memory == Memory::registered_heap) {
    // Whole pages, as register_buffer asks.
    const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    const std::size_t pages = (total + page - 1) / page * page;
    mem_ = static_cast<std::byte*>(std::aligned_alloc(page, pages));
    if (mem_ == nullptr) throw std::bad_alloc();
    std::memset(mem_, kGuardByte, pages);
    const Status st = register_buffer(mem_, pages);
    if (!st.ok()) {
      std::free(mem_);
      throw std::runtime_error(st.to_string());
    }
  } else {
    // Not value-initialised: the three stores below write every byte once
    // (the matrix's multi-MB cases spent a tenth of their time in memset).
    heap_ = std::make_unique_for_overwrite<std::byte[]>(total);
    mem_ = heap_.get();
  }
  std::memset(mem_, kGuardByte, kGuard);
  std::memset(data(), kFillByte, bytes);
  std::memset(data() + bytes, kGuardByte, kGuard);
}

Guarded::~Guarded() {
  if (memory_ == Memory::mem_alloc) {
    EXPECT_TRUE(mem_free(mem_).ok());
  } else if (memory_ == Memory::registered_heap) {
    EXPECT_TRUE(deregister_buffer(mem_).ok());
    std::free(mem_);
  }
}

bool Guarded::guards_intact() const {
  for (std::size_t i = 0; i < kGuard; ++i) {
    if (mem_[i] != std::byte{kGuardByte} || mem_[kGuard + bytes_ + i] != std::byte{kGuardByte}) return false;
  }
  return true;
}

}  // namespace cclz::mpitest
