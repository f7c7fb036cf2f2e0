// The reference GPT: allocation of the tensor groups, the forward pass and
// the backward pass as calls of the layer kernels (see gpt.hpp for the model
// and layers.hpp for each kernel's formula and shapes).
//
// Forward cost per token, N params: about 2N flops in the matrices plus
// 4*T*C per block in attention; backward twice that.
#include "model/gpt.hpp"

#include <algorithm>
#include <new>
#include <string>

#include "model/layers.hpp"

namespace cclz::train {

namespace {
Status invalid(const std::string& msg) { return {Result::invalid_argument, "gpt: " + msg}; }
}  // namespace

Status Gpt::create(const ModelConfig& cfg, int max_batch, std::unique_ptr<Gpt>* out) {
  if (Status s = validate(cfg); !s.ok()) return s;
  if (max_batch < 1) return invalid("max_batch " + std::to_string(max_batch) + " must be at least 1");
  // Keep every (B*T) x (mlp*C) and (B*T) x V activation within int range.
  const long long rows = static_cast<long long>(max_batch) * cfg.context;
  const long long widest = std::max<long long>(static_cast<long long>(cfg.mlp_ratio) * cfg.width, cfg.vocab_size);
  if (rows * widest > (1ll << 31) - 1)
    return invalid("batch " + std::to_string(max_batch) + " x context " + std::to_string(cfg.context) +
                   " gives activations over 2^31 elements per tensor");
  std::unique_ptr<Gpt> m(new (std::nothrow) Gpt());
  if (!m) return {Result::system_error, "gpt: out of memory"};
  m->cfg_ = cfg;
  m->max_batch_ = max_batch;
  if (Status s = m->allocate(); !s.ok()) return s;
  m->init(0);
  *out = std::move(m);
  return {};
}

Status Gpt::allocate() {
  const std::size_t B = static_cast<std::size_t>(max_batch_);
  const std::size_t T = static_cast<std::size_t>(cfg_.context);
  const std::size_t C = static_cast<std::size_t>(cfg_.width);
  const std::size_t NH = static_cast<std::size_t>(cfg_.heads);
  const std::size_t H = static_cast<std::size_t>(cfg_.mlp_ratio) * C;
  const std::size_t V = static_cast<std::size_t>(cfg_.vocab_size);
  const std::size_t L = static_cast<std::size_t>(cfg_.layers);
  const std::size_t BT = B * T;

  table_ = make_param_table(cfg_);
  wte_ = table_.find("wte");
  wpe_ = table_.find("wpe");
  lnf_w_ = table_.find("lnf.weight");
  lnf_b_ = table_.find("lnf.bias");
  head_ = table_.find("lm_head.weight");
  bp_.resize(L);
  for (std::size_t l = 0; l < L; ++l) {
    const std::string pre = "h." + std::to_string(l) + ".";
    auto f = [&](const char* n) { return table_.find(pre + n); };
    bp_[l] = {f("ln1.weight"),       f("ln1.bias"),     f("attn.qkv.weight"), f("attn.qkv.bias"),
              f("attn.proj.weight"), f("attn.proj.bias"), f("ln2.weight"),      f("ln2.bias"),
              f("mlp.fc.weight"),    f("mlp.fc.bias"),  f("mlp.proj.weight"), f("mlp.proj.bias")};
  }

  const std::size_t per_block = BT * C * 5 + BT * 4 + BT * 3 * C + B * NH * T * T + BT * H * 2;
  const std::size_t n_acts = BT * C + L * per_block + BT * C + BT * C + BT * 2 + BT * V + BT;
  const std::size_t n_scratch = BT * C * 3 + BT * 3 * C + BT * H * 2 + T * T + BT * V;
  try {
    params_.assign(table_.total, 0.0f);
    acts_.assign(n_acts, 0.0f);
    scratch_.assign(n_scratch, 0.0f);
    tokens_.assign(2 * BT, 0);
    ba_.resize(L);
  } catch (const std::bad_alloc&) {
    return {Result::system_error,
            "gpt: out of memory allocating " + std::to_string((2 * table_.total + n_acts + n_scratch) * 4 >> 20) +
                " MiB for " + describe(cfg_) + " batch " + std::to_string(max_batch_)};
  }
  if (Status st = grads_.allocate(table_.total); !st.ok()) {
    return {st.code(), "gpt: gradients of " + describe(cfg_) + ": " + st.message()};
  }

  float* a = acts_.data();
  auto take = [&a](std::size_t n) {
    float* r = a;
    a += n;
    return r;
  };
  encoded_ = take(BT * C);
  for (auto& b : ba_) {
    b.ln1 = take(BT * C);
    b.ln1_mean = take(BT);
    b.ln1_rstd = take(BT);
    b.qkv = take(BT * 3 * C);
    b.att = take(B * NH * T * T);
    b.atty = take(BT * C);
    b.res2 = take(BT * C);
    b.ln2 = take(BT * C);
    b.ln2_mean = take(BT);
    b.ln2_rstd = take(BT);
    b.fch = take(BT * H);
    b.fch_gelu = take(BT * H);
    b.res3 = take(BT * C);
  }
  proj_out_ = take(BT * C);
  lnf_ = take(BT * C);
  lnf_mean_ = take(BT);
  lnf_rstd_ = take(BT);
  probs_ = take(BT * V);
  losses_ = take(BT);

  float* s = scratch_.data();
  auto take_s = [&s](std::size_t n) {
    float* r = s;
    s += n;
    return r;
  };
  dres_ = take_s(BT * C);
  dln_ = take_s(BT * C);
  datty_ = take_s(BT * C);
  dqkv_ = take_s(BT * 3 * C);
  dfch_ = take_s(BT * H);
  dfch_gelu_ = take_s(BT * H);
  datt_ = take_s(T * T);
  dlogits_ = take_s(BT * V);
  return {};
}

void Gpt::init(std::uint64_t seed) {
  init_params(params_.data(), table_, seed);
  have_targets_ = false;
}

void Gpt::zero_grad() { std::fill(grads_.data(), grads_.data() + grads_.size(), 0.0f); }

Status Gpt::forward(const int* inputs, const int* targets, int B, int T, float* loss) {
  if (B < 1 || B > max_batch_)
    return invalid("batch " + std::to_string(B) + " outside 1.." + std::to_string(max_batch_));
  if (T < 1 || T > cfg_.context)
    return invalid("sequence length " + std::to_string(T) + " outside 1.." + std::to_string(cfg_.context));
  const int C = cfg_.width, NH = cfg_.heads, V = cfg_.vocab_size, H = cfg_.mlp_ratio * cfg_.width;
  const int N = B * T;
  for (int i = 0; i < N; ++i) {
    if (inputs[i] < 0 || inputs[i] >= V)
      return invalid("input token " + std::to_string(inputs[i]) + " at " + std::to_string(i) + " outside 0.." +
                     std::to_string(V - 1));
    if (targets != nullptr && (targets[i] < 0 || targets[i] >= V))
      return invalid("target token " + std::to_string(targets[i]) + " at " + std::to_string(i) + " outside 0.." +
                     std::to_string(V - 1));
  }
  // Keep the tokens: backward needs them after the caller's buffers may have changed.
  std::copy(inputs, inputs + N, tokens_.begin());
  if (targets != nullptr) std::copy(targets, targets + N, tokens_.begin() + N);

  embedding_forward(encoded_, inputs, p(wte_), p(wpe_), B, T, C);
  const float* x = encoded_;
  for (int l = 0; l < cfg_.layers; ++l) {
    const BlockParam& w = bp_[static_cast<std::size_t>(l)];
    BlockAct& a = ba_[static_cast<std::size_t>(l)];
    layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, p(w.ln1_w), p(w.ln1_b), N, C);
    linear_forward(a.qkv, a.ln1, p(w.qkv_w), p(w.qkv_b), N, C, 3 * C);
    attention_forward(a.atty, a.att, a.qkv, B, T, C, NH);
    linear_forward(proj_out_, a.atty, p(w.proj_w), p(w.proj_b), N, C, C);
    residual_forward(a.res2, x, proj_out_, static_cast<std::size_t>(N) * C);
    layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p(w.ln2_w), p(w.ln2_b), N, C);
    linear_forward(a.fch, a.ln2, p(w.fc_w), p(w.fc_b), N, C, H);
    gelu_forward(a.fch_gelu, a.fch, static_cast<std::size_t>(N) * H);
    linear_forward(proj_out_, a.fch_gelu, p(w.fcproj_w), p(w.fcproj_b), N, H, C);
    residual_forward(a.res3, a.res2, proj_out_, static_cast<std::size_t>(N) * C);
    x = a.res3;
  }
  layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, x, p(lnf_w_), p(lnf_b_), N, C);
  linear_forward(probs_, lnf_, p(head_), nullptr, N, C, V);  // logits, turned into probs in place
  crossentropy_forward(losses_, probs_, probs_, targets, N, V);

  last_B_ = B;
  last_T_ = T;
  have_targets_ = targets != nullptr;
  if (have_targets_ && loss != nullptr) {
    double sum = 0.0;  // fixed order, so the mean is deterministic
    for (int i = 0; i < N; ++i) sum += losses_[i];
    *loss = static_cast<float>(sum / N);
  }
  return {};
}

