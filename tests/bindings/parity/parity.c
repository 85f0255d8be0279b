/* Binding parity, C side: the scenario of SCENARIO.md through the C ABI, recorded to argv[1].
 * The Rust and Python programs must write the same bytes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvsdk.h"

enum { LAYERS = 3, Q_HEADS = 4, KV_HEADS = 2, HEAD_DIM = 16, PROMPT = 24, DECODE = 4 };

static uint32_t rng_state = 20261120u;
static FILE *record;

static float draw(void) {
  rng_state = rng_state * 1664525u + 1013904223u;
  return (float)((rng_state >> 8) & 0xffffu) / 32768.0f - 1.0f;
}

static void fill(float *x, size_t n) {
  size_t i;
  for (i = 0; i < n; ++i) x[i] = draw();
}

/* x86-64 and aarch64 are little-endian, so native writes are the little-endian records. */
static void put(const void *data, size_t bytes) { fwrite(data, 1, bytes, record); }
static void put_u64(uint64_t v) { put(&v, sizeof v); }

static void must(kvsdk_status st, const char *what) {
  if (st != KVSDK_OK) {
    fprintf(stderr, "parity.c: %s failed: %s (%s)\n", what, kvsdk_status_str(st),
            kvsdk_last_error());
    exit(1);
  }
}

/* Appends `n` tokens at positions pos0.. to `layer`, then attends `n` fresh queries (causally
 * when `causal`), recording the output. */
static void append_and_attend(kvsdk_cache *cache, uint32_t layer, int32_t pos0, size_t n,
                              int causal) {
  size_t kv_elems = n * KV_HEADS * HEAD_DIM, q_elems = n * Q_HEADS * HEAD_DIM, i;
  float *k = malloc(kv_elems * sizeof *k), *v = malloc(kv_elems * sizeof *v);
  float *q = malloc(q_elems * sizeof *q), *out = malloc(q_elems * sizeof *out);
  int32_t *pos = malloc(n * sizeof *pos);
  for (i = 0; i < n; ++i) pos[i] = pos0 + (int32_t)i;
  fill(k, kv_elems);
  fill(v, kv_elems);
  must(kvsdk_cache_append(cache, layer, n, k, v, pos, kv_elems * sizeof(float)), "append");
  fill(q, q_elems);
  must(kvsdk_cache_attend(cache, layer, n, q, causal ? pos : NULL, q_elems * sizeof(float), out,
                          q_elems * sizeof(float)),
       "attend");
  put(out, q_elems * sizeof(float));
  free(k); free(v); free(q); free(out); free(pos);
}

static void record_read_back(const kvsdk_cache *cache) {
  uint32_t layer, head;
  for (layer = 0; layer < LAYERS; ++layer) {
    for (head = 0; head < KV_HEADS; ++head) {
      size_t n = 0;
      float *k, *v;
      int32_t *pos;
      must(kvsdk_cache_read(cache, layer, head, NULL, NULL, NULL, 0, &n), "read size");
      k = malloc(n * HEAD_DIM * sizeof *k + 1);
      v = malloc(n * HEAD_DIM * sizeof *v + 1);
      pos = malloc(n * sizeof *pos + 1);
      must(kvsdk_cache_read(cache, layer, head, k, v, pos, n, &n), "read");
      put_u64(n);
      put(k, n * HEAD_DIM * sizeof *k);
      put(v, n * HEAD_DIM * sizeof *v);
      put(pos, n * sizeof *pos);
      free(k); free(v); free(pos);
    }
  }
}

static void record_stats(const kvsdk_cache *cache) {
  kvsdk_cache_stats s;
  int t;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  must(kvsdk_cache_stats_get(cache, &s), "stats");
  put_u64(s.tokens);
  put_u64(s.appended_tokens);
  put_u64(s.bytes);
  for (t = 0; t < KVSDK_TIER_SLOTS; ++t) put_u64(s.bytes_by_tier[t]);
  put_u64(s.full_bytes);
}

int main(int argc, char **argv) {
  kvsdk_context *ctx = NULL;
  kvsdk_cache *cache = NULL;
  kvsdk_geometry g;
  kvsdk_policy p;
  uint32_t layer;
  int step;
  if (argc != 2) {
    fprintf(stderr, "usage: %s RECORD_FILE\n", argv[0]);
    return 2;
  }
  record = fopen(argv[1], "wb");
  if (!record) {
    perror(argv[1]);
    return 1;
  }
  must(kvsdk_context_create(&ctx, NULL), "context_create");
  must(kvsdk_geometry_init(&g), "geometry_init");
  g.n_layers = LAYERS; g.n_q_heads = Q_HEADS; g.n_kv_heads = KV_HEADS; g.head_dim = HEAD_DIM;
  g.dtype = KVSDK_DTYPE_F32;
  must(kvsdk_policy_parse(&p, "full"), "policy_parse");
  must(kvsdk_cache_create(&cache, ctx, &g, &p), "cache_create");

  for (layer = 0; layer < LAYERS; ++layer) append_and_attend(cache, layer, 0, PROMPT, 1);
  for (step = 0; step < DECODE; ++step)
    for (layer = 0; layer < LAYERS; ++layer) append_and_attend(cache, layer, PROMPT + step, 1, 0);
  record_read_back(cache);
  record_stats(cache);

  kvsdk_cache_destroy(cache);
  kvsdk_context_destroy(ctx);
  if (fclose(record) != 0) {
    perror(argv[1]);
    return 1;
  }
  return 0;
}
