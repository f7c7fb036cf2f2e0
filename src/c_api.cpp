// The C API (include/cclz/cclz.h) over cclz::Comm: NCCL's function shapes
// with a cclz prefix, MPI's request semantics (wait/test free the request).
//
// Handles: a registry (the one piece of process-wide state here) holds every
// communicator handle ever returned. Destroy empties the handle but keeps it
// registered, so a later call through it is cclzInvalidUsage and the address
// is never reused by another communicator. Calls hold a shared_ptr to the
// Comm while they run, so a destroy racing with a call cannot free it
// underneath. Messages of failed calls go to a thread-local string
// (cclzGetLastError), like errno.
// Cost: one registry lookup (a mutex and a hash probe) per call.
#include "cclz/cclz.h"

#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_set>

#include "cclz/cclz.hpp"
#include "comm_impl.hpp"

struct cclzComm {
  std::shared_ptr<cclz::Comm> comm;  // null once destroyed
};

struct cclzRequest {
  cclz::Request request;
};

namespace {

using cclz::Result;
using cclz::Status;

static_assert(sizeof(cclzUniqueId) == sizeof(cclz::UniqueId), "cclzUniqueId must match cclz::UniqueId");
static_assert(static_cast<int>(cclzTimeout) == static_cast<int>(Result::timeout));
static_assert(static_cast<int>(cclzBfloat16) == static_cast<int>(cclz::DataType::bf16));
static_assert(static_cast<int>(cclzInt64) == static_cast<int>(cclz::DataType::i64));
static_assert(static_cast<int>(cclzAvg) == static_cast<int>(cclz::ReduceOp::avg));

struct Registry {
  std::mutex mu;
  std::unordered_set<const cclzComm*> handles;
};

// Never destroyed, like the handles it holds: they stay reachable (no
// leak at exit), and a call from an atexit handler still finds it.
Registry& registry() {
  static Registry* const r = new Registry;
  return *r;
}

thread_local std::string t_last_error;

cclzResult_t fail(const Status& st) {
  t_last_error = st.message().empty() ? cclz::result_name(st.code()) : st.message();
  return static_cast<cclzResult_t>(st.code());
}

cclzResult_t fail(Result code, std::string message) { return fail(Status(code, std::move(message))); }

cclzResult_t ret(const Status& st) { return st.ok() ? cclzSuccess : fail(st); }

// The live Comm behind `h`, or the error for a null, unknown or destroyed one.
cclzResult_t lookup(const cclzComm* h, const char* fn, std::shared_ptr<cclz::Comm>* out) {
  if (h == nullptr) return fail(Result::invalid_argument, std::string(fn) + ": null communicator");
  Registry& reg = registry();
  std::lock_guard lk(reg.mu);
  if (reg.handles.count(h) == 0) {
    return fail(Result::invalid_argument, std::string(fn) + ": not a communicator handle");
  }
  if (!h->comm) return fail(Result::invalid_usage, std::string(fn) + ": communicator was destroyed");
  *out = h->comm;
  return cclzSuccess;
}

cclzComm_t wrap(std::unique_ptr<cclz::Comm> c) {
  auto* h = new cclzComm{std::shared_ptr<cclz::Comm>(std::move(c))};
  Registry& reg = registry();
  std::lock_guard lk(reg.mu);
  reg.handles.insert(h);
  return h;
}

// Takes the Comm out of a live handle (destroy/abort).
cclzResult_t take(cclzComm_t h, const char* fn, std::shared_ptr<cclz::Comm>* out) {
  if (cclzResult_t r = lookup(h, fn, out); r != cclzSuccess) return r;
  Registry& reg = registry();
  std::lock_guard lk(reg.mu);
  if (!h->comm) return fail(Result::invalid_usage, std::string(fn) + ": communicator was destroyed");
  h->comm.reset();
  return cclzSuccess;
}

// Runs `f`, turning escaping exceptions (allocation) into an error code: a C
// caller must never see one.
template <typename F>
cclzResult_t guarded(const char* fn, F&& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return fail(Result::system_error, std::string(fn) + ": out of memory");
  } catch (const std::exception& e) {
    return fail(Result::internal_error, std::string(fn) + ": " + e.what());
  } catch (...) {
    return fail(Result::internal_error, std::string(fn) + ": unknown exception");
  }
}

template <typename F>
cclzResult_t with_comm(cclzComm_t h, const char* fn, F&& f) noexcept {
  return guarded(fn, [&]() -> cclzResult_t {
    std::shared_ptr<cclz::Comm> c;
    if (cclzResult_t r = lookup(h, fn, &c); r != cclzSuccess) return r;
    return f(*c);
  });
}

