/* An app built against the first published kvsdk.h (kvsdk_abi_v1.h, frozen), run against today's
 * library, whose kvsdk_context_options and kvsdk_policy have since gained fields. It drives the
 * whole lifecycle with the old layouts: the legacy *_init symbols, a context with options, a
 * cache, geometry and policy read-backs, append, attend, both stats calls, a save to a buffer and
 * a load with kvsdk_load_info. Every struct sits at the start of a larger buffer of canary bytes,
 * checked after every call: the library must never write past the old struct's size, and must
 * report in struct_size exactly what it wrote. Exits non-zero on any mismatch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvsdk_abi_v1.h"

#ifdef KVSDK_H
#error "the frozen client must see only the frozen header, never include/kvsdk.h"
#endif

/* kvsdk_policy_parse as the first kvsdk.h declared it: a plain function, which today's header
 * wraps in a macro over kvsdk_policy_parse_sized and keeps exported as a frozen legacy symbol.
 * (Declared here, in the first header's words, because kvsdk_abi_v1.h is never edited.) */
kvsdk_status kvsdk_policy_parse(kvsdk_policy *policy, const char *spec);

#define END_OF(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))
#define CANARY 0xA5
#define SLACK 64

/* One struct inside a buffer: `size` bytes of the old struct, then SLACK canary bytes. The union
 * keeps the bytes aligned for any of the structs. */
typedef struct slot {
  union {
    unsigned char bytes[256 + SLACK];
    uint64_t align;
  } u;
  size_t size;
  const char *name;
} slot;

static int failures = 0;

static void fail(const char *what) {
  fprintf(stderr, "FAIL: %s (last error: %s)\n", what, kvsdk_last_error());
  ++failures;
}

static void expect(int cond, const char *what) {
  if (!cond) fail(what);
}

static void *slot_open(slot *s, size_t size, const char *name) {
  memset(s->u.bytes, CANARY, sizeof s->u.bytes);
  s->size = size;
  s->name = name;
  return s->u.bytes;
}

/* The canaries after the old struct are untouched, and struct_size reports the old size. */
static void slot_check(const slot *s, const char *after) {
  uint32_t struct_size;
  size_t i;
  for (i = s->size; i < s->size + SLACK; ++i) {
    if (s->u.bytes[i] != CANARY) {
      fprintf(stderr, "FAIL: %s: byte %u past the old %s (%u bytes) was written\n", after,
              (unsigned)(i - s->size), s->name, (unsigned)s->size);
      ++failures;
      return;
    }
  }
  memcpy(&struct_size, s->u.bytes, sizeof struct_size);
  if (struct_size != s->size) {
    fprintf(stderr, "FAIL: %s: %s.struct_size is %u, the old struct has %u bytes\n", after,
            s->name, (unsigned)struct_size, (unsigned)s->size);
    ++failures;
  }
}

#define CALL(call, what) expect((call) == KVSDK_OK, what)

enum { LAYERS = 2, Q_HEADS = 4, KV_HEADS = 2, HEAD_DIM = 8, TOKENS = 16 };

static void fill(float *x, size_t n, unsigned seed) {
  size_t i;
  for (i = 0; i < n; ++i) x[i] = (float)sin(0.37 * (double)(i + 1) * (double)(seed + 1));
}

/* Appends TOKENS tokens to every layer and attends one query per layer into `out`. */
static void append_all(kvsdk_cache *cache) {
  static float k[TOKENS * KV_HEADS * HEAD_DIM], v[TOKENS * KV_HEADS * HEAD_DIM];
  int32_t pos[TOKENS];
  uint32_t l;
  int t;
  for (t = 0; t < TOKENS; ++t) pos[t] = t;
  for (l = 0; l < LAYERS; ++l) {
    fill(k, TOKENS * KV_HEADS * HEAD_DIM, 2 * l);
    fill(v, TOKENS * KV_HEADS * HEAD_DIM, 2 * l + 1);
    CALL(kvsdk_cache_append(cache, l, TOKENS, k, v, pos, sizeof k), "kvsdk_cache_append");
  }
}

