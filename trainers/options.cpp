// Trainer flag parsing: "--name value" or "--name=value", strict numbers
// (the whole string, finite, in range), every error naming the flag.
#include "options.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace cclz::train {

namespace {

Status bad(std::string_view flag, std::string_view value, std::string_view want) {
  return {Result::invalid_argument,
          "--" + std::string(flag) + " '" + std::string(value) + "': want " + std::string(want)};
}

Status parse_int(std::string_view flag, std::string_view v, int lo, int hi, int* out) {
  int x = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || end != v.data() + v.size() || x < lo || x > hi)
    return bad(flag, v, "an integer in " + std::to_string(lo) + ".." + std::to_string(hi));
  *out = x;
  return {};
}

Status parse_u64(std::string_view flag, std::string_view v, std::uint64_t* out) {
  std::uint64_t x = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || end != v.data() + v.size()) return bad(flag, v, "a non-negative integer");
  *out = x;
  return {};
}

Status parse_double(std::string_view flag, std::string_view v, double lo, double hi, double* out) {
  const std::string s(v);
  char* end = nullptr;
  const double x = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(x) || x < lo || x > hi) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "a number in [%g, %g]", lo, hi);
    return bad(flag, v, buf);
  }
  *out = x;
  return {};
}

Status parse_float(std::string_view flag, std::string_view v, double lo, double hi, float* out) {
  double x = 0;
  if (Status s = parse_double(flag, v, lo, hi, &x); !s.ok()) return s;
  *out = static_cast<float>(x);
  return {};
}

}  // namespace

std::string train_usage(const char* program) {
  return std::string("usage: ") + program + R"( [options]
Trains the reference GPT on a byte-level corpus in one process.

model:
  --layers N          transformer blocks (4)
  --width N           channels (128)
  --heads N           attention heads, must divide width (4)
  --context N         sequence length T (64)
  --mlp-ratio N       MLP hidden width / width (4)
training:
  --batch N           sequences per step (16)
  --steps N           optimizer steps (1000)
  --optimizer NAME    adamw | sgd (adamw)
  --lr X              peak learning rate (1e-3)
  --min-lr X          final learning rate of the cosine (lr / 10)
  --warmup N          linear warm-up steps (50, or steps / 10 if fewer)
  --schedule NAME     cosine | constant (cosine)
  --beta1 X --beta2 X --eps X    AdamW (0.9, 0.95, 1e-8)
  --momentum X        SGD momentum (0.9)
  --weight-decay X    on linear weights and the LM head only (0.1)
  --clip X            global gradient-norm limit, 0 = off (1.0)
  --seed N            initialisation and data order (1)
  --threads N         OpenBLAS threads, 0 = its default (0)
data and logging:
  --data FILE         any text file (default: /usr/share/common-licenses, all files)
  --val-fraction X    tail of the corpus held out for validation (0.1)
  --eval-every N      validation loss every N steps, 0 = at the end only (100)
  --eval-batches N    validation batches per evaluation, 0 = all (0)
  --log-every N       progress line every N steps (10)
  --csv FILE          per-step log: step,train_loss,val_loss,lr,grad_norm,step_ms,tokens_per_s,elapsed_s
  --quiet             no progress lines
  --help
)";
}

