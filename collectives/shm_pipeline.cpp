#include "shm_pipeline.hpp"

#include <atomic>
#include <chrono>

#include "kernels.hpp"
#include "shm_direct.hpp"

#if defined(__x86_64__)
#include <cpuid.h>
#include <emmintrin.h>
#include <immintrin.h>
#include <x86intrin.h>
#endif

namespace cclz::coll::shm {

Status sig_mismatch(const Group& g, int peer, const detail::ShmWindow::CallSig& mine,
                    const detail::ShmWindow::CallSig& theirs) {
  auto describe = [](const detail::ShmWindow::CallSig& s) {
    const auto kind = static_cast<CollKind>(s.shape & 0xff);
    return std::string(coll_name(kind)) + " #" + std::to_string(s.seq / 2) + " of " + std::to_string(s.count) +
           " x " + dtype_name(static_cast<DataType>((s.shape >> 8) & 0xff)) + " (op " +
           std::to_string((s.shape >> 16) & 0xff) + ", root " + std::to_string((s.shape >> 24) & 0xffffffff) + ")";
  };
  return {Result::invalid_usage, "ranks disagree on the call: this rank runs " + describe(mine) + ", rank " +
                                     std::to_string(g.global_rank(peer)) + " runs " + describe(theirs)};
}

namespace {

// Large copies on the hosts measured here are bound by how many lines one
// core has in flight, not by the memory: a copy that walks kStreams pages
// side by side, a line from each in turn, keeps the prefetchers of several
// pages busy at once. One core copying 256 MB with SSE loops
// (docs/performance-log.md, "Copies four pages at a time"): with streaming
// stores 8.8 -> 11.8 GB/s (glibc's memcpy 10.2-11.7); into a 256 KiB slot
// in the cache 9.7 -> 14.4, about what glibc's `rep movsb` does there.
constexpr std::size_t kPage = 4096;
constexpr std::size_t kStreams = 4;
constexpr std::size_t kInterleaved = kStreams * kPage;

#if defined(__x86_64__)
// One 64-byte line from src + at to out + at (streaming stores, `out`
// on a line there) and, with kToSlot, to slot + at.
template <bool kStream, bool kToSlot, bool kSlotStreamed>
inline void line(std::byte* slot, std::byte* out, const std::byte* src, std::size_t at) noexcept {
  __m128i v[4];
  for (int k = 0; k < 4; ++k) v[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + at + 16 * k));
  if constexpr (kToSlot && kSlotStreamed) {
    for (int k = 0; k < 4; ++k) _mm_stream_si128(reinterpret_cast<__m128i*>(slot + at + 16 * k), v[k]);
  } else if constexpr (kToSlot) {
    for (int k = 0; k < 4; ++k) _mm_storeu_si128(reinterpret_cast<__m128i*>(slot + at + 16 * k), v[k]);
  }
  for (int k = 0; k < 4; ++k) {
    auto* o = reinterpret_cast<__m128i*>(out + at + 16 * k);
    if constexpr (kStream) {
      _mm_stream_si128(o, v[k]);
    } else {
      _mm_storeu_si128(o, v[k]);
    }
  }
}

// line() with two 256-bit vectors. Streaming stores of a quarter line
// each, four lines open at once (one a page), ran at about half this speed
// on a Zen 5 host: 2 processes each streaming 64 MB out of the cache,
// 8.5-11.1 against 16.4-18.6 GB/s a process (docs/performance-log.md).
template <bool kStream, bool kToSlot, bool kSlotStreamed>
__attribute__((target("avx2"))) inline void line_avx2(std::byte* slot, std::byte* out, const std::byte* src,
                                                     std::size_t at) noexcept {
  __m256i v[2];
  for (int k = 0; k < 2; ++k) v[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + at + 32 * k));
  if constexpr (kToSlot && kSlotStreamed) {
    for (int k = 0; k < 2; ++k) _mm256_stream_si256(reinterpret_cast<__m256i*>(slot + at + 32 * k), v[k]);
  } else if constexpr (kToSlot) {
    for (int k = 0; k < 2; ++k) _mm256_storeu_si256(reinterpret_cast<__m256i*>(slot + at + 32 * k), v[k]);
  }
  for (int k = 0; k < 2; ++k) {
    auto* o = reinterpret_cast<__m256i*>(out + at + 32 * k);
    if constexpr (kStream) {
      _mm256_stream_si256(o, v[k]);
    } else {
      _mm256_storeu_si256(o, v[k]);
    }
  }
}

