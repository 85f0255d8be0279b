// What the golden snapshots hold, as formulas: the generator (make_golden.cpp) writes caches
// filled from these, and golden_test.cpp checks every loaded row against them. Every value is
// exactly representable in f16, so the exact tier returns it bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvsdk.h"

namespace kvsdk_golden {

// The recorded attention outputs (content and continuation digests) are the reference kernels'
// (the oracle's); the optimized backend's outputs differ by rounding and are checked against the
// reference by tests/backends/backend_ops_test.cpp.
constexpr kvsdk_backend kGoldenBackend = KVSDK_BACKEND_CPU_REFERENCE;

// A context on kGoldenBackend (NULL on failure).
inline kvsdk_context* golden_context() {
  kvsdk_context_options o;
  kvsdk_context_options_init(&o);
  o.backend = kGoldenBackend;
  kvsdk_context* ctx = nullptr;
  return kvsdk_context_create(&ctx, &o) == KVSDK_OK ? ctx : nullptr;
}

// Key/value element d of token t (position t) in layer l, KV head h: multiples of 1/8 in
// [-16, 16), distinct across (l, t, h, d) within the small golden geometries.
inline float key_value(uint32_t l, uint32_t t, uint32_t h, uint32_t d, bool value) {
  const uint32_t x = (l * 131u + t * 31u + h * 17u + d * 7u + (value ? 5u : 0u)) % 256u;
  return (float(x) - 128.0f) / 8.0f;
}

inline kvsdk_geometry golden_geometry(int32_t dtype) {
  kvsdk_geometry g;
  kvsdk_geometry_init(&g);
  g.n_layers = 2;
  g.n_q_heads = 4;
  g.n_kv_heads = 2;
  g.head_dim = 8;
  g.dtype = dtype;
  g.rope_theta = 500000.0f;
  return g;
}

// Tokens in each layer of the base snapshot; layer 1 holds more (uneven layers).
inline uint32_t base_tokens(uint32_t layer) { return layer == 0 ? 5u : 7u; }

// ------------------------------------------------------------------------------------------------
// Format 2.0 goldens (v2_0_*.kvsnap): caches holding compressed tiers (TierState records). Each
// file is one scripted conversation: a full save after kV2BaseSteps steps, then one journal delta
// (kvsdk_cache_save_delta) after kV2DeltaSteps more. make_golden.cpp runs the script and records
// what every file must hold after load (v2_0_expected.h, generated); golden_test.cpp loads the
// files, checks them against that record, and continues them with kV2ContinueSteps more steps
// next to a cache rebuilt by the same script. The committed files were written by this script:
// never change it (a later format gets its own cases and files).
// v2_0_specache_nobacking's base is saved with include_backing = 0 (loading the base alone
// rebuilds the backing rows from the low-bit copy); its delta, like every delta, carries the
// backing store of the layers it rewrites (here every layer).
// ------------------------------------------------------------------------------------------------

constexpr uint32_t kV2Layers = 4, kV2QHeads = 4, kV2KvHeads = 2, kV2HeadDim = 8;
// The smallkv proxy: a smaller model of the same family (one KV head, two query heads).
constexpr uint32_t kV2ProxyQHeads = 2, kV2ProxyKvHeads = 1;
// Step 0 is a prefill of kV2Prefill tokens, every later step decodes one token.
constexpr uint32_t kV2Prefill = 16;
constexpr uint32_t kV2BaseSteps = 5, kV2DeltaSteps = 4, kV2ContinueSteps = 4;
// Fixed queries for the recorded attention: kV2FixedQueries queries at position kV2FixedPos
// (every cached token visible).
constexpr uint32_t kV2FixedQueries = 2;
constexpr int32_t kV2FixedPos = 1000;

inline kvsdk_geometry v2_geometry() {
  kvsdk_geometry g = golden_geometry(KVSDK_DTYPE_F32);
  g.n_layers = kV2Layers;
  g.n_q_heads = kV2QHeads;
  g.n_kv_heads = kV2KvHeads;
  g.head_dim = kV2HeadDim;
  return g;
}

inline kvsdk_geometry v2_proxy_geometry() {
  kvsdk_geometry g = v2_geometry();
  g.n_q_heads = kV2ProxyQHeads;
  g.n_kv_heads = kV2ProxyKvHeads;
  return g;
}

// Query element d of query head qh for token t in layer l: multiples of 1/32 in [-2, 2). `salt`
// separates the script's queries (0), the proxy's (1), SpeCache's speculative ones (2) and the
// fixed queries of the record (3; proxy 4).
inline float query_value(uint32_t l, uint32_t t, uint32_t qh, uint32_t d, uint32_t salt) {
  const uint32_t x = (l * 37u + t * 53u + qh * 29u + d * 11u + salt * 101u) % 128u;
  return (float(x) - 64.0f) / 32.0f;
}

// One golden file: a preset, the parameters the script sets, and its save options.
struct V2Case {
  const char* file;
  const char* preset;          // kvsdk_policy_parse spec
  uint32_t include_backing;    // kvsdk_save_options.include_backing, always set explicitly
  uint64_t cache_budget;       // kvsdk_cache_set_budget right after create (0: none)
  bool proxy;                  // smallkv: a proxy cache runs each step first
  bool prefetch;               // specache: a speculative prefetch after each layer's attend
};

// What a loaded v2 file must hold (recorded by make_golden.cpp in v2_0_expected.h).
struct V2State {
  uint64_t appended[kV2Layers];             // kvsdk_layer_stats.appended_tokens
  uint64_t tokens[kV2Layers][kV2KvHeads];   // rows kvsdk_cache_read returns
  uint64_t rows[kV2Layers][kV2KvHeads];     // v2_rows_digest
  uint64_t attention[kV2Layers];            // digest of v2_fixed_attention's outputs
  uint32_t tier_mask;                       // bit t: bytes_by_tier[t] > 0
};

// Every field of kvsdk_policy as kvsdk_cache_policy returns it after load.
struct V2Policy {
  int32_t method, quant_bits, quant_group, quant_residual, sink_tokens, recent_tokens,
      obs_window, pool_kernel, pool_kind;
  float heavy_ratio, schedule_alpha, schedule_beta;
  int32_t boundary_layer;
  float merge_t, retain_ratio;
  int32_t fetch_tokens, match_tokens;
};

// A frame of the file as written: offset of its 32-byte header, payload bytes, container kind
// (1 metadata, 2 tier chunk, 3 index, 4 journal).
struct V2Frame {
  uint64_t offset;
  uint32_t payload_bytes;
  uint8_t kind;
};

struct V2Expected {
  const char* file;
  const char* preset;
  uint32_t include_backing;
  uint64_t cache_budget;
  V2Policy policy;
  uint32_t format_major, format_minor;
  uint32_t journal_frames_applied;
  uint64_t file_bytes, base_end;      // base_end: end of the full snapshot (trailer included)
  std::vector<V2Frame> frames;
  V2State base;                       // the file cut at base_end (no journal)
  V2State full;                       // the whole file (base + delta)
  uint64_t continuation;              // digest of kV2ContinueSteps more steps' outputs and rows
};

inline const V2Case* v2_cases(size_t* n) {
  static const V2Case cases[] = {
      {"v2_0_kivi.kvsnap", "kivi", 1, 0, false, false},
      {"v2_0_xkv_kivi2.kvsnap", "xkv+kivi2", 1, 4600, false, false},
      {"v2_0_spindlekv.kvsnap", "spindlekv", 1, 6500, false, false},
      {"v2_0_minicache.kvsnap", "minicache", 1, 0, false, false},
      {"v2_0_minicache_kivi4.kvsnap", "minicache+kivi4", 1, 0, false, false},
      {"v2_0_smallkv.kvsnap", "smallkv", 1, 5000, true, false},
      {"v2_0_specache.kvsnap", "specache", 1, 0, false, true},
      {"v2_0_specache_nobacking.kvsnap", "specache", 0, 0, false, true},
  };
  *n = sizeof cases / sizeof cases[0];
  return cases;
}

// The policy of a case: the preset with small KIVI groups and windows so that a few dozen tokens
// already fill quantized blocks, evict and fetch.
inline kvsdk_policy v2_policy(const V2Case& c) {
  kvsdk_policy p;
  kvsdk_policy_init(&p, KVSDK_METHOD_FULL);
  kvsdk_policy_parse(&p, c.preset);
  p.quant_group = 4;
  p.quant_residual = 4;
  p.obs_window = 4;
  p.pool_kernel = 3;
  p.fetch_tokens = 6;
  p.match_tokens = 8;
  p.evict_slack = 0.0f;  // the files were written with exact eviction (before the field)
  p.kivi_weight_bits = 14;  // and with 14-bit KIVI value weights (before that field)
  return p;
}

inline uint32_t v2_step_begin(uint32_t step) { return step == 0 ? 0 : kV2Prefill + step - 1; }
inline uint32_t v2_step_end(uint32_t step) { return kV2Prefill + step; }

// f32 keys, values and positions of tokens [t0, t1) of layer l (n_kv_heads of g); the proxy's
// single KV head holds the large model's KV head 0.
inline void v2_kv(const kvsdk_geometry& g, uint32_t l, uint32_t t0, uint32_t t1,
                  std::vector<float>& k, std::vector<float>& v, std::vector<int32_t>& pos) {
  const size_t row = size_t(g.n_kv_heads) * g.head_dim;
  k.assign((t1 - t0) * row, 0.0f);
  v.assign(k.size(), 0.0f);
  pos.clear();
  for (uint32_t t = t0; t < t1; ++t) {
    pos.push_back(int32_t(t));
    for (uint32_t h = 0; h < g.n_kv_heads; ++h) {
      for (uint32_t d = 0; d < g.head_dim; ++d) {
        k[(t - t0) * row + h * g.head_dim + d] = key_value(l, t, h, d, false);
        v[(t - t0) * row + h * g.head_dim + d] = key_value(l, t, h, d, true);
      }
    }
  }
}

// Queries of tokens [t0, t1) (n_q_heads of g) with `salt`.
inline std::vector<float> v2_queries(const kvsdk_geometry& g, uint32_t l, uint32_t t0,
                                     uint32_t t1, uint32_t salt) {
  std::vector<float> q;
  for (uint32_t t = t0; t < t1; ++t) {
    for (uint32_t h = 0; h < g.n_q_heads; ++h) {
      for (uint32_t d = 0; d < g.head_dim; ++d) q.push_back(query_value(l, t, h, d, salt));
    }
  }
  return q;
}

// The proxy's share of step `step`: append and attend every layer (run before the large model's).
inline kvsdk_status v2_proxy_step(kvsdk_cache* proxy, uint32_t step) {
  const kvsdk_geometry g = v2_proxy_geometry();
  const uint32_t t0 = v2_step_begin(step), t1 = v2_step_end(step);
  std::vector<float> k, v;
  std::vector<int32_t> pos;
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    v2_kv(g, l, t0, t1, k, v, pos);
    kvsdk_status st = kvsdk_cache_append(proxy, l, pos.size(), k.data(), v.data(), pos.data(),
                                         k.size() * 4);
    if (st != KVSDK_OK) return st;
    const std::vector<float> q = v2_queries(g, l, t0, t1, 1);
    std::vector<float> out(q.size());
    st = kvsdk_cache_attend(proxy, l, pos.size(), q.data(), pos.data(), q.size() * 4, out.data(),
                            out.size() * 4);
    if (st != KVSDK_OK) return st;
  }
  return KVSDK_OK;
}

