// Reduction kernel benchmark (Google Benchmark): kernels::reduce() for every
// dtype and op at 4 KiB, 256 KiB (in cache) and 64 MiB (memory) per buffer,
// next to memcpy of the same buffer size as the copy-bandwidth reference, plus
// the per-ISA variants, the fused reduce_many against a chain of reduce()
// calls, the bulk f16/bf16 conversions, avg's divide step, and the
// node-local path's large copies (copy_stream, copy_in) and the kernel's copy
// that carries heap buffers between processes (cma_read).
//
// Bytes processed (so "bytes_per_second" is a bandwidth) count every stream
// that touches memory: reduce = 3 x buffer (read a, read b, write dst),
// memcpy = 2 x buffer (read, write), two inputs into two outputs = 4 x
// buffer, reduce_many over k inputs = (k + 1) x
// buffer, a chain of k - 1 reduce() calls = 3 (k - 1) x buffer, a conversion
// = input + output bytes. Equal GB/s for reduce and memcpy therefore means
// the kernel runs at copy bandwidth. Cost: ~1-2 minutes for the whole set;
// filter with --benchmark_filter, e.g. 'reduce/(f32|f16|bf16|i32)/sum|memcpy'.
#include <benchmark/benchmark.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels.hpp"
#include "shm_pipeline.hpp"

namespace {

using cclz::DataType;
using cclz::ReduceOp;
namespace kernels = cclz::kernels;

constexpr std::size_t kSizes[] = {4u << 10, 256u << 10, 64u << 20};

std::string size_name(std::size_t bytes) {
  if (bytes >= (1u << 20)) return std::to_string(bytes >> 20) + "MB";
  return std::to_string(bytes >> 10) + "KB";
}

// Finite, normal, non-growing values (denormal f32 arithmetic would measure
// microcode assists, not the kernel): 1 + small fraction, in the buffer's type.
void fill(unsigned char* buf, std::size_t bytes, DataType dt, unsigned seed) {
  const std::size_t es = cclz::dtype_size(dt);
  const std::size_t n = bytes / es;
  std::uint32_t x = seed * 2654435761u + 1;
  for (std::size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    const float v = 1.0f + static_cast<float>(x >> 24) / 1024.0f;
    unsigned char* p = buf + i * es;
    switch (dt) {
      case DataType::f32: std::memcpy(p, &v, 4); break;
      case DataType::f64: {
        const double d = v;
        std::memcpy(p, &d, 8);
        break;
      }
      case DataType::f16: {
        const std::uint16_t h = kernels::float_to_half(v);
        std::memcpy(p, &h, 2);
        break;
      }
      case DataType::bf16: {
        const std::uint16_t h = kernels::float_to_bf16(v);
        std::memcpy(p, &h, 2);
        break;
      }
      case DataType::i8:
      case DataType::u8: *p = static_cast<unsigned char>(x >> 24); break;
      case DataType::i32: {
        const std::uint32_t u = x;
        std::memcpy(p, &u, 4);
        break;
      }
      case DataType::i64: {
        const std::uint64_t u = (static_cast<std::uint64_t>(x) << 32) | (x ^ 0x9e3779b9u);
        std::memcpy(p, &u, 8);
        break;
      }
    }
  }
}

// Streams live in one page-aligned arena, each at a different offset modulo
// 4 KiB (multiples of 64 + 320 j bytes). Separate vectors would sit at
// whatever offsets malloc picks, and when a load address and an earlier
// store address agree in their low 12 bits the core stalls ("4K aliasing"):
// memcpy of 4 KiB measured 2-3x slower from that alone.
class Arena {
 public:
  Arena(std::size_t streams, std::size_t bytes)
      : stride_(round_up(bytes + 4096)), mem_(streams * stride_ + 4096) {
    base_ = mem_.data() + (4096 - reinterpret_cast<std::uintptr_t>(mem_.data()) % 4096) % 4096;
  }
  unsigned char* stream(std::size_t j) { return base_ + j * stride_ + (j * 320) % 4096; }

