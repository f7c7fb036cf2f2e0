/* cclz C API: NCCL's shape with a cclz prefix, valid C (C99 and later) and
 * C++. Host memory only: there is no stream argument. Every call returns a
 * cclzResult_t; cclzGetLastError() gives the message of this thread's last
 * failed call ("rank R: <collective> #<seq> (...): <cause>").
 *
 * Handles: a destroyed (or aborted) communicator stays a valid handle that
 * answers cclzInvalidUsage ("communicator was destroyed"), so use after
 * destroy is an error, never a crash; a pointer that was never a handle is
 * cclzInvalidArgument. A request is freed by the cclzWait or cclzTest that
 * sees it complete (which sets it to NULL), as in MPI.
 *
 * Non-blocking calls (cclzI...) return at once; buffers (and for
 * cclzIallToAllv the count arrays are copied, the buffers are not) must stay
 * valid until the request completes. Blocking calls are the non-blocking
 * ones followed by a wait.
 */
#ifndef CCLZ_CCLZ_H_
#define CCLZ_CCLZ_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CCLZ_MAJOR 0
#define CCLZ_MINOR 1
#define CCLZ_PATCH 0

typedef enum {
  cclzSuccess = 0,
  cclzUnhandledCudaError = 1,
  cclzSystemError = 2,
  cclzInternalError = 3,
  cclzInvalidArgument = 4,
  cclzInvalidUsage = 5,
  cclzRemoteError = 6,
  cclzInProgress = 7,
  cclzTimeout = 8
} cclzResult_t;

/* Values equal cclz::DataType (and NCCL's where both have the type). */
typedef enum {
  cclzInt8 = 0,
  cclzChar = 0,
  cclzUint8 = 1,
  cclzInt32 = 2,
  cclzInt = 2,
  cclzInt64 = 4,
  cclzFloat16 = 6,
  cclzHalf = 6,
  cclzFloat32 = 7,
  cclzFloat = 7,
  cclzFloat64 = 8,
  cclzDouble = 8,
  cclzBfloat16 = 9
} cclzDataType_t;

typedef enum { cclzSum = 0, cclzProd = 1, cclzMax = 2, cclzMin = 3, cclzAvg = 4 } cclzRedOp_t;

#define CCLZ_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[CCLZ_UNIQUE_ID_BYTES];
} cclzUniqueId;

typedef struct cclzComm* cclzComm_t;
typedef struct cclzRequest* cclzRequest_t;

/* Errors */
const char* cclzGetErrorString(cclzResult_t result);
/* This thread's last error message ("" if none); `comm` may be NULL. */
const char* cclzGetLastError(cclzComm_t comm);

/* Host buffers that the ranks of a node read from one another in place:
 * large node-local collectives on them copy each byte once (cclz::mem_alloc
 * in cclz.hpp). size 0 gives *ptr = NULL; cclzMemFree(NULL) does nothing. */
cclzResult_t cclzMemAlloc(void** ptr, size_t size);
cclzResult_t cclzMemFree(void* ptr);
/* Makes a heap buffer readable in place by the node's ranks, as if it came
 * from cclzMemAlloc, until cclzDeregisterBuffer (cclz::register_buffer in
 * cclz.hpp: its pages move into shared memory at the same addresses). */
cclzResult_t cclzRegisterBuffer(void* ptr, size_t size);
cclzResult_t cclzDeregisterBuffer(void* ptr);

/* Creation and teardown */
cclzResult_t cclzGetUniqueId(cclzUniqueId* uniqueId);
cclzResult_t cclzCommInitRank(cclzComm_t* comm, int nranks, cclzUniqueId commId, int rank);
/* torchrun-style: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (CCLZ_MASTER_PORT overrides it). */
cclzResult_t cclzCommInitFromEnv(cclzComm_t* comm);
/* color < 0: *newcomm = NULL. */
cclzResult_t cclzCommSplit(cclzComm_t comm, int color, int key, cclzComm_t* newcomm);
cclzResult_t cclzCommDestroy(cclzComm_t comm);
cclzResult_t cclzCommAbort(cclzComm_t comm);
cclzResult_t cclzCommGetAsyncError(cclzComm_t comm, cclzResult_t* asyncError);

/* Queries */
cclzResult_t cclzCommCount(const cclzComm_t comm, int* count);
cclzResult_t cclzCommUserRank(const cclzComm_t comm, int* rank);
cclzResult_t cclzCommLocalRank(const cclzComm_t comm, int* localRank);
cclzResult_t cclzCommLocalSize(const cclzComm_t comm, int* localSize);
cclzResult_t cclzCommNodeId(const cclzComm_t comm, int* nodeId);
cclzResult_t cclzCommNumNodes(const cclzComm_t comm, int* numNodes);