// Step `step` of the script on cache `c` (and its proxy, for smallkv): per layer append, observe
// and attend the step's queries (causal), then (specache) prefetch for the next token. The
// attention outputs go to `outputs` (NULL: dropped).
inline kvsdk_status v2_step(const V2Case& cs, kvsdk_cache* c, kvsdk_cache* proxy, uint32_t step,
                            std::vector<float>* outputs) {
  const kvsdk_geometry g = v2_geometry();
  const uint32_t t0 = v2_step_begin(step), t1 = v2_step_end(step);
  if (cs.proxy) {
    const kvsdk_status st = v2_proxy_step(proxy, step);
    if (st != KVSDK_OK) return st;
  }
  std::vector<float> k, v;
  std::vector<int32_t> pos;
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    v2_kv(g, l, t0, t1, k, v, pos);
    kvsdk_status st =
        kvsdk_cache_append(c, l, pos.size(), k.data(), v.data(), pos.data(), k.size() * 4);
    if (st != KVSDK_OK) return st;
    const std::vector<float> q = v2_queries(g, l, t0, t1, 0);
    st = kvsdk_cache_observe(c, l, pos.size(), q.data(), pos.data(), q.size() * 4);
    if (st != KVSDK_OK) return st;
    std::vector<float> out(q.size());
    st = kvsdk_cache_attend(c, l, pos.size(), q.data(), pos.data(), q.size() * 4, out.data(),
                            out.size() * 4);
    if (st != KVSDK_OK) return st;
    if (outputs) outputs->insert(outputs->end(), out.begin(), out.end());
    if (cs.prefetch) {
      const std::vector<float> s = v2_queries(g, l, t1, t1 + 1, 2);
      const int32_t next = int32_t(t1);
      st = kvsdk_cache_prefetch(c, l, 1, s.data(), &next, s.size() * 4);
      if (st != KVSDK_OK) return st;
    }
  }
  return KVSDK_OK;
}

