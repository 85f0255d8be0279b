#include "proxy.h"

#include "error.h"

namespace eval {

std::string default_proxy_model(const std::string& model) {
  return model == "shakespeare-base" ? "shakespeare-small" : "";
}

ProxyRunner::ProxyRunner(const llama::Model& proxy_model, kvsdk_cache* large) : large_(large) {
  llama::check(kvsdk_context_create(&ctx_, nullptr), "kvsdk_context_create");
  try {
    session_ = std::make_unique<llama::Session>(proxy_model, ctx_, nullptr);
    llama::check(kvsdk_cache_set_proxy(large_, session_->cache()), "kvsdk_cache_set_proxy");
  } catch (...) {
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

uint64_t ProxyRunner::cache_bytes() const {
  kvsdk_cache_stats st{};
  st.struct_size = sizeof st;
  llama::check(kvsdk_cache_stats_get(session_->cache(), &st), "kvsdk_cache_stats_get");
  return st.bytes;
}

}  // namespace eval
