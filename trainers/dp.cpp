// Data-parallel training loop (see dp.hpp).
#include "dp.hpp"

#include <cblas.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>

#include "cclz/compressed.hpp"
#include "common/rng.hpp"
#include "data/corpus.hpp"
#include "data/sampler.hpp"
#include "model/gpt.hpp"
#include "optim/clip.hpp"
#include "optim/optimizer.hpp"

namespace cclz::train {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

Status bad_flag(std::string_view flag, std::string_view value, std::string_view want) {
  return {Result::invalid_argument, "--" + std::string(flag) + " '" + std::string(value) + "': want " + std::string(want)};
}

Status int_flag(std::string_view flag, std::string_view v, int lo, int hi, int* out) {
  const std::string s(v);
  char* end = nullptr;
  const long x = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || end != s.c_str() + s.size() || x < lo || x > hi)
    return bad_flag(flag, v, "an integer in " + std::to_string(lo) + ".." + std::to_string(hi));
  *out = static_cast<int>(x);
  return {};
}

// What a dense all-reduce of `bytes` sends per rank in the bandwidth-optimal
// schedule (the model CompressedReport counts with).
std::uint64_t dense_wire(std::size_t bytes, int world) {
  return world <= 1 ? 0 : 2 * static_cast<std::uint64_t>(world - 1) * bytes / static_cast<std::uint64_t>(world);
}

struct Bucket {
  std::size_t lo = 0, hi = 0;  // floats of the gradient buffer
  int low_group = 0;           // launched when this group is ready
};

// Whole groups from the last backwards, each bucket at least min_floats.
std::vector<Bucket> make_buckets(const ParamTable& t, std::size_t min_floats) {
  std::vector<Bucket> out;
  Bucket cur;
  bool open = false;
  for (int g = t.num_groups - 1; g >= 0; --g) {
    if (!open) {
      cur = Bucket{t.group_begin(g), t.group_end(g), g};
      open = true;
    } else {
      cur.lo = t.group_begin(g);
      cur.low_group = g;
    }
    if (cur.hi - cur.lo >= min_floats) {
      out.push_back(cur);
      open = false;
    }
  }
  if (open) {
    if (out.empty() || cur.hi - cur.lo >= min_floats / 2) {
      out.push_back(cur);
    } else {  // a small remainder joins the previous bucket
      out.back().lo = cur.lo;
      out.back().low_group = cur.low_group;
    }
  }
  return out;
}

// ---------------------------------------------------------------- checkpoints
//
// One file per rank, DIR/step-<S>.rank-<R>.ckpt, host byte order:
//   "CCLZDP01", u32 version 1, i32 x 6 model (vocab, context, layers, width,
//   heads, mlp_ratio), u64 parameters, i32 world, rank, batch, local_steps,
//   str compressor spec, u32 buckets + (u64 lo, hi) each, i64 step,
//   i64 optimizer steps, str sampler state, f32 x parameters, u64 + f32 x
//   optimizer state, per bucket u64 + compressor state bytes, then u64
//   FNV-1a of everything before it.
// DIR/latest holds the step of the newest complete set, as text.

constexpr char kMagic[8] = {'C', 'C', 'L', 'Z', 'D', 'P', '0', '1'};
constexpr std::uint32_t kVersion = 1;

struct Writer {
  std::vector<std::byte> b;
  void raw(const void* p, std::size_t n) {
    const auto* c = static_cast<const std::byte*>(p);
    b.insert(b.end(), c, c + n);
  }
  template <class T>
  void put(T v) {
    raw(&v, sizeof v);
  }
  void str(std::string_view s) {
    put(static_cast<std::uint32_t>(s.size()));
    raw(s.data(), s.size());
  }
};

struct Reader {
  std::span<const std::byte> b;
  std::size_t at = 0;
  bool ok = true;
  bool raw(void* p, std::size_t n) {
    if (!ok || b.size() - at < n) return ok = false;
    std::memcpy(p, b.data() + at, n);
    at += n;
    return true;
  }
  template <class T>
  T get() {
    T v{};
    raw(&v, sizeof v);
    return v;
  }
  std::string str() {
    const auto n = get<std::uint32_t>();
    if (!ok || b.size() - at < n) {
      ok = false;
      return {};
    }
    std::string s(reinterpret_cast<const char*>(b.data() + at), n);
    at += n;
    return s;
  }
};