Status Gpt::backward(float loss_scale, const GroupReadyFn& on_group_ready) {
  if (!have_targets_) return {Result::invalid_usage, "gpt: backward needs a forward with targets first"};
  const int B = last_B_, T = last_T_;
  const int C = cfg_.width, NH = cfg_.heads, V = cfg_.vocab_size, H = cfg_.mlp_ratio * cfg_.width;
  const int N = B * T;
  const std::size_t NC = static_cast<std::size_t>(N) * C;
  const std::size_t NH4 = static_cast<std::size_t>(N) * H;
  const int* inputs = tokens_.data();
  const int* targets = tokens_.data() + N;
  auto zero = [](float* b, std::size_t n) { std::fill(b, b + n, 0.0f); };
  auto ready = [&](int group) {
    if (on_group_ready) on_group_ready(group);
  };

  // Head and final LayerNorm (group L+1).
  zero(dlogits_, static_cast<std::size_t>(N) * V);
  crossentropy_backward(dlogits_, probs_, targets, loss_scale / static_cast<float>(N), N, V);
  zero(dln_, NC);
  linear_backward_dw(g(head_), nullptr, dlogits_, lnf_, N, C, V);
  linear_backward_dx(dln_, dlogits_, p(head_), N, C, V);
  const float* x_last = cfg_.layers > 0 ? ba_.back().res3 : encoded_;
  zero(dres_, NC);
  layernorm_backward_dw(g(lnf_w_), g(lnf_b_), dln_, x_last, lnf_mean_, lnf_rstd_, N, C);
  layernorm_backward_dx(dres_, dln_, x_last, p(lnf_w_), lnf_mean_, lnf_rstd_, N, C);
  ready(cfg_.layers + 1);

  // Blocks in reverse. dres_ holds the gradient of the residual stream; the
  // residual adds pass it unchanged, so each branch adds its input gradient
  // into dres_ through the LayerNorm's dx.
  for (int l = cfg_.layers - 1; l >= 0; --l) {
    const BlockParam& w = bp_[static_cast<std::size_t>(l)];
    const BlockAct& a = ba_[static_cast<std::size_t>(l)];
    const float* x = l == 0 ? encoded_ : ba_[static_cast<std::size_t>(l - 1)].res3;

    // MLP branch: res3 = res2 + fcproj(gelu(fc(ln2(res2)))).
    zero(dfch_gelu_, NH4);
    zero(dfch_, NH4);
    zero(dln_, NC);
    linear_backward_dw(g(w.fcproj_w), g(w.fcproj_b), dres_, a.fch_gelu, N, H, C);
    linear_backward_dx(dfch_gelu_, dres_, p(w.fcproj_w), N, H, C);
    gelu_backward(dfch_, dfch_gelu_, a.fch, NH4);
    linear_backward_dw(g(w.fc_w), g(w.fc_b), dfch_, a.ln2, N, C, H);
    linear_backward_dx(dln_, dfch_, p(w.fc_w), N, C, H);
    layernorm_backward_dw(g(w.ln2_w), g(w.ln2_b), dln_, a.res2, a.ln2_mean, a.ln2_rstd, N, C);
    layernorm_backward_dx(dres_, dln_, a.res2, p(w.ln2_w), a.ln2_mean, a.ln2_rstd, N, C);

    // Attention branch: res2 = x + proj(attn(qkv(ln1(x)))).
    zero(datty_, NC);
    zero(dqkv_, 3 * NC);
    zero(dln_, NC);
    linear_backward_dw(g(w.proj_w), g(w.proj_b), dres_, a.atty, N, C, C);
    linear_backward_dx(datty_, dres_, p(w.proj_w), N, C, C);
    attention_backward(dqkv_, datt_, datty_, a.qkv, a.att, B, T, C, NH);
    linear_backward_dw(g(w.qkv_w), g(w.qkv_b), dqkv_, a.ln1, N, C, 3 * C);
    linear_backward_dx(dln_, dqkv_, p(w.qkv_w), N, C, 3 * C);
    layernorm_backward_dw(g(w.ln1_w), g(w.ln1_b), dln_, x, a.ln1_mean, a.ln1_rstd, N, C);
    layernorm_backward_dx(dres_, dln_, x, p(w.ln1_w), a.ln1_mean, a.ln1_rstd, N, C);
    ready(l + 1);
  }

  embedding_backward_dw(g(wte_), g(wpe_), dres_, inputs, B, T, C);
  ready(0);
  return {};
}

}  // namespace cclz::train
