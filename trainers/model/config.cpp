// ModelConfig validation. Bounds keep every (B*T, 4C) or (T, T) product well
// inside int, the type the kernels and cblas use for dimensions.
#include "model/config.hpp"

#include <cstdio>

namespace cclz::train {

namespace {
Status bad(const char* field, int value, const char* want) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "model config: %s = %d, want %s", field, value, want);
  return {Result::invalid_argument, buf};
}
}  // namespace

Status validate(const ModelConfig& cfg) {
  if (cfg.vocab_size < 2 || cfg.vocab_size > (1 << 20)) return bad("vocab_size", cfg.vocab_size, "2..1048576");
  if (cfg.context < 1 || cfg.context > 8192) return bad("context", cfg.context, "1..8192");
  if (cfg.layers < 1 || cfg.layers > 256) return bad("layers", cfg.layers, "1..256");
  if (cfg.width < 1 || cfg.width > 16384) return bad("width", cfg.width, "1..16384");
  if (cfg.heads < 1 || cfg.heads > cfg.width) return bad("heads", cfg.heads, "1..width");
  if (cfg.width % cfg.heads != 0) return bad("heads", cfg.heads, "a divisor of width");
  if (cfg.mlp_ratio < 1 || cfg.mlp_ratio > 16) return bad("mlp_ratio", cfg.mlp_ratio, "1..16");
  return {};
}

std::string describe(const ModelConfig& cfg) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "L=%d C=%d NH=%d T=%d V=%d mlp=%d", cfg.layers, cfg.width, cfg.heads, cfg.context,
                cfg.vocab_size, cfg.mlp_ratio);
  return buf;
}

}  // namespace cclz::train