std::uint64_t fnv1a(std::span<const std::byte> b) {
  std::uint64_t h = 1469598103934665603ULL;
  for (std::byte c : b) {
    h ^= static_cast<std::uint8_t>(c);
    h *= 1099511628211ULL;
  }
  return h;
}

std::string ckpt_name(const std::string& dir, int step, int rank) {
  return dir + "/step-" + std::to_string(step) + ".rank-" + std::to_string(rank) + ".ckpt";
}

Status errno_error(const std::string& what) { return {Result::system_error, what + ": " + std::strerror(errno)}; }

// Writes bytes to path through path.tmp, fsync and rename, then fsyncs the
// directory, so the name refers to either the old file or the whole new one.
// CCLZ_TRAIN_TEST_CRASH_IN_WRITE (tests only): a path containing its value
// gets half its bytes written, then the process dies.
Status write_atomically(const std::string& path, std::span<const std::byte> bytes) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_error("checkpoint: cannot create " + tmp);
  std::size_t n = bytes.size();
  const char* crash = std::getenv("CCLZ_TRAIN_TEST_CRASH_IN_WRITE");
  const bool die = crash != nullptr && *crash != '\0' && path.find(crash) != std::string::npos;
  if (die) n /= 2;
  std::size_t done = 0;
  while (done < n) {
    const ssize_t w = ::write(fd, bytes.data() + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const Status s = errno_error("checkpoint: writing " + tmp);
      ::close(fd);
      return s;
    }
    done += static_cast<std::size_t>(w);
  }
  if (die) {
    ::fsync(fd);
    std::fprintf(stderr, "cclz-train: test crash while writing %s (%zu of %zu bytes)\n", tmp.c_str(), n, bytes.size());
    std::fflush(stderr);
    ::_exit(3);
  }
  if (::fsync(fd) != 0) {
    const Status s = errno_error("checkpoint: fsync " + tmp);
    ::close(fd);
    return s;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return errno_error("checkpoint: rename " + tmp + " to " + path);
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return {};
}

Status read_file(const std::string& path, std::vector<std::byte>* out) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return errno_error("checkpoint: cannot open " + path);
  out->clear();
  std::byte buf[1 << 16];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out->insert(out->end(), buf, buf + n);
  const bool err = std::ferror(f) != 0;
  std::fclose(f);
  if (err) return errno_error("checkpoint: reading " + path);
  return {};
}

// Everything one rank's checkpoint holds, by reference to the live objects.
struct TrainState {
  const TrainOptions& o;
  const DpOptions& dp;
  int world = 1, rank = 0;
  Gpt& model;
  Optimizer& opt;
  BatchSampler& sampler;
  const std::vector<Bucket>& buckets;
  const Compressor* comp;  // null: dense
  std::vector<std::unique_ptr<CompressorState>>& states;
};

Status save_checkpoint(const TrainState& s, int step) {
  Writer w;
  w.raw(kMagic, sizeof kMagic);
  w.put(kVersion);
  const ModelConfig& m = s.o.model;
  for (int v : {m.vocab_size, m.context, m.layers, m.width, m.heads, m.mlp_ratio}) w.put(static_cast<std::int32_t>(v));
  w.put(static_cast<std::uint64_t>(s.model.num_params()));
  for (int v : {s.world, s.rank, s.o.batch, s.dp.local_steps}) w.put(static_cast<std::int32_t>(v));
  w.str(s.dp.compressor);
  w.put(static_cast<std::uint32_t>(s.buckets.size()));
  for (const Bucket& b : s.buckets) {
    w.put(static_cast<std::uint64_t>(b.lo));
    w.put(static_cast<std::uint64_t>(b.hi));
  }
  w.put(static_cast<std::int64_t>(step));
  w.put(static_cast<std::int64_t>(s.opt.steps()));
  const std::vector<std::uint8_t> smp = serialize(s.sampler.state());
  w.str(std::string_view(reinterpret_cast<const char*>(smp.data()), smp.size()));
  w.raw(s.model.params(), s.model.num_params() * sizeof(float));
  const std::span<float> os = s.opt.state();
  w.put(static_cast<std::uint64_t>(os.size()));
  w.raw(os.data(), os.size_bytes());
  for (const auto& st : s.states) {
    std::vector<std::byte> one;
    if (st) {
      if (Status e = st->save(&one); !e.ok()) return e;
    }
    w.put(static_cast<std::uint64_t>(one.size()));
    w.raw(one.data(), one.size());
  }
  w.put(fnv1a(w.b));
  return write_atomically(ckpt_name(s.dp.checkpoint, step, s.rank), w.b);
}