 private:
  static std::size_t round_up(std::size_t x) { return (x + 4095) / 4096 * 4096; }
  std::size_t stride_;
  std::vector<unsigned char> mem_;
  unsigned char* base_;
};

struct Buffers {
  Arena arena;
  unsigned char *a, *b, *d;
  Buffers(std::size_t bytes, DataType dt)
      : arena(3, bytes), a(arena.stream(0)), b(arena.stream(1)), d(arena.stream(2)) {
    fill(a, bytes, dt, 1);
    fill(b, bytes, dt, 2);
  }
};

void bm_reduce(benchmark::State& st, const kernels::Variant* v, DataType dt, ReduceOp op, std::size_t bytes) {
  Buffers buf(bytes, dt);
  const std::size_t count = bytes / cclz::dtype_size(dt);
  for (auto _ : st) {
    v->reduce(buf.d, buf.a, buf.b, count, dt, op);
    benchmark::DoNotOptimize(buf.d);
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * 3 * static_cast<std::int64_t>(bytes));
}

// In place (dst == a), the form ring algorithms use when reducing into their
// own buffer: 2 reads + 1 write as well.
void bm_reduce_inplace(benchmark::State& st, DataType dt, std::size_t bytes) {
  Buffers buf(bytes, dt);
  const std::size_t count = bytes / cclz::dtype_size(dt);
  // max keeps values bounded however many iterations run.
  for (auto _ : st) {
    kernels::reduce(buf.a, buf.a, buf.b, count, dt, ReduceOp::max);
    benchmark::DoNotOptimize(buf.a);
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * 3 * static_cast<std::int64_t>(bytes));
}

// memcpy of the whole buffer, and the large copies as the node-local
// pipelines make them (shm_pipeline.hpp), four pages side by side: memory
// to memory with streaming stores (copy_stream), and a source in memory
// into a 512 KiB slot that stays in the cache, a slot's worth at a time
// (copy_in, beside memcpy doing the same). `offset`: source and destination
// that many bytes past a line, as a program's arrays may be. And the
// kernel's copy (cma_read): one process_vm_readv of the whole buffer, the
// way a heap call's peer blocks cross between processes
// (collectives/shm_direct.cpp); read from this process, which takes the
// kernel's same path (it pins each page of the source, then copies it).
enum class Copy { memcpy, stream, in, memcpy_in, kernel };
void bm_copy(benchmark::State& st, Copy kind, std::size_t bytes, std::size_t offset) {
  constexpr std::size_t kSlot = std::size_t{512} << 10;
  Arena arena(2, bytes + offset);
  unsigned char* src = arena.stream(0) + offset;
  unsigned char* dst = arena.stream(1) + offset;
  std::memset(src, 1, bytes);
  std::memset(dst, 0, bytes);
  for (auto _ : st) {
    if (kind == Copy::memcpy) {
      std::memcpy(dst, src, bytes);
    } else if (kind == Copy::stream) {
      cclz::coll::shm::copy_stream(dst, src, bytes);
    } else if (kind == Copy::kernel) {
      iovec local{dst, bytes};
      iovec remote{src, bytes};
      if (process_vm_readv(getpid(), &local, 1, &remote, 1, 0) != static_cast<ssize_t>(bytes)) {
        st.SkipWithError("process_vm_readv did not copy the whole buffer");
        break;
      }
    } else {
      for (std::size_t o = 0; o < bytes; o += kSlot) {
        (kind == Copy::in ? cclz::coll::shm::copy_in : cclz::coll::shm::copy)(dst, src + o, std::min(kSlot, bytes - o));
      }
    }
    benchmark::DoNotOptimize(dst);
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * 2 * static_cast<std::int64_t>(bytes));
}

// k inputs into one output: fused single pass vs the chain of reduce() calls
// an algorithm would otherwise make.
// v: one instruction-set variant's reduce_many (isa/<variant>/reduce_many/...),
// or nullptr for the library's choice.
void bm_many(benchmark::State& st, DataType dt, std::size_t k, std::size_t bytes, bool fused,
             const kernels::Variant* v) {
  Arena arena(k + 1, bytes);
  std::vector<const void*> ptrs;
  for (std::size_t s = 0; s < k; ++s) {
    fill(arena.stream(s), bytes, dt, static_cast<unsigned>(s + 1));
    ptrs.push_back(arena.stream(s));
  }
  unsigned char* d = arena.stream(k);
  std::memset(d, 0, bytes);
  const std::size_t count = bytes / cclz::dtype_size(dt);
  for (auto _ : st) {
    if (v != nullptr) {
      v->reduce_many(d, nullptr, ptrs.data(), k, count, dt, ReduceOp::sum);
    } else if (fused) {
      kernels::reduce_many(d, ptrs, count, dt, ReduceOp::sum);
    } else {
      kernels::reduce(d, ptrs[0], ptrs[1], count, dt, ReduceOp::sum);
      for (std::size_t s = 2; s < k; ++s) kernels::reduce(d, d, ptrs[s], count, dt, ReduceOp::sum);
    }
    benchmark::DoNotOptimize(d);
    benchmark::ClobberMemory();
  }
  const std::int64_t streams = fused ? static_cast<std::int64_t>(k + 1) : 3 * static_cast<std::int64_t>(k - 1);
  st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * streams * static_cast<std::int64_t>(bytes));
}

