// The reference GPT (decoder-only transformer, Radford et al. 2019) on the
// CPU in f32, built from the layer kernels in layers.hpp:
//
//   x0 = wte[tokens] + wpe[0..T)                                  (B,T,C)
//   for l in 0..L:  x = x + proj(attn(qkv(ln1(x))))                (B,T,C)
//                   x = x + mlp.proj(gelu(mlp.fc(ln2(x))))          hidden (B,T,4C)
//   logits = lnf(x) . lm_head^T                                    (B,T,V)
//   loss = mean over (b,t) of -log softmax(logits)[targets]
//
// The LM head is untied from wte: it costs V*C extra parameters but keeps
// the first and last groups independent, so a pipeline's first and last
// stages need no shared-weight all-reduce and the data-parallel buckets
// never wait on the embedding (tied, wte's gradient would only be final at
// the very end of backward). Linear layers have biases, the head does not.
//
// Memory: parameters and gradients each one allocation (ParamTable layout),
// activations one allocation sized for (max_batch, context), and one
// allocation of backward scratch that is reused layer by layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "cclz/cclz.hpp"
#include "cclz/types.hpp"
#include "model/config.hpp"
#include "model/params.hpp"

namespace cclz::train {

// Called during backward when the gradients of a parameter group (see
// params.hpp) are final: group L+1 first, then L, ..., 0.
using GroupReadyFn = std::function<void(int group)>;

// Zeroed floats from cclz::mem_alloc: the gradients, which the
// data-parallel trainer all-reduces in place, so that the ranks of a node
// read one another's buckets directly instead of staging them.
class SharedFloats {
 public:
  SharedFloats() = default;
  ~SharedFloats() { (void)mem_free(p_); }
  SharedFloats(const SharedFloats&) = delete;
  SharedFloats& operator=(const SharedFloats&) = delete;
  Status allocate(std::size_t n) {
    void* p = nullptr;
    if (Status st = mem_alloc(&p, n * sizeof(float)); !st.ok()) return st;
    (void)mem_free(p_);
    p_ = static_cast<float*>(p);
    n_ = n;
    return {};
  }
  float* data() noexcept { return p_; }
  const float* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }

 private:
  float* p_ = nullptr;
  std::size_t n_ = 0;
};

class Gpt {
 public:
  // Allocates parameters (initialised with init(0)), gradients (zero),
  // activations and scratch for batches of up to max_batch sequences of up
  // to cfg.context tokens. Fails on an invalid config or if memory runs out.
  static Status create(const ModelConfig& cfg, int max_batch, std::unique_ptr<Gpt>* out);

  const ModelConfig& config() const noexcept { return cfg_; }
  int max_batch() const noexcept { return max_batch_; }
  const ParamTable& table() const noexcept { return table_; }
  std::size_t num_params() const noexcept { return table_.total; }
  float* params() noexcept { return params_.data(); }
  const float* params() const noexcept { return params_.data(); }
  float* grads() noexcept { return grads_.data(); }
  const float* grads() const noexcept { return grads_.data(); }
  std::size_t activation_floats() const noexcept { return acts_.size() + scratch_.size(); }

  // Seeded GPT-2-style init (params.hpp).
  void init(std::uint64_t seed);

  // inputs, targets (B,T) token ids in [0,V). targets may be null (then no
  // loss; *loss is left alone and backward is not allowed). On success with
  // targets, *loss (if not null) is the mean cross-entropy. probs() then
  // holds softmax(logits), (B,T,V).
  Status forward(const int* inputs, const int* targets, int B, int T, float* loss);
  const float* probs() const noexcept { return probs_; }

  void zero_grad();

  // Adds the gradient of loss_scale * (mean loss of the last forward) to
  // grads(): zero_grad() first for a plain step; leaving the gradients in
  // place accumulates micro-batches. on_group_ready, if set, is called as
  // each group's gradients become final. Needs a forward with targets.
  Status backward(float loss_scale = 1.0f, const GroupReadyFn& on_group_ready = {});

 private:
  struct BlockAct {  // per block, sized for (max_batch, context)
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *res3;
  };
  struct BlockParam {  // indices into table_.tensors
    int ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
  };

  Gpt() = default;
  Status allocate();
  float* p(int idx) noexcept { return params_.data() + table_.tensors[static_cast<std::size_t>(idx)].offset; }
  float* g(int idx) noexcept { return grads_.data() + table_.tensors[static_cast<std::size_t>(idx)].offset; }

  ModelConfig cfg_;
  int max_batch_ = 0;
  ParamTable table_;
  std::vector<BlockParam> bp_;
  int wte_ = 0, wpe_ = 0, lnf_w_ = 0, lnf_b_ = 0, head_ = 0;

  std::vector<float> params_;
  SharedFloats grads_;
  std::vector<float> acts_;     // forward activations
  std::vector<float> scratch_;  // backward scratch
  std::vector<int> tokens_;     // inputs then targets of the last forward, (B,T) each

  // Pointers into acts_.
  float* encoded_ = nullptr;
  std::vector<BlockAct> ba_;
  float* proj_out_ = nullptr;  // attn.proj / mlp.proj output before the residual add (not kept)
  float *lnf_ = nullptr, *lnf_mean_ = nullptr, *lnf_rstd_ = nullptr, *probs_ = nullptr, *losses_ = nullptr;
  // Pointers into scratch_.
  float *dres_ = nullptr, *dln_ = nullptr, *datty_ = nullptr, *dqkv_ = nullptr, *dfch_ = nullptr,
        *dfch_gelu_ = nullptr, *datt_ = nullptr, *dlogits_ = nullptr;

  int last_B_ = 0, last_T_ = 0;
  bool have_targets_ = false;
};

}  // namespace cclz::train