// Reads DIR/latest: the step of the newest complete checkpoint.
Status latest_step(const std::string& dir, int* step) {
  std::vector<std::byte> b;
  if (Status s = read_file(dir + "/latest", &b); !s.ok()) {
    return {Result::invalid_argument, "--resume: no checkpoint in '" + dir + "' (" + s.message() + ")"};
  }
  const std::string text(reinterpret_cast<const char*>(b.data()), b.size());
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (end == text.c_str() || v < 0) return {Result::invalid_argument, "--resume: " + dir + "/latest is damaged"};
  *step = static_cast<int>(v);
  return {};
}

Status load_checkpoint(const TrainState& s, int step) {
  const std::string path = ckpt_name(s.dp.checkpoint, step, s.rank);
  std::vector<std::byte> bytes;
  if (Status e = read_file(path, &bytes); !e.ok()) return {Result::invalid_argument, "--resume: " + e.message()};
  auto refuse = [&](const std::string& why) { return Status{Result::invalid_argument, "--resume: " + path + ": " + why}; };
  if (bytes.size() < sizeof kMagic + 8 || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    return refuse("not a cclz-train checkpoint");
  std::uint64_t sum = 0;
  std::memcpy(&sum, bytes.data() + bytes.size() - 8, 8);
  const std::span<const std::byte> body(bytes.data(), bytes.size() - 8);
  if (fnv1a(body) != sum) return refuse("checksum mismatch (a damaged or partly written file)");
  Reader r{body, sizeof kMagic};
  if (r.get<std::uint32_t>() != kVersion) return refuse("unknown version");
  const ModelConfig& m = s.o.model;
  ModelConfig c;
  c.vocab_size = r.get<std::int32_t>();
  c.context = r.get<std::int32_t>();
  c.layers = r.get<std::int32_t>();
  c.width = r.get<std::int32_t>();
  c.heads = r.get<std::int32_t>();
  c.mlp_ratio = r.get<std::int32_t>();
  const auto params = r.get<std::uint64_t>();
  if (c.vocab_size != m.vocab_size || c.context != m.context || c.layers != m.layers || c.width != m.width ||
      c.heads != m.heads || c.mlp_ratio != m.mlp_ratio || params != s.model.num_params()) {
    return refuse("it holds a model of " + describe(c) + " (" + std::to_string(params) + " parameters); this run is " +
                  describe(m) + " (" + std::to_string(s.model.num_params()) + ")");
  }
  const int world = r.get<std::int32_t>(), rank = r.get<std::int32_t>(), batch = r.get<std::int32_t>(),
            local = r.get<std::int32_t>();
  if (world != s.world || rank != s.rank) {
    return refuse("written by rank " + std::to_string(rank) + " of " + std::to_string(world) + "; this is rank " +
                  std::to_string(s.rank) + " of " + std::to_string(s.world) + " (resume on the same number of ranks)");
  }
  if (batch != s.o.batch || local != s.dp.local_steps) {
    return refuse("global batch " + std::to_string(batch) + ", local steps " + std::to_string(local) + "; this run has " +
                  std::to_string(s.o.batch) + ", " + std::to_string(s.dp.local_steps));
  }
  const std::string spec = r.str();
  if (spec != s.dp.compressor) return refuse("compressor '" + spec + "'; this run has '" + s.dp.compressor + "'");
  const auto nb = r.get<std::uint32_t>();
  bool same = nb == s.buckets.size();
  for (std::uint32_t i = 0; i < nb && r.ok; ++i) {
    const auto lo = r.get<std::uint64_t>(), hi = r.get<std::uint64_t>();
    same = same && i < s.buckets.size() && lo == s.buckets[i].lo && hi == s.buckets[i].hi;
  }
  if (!same) return refuse("another gradient bucket layout (--bucket-kb differs)");
  const auto saved_step = r.get<std::int64_t>();
  const auto opt_steps = r.get<std::int64_t>();
  const std::string smp = r.str();
  if (!r.ok || saved_step != step) return refuse("truncated or for another step");
  SamplerState ss;
  if (Status e = deserialize(std::span(reinterpret_cast<const std::uint8_t*>(smp.data()), smp.size()), &ss); !e.ok())
    return refuse(e.message());
  if (Status e = s.sampler.restore(ss); !e.ok()) return refuse(e.message());
  if (!r.raw(s.model.params(), s.model.num_params() * sizeof(float))) return refuse("truncated parameters");
  const std::span<float> os = s.opt.state();
  if (r.get<std::uint64_t>() != os.size() || !r.raw(os.data(), os.size_bytes()))
    return refuse("optimizer state of another size (another optimizer?)");
  s.opt.set_steps(opt_steps);
  for (auto& st : s.states) {
    const auto n = r.get<std::uint64_t>();
    if (!r.ok || body.size() - r.at < n) return refuse("truncated compressor state");
    if (st) {
      if (Status e = st->load(body.subspan(r.at, n)); !e.ok()) return refuse(e.message());
    } else if (n != 0) {
      return refuse("compressor state for a dense run");
    }
    r.at += n;
  }
  if (r.at != body.size()) return refuse("trailing bytes");
  return {};
}

// ---------------------------------------------------------------- the reducer

// Runs the bucket reductions of one step. Dense: non-blocking all-reduces.
// Compressed: a thread that takes ready buckets in order.
class Reducer {
 public:
  Reducer(Comm& comm, float* grads, const std::vector<Bucket>& buckets, const Compressor* comp,
          std::vector<std::unique_ptr<CompressorState>>& states)
      : comm_(comm), grads_(grads), buckets_(buckets), comp_(comp), states_(states), reqs_(buckets.size()),
        wire_(buckets.size(), 0) {
    if (comp_ != nullptr) worker_ = std::thread([this] { run(); });
  }
  ~Reducer() {
    if (worker_.joinable()) {
      {
        std::lock_guard lk(mu_);
        stop_ = true;
      }
      cv_.notify_all();
      worker_.join();
    }
  }

  void launch(std::size_t k) {
    const Bucket& b = buckets_[k];
    if (comp_ == nullptr) {
      reqs_[k] = comm_.all_reduce(grads_ + b.lo, grads_ + b.lo, b.hi - b.lo, DataType::f32, ReduceOp::avg);
      wire_[k] = dense_wire((b.hi - b.lo) * 4, comm_.size());
      return;
    }
    {
      std::lock_guard lk(mu_);
      queue_.push_back(k);
    }
    cv_.notify_all();
  }

  // Waits for every bucket of the step; *wire gets this rank's bytes.
  Status finish(std::uint64_t* wire) {
    Status first;
    if (comp_ == nullptr) {
      for (Request& r : reqs_) {
        if (Status s = r.wait(); !s.ok() && first.ok()) first = s;
        r = Request();
      }
    } else {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return done_ == buckets_.size() || !error_.ok(); });
      first = error_;
      done_ = 0;
    }
    *wire = 0;
    for (std::uint64_t w : wire_) *wire += w;
    return first;
  }
  double busy_seconds() const { return busy_s_; }

 private:
  void run() {
    CompressedOptions opt;
    opt.average = true;
    for (;;) {
      std::size_t k = 0;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        k = queue_.front();
        queue_.pop_front();
      }
      const Bucket& b = buckets_[k];
      const TensorDesc desc = states_[k]->desc();
      CompressedReport rep;
      opt.name = "bucket " + std::to_string(k);
      const Clock::time_point t0 = Clock::now();
      Status s = compressed_all_reduce(comm_, grads_ + b.lo, desc, *comp_, *states_[k], opt, &rep);
      busy_s_ += since(t0);
      wire_[k] = rep.wire_bytes;
      {
        std::lock_guard lk(mu_);
        if (!s.ok() && error_.ok()) error_ = s;
        ++done_;
      }
      cv_.notify_all();
    }
  }

  Comm& comm_;
  float* grads_;
  const std::vector<Bucket>& buckets_;
  const Compressor* comp_;
  std::vector<std::unique_ptr<CompressorState>>& states_;
  std::vector<Request> reqs_;
  std::vector<std::uint64_t> wire_;
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::size_t> queue_;
  std::size_t done_ = 0;
  bool stop_ = false;
  Status error_;
  double busy_s_ = 0;
};

