/* A program written only against nccl.h (and MPI, which launches the ranks
 * and spreads the ncclUniqueId): every call of libcclz_nccl on host buffers,
 * checked against references computed here from the formula that made each
 * rank's input.
 *
 *   nccl_test all        collectives x dtypes x ops x counts, in and out of
 *                        place; grouped send/recv all-to-all; gather/scatter;
 *                        PreMulSum; split; memory and registration; errors
 *   nccl_test abort      rank 1 aborts; the others' all-reduce fails, fast
 *   nccl_test compress   CCLZ_COMPRESSOR=bf16 set by the caller: float
 *                        all-reduces are compressed, integer ones exact
 *   nccl_test fallback   CCLZ_NCCL_FALLBACK=1 with a missing real NCCL: init
 *                        fails with ncclInvalidArgument and says why
 *   nccl_test initall    (one process) ncclCommInitAll of 3 host communicators
 *
 * Prints one line per check group; exits 1 on the first mismatch. */
#include <math.h>
#include <mpi.h>
#include <nccl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"

/* ---- element access by dtype, through double */

static size_t tsize(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

static uint16_t f2h(float f) { /* round to nearest even, small normal values only */
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  int e = (int)((x >> 23) & 0xff) - 127 + 15;
  uint32_t m = x & 0x7fffffu;
  if (f == 0.0f) return (uint16_t)sign;
  uint32_t h = sign | ((uint32_t)e << 10) | (m >> 13);
  uint32_t rest = m & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
  return (uint16_t)h;
}
static float h2f(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu, x;
  if (e == 0 && m == 0) x = sign;
  else x = sign | ((e - 15 + 127) << 23) | (m << 13);
  float f;
  memcpy(&f, &x, 4);
  return f;
}
static uint16_t f2b(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t r = x + 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(r >> 16);
}
static float b2f(uint16_t b) {
  uint32_t x = (uint32_t)b << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static void put(void* p, size_t i, ncclDataType_t t, double v) {
  switch (t) {
    case ncclInt8: ((int8_t*)p)[i] = (int8_t)v; break;
    case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: ((uint8_t*)p)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t*)p)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t*)p)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t*)p)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t*)p)[i] = (uint64_t)v; break;
    case ncclFloat16: ((uint16_t*)p)[i] = f2h((float)v); break;
    case ncclBfloat16: ((uint16_t*)p)[i] = f2b((float)v); break;
    case ncclFloat32: ((float*)p)[i] = (float)v; break;
    default: ((double*)p)[i] = v; break;
  }
}
static double get(const void* p, size_t i, ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return ((const int8_t*)p)[i];
    case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return ((const uint8_t*)p)[i];
    case ncclInt32: return ((const int32_t*)p)[i];
    case ncclUint32: return ((const uint32_t*)p)[i];
    case ncclInt64: return (double)((const int64_t*)p)[i];
    case ncclUint64: return (double)((const uint64_t*)p)[i];
    case ncclFloat16: return h2f(((const uint16_t*)p)[i]);
    case ncclBfloat16: return b2f(((const uint16_t*)p)[i]);
    case ncclFloat32: return ((const float*)p)[i];
    default: return ((const double*)p)[i];
  }
}
static int is_signed(ncclDataType_t t) { return t != ncclUint8 && t != ncclUint32 && t != ncclUint64; }
static int is_float(ncclDataType_t t) {
  return t == ncclFloat16 || t == ncclBfloat16 || t == ncclFloat32 || t == ncclFloat64;
}

/* Rank r's element i: small values so that sums and products of 5 ranks fit
 * every type exactly; products use only -2..2 (|x| <= 32 over 5 ranks). */
static double value(int r, size_t i, ncclDataType_t t, ncclRedOp_t op) {
  long v = (long)((r + 1) * 7 + (long)i * 3) % 5;       /* 0..4 */
  if (op == ncclProd) v = v % 3;                      /* 0..2 */
  if (is_signed(t) && (i + (size_t)r) % 2 == 1) v = -v;
  return (double)v;
}

