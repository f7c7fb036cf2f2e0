// libcclz_nccl.so: NCCL's C API (nccl.h, NCCL 2.28) served by cclz.
//
// A program built against NCCL runs on it unchanged by linking it instead of
// libnccl or with LD_PRELOAD. Host buffers go through cclz's collectives;
// host work completes before a call returns (the stream argument is not
// used: there is nothing to order on it). CUDA buffers are detected with
// cudaPointerGetAttributes (libcudart loaded with dlopen when present) and
// either forwarded to the real NCCL (CCLZ_NCCL_FALLBACK=1, the library
// named by CCLZ_NCCL_LIBRARY, default libnccl.so.2) or refused with
// ncclInvalidArgument; cclz has no CUDA path yet. Every function nccl.h
// declares is exported; the ones not implemented return ncclInvalidUsage
// and say so through ncclGetLastError. docs/nccl.md has the details.
//
// Result codes: cclz's match NCCL's except its timeout (8, which is
// ncclNumResults in NCCL): a timeout is reported as ncclRemoteError (a peer
// stopped answering), with "timeout" in the message.
#include <dlfcn.h>
#include <nccl.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cclz/cclz.hpp"
#include "cclz/compressed.hpp"

#define CCLZ_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

thread_local std::string t_last_error;

ncclResult_t fail(ncclResult_t r, std::string msg) {
  t_last_error = "cclz-nccl: " + std::move(msg);
  return r;
}

ncclResult_t from_status(const cclz::Status& s) {
  if (s.ok()) return ncclSuccess;
  const int c = static_cast<int>(s.code());
  const ncclResult_t r = s.code() == cclz::Result::timeout ? ncclRemoteError : static_cast<ncclResult_t>(c);
  return fail(r, s.to_string());
}

// ---------------------------------------------------------------- CUDA probing and the real NCCL

struct CudaRuntime {
  using PtrAttr = cudaError_t (*)(cudaPointerAttributes*, const void*);
  using GetDevice = cudaError_t (*)(int*);
  PtrAttr ptr_attr = nullptr;
  GetDevice get_device = nullptr;
  bool usable = false;
};

