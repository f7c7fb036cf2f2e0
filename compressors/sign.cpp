// sign: 1 bit per element, the sign of g, with one scale per tensor, the
// mean |g| (scaled sign of EF-signSGD, Karimireddy et al. 2019; use it as
// ef+sign for their error feedback). Element i decodes to +-mean|g|
// (+ for g_i = +0, - for -0). Payload: f32 scale then ceil(n/8) bytes of
// sign bits (quant.hpp); gather-only. Cost: one read of the input, n/8
// bytes written (signs.cpp).
#include "compressors/quant.hpp"

namespace cclz::compress {

extern const CompressorDesc compressor_sign = {
    "sign", "1 bit per element (sign) with scale mean|g| per tensor (EF-signSGD)", "",
    [](const CompressorSpec& spec, std::unique_ptr<Compressor>* out) { return quant::make_sign(spec, false, out); },
};

}  // namespace cclz::compress