// A cache of case `cs` created on `ctx` (with its budget) and run through steps [0, steps).
// `proxy` (smallkv) must be a fresh 'full' cache of v2_proxy_geometry(), linked here.
inline kvsdk_status v2_build(const V2Case& cs, kvsdk_context* ctx, kvsdk_cache* proxy,
                             uint32_t steps, kvsdk_cache** out) {
  const kvsdk_geometry g = v2_geometry();
  const kvsdk_policy p = v2_policy(cs);
  kvsdk_cache* c = nullptr;
  kvsdk_status st = kvsdk_cache_create(&c, ctx, &g, &p);
  if (st == KVSDK_OK && cs.cache_budget) st = kvsdk_cache_set_budget(c, cs.cache_budget);
  if (st == KVSDK_OK && cs.proxy) st = kvsdk_cache_set_proxy(c, proxy);
  for (uint32_t s = 0; st == KVSDK_OK && s < steps; ++s) st = v2_step(cs, c, proxy, s, nullptr);
  if (st != KVSDK_OK) {
    kvsdk_cache_destroy(c);
    return st;
  }
  *out = c;
  return KVSDK_OK;
}

// ------------------------------------------------------------------------------------------------
// Format 3.0 and 1.2 goldens (v3_0_*.kvsnap, v1_2_*.kvsnap): the writer that introduced
// field-by-field tier deltas (formats/tier_delta.*) saves window-method caches (snapkv, pyramidkv,
// xkv, spindlekv) and caches with compressed tiers as 3.0, every other exact cache (full,
// streaming_llm, h2o) as 1.2. Each file is the v2 script (same geometry, tokens, queries, steps)
// saved in three parts, so that deltas over deltas are pinned:
//   base     a full save after kV3BaseSteps steps (no budget unless the case has one from create)
//   delta 1  after kV3AppendSteps more steps with nothing to enforce: rows are only appended
//   delta 2  after kvsdk_cache_set_budget(evict_percent % of the cache's bytes at that point; the
//            policy evicts or compresses to it) and kV3EvictSteps more steps under that budget;
//            cases with evict_percent 0 (policies that never evict) only run the steps, which
//            compress (KIVI residual windows into blocks, MiniCache merges, SpeCache copies).
// make_golden.cpp runs the script and records what every file must hold after load
// (v3_0_expected.h, v1_2_expected.h, generated); golden_test.cpp checks them. The committed files
// were written by this script: never change it (a later format gets its own cases and files).
// ------------------------------------------------------------------------------------------------