// The whole lines of [from, n), kStreams pages side by side while they
// last, each moved by Line; returns where the whole lines end. Inlined
// into each entry below, so that the AVX2 one inlines its lines too.
template <auto Line>
[[gnu::always_inline]] inline std::size_t walk(std::byte* slot, std::byte* out, const std::byte* src,
                                               std::size_t from, std::size_t n) noexcept {
  std::size_t i = from;
  for (; i + kInterleaved <= n; i += kInterleaved) {
    for (std::size_t j = 0; j < kPage; j += 64) {
      for (std::size_t k = 0; k < kStreams; ++k) Line(slot, out, src, i + k * kPage + j);
    }
  }
  for (; i + 64 <= n; i += 64) Line(slot, out, src, i);
  return i;
}
template <bool kStream, bool kToSlot, bool kSlotStreamed>
std::size_t lines_sse(std::byte* slot, std::byte* out, const std::byte* src, std::size_t from,
                      std::size_t n) noexcept {
  return walk<line<kStream, kToSlot, kSlotStreamed>>(slot, out, src, from, n);
}
template <bool kStream, bool kToSlot, bool kSlotStreamed>
__attribute__((target("avx2"))) std::size_t lines_avx2(std::byte* slot, std::byte* out, const std::byte* src,
                                                       std::size_t from, std::size_t n) noexcept {
  return walk<line_avx2<kStream, kToSlot, kSlotStreamed>>(slot, out, src, from, n);
}
// Once, at load (before libgcc's own initialiser may have run, hence the
// init).
const bool has_avx2 = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") != 0;
}();
std::atomic<bool> wide_lines{has_avx2};

template <bool kStream, bool kToSlot = false, bool kSlotStreamed = false>
std::size_t lines(std::byte* slot, std::byte* out, const std::byte* src, std::size_t from, std::size_t n) noexcept {
  if (wide_lines.load(std::memory_order_relaxed)) {
    return lines_avx2<kStream, kToSlot, kSlotStreamed>(slot, out, src, from, n);
  }
  return lines_sse<kStream, kToSlot, kSlotStreamed>(slot, out, src, from, n);
}

// `rep movsb` where the CPU has fast short strings (FSRM). Copies of 1-2
// KiB into or out of the slots, whose lines the peer's core holds, ran
// 20-30% faster with it than with glibc's vector loop, which glibc uses
// below about 2 KiB (0x840 on the 2-vCPU Xeon; 2 bound ranks: all-gather 4
// KB 1.45-1.52 -> 1.14-1.31 us, reduce-scatter 4 KB 1.41-1.44 ->
// 1.06-1.08, all-reduce 2 KB 1.47-1.55 -> 1.16-1.24). From 8 KiB glibc's
// own choice.
constexpr std::size_t kRepMovsbFrom = 1024, kRepMovsbTo = 8192;

bool fast_short_rep_movsb() noexcept {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) != 0 && (d & (1u << 4)) != 0;
}
const bool has_fsrm = fast_short_rep_movsb();  // once, at load
#endif

}  // namespace

bool set_wide_copies(bool wide) noexcept {
#if defined(__x86_64__)
  if (wide && !has_avx2) return false;
  wide_lines.store(wide, std::memory_order_relaxed);
  return true;
#else
  return !wide;
#endif
}

void copy(void* dst, const void* src, std::size_t n) noexcept {
#if defined(__x86_64__)
  if (n >= kRepMovsbFrom && n < kRepMovsbTo && has_fsrm) {
    asm volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
    return;
  }
#endif
  if (n != 0) std::memcpy(dst, src, n);
}