static double reduce_ref(size_t i, ncclDataType_t t, ncclRedOp_t op, int n) {
  double acc = value(0, i, t, op);
  for (int r = 1; r < n; ++r) {
    double v = value(r, i, t, op);
    switch (op) {
      case ncclSum: case ncclAvg: acc += v; break;
      case ncclProd: acc *= v; break;
      case ncclMax: acc = v > acc ? v : acc; break;
      case ncclMin: acc = v < acc ? v : acc; break;
      default: break;
    }
  }
  if (op == ncclAvg) {
    if (is_float(t)) acc = acc / n;
    else acc = (double)(long long)(acc / n); /* truncating division, as cclz and NCCL do for integers */
  }
  return acc;
}

static int close_enough(double got, double want, ncclDataType_t t) {
  double tol = t == ncclFloat16 || t == ncclBfloat16 ? 1e-2 : t == ncclFloat32 ? 1e-6 : 0.0;
  return fabs(got - want) <= tol * (fabs(want) > 1 ? fabs(want) : 1);
}

static const ncclDataType_t kReduceTypes[] = {ncclInt8, ncclUint8, ncclInt32, ncclInt64,
                                             ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16};
static const ncclDataType_t kAllTypes[] = {ncclInt8, ncclUint8, ncclInt32, ncclUint32, ncclInt64, ncclUint64,
                                          ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16,
                                          ncclFloat8e4m3, ncclFloat8e5m2};
static const ncclRedOp_t kOps[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
static const size_t kCounts[] = {0, 1, 7, 1001, 70001};
#define LEN(a) (sizeof(a) / sizeof((a)[0]))

static ncclComm_t make_comm(void) {
  ncclUniqueId id;
  if (g_rank == 0) NCCL_OK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, g_size, id, g_rank));
  return comm;
}

static void test_all_reduce_family(ncclComm_t comm) {
  const int n = g_size, me = g_rank;
  int cases = 0;
  for (size_t ti = 0; ti < LEN(kReduceTypes); ++ti) {
    ncclDataType_t t = kReduceTypes[ti];
    for (size_t oi = 0; oi < LEN(kOps); ++oi) {
      ncclRedOp_t op = kOps[oi];
      if (!is_signed(t) && op == ncclProd) { /* unsigned products of 0..2 are fine too */ }
      for (size_t ci = 0; ci < LEN(kCounts); ++ci) {
        size_t count = kCounts[ci];
        size_t es = tsize(t);
        for (int in_place = 0; in_place < 2; ++in_place) {
          /* all-reduce */
          void* send = calloc(count + 1, es);
          void* recv = calloc(count + 1, es);
          for (size_t i = 0; i < count; ++i) put(send, i, t, value(me, i, t, op));
          void* s = in_place ? recv : send;
          if (in_place) memcpy(recv, send, count * es);
          NCCL_OK(ncclAllReduce(s, recv, count, t, op, comm, NULL));
          for (size_t i = 0; i < count; ++i) {
            double want = reduce_ref(i, t, op, n), got = get(recv, i, t);
            CHECK(close_enough(got, want, t), "all_reduce type %d op %d count %zu %s [%zu]: %g, want %g", (int)t,
                  (int)op, count, in_place ? "in place" : "out of place", i, got, want);
          }
          /* reduce to the last rank */
          int root = n - 1;
          memset(recv, 0, (count + 1) * es);
          if (in_place) memcpy(recv, send, count * es);
          NCCL_OK(ncclReduce(s, recv, count, t, op, root, comm, NULL));
          if (me == root) {
            for (size_t i = 0; i < count; ++i) {
              double want = reduce_ref(i, t, op, n), got = get(recv, i, t);
              CHECK(close_enough(got, want, t), "reduce type %d op %d count %zu [%zu]: %g, want %g", (int)t, (int)op,
                    count, i, got, want);
            }
          }
          free(send);
          free(recv);
          /* reduce-scatter: recvcount = count; rank r's input block b holds value(r, b*count + i) */
          void* big = calloc(count * (size_t)n + 1, es);
          void* out = calloc(count + 1, es);
          for (size_t i = 0; i < count * (size_t)n; ++i) put(big, i, t, value(me, i, t, op));
          void* rs_out = in_place ? (char*)big + (size_t)me * count * es : out;
          NCCL_OK(ncclReduceScatter(big, rs_out, count, t, op, comm, NULL));
          for (size_t i = 0; i < count; ++i) {
            double want = reduce_ref((size_t)me * count + i, t, op, n), got = get(rs_out, i, t);
            CHECK(close_enough(got, want, t), "reduce_scatter type %d op %d count %zu [%zu]: %g, want %g", (int)t,
                  (int)op, count, i, got, want);
          }
          free(big);
          free(out);
          ++cases;
        }
      }
    }
  }
  /* uint32/uint64/fp8 cannot be reduced by cclz: a clear error, not a wrong result */
  uint32_t u[4] = {1, 2, 3, 4};
  ncclResult_t r = ncclAllReduce(u, u, 4, ncclUint32, ncclSum, comm, NULL);
  CHECK(r == ncclInvalidArgument, "uint32 all-reduce returned %d", (int)r);
  CHECK(strstr(ncclGetLastError(comm), "cannot be reduced") != NULL, "message: %s", ncclGetLastError(comm));
  if (me == 0) printf("all-reduce, reduce, reduce-scatter: %d cases (8 types x 5 ops x 5 counts x in/out of place) OK\n", cases);
}

