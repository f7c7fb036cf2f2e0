// fp16: cast to IEEE half, summed in f16. The cast itself is in cast.cpp.
#include "compressors/common.hpp"

namespace cclz::compress {

extern const CompressorDesc compressor_fp16 = {
    "fp16", "cast to IEEE half, summed in f16", "",
    [](const CompressorSpec& spec, std::unique_ptr<Compressor>* out) { return make_cast(spec, CastTo::f16, out); },
};

}  // namespace cclz::compress
