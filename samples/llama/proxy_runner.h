// SmallKV's proxy: the small model of the same family runs on the same tokens with its own
// 'full' kvsdk cache, one forward pass just before the large model's, so that the large
// (smallkv) cache reads the proxy's queries of the same step (kvsdk_cache_set_proxy). Used by
// kvsdk-eval and kvsdk-demo.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kvsdk.h"
#include "model.h"
#include "session.h"

namespace llama {

// The proxy model paired with `model` for smallkv when none is named (shakespeare-base ->
// shakespeare-small); empty when there is none.
std::string default_proxy_model(const std::string& model);

class ProxyRunner {
 public:
  // Creates the proxy's full cache on its own unlimited context (the proxy is not part of the
  // large cache's budget) and links it to `large`. Throws Error / KvsdkError on failure.
  ProxyRunner(const Model& proxy_model, kvsdk_cache* large);
  // Resumes a proxy saved with save(): loads `snapshot` (the proxy's tokens up to `position`)
  // on its own unlimited context and links it to `large`, a smallkv cache loaded from the
  // snapshot taken at the same point (its head mapping names the proxy's heads).
  ProxyRunner(const Model& proxy_model, kvsdk_cache* large, const std::string& snapshot,
              int position);
  ~ProxyRunner();
  ProxyRunner(const ProxyRunner&) = delete;
  ProxyRunner& operator=(const ProxyRunner&) = delete;

  // Runs the proxy over the same tokens the large model is about to run. Without logits: the
  // proxy generates nothing, so its last layer stops after the attention the large cache reads
  // (SmallKV's early layer stopping; run_layers).
  void forward(const int* tokens, size_t n) { session_->forward(tokens, n, nullptr); }
  // Saves the proxy's cache to `path` (default options), to be resumed with the constructor above.
  void save(const std::string& path) const;
  uint64_t cache_bytes() const;  // bytes of the proxy's full cache

 private:
  void link();

  kvsdk_context* ctx_ = nullptr;
  std::unique_ptr<Session> session_;
  kvsdk_cache* large_;
};

}  // namespace llama
