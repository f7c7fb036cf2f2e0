/* libcclz_nccl's CUDA path (CCLZ_NCCL_FALLBACK), on a machine without a
 * GPU: a program written against nccl.h and the CUDA runtime, run with the
 * stand-ins of standin/ (a CUDA runtime whose device memory the host cannot
 * touch, and an NCCL over MPI that serves only device memory and counts its
 * calls) in place of the real libraries.
 *
 *   fallback_test forward   CCLZ_NCCL_FALLBACK=1, CCLZ_NCCL_LIBRARY = the
 *                           stand-in NCCL: every call on device buffers
 *                           reaches it with the caller's arguments (results
 *                           checked), host buffers stay with cclz, groups
 *                           mix the two, split, PreMulSum (host and device
 *                           scalars), MemAlloc, Register, and the real
 *                           NCCL's errors come back with its message
 *   fallback_test reject    no fallback: device buffers are refused with
 *                           ncclInvalidArgument and a message saying how to
 *                           forward them; host buffers still work
 *
 * Exits 1 on the first failed check. */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <mpi.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* ---- device buffers of float or int32 */

static void* dalloc(size_t bytes) {
  void* p = NULL;
  CHECK(cudaMalloc(&p, bytes) == cudaSuccess, "cudaMalloc(%zu)", bytes);
  return p;
}
static void h2d(void* d, const void* h, size_t bytes) { cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice); }
static void d2h(void* h, const void* d, size_t bytes) { cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost); }

static long (*g_calls)(void);

static ncclComm_t make_comm(void) {
  ncclUniqueId id;
  if (g_rank == 0) NCCL_OK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm = NULL;
  NCCL_OK(ncclCommInitRank(&comm, g_size, id, g_rank));
  return comm;
}

/* Inputs are small integers, exact in float in any order. */
static double value(int r, size_t i, ncclRedOp_t op) {
  if (op == ncclProd) return (double)(1 + (int)((i + (size_t)r) % 2));
  return (double)(r + 1) + (double)(i % 7);
}
static double expect_reduce(size_t i, ncclRedOp_t op) {
  double acc = value(0, i, op);
  for (int r = 1; r < g_size; ++r) {
    const double v = value(r, i, op);
    if (op == ncclProd) acc *= v;
    else if (op == ncclMax) acc = v > acc ? v : acc;
    else if (op == ncclMin) acc = v < acc ? v : acc;
    else acc += v;
  }
  return op == ncclAvg ? acc / g_size : acc;
}

static void fill(float* h, size_t n, int r, ncclRedOp_t op, size_t base) {
  for (size_t i = 0; i < n; ++i) h[i] = (float)value(r, base + i, op);
}