Status parse_train_args(int argc, const char* const* argv, TrainOptions* o, bool* help) {
  *help = false;
  float min_lr = -1.0f;  // negative: lr / 10
  bool warmup_given = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      *help = true;
      return {};
    }
    if (arg == "--quiet") {
      o->quiet = true;
      continue;
    }
    if (arg.substr(0, 2) != "--") return {Result::invalid_argument, "unexpected argument '" + std::string(arg) + "'"};
    arg.remove_prefix(2);
    std::string_view name = arg, value;
    if (const auto eq = arg.find('='); eq != std::string_view::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    } else {
      if (i + 1 >= argc) return {Result::invalid_argument, "--" + std::string(name) + " needs a value"};
      value = argv[++i];
    }
    Status s;
    if (name == "layers") {
      s = parse_int(name, value, 1, 256, &o->model.layers);
    } else if (name == "width") {
      s = parse_int(name, value, 1, 16384, &o->model.width);
    } else if (name == "heads") {
      s = parse_int(name, value, 1, 16384, &o->model.heads);
    } else if (name == "context") {
      s = parse_int(name, value, 1, 8192, &o->model.context);
    } else if (name == "mlp-ratio") {
      s = parse_int(name, value, 1, 16, &o->model.mlp_ratio);
    } else if (name == "batch") {
      s = parse_int(name, value, 1, 1 << 20, &o->batch);
    } else if (name == "steps") {
      s = parse_int(name, value, 1, 1 << 30, &o->steps);
    } else if (name == "optimizer") {
      if (!parse_optimizer(value, &o->optim.kind)) s = bad(name, value, "adamw or sgd");
    } else if (name == "lr") {
      s = parse_float(name, value, 1e-12, 100.0, &o->schedule.max_lr);
    } else if (name == "min-lr") {
      s = parse_float(name, value, 0.0, 100.0, &min_lr);
    } else if (name == "warmup") {
      s = parse_int(name, value, 0, 1 << 30, &o->schedule.warmup);
      warmup_given = true;
    } else if (name == "schedule") {
      if (!parse_schedule(value, &o->schedule.kind)) s = bad(name, value, "cosine or constant");
    } else if (name == "beta1") {
      s = parse_float(name, value, 0.0, 0.999999, &o->optim.beta1);
    } else if (name == "beta2") {
      s = parse_float(name, value, 0.0, 0.999999, &o->optim.beta2);
    } else if (name == "eps") {
      s = parse_float(name, value, 1e-30, 1.0, &o->optim.eps);
    } else if (name == "momentum") {
      s = parse_float(name, value, 0.0, 0.999999, &o->optim.momentum);
    } else if (name == "weight-decay") {
      s = parse_float(name, value, 0.0, 100.0, &o->optim.weight_decay);
    } else if (name == "clip") {
      s = parse_float(name, value, 0.0, 1e30, &o->clip);
    } else if (name == "seed") {
      s = parse_u64(name, value, &o->seed);
    } else if (name == "threads") {
      s = parse_int(name, value, 0, 1024, &o->threads);
    } else if (name == "data") {
      if (value.empty()) s = bad(name, value, "a file name");
      o->data = value;
    } else if (name == "val-fraction") {
      s = parse_double(name, value, 0.0, 0.5, &o->val_fraction);
    } else if (name == "eval-every") {
      s = parse_int(name, value, 0, 1 << 30, &o->eval_every);
    } else if (name == "eval-batches") {
      s = parse_int(name, value, 0, 1 << 30, &o->eval_batches);
    } else if (name == "log-every") {
      s = parse_int(name, value, 1, 1 << 30, &o->log_every);
    } else if (name == "csv") {
      if (value.empty()) s = bad(name, value, "a file name");
      o->csv = value;
    } else {
      s = {Result::invalid_argument, "unknown option --" + std::string(name) + " (see --help)"};
    }
    if (!s.ok()) return s;
  }

  o->schedule.total = o->steps;
  o->schedule.min_lr = min_lr >= 0.0f ? min_lr : o->schedule.max_lr / 10.0f;
  // The default warm-up (50) shrinks for short runs to a tenth of them.
  if (!warmup_given) o->schedule.warmup = std::min(o->schedule.warmup, o->steps / 10);
  if (Status s = validate(o->model); !s.ok()) return s;
  if (Status s = validate(o->optim); !s.ok()) return s;
  if (Status s = validate(o->schedule); !s.ok()) return s;
  if (o->model.vocab_size != 256) return {Result::invalid_argument, "byte-level data needs vocab 256"};
  return {};
}

}  // namespace cclz::train
