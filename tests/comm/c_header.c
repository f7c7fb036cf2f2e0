/* Proves include/cclz/cclz.h is valid C (compiled as C11 with -Wpedantic)
 * and that the C API works from C: argument errors, a one-rank
 * communicator over a unique id, a blocking and a non-blocking all-reduce,
 * and use after destroy. Exit status 0 = pass; prints the failing check. */
#include <stdio.h>
#include <string.h>

#include "cclz/cclz.h"

#define CHECK(cond)                                            \
  do {                                                         \
    if (!(cond)) {                                             \
      fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
              cclzGetLastError(NULL));                         \
      return 1;                                                \
    }                                                          \
  } while (0)

int main(void) {
  cclzUniqueId id;
  cclzComm_t comm = NULL;
  cclzRequest_t req = NULL;
  float in[8], out[8];
  int i, n = -1, rank = -1, done = 0;
  cclzResult_t r;

  CHECK(sizeof(id.internal) == CCLZ_UNIQUE_ID_BYTES);
  CHECK(cclzCommCount(NULL, &n) == cclzInvalidArgument);
  CHECK(strlen(cclzGetLastError(NULL)) > 0);
  CHECK(cclzGetUniqueId(NULL) == cclzInvalidArgument);

  r = cclzGetUniqueId(&id);
  if (r != cclzSuccess) {
    /* A build without UCX cannot make communicators; the header was still
     * compiled as C, which is the main point of this file. */
    printf("skipping the runtime part: %s\n", cclzGetLastError(NULL));
    return 0;
  }
  CHECK(cclzCommInitRank(&comm, 1, id, 0) == cclzSuccess);
  CHECK(cclzCommCount(comm, &n) == cclzSuccess && n == 1);
  CHECK(cclzCommUserRank(comm, &rank) == cclzSuccess && rank == 0);

  for (i = 0; i < 8; ++i) in[i] = (float)i;
  CHECK(cclzAllReduce(in, out, 8, cclzFloat32, cclzSum, comm) == cclzSuccess);
  CHECK(out[7] == 7.0f);
  CHECK(cclzIallReduce(in, in, 8, cclzFloat32, cclzMax, comm, &req) == cclzSuccess);
  CHECK(cclzTest(&req, &done) == cclzSuccess);
  CHECK(cclzWait(&req) == cclzSuccess && req == NULL);
  CHECK(cclzAllReduce(NULL, out, 8, cclzFloat32, cclzSum, comm) == cclzInvalidArgument);

  CHECK(cclzCommDestroy(comm) == cclzSuccess);
  CHECK(cclzAllReduce(in, out, 8, cclzFloat32, cclzSum, comm) == cclzInvalidUsage);
  CHECK(cclzCommDestroy(comm) == cclzInvalidUsage);
  printf("ok\n");
  return 0;
}