static void test_reductions(ncclComm_t comm) {
  const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
  const size_t counts[] = {0, 1, 1001};
  for (size_t oi = 0; oi < 5; ++oi) {
    for (size_t ci = 0; ci < 3; ++ci) {
      for (int in_place = 0; in_place < 2; ++in_place) {
        const ncclRedOp_t op = ops[oi];
        const size_t n = counts[ci], bytes = n * sizeof(float), total = bytes * (size_t)g_size;
        float* h = malloc(total + 4);
        float* d_in = dalloc(total);
        float* d_out = in_place ? d_in : dalloc(total);
        /* all-reduce */
        fill(h, n, g_rank, op, 0);
        h2d(d_in, h, bytes);
        NCCL_OK(ncclAllReduce(d_in, d_out, n, ncclFloat32, op, comm, 0));
        d2h(h, d_out, bytes);
        for (size_t i = 0; i < n; ++i) {
          const double want = expect_reduce(i, op);
          CHECK(h[i] == (float)want || (op == ncclAvg && h[i] - want < 1e-5 && want - h[i] < 1e-5),
                "all-reduce op %d n %zu in_place %d [%zu] = %g, want %g", (int)op, n, in_place, i, h[i], want);
        }
        /* reduce to every root */
        for (int root = 0; root < g_size; ++root) {
          fill(h, n, g_rank, op, 0);
          h2d(d_in, h, bytes);
          NCCL_OK(ncclReduce(d_in, d_out, n, ncclFloat32, op, root, comm, 0));
          if (g_rank != root) continue;
          d2h(h, d_out, bytes);
          for (size_t i = 0; i < n; ++i) {
            const double want = expect_reduce(i, op);
            CHECK(h[i] == (float)want || (op == ncclAvg && h[i] - want < 1e-5 && want - h[i] < 1e-5),
                  "reduce root %d op %d [%zu] = %g, want %g", root, (int)op, i, h[i], want);
          }
        }
        /* reduce-scatter: block r of the result lands on rank r */
        fill(h, n * (size_t)g_size, g_rank, op, 0);
        h2d(d_in, h, total);
        float* rs_out = in_place ? d_in + (size_t)g_rank * n : d_out;
        NCCL_OK(ncclReduceScatter(d_in, rs_out, n, ncclFloat32, op, comm, 0));
        d2h(h, rs_out, bytes);
        for (size_t i = 0; i < n; ++i) {
          const double want = expect_reduce((size_t)g_rank * n + i, op);
          CHECK(h[i] == (float)want || (op == ncclAvg && h[i] - want < 1e-5 && want - h[i] < 1e-5),
                "reduce-scatter op %d [%zu] = %g, want %g", (int)op, i, h[i], want);
        }
        cudaFree(d_in);
        if (!in_place) cudaFree(d_out);
        free(h);
      }
    }
  }
  if (g_rank == 0) printf("forward: all-reduce, reduce (every root), reduce-scatter: 5 ops x 3 counts x in/out of place\n");
}

static void test_movement(ncclComm_t comm) {
  const size_t n = 777, bytes = n * sizeof(int32_t), total = bytes * (size_t)g_size;
  int32_t* h = malloc(total);
  int32_t* d_in = dalloc(total);
  int32_t* d_out = dalloc(total);
  /* broadcast from every root, out of place and in place */
  for (int root = 0; root < g_size; ++root) {
    for (int in_place = 0; in_place < 2; ++in_place) {
      int32_t* out = in_place ? d_in : d_out;
      for (size_t i = 0; i < n; ++i) h[i] = g_rank == root ? (int32_t)(root * 1000 + (int)i) : -1;
      h2d(d_in, h, bytes);
      NCCL_OK(ncclBroadcast(d_in, out, n, ncclInt32, root, comm, 0));
      d2h(h, out, bytes);
      for (size_t i = 0; i < n; ++i) CHECK(h[i] == root * 1000 + (int)i, "broadcast root %d [%zu] = %d", root, i, h[i]);
    }
  }
  /* all-gather, out of place and in place (own block already at its place) */
  for (int in_place = 0; in_place < 2; ++in_place) {
    for (size_t i = 0; i < n; ++i) h[i] = (int32_t)(g_rank * 100000 + (int)i);
    int32_t* send = in_place ? d_out + (size_t)g_rank * n : d_in;
    h2d(send, h, bytes);
    NCCL_OK(ncclAllGather(send, d_out, n, ncclInt32, comm, 0));
    d2h(h, d_out, total);
    for (int r = 0; r < g_size; ++r)
      for (size_t i = 0; i < n; ++i)
        CHECK(h[(size_t)r * n + i] == r * 100000 + (int)i, "all-gather in_place %d block %d [%zu]", in_place, r, i);
  }
  /* all-to-all: block q of rank r's input is r*1000+q */
  for (int q = 0; q < g_size; ++q)
    for (size_t i = 0; i < n; ++i) h[(size_t)q * n + i] = (int32_t)(g_rank * 1000 + q);
  h2d(d_in, h, total);
  NCCL_OK(ncclAlltoAll(d_in, d_out, n, ncclInt32, comm, 0));
  d2h(h, d_out, total);
  for (int q = 0; q < g_size; ++q)
    for (size_t i = 0; i < n; ++i) CHECK(h[(size_t)q * n + i] == q * 1000 + g_rank, "all-to-all block %d", q);
  /* gather and scatter at every root (the root's own block stays on the device) */
  for (int root = 0; root < g_size; ++root) {
    for (size_t i = 0; i < n; ++i) h[i] = (int32_t)(g_rank * 7 + (int)i);
    h2d(d_in, h, bytes);
    NCCL_OK(ncclGather(d_in, d_out, n, ncclInt32, root, comm, 0));
    if (g_rank == root) {
      d2h(h, d_out, total);
      for (int r = 0; r < g_size; ++r)
        for (size_t i = 0; i < n; ++i) CHECK(h[(size_t)r * n + i] == r * 7 + (int)i, "gather root %d block %d", root, r);
    }
    for (int q = 0; q < g_size; ++q)
      for (size_t i = 0; i < n; ++i) h[(size_t)q * n + i] = (int32_t)(root * 100 + q);
    h2d(d_in, h, total);
    NCCL_OK(ncclScatter(d_in, d_out, n, ncclInt32, root, comm, 0));
    d2h(h, d_out, bytes);
    for (size_t i = 0; i < n; ++i) CHECK(h[i] == root * 100 + g_rank, "scatter root %d [%zu] = %d", root, i, h[i]);
  }
  /* grouped send/recv all-to-all, every rank sending first */
  for (int q = 0; q < g_size; ++q)
    for (size_t i = 0; i < n; ++i) h[(size_t)q * n + i] = (int32_t)(g_rank * 1000 + q + 7);
  h2d(d_in, h, total);
  NCCL_OK(ncclGroupStart());
  for (int q = 0; q < g_size; ++q) NCCL_OK(ncclSend(d_in + (size_t)q * n, n, ncclInt32, q, comm, 0));
  for (int q = 0; q < g_size; ++q) NCCL_OK(ncclRecv(d_out + (size_t)q * n, n, ncclInt32, q, comm, 0));
  NCCL_OK(ncclGroupEnd());
  d2h(h, d_out, total);
  for (int q = 0; q < g_size; ++q)
    for (size_t i = 0; i < n; ++i) CHECK(h[(size_t)q * n + i] == q * 1000 + g_rank + 7, "grouped send/recv from %d", q);
  cudaFree(d_in);
  cudaFree(d_out);
  free(h);
  if (g_rank == 0) printf("forward: broadcast, all-gather, all-to-all, gather, scatter, grouped send/recv\n");
}

