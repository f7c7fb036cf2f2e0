// The layers of the reference GPT as flat f32 kernels, one file each:
// forward/backward pairs over row-major arrays with explicit shapes.
//
// Conventions, shared by every layer:
//  - B batch, T sequence length, C channels, NH heads, V vocabulary;
//    per-position layers take N = B*T rows.
//  - Backward calls ADD into their gradient outputs (dinp, dweight, dbias):
//    callers zero them first. This lets gradients accumulate over
//    micro-batches and lets a branch's input gradient land directly in the
//    residual stream's gradient.
//  - A layer with weights has separate _backward_dx and _backward_dw calls,
//    so a zero-bubble pipeline can run them at different times, and every
//    linear is a plain function of the weight pointer it is given, so tensor
//    parallelism can pass a shard (rows of W for a column split).
//  - Matrix products go through cblas_sgemm; everything else is plain loops.
#pragma once

#include <cstddef>

namespace cclz::train {

// Token + position embedding: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].
// tokens (B,T) in [0,V); wte (V,C); wpe (>=T,C); out (B,T,C).
void embedding_forward(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C);
// The input is integer tokens, so there is only dW: dwte[tokens[b,t]] += dout[b,t], dwpe[t] += dout[b,t].
void embedding_backward_dw(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C);

// LayerNorm over the last dimension (Ba, Kiros, Hinton 2016), eps 1e-5:
// out = (x - mean) * rstd * weight + bias, rstd = 1 / sqrt(var + eps) with the
// biased variance. inp, out (N,C); weight, bias (C); mean, rstd (N) saved for backward.
inline constexpr float kLayerNormEps = 1e-5f;
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);
// dinp += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * weight, xhat = (x - mean) * rstd.
void layernorm_backward_dx(float* dinp, const float* dout, const float* inp, const float* weight, const float* mean,
                           const float* rstd, int N, int C);
// dweight += sum_n dout * xhat, dbias += sum_n dout.
void layernorm_backward_dw(float* dweight, float* dbias, const float* dout, const float* inp, const float* mean,
                           const float* rstd, int N, int C);

// Linear: out (N,OC) = inp (N,C) . weight (OC,C)^T + bias (OC); bias may be null.
void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC);
// dinp (N,C) += dout (N,OC) . weight (OC,C)
void linear_backward_dx(float* dinp, const float* dout, const float* weight, int N, int C, int OC);
// dweight (OC,C) += dout^T . inp; dbias (OC) += sum_n dout (dbias may be null).
void linear_backward_dw(float* dweight, float* dbias, const float* dout, const float* inp, int N, int C, int OC);

// Causal multi-head self-attention (Vaswani et al. 2017) on a fused qkv
// input (B,T,3C) laid out [q | k | v], head h at channels h*hs..(h+1)*hs,
// hs = C/NH: att = softmax(q k^T / sqrt(hs), masked to t2 <= t), out = att v.
// out (B,T,C); att (B,NH,T,T) saved for backward, zero above the diagonal.
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
// No weights, so one call: dqkv (B,T,3C) += gradient. scratch holds T*T floats.
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att, int B,
                        int T, int C, int NH);

// GELU, tanh approximation (Hendrycks, Gimpel 2016; as in GPT-2):
// gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). n elements.
void gelu_forward(float* out, const float* inp, std::size_t n);
void gelu_backward(float* dinp, const float* dout, const float* inp, std::size_t n);

// Residual add: out = a + b; backward da += dout, db += dout. n elements.
// (The GPT backward does not call residual_backward: a residual passes its
// gradient unchanged, so branch gradients are added straight into the
// residual stream's gradient. It is here for callers that keep them apart.)
void residual_forward(float* out, const float* a, const float* b, std::size_t n);
void residual_backward(float* da, float* db, const float* dout, std::size_t n);

// Softmax cross-entropy over V classes per row, N rows:
// probs = softmax(logits), losses[n] = -log probs[n, targets[n]].
// probs may alias logits (computed in place); targets null computes probs only.
void crossentropy_forward(float* losses, float* probs, const float* logits, const int* targets, int N, int V);
// For loss = sum_n dloss * losses[n]: dlogits += dloss * (probs - onehot(targets)).
// dloss = 1/N gives the gradient of the mean loss.
void crossentropy_backward(float* dlogits, const float* probs, const int* targets, float dloss, int N, int V);

}  // namespace cclz::train
