// bf16: cast to bfloat16, summed in bf16. The cast itself is in cast.cpp.
#include "compressors/common.hpp"

namespace cclz::compress {

extern const CompressorDesc compressor_bf16 = {
    "bf16", "cast to bfloat16, summed in bf16", "",
    [](const CompressorSpec& spec, std::unique_ptr<Compressor>* out) { return make_cast(spec, CastTo::bf16, out); },
};

}  // namespace cclz::compress
