#include "specache_run.h"

#include <algorithm>

#include "error.h"
#include "specache_decode.h"

namespace eval {

namespace {

uint64_t cache_bytes(const llama::Session& s) {
  kvsdk_cache_stats st{};
  st.struct_size = sizeof st;
  llama::check(kvsdk_cache_stats_get(s.cache(), &st), "kvsdk_cache_stats_get");
  return st.bytes;
}

}  // namespace

void specache_prefill(llama::Session& s, const std::vector<int>& tokens, size_t n,
                      std::vector<float>* logits, uint64_t* peak, uint64_t* prefill_peak) {
  if (n == 0) return;
  llama::SpeCacheDecoder d(s.model(), s.cache(), 0);
  d.prefill(tokens.data(), n, logits ? logits->data() : nullptr);
  *peak = std::max(*peak, cache_bytes(s));
  if (prefill_peak) *prefill_peak = std::max(*prefill_peak, cache_bytes(s));
}

double specache_decode(llama::Session& s, const std::vector<int>& tokens, size_t from,
                       const Schedule& schedule, std::vector<float>* logits, uint64_t* peak,
                       uint64_t* prefill_peak) {
  const size_t V = size_t(s.model().config().vocab_size);
  if (from >= tokens.size()) return -1.0;
  llama::SpeCacheDecoder d(s.model(), s.cache(), int(from));
  std::vector<float> step_logits(V);
  int spec = d.pre_decode(tokens[from]);
  for (size_t t = from; t < tokens.size(); ++t) {
    spec = d.step(tokens[t], spec, step_logits.data());
    if (logits) std::copy(step_logits.begin(), step_logits.end(), logits->begin() + long(t * V));
    const uint64_t b = cache_bytes(s);
    *peak = std::max(*peak, b);
    if (prefill_peak && t < schedule.prompt_tokens) *prefill_peak = std::max(*prefill_peak, b);
  }
  double hit = -1.0;
  llama::check(kvsdk_cache_fetch_stats(s.cache(), &hit, nullptr), "kvsdk_cache_fetch_stats");
  return hit;
}

double run_specache(llama::Session& s, const std::vector<int>& tokens, const Schedule& schedule,
                    std::vector<float>* logits, uint64_t* peak, uint64_t* prefill_peak) {
  const size_t V = size_t(s.model().config().vocab_size);
  if (logits) logits->assign(tokens.size() * V, 0.0f);
  // Prefill (SpeCache (docs/papers.md) Algorithm 1, full-precision attention): every prompt token
  // but the last (the first output token T_1 of the decoding), in one pass.
  const size_t prefill = std::min(tokens.size(), std::max<size_t>(schedule.prompt_tokens, 1) - 1);
  specache_prefill(s, tokens, prefill, logits, peak, prefill_peak);
  return specache_decode(s, tokens, prefill, schedule, logits, peak, prefill_peak);
}

}  // namespace eval