// A non-blocking call's request into a handle; one rejected at once is
// reported now, with no handle to free.
cclzResult_t start(cclz::Request r, cclzRequest_t* out, const char* fn) {
  if (out == nullptr) {
    // Nobody could wait on it: finish it here so the buffers are not used
    // after the caller returns.
    (void)r.wait();
    return fail(Result::invalid_argument, std::string(fn) + ": null request pointer");
  }
  *out = nullptr;
  Status st;
  if (r.test(&st) && !st.ok()) return fail(st);
  *out = new cclzRequest{std::move(r)};
  return cclzSuccess;
}

cclz::DataType dt(cclzDataType_t t) { return static_cast<cclz::DataType>(t); }
cclz::ReduceOp op(cclzRedOp_t o) { return static_cast<cclz::ReduceOp>(o); }

cclzResult_t query(const cclzComm* h, const char* fn, int* out, int (cclz::Comm::*get)() const noexcept) {
  return guarded(fn, [&]() -> cclzResult_t {
    if (out == nullptr) return fail(Result::invalid_argument, std::string(fn) + ": null output");
    std::shared_ptr<cclz::Comm> c;
    if (cclzResult_t r = lookup(h, fn, &c); r != cclzSuccess) return r;
    *out = ((*c).*get)();
    return cclzSuccess;
  });
}

}  // namespace

namespace cclz::detail {
cclzComm* c_handle_from_comm(std::unique_ptr<Comm> c) { return wrap(std::move(c)); }
}  // namespace cclz::detail

