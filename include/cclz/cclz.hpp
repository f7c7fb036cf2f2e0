// cclz public C++ API: communicators, requests and collectives.
//
// Every collective is non-blocking: it returns a Request at once and the work
// runs on the communicator's progress engine. `.wait()` blocks for the result
// and runs queued work on the calling thread. A call nobody waits on runs on
// the engine's worker thread: after a grace period of 100 us, or up to 2 ms
// when the program's previous calls were run by their waiters (the worker
// then sleeps, so that waited calls cost no thread switches), or at once
// when `.test()` polls it.
// Calls on one communicator are executed in the order they were issued, and
// every rank must issue the same collectives in the same order (as in MPI and
// NCCL). Buffers must stay valid until the request completes.
//
// In-place conventions follow NCCL: all_reduce/broadcast/reduce with
// sendbuf == recvbuf; all_gather with sendbuf == recvbuf + rank*sendcount;
// reduce_scatter with recvbuf == sendbuf + rank*recvcount.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "cclz/types.hpp"

namespace cclz {

namespace detail {
struct RequestState;
struct CommImpl;
}  // namespace detail

// Handle on one non-blocking operation. Copyable; all copies see one result.
class Request {
 public:
  Request() = default;  // an empty request is complete and successful
  explicit Request(std::shared_ptr<detail::RequestState> s) : s_(std::move(s)) {}
  static Request failed(Status st);

  // Blocks until the operation completes and returns its status.
  Status wait();
  // True when complete; then *st (if given) receives the status.
  bool test(Status* st = nullptr);

 private:
  std::shared_ptr<detail::RequestState> s_;
};

// Per-call options. Empty fields mean "use the environment or the tuner".
struct CallOptions {
  std::string algorithm;  // e.g. "ring"; overrides CCLZ_ALGO and the tuner
};

// Opaque rendezvous token (NCCL's ncclUniqueId shape): one rank makes it,
// the caller spreads it to the others by any means (MPI_Bcast, a file, ...).
struct UniqueId {
  char internal[128];
};

// Host memory for collective buffers that the node's ranks read from one
// another directly (as NCCL's ncclMemAlloc buffers): a large node-local
// collective whose buffers on every rank of the node come from here copies
// each byte once, straight between the ranks' buffers, instead of staging it
// through shared slots (docs/performance.md). Any other buffer still works
// and takes the staged path. The memory is zeroed, page aligned and counted
// against /dev/shm-like shared memory (a memfd per allocation); a peer keeps
// its mapping of a freed buffer until it is evicted from its cache or the
// communicator is destroyed. bytes == 0 gives *ptr = nullptr. The pages
// are shared, not copied on write: a child forked after the allocation
// (a data-loader worker) writes into the parent's buffer.
// Errors: invalid_argument (null ptr), system_error (out of memory).
Status mem_alloc(void** ptr, std::size_t bytes);
// Frees a mem_alloc buffer; nullptr is a no-op. Any other pointer (or one
// freed already) is invalid_argument and frees nothing.
Status mem_free(void* ptr);

// Makes an existing heap buffer readable in place by the node's ranks, as
// if it came from mem_alloc (NCCL's ncclCommRegister does this for the
// buffers it is given): its pages are copied into a memfd, which is then
// mapped over them at the same addresses, so the program sees the same
// bytes where they were, and large node-local collectives on them copy
// each byte once. Worth it for a buffer used in many calls (a gradient
// bucket): registering costs a copy of the buffer. The buffer must be
// whole pages (ptr and bytes multiples of the page size: aligned_alloc,
// mmap), of private anonymous read-write memory (the heap, anonymous
// mmap), since the pages move; registering a range inside a mem_alloc
// buffer does nothing, and one inside a registered buffer (at any
// alignment) counts one registration more; overlapping registrations merge.
// While registered the pages are shared, not copied on write, with a child
// forked meanwhile. No other thread may write the buffer during the call.
// Errors: invalid_argument (null pointer, 0 bytes, not whole pages, memory
// that is not private anonymous read-write, a range overlapping a mem_alloc
// buffer in part), system_error (out of shared memory); the buffer is
// untouched then.
Status register_buffer(void* ptr, std::size_t bytes);
// Undoes one register_buffer; `ptr` may be any address inside the range.
// With the last registration gone the pages become private again, with
// the same bytes. A registered buffer must be deregistered before it is
// freed: a collective that finds one freed (its first page no longer
// shared) warns and takes the staged path, but only that page is checked,
// on every call of 4 MiB or more and every 64th smaller one.
// Errors: invalid_argument (null, or not in a registered buffer or a
// mem_alloc one).
Status deregister_buffer(void* ptr);

class Comm {
 public:
  // Makes a rendezvous token and starts, in this process, the service that
  // the ranks of `init_rank` meet at.
  static Status create_unique_id(UniqueId* id);
  // Collective over `nranks` processes that share `id`.
  static Status init_rank(std::unique_ptr<Comm>* out, int nranks, const UniqueId& id, int rank);
  // torchrun-style: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (LOCAL_RANK,
  // CCLZ_MASTER_PORT optional). Rank 0 listens on the port.
  static Status init_from_env(std::unique_ptr<Comm>* out);
  // (From an MPI communicator: see cclz/mpi.hpp.)

  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const noexcept;
  int size() const noexcept;
  int local_rank() const noexcept;   // index among the ranks of this node
  int local_size() const noexcept;
  int node_id() const noexcept;      // 0..num_nodes-1, numbered by first rank
  int num_nodes() const noexcept;
  int node_of(int rank) const noexcept;