const CudaRuntime& cuda() {
  static const CudaRuntime rt = [] {
    CudaRuntime r;
    for (const char* name : {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"}) {
      void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (h == nullptr) continue;
      r.ptr_attr = reinterpret_cast<CudaRuntime::PtrAttr>(dlsym(h, "cudaPointerGetAttributes"));
      r.get_device = reinterpret_cast<CudaRuntime::GetDevice>(dlsym(h, "cudaGetDevice"));
      break;
    }
    // A runtime without a usable device (no driver, no GPU) cannot have made
    // device memory: every pointer is host memory then.
    int dev = -1;
    r.usable = r.ptr_attr != nullptr && r.get_device != nullptr && r.get_device(&dev) == cudaSuccess;
    return r;
  }();
  return rt;
}

bool is_device_pointer(const void* p) {
  const CudaRuntime& rt = cuda();
  if (!rt.usable || p == nullptr) return false;
  cudaPointerAttributes a{};
  if (rt.ptr_attr(&a, p) != cudaSuccess) return false;
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

bool fallback_requested() {
  const char* v = std::getenv("CCLZ_NCCL_FALLBACK");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

// The real NCCL's functions this shim forwards to.
struct RealNccl {
  void* handle = nullptr;
  std::string error;
  decltype(&::ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&::ncclCommInitRank) init_rank = nullptr;
  decltype(&::ncclCommDestroy) destroy = nullptr;
  decltype(&::ncclCommAbort) abort = nullptr;
  decltype(&::ncclGetErrorString) error_string = nullptr;
  decltype(&::ncclAllReduce) all_reduce = nullptr;
  decltype(&::ncclBroadcast) broadcast = nullptr;
  decltype(&::ncclReduce) reduce = nullptr;
  decltype(&::ncclAllGather) all_gather = nullptr;
  decltype(&::ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&::ncclAlltoAll) all_to_all = nullptr;
  decltype(&::ncclSend) send = nullptr;
  decltype(&::ncclRecv) recv = nullptr;
  decltype(&::ncclGroupStart) group_start = nullptr;
  decltype(&::ncclGroupEnd) group_end = nullptr;
  // Newer calls, absent from older NCCLs: a call that needs one it lacks
  // fails naming it.
  decltype(&::ncclGather) gather = nullptr;
  decltype(&::ncclScatter) scatter = nullptr;
  decltype(&::ncclCommSplit) split = nullptr;
  decltype(&::ncclCommFinalize) finalize = nullptr;
  decltype(&::ncclCommGetAsyncError) async_error = nullptr;
  decltype(&::ncclRedOpCreatePreMulSum) premulsum_create = nullptr;
  decltype(&::ncclRedOpDestroy) premulsum_destroy = nullptr;
  decltype(&::ncclMemAlloc) mem_alloc = nullptr;
  decltype(&::ncclMemFree) mem_free = nullptr;
  decltype(&::ncclCommRegister) comm_register = nullptr;
  decltype(&::ncclCommDeregister) comm_deregister = nullptr;
};

const RealNccl& real_nccl() {
  static const RealNccl n = [] {
    RealNccl r;
    const char* lib = std::getenv("CCLZ_NCCL_LIBRARY");
    const std::string name = lib != nullptr && *lib != '\0' ? lib : "libnccl.so.2";
    r.handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (r.handle == nullptr) {
      const char* e = dlerror();
      r.error = "CCLZ_NCCL_FALLBACK=1 but the real NCCL '" + name + "' cannot be loaded: " + (e ? e : "?");
      return r;
    }
    auto get = [&](auto* fn, const char* sym) {
      *fn = reinterpret_cast<std::remove_reference_t<decltype(*fn)>>(dlsym(r.handle, sym));
      if (*fn == nullptr && r.error.empty()) r.error = "the real NCCL '" + name + "' has no " + sym;
    };
    get(&r.get_unique_id, "ncclGetUniqueId");
    get(&r.init_rank, "ncclCommInitRank");
    get(&r.destroy, "ncclCommDestroy");
    get(&r.abort, "ncclCommAbort");
    get(&r.error_string, "ncclGetErrorString");
    get(&r.all_reduce, "ncclAllReduce");
    get(&r.broadcast, "ncclBroadcast");
    get(&r.reduce, "ncclReduce");
    get(&r.all_gather, "ncclAllGather");
    get(&r.reduce_scatter, "ncclReduceScatter");
    get(&r.all_to_all, "ncclAlltoAll");
    get(&r.send, "ncclSend");
    get(&r.recv, "ncclRecv");
    get(&r.group_start, "ncclGroupStart");
    get(&r.group_end, "ncclGroupEnd");
    auto get_optional = [&](auto* fn, const char* sym) {
      *fn = reinterpret_cast<std::remove_reference_t<decltype(*fn)>>(dlsym(r.handle, sym));
    };
    get_optional(&r.gather, "ncclGather");
    get_optional(&r.scatter, "ncclScatter");
    get_optional(&r.split, "ncclCommSplit");
    get_optional(&r.finalize, "ncclCommFinalize");
    get_optional(&r.async_error, "ncclCommGetAsyncError");
    get_optional(&r.premulsum_create, "ncclRedOpCreatePreMulSum");
    get_optional(&r.premulsum_destroy, "ncclRedOpDestroy");
    get_optional(&r.mem_alloc, "ncclMemAlloc");
    get_optional(&r.mem_free, "ncclMemFree");
    get_optional(&r.comm_register, "ncclCommRegister");
    get_optional(&r.comm_deregister, "ncclCommDeregister");
    return r;
  }();
  return n;
}

// ---------------------------------------------------------------- communicators

struct PreMulSum {
  ncclDataType_t dtype;
  double scalar;              // HostImmediate: read at creation
  const void* ptr = nullptr;  // ScalarDevice on a host pointer: read at each call
  bool device_scalar = false; // ScalarDevice on device memory: only the real NCCL can read it
  bool has_real = false;      // the same op made on the real NCCL's communicator (fallback)
  ncclRedOp_t real_op{};
};

// What ncclCommRegister's handle holds: the range, and the real NCCL's
// handle when the buffer is device memory registered there, or whether the
// host buffer was registered with cclz::register_buffer.
struct Registration {
  void* buff;
  std::size_t size;
  void* real = nullptr;
  bool host = false;
};

struct CompressedEntry {
  std::unique_ptr<cclz::Compressor> comp;
  std::unique_ptr<cclz::CompressorState> state;
};

}  // namespace

struct ncclComm {
  std::unique_ptr<cclz::Comm> c;
  ncclComm_t real = nullptr;  // the real NCCL's communicator (fallback only)
  int device = -1;
  std::map<int, PreMulSum> ops;  // ncclNumOps + i
  int next_op = ncclNumOps;
  std::map<std::tuple<const void*, std::size_t, int>, CompressedEntry> compressed;
  std::mutex mu;
};

namespace {

// Calls between ncclGroupStart and ncclGroupEnd, per thread: launched in
// order at the end, then waited for together (so grouped sends and receives
// in any order cannot wait on each other).
struct Group {
  int depth = 0;
  std::vector<std::function<cclz::Request()>> host;
  bool real_open = false;  // the real NCCL's group was opened for forwarded calls
  ncclResult_t deferred = ncclSuccess;
};
thread_local Group t_group;

ncclResult_t check_comm(ncclComm_t comm) {
  if (comm == nullptr || !comm->c) return fail(ncclInvalidArgument, "comm is NULL or was destroyed");
  return ncclSuccess;
}

std::size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

// cclz reduces these; the others (u32, u64, fp8) it only moves.
bool reducible(ncclDataType_t t) {
  return t == ncclInt8 || t == ncclUint8 || t == ncclInt32 || t == ncclInt64 || t == ncclFloat16 ||
         t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16;
}

// Runs a host call now, or queues it in the open group.
ncclResult_t submit(std::function<cclz::Request()> launch) {
  if (t_group.depth > 0) {
    t_group.host.push_back(std::move(launch));
    return ncclSuccess;
  }
  return from_status(launch().wait());
}

ncclResult_t check_dtype(ncclDataType_t t, bool reduce) {
  if (type_size(t) == 0) return fail(ncclInvalidArgument, "unknown datatype " + std::to_string(static_cast<int>(t)));
  if (reduce && !reducible(t)) {
    return fail(ncclInvalidArgument, "datatype " + std::to_string(static_cast<int>(t)) +
                                         " (uint32, uint64 or fp8) cannot be reduced by cclz yet; it can be moved "
                                         "(broadcast, all-gather, all-to-all, send/recv)");
  }
  return ncclSuccess;
}

ncclResult_t check_buffers(const void* a, const void* b, std::size_t bytes_a, std::size_t bytes_b) {
  if ((bytes_a > 0 && a == nullptr) || (bytes_b > 0 && b == nullptr)) {
    return fail(ncclInvalidArgument, "a buffer is NULL with a non-zero count");
  }
  return ncclSuccess;
}

// Where a call's buffers live: 0 host, 1 device (forward), or an error.
ncclResult_t route(ncclComm_t comm, const void* a, const void* b, bool* forward) {
  *forward = false;
  if (!is_device_pointer(a) && !is_device_pointer(b)) return ncclSuccess;
  if (comm->real == nullptr) {
    return fail(ncclInvalidArgument, fallback_requested()
                                         ? "CUDA buffer, and the real NCCL's communicator is not available"
                                         : "CUDA buffer: cclz serves host buffers only (set CCLZ_NCCL_FALLBACK=1 "
                                           "to forward CUDA buffers to the real NCCL)");
  }
  *forward = true;
  if (t_group.depth > 0 && !t_group.real_open) {
    real_nccl().group_start();
    t_group.real_open = true;
  }
  return ncclSuccess;
}

ncclResult_t real_result(ncclResult_t r) {
  if (r != ncclSuccess) return fail(r, std::string("real NCCL: ") + real_nccl().error_string(r));
  return r;
}

// A forwarded call names the real NCCL's own op for a PreMulSum made here.
ncclResult_t real_op(ncclComm_t comm, ncclRedOp_t op, ncclRedOp_t* out) {
  *out = op;
  if (op < ncclNumOps) return ncclSuccess;
  std::lock_guard lk(comm->mu);
  const auto it = comm->ops.find(static_cast<int>(op));
  if (it == comm->ops.end()) return fail(ncclInvalidArgument, "unknown reduction op " + std::to_string(static_cast<int>(op)));
  if (!it->second.has_real) return fail(ncclInvalidArgument, "the PreMulSum op has no counterpart in the real NCCL");
  *out = it->second.real_op;
  return ncclSuccess;
}

ncclResult_t real_missing(const char* what) {
  return fail(ncclInvalidUsage, std::string("CCLZ_NCCL_FALLBACK=1: the real NCCL has no ") + what);
}

// The reduction for cclz, or PreMulSum: *scale gets its factor.
ncclResult_t map_op(ncclComm_t comm, ncclRedOp_t op, ncclDataType_t dt, cclz::ReduceOp* out, double* scale) {
  *scale = 1.0;
  if (op >= ncclSum && op <= ncclAvg) {
    *out = static_cast<cclz::ReduceOp>(op);
    return ncclSuccess;
  }
  std::lock_guard lk(comm->mu);
  const auto it = comm->ops.find(static_cast<int>(op));
  if (it == comm->ops.end()) return fail(ncclInvalidArgument, "unknown reduction op " + std::to_string(static_cast<int>(op)));
  if (it->second.dtype != dt) return fail(ncclInvalidArgument, "the PreMulSum op was made for another datatype");
  *out = cclz::ReduceOp::sum;
  if (it->second.device_scalar) {
    return fail(ncclInvalidArgument, "the PreMulSum op's scalar is in device memory: it applies to CUDA buffers only");
  }
  if (it->second.ptr != nullptr) {
    const void* p = it->second.ptr;
    switch (dt) {
      case ncclFloat32: *scale = *static_cast<const float*>(p); break;
      case ncclFloat64: *scale = *static_cast<const double*>(p); break;
      case ncclInt32: *scale = *static_cast<const std::int32_t*>(p); break;
      case ncclInt64: *scale = static_cast<double>(*static_cast<const std::int64_t*>(p)); break;
      default: return fail(ncclInvalidArgument, "PreMulSum with a pointer scalar supports f32, f64, i32, i64");
    }
  } else {
    *scale = it->second.scalar;
  }
  return ncclSuccess;
}

// PreMulSum: the input times the scalar into a buffer the caller keeps alive
// until the call completes.
ncclResult_t premultiply(const void* in, std::size_t count, ncclDataType_t dt, double s,
                         std::shared_ptr<std::vector<std::byte>>* out) {
  auto buf = std::make_shared<std::vector<std::byte>>(count * type_size(dt));
  auto scale = [&](auto* dst, const auto* src) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(src)>>;
    for (std::size_t i = 0; i < count; ++i) dst[i] = static_cast<T>(static_cast<double>(src[i]) * s);
  };
  switch (dt) {
    case ncclFloat32: scale(reinterpret_cast<float*>(buf->data()), static_cast<const float*>(in)); break;
    case ncclFloat64: scale(reinterpret_cast<double*>(buf->data()), static_cast<const double*>(in)); break;
    case ncclInt32: scale(reinterpret_cast<std::int32_t*>(buf->data()), static_cast<const std::int32_t*>(in)); break;
    case ncclInt64: scale(reinterpret_cast<std::int64_t*>(buf->data()), static_cast<const std::int64_t*>(in)); break;
    case ncclInt8: scale(reinterpret_cast<std::int8_t*>(buf->data()), static_cast<const std::int8_t*>(in)); break;
    case ncclUint8: scale(reinterpret_cast<std::uint8_t*>(buf->data()), static_cast<const std::uint8_t*>(in)); break;
    default:
      return fail(ncclInvalidArgument, "PreMulSum on f16/bf16 is not supported by cclz yet");
  }
  *out = std::move(buf);
  return ncclSuccess;
}

// CCLZ_COMPRESSOR: which all-reduces are compressed.
struct CompressScope {
  std::string spec;
  std::size_t min_bytes = 1 << 20;
  std::string error;
};

const CompressScope& compress_scope() {
  static const CompressScope s = [] {
    CompressScope c;
    if (const char* v = std::getenv("CCLZ_COMPRESSOR"); v != nullptr && *v != '\0') c.spec = v;
    if (const char* v = std::getenv("CCLZ_COMPRESSOR_MIN_BYTES"); v != nullptr && *v != '\0') {
      char* end = nullptr;
      const unsigned long long b = std::strtoull(v, &end, 10);
      if (end == v || *end != '\0') {
        c.error = std::string("CCLZ_COMPRESSOR_MIN_BYTES='") + v + "' is not a byte count";
      } else {
        c.min_bytes = b;
      }
    }
    if (!c.spec.empty() && c.error.empty()) {
      std::unique_ptr<cclz::Compressor> probe;
      if (cclz::Status st = cclz::make_compressor(c.spec, &probe); !st.ok()) c.error = "CCLZ_COMPRESSOR: " + st.message();
    }
    return c;
  }();
  return s;
}

ncclResult_t compressed_all_reduce(ncclComm_t comm, const void* send, void* recv, std::size_t count,
                                   cclz::DataType dt, bool average) {
  const CompressScope& sc = compress_scope();
  CompressedEntry* e = nullptr;
  {
    std::lock_guard lk(comm->mu);
    CompressedEntry& ent = comm->compressed[{recv, count, static_cast<int>(dt)}];
    if (!ent.comp) {
      if (cclz::Status st = cclz::make_compressor(sc.spec, &ent.comp); !st.ok()) return from_status(st);
      cclz::TensorDesc d;
      d.count = count;
      d.dtype = dt;
      if (cclz::Status st = ent.comp->make_state(d, &ent.state); !st.ok()) {
        ent.comp.reset();
        return from_status(st);
      }
    }
    e = &ent;
  }
  if (send != recv) std::memcpy(recv, send, count * cclz::dtype_size(dt));
  cclz::CompressedOptions opt;
  opt.average = average;
  return from_status(cclz::compressed_all_reduce(*comm->c, recv, e->state->desc(), *e->comp, *e->state, opt));
}

cclz::DataType cdt(ncclDataType_t t) { return static_cast<cclz::DataType>(t); }

// Data-movement calls on types cclz does not reduce travel as bytes.
std::pair<cclz::DataType, std::size_t> as_moved(ncclDataType_t t, std::size_t count) {
  if (reducible(t)) return {cdt(t), count};
  return {cclz::DataType::u8, count * type_size(t)};
}

ncclResult_t init_rank(ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank) {
  if (out == nullptr) return fail(ncclInvalidArgument, "comm output pointer is NULL");
  *out = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return fail(ncclInvalidArgument, "rank " + std::to_string(rank) + " of " + std::to_string(nranks) + " is out of range");
  }
  static_assert(sizeof(cclz::UniqueId) == sizeof(ncclUniqueId));
  cclz::UniqueId cid;
  std::memcpy(&cid, &id, sizeof cid);
  auto comm = std::make_unique<ncclComm>();
  if (cclz::Status st = cclz::Comm::init_rank(&comm->c, nranks, cid, rank); !st.ok()) return from_status(st);
  if (cuda().usable) cuda().get_device(&comm->device);
  if (const CompressScope& sc = compress_scope(); !sc.error.empty()) return fail(ncclInvalidArgument, sc.error);
  if (fallback_requested()) {
    const RealNccl& real = real_nccl();
    if (!real.error.empty()) return fail(ncclInvalidArgument, real.error);
    // The real NCCL's own unique id travels over the cclz communicator.
    ncclUniqueId rid{};
    ncclResult_t made = ncclSuccess;
    if (rank == 0) made = real.get_unique_id(&rid);
    std::int32_t ok = made == ncclSuccess ? 1 : 0;
    if (cclz::Status st = comm->c->broadcast(&ok, &ok, 1, cclz::DataType::i32, 0).wait(); !st.ok()) return from_status(st);
    if (ok == 0) return fail(ncclSystemError, "CCLZ_NCCL_FALLBACK=1: rank 0 could not get the real NCCL's unique id");
    if (cclz::Status st = comm->c->broadcast(&rid, &rid, sizeof rid, cclz::DataType::u8, 0).wait(); !st.ok())
      return from_status(st);
    if (ncclResult_t r = real.init_rank(&comm->real, nranks, rid, rank); r != ncclSuccess) {
      comm->real = nullptr;
      return fail(r, std::string("CCLZ_NCCL_FALLBACK=1: the real NCCL could not make its communicator: ") +
                         real.error_string(r));
    }
  }
  *out = comm.release();
  return ncclSuccess;
}

ncclResult_t check_config(const ncclConfig_t* config) {
  if (config == nullptr) return ncclSuccess;
  if (config->magic != 0xcafebeef) return fail(ncclInvalidArgument, "ncclConfig_t: bad magic (use NCCL_CONFIG_INITIALIZER)");
  if (config->size < offsetof(ncclConfig_t, blocking) + sizeof(int) || config->size > sizeof(ncclConfig_t)) {
    return fail(ncclInvalidArgument, "ncclConfig_t: size " + std::to_string(config->size) + " is not a known layout");
  }
  if (config->version < NCCL_VERSION(2, 14, 0) || config->version > NCCL_VERSION_CODE) {
    return fail(ncclInvalidArgument, "ncclConfig_t: version " + std::to_string(config->version) + " is not supported");
  }
  return ncclSuccess;
}

ncclResult_t not_implemented(const char* what) {
  return fail(ncclInvalidUsage, std::string(what) + " is not implemented by cclz (see docs/nccl.md)");
}

}  // namespace