/* Blocking collectives (in-place conventions as NCCL's) */
cclzResult_t cclzAllReduce(const void* sendbuff, void* recvbuff, size_t count, cclzDataType_t datatype,
                           cclzRedOp_t op, cclzComm_t comm);
cclzResult_t cclzReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, cclzDataType_t datatype,
                               cclzRedOp_t op, cclzComm_t comm);
cclzResult_t cclzAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, cclzDataType_t datatype,
                           cclzComm_t comm);
cclzResult_t cclzAllToAll(const void* sendbuff, void* recvbuff, size_t count, cclzDataType_t datatype,
                          cclzComm_t comm);
/* Counts and displacements in elements, nranks entries each. */
cclzResult_t cclzAllToAllv(const void* sendbuff, const size_t* sendcounts, const size_t* sdispls, void* recvbuff,
                           const size_t* recvcounts, const size_t* rdispls, cclzDataType_t datatype,
                           cclzComm_t comm);
cclzResult_t cclzBroadcast(const void* sendbuff, void* recvbuff, size_t count, cclzDataType_t datatype, int root,
                           cclzComm_t comm);
cclzResult_t cclzReduce(const void* sendbuff, void* recvbuff, size_t count, cclzDataType_t datatype, cclzRedOp_t op,
                        int root, cclzComm_t comm);
cclzResult_t cclzBarrier(cclzComm_t comm);
cclzResult_t cclzSend(const void* sendbuff, size_t count, cclzDataType_t datatype, int peer, cclzComm_t comm);
cclzResult_t cclzRecv(void* recvbuff, size_t count, cclzDataType_t datatype, int peer, cclzComm_t comm);

/* Non-blocking variants: on success *request receives a handle to pass to
 * cclzWait/cclzTest; a call rejected at once (bad argument, destroyed or
 * failed communicator) returns its error and sets *request = NULL. */
cclzResult_t cclzIallReduce(const void* sendbuff, void* recvbuff, size_t count, cclzDataType_t datatype,
                            cclzRedOp_t op, cclzComm_t comm, cclzRequest_t* request);
cclzResult_t cclzIreduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, cclzDataType_t datatype,
                                cclzRedOp_t op, cclzComm_t comm, cclzRequest_t* request);
cclzResult_t cclzIallGather(const void* sendbuff, void* recvbuff, size_t sendcount, cclzDataType_t datatype,
                            cclzComm_t comm, cclzRequest_t* request);
cclzResult_t cclzIallToAll(const void* sendbuff, void* recvbuff, size_t count, cclzDataType_t datatype,
                           cclzComm_t comm, cclzRequest_t* request);
cclzResult_t cclzIallToAllv(const void* sendbuff, const size_t* sendcounts, const size_t* sdispls, void* recvbuff,
                            const size_t* recvcounts, const size_t* rdispls, cclzDataType_t datatype,
                            cclzComm_t comm, cclzRequest_t* request);
cclzResult_t cclzIbroadcast(const void* sendbuff, void* recvbuff, size_t count, cclzDataType_t datatype, int root,
                            cclzComm_t comm, cclzRequest_t* request);
cclzResult_t cclzIreduce(const void* sendbuff, void* recvbuff, size_t count, cclzDataType_t datatype, cclzRedOp_t op,
                         int root, cclzComm_t comm, cclzRequest_t* request);
cclzResult_t cclzIbarrier(cclzComm_t comm, cclzRequest_t* request);
cclzResult_t cclzIsend(const void* sendbuff, size_t count, cclzDataType_t datatype, int peer, cclzComm_t comm,
                       cclzRequest_t* request);
cclzResult_t cclzIrecv(void* recvbuff, size_t count, cclzDataType_t datatype, int peer, cclzComm_t comm,
                       cclzRequest_t* request);

/* Blocks until *request completes, frees it, sets *request = NULL and
 * returns its result. A NULL *request is complete and successful. */
cclzResult_t cclzWait(cclzRequest_t* request);
/* Never blocks. *done = 1 when complete: then as cclzWait (freed, NULL,
 * its result); otherwise *done = 0 and cclzSuccess. */
cclzResult_t cclzTest(cclzRequest_t* request, int* done);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* CCLZ_CCLZ_H_ */
