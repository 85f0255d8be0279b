/* A FROZEN copy of the first published layouts of kvsdk.h's versioned structs, and of the
 * declarations the frozen client (frozen_client.c) calls. Never edit it: it stands for an app
 * compiled against an old kvsdk.h. Since these layouts were published, kvsdk_context_options
 * gained n_threads and kvsdk_policy gained evict_slack, so the library this client links against
 * is one "whose structs gained a field"; every struct that grows later makes the test cover it
 * too. */
#ifndef KVSDK_ABI_V1_H
#define KVSDK_ABI_V1_H

#include <stddef.h>
#include <stdint.h>

typedef int32_t kvsdk_status;
typedef struct kvsdk_context kvsdk_context;
typedef struct kvsdk_cache kvsdk_cache;

typedef struct kvsdk_context_options {
  uint32_t struct_size;
  int32_t backend;
  int32_t device;
  uint64_t budget_bytes;
} kvsdk_context_options;

typedef struct kvsdk_geometry {
  uint32_t struct_size;
  uint32_t n_layers;
  uint32_t n_q_heads;
  uint32_t n_kv_heads;
  uint32_t head_dim;
  int32_t dtype;
  int32_t rope_style;
  float rope_theta;
  float attn_scale;
} kvsdk_geometry;

typedef struct kvsdk_policy {
  uint32_t struct_size;
  int32_t method;
  int32_t quant_bits;
  int32_t quant_group;
  int32_t quant_residual;
  int32_t sink_tokens;
  int32_t recent_tokens;
  int32_t obs_window;
  int32_t pool_kernel;
  int32_t pool_kind;
  float heavy_ratio;
  float schedule_alpha;
  float schedule_beta;
  int32_t boundary_layer;
  float merge_t;
  float retain_ratio;
  int32_t fetch_tokens;
  int32_t match_tokens;
} kvsdk_policy;

typedef struct kvsdk_cache_stats {
  uint32_t struct_size;
  uint32_t n_layers;
  uint64_t tokens;
  uint64_t appended_tokens;
  uint64_t bytes;
  uint64_t bytes_by_tier[8];
  uint64_t full_bytes;
  uint64_t backing_bytes;
  uint64_t budget_bytes;
  uint64_t context_used_bytes;
} kvsdk_cache_stats;

typedef struct kvsdk_layer_stats {
  uint32_t struct_size;
  uint32_t layer;
  uint64_t tokens;
  uint64_t tokens_min_head;
  uint64_t tokens_max_head;
  uint64_t appended_tokens;
  uint64_t bytes;
  uint64_t bytes_by_tier[8];
} kvsdk_layer_stats;

typedef struct kvsdk_save_options {
  uint32_t struct_size;
  int32_t zstd_level;
  uint32_t include_backing;
  uint64_t max_frame_bytes;
  uint32_t max_journal_percent;
} kvsdk_save_options;

typedef struct kvsdk_load_info {
  uint32_t struct_size;
  uint32_t format_major;
  uint32_t format_minor;
  uint32_t journal_frames_applied;
  uint32_t journal_frames_dropped;
} kvsdk_load_info;

#define KVSDK_OK 0
#define KVSDK_E_INVALID_ARG 1
#define KVSDK_DTYPE_F32 0
#define KVSDK_ROPE_INTERLEAVED 1
#define KVSDK_POOL_MAX 0
#define KVSDK_METHOD_SNAPKV 3

/* The init functions as an app built against the first header called them: plain functions
 * (today's kvsdk.h declares them with parenthesized names and wraps them in macros). */
kvsdk_status kvsdk_context_options_init(kvsdk_context_options *options);
kvsdk_status kvsdk_geometry_init(kvsdk_geometry *geometry);
kvsdk_status kvsdk_policy_init(kvsdk_policy *policy, int32_t method);
kvsdk_status kvsdk_cache_stats_init(kvsdk_cache_stats *stats);
kvsdk_status kvsdk_layer_stats_init(kvsdk_layer_stats *stats);
kvsdk_status kvsdk_save_options_init(kvsdk_save_options *options);
kvsdk_status kvsdk_load_info_init(kvsdk_load_info *info);


const char *kvsdk_last_error(void);
kvsdk_status kvsdk_context_create(kvsdk_context **out, const kvsdk_context_options *options);
void kvsdk_context_destroy(kvsdk_context *ctx);
kvsdk_status kvsdk_context_used_bytes(const kvsdk_context *ctx, uint64_t *out);
kvsdk_status kvsdk_cache_create(kvsdk_cache **out, kvsdk_context *ctx,
                                const kvsdk_geometry *geometry, const kvsdk_policy *policy);
void kvsdk_cache_destroy(kvsdk_cache *cache);
kvsdk_status kvsdk_cache_geometry(const kvsdk_cache *cache, kvsdk_geometry *out);
kvsdk_status kvsdk_cache_policy(const kvsdk_cache *cache, kvsdk_policy *out);
kvsdk_status kvsdk_cache_append(kvsdk_cache *cache, uint32_t layer, size_t n_tokens,
                                const void *k, const void *v, const int32_t *positions,
                                size_t kv_bytes);
kvsdk_status kvsdk_cache_attend(kvsdk_cache *cache, uint32_t layer, size_t n_queries,
                                const void *q, const int32_t *q_positions, size_t q_bytes,
                                void *out, size_t out_bytes);
kvsdk_status kvsdk_cache_stats_get(const kvsdk_cache *cache, kvsdk_cache_stats *out);
kvsdk_status kvsdk_cache_layer_stats_get(const kvsdk_cache *cache, uint32_t layer,
                                         kvsdk_layer_stats *out);
kvsdk_status kvsdk_cache_save_to_buffer(kvsdk_cache *cache, const kvsdk_save_options *options,
                                        void *buf, size_t capacity, size_t *out_size);
kvsdk_status kvsdk_cache_load_from_buffer(kvsdk_cache **out, kvsdk_context *ctx, const void *buf,
                                          size_t size, const kvsdk_geometry *expected,
                                          kvsdk_load_info *info);

#endif