extern "C" {

const char* cclzGetErrorString(cclzResult_t result) {
  switch (result) {
    case cclzSuccess: return "no error";
    case cclzUnhandledCudaError: return "unhandled CUDA error";
    case cclzSystemError: return "system error (out of memory, sockets, threads)";
    case cclzInternalError: return "internal error";
    case cclzInvalidArgument: return "invalid argument";
    case cclzInvalidUsage: return "invalid usage";
    case cclzRemoteError: return "remote error (a peer failed, aborted or disappeared)";
    case cclzInProgress: return "operation in progress";
    case cclzTimeout: return "timeout (CCLZ_TIMEOUT passed)";
  }
  return "unknown result code";
}

const char* cclzGetLastError(cclzComm_t comm) {
  (void)comm;  // the message is per thread, whichever communicator failed
  return t_last_error.c_str();
}

cclzResult_t cclzMemAlloc(void** ptr, size_t size) {
  return guarded("cclzMemAlloc", [&]() -> cclzResult_t {
    if (Status st = cclz::mem_alloc(ptr, size); !st.ok()) return fail(st);
    return cclzSuccess;
  });
}

cclzResult_t cclzMemFree(void* ptr) {
  return guarded("cclzMemFree", [&]() -> cclzResult_t {
    if (Status st = cclz::mem_free(ptr); !st.ok()) return fail(st);
    return cclzSuccess;
  });
}

cclzResult_t cclzRegisterBuffer(void* ptr, size_t size) {
  return guarded("cclzRegisterBuffer", [&]() -> cclzResult_t {
    if (Status st = cclz::register_buffer(ptr, size); !st.ok()) return fail(st);
    return cclzSuccess;
  });
}

cclzResult_t cclzDeregisterBuffer(void* ptr) {
  return guarded("cclzDeregisterBuffer", [&]() -> cclzResult_t {
    if (Status st = cclz::deregister_buffer(ptr); !st.ok()) return fail(st);
    return cclzSuccess;
  });
}

cclzResult_t cclzGetUniqueId(cclzUniqueId* uniqueId) {
  return guarded("cclzGetUniqueId", [&]() -> cclzResult_t {
    if (uniqueId == nullptr) return fail(Result::invalid_argument, "cclzGetUniqueId: null id");
    cclz::UniqueId id{};
    if (Status st = cclz::Comm::create_unique_id(&id); !st.ok()) return fail(st);
    std::memcpy(uniqueId->internal, id.internal, sizeof id.internal);
    return cclzSuccess;
  });
}

cclzResult_t cclzCommInitRank(cclzComm_t* comm, int nranks, cclzUniqueId commId, int rank) {
  return guarded("cclzCommInitRank", [&]() -> cclzResult_t {
    if (comm == nullptr) return fail(Result::invalid_argument, "cclzCommInitRank: null communicator pointer");
    *comm = nullptr;
    cclz::UniqueId id{};
    std::memcpy(id.internal, commId.internal, sizeof id.internal);
    std::unique_ptr<cclz::Comm> c;
    if (Status st = cclz::Comm::init_rank(&c, nranks, id, rank); !st.ok()) return fail(st);
    *comm = wrap(std::move(c));
    return cclzSuccess;
  });
}

cclzResult_t cclzCommInitFromEnv(cclzComm_t* comm) {
  return guarded("cclzCommInitFromEnv", [&]() -> cclzResult_t {
    if (comm == nullptr) return fail(Result::invalid_argument, "cclzCommInitFromEnv: null communicator pointer");
    *comm = nullptr;
    std::unique_ptr<cclz::Comm> c;
    if (Status st = cclz::Comm::init_from_env(&c); !st.ok()) return fail(st);
    *comm = wrap(std::move(c));
    return cclzSuccess;
  });
}

cclzResult_t cclzCommSplit(cclzComm_t comm, int color, int key, cclzComm_t* newcomm) {
  return with_comm(comm, "cclzCommSplit", [&](cclz::Comm& c) -> cclzResult_t {
    if (newcomm == nullptr) return fail(Result::invalid_argument, "cclzCommSplit: null output");
    *newcomm = nullptr;
    std::unique_ptr<cclz::Comm> child;
    if (Status st = c.split(color, key, &child); !st.ok()) return fail(st);
    if (child) *newcomm = wrap(std::move(child));
    return cclzSuccess;
  });
}

cclzResult_t cclzCommDestroy(cclzComm_t comm) {
  return guarded("cclzCommDestroy", [&]() -> cclzResult_t {
    std::shared_ptr<cclz::Comm> c;
    if (cclzResult_t r = take(comm, "cclzCommDestroy", &c); r != cclzSuccess) return r;
    return ret(c->destroy());
  });
}

cclzResult_t cclzCommAbort(cclzComm_t comm) {
  return guarded("cclzCommAbort", [&]() -> cclzResult_t {
    std::shared_ptr<cclz::Comm> c;
    if (cclzResult_t r = take(comm, "cclzCommAbort", &c); r != cclzSuccess) return r;
    c->abort();
    (void)c->destroy();  // after abort only releases what is left
    return cclzSuccess;
  });
}

cclzResult_t cclzCommGetAsyncError(cclzComm_t comm, cclzResult_t* asyncError) {
  return with_comm(comm, "cclzCommGetAsyncError", [&](cclz::Comm& c) -> cclzResult_t {
    if (asyncError == nullptr) return fail(Result::invalid_argument, "cclzCommGetAsyncError: null output");
    const Status st = c.async_error();
    if (!st.ok()) t_last_error = st.message();
    *asyncError = static_cast<cclzResult_t>(st.code());
    return cclzSuccess;
  });
}

cclzResult_t cclzCommCount(const cclzComm_t comm, int* count) {
  return query(comm, "cclzCommCount", count, &cclz::Comm::size);
}
cclzResult_t cclzCommUserRank(const cclzComm_t comm, int* rank) {
  return query(comm, "cclzCommUserRank", rank, &cclz::Comm::rank);
}
cclzResult_t cclzCommLocalRank(const cclzComm_t comm, int* localRank) {
  return query(comm, "cclzCommLocalRank", localRank, &cclz::Comm::local_rank);
}
cclzResult_t cclzCommLocalSize(const cclzComm_t comm, int* localSize) {
  return query(comm, "cclzCommLocalSize", localSize, &cclz::Comm::local_size);
}
cclzResult_t cclzCommNodeId(const cclzComm_t comm, int* nodeId) {
  return query(comm, "cclzCommNodeId", nodeId, &cclz::Comm::node_id);
}
cclzResult_t cclzCommNumNodes(const cclzComm_t comm, int* numNodes) {
  return query(comm, "cclzCommNumNodes", numNodes, &cclz::Comm::num_nodes);
}

// ---------------------------------------------------------------- blocking

cclzResult_t cclzAllReduce(const void* sendbuff, void* recvbuff, size_t count, cclzDataType_t datatype,
                           cclzRedOp_t o, cclzComm_t comm) {
  return with_comm(comm, "cclzAllReduce", [&](cclz::Comm& c) {
    return ret(c.all_reduce(sendbuff, recvbuff, count, dt(datatype), op(o)).wait());
  });
}

cclzResult_t cclzReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, cclzDataType_t datatype,
                               cclzRedOp_t o, cclzComm_t comm) {
  return with_comm(comm, "cclzReduceScatter", [&](cclz::Comm& c) {
    return ret(c.reduce_scatter(sendbuff, recvbuff, recvcount, dt(datatype), op(o)).wait());
  });
}

