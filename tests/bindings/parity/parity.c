/* Binding parity, C side: the scenario of SCENARIO.md through the C ABI. Writes the record to
 * argv[1] and the snapshot to argv[2] (and three more saves to argv[2].1, .2, .3, which
 * must be identical: snapshots are deterministic). The Rust and Python programs must match. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvsdk.h"

enum { LAYERS = 3, Q_HEADS = 4, KV_HEADS = 2, HEAD_DIM = 16, PROMPT = 24, WINDOW = 8, DECODE = 4 };

static uint32_t rng_state = 20261120u;
static FILE *record;

static float draw(void) {
  rng_state = rng_state * 1664525u + 1013904223u;
  return (float)((rng_state >> 8) & 0xffffu) / 32768.0f - 1.0f;
}

static float *drawn(size_t n) {
  float *x = malloc(n * sizeof *x + 1);
  size_t i;
  for (i = 0; i < n; ++i) x[i] = draw();
  return x;
}

/* x86-64 and aarch64 are little-endian, so native writes are the little-endian records. */
static void put(const void *data, size_t bytes) { fwrite(data, 1, bytes, record); }
static void put_u64(uint64_t v) { put(&v, sizeof v); }
static void put_i32(int32_t v) { put(&v, sizeof v); }

static void must(kvsdk_status st, const char *what) {
  if (st != KVSDK_OK) {
    fprintf(stderr, "parity.c: %s failed: %s (%s)\n", what, kvsdk_status_str(st),
            kvsdk_last_error());
    exit(1);
  }
}

/* Appends one token at `pos` to `layer` of `cache`, then attends one fresh query (no
 * q_positions), records the output, and observes the query at `pos` when `observe`. */
static void decode_step(kvsdk_cache *cache, uint32_t layer, int32_t pos, int observe) {
  size_t kv_elems = KV_HEADS * HEAD_DIM, q_elems = Q_HEADS * HEAD_DIM;
  float *k = drawn(kv_elems), *v = drawn(kv_elems), *q, out[Q_HEADS * HEAD_DIM];
  must(kvsdk_cache_append(cache, layer, 1, k, v, &pos, kv_elems * sizeof(float)), "append");
  q = drawn(q_elems);
  must(kvsdk_cache_attend(cache, layer, 1, q, NULL, sizeof out, out, sizeof out), "attend");
  put(out, sizeof out);
  if (observe) must(kvsdk_cache_observe(cache, layer, 1, q, &pos, sizeof out), "observe");
  free(k); free(v); free(q);
}