struct CsvFile {
  std::FILE* f = nullptr;
  ~CsvFile() {
    if (f != nullptr) std::fclose(f);
  }
};

// Every rank's local check, agreed: if any rank failed, all fail (with this
// rank's own message where it has one).
Status agree(Comm& comm, const Status& local) {
  std::int32_t bad = local.ok() ? 0 : 1;
  if (Status s = comm.all_reduce(&bad, &bad, 1, DataType::i32, ReduceOp::max).wait(); !s.ok()) return s;
  if (!local.ok()) return local;
  if (bad != 0) return {Result::invalid_argument, "another rank failed its checks before training (see its message)"};
  return {};
}

}  // namespace

std::string dp_usage(const char* program) {
  std::string u = train_usage(program);
  const std::string first = "Trains the reference GPT on a byte-level corpus in one process.";
  if (const auto at = u.find(first); at != std::string::npos) {
    u.replace(at, first.size(),
              "Trains the reference GPT data-parallel on every rank of the MPI job\n"
              "(mpiexec -n N); --batch is the global batch, N must divide it.");
  }
  u += R"(data parallel:
  --compressor SPEC   gradient compressor for every bucket (none): fp16, bf16,
                      topk:ratio=R, ef+topk:ratio=R, powersgd:rank=R, int8, ...
  --bucket-kb N       minimum gradient bucket in KiB, whole parameter groups (256)
  --local-steps H     local SGD: average parameters every H steps (1: gradients every step)
  --checkpoint DIR    write checkpoints to DIR (created if missing)
  --checkpoint-every N  every N steps (0: at the end only)
  --resume            continue from DIR's newest complete checkpoint
  --stop-after N      stop after step N (with a checkpoint), as if interrupted
The CSV (rank 0) adds bytes_sent,dense_bytes: this rank's wire bytes that step
and what dense f32 averaging sends (2 (N-1)/N of the gradient bytes).
)";
  return u;
}