cclzResult_t cclzAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, cclzDataType_t datatype,
                           cclzComm_t comm) {
  return with_comm(comm, "cclzAllGather", [&](cclz::Comm& c) {
    return ret(c.all_gather(sendbuff, recvbuff, sendcount, dt(datatype)).wait());
  });
}

cclzResult_t cclzAllToAll(const void* sendbuff, void* recvbuff, size_t count, cclzDataType_t datatype,
                          cclzComm_t comm) {
  return with_comm(comm, "cclzAllToAll", [&](cclz::Comm& c) {
    return ret(c.all_to_all(sendbuff, recvbuff, count, dt(datatype)).wait());
  });
}

namespace {
cclz::Request all_to_allv(cclz::Comm& c, const void* sendbuff, const size_t* sendcounts, const size_t* sdispls,
                          void* recvbuff, const size_t* recvcounts, const size_t* rdispls, cclzDataType_t datatype,
                          const char* fn) {
  if (sendcounts == nullptr || sdispls == nullptr || recvcounts == nullptr || rdispls == nullptr) {
    return cclz::Request::failed(
        {Result::invalid_argument, "rank " + std::to_string(c.rank()) + ": " + fn + ": null count array"});
  }
  const auto n = static_cast<std::size_t>(c.size());
  return c.all_to_allv(sendbuff, {sendcounts, n}, {sdispls, n}, recvbuff, {recvcounts, n}, {rdispls, n},
                       dt(datatype));
}
}  // namespace

cclzResult_t cclzAllToAllv(const void* sendbuff, const size_t* sendcounts, const size_t* sdispls, void* recvbuff,
                           const size_t* recvcounts, const size_t* rdispls, cclzDataType_t datatype,
                           cclzComm_t comm) {
  return with_comm(comm, "cclzAllToAllv", [&](cclz::Comm& c) {
    return ret(all_to_allv(c, sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls, datatype,
                           "cclzAllToAllv")
                   .wait());
  });
}

cclzResult_t cclzBroadcast(const void* sendbuff, void* recvbuff, size_t count, cclzDataType_t datatype, int root,
                           cclzComm_t comm) {
  return with_comm(comm, "cclzBroadcast", [&](cclz::Comm& c) {
    return ret(c.broadcast(sendbuff, recvbuff, count, dt(datatype), root).wait());
  });
}

cclzResult_t cclzReduce(const void* sendbuff, void* recvbuff, size_t count, cclzDataType_t datatype, cclzRedOp_t o,
                        int root, cclzComm_t comm) {
  return with_comm(comm, "cclzReduce", [&](cclz::Comm& c) {
    return ret(c.reduce(sendbuff, recvbuff, count, dt(datatype), op(o), root).wait());
  });
}

cclzResult_t cclzBarrier(cclzComm_t comm) {
  return with_comm(comm, "cclzBarrier", [&](cclz::Comm& c) { return ret(c.barrier().wait()); });
}

cclzResult_t cclzSend(const void* sendbuff, size_t count, cclzDataType_t datatype, int peer, cclzComm_t comm) {
  return with_comm(comm, "cclzSend",
                   [&](cclz::Comm& c) { return ret(c.send(sendbuff, count, dt(datatype), peer).wait()); });
}

cclzResult_t cclzRecv(void* recvbuff, size_t count, cclzDataType_t datatype, int peer, cclzComm_t comm) {
  return with_comm(comm, "cclzRecv",
                   [&](cclz::Comm& c) { return ret(c.recv(recvbuff, count, dt(datatype), peer).wait()); });
}

// ------------------------------------------------------------ non-blocking

cclzResult_t cclzIallReduce(const void* sendbuff, void* recvbuff, size_t count, cclzDataType_t datatype,
                            cclzRedOp_t o, cclzComm_t comm, cclzRequest_t* request) {
  return with_comm(comm, "cclzIallReduce", [&](cclz::Comm& c) {
    return start(c.all_reduce(sendbuff, recvbuff, count, dt(datatype), op(o)), request, "cclzIallReduce");
  });
}

