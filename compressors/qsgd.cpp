// qsgd:bits=B,bucket=N[,seed=S]: QSGD (Alistarh et al. 2017). Per bucket of N
// elements (default 512), scale = ||bucket||_2 and s = 2^B - 1 levels
// (B in 1..8, default 4); element i is sent as its sign and the level
// floor(s |x_i| / scale + u_i), u_i uniform: unbiased, with
// E||Q(x) - x||^2 <= min(N / s^2, sqrt(N) / s) ||x||^2 per bucket.
// Payload: per bucket a f32 scale and B + 1 bit-planes (quant.hpp), so
// 4 + (B + 1) N / 8 bytes; re-quantizable. Cost: one read of the input, one
// write of the payload (blockquant.cpp).
#include "compressors/quant.hpp"

namespace cclz::compress {

extern const CompressorDesc compressor_qsgd = {
    "qsgd", "stochastic rounding to 2^bits-1 levels of |g| / ||bucket||_2, sign kept (unbiased)", "bits,bucket,seed",
    [](const CompressorSpec& spec, std::unique_ptr<Compressor>* out) {
      return quant::make_levels(spec, quant::Norm::l2, out);
    },
};

}  // namespace cclz::compress