constexpr uint32_t kV3BaseSteps = 5, kV3AppendSteps = 1, kV3EvictSteps = 3;
constexpr uint32_t kV3Delta1Steps = kV3BaseSteps + kV3AppendSteps;       // steps run at delta 1
constexpr uint32_t kV3EndSteps = kV3Delta1Steps + kV3EvictSteps;         // steps run at delta 2
constexpr uint32_t kV3ContinueSteps = 4;

struct V3Case {
  V2Case script;              // file, preset, include_backing, budget from create, proxy, prefetch
  uint32_t evict_percent;     // budget set before delta 2's steps (0: none)
};

struct V3Expected {
  const char* file;
  const char* preset;
  uint32_t include_backing;
  uint64_t cache_budget;              // from create (0: none)
  uint64_t evict_budget;              // set before delta 2's steps (0: none)
  V2Policy policy;
  uint32_t format_major, format_minor;  // of the file (its container header)
  uint32_t journal_frames_applied;      // both deltas
  uint32_t delta1_frames;               // frames of delta 1
  uint64_t file_bytes, base_end, delta1_end;  // ends of the base (trailer included) and delta 1
  std::vector<V2Frame> frames;
  V2State base, delta1, full;         // the file cut at base_end, at delta1_end, whole
  uint64_t continuation;              // kV3ContinueSteps more steps after the whole file
  bool continues_like_writer;         // false: include_backing 0 (rebuilt backing rows differ)
};