Status parse_dp_args(int argc, const char* const* argv, TrainOptions* train, DpOptions* dp, bool* help) {
  std::vector<const char*> rest = {argc > 0 ? argv[0] : "cclz-train"};
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--resume") {
      dp->resume = true;
      continue;
    }
    std::string_view name = arg.substr(0, arg.find('=')), value;
    const bool ours = name == "--compressor" || name == "--bucket-kb" || name == "--local-steps" ||
                      name == "--checkpoint" || name == "--checkpoint-every" || name == "--stop-after";
    if (!ours) {
      rest.push_back(argv[i]);
      continue;
    }
    if (name.size() < arg.size()) {
      value = arg.substr(name.size() + 1);
    } else {
      if (i + 1 >= argc) return {Result::invalid_argument, std::string(name) + " needs a value"};
      value = argv[++i];
    }
    name.remove_prefix(2);
    Status s;
    if (name == "compressor") {
      if (value.empty()) s = bad_flag(name, value, "a compressor spec");
      dp->compressor = value;
    } else if (name == "bucket-kb") {
      s = int_flag(name, value, 1, 1 << 20, &dp->bucket_kb);
    } else if (name == "local-steps") {
      s = int_flag(name, value, 1, 1 << 20, &dp->local_steps);
    } else if (name == "checkpoint") {
      if (value.empty()) s = bad_flag(name, value, "a directory");
      dp->checkpoint = value;
    } else if (name == "checkpoint-every") {
      s = int_flag(name, value, 0, 1 << 30, &dp->checkpoint_every);
    } else {
      s = int_flag(name, value, 1, 1 << 30, &dp->stop_after);
    }
    if (!s.ok()) return s;
  }
  if (Status s = parse_train_args(static_cast<int>(rest.size()), rest.data(), train, help); !s.ok() || *help) return s;
  if (dp->resume && dp->checkpoint.empty()) return {Result::invalid_argument, "--resume needs --checkpoint DIR"};
  if (dp->local_steps > 1 && dp->compressor != "none") {
    return {Result::invalid_argument, "--local-steps " + std::to_string(dp->local_steps) +
                                          " averages parameters densely; --compressor applies to gradient averaging "
                                          "only (use one or the other)"};
  }
  return {};
}