// ---------------------------------------------------------------- the API

CCLZ_EXPORT ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return fail(ncclInvalidArgument, "version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

CCLZ_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (uniqueId == nullptr) return fail(ncclInvalidArgument, "uniqueId is NULL");
  cclz::UniqueId id;
  if (cclz::Status st = cclz::Comm::create_unique_id(&id); !st.ok()) return from_status(st);
  std::memcpy(uniqueId, &id, sizeof *uniqueId);
  return ncclSuccess;
}

CCLZ_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return init_rank(comm, nranks, commId, rank);
}

CCLZ_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                                ncclConfig_t* config) {
  if (ncclResult_t r = check_config(config); r != ncclSuccess) return r;
  return init_rank(comm, nranks, commId, rank);
}

CCLZ_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) {
  (void)devlist;  // host communicators: one per entry, all in this process
  if (comm == nullptr || ndev < 1) return fail(ncclInvalidArgument, "ncclCommInitAll: comm is NULL or ndev < 1");
  ncclUniqueId id;
  if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) return r;
  std::vector<ncclResult_t> results(static_cast<std::size_t>(ndev), ncclSuccess);
  std::vector<std::string> errors(static_cast<std::size_t>(ndev));
  std::vector<std::thread> threads;
  for (int r = 0; r < ndev; ++r) {
    threads.emplace_back([&, r] {
      results[static_cast<std::size_t>(r)] = init_rank(&comm[r], ndev, id, r);
      errors[static_cast<std::size_t>(r)] = t_last_error;
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < ndev; ++r) {
    if (results[static_cast<std::size_t>(r)] != ncclSuccess) {
      for (int q = 0; q < ndev; ++q) {
        if (comm[q] != nullptr) {
          comm[q]->c->abort();
          delete comm[q];
          comm[q] = nullptr;
        }
      }
      t_last_error = errors[static_cast<std::size_t>(r)];
      return results[static_cast<std::size_t>(r)];
    }
  }
  return ncclSuccess;
}

CCLZ_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  if (ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  if (newcomm == nullptr) return fail(ncclInvalidArgument, "newcomm is NULL");
  if (ncclResult_t r = check_config(config); r != ncclSuccess) return r;
  *newcomm = nullptr;
  if (comm->real != nullptr && real_nccl().split == nullptr) return real_missing("ncclCommSplit");
  auto out = std::make_unique<ncclComm>();
  if (cclz::Status st = comm->c->split(color == NCCL_SPLIT_NOCOLOR ? -1 : color, key, &out->c); !st.ok())
    return from_status(st);
  out->device = comm->device;
  if (comm->real != nullptr) {
    // The same split of the real NCCL's communicator (collective over the parent's ranks too).
    if (ncclResult_t r = real_nccl().split(comm->real, color, key, &out->real, config); r != ncclSuccess) {
      if (out->c) out->c->abort();
      return real_result(r);
    }
    if ((out->real != nullptr) != static_cast<bool>(out->c)) {
      if (out->c) out->c->abort();
      if (out->real != nullptr) real_nccl().destroy(out->real);
      return fail(ncclInternalError, "the real NCCL's split disagrees with cclz's on membership");
    }
  }
  if (out->c) *newcomm = out.release();
  return ncclSuccess;
}

CCLZ_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  if (comm->real != nullptr && real_nccl().finalize != nullptr) {
    if (ncclResult_t r = real_result(real_nccl().finalize(comm->real)); r != ncclSuccess) return r;
  }
  return from_status(comm->c->destroy());  // waits for queued work, then releases the transport
}