// Format 3.0 files: every preset family the 3.0 writer writes.
inline const V3Case* v3_cases(size_t* n) {
  static const V3Case cases[] = {
      {{"v3_0_snapkv.kvsnap", "snapkv", 1, 0, false, false}, 75},
      {{"v3_0_pyramidkv.kvsnap", "pyramidkv", 1, 0, false, false}, 75},
      {{"v3_0_xkv.kvsnap", "xkv", 1, 0, false, false}, 75},
      {{"v3_0_xkv_kivi2.kvsnap", "xkv+kivi2", 1, 0, false, false}, 75},
      {{"v3_0_h2o_kivi4.kvsnap", "h2o+kivi4", 1, 0, false, false}, 75},
      {{"v3_0_kivi.kvsnap", "kivi", 1, 0, false, false}, 0},
      {{"v3_0_spindlekv.kvsnap", "spindlekv", 1, 0, false, false}, 75},
      {{"v3_0_minicache.kvsnap", "minicache", 1, 0, false, false}, 0},
      {{"v3_0_minicache_kivi4.kvsnap", "minicache+kivi4", 1, 0, false, false}, 0},
      {{"v3_0_smallkv.kvsnap", "smallkv", 1, 0, true, false}, 75},
      {{"v3_0_specache.kvsnap", "specache", 1, 0, false, true}, 0},
      {{"v3_0_specache_nobacking.kvsnap", "specache", 0, 0, false, true}, 0},
  };
  *n = sizeof cases / sizeof cases[0];
  return cases;
}

// Format 3.1 files: what the 3.1 writer writes differently from 3.0 (journal deltas give H2O
// scores as differences, HeadScores.score_base/score_diffs): the h2o cache with compressed tiers
// (an h2o cache without them is written as 1.2, whose deltas keep whole scores).
inline const V3Case* v3_1_cases(size_t* n) {
  static const V3Case cases[] = {
      {{"v3_1_h2o_kivi4.kvsnap", "h2o+kivi4", 1, 0, false, false}, 75},
  };
  *n = sizeof cases / sizeof cases[0];
  return cases;
}

// Format 4.0 files (typed compressed-store tables, deltas by field id): every preset family the
// 4.0 writer saves as 4.0, as the v3_0 files.
inline const V3Case* v4_0_cases(size_t* n) {
  static const V3Case cases[] = {
      {{"v4_0_snapkv.kvsnap", "snapkv", 1, 0, false, false}, 75},
      {{"v4_0_pyramidkv.kvsnap", "pyramidkv", 1, 0, false, false}, 75},
      {{"v4_0_xkv.kvsnap", "xkv", 1, 0, false, false}, 75},
      {{"v4_0_xkv_kivi2.kvsnap", "xkv+kivi2", 1, 0, false, false}, 75},
      {{"v4_0_h2o_kivi4.kvsnap", "h2o+kivi4", 1, 0, false, false}, 75},
      {{"v4_0_kivi.kvsnap", "kivi", 1, 0, false, false}, 0},
      {{"v4_0_spindlekv.kvsnap", "spindlekv", 1, 0, false, false}, 75},
      {{"v4_0_minicache.kvsnap", "minicache", 1, 0, false, false}, 0},
      {{"v4_0_minicache_kivi4.kvsnap", "minicache+kivi4", 1, 0, false, false}, 0},
      {{"v4_0_smallkv.kvsnap", "smallkv", 1, 0, true, false}, 75},
      {{"v4_0_specache.kvsnap", "specache", 1, 0, false, true}, 0},
      {{"v4_0_specache_nobacking.kvsnap", "specache", 0, 0, false, true}, 0},
  };
  *n = sizeof cases / sizeof cases[0];
  return cases;
}

// Format 1.2 files: the exact caches the same writer saves as 1.2.
inline const V3Case* v1_2_cases(size_t* n) {
  static const V3Case cases[] = {
      {{"v1_2_full.kvsnap", "full", 1, 0, false, false}, 0},
      {{"v1_2_streaming_llm.kvsnap", "streaming_llm", 1, 0, false, false}, 75},
      {{"v1_2_h2o.kvsnap", "h2o", 1, 0, false, false}, 75},
  };
  *n = sizeof cases / sizeof cases[0];
  return cases;
}

