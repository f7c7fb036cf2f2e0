// Magnitude selection for the sparsifiers (top-k, DGC, threshold).
//
// Exact top-k is a most-significant-digit radix select on the bit pattern of
// |x| (31 bits: 11 + 11 + 9): one histogram pass over x, one pass that
// copies the keys of the one top-level bucket holding the k-th largest, two
// small passes over those candidates, and one pass collecting every element
// above the k-th key (ties at it by ascending index). O(n), three reads of x.
//
// The sampled variant is Deep Gradient Compression's (Lin et al. 2018,
// section 3 and its released code): the threshold is the order statistic of
// a random sample that matches k/n, so one pass over x selects; the count is
// accepted when it lies in [0.8k, 1.3k], otherwise the exact select runs.
#include <algorithm>
#include <cmath>
#include <functional>

#include "compressors/common.hpp"

namespace cclz::compress {

std::size_t count_for_ratio(double ratio, std::size_t n) noexcept {
  if (n == 0) return 0;
  const double want = std::ceil(ratio * static_cast<double>(n));
  if (!(want >= 1.0)) return 1;
  if (want >= static_cast<double>(n)) return n;
  return static_cast<std::size_t>(want);
}

Band sampled_band(std::size_t k) noexcept { return {(8 * k + 9) / 10, 13 * k / 10}; }

namespace {

constexpr int kBits1 = 11, kBits2 = 11, kBits3 = 9;  // 31 bits of |x|
constexpr int kShift1 = kBits2 + kBits3, kShift2 = kBits3;
constexpr std::uint32_t kMask2 = (1u << kBits2) - 1, kMask3 = (1u << kBits3) - 1;

// Walks hist from the top bucket down; returns the bucket holding the
// need-th largest (need >= 1) and lowers need to its rank inside that bucket.
std::uint32_t find_bucket(const std::uint32_t* hist, std::uint32_t nbuckets, std::size_t* need) {
  std::size_t above = 0;
  for (std::uint32_t b = nbuckets; b-- > 0;) {
    if (above + hist[b] >= *need) {
      *need -= above;
      return b;
    }
    above += hist[b];
  }
  return 0;  // unreachable when need <= total
}

// Calls emit(i) for every i with |x[i]|'s key >= thr, ascending, until emit
// returns false. Blocks of 16 are first tested as a whole (a loop the
// compiler vectorises); at the densities sparsifiers use most blocks hold
// nothing and cost one vector compare per 4 elements instead of a branch per
// element. Keys are below 2^31, so signed compares are exact.
template <class Emit>
void scan_at_least(const float* x, std::size_t n, std::uint32_t thr, Emit emit) {
  constexpr std::size_t kBlock = 16;
  const auto t = static_cast<std::int32_t>(thr);
  std::size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    std::int32_t any = 0;
    for (std::size_t j = 0; j < kBlock; ++j) any |= static_cast<std::int32_t>(mag_key(x[i + j])) >= t;
    if (any == 0) continue;
    for (std::size_t j = i; j < i + kBlock; ++j) {
      if (static_cast<std::int32_t>(mag_key(x[j])) >= t && !emit(j)) return;
    }
  }
  for (; i < n; ++i) {
    if (static_cast<std::int32_t>(mag_key(x[i])) >= t && !emit(i)) return;
  }
}

}  // namespace