/* Host buffers stay with cclz (the stand-in's count does not move), also in
 * a group that mixes them with device buffers. */
static void test_host_and_mixed(ncclComm_t comm) {
  const size_t n = 513;
  float h_in[513], h_out[513];
  for (size_t i = 0; i < n; ++i) h_in[i] = (float)(g_rank + 1);
  const long before = g_calls();
  NCCL_OK(ncclAllReduce(h_in, h_out, n, ncclFloat32, ncclSum, comm, 0));
  CHECK(g_calls() == before, "a host all-reduce reached the real NCCL (%ld calls, was %ld)", g_calls(), before);
  for (size_t i = 0; i < n; ++i) CHECK(h_out[i] == (float)(g_size * (g_size + 1) / 2), "host all-reduce [%zu]", i);

  float* d = dalloc(n * sizeof(float));
  float h[513];
  for (size_t i = 0; i < n; ++i) h[i] = (float)(2 * g_rank);
  h2d(d, h, sizeof h);
  memset(h_out, 0, sizeof h_out);
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(h_in, h_out, n, ncclFloat32, ncclSum, comm, 0));
  NCCL_OK(ncclAllReduce(d, d, n, ncclFloat32, ncclSum, comm, 0));
  NCCL_OK(ncclGroupEnd());
  CHECK(g_calls() == before + 1, "the grouped device all-reduce: %ld calls, want %ld", g_calls(), before + 1);
  d2h(h, d, sizeof h);
  for (size_t i = 0; i < n; ++i) {
    CHECK(h_out[i] == (float)(g_size * (g_size + 1) / 2), "grouped host all-reduce [%zu]", i);
    CHECK(h[i] == (float)(g_size * (g_size - 1)), "grouped device all-reduce [%zu] = %g", i, h[i]);
  }
  cudaFree(d);
  if (g_rank == 0) printf("forward: host buffers stay with cclz, also grouped with device buffers\n");
}

