// Magnitude selection for the sparsifiers (top-k, DGC, threshold).
//
// Exact top-k is a most-significant-digit radix select on the bit pattern of
// |x| (31 bits: 11 + 11 + 9): one histogram pass over x, one pass that
// copies the keys of the one top-level bucket holding the k-th largest, two
// small passes over those candidates, and one pass collecting every element
// above the k-th key (ties at it by ascending index). O(n), three reads of x.
//
// On large tensors a prefilter comes first: a stratified sample gives a
// threshold that about 1.5k elements exceed, one vectorised scan collects
// those (ascending index), and the radix select runs on their keys alone.
// Every element at or above the k-th largest key is then a candidate (there
// are at least k candidates, so the k-th key is >= the threshold), so the
// result is identical to the full select; the sample decides only the
// speed. Fewer than k candidates, or more than 3k (many equal keys), fall
// back to the full select. The histogram pass with its scattered increments
// was most of the time; the scan reads x at close to copy speed.
//
// The sampled variant is Deep Gradient Compression's (Lin et al. 2018,
// section 3 and its released code): the threshold is the order statistic of
// a random sample that matches k/n, so one pass over x selects; the count is
// accepted when it lies in [0.8k, 1.3k], otherwise the exact select runs.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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
// returns false. Blocks of 16 are tested as a whole: with SSE2 (baseline
// x86-64) four compares of |x| < tf as floats give a 16-bit mask of the
// elements that may qualify, and only its set bits are visited; at the
// densities sparsifiers use most blocks hold nothing. Float order is the
// key order for every non-NaN; a NaN fails `<` and is then settled by its
// key, as is every candidate. (Integer compares of the keys did not
// vectorise on baseline x86-64, and a per-element loop over every block
// with a hit cost as much as the rest of the encode.)
template <class Emit>
void scan_at_least(const float* x, std::size_t n, std::uint32_t thr, Emit emit) {
  constexpr std::size_t kBlock = 16;
  const auto t = static_cast<std::int32_t>(thr);
  std::size_t i = 0;
#if defined(__SSE2__)
  float tf;
  std::memcpy(&tf, &thr, 4);
  const __m128 tv = _mm_set1_ps(tf);
  const __m128 absmask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
  for (; i + kBlock <= n; i += kBlock) {
    unsigned mask = 0;
    for (unsigned q = 0; q < kBlock / 4; ++q) {
      const __m128 v = _mm_and_ps(_mm_loadu_ps(x + i + 4 * q), absmask);
      mask |= static_cast<unsigned>(_mm_movemask_ps(_mm_cmpnlt_ps(v, tv))) << (4 * q);
    }
    while (mask != 0) {
      const std::size_t j = i + static_cast<std::size_t>(__builtin_ctz(mask));
      mask &= mask - 1;
      if (static_cast<std::int32_t>(mag_key(x[j])) >= t && !emit(j)) return;
    }
  }
#endif
  for (; i < n; ++i) {
    if (static_cast<std::int32_t>(mag_key(x[i])) >= t && !emit(i)) return;
  }
}

// The k-th largest of m keys (1 <= k <= m) by the same three-level radix
// select; *ties receives how many elements equal to it are taken (the
// first ones by position).
std::uint32_t kth_largest_key(const std::uint32_t* keys, std::size_t m, std::size_t k, std::size_t* ties) {
  std::vector<std::uint32_t> h((1u << kBits1) + (1u << kBits2) + (1u << kBits3), 0);
  std::uint32_t* h1 = h.data();
  std::uint32_t* h2 = h1 + (1u << kBits1);
  std::uint32_t* h3 = h2 + (1u << kBits2);
  for (std::size_t j = 0; j < m; ++j) ++h1[keys[j] >> kShift1];
  std::size_t need = k;
  const std::uint32_t b1 = find_bucket(h1, 1u << kBits1, &need);
  for (std::size_t j = 0; j < m; ++j) {
    if ((keys[j] >> kShift1) == b1) ++h2[(keys[j] >> kShift2) & kMask2];
  }
  const std::uint32_t hi2 = (b1 << kBits2) | find_bucket(h2, 1u << kBits2, &need);
  for (std::size_t j = 0; j < m; ++j) {
    if ((keys[j] >> kShift2) == hi2) ++h3[keys[j] & kMask3];
  }
  const std::uint32_t kth = (hi2 << kBits3) | find_bucket(h3, 1u << kBits3, &need);
  *ties = need;
  return kth;
}

// The prefiltered select (see the top of the file). False when the sample's
// threshold did not bracket the k-th key; *idx is then unspecified.
bool topk_prefiltered(const float* xp, std::size_t n, std::size_t k, SelectScratch& scratch,
                      std::vector<std::uint32_t>* idx) {
  // About 600 sampled elements above the threshold: the candidate count's
  // relative spread is then a few percent (more than 1/sqrt(600): the
  // sample comes in runs of 16 neighbours), so 1.5k stays far inside
  // [k, 3k]. Runs of 16 floats are one cache line each: a sample of
  // isolated elements cost a cache miss per element, more than the scan.
  constexpr std::size_t kRun = 16;
  const std::size_t s = std::max<std::size_t>(2048, (600 * n + k - 1) / k) / kRun * kRun;
  if (s * 8 > n) return false;  // the sample would cost a good part of a pass
  std::vector<std::uint32_t>& sample = scratch.sample;
  sample.resize(s);
  Rng rng(0x746f706b ^ n);  // any fixed seed: the result does not depend on it
  const std::size_t runs = s / kRun, stride = n / runs;  // stride >= 8 * kRun
  for (std::size_t r = 0; r < runs; ++r) {
    const std::size_t at = r * stride + rng.below(static_cast<std::uint32_t>(stride - kRun + 1));
    for (std::size_t j = 0; j < kRun; ++j) sample[r * kRun + j] = mag_key(xp[at + j]);
  }
  const std::size_t ks = std::min(s, (3 * k * s + 2 * n - 1) / (2 * n));  // the 1.5k-th largest, scaled
  std::nth_element(sample.begin(), sample.begin() + static_cast<std::ptrdiff_t>(ks - 1), sample.end(),
                   std::greater<>());
  const std::uint32_t thr = sample[ks - 1];

  std::vector<std::uint32_t>& cand = scratch.cand;  // candidate indices, ascending
  const std::size_t cap = 3 * k;
  cand.resize(cap);
  std::size_t m = 0;
  scan_at_least(xp, n, thr, [&](std::size_t i) {
    if (m == cap) {
      m = cap + 1;
      return false;
    }
    cand[m++] = static_cast<std::uint32_t>(i);
    return true;
  });
  if (m < k || m > cap) return false;

  std::vector<std::uint32_t>& keys = scratch.keys;
  keys.resize(m);
  for (std::size_t j = 0; j < m; ++j) keys[j] = mag_key(xp[cand[j]]);
  std::size_t ties = 0;
  const std::uint32_t kth = kth_largest_key(keys.data(), m, k, &ties);
  idx->resize(k);
  std::uint32_t* out = idx->data();
  std::size_t c = 0;
  for (std::size_t j = 0; j < m; ++j) {
    if (keys[j] > kth) {
      out[c++] = cand[j];
    } else if (keys[j] == kth && ties != 0) {
      --ties;
      out[c++] = cand[j];
    }
  }
  return c == k;
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
  if (topk_prefiltered(xp, n, k, scratch, idx)) return;
  idx->resize(k);
  out = idx->data();

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