static void test_movement(ncclComm_t comm) {
  const int n = g_size, me = g_rank;
  for (size_t ti = 0; ti < LEN(kAllTypes); ++ti) {
    ncclDataType_t t = kAllTypes[ti];
    size_t es = tsize(t);
    for (size_t ci = 0; ci < LEN(kCounts); ++ci) {
      size_t count = kCounts[ci];
      for (int in_place = 0; in_place < 2; ++in_place) {
        /* broadcast from every root */
        for (int root = 0; root < n; ++root) {
          void* send = calloc(count + 1, es);
          void* recv = calloc(count + 1, es);
          for (size_t i = 0; i < count; ++i) put(send, i, t, value(me, i, ncclUint8, ncclSum));
          if (in_place) {
            memcpy(recv, send, count * es);
            NCCL_OK(root % 2 ? ncclBcast(recv, count, t, root, comm, NULL)
                             : ncclBroadcast(recv, recv, count, t, root, comm, NULL));
          } else {
            NCCL_OK(ncclBroadcast(send, recv, count, t, root, comm, NULL));
          }
          for (size_t i = 0; i < count; ++i)
            CHECK(get(recv, i, t) == value(root, i, ncclUint8, ncclSum), "broadcast type %d root %d [%zu]", (int)t, root, i);
          free(send);
          free(recv);
        }
        /* all-gather, all-to-all, gather, scatter */
        void* all = calloc(count * (size_t)n + 1, es);
        void* mine = calloc(count + 1, es);
        for (size_t i = 0; i < count; ++i) put(mine, i, t, value(me, i, ncclUint8, ncclSum));
        void* ag_in = mine;
        if (in_place) {
          memcpy((char*)all + (size_t)me * count * es, mine, count * es);
          ag_in = (char*)all + (size_t)me * count * es;
        }
        NCCL_OK(ncclAllGather(ag_in, all, count, t, comm, NULL));
        for (int q = 0; q < n; ++q)
          for (size_t i = 0; i < count; ++i)
            CHECK(get(all, (size_t)q * count + i, t) == value(q, i, ncclUint8, ncclSum), "all_gather type %d [%d][%zu]", (int)t, q, i);
        /* all-to-all: block q of rank r holds value(r, q*count + i) */
        void* a2a_in = calloc(count * (size_t)n + 1, es);
        void* a2a_out = calloc(count * (size_t)n + 1, es);
        for (size_t i = 0; i < count * (size_t)n; ++i) put(a2a_in, i, t, value(me, i, ncclUint8, ncclSum));
        NCCL_OK(ncclAlltoAll(a2a_in, a2a_out, count, t, comm, NULL));
        for (int q = 0; q < n; ++q)
          for (size_t i = 0; i < count; ++i)
            CHECK(get(a2a_out, (size_t)q * count + i, t) == value(q, (size_t)me * count + i, ncclUint8, ncclSum),
                  "all_to_all type %d [%d][%zu]", (int)t, q, i);
        /* gather to root 0, scatter from root n-1 */
        memset(all, 0, count * (size_t)n * es);
        NCCL_OK(ncclGather(mine, all, count, t, 0, comm, NULL));
        if (me == 0)
          for (int q = 0; q < n; ++q)
            for (size_t i = 0; i < count; ++i)
              CHECK(get(all, (size_t)q * count + i, t) == value(q, i, ncclUint8, ncclSum), "gather type %d [%d][%zu]", (int)t, q, i);
        memset(mine, 0, count * es);
        NCCL_OK(ncclScatter(a2a_in, mine, count, t, n - 1, comm, NULL));
        for (size_t i = 0; i < count; ++i)
          CHECK(get(mine, i, t) == value(n - 1, (size_t)me * count + i, ncclUint8, ncclSum), "scatter type %d [%zu]", (int)t, i);
        free(all);
        free(mine);
        free(a2a_in);
        free(a2a_out);
      }
    }
  }
  if (me == 0) printf("broadcast, bcast, all-gather, all-to-all, gather, scatter: 12 types x 5 counts x in/out of place OK\n");
}

