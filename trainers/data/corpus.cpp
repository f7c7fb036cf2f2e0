// Corpus loading (one file, or a directory's regular files in name order)
// and the train/validation split; see corpus.hpp.
#include "data/corpus.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <new>
#include <system_error>

namespace cclz::train {

namespace {

// Appends the file's bytes to out.
Status append_file(const std::string& path, std::vector<std::uint8_t>* out) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return {Result::invalid_argument, "data: cannot open '" + path + "': " + std::strerror(errno)};
  std::uint8_t buf[1 << 16];
  Status st;
  try {
    for (;;) {
      const std::size_t n = std::fread(buf, 1, sizeof buf, f);
      out->insert(out->end(), buf, buf + n);
      if (n < sizeof buf) {
        if (std::ferror(f)) st = {Result::system_error, "data: error reading '" + path + "'"};
        break;
      }
    }
  } catch (const std::bad_alloc&) {
    st = {Result::system_error, "data: out of memory reading '" + path + "'"};
  }
  std::fclose(f);
  return st;
}

}  // namespace

Status load_corpus_file(const std::string& path, Corpus* out) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    return {Result::invalid_argument, "data: file '" + path + "' does not exist"};
  if (std::filesystem::is_directory(path, ec))
    return {Result::invalid_argument, "data: '" + path + "' is a directory, want a text file"};
  Corpus c;
  c.source = path;
  if (Status s = append_file(path, &c.bytes); !s.ok()) return s;
  if (c.bytes.empty()) return {Result::invalid_argument, "data: file '" + path + "' is empty"};
  *out = std::move(c);
  return {};
}

Status load_corpus_dir(const std::string& dir, Corpus* out) {
  std::error_code ec;
  std::vector<std::string> names;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec) return {Result::invalid_argument, "data: cannot list '" + dir + "': " + ec.message()};
  for (const auto& e : it) {
    if (e.is_symlink(ec) || !e.is_regular_file(ec)) continue;
    names.push_back(e.path().filename().string());
  }
  if (names.empty()) return {Result::invalid_argument, "data: no regular files in '" + dir + "'"};
  std::sort(names.begin(), names.end());  // byte order of the names: independent of the locale
  Corpus c;
  for (const std::string& n : names) {
    if (Status s = append_file(dir + "/" + n, &c.bytes); !s.ok()) return s;
  }
  if (c.bytes.empty()) return {Result::invalid_argument, "data: the files in '" + dir + "' are all empty"};
  c.source = dir + " (" + std::to_string(names.size()) + " files)";
  *out = std::move(c);
  return {};
}

Status split_corpus(const Corpus& corpus, double val_fraction, int context, DataSplit* out) {
  if (!(val_fraction >= 0.0 && val_fraction <= 0.5)) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "data: validation fraction %g outside [0, 0.5]", val_fraction);
    return {Result::invalid_argument, buf};
  }
  if (context < 1) return {Result::invalid_argument, "data: context must be at least 1"};
  const std::size_t n = corpus.bytes.size();
  const std::size_t n_val = static_cast<std::size_t>(static_cast<double>(n) * val_fraction);
  const std::size_t n_train = n - n_val;
  const std::size_t need = static_cast<std::size_t>(context) + 1;
  if (n_train < need || (val_fraction > 0.0 && n_val < need)) {
    return {Result::invalid_argument,
            "data: corpus " + corpus.source + " has " + std::to_string(n) + " bytes, too short for context " +
                std::to_string(context) + ": the training part has " + std::to_string(n_train) +
                " and the validation part " + std::to_string(n_val) + " bytes, and each needs at least context + 1 = " +
                std::to_string(need)};
  }
  const std::span<const std::uint8_t> all(corpus.bytes);
  out->train = all.first(n_train);
  out->val = all.subspan(n_train);
  return {};
}

std::uint64_t fingerprint(std::span<const std::uint8_t> bytes) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::uint8_t b : bytes) {
    h ^= b;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace cclz::train
