// none: the input as it is, summed in its own dtype (the uncompressed baseline). The cast itself is in cast.cpp.
#include "compressors/common.hpp"

namespace cclz::compress {

extern const CompressorDesc compressor_none = {
    "none", "the input as it is, summed in its own dtype (the uncompressed baseline)", "",
    [](const CompressorSpec& spec, std::unique_ptr<Compressor>* out) { return make_cast(spec, CastTo::same, out); },
};

}  // namespace cclz::compress
