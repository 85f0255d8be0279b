#include "proxy_runner.h"

#include "error.h"

namespace llama {

std::string default_proxy_model(const std::string& model) {
  return model == "shakespeare-base" ? "shakespeare-small" : "";
}

ProxyRunner::ProxyRunner(const Model& proxy_model, kvsdk_cache* large) : large_(large) {
  check(kvsdk_context_create(&ctx_, nullptr), "kvsdk_context_create");
  try {
    session_ = std::make_unique<Session>(proxy_model, ctx_, nullptr);
    link();
  } catch (...) {
    session_.reset();
    kvsdk_context_destroy(ctx_);
    throw;
  }
}

ProxyRunner::ProxyRunner(const Model& proxy_model, kvsdk_cache* large, const std::string& snapshot,
                         int position)
    : large_(large) {
  check(kvsdk_context_create(&ctx_, nullptr), "kvsdk_context_create");
  kvsdk_cache* cache = nullptr;
  try {
    const kvsdk_geometry g = geometry_of(proxy_model.config());
    check(kvsdk_cache_load(&cache, ctx_, snapshot.c_str(), &g, nullptr), "kvsdk_cache_load (proxy)");
    session_ = std::make_unique<Session>(proxy_model, cache, position);  // owns `cache` from here
    cache = nullptr;
    link();
  } catch (...) {
    kvsdk_cache_destroy(cache);
    session_.reset();
    kvsdk_context_destroy(ctx_);
    throw;
  }
}

ProxyRunner::~ProxyRunner() {
  kvsdk_cache_set_proxy(large_, nullptr);
  session_.reset();
  kvsdk_context_destroy(ctx_);
}

void ProxyRunner::link() {
  check(kvsdk_cache_set_proxy(large_, session_->cache()), "kvsdk_cache_set_proxy");
}

void ProxyRunner::save(const std::string& path) const {
  check(kvsdk_cache_save(session_->cache(), path.c_str(), nullptr), "kvsdk_cache_save (proxy)");
}

uint64_t ProxyRunner::cache_bytes() const {
  kvsdk_cache_stats st{};
  st.struct_size = sizeof st;
  check(kvsdk_cache_stats_get(session_->cache(), &st), "kvsdk_cache_stats_get");
  return st.bytes;
}

}  // namespace llama
