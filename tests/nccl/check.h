/* The checks of the C test programs written against nccl.h: a failed check
 * prints the rank, the place and the message, then ends every rank. */
#pragma once
#include <mpi.h>
#include <nccl.h>
#include <stdio.h>

static int g_rank, g_size;

#define CHECK(cond, ...)                                                    \
  do {                                                                      \
    if (!(cond)) {                                                          \
      fprintf(stderr, "rank %d: FAIL %s:%d: ", g_rank, __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                         \
      fprintf(stderr, "\n");                                                \
      MPI_Abort(MPI_COMM_WORLD, 1);                                         \
    }                                                                       \
  } while (0)

#define NCCL_OK(call)                                                                                     \
  do {                                                                                                    \
    ncclResult_t r_ = (call);                                                                             \
    CHECK(r_ == ncclSuccess, "%s -> %d (%s): %s", #call, (int)r_, ncclGetErrorString(r_), ncclGetLastError(NULL)); \
  } while (0)
