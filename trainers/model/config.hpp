// Shape of the reference GPT: a decoder-only transformer over a byte-level
// vocabulary. Defaults are sized to train visibly in minutes on 2 cores
// (about 0.83 M parameters).
#pragma once

#include <cstddef>
#include <string>

#include "cclz/types.hpp"

namespace cclz::train {

struct ModelConfig {
  int vocab_size = 256;  // byte-level: every byte value is a token
  int context = 64;      // maximum sequence length T (size of the position table)
  int layers = 4;        // transformer blocks L
  int width = 128;       // channels C
  int heads = 4;         // attention heads NH; head size C / NH
  int mlp_ratio = 4;     // MLP hidden width = mlp_ratio * C
};

// Checks every field (positive, width divisible by heads, sizes that fit the
// int arithmetic of the kernels); the message names the offending field.
Status validate(const ModelConfig& cfg);

// "L=4 C=128 NH=4 T=64 V=256 mlp=4"
std::string describe(const ModelConfig& cfg);

}  // namespace cclz::train