// FNV-1a 64 over bytes, for the recorded digests.
inline uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}
constexpr uint64_t kFnvBasis = 0xcbf29ce484222325ull;

// Digest of what kvsdk_cache_read returns for one (layer, KV head): count, positions, keys and
// values (f32 bit patterns). `n` receives the count.
inline kvsdk_status v2_rows_digest(const kvsdk_cache* c, uint32_t l, uint32_t h, uint64_t* n_out,
                                   uint64_t* digest) {
  size_t n = 0;
  kvsdk_status st = kvsdk_cache_read(c, l, h, nullptr, nullptr, nullptr, 0, &n);
  if (st != KVSDK_OK) return st;
  std::vector<float> k(n * kV2HeadDim), v(n * kV2HeadDim);
  std::vector<int32_t> pos(n);
  if (n) st = kvsdk_cache_read(c, l, h, k.data(), v.data(), pos.data(), n, &n);
  if (st != KVSDK_OK) return st;
  const uint64_t count = n;
  uint64_t d = fnv1a(kFnvBasis, &count, sizeof count);
  d = fnv1a(d, pos.data(), pos.size() * 4);
  d = fnv1a(d, k.data(), k.size() * 4);
  d = fnv1a(d, v.data(), v.size() * 4);
  *n_out = n;
  *digest = d;
  return KVSDK_OK;
}

// Attention of the fixed queries in layer l (the proxy, when given, attends its fixed queries
// first, as a smallkv host would); the outputs go to `out`. Changes no rows (smallkv: its
// importance scores; specache: its hit-rate measurement).
inline kvsdk_status v2_fixed_attention(kvsdk_cache* c, kvsdk_cache* proxy, uint32_t l,
                                       std::vector<float>* out) {
  const std::vector<int32_t> qpos(kV2FixedQueries, kV2FixedPos);
  if (proxy) {
    const kvsdk_geometry pg = v2_proxy_geometry();
    const std::vector<float> pq = v2_queries(pg, l, 0, kV2FixedQueries, 4);
    std::vector<float> po(pq.size());
    const kvsdk_status st = kvsdk_cache_attend(proxy, l, kV2FixedQueries, pq.data(), qpos.data(),
                                               pq.size() * 4, po.data(), po.size() * 4);
    if (st != KVSDK_OK) return st;
  }
  const std::vector<float> q = v2_queries(v2_geometry(), l, 0, kV2FixedQueries, 3);
  out->assign(q.size(), 0.0f);
  return kvsdk_cache_attend(c, l, kV2FixedQueries, q.data(), qpos.data(), q.size() * 4,
                            out->data(), out->size() * 4);
}

// Measures what a cache holds into `st`: appended tokens, rows and tiers, then the fixed-query
// attention (smallkv: `proxy`, which has run the same steps, is attached first).
inline kvsdk_status v2_measure(kvsdk_cache* c, kvsdk_cache* proxy, V2State* st) {
  *st = V2State{};
  kvsdk_status s = KVSDK_OK;
  for (uint32_t l = 0; l < kV2Layers && s == KVSDK_OK; ++l) {
    kvsdk_layer_stats ls{};
    ls.struct_size = sizeof ls;
    s = kvsdk_cache_layer_stats_get(c, l, &ls);
    st->appended[l] = ls.appended_tokens;
    for (uint32_t h = 0; h < kV2KvHeads && s == KVSDK_OK; ++h) {
      s = v2_rows_digest(c, l, h, &st->tokens[l][h], &st->rows[l][h]);
    }
  }
  kvsdk_cache_stats cs{};
  cs.struct_size = sizeof cs;
  if (s == KVSDK_OK) s = kvsdk_cache_stats_get(c, &cs);
  for (uint32_t t = 0; t < KVSDK_TIER_SLOTS; ++t) {
    if (cs.bytes_by_tier[t]) st->tier_mask |= 1u << t;
  }
  if (s == KVSDK_OK && proxy) s = kvsdk_cache_set_proxy(c, proxy);
  for (uint32_t l = 0; l < kV2Layers && s == KVSDK_OK; ++l) {
    std::vector<float> out;
    s = v2_fixed_attention(c, proxy, l, &out);
    st->attention[l] = fnv1a(kFnvBasis, out.data(), out.size() * 4);
  }
  return s;
}

