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
  if (worker_.joinable()) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !running_; });  // (a pass nobody joined still finishes)
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  kvsdk_cache_set_proxy(large_, nullptr);
  session_.reset();
  kvsdk_context_destroy(ctx_);
}

void ProxyRunner::link() {
  check(kvsdk_cache_set_proxy(large_, session_->cache()), "kvsdk_cache_set_proxy");
}

// Long enough for any pass of these models on a loaded machine; a proxy pass that fails makes the
// large model's waiting call fail after it (and join() then reports the proxy's error).
constexpr uint32_t kProxyWaitMs = 10000;

void ProxyRunner::start(const int* tokens, size_t n) {
  if (!worker_.joinable()) {
    check(kvsdk_cache_set_proxy_wait(large_, kProxyWaitMs), "kvsdk_cache_set_proxy_wait");
    worker_ = std::thread([this] { worker_loop(); });
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_) throw Error("ProxyRunner::start: the previous pass was not joined");
    tokens_.assign(tokens, tokens + n);
    error_ = nullptr;
    pending_ = running_ = true;
  }
  cv_.notify_all();
}

void ProxyRunner::join() {
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!pending_) return;
    cv_.wait(lock, [&] { return !running_; });
    pending_ = false;
    error = error_;
  }
  if (error) std::rethrow_exception(error);
}

void ProxyRunner::worker_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || running_; });
    if (stop_) return;
    lock.unlock();
    std::exception_ptr error;
    try {
      session_->forward(tokens_.data(), tokens_.size(), nullptr);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    error_ = error;
    running_ = false;
    cv_.notify_all();
  }
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