CCLZ_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return fail(ncclInvalidArgument, "comm is NULL");
  ncclResult_t r = ncclSuccess;
  if (comm->c) r = from_status(comm->c->destroy());
  if (r == ncclInvalidUsage) r = ncclSuccess;  // already finalized
  if (comm->real != nullptr) real_nccl().destroy(comm->real);
  delete comm;
  return r;
}

CCLZ_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return fail(ncclInvalidArgument, "comm is NULL");
  // Peers blocked on this rank get an error instead of hanging (Comm::abort).
  if (comm->c) comm->c->abort();
  if (comm->real != nullptr) real_nccl().abort(comm->real);
  delete comm;
  return ncclSuccess;
}

CCLZ_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  if (asyncError == nullptr) return fail(ncclInvalidArgument, "asyncError is NULL");
  const cclz::Status st = comm->c->async_error();
  *asyncError = st.ok() ? ncclSuccess : from_status(st);
  if (*asyncError == ncclSuccess && comm->real != nullptr && real_nccl().async_error != nullptr) {
    ncclResult_t real = ncclSuccess;
    if (ncclResult_t r = real_result(real_nccl().async_error(comm->real, &real)); r != ncclSuccess) return r;
    if (real != ncclSuccess) *asyncError = real_result(real);
  }
  return ncclSuccess;
}

