// int8[:block=N][,stochastic=1][,seed=S]: blockwise 8-bit quantization with a
// per-block absmax scale, as ZeRO++'s quantized collectives (Wang et al.
// 2023). Per block of N elements (default 256): scale = max |x_i| / 127,
// q_i = x_i / scale rounded to nearest even (error <= scale / 2), or with
// stochastic=1 rounded down or up with the probability that makes it
// unbiased. Payload: per block a f32 scale and N int8, 4 + N bytes;
// re-quantizable. Cost: one read of the input, one write of the payload
// (blockquant.cpp).
#include "compressors/quant.hpp"

namespace cclz::compress {

extern const CompressorDesc compressor_int8 = {
    "int8", "blockwise int8 with an absmax scale per block; round to nearest or stochastic", "block,stochastic,seed",
    [](const CompressorSpec& spec, std::unique_ptr<Compressor>* out) { return quant::make_absmax(spec, 8, out); },
};

}  // namespace cclz::compress
