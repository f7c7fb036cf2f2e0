// A shared module without the plugin entry point, for the error test.
extern "C" int cclz_not_a_compressor_plugin() { return 0; }
