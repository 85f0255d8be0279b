#include "policy_runner.h"

#include <algorithm>

#include "error.h"

namespace demo {

namespace {

constexpr size_t kPrefillChunk = 16;

int32_t method_of(const kvsdk_cache* cache) {
  kvsdk_policy p;
  kvsdk_policy_init(&p, KVSDK_METHOD_FULL);
  llama::check(kvsdk_cache_policy(cache, &p), "kvsdk_cache_policy");
  return p.method;
}

}  // namespace

PolicyRunner::PolicyRunner(const llama::Model& model, const llama::Model* proxy_model,
                           kvsdk_context* ctx, const kvsdk_policy& policy)
    : model_(model), session_(std::make_unique<llama::Session>(model, ctx, &policy)) {
  attach_helpers(proxy_model, nullptr, "");
}

PolicyRunner::PolicyRunner(const llama::Model& model, const llama::Model* proxy_model,
                           kvsdk_context* ctx, const std::string& snapshot, const ResumePoint& at)
    : model_(model) {
  const kvsdk_geometry g = llama::geometry_of(model.config());
  kvsdk_cache* cache = nullptr;
  llama::check(kvsdk_cache_load(&cache, ctx, snapshot.c_str(), &g, nullptr), "kvsdk_cache_load");
  try {
    session_ = std::make_unique<llama::Session>(model, cache, at.position);
  } catch (...) {
    kvsdk_cache_destroy(cache);
    throw;
  }
  attach_helpers(proxy_model, &at, snapshot);
}

void PolicyRunner::attach_helpers(const llama::Model* proxy_model, const ResumePoint* resumed,
                                  const std::string& snapshot) {
  kvsdk_cache* cache = session_->cache();
  method_ = method_of(cache);
  if (method_ == KVSDK_METHOD_SMALLKV) {
    if (!proxy_model) throw llama::Error("smallkv needs a proxy model (--proxy-model)");
    proxy_ = resumed ? std::make_unique<llama::ProxyRunner>(*proxy_model, cache, proxy_snapshot(snapshot),
                                                             resumed->position)
                     : std::make_unique<llama::ProxyRunner>(*proxy_model, cache);
  }
  if (method_ == KVSDK_METHOD_SPECACHE) {
    specache_ = std::make_unique<llama::SpeCacheDecoder>(model_, cache, resumed ? resumed->position : 0);
    if (resumed) {
      if (resumed->spec < 0) throw llama::Error("a resumed specache conversation needs its speculative token");
      spec_ = resumed->spec;
    }
  }
}

int PolicyRunner::position() const {
  return specache_ ? specache_->position() : session_->position();
}

void PolicyRunner::prefill(const std::vector<int>& prompt, float* logits) {
  if (prompt.empty()) throw llama::Error("the prompt is empty");
  if (specache_) {
    // SpeCache's prefill attends in full precision; the last prompt token is the first decoding
    // step, after a pre-decoding pass that guesses the first speculative token.
    specache_->prefill(prompt.data(), prompt.size() - 1, nullptr);
    spec_ = specache_->pre_decode(prompt.back());
    feed(prompt.back(), logits);
    return;
  }
  for (size_t t = 0; t < prompt.size(); t += kPrefillChunk) {
    const size_t n = std::min(kPrefillChunk, prompt.size() - t);
    forward(prompt.data() + t, n, t + n == prompt.size() ? logits : nullptr);
  }
}

void PolicyRunner::forward(const int* tokens, size_t n, float* logits) {
  if (!proxy_) {
    session_->forward(tokens, n, logits);
    return;
  }
  // SmallKV: the proxy's pass over the same tokens runs on its own thread, in parallel; the large
  // cache's calls wait for the proxy layers they read.
  proxy_->start(tokens, n);
  try {
    session_->forward(tokens, n, logits);
  } catch (...) {
    try {
      proxy_->join();
    } catch (...) {  // the large model's error is the one to report
    }
    throw;
  }
  proxy_->join();
}

void PolicyRunner::feed(int token, float* logits) {
  if (specache_) {
    spec_ = specache_->step(token, spec_, logits);
    return;
  }
  forward(&token, 1, logits);
}

ResumePoint PolicyRunner::save(const std::string& snapshot) const {
  llama::check(kvsdk_cache_save(session_->cache(), snapshot.c_str(), nullptr), "kvsdk_cache_save");
  if (proxy_) proxy_->save(proxy_snapshot(snapshot));
  return ResumePoint{position(), specache_ ? spec_ : -1};
}

kvsdk_cache_stats PolicyRunner::stats() const {
  kvsdk_cache_stats st{};
  st.struct_size = sizeof st;
  llama::check(kvsdk_cache_stats_get(session_->cache(), &st), "kvsdk_cache_stats_get");
  return st;
}

uint64_t PolicyRunner::cache_bytes() const { return stats().bytes; }

uint64_t PolicyRunner::backing_bytes() const { return stats().backing_bytes; }

double PolicyRunner::fetch_hit_rate() const {
  if (!specache_) return -1.0;
  double hit = -1.0;
  llama::check(kvsdk_cache_fetch_stats(session_->cache(), &hit, nullptr), "kvsdk_cache_fetch_stats");
  return hit;
}

uint64_t PolicyRunner::proxy_bytes() const { return proxy_ ? proxy_->cache_bytes() : 0; }

}  // namespace demo
