// Byte-level text corpus for the trainers: every byte is a token (vocab 256).
// The default corpus is the licence texts Debian ships on every machine,
// /usr/share/common-licenses: its regular files concatenated in name order
// (symbolic links are skipped: GPL, LGPL and GFDL point at versioned files
// already included, and duplicated text would leak into the validation
// split). About 237 KB on Debian 12. --data FILE takes any file instead.
//
// Split: the last val_fraction of the bytes is validation, the rest
// training; contiguous, so no window straddles both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cclz/types.hpp"

namespace cclz::train {

inline constexpr const char* kDefaultCorpusDir = "/usr/share/common-licenses";

struct Corpus {
  std::vector<std::uint8_t> bytes;
  std::string source;  // the path, or "DIR (N files)"
};

Status load_corpus_file(const std::string& path, Corpus* out);
Status load_corpus_dir(const std::string& dir, Corpus* out);
inline Status load_default_corpus(Corpus* out) { return load_corpus_dir(kDefaultCorpusDir, out); }

struct DataSplit {
  std::span<const std::uint8_t> train;
  std::span<const std::uint8_t> val;  // empty when val_fraction is 0
};
// val_fraction in [0, 0.5]; each non-empty part must hold at least one
// window of context + 1 bytes, or the error says how long each part is.
Status split_corpus(const Corpus& corpus, double val_fraction, int context, DataSplit* out);

// 64-bit FNV-1a of the bytes: identifies a corpus in a sampler's state.
std::uint64_t fingerprint(std::span<const std::uint8_t> bytes) noexcept;

}  // namespace cclz::train
