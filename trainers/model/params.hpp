// The parameter table of the reference GPT: every weight lives in one
// contiguous f32 allocation, and this table names each tensor's slice
// (name, shape, offset, size, layer). Gradients, optimizer moments and any
// shard use the same offsets, so a data-parallel trainer can bucket the
// gradient buffer by walking the table backwards and ZeRO can cut it into
// rank ranges without knowing the model.
//
// Layout is layer-major, in forward order: group 0 = embeddings (wte, wpe),
// groups 1..L = block l-1's twelve tensors, group L+1 = final LayerNorm and
// the LM head. Each group is one contiguous range, and the groups' ranges
// appear in the order backward finishes them reversed: backward completes
// group L+1 first and group 0 last.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.hpp"

namespace cclz::train {

enum class ParamKind {
  embedding,    // wte, wpe
  matrix,       // linear weights, LM head
  bias,         // linear biases
  norm_weight,  // LayerNorm gain
  norm_bias,    // LayerNorm shift
};
const char* param_kind_name(ParamKind k) noexcept;

struct ParamTensor {
  std::string name;          // "wte", "h.0.attn.qkv.weight", "lnf.weight", "lm_head.weight", ...
  std::vector<int> shape;    // one or two dimensions, row-major
  std::size_t offset = 0;    // in floats from the start of the allocation
  std::size_t numel = 0;
  int group = 0;             // 0 embeddings, 1..L blocks, L+1 final; see the layout note above
  ParamKind kind = ParamKind::matrix;
  bool weight_decay = false; // AdamW decays matrices only (see optim/optimizer.hpp)
  float init_std = 0.0f;     // normal(0, init_std); 0 means constant init_value
  float init_value = 0.0f;
};

struct ParamTable {
  std::vector<ParamTensor> tensors;
  std::size_t total = 0;  // floats in the allocation
  int num_groups = 0;     // L + 2

  // Index of the named tensor, or -1.
  int find(std::string_view name) const noexcept;
  // [begin, end) offsets (floats) covered by group g.
  std::size_t group_begin(int g) const noexcept;
  std::size_t group_end(int g) const noexcept;
};

// The table for cfg (the configuration must validate).
ParamTable make_param_table(const ModelConfig& cfg);

// GPT-2-style initialisation (Radford et al. 2019): every matrix and
// embedding normal(0, 0.02); the two projections that write into the
// residual stream (attn.proj, mlp.proj) normal(0, 0.02 / sqrt(2L)) so the
// stream's variance does not grow with depth; biases 0; LayerNorm gain 1,
// shift 0. Tensor i draws from its own stream seeded by (seed, i), so each
// tensor's values do not depend on the others or on the table's order.
void init_params(float* params, const ParamTable& table, std::uint64_t seed);

}  // namespace cclz::train