static void test_grouped_p2p(ncclComm_t comm) {
  const int n = g_size, me = g_rank;
  const size_t count = 100003; /* large enough for a rendezvous protocol */
  float* send = malloc(count * (size_t)n * sizeof(float));
  float* recv = malloc(count * (size_t)n * sizeof(float));
  for (size_t i = 0; i < count * (size_t)n; ++i) send[i] = (float)(me * 1000003 + (long)i % 1000);
  /* Every rank sends first and receives second, to every peer: only a group makes that safe. */
  NCCL_OK(ncclGroupStart());
  for (int q = 0; q < n; ++q) NCCL_OK(ncclSend(send + (size_t)q * count, count, ncclFloat32, q, comm, NULL));
  for (int q = 0; q < n; ++q) NCCL_OK(ncclRecv(recv + (size_t)q * count, count, ncclFloat32, q, comm, NULL));
  NCCL_OK(ncclGroupEnd());
  for (int q = 0; q < n; ++q)
    for (size_t i = 0; i < count; ++i)
      CHECK(recv[(size_t)q * count + i] == (float)(q * 1000003 + (long)((size_t)me * count + i) % 1000),
            "grouped all-to-all from %d [%zu]", q, i);
  /* nested groups and a collective inside a group */
  float x = (float)(me + 1), y = 0;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, comm, NULL));
  NCCL_OK(ncclGroupEnd());
  CHECK(y == 0, "a grouped call ran before the outermost ncclGroupEnd");
  NCCL_OK(ncclGroupEnd());
  CHECK(y == (float)(n * (n + 1) / 2), "grouped all-reduce gave %g", y);
  free(send);
  free(recv);
  if (me == 0) printf("grouped send/recv all-to-all (every rank sends first), nested groups OK\n");
}

/* Whether the /proc/self/maps line holding p names `what`. */
static int mapping_names(const void* p, const char* what) {
  FILE* f = fopen("/proc/self/maps", "r");
  char line[512];
  int found = 0;
  while (f != NULL && fgets(line, sizeof line, f) != NULL) {
    unsigned long lo = 0, hi = 0;
    if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && (unsigned long)p >= lo && (unsigned long)p < hi) {
      found = strstr(line, what) != NULL;
      break;
    }
  }
  if (f != NULL) fclose(f);
  return found;
}