CCLZ_EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  if (count == nullptr) return fail(ncclInvalidArgument, "count is NULL");
  *count = comm->c->size();
  return ncclSuccess;
}

CCLZ_EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  if (device == nullptr) return fail(ncclInvalidArgument, "device is NULL");
  *device = comm->device;  // the CUDA device current at init; -1 without CUDA
  return ncclSuccess;
}

CCLZ_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  if (rank == nullptr) return fail(ncclInvalidArgument, "rank is NULL");
  *rank = comm->c->rank();
  return ncclSuccess;
}

CCLZ_EXPORT const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

CCLZ_EXPORT const char* ncclGetLastError(ncclComm_t comm) {
  (void)comm;  // this thread's last message, whatever the communicator
  return t_last_error.c_str();
}

CCLZ_EXPORT ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                       ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  if (ncclResult_t r = check_dtype(datatype, true); r != ncclSuccess) return r;
  const std::size_t bytes = count * type_size(datatype);
  if (ncclResult_t r = check_buffers(sendbuff, recvbuff, bytes, bytes); r != ncclSuccess) return r;
  bool fwd = false;
  if (ncclResult_t r = route(comm, sendbuff, recvbuff, &fwd); r != ncclSuccess) return r;
  if (fwd) {
    ncclRedOp_t rop{};
    if (ncclResult_t r = real_op(comm, op, &rop); r != ncclSuccess) return r;
    return real_result(real_nccl().all_reduce(sendbuff, recvbuff, count, datatype, rop, comm->real, stream));
  }
  cclz::ReduceOp cop{};
  double scale = 1.0;
  if (ncclResult_t r = map_op(comm, op, datatype, &cop, &scale); r != ncclSuccess) return r;
  const CompressScope& sc = compress_scope();
  const bool is_float = datatype == ncclFloat32 || datatype == ncclFloat16 || datatype == ncclBfloat16;
  if (!sc.spec.empty() && is_float && op <= ncclAvg && (cop == cclz::ReduceOp::sum || cop == cclz::ReduceOp::avg) &&
      bytes >= sc.min_bytes && t_group.depth == 0) {
    return compressed_all_reduce(comm, sendbuff, recvbuff, count, cdt(datatype), cop == cclz::ReduceOp::avg);
  }
  std::shared_ptr<std::vector<std::byte>> pre;
  if (op >= ncclNumOps) {
    if (ncclResult_t r = premultiply(sendbuff, count, datatype, scale, &pre); r != ncclSuccess) return r;
    sendbuff = pre->data();
  }
  cclz::Comm* c = comm->c.get();
  // `keep` holds the premultiplied input until a grouped call has run.
  return submit([=, keep = pre] {
    (void)keep;
    return c->all_reduce(sendbuff, recvbuff, count, cdt(datatype), cop);
  });
}

CCLZ_EXPORT ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                    ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  if (ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  if (ncclResult_t r = check_dtype(datatype, true); r != ncclSuccess) return r;
  if (root < 0 || root >= comm->c->size()) return fail(ncclInvalidArgument, "root " + std::to_string(root) + " out of range");
  const std::size_t bytes = count * type_size(datatype);
  if (ncclResult_t r = check_buffers(sendbuff, comm->c->rank() == root ? recvbuff : sendbuff, bytes, bytes);
      r != ncclSuccess)
    return r;
  bool fwd = false;
  if (ncclResult_t r = route(comm, sendbuff, recvbuff, &fwd); r != ncclSuccess) return r;
  if (fwd) {
    ncclRedOp_t rop{};
    if (ncclResult_t r = real_op(comm, op, &rop); r != ncclSuccess) return r;
    return real_result(real_nccl().reduce(sendbuff, recvbuff, count, datatype, rop, root, comm->real, stream));
  }
  cclz::ReduceOp cop{};
  double scale = 1.0;
  if (ncclResult_t r = map_op(comm, op, datatype, &cop, &scale); r != ncclSuccess) return r;
  std::shared_ptr<std::vector<std::byte>> pre;
  if (op >= ncclNumOps) {
    if (ncclResult_t r = premultiply(sendbuff, count, datatype, scale, &pre); r != ncclSuccess) return r;
    sendbuff = pre->data();
  }
  cclz::Comm* c = comm->c.get();
  return submit([=, keep = pre] {
    (void)keep;
    return c->reduce(sendbuff, recvbuff, count, cdt(datatype), cop, root);
  });
}

