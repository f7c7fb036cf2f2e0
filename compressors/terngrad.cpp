// terngrad[:bucket=N][,seed=S]: TernGrad (Wen et al. 2017). Per bucket of N
// elements (default 512), scale s = max |x_i|; element i is sent as
// s * sign(x_i) * b_i with b_i = 1 with probability |x_i| / s, else 0:
// unbiased, E||Q(x) - x||^2 = sum_i (s |x_i| - x_i^2) per bucket. (The paper
// takes one scale per layer; bucket=<count> gives that.) Payload: the level
// layout of quant.hpp with one level bit: per bucket a f32 scale and two
// bit-planes (sign, non-zero), 4 + N / 4 bytes; re-quantizable.
// Cost: one read of the input, one write of the payload (blockquant.cpp).
#include "compressors/quant.hpp"

namespace cclz::compress {

extern const CompressorDesc compressor_terngrad = {
    "terngrad", "ternary {-1, 0, +1} * max|g| per bucket, stochastic (unbiased)", "bucket,seed",
    [](const CompressorSpec& spec, std::unique_ptr<Compressor>* out) {
      return quant::make_levels(spec, quant::Norm::max, out);
    },
};

}  // namespace cclz::compress
