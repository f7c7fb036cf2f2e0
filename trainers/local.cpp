// Single-process training loop (see local.hpp). Seeds: the model is
// initialised from hash(seed, 1), the batches drawn with hash(seed, 2), so
// changing one never shifts the other's stream.
#include "local.hpp"

#include <cblas.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <string>

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

std::string hms(double s) {
  const long t = std::lround(s);
  char buf[32];
  if (t >= 3600) {
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  } else if (t >= 60) {
    std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%lds", t);
  }
  return buf;
}

// Mean loss over the first n evaluation batches of the validation split.
Status evaluate(Gpt& model, std::span<const std::uint8_t> val, int n, int B, int T, std::vector<int>& in,
                std::vector<int>& tg, float* out) {
  double sum = 0;
  for (int j = 0; j < n; ++j) {
    eval_batch(val, j, B, T, 0, 1, in.data(), tg.data());
    float loss = 0;
    if (Status s = model.forward(in.data(), tg.data(), B, T, &loss); !s.ok()) return s;
    sum += loss;
  }
  *out = static_cast<float>(sum / n);
  return {};
}

struct CsvFile {
  std::FILE* f = nullptr;
  ~CsvFile() {
    if (f != nullptr) std::fclose(f);
  }
};

}  // namespace

Status train_local(const TrainOptions& o, std::FILE* log, TrainResult* result) {
  *result = {};
  // Everything that can fail on input is checked before the first step.
  Corpus corpus;
  if (Status s = o.data.empty() ? load_default_corpus(&corpus) : load_corpus_file(o.data, &corpus); !s.ok()) return s;
  DataSplit split;
  if (Status s = split_corpus(corpus, o.val_fraction, o.model.context, &split); !s.ok()) return s;
  const int B = o.batch, T = o.model.context;
  BatchSampler sampler;
  if (Status s = BatchSampler::create(split.train, B, T, 0, 1, hash_combine(o.seed, 2), &sampler); !s.ok()) return s;
  int n_eval = eval_batch_count(split.val.size(), B, T);
  if (o.eval_batches > 0 && o.eval_batches < n_eval) n_eval = o.eval_batches;
  if (o.val_fraction > 0 && n_eval == 0)
    return {Result::invalid_argument, "data: the validation part (" + std::to_string(split.val.size()) +
                                          " bytes) holds fewer than one batch of " + std::to_string(B) +
                                          " windows of " + std::to_string(T) + " + 1 bytes; lower --batch or raise --val-fraction"};

  std::unique_ptr<Gpt> model;
  if (Status s = Gpt::create(o.model, B, &model); !s.ok()) return s;
  model->init(hash_combine(o.seed, 1));
  std::unique_ptr<Optimizer> opt;
  if (Status s = Optimizer::create(o.optim, model->table(), &opt); !s.ok()) return s;
  LrSchedule sched = o.schedule;
  sched.total = o.steps;
  if (Status s = validate(sched); !s.ok()) return s;

  CsvFile csv;
  if (!o.csv.empty()) {
    csv.f = std::fopen(o.csv.c_str(), "w");
    if (csv.f == nullptr) return {Result::invalid_argument, "cannot write --csv '" + o.csv + "'"};
    std::fprintf(csv.f, "step,train_loss,val_loss,lr,grad_norm,step_ms,tokens_per_s,elapsed_s\n");
  }
  if (o.threads > 0) openblas_set_num_threads(o.threads);

  result->num_params = model->num_params();
  if (log != nullptr) {
    std::fprintf(log, "model    %s, %zu parameters, %.1f MiB activations\n", describe(o.model).c_str(),
                 model->num_params(), static_cast<double>(model->activation_floats()) * 4 / (1 << 20));
    std::fprintf(log, "data     %s: %zu bytes, train %zu, validation %zu (%d eval batches)\n", corpus.source.c_str(),
                 corpus.bytes.size(), split.train.size(), split.val.size(), n_eval);
    std::fprintf(log, "training batch %d x %d = %d tokens/step, %d steps, %s lr %g -> %g (%s, warm-up %d), clip %g, "
                      "seed %llu, BLAS threads %d\n",
                 B, T, B * T, o.steps, optimizer_name(o.optim.kind), static_cast<double>(sched.max_lr),
                 static_cast<double>(sched.min_lr), schedule_name(sched.kind), sched.warmup,
                 static_cast<double>(o.clip), static_cast<unsigned long long>(o.seed), openblas_get_num_threads());
    std::fflush(log);
  }

  std::vector<int> in(static_cast<std::size_t>(B) * T), tg(in.size());
  auto run_eval = [&](int step) -> Status {
    if (n_eval == 0) return {};
    float v = 0;
    if (Status s = evaluate(*model, split.val, n_eval, B, T, in, tg, &v); !s.ok()) return s;
    result->val.push_back({step, v});
    if (log != nullptr) {
      std::fprintf(log, "step %6d/%d | val loss %.4f\n", step, o.steps, static_cast<double>(v));
      std::fflush(log);
    }
    return {};
  };
  const Clock::time_point t_start = Clock::now();
  if (Status s = run_eval(0); !s.ok()) return s;

  double interval_s = 0;  // training time since the last progress line
  int interval_steps = 0;
  for (int step = 0; step < o.steps; ++step) {
    const Clock::time_point t0 = Clock::now();
    sampler.next(in.data(), tg.data());
    float loss = 0;
    if (Status s = model->forward(in.data(), tg.data(), B, T, &loss); !s.ok()) return s;
    model->zero_grad();
    if (Status s = model->backward(); !s.ok()) return s;
    const double norm = clip_grad_norm(model->grads(), model->num_params(), o.clip);
    if (!std::isfinite(loss) || !std::isfinite(norm)) {
      char buf[128];
      std::snprintf(buf, sizeof buf, "step %d: loss %g, gradient norm %g is not finite; lower --lr", step + 1,
                    static_cast<double>(loss), norm);
      return {Result::internal_error, buf};
    }
    const float lr = sched.at(step);
    opt->step(model->params(), model->grads(), lr);
    const double dt = since(t0);
    result->step_seconds += dt;
    interval_s += dt;
    ++interval_steps;
    result->train_loss.push_back(loss);
    result->grad_norm.push_back(static_cast<float>(norm));

    const int done = step + 1;
    const std::size_t n_val_before = result->val.size();
    if ((o.eval_every > 0 && done % o.eval_every == 0) || done == o.steps) {
      if (Status s = run_eval(done); !s.ok()) return s;
    }
    const double elapsed = since(t_start);
    if (log != nullptr && !o.quiet && (done % o.log_every == 0 || done == o.steps)) {
      const double eta = elapsed / done * (o.steps - done);
      std::fprintf(log, "step %6d/%d | loss %.4f | lr %.2e | norm %6.3f | %7.0f tok/s | %6.1f ms/step | ETA %s\n", done,
                   o.steps, static_cast<double>(loss), static_cast<double>(lr), norm,
                   interval_steps * static_cast<double>(B) * T / interval_s, 1e3 * interval_s / interval_steps,
                   hms(eta).c_str());
      std::fflush(log);
      interval_s = 0;
      interval_steps = 0;
    }
    if (csv.f != nullptr) {
      std::fprintf(csv.f, "%d,%.9g,", done, static_cast<double>(loss));
      if (result->val.size() > n_val_before) std::fprintf(csv.f, "%.9g", static_cast<double>(result->val.back().loss));
      std::fprintf(csv.f, ",%.9g,%.9g,%.3f,%.1f,%.3f\n", static_cast<double>(lr), norm, 1e3 * dt,
                   static_cast<double>(B) * T / dt, elapsed);
    }
  }
  result->seconds = since(t_start);
  if (csv.f != nullptr && std::fflush(csv.f) != 0) return {Result::system_error, "error writing --csv '" + o.csv + "'"};
  return {};
}

}  // namespace cclz::train