// Two inputs into two outputs (the direct all-reduce's own and the peer's
// output): reduce_many_copy's one pass against reduce() and a memcpy. In
// place the outputs are the inputs, as in an in-place all-reduce: the same
// lines are read and written, half the traffic of four streams.
void bm_two_outputs(benchmark::State& st, DataType dt, std::size_t bytes, bool fused, bool in_place) {
  Arena arena(4, bytes);
  fill(arena.stream(0), bytes, dt, 1);
  fill(arena.stream(1), bytes, dt, 2);
  const void* srcs[] = {arena.stream(0), arena.stream(1)};
  unsigned char* d = in_place ? arena.stream(0) : arena.stream(2);
  unsigned char* c = in_place ? arena.stream(1) : arena.stream(3);
  const std::size_t count = bytes / cclz::dtype_size(dt);
  for (auto _ : st) {
    if (fused) {
      kernels::reduce_many_copy(d, c, srcs, count, dt, ReduceOp::sum);
    } else {
      kernels::reduce(d, srcs[0], srcs[1], count, dt, ReduceOp::sum);
      std::memcpy(c, d, bytes);
    }
    benchmark::DoNotOptimize(d);
    benchmark::DoNotOptimize(c);
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * 4 * static_cast<std::int64_t>(bytes));
}

// k inputs into two outputs, as a staged streamed all-reduce writes its
// reduced share to its slot and its output, a `piece` at a time. Slots
// through memory: both outputs streamed, by reduce_many_stream in one pass
// or (two_pass) as the all-reduce does where that kernel declines,
// reduce_many into a buffer in the cache and then shm::copy_and_stream.
// `slot_in_cache`: a `piece`-sized slot stored ordinarily (its peers read it
// from this cache) and the output streamed, by reduce_many_stream with dst
// not streamed, or (two_pass) reduce_many into the slot and
// shm::copy_stream from there. k reads and two writes counted.
void bm_many_streamed(benchmark::State& st, DataType dt, std::size_t k, std::size_t bytes, std::size_t piece,
                      bool two_pass, bool slot_in_cache) {
  Arena arena(k + 2, bytes);
  std::vector<const void*> ptrs(k);
  for (std::size_t s = 0; s < k; ++s) fill(arena.stream(s), bytes, dt, static_cast<unsigned>(s + 1));
  std::vector<unsigned char> scratch(piece + 64);
  unsigned char* buf = scratch.data() + (64 - reinterpret_cast<std::uintptr_t>(scratch.data()) % 64) % 64;
  const std::size_t es = cclz::dtype_size(dt);
  unsigned char* d = arena.stream(k);
  unsigned char* c = arena.stream(k + 1);
  for (auto _ : st) {
    for (std::size_t o = 0; o < bytes; o += piece) {
      const std::size_t n = std::min(piece, bytes - o);
      for (std::size_t s = 0; s < k; ++s) ptrs[s] = arena.stream(s) + o;
      unsigned char* slot = slot_in_cache ? buf : d + o;
      if (two_pass) {
        kernels::reduce_many(buf, ptrs, n / es, dt, ReduceOp::sum);
        if (slot_in_cache) {
          cclz::coll::shm::copy_stream(c + o, buf, n);
        } else {
          cclz::coll::shm::copy_and_stream(slot, c + o, buf, n, true);
        }
      } else if (!kernels::reduce_many_stream(slot, c + o, ptrs, n / es, dt, ReduceOp::sum, !slot_in_cache)) {
        st.SkipWithError("reduce_many_stream has no kernel on this CPU");
        return;
      }
    }
    benchmark::DoNotOptimize(d);
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * static_cast<std::int64_t>(k + 2) *
                       static_cast<std::int64_t>(bytes));
}

