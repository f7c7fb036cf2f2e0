// Double-precision reference forwards of every GPT layer and of the whole
// model, written independently of trainers/model (plain loops, no BLAS, no
// shared code), plus the finite-difference and comparison helpers of the
// gradient checks. The checks compare the f32 backward kernels against
// central differences of these references, so an error in a backward kernel
// cannot be masked by the same error in its forward.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <numbers>
#include <string>
#include <vector>

#include "model/config.hpp"
#include "model/params.hpp"

namespace cclz::train::ref {

using Vec = std::vector<double>;

inline Vec to_double(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

inline void embedding(Vec& out, const std::vector<int>& tok, const Vec& wte, const Vec& wpe, int B, int T, int C) {
  out.assign(static_cast<std::size_t>(B) * T * C, 0.0);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c) {
        const std::size_t bt = static_cast<std::size_t>(b) * T + t;
        out[bt * C + c] = wte[static_cast<std::size_t>(tok[bt]) * C + c] + wpe[static_cast<std::size_t>(t) * C + c];
      }
}

inline void layernorm(Vec& out, const Vec& x, const Vec& w, const Vec& b, int N, int C, double eps = 1e-5) {
  out.assign(static_cast<std::size_t>(N) * C, 0.0);
  for (int n = 0; n < N; ++n) {
    const double* r = x.data() + static_cast<std::size_t>(n) * C;
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += r[c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (r[c] - m) * (r[c] - m);
    v /= C;
    const double rs = 1.0 / std::sqrt(v + eps);
    for (int c = 0; c < C; ++c) out[static_cast<std::size_t>(n) * C + c] = (r[c] - m) * rs * w[c] + b[c];
  }
}

// out (N,OC) = x (N,C) W^T (W is (OC,C)) + bias; bias empty = none.
inline void linear(Vec& out, const Vec& x, const Vec& W, const Vec& bias, int N, int C, int OC) {
  out.assign(static_cast<std::size_t>(N) * OC, 0.0);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = bias.empty() ? 0.0 : bias[o];
      for (int c = 0; c < C; ++c) s += x[static_cast<std::size_t>(n) * C + c] * W[static_cast<std::size_t>(o) * C + c];
      out[static_cast<std::size_t>(n) * OC + o] = s;
    }
}

inline void attention(Vec& out, const Vec& qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  out.assign(static_cast<std::size_t>(B) * T * C, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  auto at = [&](int b, int t, int part, int h, int i) {
    return qkv[(static_cast<std::size_t>(b) * T + t) * 3 * C + static_cast<std::size_t>(part) * C +
               static_cast<std::size_t>(h) * hs + i];
  };
  std::vector<double> w(static_cast<std::size_t>(T));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        double mx = -1e300;
        for (int u = 0; u <= t; ++u) {
          double s = 0;
          for (int i = 0; i < hs; ++i) s += at(b, t, 0, h, i) * at(b, u, 1, h, i);
          w[u] = s * scale;
          mx = std::max(mx, w[u]);
        }
        double z = 0;
        for (int u = 0; u <= t; ++u) z += (w[u] = std::exp(w[u] - mx));
        for (int i = 0; i < hs; ++i) {
          double s = 0;
          for (int u = 0; u <= t; ++u) s += w[u] / z * at(b, u, 2, h, i);
          out[(static_cast<std::size_t>(b) * T + t) * C + static_cast<std::size_t>(h) * hs + i] = s;
        }
      }
}

inline double gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}

// Per-row -log softmax(logits)[target].
inline void crossentropy(Vec& losses, const Vec& logits, const std::vector<int>& targets, int N, int V) {
  losses.assign(static_cast<std::size_t>(N), 0.0);
  for (int n = 0; n < N; ++n) {
    const double* z = logits.data() + static_cast<std::size_t>(n) * V;
    double mx = z[0];
    for (int v = 1; v < V; ++v) mx = std::max(mx, z[v]);
    double s = 0;
    for (int v = 0; v < V; ++v) s += std::exp(z[v] - mx);
    losses[n] = mx + std::log(s) - z[targets[n]];
  }
}

// The whole GPT in double, reading every tensor by name from the table.
inline double model_loss(const ModelConfig& cfg, const ParamTable& table, const Vec& params,
                         const std::vector<int>& inputs, const std::vector<int>& targets, int B, int T) {
  const int C = cfg.width, NH = cfg.heads, V = cfg.vocab_size, H = cfg.mlp_ratio * cfg.width, N = B * T;
  auto tensor = [&](const std::string& name) {
    const ParamTensor& t = table.tensors[static_cast<std::size_t>(table.find(name))];
    return Vec(params.begin() + static_cast<std::ptrdiff_t>(t.offset),
               params.begin() + static_cast<std::ptrdiff_t>(t.offset + t.numel));
  };
  Vec x, ln, qkv, att, proj, fc;
  embedding(x, inputs, tensor("wte"), tensor("wpe"), B, T, C);
  for (int l = 0; l < cfg.layers; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    layernorm(ln, x, tensor(p + "ln1.weight"), tensor(p + "ln1.bias"), N, C);
    linear(qkv, ln, tensor(p + "attn.qkv.weight"), tensor(p + "attn.qkv.bias"), N, C, 3 * C);
    attention(att, qkv, B, T, C, NH);
    linear(proj, att, tensor(p + "attn.proj.weight"), tensor(p + "attn.proj.bias"), N, C, C);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += proj[i];
    layernorm(ln, x, tensor(p + "ln2.weight"), tensor(p + "ln2.bias"), N, C);
    linear(fc, ln, tensor(p + "mlp.fc.weight"), tensor(p + "mlp.fc.bias"), N, C, H);
    for (double& v : fc) v = gelu(v);
    linear(proj, fc, tensor(p + "mlp.proj.weight"), tensor(p + "mlp.proj.bias"), N, H, C);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += proj[i];
  }
  layernorm(ln, x, tensor("lnf.weight"), tensor("lnf.bias"), N, C);
  Vec logits, losses;
  linear(logits, ln, tensor("lm_head.weight"), {}, N, C, V);
  crossentropy(losses, logits, targets, N, V);
  double s = 0;
  for (double l : losses) s += l;
  return s / N;
}

// Central differences of f with respect to every element of x (perturbed in
// place and restored): (f(x + h e_i) - f(x - h e_i)) / 2h.
inline Vec numeric_grad(const std::function<double()>& f, Vec& x, double h = 1e-5) {
  Vec g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double fp = f();
    x[i] = keep - h;
    const double fm = f();
    x[i] = keep;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

// Normwise relative error max_i |a_i - n_i| / max_i |n_i| (the scale floored
// at 1e-12), printed so the margin to the tolerance is visible in the log.
inline double rel_error(const std::vector<float>& a, const Vec& n, const char* what) {
  double err = 0, scale = 1e-12;
  for (std::size_t i = 0; i < n.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(a[i]) - n[i]));
    scale = std::max(scale, std::fabs(n[i]));
  }
  std::printf("  %-28s max|err| %.3e  max|ref| %.3e  rel %.3e\n", what, err, scale, err / scale);
  return err / scale;
}

}  // namespace cclz::train::ref