CCLZ_EXPORT ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                       int root, ncclComm_t comm, cudaStream_t stream) {
  if (ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  if (ncclResult_t r = check_dtype(datatype, false); r != ncclSuccess) return r;
  if (root < 0 || root >= comm->c->size()) return fail(ncclInvalidArgument, "root " + std::to_string(root) + " out of range");
  const std::size_t bytes = count * type_size(datatype);
  if (ncclResult_t r = check_buffers(comm->c->rank() == root ? sendbuff : recvbuff, recvbuff, bytes, bytes);
      r != ncclSuccess)
    return r;
  bool fwd = false;
  if (ncclResult_t r = route(comm, sendbuff, recvbuff, &fwd); r != ncclSuccess) return r;
  if (fwd) return real_result(real_nccl().broadcast(sendbuff, recvbuff, count, datatype, root, comm->real, stream));
  const auto [dt, n] = as_moved(datatype, count);
  cclz::Comm* c = comm->c.get();
  return submit([=] { return c->broadcast(sendbuff, recvbuff, n, dt, root); });
}

CCLZ_EXPORT ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                                   cudaStream_t stream) {
  return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

CCLZ_EXPORT ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                                       ncclComm_t comm, cudaStream_t stream) {
  if (ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  if (ncclResult_t r = check_dtype(datatype, false); r != ncclSuccess) return r;
  const std::size_t bytes = sendcount * type_size(datatype);
  if (ncclResult_t r = check_buffers(sendbuff, recvbuff, bytes, bytes); r != ncclSuccess) return r;
  bool fwd = false;
  if (ncclResult_t r = route(comm, sendbuff, recvbuff, &fwd); r != ncclSuccess) return r;
  if (fwd) return real_result(real_nccl().all_gather(sendbuff, recvbuff, sendcount, datatype, comm->real, stream));
  const auto [dt, n] = as_moved(datatype, sendcount);
  cclz::Comm* c = comm->c.get();
  return submit([=] { return c->all_gather(sendbuff, recvbuff, n, dt); });
}

CCLZ_EXPORT ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                           cudaStream_t stream) {
  if (ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  if (ncclResult_t r = check_dtype(datatype, true); r != ncclSuccess) return r;
  const std::size_t bytes = recvcount * type_size(datatype);
  if (ncclResult_t r = check_buffers(sendbuff, recvbuff, bytes, bytes); r != ncclSuccess) return r;
  bool fwd = false;
  if (ncclResult_t r = route(comm, sendbuff, recvbuff, &fwd); r != ncclSuccess) return r;
  if (fwd) {
    ncclRedOp_t rop{};
    if (ncclResult_t r = real_op(comm, op, &rop); r != ncclSuccess) return r;
    return real_result(real_nccl().reduce_scatter(sendbuff, recvbuff, recvcount, datatype, rop, comm->real, stream));
  }
  cclz::ReduceOp cop{};
  double scale = 1.0;
  if (ncclResult_t r = map_op(comm, op, datatype, &cop, &scale); r != ncclSuccess) return r;
  std::shared_ptr<std::vector<std::byte>> pre;
  const std::size_t total = recvcount * static_cast<std::size_t>(comm->c->size());
  if (op >= ncclNumOps) {
    if (ncclResult_t r = premultiply(sendbuff, total, datatype, scale, &pre); r != ncclSuccess) return r;
    sendbuff = pre->data();
  }
  cclz::Comm* c = comm->c.get();
  return submit([=, keep = pre] {
    (void)keep;
    return c->reduce_scatter(sendbuff, recvbuff, recvcount, cdt(datatype), cop);
  });
}

CCLZ_EXPORT ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                      ncclComm_t comm, cudaStream_t stream) {
  if (ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  if (ncclResult_t r = check_dtype(datatype, false); r != ncclSuccess) return r;
  const std::size_t bytes = count * type_size(datatype);
  if (ncclResult_t r = check_buffers(sendbuff, recvbuff, bytes, bytes); r != ncclSuccess) return r;
  bool fwd = false;
  if (ncclResult_t r = route(comm, sendbuff, recvbuff, &fwd); r != ncclSuccess) return r;
  if (fwd) return real_result(real_nccl().all_to_all(sendbuff, recvbuff, count, datatype, comm->real, stream));
  const auto [dt, n] = as_moved(datatype, count);
  cclz::Comm* c = comm->c.get();
  return submit([=] { return c->all_to_all(sendbuff, recvbuff, n, dt); });
}

CCLZ_EXPORT ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                  ncclComm_t comm, cudaStream_t stream) {
  if (ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  if (ncclResult_t r = check_dtype(datatype, false); r != ncclSuccess) return r;
  if (peer < 0 || peer >= comm->c->size()) return fail(ncclInvalidArgument, "peer " + std::to_string(peer) + " out of range");
  if (ncclResult_t r = check_buffers(sendbuff, sendbuff, count * type_size(datatype), 0); r != ncclSuccess) return r;
  bool fwd = false;
  if (ncclResult_t r = route(comm, sendbuff, sendbuff, &fwd); r != ncclSuccess) return r;
  if (fwd) return real_result(real_nccl().send(sendbuff, count, datatype, peer, comm->real, stream));
  const auto [dt, n] = as_moved(datatype, count);
  cclz::Comm* c = comm->c.get();
  return submit([=] { return c->send(sendbuff, n, dt, peer); });
}

CCLZ_EXPORT ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                                  cudaStream_t stream) {
  if (ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  if (ncclResult_t r = check_dtype(datatype, false); r != ncclSuccess) return r;
  if (peer < 0 || peer >= comm->c->size()) return fail(ncclInvalidArgument, "peer " + std::to_string(peer) + " out of range");
  if (ncclResult_t r = check_buffers(recvbuff, recvbuff, count * type_size(datatype), 0); r != ncclSuccess) return r;
  bool fwd = false;
  if (ncclResult_t r = route(comm, recvbuff, recvbuff, &fwd); r != ncclSuccess) return r;
  if (fwd) return real_result(real_nccl().recv(recvbuff, count, datatype, peer, comm->real, stream));
  const auto [dt, n] = as_moved(datatype, count);
  cclz::Comm* c = comm->c.get();
  return submit([=] { return c->recv(recvbuff, n, dt, peer); });
}

// Gather and scatter as grouped point-to-point from and to the root.
CCLZ_EXPORT ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                    int root, ncclComm_t comm, cudaStream_t stream) {
  if (ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  const int n = comm->c->size(), me = comm->c->rank();
  if (root < 0 || root >= n) return fail(ncclInvalidArgument, "root " + std::to_string(root) + " out of range");
  if (ncclResult_t r = check_dtype(datatype, false); r != ncclSuccess) return r;
  const std::size_t bytes = count * type_size(datatype);
  if (ncclResult_t r = check_buffers(sendbuff, me == root ? recvbuff : sendbuff, bytes, bytes); r != ncclSuccess) return r;
  bool fwd = false;
  if (ncclResult_t r = route(comm, sendbuff, me == root ? recvbuff : sendbuff, &fwd); r != ncclSuccess) return r;
  if (fwd) {
    if (real_nccl().gather == nullptr) return real_missing("ncclGather");
    return real_result(real_nccl().gather(sendbuff, recvbuff, count, datatype, root, comm->real, stream));
  }
  if (ncclResult_t r = ncclGroupStart(); r != ncclSuccess) return r;
  ncclResult_t res = ncclSuccess;
  if (me == root) {
    auto* out = static_cast<std::byte*>(recvbuff);
    for (int q = 0; q < n && res == ncclSuccess; ++q) {
      if (q == me) {
        if (out + static_cast<std::size_t>(q) * bytes != sendbuff && bytes > 0) {
          std::memmove(out + static_cast<std::size_t>(q) * bytes, sendbuff, bytes);
        }
      } else {
        res = ncclRecv(out + static_cast<std::size_t>(q) * bytes, count, datatype, q, comm, stream);
      }
    }
  } else {
    res = ncclSend(sendbuff, count, datatype, root, comm, stream);
  }
  const ncclResult_t end = ncclGroupEnd();
  return res != ncclSuccess ? res : end;
}

CCLZ_EXPORT ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                     int root, ncclComm_t comm, cudaStream_t stream) {
  if (ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  const int n = comm->c->size(), me = comm->c->rank();
  if (root < 0 || root >= n) return fail(ncclInvalidArgument, "root " + std::to_string(root) + " out of range");
  if (ncclResult_t r = check_dtype(datatype, false); r != ncclSuccess) return r;
  const std::size_t bytes = count * type_size(datatype);
  if (ncclResult_t r = check_buffers(me == root ? sendbuff : recvbuff, recvbuff, bytes, bytes); r != ncclSuccess) return r;
  bool fwd = false;
  if (ncclResult_t r = route(comm, me == root ? sendbuff : recvbuff, recvbuff, &fwd); r != ncclSuccess) return r;
  if (fwd) {
    if (real_nccl().scatter == nullptr) return real_missing("ncclScatter");
    return real_result(real_nccl().scatter(sendbuff, recvbuff, count, datatype, root, comm->real, stream));
  }
  if (ncclResult_t r = ncclGroupStart(); r != ncclSuccess) return r;
  ncclResult_t res = ncclSuccess;
  if (me == root) {
    const auto* in = static_cast<const std::byte*>(sendbuff);
    for (int q = 0; q < n && res == ncclSuccess; ++q) {
      if (q == me) {
        if (in + static_cast<std::size_t>(q) * bytes != recvbuff && bytes > 0) {
          std::memmove(recvbuff, in + static_cast<std::size_t>(q) * bytes, bytes);
        }
      } else {
        res = ncclSend(in + static_cast<std::size_t>(q) * bytes, count, datatype, q, comm, stream);
      }
    }
  } else {
    res = ncclRecv(recvbuff, count, datatype, root, comm, stream);
  }
  const ncclResult_t end = ncclGroupEnd();
  return res != ncclSuccess ? res : end;
}

CCLZ_EXPORT ncclResult_t ncclGroupStart() {
  ++t_group.depth;
  return ncclSuccess;
}

CCLZ_EXPORT ncclResult_t ncclGroupEnd() {
  if (t_group.depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--t_group.depth > 0) return ncclSuccess;
  std::vector<std::function<cclz::Request()>> calls;
  calls.swap(t_group.host);
  std::vector<cclz::Request> reqs;
  reqs.reserve(calls.size());
  for (auto& launch : calls) reqs.push_back(launch());
  ncclResult_t res = ncclSuccess;
  for (cclz::Request& r : reqs) {
    const ncclResult_t one = from_status(r.wait());
    if (res == ncclSuccess) res = one;
  }
  if (t_group.real_open) {
    t_group.real_open = false;
    const ncclResult_t r = real_result(real_nccl().group_end());
    if (res == ncclSuccess) res = r;
  }
  return res;
}

CCLZ_EXPORT ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                                  ncclScalarResidence_t residence, ncclComm_t comm) {
  if (ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  if (op == nullptr || scalar == nullptr) return fail(ncclInvalidArgument, "op or scalar is NULL");
  if (ncclResult_t r = check_dtype(datatype, true); r != ncclSuccess) return r;
  const bool device_scalar = is_device_pointer(scalar);
  if (device_scalar && (residence != ncclScalarDevice || comm->real == nullptr)) {
    return fail(ncclInvalidArgument, residence != ncclScalarDevice
                                         ? "a scalar in device memory must be ncclScalarDevice"
                                         : "a device scalar needs CUDA buffers, which cclz serves only with "
                                           "CCLZ_NCCL_FALLBACK=1");
  }
  PreMulSum p{datatype, 1.0, nullptr};
  if (device_scalar) {
    p.device_scalar = true;
  } else if (residence == ncclScalarHostImmediate) {
    switch (datatype) {
      case ncclFloat32: p.scalar = *static_cast<const float*>(scalar); break;
      case ncclFloat64: p.scalar = *static_cast<const double*>(scalar); break;
      case ncclInt32: p.scalar = *static_cast<const std::int32_t*>(scalar); break;
      case ncclInt64: p.scalar = static_cast<double>(*static_cast<const std::int64_t*>(scalar)); break;
      case ncclInt8: p.scalar = *static_cast<const std::int8_t*>(scalar); break;
      case ncclUint8: p.scalar = *static_cast<const std::uint8_t*>(scalar); break;
      default: return fail(ncclInvalidArgument, "PreMulSum on f16/bf16 is not supported by cclz yet");
    }
  } else if (residence == ncclScalarDevice) {
    p.ptr = scalar;  // a host pointer read at each call
  } else {
    return fail(ncclInvalidArgument, "unknown scalar residence");
  }
  if (comm->real != nullptr) {
    // The same op on the real NCCL's communicator, for calls on CUDA buffers.
    if (real_nccl().premulsum_create == nullptr) return real_missing("ncclRedOpCreatePreMulSum");
    if (ncclResult_t r = real_nccl().premulsum_create(&p.real_op, scalar, datatype, residence, comm->real);
        r != ncclSuccess)
      return real_result(r);
    p.has_real = true;
  }
  std::lock_guard lk(comm->mu);
  const int id = comm->next_op++;
  comm->ops[id] = p;
  *op = static_cast<ncclRedOp_t>(id);
  return ncclSuccess;
}

CCLZ_EXPORT ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  if (ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  PreMulSum p{};
  {
    std::lock_guard lk(comm->mu);
    const auto it = comm->ops.find(static_cast<int>(op));
    if (it == comm->ops.end()) {
      return fail(ncclInvalidArgument,
                  "op " + std::to_string(static_cast<int>(op)) + " was not made by ncclRedOpCreatePreMulSum");
    }
    p = it->second;
    comm->ops.erase(it);
  }
  if (p.has_real && real_nccl().premulsum_destroy != nullptr) {
    return real_result(real_nccl().premulsum_destroy(p.real_op, comm->real));
  }
  return ncclSuccess;
}

// Host memory (page-aligned, zeroed), or with CCLZ_NCCL_FALLBACK=1 the real
// NCCL's device memory, as a program written for NCCL expects.
CCLZ_EXPORT ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  if (ptr == nullptr) return fail(ncclInvalidArgument, "ptr is NULL");
  *ptr = nullptr;
  if (fallback_requested()) {
    const RealNccl& real = real_nccl();
    if (!real.error.empty()) return fail(ncclInvalidArgument, real.error);
    if (real.mem_alloc == nullptr) return real_missing("ncclMemAlloc");
    return real_result(real.mem_alloc(ptr, size));
  }
  // Host memory that the node's ranks read from one another in place, as
  // NCCL's own ncclMemAlloc buffers serve its registered paths.
  return from_status(cclz::mem_alloc(ptr, size));
}