// bytes = size of the f32 side; the 16-bit side is half of it.
void bm_convert(benchmark::State& st, const kernels::Variant* v, bool bf16, bool to_float, std::size_t bytes) {
  const std::size_t n = bytes / 4;
  std::vector<float> f(n);
  std::vector<std::uint16_t> h(n);
  for (std::size_t i = 0; i < n; ++i) f[i] = 1.0f + static_cast<float>(i % 1000) / 3.0f;
  v->float_to_half(f.data(), h.data(), n);
  for (auto _ : st) {
    if (to_float) {
      (bf16 ? v->bf16_to_float : v->half_to_float)(h.data(), f.data(), n);
    } else {
      (bf16 ? v->float_to_bf16 : v->float_to_half)(f.data(), h.data(), n);
    }
    benchmark::DoNotOptimize(f.data());
    benchmark::DoNotOptimize(h.data());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * static_cast<std::int64_t>(n * 6));
}

// avg's divide step in place. Divisors 1 and -1 keep the values as they
// are from one iteration to the next (a divisor of 2 would run them into
// subnormals) and take the two loops: 1, a power of two, multiplies by its
// reciprocal; -1 divides. Bytes: read and write of the buffer.
void bm_divide(benchmark::State& st, const kernels::Variant* v, DataType dt, int divisor, std::size_t bytes) {
  Buffers buf(bytes, dt);
  const std::size_t count = bytes / cclz::dtype_size(dt);
  for (auto _ : st) {
    v->divide(buf.a, count, dt, divisor);
    benchmark::DoNotOptimize(buf.a);
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * 2 * static_cast<std::int64_t>(bytes));
}