  // Collective over this communicator: ranks with the same color form a new
  // communicator, ordered by (key, old rank). color < 0: this rank takes part
  // in the exchange but gets no communicator (*out = nullptr).
  Status split(int color, int key, std::unique_ptr<Comm>* out);

  // Waits for queued work, then releases transport resources. Later calls
  // fail with invalid_usage. Also done by the destructor.
  Status destroy();
  // Stops at once: pending and later operations fail with remote_error, and
  // peers blocked on this rank get an error instead of hanging.
  void abort();
  // The first error this communicator hit (success if none). After an error
  // every later operation fails fast with it.
  Status async_error() const;

  Request all_reduce(const void* sendbuf, void* recvbuf, std::size_t count, DataType dt, ReduceOp op,
                     const CallOptions& opt = {});
  Request reduce_scatter(const void* sendbuf, void* recvbuf, std::size_t recvcount, DataType dt, ReduceOp op,
                         const CallOptions& opt = {});
  Request all_gather(const void* sendbuf, void* recvbuf, std::size_t sendcount, DataType dt,
                     const CallOptions& opt = {});
  // `count` elements to each peer; recvbuf receives `count` from each peer.
  Request all_to_all(const void* sendbuf, void* recvbuf, std::size_t count, DataType dt,
                     const CallOptions& opt = {});
  // Counts and displacements in elements, one per rank.
  Request all_to_allv(const void* sendbuf, std::span<const std::size_t> send_counts,
                      std::span<const std::size_t> send_displs, void* recvbuf,
                      std::span<const std::size_t> recv_counts, std::span<const std::size_t> recv_displs,
                      DataType dt, const CallOptions& opt = {});
  Request broadcast(const void* sendbuf, void* recvbuf, std::size_t count, DataType dt, int root,
                    const CallOptions& opt = {});
  Request reduce(const void* sendbuf, void* recvbuf, std::size_t count, DataType dt, ReduceOp op, int root,
                 const CallOptions& opt = {});
  Request barrier(const CallOptions& opt = {});
  // Point to point. Messages between a pair are matched in issue order.
  Request send(const void* buf, std::size_t count, DataType dt, int peer);
  Request recv(void* buf, std::size_t count, DataType dt, int peer);

  // Internal access for the library's own layers (compressors, bindings).
  detail::CommImpl* impl() noexcept { return impl_.get(); }

 private:
  explicit Comm(std::unique_ptr<detail::CommImpl> impl);
  std::unique_ptr<detail::CommImpl> impl_;
  friend struct detail::CommImpl;
};

}  // namespace cclz