static void attend_all(kvsdk_cache *cache, float out[LAYERS][Q_HEADS * HEAD_DIM]) {
  float q[Q_HEADS * HEAD_DIM];
  uint32_t l;
  for (l = 0; l < LAYERS; ++l) {
    fill(q, Q_HEADS * HEAD_DIM, 7 + l);
    CALL(kvsdk_cache_attend(cache, l, 1, q, NULL, sizeof q, out[l], sizeof out[l]),
         "kvsdk_cache_attend");
  }
}

int main(void) {
  slot so, sg, sp, sgb, spb, scs, sls, ssv, sli;
  kvsdk_context_options *opts = slot_open(&so, END_OF(kvsdk_context_options, budget_bytes),
                                          "kvsdk_context_options");
  kvsdk_geometry *geom = slot_open(&sg, END_OF(kvsdk_geometry, attn_scale), "kvsdk_geometry");
  kvsdk_policy *pol = slot_open(&sp, END_OF(kvsdk_policy, match_tokens), "kvsdk_policy");
  kvsdk_geometry *geom_back = slot_open(&sgb, sg.size, "kvsdk_geometry");
  kvsdk_policy *pol_back = slot_open(&spb, sp.size, "kvsdk_policy");
  kvsdk_cache_stats *cs = slot_open(&scs, END_OF(kvsdk_cache_stats, context_used_bytes),
                                    "kvsdk_cache_stats");
  kvsdk_layer_stats *ls = slot_open(&sls, END_OF(kvsdk_layer_stats, bytes_by_tier),
                                    "kvsdk_layer_stats");
  kvsdk_save_options *save = slot_open(&ssv, END_OF(kvsdk_save_options, max_journal_percent),
                                       "kvsdk_save_options");
  kvsdk_load_info *info = slot_open(&sli, END_OF(kvsdk_load_info, journal_frames_dropped),
                                    "kvsdk_load_info");
  kvsdk_context *ctx = NULL;
  kvsdk_cache *cache = NULL, *loaded = NULL;
  static float out[LAYERS][Q_HEADS * HEAD_DIM], out_loaded[LAYERS][Q_HEADS * HEAD_DIM];
  unsigned char *snapshot = NULL;
  size_t snapshot_size = 0, written = 0;
  uint64_t used = 0;
  const uint64_t budget = (uint64_t)1 << 30;

  /* Context. */
  CALL(kvsdk_context_options_init(opts), "kvsdk_context_options_init");
  slot_check(&so, "kvsdk_context_options_init");
  expect(opts->backend == 0 && opts->device == 0 && opts->budget_bytes == 0,
         "context options defaults");
  opts->budget_bytes = budget;
  CALL(kvsdk_context_create(&ctx, opts), "kvsdk_context_create");
  slot_check(&so, "kvsdk_context_create");
  if (!ctx) return 1;

  /* Geometry and policy. */
  CALL(kvsdk_geometry_init(geom), "kvsdk_geometry_init");
  slot_check(&sg, "kvsdk_geometry_init");
  expect(geom->dtype == KVSDK_DTYPE_F32 && geom->rope_style == KVSDK_ROPE_INTERLEAVED &&
             geom->rope_theta == 10000.0f && geom->n_layers == 0,
         "geometry defaults");
  geom->n_layers = LAYERS;
  geom->n_q_heads = Q_HEADS;
  geom->n_kv_heads = KV_HEADS;
  geom->head_dim = HEAD_DIM;
  geom->attn_scale = 0.25f;
  CALL(kvsdk_policy_init(pol, KVSDK_METHOD_SNAPKV), "kvsdk_policy_init");
  slot_check(&sp, "kvsdk_policy_init");
  expect(pol->method == KVSDK_METHOD_SNAPKV && pol->quant_bits == 0 && pol->quant_group == 32 &&
             pol->quant_residual == 128 && pol->obs_window == 32 && pol->pool_kernel == 7 &&
             pol->pool_kind == KVSDK_POOL_MAX && pol->heavy_ratio == 0.5f &&
             pol->match_tokens == 128,
         "policy defaults");
  pol->obs_window = 4;
  pol->sink_tokens = 2;
  pol->match_tokens = 77;
  pol->boundary_layer = 1;
  /* A legacy init refuses what it always refused, and writes nothing then. */
  expect(kvsdk_policy_init(pol, 999) == KVSDK_E_INVALID_ARG, "kvsdk_policy_init(bad method)");
  expect(pol->obs_window == 4 && pol->match_tokens == 77, "a refused init changed the policy");
  slot_check(&sp, "kvsdk_policy_init(bad method)");

  /* The legacy parse into an old struct: the old bytes only, and the same values; a name that
   * does not parse writes nothing. */
  {
    slot sq;
    kvsdk_policy *parsed = slot_open(&sq, sp.size, "kvsdk_policy");
    CALL(kvsdk_policy_parse(parsed, "snapkv"), "kvsdk_policy_parse");
    slot_check(&sq, "kvsdk_policy_parse");
    expect(parsed->method == KVSDK_METHOD_SNAPKV && parsed->quant_bits == 0 &&
               parsed->obs_window == 32 && parsed->match_tokens == 128,
           "parsed policy values");
    CALL(kvsdk_policy_parse(parsed, "snapkv+kivi4"), "kvsdk_policy_parse (overlay)");
    slot_check(&sq, "kvsdk_policy_parse (overlay)");
    expect(parsed->method == KVSDK_METHOD_SNAPKV && parsed->quant_bits == 4,
           "parsed overlay values");
    parsed->obs_window = 9;
    expect(kvsdk_policy_parse(parsed, "snapkv+kivi3") == KVSDK_E_INVALID_ARG,
           "kvsdk_policy_parse(bad name)");
    expect(parsed->obs_window == 9 && parsed->quant_bits == 4, "a refused parse changed it");
    slot_check(&sq, "kvsdk_policy_parse (bad name)");
  }

  CALL(kvsdk_cache_create(&cache, ctx, geom, pol), "kvsdk_cache_create");
  slot_check(&sg, "kvsdk_cache_create (geometry)");
  slot_check(&sp, "kvsdk_cache_create (policy)");
  if (!cache) return 1;

  /* Read-backs into old structs: exactly the old bytes, the same values. */
  CALL(kvsdk_geometry_init(geom_back), "kvsdk_geometry_init (read-back)");
  CALL(kvsdk_cache_geometry(cache, geom_back), "kvsdk_cache_geometry");
  slot_check(&sgb, "kvsdk_cache_geometry");
  expect(memcmp(geom_back, geom, sg.size) == 0, "geometry read-back differs");
  CALL(kvsdk_policy_init(pol_back, 0), "kvsdk_policy_init (read-back)");
  CALL(kvsdk_cache_policy(cache, pol_back), "kvsdk_cache_policy");
  slot_check(&spb, "kvsdk_cache_policy");
  expect(memcmp(pol_back, pol, sp.size) == 0, "policy read-back differs");

  /* Append and attend. */
  append_all(cache);
  attend_all(cache, out);
  expect(out[0][0] != 0.0f && isfinite(out[1][Q_HEADS * HEAD_DIM - 1]), "attention output");

  /* Stats into old structs. */
  CALL(kvsdk_cache_stats_init(cs), "kvsdk_cache_stats_init");
  slot_check(&scs, "kvsdk_cache_stats_init");
  expect(cs->tokens == 0 && cs->context_used_bytes == 0, "cache stats not zeroed");
  CALL(kvsdk_cache_stats_get(cache, cs), "kvsdk_cache_stats_get");
  slot_check(&scs, "kvsdk_cache_stats_get");
  CALL(kvsdk_context_used_bytes(ctx, &used), "kvsdk_context_used_bytes");
  expect(cs->n_layers == LAYERS && cs->tokens == (uint64_t)LAYERS * KV_HEADS * TOKENS &&
             cs->appended_tokens == (uint64_t)LAYERS * TOKENS && cs->bytes > 0 &&
             cs->budget_bytes == budget && cs->context_used_bytes == used && used == cs->bytes,
         "cache stats values");
  /* A struct_size below the first version is refused and nothing is written. */
  cs->struct_size = (uint32_t)(scs.size - 1);
  cs->tokens = 12345;
  expect(kvsdk_cache_stats_get(cache, cs) == KVSDK_E_INVALID_ARG, "stats with a short struct");
  expect(cs->tokens == 12345 && cs->struct_size == scs.size - 1, "refused stats wrote");
  cs->struct_size = (uint32_t)scs.size;

  CALL(kvsdk_layer_stats_init(ls), "kvsdk_layer_stats_init");
  slot_check(&sls, "kvsdk_layer_stats_init");
  CALL(kvsdk_cache_layer_stats_get(cache, 1, ls), "kvsdk_cache_layer_stats_get");
  slot_check(&sls, "kvsdk_cache_layer_stats_get");
  expect(ls->layer == 1 && ls->tokens == (uint64_t)KV_HEADS * TOKENS &&
             ls->tokens_min_head == TOKENS && ls->tokens_max_head == TOKENS &&
             ls->appended_tokens == TOKENS && ls->bytes > 0 && ls->bytes < cs->bytes,
         "layer stats values");

  /* Save to a buffer with old save options. */
  CALL(kvsdk_save_options_init(save), "kvsdk_save_options_init");
  slot_check(&ssv, "kvsdk_save_options_init");
  /* The default level is the library's, not the header's: 3 until snapshot format 6, 1 since
   * (measured faster at the same size on byte-plane rows). */
  expect((save->zstd_level == 3 || save->zstd_level == 1) && save->include_backing == 1 &&
             save->max_frame_bytes == (uint64_t)8 << 20 && save->max_journal_percent == 0,
         "save options defaults");
  CALL(kvsdk_cache_save_to_buffer(cache, save, NULL, 0, &snapshot_size), "save size query");
  slot_check(&ssv, "kvsdk_cache_save_to_buffer (size)");
  snapshot = malloc(snapshot_size ? snapshot_size : 1);
  if (!snapshot) return 1;
  CALL(kvsdk_cache_save_to_buffer(cache, save, snapshot, snapshot_size, &written),
       "kvsdk_cache_save_to_buffer");
  slot_check(&ssv, "kvsdk_cache_save_to_buffer");
  expect(written == snapshot_size && written > 0, "snapshot size");

  /* Load it back with an old load info and an old expected geometry. */
  CALL(kvsdk_load_info_init(info), "kvsdk_load_info_init");
  slot_check(&sli, "kvsdk_load_info_init");
  CALL(kvsdk_cache_load_from_buffer(&loaded, ctx, snapshot, written, geom, info),
       "kvsdk_cache_load_from_buffer");
  slot_check(&sli, "kvsdk_cache_load_from_buffer");
  slot_check(&sg, "kvsdk_cache_load_from_buffer (expected geometry)");
  expect(info->format_major >= 1 && info->journal_frames_applied == 0 &&
             info->journal_frames_dropped == 0,
         "load info values");
  if (loaded) {
    CALL(kvsdk_policy_init(pol_back, 0), "kvsdk_policy_init (loaded read-back)");
    CALL(kvsdk_cache_policy(loaded, pol_back), "kvsdk_cache_policy (loaded)");
    slot_check(&spb, "kvsdk_cache_policy (loaded)");
    expect(memcmp(pol_back, pol, sp.size) == 0, "loaded policy differs");
    attend_all(loaded, out_loaded);
    expect(memcmp(out, out_loaded, sizeof out) == 0, "the loaded cache attends differently");
  }

  kvsdk_cache_destroy(loaded);
  kvsdk_cache_destroy(cache);
  kvsdk_context_destroy(ctx);
  free(snapshot);
  if (failures) {
    fprintf(stderr, "frozen ABI client: %d failures\n", failures);
    return 1;
  }
  printf("frozen ABI client: OK\n");
  return 0;
}
