// int4[:block=N][,stochastic=1][,seed=S]: blockwise 4-bit quantization with a
// per-block absmax scale (ZeRO++'s int4 weight/gradient groups). Per block
// of N elements (default 256): scale = max |x_i| / 7, q_i in [-7, 7] rounded
// to nearest even (error <= scale / 2) or stochastically (unbiased).
// Payload: per block a f32 scale and ceil(N / 2) bytes of two's-complement
// nibbles, element 2j in the low nibble of byte j; re-quantizable.
// Cost: one read of the input, one write of the payload (blockquant.cpp).
#include "compressors/quant.hpp"

namespace cclz::compress {

extern const CompressorDesc compressor_int4 = {
    "int4", "blockwise int4 with an absmax scale per block; round to nearest or stochastic", "block,stochastic,seed",
    [](const CompressorSpec& spec, std::unique_ptr<Compressor>* out) { return quant::make_absmax(spec, 4, out); },
};

}  // namespace cclz::compress
