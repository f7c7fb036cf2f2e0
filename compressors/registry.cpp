// The one list of compressors. Adding one: a new file exporting a
// CompressorDesc, plus one line here (and its file in compressors/meson.build).
// Plugins named by CCLZ_COMPRESSOR_PLUGIN (or load_compressor_plugin) add
// their descriptors after these; the plugin list is this file's only mutable
// global, guarded by a mutex.
#include <dlfcn.h>

#include <array>
#include <cstdlib>
#include <mutex>

#include "compressors/common.hpp"

namespace cclz {

namespace compress {
extern const CompressorDesc compressor_none;
extern const CompressorDesc compressor_fp16;
extern const CompressorDesc compressor_bf16;
extern const CompressorDesc compressor_topk;
extern const CompressorDesc compressor_randk;
extern const CompressorDesc compressor_threshold;
extern const CompressorDesc compressor_dgc;
extern const CompressorDesc compressor_qsgd;
extern const CompressorDesc compressor_terngrad;
extern const CompressorDesc compressor_int8;
extern const CompressorDesc compressor_int4;
extern const CompressorDesc compressor_sign;
extern const CompressorDesc compressor_signum;
extern const CompressorDesc compressor_powersgd;
}  // namespace compress

namespace {

const auto kBuiltin = std::to_array<const CompressorDesc*>({
    &compress::compressor_none,
    &compress::compressor_fp16,
    &compress::compressor_bf16,
    &compress::compressor_topk,
    &compress::compressor_randk,
    &compress::compressor_threshold,
    &compress::compressor_dgc,
    &compress::compressor_qsgd,
    &compress::compressor_terngrad,
    &compress::compressor_int8,
    &compress::compressor_int4,
    &compress::compressor_sign,
    &compress::compressor_signum,
    &compress::compressor_powersgd,
});

struct Plugin {
  std::string path;
  std::vector<const CompressorDesc*> descs;
};

std::mutex g_plugin_mutex;
std::vector<Plugin> g_plugins;  // dlopen handles are never closed: compressors may outlive any caller

const CompressorDesc* find_desc(std::string_view name) {
  for (const CompressorDesc* d : kBuiltin) {
    if (name == d->name) return d;
  }
  std::lock_guard lock(g_plugin_mutex);
  for (const Plugin& p : g_plugins) {
    for (const CompressorDesc* d : p.descs) {
      if (name == d->name) return d;
    }
  }
  return nullptr;
}

std::string known_names() {
  std::string s;
  for (const CompressorDesc* d : compressor_descs()) s += (s.empty() ? "" : ", ") + std::string(d->name);
  return s;
}

bool key_accepted(const char* keys, std::string_view key) {
  std::string_view ks = keys;
  while (!ks.empty()) {
    const std::size_t comma = ks.find(',');
    if (ks.substr(0, comma) == key) return true;
    if (comma == std::string_view::npos) break;
    ks.remove_prefix(comma + 1);
  }
  return false;
}

Status plugin_error(const std::string& path, const std::string& problem) {
  return {Result::invalid_argument, "compressor plugin '" + path + "': " + problem};
}

}  // namespace

std::vector<const CompressorDesc*> compressor_descs() {
  std::vector<const CompressorDesc*> all(kBuiltin.begin(), kBuiltin.end());
  std::lock_guard lock(g_plugin_mutex);
  for (const Plugin& p : g_plugins) all.insert(all.end(), p.descs.begin(), p.descs.end());
  return all;
}

Status load_compressor_plugin(const std::string& path) {
  std::lock_guard lock(g_plugin_mutex);
  for (const Plugin& p : g_plugins) {
    if (p.path == path) return {};
  }
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* why = dlerror();
    return plugin_error(path, std::string("cannot load it: ") + (why != nullptr ? why : "dlopen failed"));
  }
  auto fn = reinterpret_cast<CompressorPluginFn>(dlsym(h, kCompressorPluginSymbol));
  if (fn == nullptr) {
    dlclose(h);
    return plugin_error(path, std::string("it has no symbol ") + kCompressorPluginSymbol +
                                  " (export it as extern \"C\"; see cclz/compress.hpp)");
  }
  std::size_t count = 0;
  const CompressorDesc* descs = fn(&count);
  Plugin p{path, {}};
  for (std::size_t i = 0; i < count; ++i) {
    const CompressorDesc* d = descs + i;
    CompressorSpec probe;
    if (d->name == nullptr || d->make == nullptr || d->keys == nullptr ||
        !parse_compressor_spec(d->name, &probe).ok() || probe.name != d->name || !probe.params.empty()) {
      dlclose(h);
      return plugin_error(path, "descriptor " + std::to_string(i) + " has no valid name, keys or make function");
    }
    bool clash = false;
    for (const CompressorDesc* b : kBuiltin) clash = clash || probe.name == b->name;
    for (const Plugin& q : g_plugins) {
      for (const CompressorDesc* b : q.descs) clash = clash || probe.name == b->name;
    }
    for (const CompressorDesc* b : p.descs) clash = clash || probe.name == b->name;
    if (clash) {
      dlclose(h);
      return plugin_error(path, "compressor name '" + probe.name + "' is already registered");
    }
    p.descs.push_back(d);
  }
  g_plugins.push_back(std::move(p));
  return {};
}

Status make_compressor(std::string_view text, std::unique_ptr<Compressor>* out) {
  if (const char* env = std::getenv("CCLZ_COMPRESSOR_PLUGIN"); env != nullptr && *env != '\0') {
    if (Status s = load_compressor_plugin(env); !s.ok()) {
      return {s.code(), "CCLZ_COMPRESSOR_PLUGIN: " + s.message()};
    }
  }
  CompressorSpec spec;
  if (Status s = parse_compressor_spec(text, &spec); !s.ok()) return s;
  const CompressorDesc* d = find_desc(spec.name);
  if (d == nullptr) return spec_error(spec, "unknown compressor '" + spec.name + "' (known: " + known_names() + ")");
  for (const auto& [key, value] : spec.params) {
    if (!key_accepted(d->keys, key)) {
      return spec_error(spec, "unknown parameter '" + key + "' for " + spec.name + " (accepted: " +
                                  (*d->keys != '\0' ? std::string(d->keys) : std::string("none")) + ")");
    }
  }
  CompressorSpec inner_spec = spec;
  inner_spec.feedback = Feedback::none;
  std::unique_ptr<Compressor> c;
  if (Status s = d->make(inner_spec, &c); !s.ok()) return s;
  if (!c) return spec_error(spec, "internal: " + spec.name + "'s make() returned no compressor");
  if (spec.feedback != Feedback::none) return compress::make_error_feedback(spec, std::move(c), out);
  *out = std::move(c);
  return {};
}

}  // namespace cclz
