// SmallKV's proxy: the small model of the same family runs on the same tokens with its own
// 'full' kvsdk cache, one forward pass just before the large model's, so that the large
// (smallkv) cache reads the proxy's queries of the same step (kvsdk_cache_set_proxy). Used by
// kvsdk-eval and kvsdk-demo.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

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

  // The same forward pass on the runner's own thread, in parallel with the large model's pass
  // over the same tokens (SmallKV's Algorithm 1): the large cache waits, inside its calls, for
  // the proxy layers it reads (kvsdk_cache_set_proxy_wait, set here on the first start()).
  // join() returns once the pass is done and rethrows its error; call it before the next
  // start() and before anything else touches either cache. A large-model call that fails while
  // the proxy's pass runs must still join().
  void start(const int* tokens, size_t n);
  void join();
  // Saves the proxy's cache to `path` (default options), to be resumed with the constructor above.
  void save(const std::string& path) const;
  uint64_t cache_bytes() const;  // bytes of the proxy's full cache

 private:
  void link();

  void worker_loop();

  kvsdk_context* ctx_ = nullptr;
  std::unique_ptr<Session> session_;
  kvsdk_cache* large_;

  // The worker (started by the first start()): one pass at a time. Passes are counted (started_,
  // finished_); each side spins briefly on the other's counter before blocking on cv_, since a
  // wake-up through the kernel costs about as much as a proxy layer (kvsdk's util/spin_wait.h
  // does the same inside the large cache's waits).
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> started_{0}, finished_{0};
  std::vector<int> tokens_;   // the pass's tokens (written before started_ moves)
  std::atomic<bool> stop_{false};  // set under mu_
  std::exception_ptr error_;  // the pass's failure (written before finished_ moves)
};

}  // namespace llama
