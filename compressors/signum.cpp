// signum[:beta=B]: Signum (Bernstein et al. 2018): the sign of the momentum
// m <- beta m + (1 - beta) g (beta in [0, 1), default 0.9; m starts at 0 and
// is saved with the state), sent as the sign payload with scale mean |m|,
// so the decoded sum keeps the gradient's magnitude. Payload: f32 scale then
// ceil(n/8) bytes of sign bits (quant.hpp); gather-only. Cost: a read of g,
// a read-modify-write of m, n/8 bytes written (signs.cpp).
#include "compressors/quant.hpp"

namespace cclz::compress {

extern const CompressorDesc compressor_signum = {
    "signum", "sign of the momentum beta*m + (1-beta)*g, scale mean|m| (Signum)", "beta",
    [](const CompressorSpec& spec, std::unique_ptr<Compressor>* out) { return quant::make_sign(spec, true, out); },
};

}  // namespace cclz::compress