cclzResult_t cclzIreduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, cclzDataType_t datatype,
                                cclzRedOp_t o, cclzComm_t comm, cclzRequest_t* request) {
  return with_comm(comm, "cclzIreduceScatter", [&](cclz::Comm& c) {
    return start(c.reduce_scatter(sendbuff, recvbuff, recvcount, dt(datatype), op(o)), request,
                 "cclzIreduceScatter");
  });
}

cclzResult_t cclzIallGather(const void* sendbuff, void* recvbuff, size_t sendcount, cclzDataType_t datatype,
                            cclzComm_t comm, cclzRequest_t* request) {
  return with_comm(comm, "cclzIallGather", [&](cclz::Comm& c) {
    return start(c.all_gather(sendbuff, recvbuff, sendcount, dt(datatype)), request, "cclzIallGather");
  });
}

cclzResult_t cclzIallToAll(const void* sendbuff, void* recvbuff, size_t count, cclzDataType_t datatype,
                           cclzComm_t comm, cclzRequest_t* request) {
  return with_comm(comm, "cclzIallToAll", [&](cclz::Comm& c) {
    return start(c.all_to_all(sendbuff, recvbuff, count, dt(datatype)), request, "cclzIallToAll");
  });
}

cclzResult_t cclzIallToAllv(const void* sendbuff, const size_t* sendcounts, const size_t* sdispls, void* recvbuff,
                            const size_t* recvcounts, const size_t* rdispls, cclzDataType_t datatype,
                            cclzComm_t comm, cclzRequest_t* request) {
  return with_comm(comm, "cclzIallToAllv", [&](cclz::Comm& c) {
    return start(all_to_allv(c, sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls, datatype,
                             "cclzIallToAllv"),
                 request, "cclzIallToAllv");
  });
}

cclzResult_t cclzIbroadcast(const void* sendbuff, void* recvbuff, size_t count, cclzDataType_t datatype, int root,
                            cclzComm_t comm, cclzRequest_t* request) {
  return with_comm(comm, "cclzIbroadcast", [&](cclz::Comm& c) {
    return start(c.broadcast(sendbuff, recvbuff, count, dt(datatype), root), request, "cclzIbroadcast");
  });
}

cclzResult_t cclzIreduce(const void* sendbuff, void* recvbuff, size_t count, cclzDataType_t datatype, cclzRedOp_t o,
                         int root, cclzComm_t comm, cclzRequest_t* request) {
  return with_comm(comm, "cclzIreduce", [&](cclz::Comm& c) {
    return start(c.reduce(sendbuff, recvbuff, count, dt(datatype), op(o), root), request, "cclzIreduce");
  });
}

cclzResult_t cclzIbarrier(cclzComm_t comm, cclzRequest_t* request) {
  return with_comm(comm, "cclzIbarrier", [&](cclz::Comm& c) { return start(c.barrier(), request, "cclzIbarrier"); });
}

cclzResult_t cclzIsend(const void* sendbuff, size_t count, cclzDataType_t datatype, int peer, cclzComm_t comm,
                       cclzRequest_t* request) {
  return with_comm(comm, "cclzIsend", [&](cclz::Comm& c) {
    return start(c.send(sendbuff, count, dt(datatype), peer), request, "cclzIsend");
  });
}

cclzResult_t cclzIrecv(void* recvbuff, size_t count, cclzDataType_t datatype, int peer, cclzComm_t comm,
                       cclzRequest_t* request) {
  return with_comm(comm, "cclzIrecv", [&](cclz::Comm& c) {
    return start(c.recv(recvbuff, count, dt(datatype), peer), request, "cclzIrecv");
  });
}

cclzResult_t cclzWait(cclzRequest_t* request) {
  return guarded("cclzWait", [&]() -> cclzResult_t {
    if (request == nullptr) return fail(Result::invalid_argument, "cclzWait: null request pointer");
    if (*request == nullptr) return cclzSuccess;
    const Status st = (*request)->request.wait();
    delete *request;
    *request = nullptr;
    return ret(st);
  });
}

cclzResult_t cclzTest(cclzRequest_t* request, int* done) {
  return guarded("cclzTest", [&]() -> cclzResult_t {
    if (request == nullptr || done == nullptr) return fail(Result::invalid_argument, "cclzTest: null argument");
    *done = 0;
    if (*request == nullptr) {
      *done = 1;
      return cclzSuccess;
    }
    Status st;
    if (!(*request)->request.test(&st)) return cclzSuccess;
    delete *request;
    *request = nullptr;
    *done = 1;
    return ret(st);
  });
}

}  // extern "C"
