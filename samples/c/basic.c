/* kvsdk C sample: one conversation's KV cache inside a memory budget.
 *
 * Creates a context with a budget, a cache for a small GQA model, "prefills" a prompt layer by
 * layer (append keys/values, attend the prompt's queries causally), runs decode steps, reads a
 * head back, prints the stats, and shows that an append that does not fit the budget fails
 * cleanly without changing the cache. Exit code 0 on success. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvsdk.h"

enum { N_LAYERS = 4, N_Q_HEADS = 8, N_KV_HEADS = 2, HEAD_DIM = 64, PROMPT = 96, DECODE = 32 };

static float frand(unsigned *state) {
  *state = *state * 1664525u + 1013904223u;
  return (float)((*state >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static int check(kvsdk_status st, const char *what) {
  if (st != KVSDK_OK) {
    fprintf(stderr, "%s failed: %s (%s)\n", what, kvsdk_status_str(st), kvsdk_last_error());
    return 0;
  }
  return 1;
}

/* Appends `n` tokens at `pos0..` to one layer and attends their queries causally. */
static int step(kvsdk_cache *cache, unsigned layer, int pos0, int n, unsigned *rng, float *out) {
  size_t kv_elems = (size_t)n * N_KV_HEADS * HEAD_DIM, q_elems = (size_t)n * N_Q_HEADS * HEAD_DIM;
  float *k = malloc(kv_elems * sizeof(float)), *v = malloc(kv_elems * sizeof(float));
  float *q = malloc(q_elems * sizeof(float));
  int32_t *pos = malloc((size_t)n * sizeof(int32_t));
  size_t i;
  int ok;
  for (i = 0; i < kv_elems; ++i) { k[i] = frand(rng); v[i] = frand(rng); }
  for (i = 0; i < q_elems; ++i) q[i] = frand(rng);
  for (i = 0; i < (size_t)n; ++i) pos[i] = pos0 + (int32_t)i;
  ok = check(kvsdk_cache_append(cache, layer, (size_t)n, k, v, pos, kv_elems * sizeof(float)),
             "append") &&
       check(kvsdk_cache_attend(cache, layer, (size_t)n, q, pos, q_elems * sizeof(float), out,
                                q_elems * sizeof(float)),
             "attend");
  free(k); free(v); free(q); free(pos);
  return ok;
}

int main(void) {
  kvsdk_context_options copts;
  kvsdk_geometry geom;
  kvsdk_policy policy;
  kvsdk_context *ctx = NULL;
  kvsdk_cache *cache = NULL;
  kvsdk_cache_stats stats;
  unsigned rng = 42, layer;
  int t, ok = 1;
  size_t n_tokens = 0;
  uint64_t before, after;
  float *out = malloc((size_t)PROMPT * N_Q_HEADS * HEAD_DIM * sizeof(float));
  /* f16 exact tier: keys + values (2 bytes each) + a 4-byte position per token and KV head. */
  const uint64_t bytes_per_token = (uint64_t)N_LAYERS * N_KV_HEADS * (HEAD_DIM * 2 * 2 + 4);
  const uint64_t budget = bytes_per_token * (PROMPT + DECODE);

  printf("kvsdk %s (header %d.%d.%d)\n", kvsdk_version_string(), KVSDK_VERSION_MAJOR,
         KVSDK_VERSION_MINOR, KVSDK_VERSION_PATCH);
  if (kvsdk_version() / 10000 != KVSDK_VERSION_MAJOR) {
    fprintf(stderr, "library major version differs from the header\n");
    return 1;
  }

  kvsdk_context_options_init(&copts);
  copts.budget_bytes = budget;
  kvsdk_geometry_init(&geom);
  geom.n_layers = N_LAYERS; geom.n_q_heads = N_Q_HEADS; geom.n_kv_heads = N_KV_HEADS;
  geom.head_dim = HEAD_DIM; geom.dtype = KVSDK_DTYPE_F32;
  kvsdk_policy_init(&policy, KVSDK_METHOD_FULL);

  if (!check(kvsdk_context_create(&ctx, &copts), "context_create") ||
      !check(kvsdk_cache_create(&cache, ctx, &geom, &policy), "cache_create")) {
    return 1;
  }

  for (layer = 0; layer < N_LAYERS && ok; ++layer) ok = step(cache, layer, 0, PROMPT, &rng, out);
  for (t = 0; t < DECODE && ok; ++t) {
    for (layer = 0; layer < N_LAYERS && ok; ++layer) {
      ok = step(cache, layer, PROMPT + t, 1, &rng, out);
    }
  }
  if (ok) ok = check(kvsdk_cache_read(cache, 0, 0, NULL, NULL, NULL, 0, &n_tokens), "read");

  stats.struct_size = sizeof(stats);
  if (ok) ok = check(kvsdk_cache_stats_get(cache, &stats), "stats");
  if (ok) {
    printf("policy %s, %u layers, %u query heads on %u KV heads, head_dim %u\n",
           kvsdk_method_name(KVSDK_METHOD_FULL), N_LAYERS, N_Q_HEADS, N_KV_HEADS, HEAD_DIM);
    printf("tokens per head: %zu, cache bytes: %llu (exact %llu + metadata %llu), budget: %llu\n",
           n_tokens, (unsigned long long)stats.bytes,
           (unsigned long long)stats.bytes_by_tier[KVSDK_TIER_EXACT],
           (unsigned long long)stats.bytes_by_tier[KVSDK_TIER_METADATA],
           (unsigned long long)stats.budget_bytes);
    printf("output[0] of the last decode step: %.6f\n", out[0]);
  }

  /* The budget is full: one more token must fail and leave the cache unchanged. */
  if (ok) {
    float k1[N_KV_HEADS * HEAD_DIM] = {0}, v1[N_KV_HEADS * HEAD_DIM] = {0};
    int32_t pos1 = PROMPT + DECODE;
    kvsdk_status st;
    kvsdk_context_used_bytes(ctx, &before);
    st = kvsdk_cache_append(cache, 0, 1, k1, v1, &pos1, sizeof(k1));
    kvsdk_context_used_bytes(ctx, &after);
    printf("append beyond the budget: %s (%s), used bytes %llu -> %llu\n", kvsdk_status_str(st),
           kvsdk_last_error(), (unsigned long long)before, (unsigned long long)after);
    ok = st == KVSDK_E_BUDGET && before == after;
  }

  kvsdk_cache_destroy(cache);
  kvsdk_context_destroy(ctx);
  free(out);
  printf("%s\n", ok ? "sample finished: OK" : "sample FAILED");
  return ok ? 0 : 1;
}
