// SmallKV's proxy in the evaluation: the small model of the same family runs on the same tokens
// with its own 'full' kvsdk cache, one forward pass just before the large model's, so that the
// large (smallkv) cache reads the proxy's queries of the same step (kvsdk_cache_set_proxy).
#pragma once

#include <memory>
#include <string>

#include "kvsdk.h"
#include "model.h"
#include "session.h"

namespace eval {

// The proxy model kvsdk-eval pairs with `model` for smallkv when --proxy-model is not given
// (shakespeare-base -> shakespeare-small); empty when there is none.
std::string default_proxy_model(const std::string& model);

class ProxyRunner {
 public:
  // Creates the proxy's full cache on its own unlimited context and links it to `large`.
  // Throws llama::Error / KvsdkError on failure.
  ProxyRunner(const llama::Model& proxy_model, kvsdk_cache* large);
  ~ProxyRunner();
  ProxyRunner(const ProxyRunner&) = delete;
  ProxyRunner& operator=(const ProxyRunner&) = delete;

  // Runs the proxy over the same tokens the large model is about to run.
  void forward(const int* tokens, size_t n) { session_->forward(tokens, n, nullptr); }
  uint64_t cache_bytes() const;  // bytes of the proxy's full cache

 private:
  kvsdk_context* ctx_ = nullptr;
  std::unique_ptr<llama::Session> session_;
  kvsdk_cache* large_;
};

}  // namespace eval
