// SpeCache's decode step (samples/llama/specache_decode.h) on a real checkpoint: when every token
// is fetched, each step's logits equal the full cache's (the attention runs on the f16 backing
// rows); the speculative token is never appended; with a small fetch the hit rate is measured
// and the logits stay close to the full cache's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "model.h"
#include "model_paths.h"
#include "session.h"
#include "specache_decode.h"
#include "test_util.h"

namespace {

double max_rel_diff(const float* a, const float* b, size_t n) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) scale = std::max(scale, double(std::fabs(a[i])));
  for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(double(a[i]) - b[i]));
  return worst / scale;
}

// Prefills tokens[0, prompt - 1) into both caches (SpeCache: SpeCacheDecoder::prefill), then
// decodes the rest: full with Session::step, SpeCache with pre-decoding and decode steps. Returns the worst relative logit
// difference of a step, and the mean over the steps in `*mean`.
double decode_against_full(const llama::Model& model, const kvsdk_policy& policy, size_t prompt,
                           size_t steps, kvsdk_cache** specache_out, kvsdk_context* ctx,
                           std::unique_ptr<llama::Session>& keep, double* mean = nullptr) {
  const size_t V = size_t(model.config().vocab_size);
  std::vector<int> tokens(prompt + steps);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int((i * 7 + 3) % V);
  llama::Session full(model, ctx, nullptr);
  keep = std::make_unique<llama::Session>(model, ctx, &policy);
  full.forward(tokens.data(), prompt - 1, nullptr);
  llama::SpeCacheDecoder d(model, keep->cache(), 0);
  d.prefill(tokens.data(), prompt - 1, nullptr);  // full-precision attention, low-bit storage
  int spec = d.pre_decode(tokens[prompt - 1]);
  std::vector<float> mine(V);
  double worst = 0, sum = 0;
  for (size_t t = prompt - 1; t < tokens.size(); ++t) {
    const float* want = full.step(tokens[t]);
    spec = d.step(tokens[t], spec, mine.data());
    const double diff = max_rel_diff(want, mine.data(), V);
    worst = std::max(worst, diff);
    sum += diff;
    EXPECT_EQ(d.position(), int(t + 1));
  }
  *specache_out = keep->cache();
  if (mean) *mean = sum / double(steps + 1);
  return worst;
}

TEST(SpeCacheDecode, FetchingEveryTokenGivesTheFullCachesLogits) {
  const llama::Model model = llama::Model::load(kvsdk_test::bundled_model("shakespeare-small.bin"));
  auto ctx = kvsdk_test::make_context();
  kvsdk_policy p;
  ASSERT_EQ(kvsdk_policy_parse(&p, "specache+kivi1"), KVSDK_OK);
  p.fetch_tokens = 1000;  // more than the sequence: everything fetched
  p.quant_group = 8;
  p.quant_residual = 16;  // most rows quantized: only the fetch keeps attention exact
  kvsdk_cache* cache = nullptr;
  std::unique_ptr<llama::Session> keep;
  const double worst = decode_against_full(model, p, 80, 40, &cache, ctx.get(), keep);
  EXPECT_LT(worst, 1e-4);
  kvsdk_layer_stats l0{};
  l0.struct_size = sizeof l0;
  ASSERT_EQ(kvsdk_cache_layer_stats_get(cache, 0, &l0), KVSDK_OK);
  EXPECT_GT(l0.bytes_by_tier[KVSDK_TIER_QUANTIZED], 0u);  // some rows did leave the window
  // Only output tokens entered the cache: 120 per layer.
  kvsdk_cache_stats s{};
  s.struct_size = sizeof s;
  ASSERT_EQ(kvsdk_cache_stats_get(cache, &s), KVSDK_OK);
  EXPECT_EQ(s.appended_tokens, uint64_t(model.config().n_layers) * 120);
  double hit = 0;
  ASSERT_EQ(kvsdk_cache_fetch_stats(cache, &hit, nullptr), KVSDK_OK);
  // Every row there was at the prefetch is fetched; only the output token appended after it is
  // not (it is in the exact residual window).
  EXPECT_GT(hit, 0.5);
  EXPECT_LE(hit, 1.0);
}

TEST(SpeCacheDecode, ASmallFetchMeasuresItsHitRateAndStaysClose) {
  const llama::Model model = llama::Model::load(kvsdk_test::bundled_model("shakespeare-small.bin"));
  auto ctx = kvsdk_test::make_context();
  kvsdk_policy with_fetch, without_fetch;
  ASSERT_EQ(kvsdk_policy_parse(&with_fetch, "specache+kivi1"), KVSDK_OK);
  with_fetch.fetch_tokens = 8;
  with_fetch.quant_residual = 16;
  without_fetch = with_fetch;
  without_fetch.fetch_tokens = 0;  // the low-bit copy alone
  kvsdk_cache* cache = nullptr;
  std::unique_ptr<llama::Session> keep_a, keep_b;
  double fetched = 0, lowbit = 0;
  decode_against_full(model, with_fetch, 80, 24, &cache, ctx.get(), keep_a, &fetched);
  double hit = 0;
  uint64_t samples = 0;
  ASSERT_EQ(kvsdk_cache_fetch_stats(cache, &hit, &samples), KVSDK_OK);
  const uint64_t heads = uint64_t(model.config().n_layers) * uint64_t(model.config().n_kv_heads);
  EXPECT_EQ(samples, heads * 25);  // one measurement per layer and KV head per decode step
  EXPECT_GT(hit, 0.0);
  EXPECT_LT(hit, 1.0);
  decode_against_full(model, without_fetch, 80, 24, &cache, ctx.get(), keep_b, &lowbit);
  EXPECT_LT(fetched, lowbit);  // fetching 8 rows per head recovers part of the error (mean)
}

}  // namespace