static void prefill(kvsdk_cache *cache, uint32_t layer) {
  size_t kv_elems = (size_t)PROMPT * KV_HEADS * HEAD_DIM;
  size_t q_elems = (size_t)PROMPT * Q_HEADS * HEAD_DIM;
  float *k = drawn(kv_elems), *v = drawn(kv_elems), *q, *out = malloc(q_elems * sizeof *out);
  int32_t pos[PROMPT];
  size_t i, per_query = Q_HEADS * HEAD_DIM;
  for (i = 0; i < PROMPT; ++i) pos[i] = (int32_t)i;
  must(kvsdk_cache_append(cache, layer, PROMPT, k, v, pos, kv_elems * sizeof(float)), "append");
  q = drawn(q_elems);
  must(kvsdk_cache_attend(cache, layer, PROMPT, q, pos, q_elems * sizeof(float), out,
                          q_elems * sizeof(float)),
       "attend");
  put(out, q_elems * sizeof(float));
  must(kvsdk_cache_observe(cache, layer, WINDOW, q + (PROMPT - WINDOW) * per_query,
                           pos + (PROMPT - WINDOW), WINDOW * per_query * sizeof(float)),
       "observe");
  free(k); free(v); free(q); free(out);
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

static kvsdk_cache_stats stats_of(const kvsdk_cache *cache) {
  kvsdk_cache_stats s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  must(kvsdk_cache_stats_get(cache, &s), "stats");
  return s;
}

static void record_stats(const kvsdk_cache *cache) {
  kvsdk_cache_stats s = stats_of(cache);
  int t;
  put_u64(s.tokens);
  put_u64(s.appended_tokens);
  put_u64(s.bytes);
  for (t = 0; t < KVSDK_TIER_SLOTS; ++t) put_u64(s.bytes_by_tier[t]);
  put_u64(s.full_bytes);
}

static void save_copy(kvsdk_cache *cache, const char *base, int index) {
  char path[4096];
  snprintf(path, sizeof path, "%s.%d", base, index);
  must(kvsdk_cache_save(cache, path, NULL), "save (determinism probe)");
}

int main(int argc, char **argv) {
  kvsdk_context *ctx = NULL;
  kvsdk_cache *cache = NULL, *loaded = NULL;
  kvsdk_geometry g;
  kvsdk_policy p;
  kvsdk_load_info info;
  uint64_t alloc[LAYERS];
  uint32_t layer;
  int step, i;
  if (argc != 3) {
    fprintf(stderr, "usage: %s RECORD_FILE SNAPSHOT_FILE\n", argv[0]);
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
  must(kvsdk_policy_parse(&p, "snapkv"), "policy_parse");
  p.obs_window = WINDOW;
  must(kvsdk_cache_create(&cache, ctx, &g, &p), "cache_create");

  for (layer = 0; layer < LAYERS; ++layer) prefill(cache, layer);
  {
    uint64_t bytes = stats_of(cache).bytes;
    put_u64(bytes);
    must(kvsdk_cache_set_budget(cache, bytes * 3 / 5), "set_budget");
    must(kvsdk_cache_compress(cache), "compress");
    must(kvsdk_cache_allocation(cache, alloc, LAYERS), "allocation");
    for (layer = 0; layer < LAYERS; ++layer) put_u64(alloc[layer]);
  }
  for (step = 0; step < DECODE; ++step)
    for (layer = 0; layer < LAYERS; ++layer) decode_step(cache, layer, PROMPT + step, 1);
  record_read_back(cache);
  record_stats(cache);

  must(kvsdk_cache_save(cache, argv[2], NULL), "save");
  for (i = 1; i <= 3; ++i) save_copy(cache, argv[2], i);

  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  must(kvsdk_cache_load(&loaded, ctx, argv[2], &g, &info), "load");
  must(kvsdk_policy_init(&p, KVSDK_METHOD_FULL), "policy_init");
  must(kvsdk_cache_policy(loaded, &p), "cache_policy");
  put_i32(p.method);
  put_i32(p.obs_window);
  put_i32(p.pool_kernel);
  put_i32(p.pool_kind);
  for (layer = 0; layer < LAYERS; ++layer) {
    float *q = drawn(Q_HEADS * HEAD_DIM), out[Q_HEADS * HEAD_DIM];
    must(kvsdk_cache_attend(loaded, layer, 1, q, NULL, sizeof out, out, sizeof out), "attend");
    put(out, sizeof out);
    free(q);
  }
  for (layer = 0; layer < LAYERS; ++layer) decode_step(loaded, layer, PROMPT + DECODE, 0);
  {
    kvsdk_cache *branch = NULL;
    must(kvsdk_cache_fork(&branch, loaded), "fork");
    for (layer = 0; layer < LAYERS; ++layer) decode_step(branch, layer, PROMPT + DECODE + 1, 0);
    put_i32(kvsdk_cache_truncate(branch, PROMPT + DECODE + 1));
    for (layer = 0; layer < LAYERS; ++layer) decode_step(branch, layer, PROMPT + DECODE + 1, 0);
    kvsdk_cache_destroy(branch);
  }

  kvsdk_cache_destroy(loaded);
  kvsdk_cache_destroy(cache);
  kvsdk_context_destroy(ctx);
  if (fclose(record) != 0) {
    perror(argv[1]);
    return 1;
  }
  return 0;
}