// The continuation record: digest of the continuation steps' attention outputs, then of every
// (layer, head)'s rows after them.
inline kvsdk_status v2_continuation_digest(const kvsdk_cache* c, const std::vector<float>& outputs,
                                           uint64_t* digest) {
  uint64_t d = fnv1a(kFnvBasis, outputs.data(), outputs.size() * 4);
  for (uint32_t l = 0; l < kV2Layers; ++l) {
    for (uint32_t h = 0; h < kV2KvHeads; ++h) {
      uint64_t n = 0, rows = 0;
      const kvsdk_status s = v2_rows_digest(c, l, h, &n, &rows);
      if (s != KVSDK_OK) return s;
      d = fnv1a(d, &rows, sizeof rows);
    }
  }
  *digest = d;
  return KVSDK_OK;
}

// ---- The v3 script (see kV3BaseSteps): the parts after the base. ----

// A cache of case `cs` (its budget from create, its proxy linked) run through the base steps.
inline kvsdk_status v3_base(const V3Case& cs, kvsdk_context* ctx, kvsdk_cache* proxy,
                            kvsdk_cache** out) {
  return v2_build(cs.script, ctx, proxy, kV3BaseSteps, out);
}

// Delta 1's steps (only appends).
inline kvsdk_status v3_append_part(const V3Case& cs, kvsdk_cache* c, kvsdk_cache* proxy) {
  for (uint32_t s = kV3BaseSteps; s < kV3Delta1Steps; ++s) {
    const kvsdk_status st = v2_step(cs.script, c, proxy, s, nullptr);
    if (st != KVSDK_OK) return st;
  }
  return KVSDK_OK;
}

// Delta 2's part: the budget (evict_percent of the cache's bytes now), then its steps.
// `budget` receives the budget set (0: none).
inline kvsdk_status v3_evict_part(const V3Case& cs, kvsdk_cache* c, kvsdk_cache* proxy,
                                  uint64_t* budget) {
  *budget = 0;
  if (cs.evict_percent) {
    kvsdk_cache_stats st{};
    st.struct_size = sizeof st;
    kvsdk_status s = kvsdk_cache_stats_get(c, &st);
    if (s != KVSDK_OK) return s;
    *budget = st.bytes * cs.evict_percent / 100;
    s = kvsdk_cache_set_budget(c, *budget);
    if (s != KVSDK_OK) return s;
  }
  for (uint32_t s = kV3Delta1Steps; s < kV3EndSteps; ++s) {
    const kvsdk_status st = v2_step(cs.script, c, proxy, s, nullptr);
    if (st != KVSDK_OK) return st;
  }
  return KVSDK_OK;
}

// The whole script up to `steps` (kV3BaseSteps, kV3Delta1Steps or kV3EndSteps).
inline kvsdk_status v3_build(const V3Case& cs, kvsdk_context* ctx, kvsdk_cache* proxy,
                             uint32_t steps, kvsdk_cache** out) {
  kvsdk_cache* c = nullptr;
  kvsdk_status st = v3_base(cs, ctx, proxy, &c);
  if (st == KVSDK_OK && steps >= kV3Delta1Steps) st = v3_append_part(cs, c, proxy);
  uint64_t budget = 0;
  if (st == KVSDK_OK && steps >= kV3EndSteps) st = v3_evict_part(cs, c, proxy, &budget);
  if (st != KVSDK_OK) {
    kvsdk_cache_destroy(c);
    return st;
  }
  *out = c;
  return KVSDK_OK;
}

// ------------------------------------------------------------------------------------------------
// Format 5.0 goldens (v5_0_*.kvsnap): a conversation on a shared prefix (kvsdk_cache_freeze,
// kvsdk_cache_create_on_prefix). The prefix is the v2 script's step 0 (the kV2Prefill-token
// prefill) on a 'kivi' cache (v2_policy), frozen; it is saved alone as v5_0_prefix_base.kvsnap (a
// plain 4.1 file: a frozen cache saves as any other). The conversation continues it with the v2
// script's steps from kV5PrefixSteps on (one token each) under its own policy: a full save after
// kV5BaseSteps of them, one appending journal delta after kV5DeltaSteps more; the same
// conversation is saved twice: embedding its prefix (embed_prefix 1: loads alone) and
// referencing it by content hash (embed_prefix 0: loads with kvsdk_cache_load_on_prefix on the
// base file, loaded and frozen). make_golden.cpp records what each file holds (v5_0_expected.h);
// golden_test.cpp checks it. Never change this script (a later format gets its own cases).
// ------------------------------------------------------------------------------------------------

