#include "proxy_runner.h"

#include "error.h"

#include <chrono>

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
    try {
      join();  // (a pass nobody joined still finishes before the caches go)
    } catch (...) {
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
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

namespace {

// Spins for up to `spin` until `done()`, then blocks on `cv` under `mu` until it is.
template <class Done>
void spin_then_block(std::mutex& mu, std::condition_variable& cv, std::chrono::microseconds spin,
                     Done done) {
  const auto end = std::chrono::steady_clock::now() + spin;
  while (!done() && std::chrono::steady_clock::now() < end) {
  }
  if (done()) return;
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, done);
}

// The worker waits this long for the next pass before it sleeps: the large model's rest of a
// decode step on the demo's models (the proxy's pass ends first). The large model's thread
// waits for the proxy's end of a pass at most this long before it sleeps.
constexpr std::chrono::microseconds kWorkerSpin{2000}, kJoinSpin{500};

}  // namespace

void ProxyRunner::start(const int* tokens, size_t n) {
  if (!worker_.joinable()) {
    check(kvsdk_cache_set_proxy_wait(large_, kProxyWaitMs), "kvsdk_cache_set_proxy_wait");
    worker_ = std::thread([this] { worker_loop(); });
  }
  if (finished_.load(std::memory_order_acquire) != started_.load(std::memory_order_relaxed)) {
    throw Error("ProxyRunner::start: the previous pass was not joined");
  }
  tokens_.assign(tokens, tokens + n);
  error_ = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);  // (a worker about to block sees it)
    started_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
}

void ProxyRunner::join() {
  const uint64_t started = started_.load(std::memory_order_relaxed);
  spin_then_block(mu_, cv_, kJoinSpin,
                  [&] { return finished_.load(std::memory_order_acquire) == started; });
  if (error_) {
    std::exception_ptr error = error_;
    error_ = nullptr;
    std::rethrow_exception(error);
  }
}

void ProxyRunner::worker_loop() {
  for (uint64_t done = 0;; ++done) {
    spin_then_block(mu_, cv_, kWorkerSpin, [&] {
      return started_.load(std::memory_order_acquire) != done || stop_.load();
    });
    if (started_.load(std::memory_order_acquire) == done) return;  // stop_ (nothing pending)
    try {
      session_->forward(tokens_.data(), tokens_.size(), nullptr);
    } catch (...) {
      error_ = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished_.store(done + 1, std::memory_order_release);
    }
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
