// Fidelity of a compressed KV cache against the full cache on the same model and text:
// perplexity on held-out text, and top-1 agreement / KL divergence of next-token distributions
// over a continuation that the full-cache model generated greedily (the compressed model is
// teacher-forced on the same tokens, so both predict from identical histories).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvsdk.h"
#include "model.h"

namespace eval {

struct Schedule {
  size_t prompt_tokens = 0;  // processed as a prefill in chunks; the rest one token per step
  size_t chunk = 16;         // prefill chunk: small chunks let budgeted policies keep up
};

// What the full (uncompressed, unlimited) cache produces; every policy is compared with it.
struct Reference {
  std::vector<int> text;              // held-out tokens for perplexity
  double ppl_full = 0;
  std::vector<int> continuation;      // prompt followed by the full model's greedy tokens
  Schedule schedule;                  // prompt = first schedule.prompt_tokens of both sequences
  std::vector<float> full_logits;     // logits at each continuation step (steps x vocab)
  uint64_t full_cache_bytes = 0;      // bytes of the full cache holding the whole sequence
  uint64_t full_snapshot_bytes = 0;   // its kvsdk snapshot (default save options) at the end
};

// Runs the full cache over `text` (perplexity) and over its first `prompt_tokens` followed by
// greedy generation up to text.size() tokens (continuation). Throws llama::Error on failure.
Reference build_reference(const llama::Model& model, const std::vector<int>& text, Schedule schedule);

struct Outcome {
  bool ok = false;
  kvsdk_status status = KVSDK_OK;  // why it failed (KVSDK_E_BUDGET: the policy could not fit)
  std::string error;
  double ppl = 0;
  double top1_agreement = 0;  // share of continuation steps whose argmax equals the full cache's
  double kl = 0;              // mean KL(full || compressed) in nats over continuation steps
  uint64_t cache_bytes = 0;   // most bytes the cache held at any point of the run
  uint64_t prefill_bytes = 0; // most bytes the cache held during the prompt's prefill
  uint64_t snapshot_bytes = 0; // kvsdk snapshot of the cache at the end of the continuation
  uint64_t proxy_bytes = 0;   // smallkv: bytes of the proxy model's full cache (not budgeted)
  double fetch_hit_rate = -1; // SpeCache: the cache's fetch hit rate (teacher-forced run); -1 n/a
};

// Bytes of a snapshot of `cache` with default options (kvsdk_cache_save_to_buffer size query).
uint64_t snapshot_bytes(const kvsdk_cache* cache);

// Measures `policy` in a context whose budget is `budget_bytes` (0 = unlimited). With
// `mini_prefill` (XKV), each run first plans the prompt with kvsdk_planner_* in a cache-free pass
// (llama::Session::plan_prefill) and fixes the cache's allocation before the real prefill.
// With `proxy` (smallkv), the proxy model runs each step just before `model` on its own full cache
// (llama::ProxyRunner, proxy_runner.h). Without `with_ppl` the perplexity pass over the text is
// skipped (ppl stays 0): top-1, KL and the snapshot come from the continuation alone, which is
// all kvsdk-eval --target needs, at half the cost.
//
// With `save_as`, the resume snapshot is the live cache converted to that policy at save time,
// as `kvsdk recompress` writes it: the live cache saved as it is, loaded into a scratch context
// without a budget and saved there with kvsdk_save_options.target_policy = *save_as (and
// target_budget_bytes 0: the loaded cache's own budget). That converted snapshot is what the
// eval's context loads and the continuation is scored on, and `snapshot_bytes` is its size. A
// pair the library refuses (e.g. a source evicted per KV head) is a failed Outcome with the
// status and message.
Outcome evaluate(const llama::Model& model, const Reference& ref, const kvsdk_policy& policy,
                 uint64_t budget_bytes, bool mini_prefill = false,
                 const llama::Model* proxy = nullptr, bool with_ppl = true,
                 const kvsdk_policy* save_as = nullptr);

// Perplexity of `text` given logits (text.size() x vocab): exp of the mean next-token NLL over
// text[1..n): every token but the first is scored, each predicted from all tokens before it. No
// BOS is added here; a text that starts with BOS (stories260K's) thus never scores it.
double perplexity(const std::vector<float>& logits, const std::vector<int>& text, size_t vocab);

// KL(p || q) in nats between the softmax distributions of two logit vectors.
double kl_divergence(const float* p_logits, const float* q_logits, size_t vocab);

}  // namespace eval