static void test_premulsum_split_memory(ncclComm_t comm) {
  const int n = g_size, me = g_rank;
  ncclRedOp_t op;
  float scalar = 0.5f;
  NCCL_OK(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarHostImmediate, comm));
  scalar = 100.0f; /* HostImmediate: read at creation */
  float v[3] = {(float)me, 2.0f, -4.0f}, out[3];
  NCCL_OK(ncclAllReduce(v, out, 3, ncclFloat32, op, comm, NULL));
  CHECK(out[0] == 0.5f * (float)(n * (n - 1) / 2) && out[1] == (float)n && out[2] == -2.0f * (float)n,
        "PreMulSum all-reduce: %g %g %g", out[0], out[1], out[2]);
  int32_t iv = me + 1, iout = 0;
  int32_t isc = 3;
  ncclRedOp_t iop;
  NCCL_OK(ncclRedOpCreatePreMulSum(&iop, &isc, ncclInt32, ncclScalarDevice, comm)); /* read at each call */
  isc = 2;
  NCCL_OK(ncclAllReduce(&iv, &iout, 1, ncclInt32, iop, comm, NULL));
  CHECK(iout == 2 * n * (n + 1) / 2, "PreMulSum (pointer scalar) gave %d", (int)iout);
  ncclResult_t r = ncclAllReduce(&iv, &iout, 1, ncclFloat32, iop, comm, NULL);
  CHECK(r == ncclInvalidArgument, "PreMulSum op of another type: %d", (int)r);
  NCCL_OK(ncclRedOpDestroy(op, comm));
  NCCL_OK(ncclRedOpDestroy(iop, comm));
  r = ncclRedOpDestroy(op, comm);
  CHECK(r == ncclInvalidArgument, "destroying an op twice: %d", (int)r);

  /* split by parity, reversed order */
  ncclComm_t sub = NULL;
  NCCL_OK(ncclCommSplit(comm, me % 2, -me, &sub, NULL));
  int sn = 0, sr = 0;
  NCCL_OK(ncclCommCount(sub, &sn));
  NCCL_OK(ncclCommUserRank(sub, &sr));
  int want_n = (n + 1 - me % 2) / 2;
  CHECK(sn == want_n, "split size %d, want %d", sn, want_n);
  int64_t s = me, ss = 0;
  NCCL_OK(ncclAllReduce(&s, &ss, 1, ncclInt64, ncclSum, sub, NULL));
  int64_t want = 0;
  for (int q = me % 2; q < n; q += 2) want += q;
  CHECK(ss == want, "split all-reduce %lld, want %lld", (long long)ss, (long long)want);
  NCCL_OK(ncclCommDestroy(sub));
  ncclComm_t none = (ncclComm_t)0x1;
  NCCL_OK(ncclCommSplit(comm, me == 0 ? NCCL_SPLIT_NOCOLOR : 1, 0, &none, NULL));
  CHECK((me == 0) == (none == NULL), "NCCL_SPLIT_NOCOLOR gave %p", (void*)none);
  if (none != NULL) NCCL_OK(ncclCommDestroy(none));

  void* mem = NULL;
  NCCL_OK(ncclMemAlloc(&mem, 1 << 20));
  void* handle = NULL;
  NCCL_OK(ncclCommRegister(comm, mem, 1 << 20, &handle));
  ((float*)mem)[0] = 1.0f;
  NCCL_OK(ncclAllReduce(mem, mem, 1 << 18, ncclFloat32, ncclSum, comm, NULL));
  CHECK(((float*)mem)[0] == (float)n, "all-reduce of ncclMemAlloc memory");
  NCCL_OK(ncclCommDeregister(comm, handle));
  NCCL_OK(ncclMemFree(mem));

  /* A heap buffer registered (its pages move into shared memory in place):
   * its bytes stay, collectives on it are exact, and after deregistration
   * it is an ordinary heap buffer again, freed with free(). */
  const size_t hcount = (4u << 20) / sizeof(float) + 1024; /* whole pages */
  float* hbuf = aligned_alloc(4096, hcount * sizeof(float));
  CHECK(hbuf != NULL, "aligned_alloc");
  for (size_t i = 0; i < hcount; ++i) hbuf[i] = (float)((i % 7) + me);
  NCCL_OK(ncclCommRegister(comm, hbuf, hcount * sizeof(float), &handle));
  CHECK(hbuf[5] == (float)(5 + me), "registration changed the buffer");
  CHECK(mapping_names(hbuf, "cclz-registered"), "the registered buffer is not in shared memory");
  for (int rep = 0; rep < 2; ++rep) {
    for (size_t i = 0; i < hcount; ++i) hbuf[i] = (float)((i % 7) + me);
    NCCL_OK(ncclAllReduce(hbuf, hbuf, hcount, ncclFloat32, ncclSum, comm, NULL));
    for (size_t i = 0; i < hcount; ++i) {
      const float w = (float)(n * (int)(i % 7) + n * (n - 1) / 2);
      CHECK(hbuf[i] == w, "registered heap all-reduce [%zu] = %g, want %g", i, (double)hbuf[i], (double)w);
    }
  }
  NCCL_OK(ncclCommDeregister(comm, handle));
  CHECK(hbuf[hcount - 1] == (float)(n * (int)((hcount - 1) % 7) + n * (n - 1) / 2), "deregistration lost bytes");
  CHECK(!mapping_names(hbuf, "memfd"), "the deregistered buffer is still in shared memory");
  /* Not whole pages, or the stack: accepted as a hint (NCCL's registration
   * is one) and left where they are, and calls on them are still exact. */
  hbuf[1] = 5.0f;
  NCCL_OK(ncclCommRegister(comm, hbuf + 1, 4096, &handle));
  CHECK(hbuf[1] == 5.0f && !mapping_names(hbuf, "memfd"), "part of a page was moved");
  NCCL_OK(ncclAllReduce(hbuf + 1, hbuf + 1, 1024, ncclFloat32, ncclSum, comm, NULL));
  CHECK(hbuf[1] == 5.0f * (float)n, "all-reduce of an unmoved registered buffer: %g", (double)hbuf[1]);
  NCCL_OK(ncclCommDeregister(comm, handle));
  free(hbuf);
  float on_stack[16] = {0};
  NCCL_OK(ncclCommRegister(comm, on_stack, sizeof on_stack, &handle));
  NCCL_OK(ncclCommDeregister(comm, handle));
  CHECK(ncclCommRegister(comm, NULL, 64, &handle) == ncclInvalidArgument, "NULL buffer registered");
  if (me == 0) printf("PreMulSum (immediate and pointer scalar), split, NOCOLOR, ncclMemAlloc, register OK\n");
}