void topk_exact(std::span<const float> x, std::size_t k, SelectScratch& scratch, std::vector<std::uint32_t>* idx) {
  const std::size_t n = x.size();
  k = std::min(k, n);
  idx->resize(k);
  if (k == 0) return;
  std::uint32_t* out = idx->data();
  if (k == n) {
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::uint32_t>(i);
    return;
  }
  const float* xp = x.data();

  // Pass 1: top 11 bits. Four sub-histograms so consecutive equal keys do
  // not wait on each other's increments.
  std::vector<std::uint32_t> h4(4u << kBits1, 0);
  std::uint32_t* h0 = h4.data();
  std::uint32_t* h1 = h0 + (1u << kBits1);
  std::uint32_t* h2 = h1 + (1u << kBits1);
  std::uint32_t* h3 = h2 + (1u << kBits1);
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    ++h0[mag_key(xp[i]) >> kShift1];
    ++h1[mag_key(xp[i + 1]) >> kShift1];
    ++h2[mag_key(xp[i + 2]) >> kShift1];
    ++h3[mag_key(xp[i + 3]) >> kShift1];
  }
  for (; i < n; ++i) ++h0[mag_key(xp[i]) >> kShift1];
  for (std::uint32_t b = 0; b < (1u << kBits1); ++b) h0[b] += h1[b] + h2[b] + h3[b];
  std::size_t need = k;
  const std::uint32_t b1 = find_bucket(h0, 1u << kBits1, &need);

  // Pass 2: copy the keys in bucket b1 (branch-free: always store, advance on a match).
  std::vector<std::uint32_t>& cand = scratch.cand;
  cand.resize(std::size_t{h0[b1]} + 1);
  std::uint32_t* cp = cand.data();
  std::size_t nc = 0;
  for (i = 0; i < n; ++i) {
    const std::uint32_t key = mag_key(xp[i]);
    cp[nc] = key;
    nc += (key >> kShift1) == b1;
  }

  // Passes 3 and 4 over the candidates: the middle 11 bits, then the low 9.
  std::fill(h1, h1 + (1u << kBits2), 0u);
  for (std::size_t j = 0; j < nc; ++j) ++h1[(cp[j] >> kShift2) & kMask2];
  const std::uint32_t b2 = find_bucket(h1, 1u << kBits2, &need);
  const std::uint32_t hi2 = (b1 << kBits2) | b2;
  std::fill(h2, h2 + (1u << kBits3), 0u);
  for (std::size_t j = 0; j < nc; ++j) {
    if ((cp[j] >> kShift2) == hi2) ++h2[cp[j] & kMask3];
  }
  const std::uint32_t b3 = find_bucket(h2, 1u << kBits3, &need);
  const std::uint32_t kth = (hi2 << kBits3) | b3;
  std::size_t ties = need;  // elements equal to the k-th key that are taken

  // Pass 5: collect, ascending index.
  std::size_t c = 0;
  scan_at_least(xp, n, kth, [&](std::size_t j) {
    if (mag_key(xp[j]) > kth) {
      out[c++] = static_cast<std::uint32_t>(j);
    } else if (ties != 0) {
      --ties;
      out[c++] = static_cast<std::uint32_t>(j);
    }
    return true;
  });
}

void topk_sampled(std::span<const float> x, std::size_t k, std::uint64_t seed, SelectScratch& scratch,
                  std::vector<std::uint32_t>* idx) {
  const std::size_t n = x.size();
  k = std::min(k, n);
  if (k == 0) {
    idx->clear();
    return;
  }
  // About 400 sampled elements above the threshold: the count's relative
  // spread is then about 1/sqrt(400) = 5%, well inside the band.
  const std::size_t s = std::min(n, std::max<std::size_t>(1024, (400 * n + k - 1) / k));
  if (s * 4 >= n) {  // a sample this large saves nothing
    topk_exact(x, k, scratch, idx);
    return;
  }
  const float* xp = x.data();
  Rng rng(seed);
  std::vector<std::uint32_t>& sample = scratch.sample;
  sample.resize(s);
  for (std::size_t j = 0; j < s; ++j) sample[j] = mag_key(xp[rng.below(static_cast<std::uint32_t>(n))]);
  const std::size_t ks = std::max<std::size_t>(1, (k * s + n / 2) / n);
  std::nth_element(sample.begin(), sample.begin() + static_cast<std::ptrdiff_t>(ks - 1), sample.end(),
                   std::greater<>());
  const std::uint32_t thr = sample[ks - 1];

  const Band band = sampled_band(k);
  idx->resize(band.hi);
  std::uint32_t* out = idx->data();
  std::size_t c = 0;
  scan_at_least(xp, n, thr, [&](std::size_t i) {
    if (c == band.hi) {  // too many: the estimate was too low
      c = band.hi + 1;
      return false;
    }
    out[c++] = static_cast<std::uint32_t>(i);
    return true;
  });
  if (c < band.lo || c > band.hi) {
    topk_exact(x, k, scratch, idx);
    return;
  }
  idx->resize(c);
}

void select_at_least(std::span<const float> x, float tau, std::vector<std::uint32_t>* idx) {
  const std::uint32_t thr = mag_key(tau);
  idx->clear();
  scan_at_least(x.data(), x.size(), thr, [idx](std::size_t i) {
    idx->push_back(static_cast<std::uint32_t>(i));
    return true;
  });
}

}  // namespace cclz::compress