CCLZ_EXPORT ncclResult_t ncclMemFree(void* ptr) {
  if (is_device_pointer(ptr)) {
    if (real_nccl().mem_free == nullptr) return real_missing("ncclMemFree");
    return real_result(real_nccl().mem_free(ptr));
  }
  return from_status(cclz::mem_free(ptr));
}

// A host buffer is registered with cclz::register_buffer where it can be:
// its pages move into shared memory in place, and the node's ranks then
// read it directly (ncclMemAlloc memory needs nothing more). Device buffers
// are registered with the real NCCL under the fallback.
CCLZ_EXPORT ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  if (ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  if (handle == nullptr || (buff == nullptr && size > 0)) return fail(ncclInvalidArgument, "handle or buff is NULL");
  auto reg = std::make_unique<Registration>(Registration{buff, size});
  bool fwd = false;
  if (ncclResult_t r = route(comm, buff, buff, &fwd); r != ncclSuccess) return r;
  if (fwd) {
    if (real_nccl().comm_register == nullptr) return real_missing("ncclCommRegister");
    if (ncclResult_t r = real_nccl().comm_register(comm->real, buff, size, &reg->real); r != ncclSuccess)
      return real_result(r);
  } else if (size > 0) {
    // Memory that cannot move (part of a page, the stack, a file's pages)
    // stays where it is: registration is a hint in NCCL, and calls on the
    // buffer take the staged path as before. Running out of shared memory
    // is an error.
    const cclz::Status st = cclz::register_buffer(buff, size);
    if (!st.ok() && st.code() != cclz::Result::invalid_argument) return from_status(st);
    reg->host = st.ok();
  }
  *handle = reg.release();
  return ncclSuccess;
}