void copy_in(void* dst, const void* src, std::size_t n) noexcept {
#if defined(__x86_64__)
  if (n >= 2 * kInterleaved) {
    auto* out = static_cast<std::byte*>(dst);
    const auto* from = static_cast<const std::byte*>(src);
    const std::size_t end = lines<false>(nullptr, out, from, 0, n);
    std::memcpy(out + end, from + end, n - end);
    return;
  }
#endif
  copy(dst, src, n);
}

namespace {

// Copies n bytes to `out` with non-temporal stores and, when `slot` is not
// null, to `slot` with ordinary ones in the same pass. Non-temporal stores
// skip the read-for-ownership of the destination lines and keep a large
// output from evicting the staging slots from the cache; the one pass reads
// a large source once (a second pass finds it evicted by the first pass's
// writes and reads it from memory again: a 64 MB all-gather on 2 ranks,
// 5.2 -> 4.3 ms). The streamed part starts on a line of `out`: the loop
// writes four pages in turn, and an output off the line boundary would
// leave two partly written lines per page open in the core's
// write-combining buffers, more than it holds, each flushed in pieces
// (buffers 16 bytes past a line, as malloc's large blocks are, 2 bound
// ranks: all-gather 16 MB 1.55-1.67 -> 1.31-1.40 ms, all-to-all 64 MB
// 11.2 -> 9.4-9.7 ms; docs/performance-log.md).
template <bool kToSlot, bool kSlotStreamed = false>
void stream_out(std::byte* slot, std::byte* out, const std::byte* src, std::size_t n) noexcept {
#if defined(__x86_64__)
  const std::size_t head = (64 - reinterpret_cast<std::uintptr_t>(out) % 64) % 64;
  if (n < head + 256) {
    if constexpr (kToSlot) copy(slot, src, n);
    copy(out, src, n);
    return;
  }
  const std::size_t end = lines<true, kToSlot, kSlotStreamed>(slot, out, src, head, n);
  // The head before the first line and the short tail.
  std::memcpy(out, src, head);
  std::memcpy(out + end, src + end, n - end);
  if constexpr (kToSlot) {
    std::memcpy(slot, src, head);
    std::memcpy(slot + end, src + end, n - end);
  }
  _mm_sfence();  // streaming stores are not ordered by the release that publishes
#else
  if constexpr (kToSlot) copy(slot, src, n);
  copy(out, src, n);
#endif
}

// reduce_divided's piece: a reduce's output and the divide's pass over it
// stay in L1.
constexpr std::size_t kDividePieceBytes = std::size_t{16} << 10;

}  // namespace

bool stream_outputs(const Group& g, std::size_t in_bytes, std::size_t out_bytes) {
  return static_cast<std::uint64_t>(g.size()) * (in_bytes + out_bytes) > g.shm()->llc_bytes();
}

bool stream_reduced(const Group& g, std::uint64_t node_bytes) { return node_bytes > 2 * g.shm()->llc_bytes(); }

std::size_t chunk_bytes(const detail::ShmWindow& w, bool stream, std::size_t call_bytes, ChunkUse use) {
  const std::size_t slot = w.slot_bytes();
  const bool cut_one_slot = use == ChunkUse::copy && w.oversubscribed();
  if (stream || (call_bytes <= slot && !cut_one_slot)) return slot;
  const auto half_l2 = static_cast<std::size_t>(w.l2_bytes() / 2);
  return std::min(slot, std::max(std::size_t{256} << 10, half_l2) / 4096 * 4096);
}

void reduce_divided(void* dst, std::span<const void* const> srcs, std::size_t count, DataType dt, ReduceOp op,
                    int divisor) {
  if (divisor == 1) return kernels::reduce_many(dst, srcs, count, dt, op);
  const std::size_t es = dtype_size(dt), piece = std::max<std::size_t>(1, kDividePieceBytes / es);
  if (count <= piece) {  // one piece: no pointers to move
    kernels::reduce_many(dst, srcs, count, dt, op);
    return kernels::divide(dst, count, dt, divisor);
  }
  std::vector<const void*> at(srcs.size());
  for (std::size_t o = 0; o < count; o += piece) {
    const std::size_t m = std::min(piece, count - o);
    for (std::size_t q = 0; q < srcs.size(); ++q) at[q] = static_cast<const std::byte*>(srcs[q]) + o * es;
    kernels::reduce_many(static_cast<std::byte*>(dst) + o * es, at, m, dt, op);
    kernels::divide(static_cast<std::byte*>(dst) + o * es, m, dt, divisor);
  }
}

