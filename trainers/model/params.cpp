// Builds the GPT parameter table (layer-major, forward order) and fills it
// with the seeded GPT-2-style initialisation described in params.hpp.
#include "model/params.hpp"

#include <cmath>

#include "common/rng.hpp"

namespace cclz::train {

const char* param_kind_name(ParamKind k) noexcept {
  switch (k) {
    case ParamKind::embedding: return "embedding";
    case ParamKind::matrix: return "matrix";
    case ParamKind::bias: return "bias";
    case ParamKind::norm_weight: return "norm_weight";
    case ParamKind::norm_bias: return "norm_bias";
  }
  return "unknown";
}

int ParamTable::find(std::string_view name) const noexcept {
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

std::size_t ParamTable::group_begin(int g) const noexcept {
  for (const auto& t : tensors) {
    if (t.group == g) return t.offset;
  }
  return total;
}

std::size_t ParamTable::group_end(int g) const noexcept {
  std::size_t end = 0;
  for (const auto& t : tensors) {
    if (t.group == g) end = t.offset + t.numel;
  }
  return end;
}

ParamTable make_param_table(const ModelConfig& cfg) {
  ParamTable table;
  const int C = cfg.width;
  const int H = cfg.mlp_ratio * C;
  const float std_base = 0.02f;
  const float std_resid = std_base / std::sqrt(2.0f * static_cast<float>(cfg.layers));
  auto add = [&](std::string name, std::vector<int> shape, int group, ParamKind kind, float std_dev,
                 float value = 0.0f) {
    ParamTensor t;
    t.name = std::move(name);
    t.numel = 1;
    for (int d : shape) t.numel *= static_cast<std::size_t>(d);
    t.shape = std::move(shape);
    t.offset = table.total;
    t.group = group;
    t.kind = kind;
    t.weight_decay = kind == ParamKind::matrix;
    t.init_std = std_dev;
    t.init_value = value;
    table.total += t.numel;
    table.tensors.push_back(std::move(t));
  };

  add("wte", {cfg.vocab_size, C}, 0, ParamKind::embedding, std_base);
  add("wpe", {cfg.context, C}, 0, ParamKind::embedding, std_base);
  for (int l = 0; l < cfg.layers; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    const int g = l + 1;
    add(p + "ln1.weight", {C}, g, ParamKind::norm_weight, 0.0f, 1.0f);
    add(p + "ln1.bias", {C}, g, ParamKind::norm_bias, 0.0f);
    add(p + "attn.qkv.weight", {3 * C, C}, g, ParamKind::matrix, std_base);
    add(p + "attn.qkv.bias", {3 * C}, g, ParamKind::bias, 0.0f);
    add(p + "attn.proj.weight", {C, C}, g, ParamKind::matrix, std_resid);
    add(p + "attn.proj.bias", {C}, g, ParamKind::bias, 0.0f);
    add(p + "ln2.weight", {C}, g, ParamKind::norm_weight, 0.0f, 1.0f);
    add(p + "ln2.bias", {C}, g, ParamKind::norm_bias, 0.0f);
    add(p + "mlp.fc.weight", {H, C}, g, ParamKind::matrix, std_base);
    add(p + "mlp.fc.bias", {H}, g, ParamKind::bias, 0.0f);
    add(p + "mlp.proj.weight", {C, H}, g, ParamKind::matrix, std_resid);
    add(p + "mlp.proj.bias", {C}, g, ParamKind::bias, 0.0f);
  }
  const int gf = cfg.layers + 1;
  add("lnf.weight", {C}, gf, ParamKind::norm_weight, 0.0f, 1.0f);
  add("lnf.bias", {C}, gf, ParamKind::norm_bias, 0.0f);
  add("lm_head.weight", {cfg.vocab_size, C}, gf, ParamKind::matrix, std_base);
  table.num_groups = cfg.layers + 2;
  return table;
}

void init_params(float* params, const ParamTable& table, std::uint64_t seed) {
  for (std::size_t i = 0; i < table.tensors.size(); ++i) {
    const ParamTensor& t = table.tensors[i];
    float* p = params + t.offset;
    if (t.init_std == 0.0f) {
      for (std::size_t j = 0; j < t.numel; ++j) p[j] = t.init_value;
      continue;
    }
    Rng rng(hash_combine(seed, i));
    for (std::size_t j = 0; j < t.numel; ++j) p[j] = static_cast<float>(t.init_std * rng.normal());
  }
}

}  // namespace cclz::train