void register_all() {
  const kernels::Variant* best = &kernels::best_variant();
  for (std::size_t bytes : kSizes) {
    const std::string sz = size_name(bytes);
    benchmark::RegisterBenchmark(("memcpy/" + sz).c_str(), bm_copy, Copy::memcpy, bytes, 0);
    for (std::size_t offset : {std::size_t{0}, std::size_t{16}}) {
      std::string name = "copy_stream/" + sz;
      if (offset != 0) name += "+16";
      benchmark::RegisterBenchmark(name.c_str(), bm_copy, Copy::stream, bytes, offset);
    }
    benchmark::RegisterBenchmark(("cma_read/" + sz).c_str(), bm_copy, Copy::kernel, bytes, 0);
    if (bytes > (std::size_t{512} << 10)) {
      benchmark::RegisterBenchmark(("copy_in/" + sz).c_str(), bm_copy, Copy::in, bytes, 0);
      benchmark::RegisterBenchmark(("memcpy_in/" + sz).c_str(), bm_copy, Copy::memcpy_in, bytes, 0);
    }
    for (DataType dt : cclz::kAllDataTypes) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max}) {
        const std::string name =
            std::string("reduce/") + cclz::dtype_name(dt) + "/" + cclz::op_name(op) + "/" + sz;
        benchmark::RegisterBenchmark(name.c_str(), bm_reduce, best, dt, op, bytes);
      }
    }
  }
  // Every ISA variant the CPU has, sum only, for the table of speed-ups.
  for (kernels::Isa isa : kernels::kAllIsas) {
    const kernels::Variant* v = kernels::variant(isa);
    if (v == nullptr) continue;
    for (std::size_t bytes : kSizes) {
      for (DataType dt : {DataType::f32, DataType::f16, DataType::bf16, DataType::i32, DataType::i8}) {
        const std::string name = std::string("isa/") + kernels::isa_name(isa) + "/reduce/" + cclz::dtype_name(dt) +
                                 "/sum/" + size_name(bytes);
        benchmark::RegisterBenchmark(name.c_str(), bm_reduce, v, dt, ReduceOp::sum, bytes);
      }
      for (DataType dt : {DataType::f32, DataType::f16, DataType::bf16}) {
        const std::string name = std::string("isa/") + kernels::isa_name(isa) + "/reduce_many/" +
                                 cclz::dtype_name(dt) + "/sum/k4/" + size_name(bytes);
        benchmark::RegisterBenchmark(name.c_str(), bm_many, dt, std::size_t{4}, bytes, true, v);
      }
      for (DataType dt : {DataType::f32, DataType::f16, DataType::bf16}) {
        for (int divisor : {1, -1}) {
          const std::string name = std::string("isa/") + kernels::isa_name(isa) + "/divide/" +
                                   cclz::dtype_name(dt) + (divisor == 1 ? "/mul/" : "/div/") + size_name(bytes);
          benchmark::RegisterBenchmark(name.c_str(), bm_divide, v, dt, divisor, bytes);
        }
      }
      for (bool bf16 : {false, true}) {
        for (bool to_float : {true, false}) {
          const std::string name = std::string("isa/") + kernels::isa_name(isa) + "/convert/" +
                                   (to_float ? (bf16 ? "bf16_to_f32/" : "f16_to_f32/")
                                             : (bf16 ? "f32_to_bf16/" : "f32_to_f16/")) +
                                   size_name(bytes);
          benchmark::RegisterBenchmark(name.c_str(), bm_convert, v, bf16, to_float, bytes);
        }
      }
    }
  }
  for (std::size_t bytes : kSizes) {
    for (DataType dt : {DataType::f32, DataType::f16, DataType::bf16}) {
      benchmark::RegisterBenchmark(
          (std::string("reduce_inplace/") + cclz::dtype_name(dt) + "/max/" + size_name(bytes)).c_str(),
          bm_reduce_inplace, dt, bytes);
      for (bool fused : {true, false}) {
        const std::string name = std::string(fused ? "reduce_many/" : "reduce_chain/") + cclz::dtype_name(dt) +
                                 "/sum/k4/" + size_name(bytes);
        benchmark::RegisterBenchmark(name.c_str(), bm_many, dt, std::size_t{4}, bytes, fused, nullptr);
      }
      for (bool fused : {true, false}) {
        const std::string name = std::string(fused ? "reduce_many_copy/" : "reduce_then_copy/") +
                                 cclz::dtype_name(dt) + "/sum/" + size_name(bytes);
        benchmark::RegisterBenchmark(name.c_str(), bm_two_outputs, dt, bytes, fused, false);
      }
      benchmark::RegisterBenchmark(
          (std::string("reduce_many_copy_inplace/") + cclz::dtype_name(dt) + "/sum/" + size_name(bytes)).c_str(),
          bm_two_outputs, dt, bytes, true, true);
      for (std::size_t k : {std::size_t{2}, std::size_t{4}}) {
        if (k > 2 && dt != DataType::f32) continue;  // halves take two sources (kernels.hpp)
        for (bool two_pass : {false, true}) {
          const std::string name = std::string(two_pass ? "reduce_then_stream/" : "reduce_many_stream/") +
                                   cclz::dtype_name(dt) + "/sum/k" + std::to_string(k) + "/" + size_name(bytes);
          benchmark::RegisterBenchmark(name.c_str(), bm_many_streamed, dt, k, bytes, std::size_t{256} << 10, two_pass,
                                       false);
          const std::string slot_name = std::string(two_pass ? "reduce_slot_then_stream/" : "reduce_slot_stream/") +
                                        cclz::dtype_name(dt) + "/sum/k" + std::to_string(k) + "/" + size_name(bytes);
          benchmark::RegisterBenchmark(slot_name.c_str(), bm_many_streamed, dt, k, bytes, std::size_t{256} << 10,
                                       two_pass, true);
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("kernels_isa", kernels::isa_name(kernels::best_variant().isa));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