static void test_premulsum_split_memory(ncclComm_t comm) {
  const size_t n = 100;
  float h[100];
  float* d = dalloc(sizeof h);
  /* PreMulSum, host-immediate and device scalars, on device buffers */
  float s = 0.5f;
  float* d_s = dalloc(sizeof s);
  h2d(d_s, &s, sizeof s);
  ncclRedOp_t ops[2];
  NCCL_OK(ncclRedOpCreatePreMulSum(&ops[0], &s, ncclFloat32, ncclScalarHostImmediate, comm));
  NCCL_OK(ncclRedOpCreatePreMulSum(&ops[1], d_s, ncclFloat32, ncclScalarDevice, comm));
  for (int k = 0; k < 2; ++k) {
    for (size_t i = 0; i < n; ++i) h[i] = (float)(4 * (g_rank + 1));
    h2d(d, h, sizeof h);
    NCCL_OK(ncclAllReduce(d, d, n, ncclFloat32, ops[k], comm, 0));
    d2h(h, d, sizeof h);
    for (size_t i = 0; i < n; ++i) CHECK(h[i] == (float)(g_size * (g_size + 1)), "PreMulSum %d [%zu] = %g", k, i, h[i]);
  }
  /* the host-immediate op also works on host buffers (cclz premultiplies) */
  float hh[100];
  for (size_t i = 0; i < n; ++i) hh[i] = (float)(4 * (g_rank + 1));
  NCCL_OK(ncclAllReduce(hh, hh, n, ncclFloat32, ops[0], comm, 0));
  for (size_t i = 0; i < n; ++i) CHECK(hh[i] == (float)(g_size * (g_size + 1)), "host PreMulSum [%zu] = %g", i, hh[i]);
  /* a device scalar cannot be read by cclz for a host buffer: an error, not a fault */
  CHECK(ncclAllReduce(hh, hh, n, ncclFloat32, ops[1], comm, 0) == ncclInvalidArgument, "device-scalar PreMulSum on host buffers");
  CHECK(strstr(ncclGetLastError(NULL), "device") != NULL, "message: %s", ncclGetLastError(NULL));
  NCCL_OK(ncclRedOpDestroy(ops[0], comm));
  NCCL_OK(ncclRedOpDestroy(ops[1], comm));
  cudaFree(d_s);

  /* split into even and odd ranks; the child forwards too */
  ncclComm_t sub = NULL;
  NCCL_OK(ncclCommSplit(comm, g_rank % 2, g_rank, &sub, NULL));
  CHECK(sub != NULL, "split gave no communicator");
  int sub_size = 0;
  NCCL_OK(ncclCommCount(sub, &sub_size));
  for (size_t i = 0; i < n; ++i) h[i] = (float)g_rank;
  h2d(d, h, sizeof h);
  const long before = g_calls();
  NCCL_OK(ncclAllReduce(d, d, n, ncclFloat32, ncclSum, sub, 0));
  CHECK(g_calls() == before + 1, "the split's device all-reduce did not reach the real NCCL");
  d2h(h, d, sizeof h);
  float want = 0;
  for (int r = g_rank % 2; r < g_size; r += 2) want += (float)r;
  CHECK(sub_size == (g_size + 1 - g_rank % 2) / 2, "split size %d", sub_size);
  for (size_t i = 0; i < n; ++i) CHECK(h[i] == want, "split all-reduce [%zu] = %g, want %g", i, h[i], want);
  NCCL_OK(ncclCommDestroy(sub));
  /* NOCOLOR: no communicator */
  NCCL_OK(ncclCommSplit(comm, g_rank == 0 ? NCCL_SPLIT_NOCOLOR : 1, 0, &sub, NULL));
  CHECK((g_rank == 0) == (sub == NULL), "NOCOLOR split");
  if (sub != NULL) NCCL_OK(ncclCommDestroy(sub));

  /* ncclMemAlloc gives device memory with the fallback on; registration of it goes to the real NCCL */
  void* m = NULL;
  NCCL_OK(ncclMemAlloc(&m, 1 << 20));
  struct cudaPointerAttributes a;
  CHECK(cudaPointerGetAttributes(&a, m) == cudaSuccess && a.type == cudaMemoryTypeDevice, "ncclMemAlloc: not device memory");
  void* handle = NULL;
  NCCL_OK(ncclCommRegister(comm, m, 1 << 20, &handle));
  NCCL_OK(ncclCommDeregister(comm, handle));
  NCCL_OK(ncclMemFree(m));
  /* and host registrations stay with cclz */
  NCCL_OK(ncclCommRegister(comm, hh, sizeof hh, &handle));
  NCCL_OK(ncclCommDeregister(comm, handle));

  /* an error of the real NCCL comes back with its message (the stand-in refuses f16) */
  CHECK(ncclAllReduce(d, d, 4, ncclFloat16, ncclSum, comm, 0) == ncclInvalidArgument, "f16 on the stand-in");
  CHECK(strstr(ncclGetLastError(NULL), "real NCCL") != NULL, "message: %s", ncclGetLastError(NULL));
  ncclResult_t async = ncclInternalError;
  NCCL_OK(ncclCommGetAsyncError(comm, &async));
  CHECK(async == ncclSuccess, "async error %d", (int)async);
  cudaFree(d);
  if (g_rank == 0) printf("forward: PreMulSum (host and device scalars), split and NOCOLOR, MemAlloc, Register, errors\n");
}