constexpr uint32_t kV5PrefixSteps = 1;  // the prefix: step 0 (tokens [0, kV2Prefill))
constexpr uint32_t kV5BaseSteps = 4, kV5DeltaSteps = 2, kV5ContinueSteps = 3;
constexpr uint32_t kV5Delta1Steps = kV5PrefixSteps + kV5BaseSteps;  // script steps run at the base
constexpr uint32_t kV5EndSteps = kV5Delta1Steps + kV5DeltaSteps;    // ... and at the delta
constexpr const char* kV5PrefixFile = "v5_0_prefix_base.kvsnap";
constexpr const char* kV5PrefixPreset = "kivi";

struct V5Case {
  const char* file;
  const char* preset;     // the conversation's policy (v2_policy of this preset)
  uint32_t embed_prefix;  // kvsdk_save_options.embed_prefix of the base save and the delta
};

inline const V5Case* v5_0_cases(size_t* n) {
  static const V5Case cases[] = {
      {"v5_0_prefix_embedded.kvsnap", "snapkv", 1},
      {"v5_0_prefix_referenced.kvsnap", "snapkv", 0},
  };
  *n = sizeof cases / sizeof cases[0];
  return cases;
}

// What a v5 file holds (v5_0_expected.h). The prefix file (embed_prefix 2 in its record) has no
// journal: base == full, base_end == file_bytes, continuation 0.
struct V5Expected {
  const char* file;
  const char* preset;
  uint32_t embed_prefix;              // 0 references, 1 embeds, 2: the prefix's own snapshot
  V2Policy policy;
  uint32_t format_major, format_minor;
  uint32_t journal_frames_applied;
  uint64_t file_bytes, base_end;
  std::vector<V2Frame> frames;
  V2State base, full;                 // cut at base_end; whole (own rows of the conversation;
                                      // the fixed-query attention spans the prefix too)
  uint64_t continuation;              // kV5ContinueSteps more steps after the whole file
};

inline V2Case v5_script(const char* preset) { return {"", preset, 1, 0, false, false}; }

// The frozen prefix of every v5 file, built by the script on `ctx` (frozen unless `freeze` 0).
inline kvsdk_status v5_prefix(kvsdk_context* ctx, kvsdk_cache** out, bool freeze = true) {
  kvsdk_cache* c = nullptr;
  kvsdk_status st = v2_build(v5_script(kV5PrefixPreset), ctx, nullptr, kV5PrefixSteps, &c);
  if (st == KVSDK_OK && freeze) st = kvsdk_cache_freeze(c);
  if (st != KVSDK_OK) {
    kvsdk_cache_destroy(c);
    return st;
  }
  *out = c;
  return KVSDK_OK;
}

// Script steps [from, to) of a v5 conversation.
inline kvsdk_status v5_steps(const char* preset, kvsdk_cache* c, uint32_t from, uint32_t to,
                             std::vector<float>* outputs = nullptr) {
  for (uint32_t s = from; s < to; ++s) {
    const kvsdk_status st = v2_step(v5_script(preset), c, nullptr, s, outputs);
    if (st != KVSDK_OK) return st;
  }
  return KVSDK_OK;
}

// A conversation of `preset` on the frozen `prefix`, run up to script step `steps`.
inline kvsdk_status v5_conversation(kvsdk_cache* prefix, const char* preset, uint32_t steps,
                                    kvsdk_cache** out) {
  const kvsdk_policy p = v2_policy(v5_script(preset));
  kvsdk_cache* c = nullptr;
  kvsdk_status st = kvsdk_cache_create_on_prefix(&c, prefix, &p);
  if (st == KVSDK_OK) st = v5_steps(preset, c, kV5PrefixSteps, steps);
  if (st != KVSDK_OK) {
    kvsdk_cache_destroy(c);
    return st;
  }
  *out = c;
  return KVSDK_OK;
}

}  // namespace kvsdk_golden
