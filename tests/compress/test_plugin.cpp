// User compressors from a shared object: CCLZ_COMPRESSOR_PLUGIN and
// load_compressor_plugin, and their errors. The modules' paths come from the
// test's environment (tests/compress/meson.build).
#include <gmock/gmock.h>

#include <cstdlib>

#include "helpers.hpp"

namespace cclz::test {
namespace {

using ::testing::HasSubstr;

std::string module_path(const char* var) {
  const char* p = std::getenv(var);
  EXPECT_NE(p, nullptr) << var << " is not set; run through meson test";
  return p != nullptr ? p : "";
}

struct EnvGuard {
  ~EnvGuard() { unsetenv("CCLZ_COMPRESSOR_PLUGIN"); }
};

TEST(Plugin, LoadsFromTheEnvironmentAndRoundTrips) {
  EnvGuard guard;
  const std::string path = module_path("CCLZ_TEST_PLUGIN");
  std::unique_ptr<Compressor> c;
  EXPECT_THAT(make_compressor("example_scale", &c).message(), HasSubstr("unknown compressor 'example_scale'"));
  ASSERT_EQ(setenv("CCLZ_COMPRESSOR_PLUGIN", path.c_str(), 1), 0);
  const Status s = make_compressor("ef+example_scale:factor=4", &c);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(c->name(), "ef+example_scale");
  bool listed = false;
  for (const CompressorDesc* d : compressor_descs()) listed = listed || std::string(d->name) == "example_scale";
  EXPECT_TRUE(listed);

  auto plain = make("example_scale:factor=4");
  auto st = state_for(*plain, 3);
  const std::vector<float> x = {1.0f, -2.0f, 0.5f};
  Payload p;
  ASSERT_TRUE(plain->begin(*st, bytes_of(x), &p).ok());
  EXPECT_EQ(widen(p.bytes, DataType::f32), (std::vector<float>{4.0f, -8.0f, 2.0f}));
  std::vector<std::span<const std::byte>> agg{p.bytes};
  std::vector<float> out(3);
  ASSERT_TRUE(plain->finish(*st, agg, std::as_writable_bytes(std::span(out))).ok());
  EXPECT_EQ(out, x);

  // Its own checks run: dtype, unknown key, bad value.
  std::unique_ptr<CompressorState> bad;
  EXPECT_THAT(plain->make_state(TensorDesc{3, DataType::f16, 0, 0}, &bad).message(),
              HasSubstr("dtype f16 is not supported by example_scale"));
  EXPECT_THAT(make_compressor("example_scale:gain=2", &c).message(),
              HasSubstr("unknown parameter 'gain' for example_scale (accepted: factor)"));
  EXPECT_THAT(make_compressor("example_scale:factor=0", &c).message(),
              HasSubstr("compressor spec 'example_scale:factor=0': factor must not be 0"));
  // Loading the same path again is a no-op.
  EXPECT_TRUE(load_compressor_plugin(path).ok());
}

TEST(Plugin, UnloadableFileIsAClearError) {
  EnvGuard guard;
  ASSERT_EQ(setenv("CCLZ_COMPRESSOR_PLUGIN", "/nonexistent/libnothing.so", 1), 0);
  std::unique_ptr<Compressor> c;
  const Status s = make_compressor("topk", &c);
  EXPECT_EQ(s.code(), Result::invalid_argument);
  EXPECT_THAT(s.message(), HasSubstr("CCLZ_COMPRESSOR_PLUGIN: compressor plugin '/nonexistent/libnothing.so': "
                                     "cannot load it: /nonexistent/libnothing.so: cannot open shared object file"));
  EXPECT_FALSE(c);
}

TEST(Plugin, ModuleWithoutEntryPointIsAClearError) {
  EnvGuard guard;
  const std::string path = module_path("CCLZ_TEST_PLUGIN_NOSYM");
  ASSERT_EQ(setenv("CCLZ_COMPRESSOR_PLUGIN", path.c_str(), 1), 0);
  std::unique_ptr<Compressor> c;
  const Status s = make_compressor("topk", &c);
  EXPECT_THAT(s.message(), HasSubstr("compressor plugin '" + path +
                                     "': it has no symbol cclz_compressor_plugin_v1 (export it as extern \"C\""));
  EXPECT_THAT(load_compressor_plugin(path).message(), HasSubstr("no symbol cclz_compressor_plugin_v1"));
}

}  // namespace
}  // namespace cclz::test