static void test_forward(void) {
  const char* lib = getenv("CCLZ_NCCL_LIBRARY");
  CHECK(lib != NULL, "CCLZ_NCCL_LIBRARY must name the stand-in NCCL");
  void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  CHECK(h != NULL, "dlopen %s: %s", lib, dlerror());
  void* sym = dlsym(h, "cclz_standin_nccl_calls");
  memcpy(&g_calls, &sym, sizeof sym); /* ISO C has no cast from object to function pointer */
  CHECK(g_calls != NULL, "%s is not the stand-in NCCL", lib);
  ncclComm_t comm = make_comm();
  CHECK(g_calls() == 1, "init made %ld communicators of the real NCCL, want 1", g_calls());
  int dev = -1;
  NCCL_OK(ncclCommCuDevice(comm, &dev));
  CHECK(dev == 0, "ncclCommCuDevice = %d", dev);
  test_reductions(comm);
  test_movement(comm);
  test_host_and_mixed(comm);
  test_premulsum_split_memory(comm);
  NCCL_OK(ncclCommFinalize(comm));
  NCCL_OK(ncclCommDestroy(comm));
}

static void test_reject(void) {
  ncclComm_t comm = make_comm();
  float* d = dalloc(64 * sizeof(float));
  float h[64];
  for (int i = 0; i < 64; ++i) h[i] = 1.0f;
  CHECK(ncclAllReduce(d, d, 64, ncclFloat32, ncclSum, comm, 0) == ncclInvalidArgument, "device all-reduce without fallback");
  CHECK(strstr(ncclGetLastError(NULL), "CCLZ_NCCL_FALLBACK=1") != NULL, "message: %s", ncclGetLastError(NULL));
  CHECK(ncclAllGather(h, d, 64 / (size_t)g_size, ncclFloat32, comm, 0) == ncclInvalidArgument, "device output");
  CHECK(ncclGather(d, h, 1, ncclFloat32, 0, comm, 0) == ncclInvalidArgument, "device gather");
  CHECK(ncclSend(d, 1, ncclFloat32, 0, comm, 0) == ncclInvalidArgument, "device send");
  /* the communicator is still good for host buffers */
  NCCL_OK(ncclAllReduce(h, h, 64, ncclFloat32, ncclSum, comm, 0));
  for (int i = 0; i < 64; ++i) CHECK(h[i] == (float)g_size, "host all-reduce after refusals");
  cudaFree(d);
  NCCL_OK(ncclCommDestroy(comm));
  if (g_rank == 0) printf("reject: device buffers refused with a message; host buffers still served\n");
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  const char* mode = argc > 1 ? argv[1] : "forward";
  if (strcmp(mode, "forward") == 0) {
    test_forward();
  } else if (strcmp(mode, "reject") == 0) {
    test_reject();
  } else {
    CHECK(0, "unknown mode %s", mode);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_rank == 0) printf("%s: all checks passed on %d ranks\n", mode, g_size);
  MPI_Finalize();
  return 0;
}