Status train_dp(Comm& comm, const TrainOptions& o, const DpOptions& dp, std::FILE* log, DpResult* res) {
  *res = {};
  const int W = comm.size(), R = comm.rank();
  if (R != 0) log = nullptr;
  const int B = o.batch, T = o.model.context;

  // Every input check first, on every rank; then the ranks agree.
  Corpus corpus;
  DataSplit split;
  BatchSampler sampler;
  std::unique_ptr<Gpt> model;
  std::unique_ptr<Optimizer> opt;
  std::unique_ptr<Compressor> comp;
  std::vector<Bucket> buckets;
  std::vector<std::unique_ptr<CompressorState>> states;
  LrSchedule sched = o.schedule;
  sched.total = o.steps;
  int n_eval = 0;
  CsvFile csv;
  int start = 0;
  Status local = [&]() -> Status {
    if (B % W != 0) {
      return {Result::invalid_argument, "--batch " + std::to_string(B) + " is the global batch and must be divisible by the " +
                                            std::to_string(W) + " ranks"};
    }
    if (Status s = o.data.empty() ? load_default_corpus(&corpus) : load_corpus_file(o.data, &corpus); !s.ok()) return s;
    if (Status s = split_corpus(corpus, o.val_fraction, T, &split); !s.ok()) return s;
    if (Status s = BatchSampler::create(split.train, B, T, R, W, hash_combine(o.seed, 2), &sampler); !s.ok()) return s;
    n_eval = eval_batch_count(split.val.size(), B, T);
    if (o.eval_batches > 0 && o.eval_batches < n_eval) n_eval = o.eval_batches;
    if (o.val_fraction > 0 && n_eval == 0) {
      return {Result::invalid_argument, "data: the validation part (" + std::to_string(split.val.size()) +
                                            " bytes) holds fewer than one batch of " + std::to_string(B) + " windows of " +
                                            std::to_string(T) + " + 1 bytes; lower --batch or raise --val-fraction"};
    }
    if (Status s = validate(sched); !s.ok()) return s;
    if (dp.compressor != "none") {
      if (Status s = make_compressor(dp.compressor, &comp); !s.ok()) return {Result::invalid_argument, s.message()};
    }
    if (Status s = Gpt::create(o.model, B / W, &model); !s.ok()) return s;
    model->init(hash_combine(o.seed, 1));
    if (Status s = Optimizer::create(o.optim, model->table(), &opt); !s.ok()) return s;
    buckets = make_buckets(model->table(), static_cast<std::size_t>(dp.bucket_kb) * 1024 / 4);
    states.resize(buckets.size());
    if (comp) {
      for (std::size_t k = 0; k < buckets.size(); ++k) {
        TensorDesc d;
        d.count = buckets[k].hi - buckets[k].lo;
        d.dtype = DataType::f32;
        if (Status s = comp->make_state(d, &states[k]); !s.ok()) return {Result::invalid_argument, s.message()};
      }
    }
    if (!dp.checkpoint.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(dp.checkpoint, ec);
      if (ec) return {Result::invalid_argument, "--checkpoint '" + dp.checkpoint + "': " + ec.message()};
    }
    if (dp.resume) {
      if (Status s = latest_step(dp.checkpoint, &start); !s.ok()) return s;
      const TrainState ts{o, dp, W, R, *model, *opt, sampler, buckets, comp.get(), states};
      if (Status s = load_checkpoint(ts, start); !s.ok()) return s;
      if (start >= o.steps) {
        return {Result::invalid_argument, "--resume: the checkpoint is at step " + std::to_string(start) +
                                              ", --steps is " + std::to_string(o.steps) + ": nothing left to do"};
      }
    }
    if (R == 0 && !o.csv.empty()) {
      csv.f = std::fopen(o.csv.c_str(), "w");
      if (csv.f == nullptr) return {Result::invalid_argument, "cannot write --csv '" + o.csv + "'"};
      std::fprintf(csv.f, "step,train_loss,val_loss,lr,grad_norm,step_ms,tokens_per_s,elapsed_s,bytes_sent,dense_bytes\n");
    }
    return {};
  }();
  if (Status s = agree(comm, local); !s.ok()) return s;
  if (o.threads > 0) openblas_set_num_threads(o.threads);

  const TrainState ts{o, dp, W, R, *model, *opt, sampler, buckets, comp.get(), states};
  const std::size_t P = model->num_params();
  res->first_step = start;
  res->buckets = static_cast<int>(buckets.size());
  res->train.num_params = P;
  if (log != nullptr) {
    std::fprintf(log, "model    %s, %zu parameters\n", describe(o.model).c_str(), P);
    std::fprintf(log, "data     %s: %zu bytes, train %zu, validation %zu (%d eval batches)\n", corpus.source.c_str(),
                 corpus.bytes.size(), split.train.size(), split.val.size(), n_eval);
    std::fprintf(log, "parallel %d ranks, %d sequences each; %s; %zu gradient buckets (>= %d KiB), compressor %s\n", W,
                 B / W, dp.local_steps > 1 ? ("local SGD every " + std::to_string(dp.local_steps) + " steps").c_str()
                                           : "gradients averaged every step",
                 buckets.size(), dp.bucket_kb, dp.compressor.c_str());
    std::fprintf(log, "training batch %d x %d = %d tokens/step, %d steps%s, %s lr %g -> %g, clip %g, seed %llu\n", B, T,
                 B * T, o.steps, start > 0 ? (", resumed at step " + std::to_string(start)).c_str() : "",
                 optimizer_name(o.optim.kind), static_cast<double>(sched.max_lr), static_cast<double>(sched.min_lr),
                 static_cast<double>(o.clip), static_cast<unsigned long long>(o.seed));
    std::fflush(log);
  }

  std::vector<int> in(static_cast<std::size_t>(B / W) * T), tg(in.size());
  auto evaluate = [&](int step) -> Status {
    if (n_eval == 0) return {};
    double sum = 0;
    for (int j = 0; j < n_eval; ++j) {
      eval_batch(split.val, j, B, T, R, W, in.data(), tg.data());
      float loss = 0;
      if (Status s = model->forward(in.data(), tg.data(), B / W, T, &loss); !s.ok()) return s;
      sum += loss;
    }
    float v = static_cast<float>(sum / n_eval);
    if (Status s = comm.all_reduce(&v, &v, 1, DataType::f32, ReduceOp::avg).wait(); !s.ok()) return s;
    res->train.val.push_back({step, v});
    if (log != nullptr) {
      std::fprintf(log, "step %6d/%d | val loss %.4f\n", step, o.steps, static_cast<double>(v));
      std::fflush(log);
    }
    return {};
  };
  auto checkpoint = [&](int step) -> Status {
    if (dp.checkpoint.empty()) return {};
    if (Status s = save_checkpoint(ts, step); !s.ok()) return s;
    // Every rank's file is complete before `latest` names the step.
    if (Status s = comm.barrier().wait(); !s.ok()) return s;
    if (R == 0) {
      const std::string text = std::to_string(step) + "\n";
      if (Status s = write_atomically(dp.checkpoint + "/latest",
                                      std::as_bytes(std::span(text.data(), text.size())));
          !s.ok()) {
        return s;
      }
      // Keep the newest two sets; older ones are not needed to resume.
      std::error_code ec;
      for (const auto& e : std::filesystem::directory_iterator(dp.checkpoint, ec)) {
        const std::string f = e.path().filename().string();
        int s = -1;
        if (std::sscanf(f.c_str(), "step-%d.rank-", &s) == 1 && s < step - std::max(1, dp.checkpoint_every)) {
          std::filesystem::remove(e.path(), ec);
        }
      }
    }
    return comm.barrier().wait();
  };

  const Clock::time_point t_start = Clock::now();
  if (start == 0) {
    if (Status s = evaluate(0); !s.ok()) return s;
  }
  Reducer reducer(comm, model->grads(), buckets, comp.get(), states);
  double interval_s = 0;
  int interval_steps = 0;
  std::uint64_t interval_bytes = 0;
  const int last = dp.stop_after > 0 ? std::min(o.steps, dp.stop_after) : o.steps;
  for (int step = start; step < last; ++step) {
    const Clock::time_point t0 = Clock::now();
    sampler.next(in.data(), tg.data());
    float loss = 0;
    if (Status s = model->forward(in.data(), tg.data(), B / W, T, &loss); !s.ok()) return s;
    model->zero_grad();
    std::uint64_t wire = 0, dense = 0;
    const int done = step + 1;
    if (dp.local_steps == 1 && W > 1) {
      std::size_t next = 0;  // buckets are launched in order as their low group comes ready
      if (Status s = model->backward(1.0f,
                                     [&](int group) {
                                       while (next < buckets.size() && buckets[next].low_group == group) {
                                         reducer.launch(next++);
                                       }
                                     });
          !s.ok()) {
        return s;
      }
      const Clock::time_point tw = Clock::now();
      if (Status s = reducer.finish(&wire); !s.ok()) return s;
      res->comm_wait_s += since(tw);
      for (const Bucket& b : buckets) dense += dense_wire((b.hi - b.lo) * 4, W);
    } else {
      if (Status s = model->backward(); !s.ok()) return s;
    }
    float global = loss;
    if (W > 1) {
      if (Status s = comm.all_reduce(&global, &global, 1, DataType::f32, ReduceOp::avg).wait(); !s.ok()) return s;
    }
    const double norm = clip_grad_norm(model->grads(), P, o.clip);
    if (!std::isfinite(global) || !std::isfinite(norm)) {
      char buf[128];
      std::snprintf(buf, sizeof buf, "step %d: loss %g, gradient norm %g is not finite; lower --lr", done,
                    static_cast<double>(global), norm);
      return {Result::internal_error, buf};
    }
    const float lr = sched.at(step);
    opt->step(model->params(), model->grads(), lr);
    if (dp.local_steps > 1 && W > 1 && done % dp.local_steps == 0) {
      if (Status s = comm.all_reduce(model->params(), model->params(), P, DataType::f32, ReduceOp::avg).wait(); !s.ok())
        return s;
      wire = dense = dense_wire(P * 4, W);
    }
    const double dt = since(t0);
    res->train.step_seconds += dt;
    res->train.train_loss.push_back(global);
    res->train.grad_norm.push_back(static_cast<float>(norm));
    res->bytes_sent.push_back(wire);
    res->dense_bytes.push_back(dense);
    interval_s += dt;
    interval_bytes += wire;
    ++interval_steps;

    const std::size_t n_val_before = res->train.val.size();
    if ((o.eval_every > 0 && done % o.eval_every == 0) || done == o.steps) {
      if (Status s = evaluate(done); !s.ok()) return s;
    }
    const double elapsed = since(t_start);
    if (log != nullptr && !o.quiet && (done % o.log_every == 0 || done == last)) {
      const double eta = elapsed / (done - start) * (o.steps - done);
      std::fprintf(log,
                   "step %6d/%d | loss %.4f | lr %.2e | norm %6.3f | %7.0f tok/s | %6.1f ms/step | sent %.3f MB/step | "
                   "ETA %.0fs\n",
                   done, o.steps, static_cast<double>(global), static_cast<double>(lr), norm,
                   interval_steps * static_cast<double>(B) * T / interval_s, 1e3 * interval_s / interval_steps,
                   static_cast<double>(interval_bytes) / interval_steps / 1e6, eta);
      std::fflush(log);
      interval_s = 0;
      interval_steps = 0;
      interval_bytes = 0;
    }
    if (csv.f != nullptr) {
      std::fprintf(csv.f, "%d,%.9g,", done, static_cast<double>(global));
      if (res->train.val.size() > n_val_before)
        std::fprintf(csv.f, "%.9g", static_cast<double>(res->train.val.back().loss));
      std::fprintf(csv.f, ",%.9g,%.9g,%.3f,%.1f,%.3f,%llu,%llu\n", static_cast<double>(lr), norm, 1e3 * dt,
                   static_cast<double>(B) * T / dt, elapsed, static_cast<unsigned long long>(wire),
                   static_cast<unsigned long long>(dense));
    }
    if ((dp.checkpoint_every > 0 && done % dp.checkpoint_every == 0) || done == last) {
      if (Status s = checkpoint(done); !s.ok()) return s;
    }
  }
  res->comm_busy_s = reducer.busy_seconds();
  res->train.seconds = since(t_start);
  if (csv.f != nullptr && std::fflush(csv.f) != 0) return {Result::system_error, "error writing --csv '" + o.csv + "'"};
  return {};
}

}  // namespace cclz::train
