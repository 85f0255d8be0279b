// One conversation under one policy, driven token by token as kvsdk-demo drives it: a
// llama::Session on the policy's cache, plus what the policy needs beside the cache:
// - smallkv: the proxy model runs every token just before the large model (llama::ProxyRunner);
// - specache: SpeCache's own decoding (llama::SpeCacheDecoder), each step decoding the output
//   token together with a speculative next token whose queries prefetch full-precision rows.
// The runner saves everything a new process needs to continue exactly (save(), then the resuming
// constructor): the cache's snapshot, SpeCache's backing store inside it, SmallKV's proxy cache
// beside it, and the few numbers of ResumePoint.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvsdk.h"
#include "model.h"
#include "proxy_runner.h"
#include "session.h"
#include "specache_decode.h"

namespace demo {

// Where a conversation stands when it is suspended (the snapshot holds the rest).
struct ResumePoint {
  int position = 0;  // tokens the cache has seen
  int spec = -1;     // specache: the speculative token of the next step; -1 otherwise
};

class PolicyRunner {
 public:
  // A new conversation: an empty cache on `ctx` under `policy`. `proxy_model` is required for
  // smallkv (and ignored otherwise). Throws llama::Error / llama::KvsdkError.
  PolicyRunner(const llama::Model& model, const llama::Model* proxy_model, kvsdk_context* ctx,
               const kvsdk_policy& policy);
  // Resumes what save(`snapshot`) wrote, on `ctx`; the policy comes from the snapshot.
  PolicyRunner(const llama::Model& model, const llama::Model* proxy_model, kvsdk_context* ctx,
               const std::string& snapshot, const ResumePoint& at);

  // Feeds the prompt (chunks of 16 tokens; SpeCache: its full-precision prefill, then its first
  // decoding step on the last prompt token) and writes the next-token logits to `logits`.
  void prefill(const std::vector<int>& prompt, float* logits);
  // Feeds one token and writes its next-token logits (vocab_size floats) to `logits`.
  void feed(int token, float* logits);

  // Saves the conversation to `snapshot` (and the proxy's cache to proxy_snapshot(snapshot)),
  // with default options: they include SpeCache's backing store, without which a resumed cache
  // would rebuild its full-precision rows from the low-bit copy and continue differently.
  ResumePoint save(const std::string& snapshot) const;
  static std::string proxy_snapshot(const std::string& snapshot) { return snapshot + ".proxy"; }

  kvsdk_cache_stats stats() const;
  uint64_t cache_bytes() const;    // budgeted bytes of the cache now
  uint64_t backing_bytes() const;  // specache: its off-budget full-precision backing store
  double fetch_hit_rate() const;   // specache: share of attended rows found fetched; -1 otherwise
  uint64_t proxy_bytes() const;  // smallkv: the proxy's full cache (its own context); else 0
  int32_t method() const { return method_; }

 private:
  void attach_helpers(const llama::Model* proxy_model, const ResumePoint* resumed,
                      const std::string& snapshot);
  int position() const;
  // One pass of the model over `tokens` (smallkv: the proxy's pass in parallel on its thread).
  void forward(const int* tokens, size_t n, float* logits);

  const llama::Model& model_;
  std::unique_ptr<llama::Session> session_;  // owns the cache
  std::unique_ptr<llama::ProxyRunner> proxy_;
  std::unique_ptr<llama::SpeCacheDecoder> specache_;
  int32_t method_ = KVSDK_METHOD_FULL;
  int spec_ = -1;
};

}  // namespace demo