void reduce_divided_stream(void* dst, std::span<const void* const> srcs, std::size_t count, DataType dt,
                           ReduceOp op, int divisor) {
  if (divisor == 1 && kernels::reduce_many_stream(dst, nullptr, srcs, count, dt, op)) return;
  const std::size_t es = dtype_size(dt), piece = std::max<std::size_t>(1, kDividePieceBytes / es);
  alignas(64) std::byte block[kDividePieceBytes];
  std::vector<const void*> at(srcs.size());
  for (std::size_t o = 0; o < count; o += piece) {
    const std::size_t m = std::min(piece, count - o);
    for (std::size_t q = 0; q < srcs.size(); ++q) at[q] = static_cast<const std::byte*>(srcs[q]) + o * es;
    reduce_divided(block, at, m, dt, op, divisor);
    copy_stream(static_cast<std::byte*>(dst) + o * es, block, m * es);
  }
}

void copy_stream(void* dst, const void* src, std::size_t n) noexcept {
  stream_out<false>(nullptr, static_cast<std::byte*>(dst), static_cast<const std::byte*>(src), n);
}

void copy_and_stream(void* slot, void* out, const void* src, std::size_t n, bool slot_streamed) noexcept {
  auto* s = static_cast<std::byte*>(slot);
  auto* o = static_cast<std::byte*>(out);
  const auto* from = static_cast<const std::byte*>(src);
  if (slot_streamed && (reinterpret_cast<std::uintptr_t>(s) - reinterpret_cast<std::uintptr_t>(o)) % 64 != 0) {
    // Both outputs' streaming stores start on a line only where they lie
    // alike within one (stream_out); the second pass finds src in the cache.
    copy_stream(s, from, n);
    copy_stream(o, from, n);
  } else if (slot_streamed) {
    stream_out<true, true>(s, o, from, n);
  } else {
    stream_out<true>(s, o, from, n);
  }
}

std::uint64_t ticks() noexcept {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
}

SlotStoreCall::SlotStoreCall(Group& g, const detail::ShmWindow::CallSig& sig, bool in_place, std::size_t bytes,
                             bool stream)
    : g_(g), stream_(stream), bytes_(bytes) {
  detail::ShmWindow& w = *g.shm();
  if (!stream) return;
  if (w.slot_stores() != 0) {
    stores_ = w.slot_stores() == 2 ? SlotStores::memory : SlotStores::cache;
    return;
  }
  state_ = &w.local_state<SlotStoreState>();
  if (g.rank() == 0) {
    band_ = SlotStoreChooser::band(sig.shape, in_place, bytes);
    bool measuring = false;
    stores_ = state_->chooser.pick(band_, &measuring);
    if (measuring && g.heap_path_timing() != nullptr) g.heap_path_timing()->stores_measured = true;
    start_ = ticks();
  } else {
    stores_ = state_->in_effect;
  }
}

void SlotStoreCall::at_stage(std::size_t c, std::uint64_t slot, int t) {
  if (state_ == nullptr || c != 0) return;
  if (t == 0 && g_.rank() == 0) g_.shm()->set_call_hint(slot, static_cast<std::uint64_t>(stores_));
  if (t == 1 && g_.rank() != 0) {
    stores_ = (g_.shm()->call_hint(0, slot) & 1) != 0 ? SlotStores::memory : SlotStores::cache;
    state_->in_effect = stores_;
  }
}

Status SlotStoreCall::finish(Status st) {
  if (state_ != nullptr && g_.rank() == 0 && st.ok() && bytes_ != 0) {
    state_->chooser.record(band_, stores_, static_cast<double>(ticks() - start_) / static_cast<double>(bytes_));
  }
  return st;
}

}  // namespace cclz::coll::shm