CCLZ_EXPORT ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  if (ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  if (handle == nullptr) return fail(ncclInvalidArgument, "handle is NULL");
  std::unique_ptr<Registration> reg(static_cast<Registration*>(handle));
  if (reg->real != nullptr && real_nccl().comm_deregister != nullptr) {
    return real_result(real_nccl().comm_deregister(comm->real, reg->real));
  }
  if (reg->host) return from_status(cclz::deregister_buffer(reg->buff));
  return ncclSuccess;
}

// Declared by nccl.h, not implemented: an error, never a silent success.
CCLZ_EXPORT ncclResult_t ncclCommRevoke(ncclComm_t, int) { return not_implemented("ncclCommRevoke"); }
CCLZ_EXPORT ncclResult_t ncclCommShrink(ncclComm_t, int*, int, ncclComm_t* newcomm, ncclConfig_t*, int) {
  if (newcomm != nullptr) *newcomm = nullptr;
  return not_implemented("ncclCommShrink");
}
CCLZ_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int, int, int, ncclUniqueId*, ncclConfig_t*) {
  if (newcomm != nullptr) *newcomm = nullptr;
  return not_implemented("ncclCommInitRankScalable");
}
CCLZ_EXPORT ncclResult_t ncclCommWindowRegister(ncclComm_t, void*, size_t, ncclWindow_t* win, int) {
  if (win != nullptr) *win = nullptr;
  return not_implemented("ncclCommWindowRegister");
}
CCLZ_EXPORT ncclResult_t ncclCommWindowDeregister(ncclComm_t, ncclWindow_t) {
  return not_implemented("ncclCommWindowDeregister");
}
CCLZ_EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t*) { return not_implemented("ncclGroupSimulateEnd"); }

// NCCL's profiling aliases: the same functions under a pnccl prefix.
#define CCLZ_ALIAS(name) \
  CCLZ_EXPORT __typeof__(name) p##name __attribute__((alias(#name)));
CCLZ_ALIAS(ncclGetVersion)
CCLZ_ALIAS(ncclGetUniqueId)
CCLZ_ALIAS(ncclCommInitRank)
CCLZ_ALIAS(ncclCommInitRankConfig)
CCLZ_ALIAS(ncclCommInitAll)
CCLZ_ALIAS(ncclCommSplit)
CCLZ_ALIAS(ncclCommFinalize)
CCLZ_ALIAS(ncclCommDestroy)
CCLZ_ALIAS(ncclCommAbort)
CCLZ_ALIAS(ncclCommGetAsyncError)
CCLZ_ALIAS(ncclCommCount)
CCLZ_ALIAS(ncclCommCuDevice)
CCLZ_ALIAS(ncclCommUserRank)
CCLZ_ALIAS(ncclGetErrorString)
CCLZ_ALIAS(ncclGetLastError)
CCLZ_ALIAS(ncclAllReduce)
CCLZ_ALIAS(ncclReduce)
CCLZ_ALIAS(ncclBroadcast)
CCLZ_ALIAS(ncclBcast)
CCLZ_ALIAS(ncclAllGather)
CCLZ_ALIAS(ncclReduceScatter)
CCLZ_ALIAS(ncclAlltoAll)
CCLZ_ALIAS(ncclGather)
CCLZ_ALIAS(ncclScatter)
CCLZ_ALIAS(ncclSend)
CCLZ_ALIAS(ncclRecv)
CCLZ_ALIAS(ncclGroupStart)
CCLZ_ALIAS(ncclGroupEnd)
CCLZ_ALIAS(ncclRedOpCreatePreMulSum)
CCLZ_ALIAS(ncclRedOpDestroy)
CCLZ_ALIAS(ncclMemAlloc)
CCLZ_ALIAS(ncclMemFree)
CCLZ_ALIAS(ncclCommRegister)
CCLZ_ALIAS(ncclCommDeregister)
CCLZ_ALIAS(ncclCommRevoke)
CCLZ_ALIAS(ncclCommShrink)
CCLZ_ALIAS(ncclCommInitRankScalable)
CCLZ_ALIAS(ncclCommWindowRegister)
CCLZ_ALIAS(ncclCommWindowDeregister)
CCLZ_ALIAS(ncclGroupSimulateEnd)