static void expect(ncclResult_t got, ncclResult_t want, const char* what) {
  CHECK(got == want, "%s returned %d, want %d", what, (int)got, (int)want);
  if (want != ncclSuccess)
    CHECK(strncmp(ncclGetLastError(NULL), "cclz-nccl: ", 11) == 0, "%s: no message (%s)", what, ncclGetLastError(NULL));
}

static void test_errors(ncclComm_t comm) {
  const int n = g_size;
  float f[4] = {0};
  expect(ncclAllReduce(f, f, 4, ncclFloat32, ncclSum, NULL, NULL), ncclInvalidArgument, "null comm");
  expect(ncclAllReduce(f, f, 4, (ncclDataType_t)ncclNumTypes, ncclSum, comm, NULL), ncclInvalidArgument, "bad dtype");
  expect(ncclAllReduce(f, f, 4, ncclFloat32, (ncclRedOp_t)99, comm, NULL), ncclInvalidArgument, "bad op");
  expect(ncclAllReduce(NULL, f, 4, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument, "null sendbuff");
  expect(ncclAllReduce(NULL, NULL, 0, ncclFloat32, ncclSum, comm, NULL), ncclSuccess, "null buffers, count 0");
  expect(ncclBroadcast(f, f, 4, ncclFloat32, n, comm, NULL), ncclInvalidArgument, "bad root");
  expect(ncclReduce(f, f, 4, ncclFloat32, ncclSum, -1, comm, NULL), ncclInvalidArgument, "negative root");
  expect(ncclSend(f, 4, ncclFloat32, n, comm, NULL), ncclInvalidArgument, "bad peer");
  expect(ncclRecv(f, 4, ncclFloat32, -1, comm, NULL), ncclInvalidArgument, "bad peer (recv)");
  expect(ncclGroupEnd(), ncclInvalidUsage, "ncclGroupEnd without start");
  ncclComm_t c2 = NULL;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.magic = 0x1234;
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  expect(ncclCommInitRankConfig(&c2, n, id, g_rank, &cfg), ncclInvalidArgument, "bad config magic");
  ncclConfig_t cfg2 = NCCL_CONFIG_INITIALIZER;
  cfg2.size = 3;
  expect(ncclCommInitRankConfig(&c2, n, id, g_rank, &cfg2), ncclInvalidArgument, "bad config size");
  expect(ncclCommInitRank(&c2, n, id, n + 3), ncclInvalidArgument, "rank out of range");
  ncclComm_t shrunk = (ncclComm_t)0x1;
  expect(ncclCommShrink(comm, NULL, 0, &shrunk, NULL, 0), ncclInvalidUsage, "ncclCommShrink (not implemented)");
  CHECK(shrunk == NULL, "ncclCommShrink left a communicator");
  CHECK(strstr(ncclGetLastError(comm), "not implemented") != NULL, "%s", ncclGetLastError(comm));
  expect(ncclCommRevoke(comm, 0), ncclInvalidUsage, "ncclCommRevoke");
  expect(ncclGroupSimulateEnd(NULL), ncclInvalidUsage, "ncclGroupSimulateEnd");
  int v = 0;
  NCCL_OK(ncclGetVersion(&v));
  CHECK(v == NCCL_VERSION_CODE, "version %d", v);
  int dev = 0;
  NCCL_OK(ncclCommCuDevice(comm, &dev));
  ncclResult_t async = ncclInternalError;
  NCCL_OK(ncclCommGetAsyncError(comm, &async));
  CHECK(async == ncclSuccess, "async error %d on a healthy communicator", (int)async);
  CHECK(strcmp(ncclGetErrorString(ncclInvalidUsage), "invalid usage (run with NCCL_DEBUG=WARN for details)") == 0,
        "error string");
  /* the communicator still works after all of that */
  float one = 1.0f, sum = 0;
  NCCL_OK(ncclAllReduce(&one, &sum, 1, ncclFloat32, ncclSum, comm, NULL));
  CHECK(sum == (float)n, "all-reduce after the errors: %g", sum);
  if (g_rank == 0) printf("errors: null comm, bad dtype/op/root/peer, null buffers, config magic/size, unimplemented calls OK\n");
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void test_abort(void) {
  ncclComm_t comm = make_comm();
  float x[1024] = {0};
  if (g_rank == 1) {
    struct timespec d = {0, 300 * 1000 * 1000};
    nanosleep(&d, NULL);
    NCCL_OK(ncclCommAbort(comm));
    printf("rank 1: aborted\n");
  } else {
    double t0 = now();
    ncclResult_t r = ncclAllReduce(x, x, 1024, ncclFloat32, ncclSum, comm, NULL);
    double dt = now() - t0;
    CHECK(r != ncclSuccess, "the all-reduce succeeded although rank 1 aborted");
    CHECK(dt < 30.0, "the all-reduce took %.1f s to fail", dt);
    ncclResult_t async = ncclSuccess;
    NCCL_OK(ncclCommGetAsyncError(comm, &async));
    CHECK(async != ncclSuccess, "no async error after the failure");
    printf("rank %d: all-reduce failed in %.2f s with %d: %s\n", g_rank, dt, (int)r, ncclGetLastError(comm));
    ncclCommAbort(comm);
  }
}

static void test_compress(void) {
  ncclComm_t comm = make_comm();
  const int n = g_size;
  const size_t count = 4096;
  float* g = malloc(count * sizeof(float));
  for (size_t i = 0; i < count; ++i) g[i] = 1.0f + 1.0f / 1024.0f * (float)(i % 7) + (float)g_rank;
  NCCL_OK(ncclAllReduce(g, g, count, ncclFloat32, ncclSum, comm, NULL));
  /* bf16 keeps 8 significant bits: the inputs' 1/1024 steps are lost, so the
   * compressed sum differs from the exact one, by less than bf16's rounding. */
  int differs = 0;
  for (size_t i = 0; i < count; ++i) {
    double exact = 0;
    for (int r = 0; r < n; ++r) exact += 1.0 + (double)(i % 7) / 1024.0 + r;
    CHECK(fabs(g[i] - exact) <= 1e-2 * exact, "compressed [%zu] %g, exact %g", i, g[i], exact);
    differs |= g[i] != (float)exact;
  }
  CHECK(differs, "no element changed: the all-reduce was not compressed");
  int32_t k[5] = {1, 2, 3, 4, 5};
  NCCL_OK(ncclAllReduce(k, k, 5, ncclInt32, ncclSum, comm, NULL));
  for (int i = 0; i < 5; ++i) CHECK(k[i] == (i + 1) * n, "integer all-reduce [%d] %d", i, (int)k[i]);
  free(g);
  NCCL_OK(ncclCommDestroy(comm));
  if (g_rank == 0) printf("CCLZ_COMPRESSOR=%s: float all-reduce compressed (within bf16 rounding), integers exact OK\n",
                          getenv("CCLZ_COMPRESSOR"));
}

static void test_fallback(void) {
  ncclUniqueId id;
  if (g_rank == 0) NCCL_OK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRank(&comm, g_size, id, g_rank);
  CHECK(r == ncclInvalidArgument && comm == NULL, "init with a missing real NCCL returned %d", (int)r);
  CHECK(strstr(ncclGetLastError(NULL), "cannot be loaded") != NULL, "message: %s", ncclGetLastError(NULL));
  if (g_rank == 0) printf("CCLZ_NCCL_FALLBACK=1 without the real NCCL: %s\n", ncclGetLastError(NULL));
}

struct InitAllArg {
  ncclComm_t comm;
  int rank;
  float out;
};
static void* init_all_worker(void* p) {
  struct InitAllArg* a = p;
  float x = (float)(a->rank + 1);
  ncclResult_t r = ncclAllReduce(&x, &a->out, 1, ncclFloat32, ncclSum, a->comm, NULL);
  if (r != ncclSuccess) a->out = -1;
  return NULL;
}
static void test_init_all(void) {
  ncclComm_t comms[3];
  NCCL_OK(ncclCommInitAll(comms, 3, NULL));
  pthread_t th[3];
  struct InitAllArg args[3];
  for (int i = 0; i < 3; ++i) {
    int c = 0, r = 0;
    NCCL_OK(ncclCommCount(comms[i], &c));
    NCCL_OK(ncclCommUserRank(comms[i], &r));
    CHECK(c == 3 && r == i, "comm %d: count %d rank %d", i, c, r);
    args[i].comm = comms[i];
    args[i].rank = i;
    args[i].out = 0;
    pthread_create(&th[i], NULL, init_all_worker, &args[i]);
  }
  for (int i = 0; i < 3; ++i) pthread_join(th[i], NULL);
  for (int i = 0; i < 3; ++i) {
    CHECK(args[i].out == 6.0f, "comm %d: all-reduce %g", i, args[i].out);
    NCCL_OK(ncclCommDestroy(comms[i]));
  }
  printf("ncclCommInitAll: 3 communicators in one process, all-reduce from 3 threads OK\n");
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  const char* mode = argc > 1 ? argv[1] : "all";
  if (strcmp(mode, "all") == 0) {
    ncclComm_t comm = make_comm();
    int c = 0, r = -1;
    NCCL_OK(ncclCommCount(comm, &c));
    NCCL_OK(ncclCommUserRank(comm, &r));
    CHECK(c == g_size && r == g_rank, "count %d rank %d", c, r);
    test_all_reduce_family(comm);
    test_movement(comm);
    test_grouped_p2p(comm);
    test_premulsum_split_memory(comm);
    test_errors(comm);
    NCCL_OK(ncclCommFinalize(comm));
    NCCL_OK(ncclCommDestroy(comm));
  } else if (strcmp(mode, "abort") == 0) {
    CHECK(g_size >= 2, "abort needs 2 ranks or more");
    test_abort();
  } else if (strcmp(mode, "compress") == 0) {
    test_compress();
  } else if (strcmp(mode, "fallback") == 0) {
    test_fallback();
  } else if (strcmp(mode, "initall") == 0) {
    test_init_all();
  } else {
    CHECK(0, "unknown mode %s", mode);
  }
  MPI_Finalize();
  return 0;
}
