/*
 * kvsdk.h — the stable C ABI of kvsdk, an embeddable SDK for the key/value (KV) cache of
 * transformer language models.
 *
 * The host application owns the model and its forward pass; kvsdk owns the KV cache of each
 * conversation: it holds it inside a hard memory budget, compresses it, computes attention over
 * it and (see the snapshot section) suspends and resumes it.
 *
 * This header is the specification. It reads top to bottom as a user's journey:
 *   version -> status and errors -> context -> geometry -> policy -> cache
 *   -> append / attend / read -> compression (observe, compress, plan) -> stats
 *   -> snapshots (save / load).
 *
 * ABI rules (hold for every function below):
 *   - Handles are opaque; every `*_create` has a `*_destroy`, and `*_destroy(NULL)` is a no-op.
 *   - Every fallible call returns a `kvsdk_status`. On failure, outputs are left untouched and
 *     the object the call operated on is unchanged, except where a function states otherwise
 *     (kvsdk_cache_save_to_buffer's buffer; KVSDK_E_NO_MEMORY part-way through an append or a
 *     prefetch of some compressed policies, see kvsdk_cache_append and kvsdk_cache_prefetch).
 *     `kvsdk_last_error()` adds detail (and is cleared by every call that succeeds).
 *   - Every struct begins with `uint32_t struct_size` and has an `*_init()` that sets it (and the
 *     defaults). Structs only grow at their end, so an app keeps working with the header it was
 *     built against:
 *       - input structs (options, geometry, policy): a struct from an older header gets the
 *         defaults for the fields it lacks; one from a newer header (larger `struct_size`) is
 *         accepted if the fields this library does not know are zero;
 *       - output structs (stats, load info, and the geometry and policy read-backs): the library
 *         writes the fields that fit in `struct_size` (never a byte past it) and sets
 *         `struct_size` to the bytes it wrote;
 *       - a `struct_size` below the struct's first published size is KVSDK_E_INVALID_ARG.
 *   - Initialising a struct: `kvsdk_X_init(p, ...)` is a macro for
 *     `kvsdk_X_init_sized(p, sizeof(kvsdk_X), ...)`, sizeof taken where the app is compiled, so
 *     the library learns the size of the app's struct and writes exactly that many bytes (a NULL
 *     `p` still compiles and is refused at run time): never past the end of an app's
 *     struct, however many fields the library's own struct has gained since. `*_init_sized`
 *     writes the first min(struct_size, library's sizeof) bytes: struct_size set to that count,
 *     every field that fits set to its default. A size above the library's sizeof (an app built
 *     against a newer kvsdk.h) gets the library's sizeof bytes and struct_size says so; the rest
 *     of the app's struct is left as it was (the app zeroes it, or reads struct_size to see which
 *     fields this library knows: a field past struct_size is ignored by every call). A size below
 *     the struct's first published size, or a NULL pointer, is KVSDK_E_INVALID_ARG and writes
 *     nothing. Bindings call the `*_init_sized` functions with their own struct sizes.
 *   - Legacy init symbols: apps built before the `*_init_sized` functions existed call
 *     `kvsdk_X_init` (and kvsdk_policy_parse, which fills a policy too) as a function. Those
 *     symbols stay exported but are frozen: they write the struct's FIRST published size (and set
 *     struct_size to it), which fits every app's struct, so later fields keep their "older
 *     structs" defaults. They are declared with a parenthesized name, `(kvsdk_X_init)(...)`, so
 *     that the macro does not apply to the declaration; new code uses the macro (or
 *     `*_init_sized`, kvsdk_policy_parse_sized) and gets every field its header knows.
 *   - Outputs come back through pointer arguments and are owned by the caller.
 *   - Same major version means same ABI.
 *
 * Threading (per object):
 *   - `kvsdk_context` is thread-safe: many caches on many threads may share one context.
 *   - `kvsdk_cache` is used by one thread at a time (the caller serialises access to one cache),
 *     for every call, including those that take a const cache; distinct caches may be used
 *     concurrently, even when they share a context. Exception: a smallkv cache and its proxy
 *     (kvsdk_cache_set_proxy) read and update each other's state, so the pair is used by one
 *     thread at a time, unless kvsdk_cache_set_proxy_wait lets the proxy run a step on its own
 *     thread while the smallkv cache runs the same step (see there for the rules).
 *   - Free functions without a handle (version, status strings, *_init, *_init_sized,
 *     kvsdk_policy_parse and kvsdk_policy_parse_sized) are thread-safe.
 *
 * C99-clean: no C++ and no dependency types appear here.
 */
#ifndef KVSDK_H
#define KVSDK_H

#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------------------------------ */
/* Export macro                                                                                */
/* ------------------------------------------------------------------------------------------ */

#if defined(KVSDK_STATIC)
#  define KVSDK_API
#elif defined(_WIN32)
#  if defined(KVSDK_BUILDING)
#    define KVSDK_API __declspec(dllexport)
#  else
#    define KVSDK_API __declspec(dllimport)
#  endif
#elif defined(__GNUC__) || defined(__clang__)
#  define KVSDK_API __attribute__((visibility("default")))
#else
#  define KVSDK_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Version                                                                                     */
/* ------------------------------------------------------------------------------------------ */

#define KVSDK_VERSION_MAJOR 0
#define KVSDK_VERSION_MINOR 1
#define KVSDK_VERSION_PATCH 0
/** Version as one integer: major * 10000 + minor * 100 + patch. */
#define KVSDK_VERSION_NUMBER \
  (KVSDK_VERSION_MAJOR * 10000 + KVSDK_VERSION_MINOR * 100 + KVSDK_VERSION_PATCH)

/** Run-time version of the linked library, as KVSDK_VERSION_NUMBER. Compare with the
 *  compile-time macro to detect a mismatched library. Never fails. Thread-safe. */
KVSDK_API uint32_t kvsdk_version(void);

/** Run-time version as a static string "MAJOR.MINOR.PATCH". Never NULL; not to be freed. */
KVSDK_API const char *kvsdk_version_string(void);

/* ------------------------------------------------------------------------------------------ */
/* Status codes and errors                                                                     */
/* ------------------------------------------------------------------------------------------ */

/** Result of every fallible call. Numbers are explicit and never renumbered. */
typedef enum kvsdk_status {
  KVSDK_OK = 0,
  KVSDK_E_INVALID_ARG = 1,   /**< NULL pointer, bad size, bad struct_size, out-of-range value. */
  KVSDK_E_OUT_OF_RANGE = 2,  /**< Layer or head index beyond the cache geometry. */
  KVSDK_E_BUDGET = 3,        /**< The memory budget cannot hold the result; nothing changed. */
  KVSDK_E_NO_MEMORY = 4,     /**< The system allocator failed; nothing changed. */
  KVSDK_E_UNSUPPORTED = 5,   /**< Not implemented in this build or on this backend. */
  KVSDK_E_IO = 6,            /**< A file could not be opened, read, written or synced. */
  KVSDK_E_CORRUPT = 7,       /**< Input bytes fail validation (truncated, bad checksum, ...). */
  KVSDK_E_VERSION = 8,       /**< Input uses a newer major format version than this library. */
  KVSDK_E_GEOMETRY = 9,      /**< Geometry mismatch (e.g. a snapshot of another model). */
  KVSDK_E_STATE = 10,        /**< The call is not valid in the object's current state. */
  KVSDK_E_BACKEND = 11,      /**< The backend (e.g. the CUDA driver) reported an error. */
  KVSDK_E_INTERNAL = 12      /**< A bug in kvsdk; please report it with kvsdk_last_error(). */
} kvsdk_status;

/** Short static English description of a status value ("memory budget exceeded", ...). Takes
 *  an int32_t so that any value is safe to pass; unknown values give "unknown status". Never
 *  NULL; not to be freed. Thread-safe. */
KVSDK_API const char *kvsdk_status_str(int32_t status);

/** Detail of the failure of the most recent call on the calling thread that returns a
 *  kvsdk_status (thread-local): every such call clears it when it returns KVSDK_OK and sets it
 *  when it fails, so it is non-empty exactly when that call failed. Calls that return no status
 *  (the *_destroy functions, kvsdk_version*, kvsdk_status_str, kvsdk_last_error itself) leave it
 *  as it is. Never NULL (empty string when the last call succeeded or nothing ran yet). The
 *  pointer is valid until the next kvsdk call on the same thread. */
KVSDK_API const char *kvsdk_last_error(void);

/* ------------------------------------------------------------------------------------------ */
/* Context: a backend and a memory budget shared by the caches created on it                  */
/* ------------------------------------------------------------------------------------------ */

/** Where cache storage lives and attention runs. Numbers are never renumbered. */
typedef enum kvsdk_backend {
  /** The optimized CPU kernels: SIMD (AVX-512, AVX2, SSE4, NEON or scalar, whichever the CPU
   *  runs best, chosen at run time). Every SIMD target gives the same bits on every machine, so
   *  a snapshot continues identically wherever it is loaded. */
  KVSDK_BACKEND_CPU = 0,
  /** An NVIDIA GPU (a kvsdk built with CUDA: Jetson Orin sm_87, Hopper sm_90, PTX for newer).
   *  The context's caches keep their rows in device memory: see kvsdk_context_create for what
   *  runs there in this version. */
  KVSDK_BACKEND_CUDA = 1,
  /** The scalar reference kernels, the oracle the optimized ones are tested against: slower;
   *  for checking a result. Outputs differ from KVSDK_BACKEND_CPU's by rounding only (the
   *  stored rows and snapshots are identical). */
  KVSDK_BACKEND_CPU_REFERENCE = 2
} kvsdk_backend;

typedef struct kvsdk_context kvsdk_context;

typedef struct kvsdk_context_options {
  uint32_t struct_size;   /**< sizeof(kvsdk_context_options); set by kvsdk_context_options_init. */
  int32_t backend;        /**< A kvsdk_backend. Default KVSDK_BACKEND_CPU. */
  int32_t device;         /**< Device ordinal for KVSDK_BACKEND_CUDA; ignored on CPU. Default 0. */
  uint64_t budget_bytes;  /**< Hard limit on cache storage bytes, summed over every cache of this
                               context. 0 means unlimited. Default 0. */
  int32_t n_threads;      /**< Threads the context's kernels run on, the calling thread included:
                               0 = every core the system reports, 1 = the calling thread only,
                               at most KVSDK_MAX_THREADS. Default 0. (Added in 1.x: an app built
                               with a smaller struct_size gets the default.) See below. */
} kvsdk_context_options;

/** The largest kvsdk_context_options.n_threads. */
#define KVSDK_MAX_THREADS 256

/* Threads. A context owns a pool of n_threads - 1 worker threads, started by
 *  kvsdk_context_create and joined when the context's memory is freed. After a job a worker polls
 *  for the next one for at most 100 microseconds, then sleeps, so an idle context costs no CPU
 *  after that (why poll: waking a sleeping thread costs tens to hundreds of microseconds on VMs
 *  and phones, as much as a decode step's job). kvsdk_cache_attend splits a layer's KV heads over
 *  the pool when the work is large enough (long caches; the exact tier, KIVI and SpeCache
 *  stores; other stores attend on the calling thread) and returns when all are done; the calling
 *  thread works too. On the exact tier and KIVI stores, a call of at most 256 query rows
 *  (queries x query heads: decode) splits each KV head of T >= 4096 rows into min(16, T / 2048)
 *  token ranges whose softmax states are merged in order (split-K), so that a model with fewer
 *  KV heads than threads (one, with multi-query attention) still uses every thread; the split
 *  depends on T only. Its working memory, kept by the cache and reused (not counted in the
 *  budget), is 16 x rows x (head_dim + 2) floats for the largest such call (decode on a
 *  Llama-3-8B-like layer: 266 KB; at most 2.1 MB at head_dim 128).
 *  Snapshots use the pool as well: kvsdk_cache_save, _save_to_buffer and _save_delta build,
 *  compress and hash the frames on the cache's context's pool (a few frames per thread at a
 *  time, written in order), and kvsdk_cache_load and _load_from_buffer check and decompress the
 *  base snapshot's frames on the destination context's pool (journal deltas are read in order on
 *  the calling thread). Results do not depend on n_threads: each head is
 *  computed the same way on any thread, and snapshot bytes, loaded caches and load errors are the
 *  same at any n_threads.
 *  An app with its own threads: calls on different caches may still run at the same time on
 *  different app threads (one thread per cache at a time, as always); while one call has the
 *  pool, a concurrent call on another cache runs on its own thread alone instead of waiting. An
 *  app that already keeps every core busy sets n_threads = 1. */

/** Initialises the app's `*options` of `struct_size` bytes: defaults for the fields that fit
 *  (CPU, device 0, unlimited budget, every core) (the ABI rules, "Initialising a struct").
 *  Writes min(struct_size, sizeof(kvsdk_context_options)) bytes, never more, and sets
 *  struct_size to that count.
 *  Errors: KVSDK_E_INVALID_ARG (`options` NULL, `struct_size` below the first version's: the
 *          end of `budget_bytes`); nothing is written. Thread-safe. */
KVSDK_API kvsdk_status kvsdk_context_options_init_sized(kvsdk_context_options *options,
                                                        size_t struct_size);
/** Legacy symbol, frozen (the ABI rules, "Legacy init symbols"): as
 *  kvsdk_context_options_init_sized with the first version's size, up to `budget_bytes`;
 *  n_threads is left out (a context created from it uses every core). Not for new code or
 *  bindings. */
KVSDK_API kvsdk_status (kvsdk_context_options_init)(kvsdk_context_options *options);
/** kvsdk_context_options_init_sized with the size of the app's struct. */
#define kvsdk_context_options_init(options) \
  kvsdk_context_options_init_sized((options), sizeof(kvsdk_context_options))

/** Creates a context. `options` may be NULL for defaults. On success `*out` owns a new context;
 *  the caller releases it with kvsdk_context_destroy (caches on it keep it alive until they are
 *  destroyed).
 *  KVSDK_BACKEND_CUDA (a kvsdk built with CUDA) allocates the context's device arena at once:
 *  one block of exactly budget_bytes of memory on GPU `device` (so budget_bytes must be > 0),
 *  freed when the context's memory is. The rows of its cache live there, in f16 with their
 *  positions, and attention runs on the GPU; stored rows, snapshots and budget charges are the
 *  same as on the CPU (a snapshot saved on either backend loads on the other), and attention
 *  outputs differ from the CPU's by rounding only. In this version a CUDA context's caches are
 *  of policy full, streaming_llm, h2o, snapkv, pyramidkv or xkv (with or without a KIVI overlay),
 *  kivi, specache (its low-bit copy and fetched rows in the arena, its backing store in host
 *  memory or a file as on the CPU; a prefetch scores and selects on the GPU, with the reference
 *  CPU backend's bits, so it fetches the same tokens) or smallkv (its full and value-only rows
 *  in the arena; the proxy cache, on any backend, is linked as on the CPU; the proxy's
 *  probabilities are computed with the reference CPU backend's bits where the proxy's rows are
 *  (on the GPU for a CUDA proxy), so the rows' scores and evictions are a reference cache's; an
 *  eviction rebuilds the heads it shrinks on a host copy, which kvsdk_policy.evict_slack makes
 *  rare) or minicache without a KIVI overlay (each layer pair's merged store and its leading
 *  layer's waiting rows in the arena; an append merges its tokens on the host with the CPU's
 *  code and copies them in; minicache+kivi4 is refused), with head_dim 64, 128 or 256;
 *  kvsdk_cache_create refuses the rest with KVSDK_E_UNSUPPORTED
 *  (docs/gpu.md lists what runs on CUDA). Each cache (forks and conversations on a shared
 *  prefix included) holds a region of the arena; a region that must grow moves the others on
 *  the device, which first give back capacity they hold beyond their rows when the arena is
 *  full, and the device work of one context's caches takes turns (a lock). Within a region the
 *  arena is laid out per layer and re-laid (live rows moved on the device) when the allocation
 *  stage plans new per-layer caps, so each layer's share follows XKV's, PyramidKV's or the
 *  host's allocation; the
 *  eviction presets and their '+kiviN' overlays score on the device with the CPU's bits (an
 *  h2o observe or a selection pass sends the queries and an append's incoming keys in and
 *  takes one float per row and KV head out; an overlay's eviction then still plans the kept
 *  heads on a host copy, once per selection pass, which kvsdk_policy.evict_slack makes rare).
 *  Each CUDA context also has its own compute
 *  and copy streams (non-blocking: the app's work on the default stream is not ordered with
 *  them) and 2 MiB of pinned host memory that every transfer of its caches goes through; both
 *  are released with the context. Besides the arena, attention uses device working memory of about 8 bytes per query
 *  element (n_queries x n_q_heads x head_dim) plus its split partials, scoring up to 16 MiB of
 *  logits plus its inputs and one float per row, each grown to the largest call and kept with
 *  the cache, and a save stages the rows through host memory (freed when the save
 *  returns). Device calls select the context's device on the calling thread for their duration
 *  and then restore the thread's current device.
 *  Errors: KVSDK_E_INVALID_ARG (NULL out, bad struct_size, unknown backend, device ordinal not
 *          present, KVSDK_BACKEND_CUDA with budget_bytes 0), KVSDK_E_UNSUPPORTED (CUDA in a
 *          build without it), KVSDK_E_BACKEND (no CUDA device, with the driver's reason),
 *          KVSDK_E_NO_MEMORY (the device cannot allocate the budget). */
KVSDK_API kvsdk_status kvsdk_context_create(kvsdk_context **out,
                                            const kvsdk_context_options *options);

/** Releases the caller's reference to a context. NULL is a no-op. Caches created on the
 *  context keep it alive: its memory is freed when the last of them is destroyed, so destroying
 *  the context first is safe (the caches keep working). */
KVSDK_API void kvsdk_context_destroy(kvsdk_context *ctx);

/** Bytes currently charged against the context budget by all its caches.
 *  Errors: KVSDK_E_INVALID_ARG if `ctx` or `out_bytes` is NULL. Thread-safe. */
KVSDK_API kvsdk_status kvsdk_context_used_bytes(const kvsdk_context *ctx, uint64_t *out_bytes);

/** The context's budget in bytes (0 = unlimited).
 *  Errors: KVSDK_E_INVALID_ARG if `ctx` or `out_bytes` is NULL. Thread-safe. */
KVSDK_API kvsdk_status kvsdk_context_budget_bytes(const kvsdk_context *ctx, uint64_t *out_bytes);

/* ------------------------------------------------------------------------------------------ */
/* Geometry: the shape of one model's attention                                                */
/* ------------------------------------------------------------------------------------------ */

/** Element type of the tensors the host passes in and gets back. */
typedef enum kvsdk_dtype {
  KVSDK_DTYPE_F32 = 0,
  KVSDK_DTYPE_F16 = 1,  /**< IEEE 754 binary16, stored in uint16_t. */
  KVSDK_DTYPE_BF16 = 2  /**< bfloat16, stored in uint16_t. */
} kvsdk_dtype;

/** How the host applies rotary position embeddings (RoPE). kvsdk stores keys as given (already
 *  rotated); the style matters to methods that must undo or redo the rotation. */
typedef enum kvsdk_rope_style {
  KVSDK_ROPE_NONE = 0,
  KVSDK_ROPE_INTERLEAVED = 1,  /**< pairs (x[2i], x[2i+1]) — llama2.c, Meta Llama. */
  KVSDK_ROPE_HALF = 2          /**< pairs (x[i], x[i+d/2]) — GPT-NeoX, HF Llama. */
} kvsdk_rope_style;

typedef struct kvsdk_geometry {
  uint32_t struct_size;  /**< sizeof(kvsdk_geometry); set by kvsdk_geometry_init. */
  uint32_t n_layers;     /**< Transformer layers, 1..4096. */
  uint32_t n_q_heads;    /**< Query heads per layer, a multiple of n_kv_heads, at most 4096. */
  uint32_t n_kv_heads;   /**< Key/value heads per layer, 1..4096 (GQA when fewer than
                              n_q_heads). */
  uint32_t head_dim;     /**< Channels per head, 1..1024; even unless rope_style is
                              KVSDK_ROPE_NONE. */
  int32_t dtype;         /**< A kvsdk_dtype for keys, values, queries and outputs. Default F32. */
  int32_t rope_style;    /**< A kvsdk_rope_style. Default KVSDK_ROPE_INTERLEAVED. */
  float rope_theta;      /**< RoPE base. Default 10000. */
  float attn_scale;      /**< Softmax scale; 0 means 1/sqrt(head_dim). Default 0. */
} kvsdk_geometry;

/** Initialises the app's `*geometry` of `struct_size` bytes: defaults for the fields that fit
 *  (all counts 0, which the host must set; F32, interleaved RoPE, theta 10000, scale 0) (the
 *  ABI rules, "Initialising a struct"). Writes min(struct_size, sizeof(kvsdk_geometry)) bytes,
 *  never more, and sets struct_size to that count.
 *  Errors: KVSDK_E_INVALID_ARG (`geometry` NULL, `struct_size` below the first version's: the
 *          end of `attn_scale`); nothing is written. Thread-safe. */
KVSDK_API kvsdk_status kvsdk_geometry_init_sized(kvsdk_geometry *geometry, size_t struct_size);
/** Legacy symbol, frozen (the ABI rules, "Legacy init symbols"): as kvsdk_geometry_init_sized
 *  with the first version's size, up to `attn_scale`. Not for new code or bindings. */
KVSDK_API kvsdk_status (kvsdk_geometry_init)(kvsdk_geometry *geometry);
/** kvsdk_geometry_init_sized with the size of the app's struct. */
#define kvsdk_geometry_init(geometry) \
  kvsdk_geometry_init_sized((geometry), sizeof(kvsdk_geometry))

/* ------------------------------------------------------------------------------------------ */
/* Policy: how a cache stays inside its budget                                                 */
/* ------------------------------------------------------------------------------------------ */

/** Compression methods: one preset per method, each from its paper (titles and arXiv ids in
 *  docs/papers.md). Numbers are never renumbered. Every method is implemented on the CPU backend
 *  (on KVSDK_BACKEND_CUDA: full, streaming_llm, h2o, snapkv, pyramidkv, xkv, their KIVI
 *  overlays, kivi, specache, smallkv and minicache (not minicache+kivi4) in this version; see
 *  kvsdk_context_create). Not
 *  implemented: a KIVI overlay (quant_bits != 0, e.g. "full+kivi2") on full, spindlekv or smallkv,
 *  for which kvsdk_cache_create returns KVSDK_E_UNSUPPORTED. Methods that "never evict" fail an
 *  append that does not fit the budget with KVSDK_E_BUDGET. */
typedef enum kvsdk_method {
  KVSDK_METHOD_FULL = 0,           /**< Exact f16 cache of every token; never evicts. */
  KVSDK_METHOD_STREAMING_LLM = 1,  /**< Evicts all but the sink_tokens first rows and the newest
                                        rows (StreamingLLM). */
  KVSDK_METHOD_H2O = 2,            /**< Evicts by accumulated attention (kvsdk_cache_observe):
                                        keeps sinks, heavy hitters and the newest rows (H2O). */
  KVSDK_METHOD_SNAPKV = 3,         /**< Evicts by the pooled attention of an observation window
                                        of queries, one selection per KV head (SnapKV). */
  KVSDK_METHOD_PYRAMIDKV = 4,      /**< SnapKV selection; rows per layer decrease linearly with
                                        depth (PyramidKV, with SpindleKV's schedule). */
  KVSDK_METHOD_XKV = 5,            /**< SnapKV-style selection; rows per layer from XKV's greedy
                                        personalised allocation. */
  KVSDK_METHOD_KIVI = 6,           /**< Every layer KIVI-quantized (quant_bits 1/2/4/8, default 2)
                                        with an exact window of recent rows; never evicts. */
  KVSDK_METHOD_SPINDLEKV = 7,      /**< Layers below boundary_layer in codebooks (never evicted);
                                        deeper layers evict with SnapKV selection on SpindleKV's
                                        layer schedule. */
  KVSDK_METHOD_MINICACHE = 8,      /**< From boundary_layer on, adjacent layer pairs share one
                                        SLERP-merged direction per token; "minicache+kiviN" holds
                                        the directions KIVI-quantized. Lower layers stay exact.
                                        Never evicts. */
  KVSDK_METHOD_SMALLKV = 9,        /**< Evicts and compensates with a proxy cache's attention
                                        (SmallKV; see the SmallKV section below). */
  KVSDK_METHOD_SPECACHE = 10       /**< A 2- or 1-bit KIVI copy in the budget, the f16 rows in an
                                        off-budget backing store, speculative prefetch of rows
                                        (SpeCache; see the SpeCache section below). Never evicts.
                                        For snapshots see kvsdk_save_options.include_backing. */
} kvsdk_method;
#define KVSDK_METHOD_COUNT 11

/** Score pooling kinds for observation-window methods. */
typedef enum kvsdk_pool_kind {
  KVSDK_POOL_MAX = 0,
  KVSDK_POOL_AVG = 1
} kvsdk_pool_kind;

/** kvsdk_policy.quant_residual: the exact residual window chosen for the cache's head_dim and
 *  KIVI width instead of a fixed R. A fixed R = 128 keeps a quarter of a 512-token conversation
 *  in f16. kvsdk-eval measured on three models (docs/eval/representations.md: 128 to 767 rows
 *  per layer, head_dim 64 and 8, 1 to 8 bits, live and evicted caches saved as KIVI) that the
 *  window a width needs depends on head_dim and the width, not on those lengths: at head_dim
 *  64 and 2 bits, 8 to 16 rows give the KL of 128 (windows beyond add bytes only) and no window
 *  doubles KL; head_dim 8 needs about 96 rows at 2 bits (KL 0.10 at 16 rows, 0.006 at 96); 1
 *  bit needs 4x the rows of 2 bits, and 4 bits no more than 16 at either head_dim. So the
 *  window is
 *      R = clamp(round(768 / head_dim x 4^(2 - bits)), 16, 128)
 *  (bits: quant_bits; 0, a method without KIVI codes, counts as 8): 16 at head_dim 64 or 128
 *  and 2 bits, 96 at head_dim 8; KIVI's own 128 is the cap. It is resolved once, when a cache
 *  is created (kvsdk_cache_create, kvsdk_cache_create_on_prefix) or converted by a targeted save
 *  (kvsdk_save_options.target_policy): the cache and its snapshots carry the resolved value,
 *  kvsdk_cache_policy returns it, and a cache loaded from a file continues with it. Snapshot
 *  files never hold KVSDK_QUANT_RESIDUAL_AUTO (a file that does is refused, KVSDK_E_CORRUPT).
 *  Lengths beyond this model's context (thousands of rows) were not measured: the cap keeps
 *  longer caches at KIVI's window or below. Not the default: quant_residual stays 128 unless
 *  set, so caches behave as they did. */
#define KVSDK_QUANT_RESIDUAL_AUTO (-1)

/** Policy parameters. Fields that a method does not use are ignored by it. kvsdk_policy_init
 *  sets the defaults given with each field (the same for every method, except quant_bits: 2 for
 *  kivi and specache, 0 for the others). */
typedef struct kvsdk_policy {
  uint32_t struct_size;     /**< sizeof(kvsdk_policy); set by kvsdk_policy_init. */
  int32_t method;           /**< A kvsdk_method. */
  int32_t quant_bits;       /**< KIVI bits: 0 = exact, or 8/4/2/1. kivi: 1/2/4/8 (0 is
                                 KVSDK_E_INVALID_ARG); specache: its low-bit copy, 1 or 2;
                                 eviction presets (the '+kiviN' overlay): the rows they keep are
                                 stored KIVI-quantized (eviction never re-quantizes a kept row);
                                 minicache: the merged directions; full, spindlekv and smallkv
                                 take none (KVSDK_E_UNSUPPORTED). */
  int32_t quant_group;      /**< KIVI group size G (tokens for keys, channels for values). 32. */
  int32_t quant_residual;   /**< KIVI exact residual window R (tokens), >= 0, or
                                 KVSDK_QUANT_RESIDUAL_AUTO. 128. */
  int32_t sink_tokens;      /**< StreamingLLM / H2O: first rows never evicted. 4. */
  int32_t recent_tokens;    /**< Not used by any method in this version (checked >= 0, saved in
                                 snapshots). The recent rows a method keeps follow from its own
                                 parameters: streaming_llm keeps every row after the sinks that
                                 fits, h2o what heavy_ratio leaves, window methods the newest
                                 obs_window rows, smallkv its 2:1:2 split. 32. */
  int32_t obs_window;       /**< Observation window w (queries) of SnapKV/PyramidKV/XKV, of
                                 SpindleKV's evicting layers and of kvsdk_planner; >= 1. 32. */
  int32_t pool_kernel;      /**< 1-D pooling kernel over scores, odd. 7. */
  int32_t pool_kind;        /**< A kvsdk_pool_kind. Max. */
  float heavy_ratio;        /**< H2O: share of the kept rows after the sinks that are heavy
                                 hitters (the rest are the newest rows), 0..1. 0.5. */
  float schedule_alpha;     /**< SpindleKV/PyramidKV schedule alpha. 0.525. */
  float schedule_beta;      /**< SpindleKV/PyramidKV schedule beta. 0.05. */
  int32_t boundary_layer;   /**< SpindleKV: layers below it hold codebooks, the others evict
                                 (0..n_layers); MiniCache: first merged layer (below n_layers).
                                 -1 = n_layers / 2. A value beyond the geometry makes
                                 kvsdk_cache_create fail with KVSDK_E_INVALID_ARG. */
  float merge_t;            /**< MiniCache SLERP interpolation t, 0..1. 0.6. */
  float retain_ratio;       /**< MiniCache share of tokens per head kept unmerged, 0..1. 0.05. */
  int32_t fetch_tokens;     /**< SpeCache: top-k rows fetched per KV head for the next step. 64. */
  int32_t match_tokens;     /**< SmallKV: first tokens used for head matching, >= 1 (the paper
                                 uses 100..200). 128. */
  /* Fields added after the first version of this struct (callers compiled against an older
   * kvsdk.h pass a smaller struct_size and get the value noted "older structs"). */
  float evict_slack;        /**< Amortized eviction, as a share of a layer's cap, 0..0.5 (other
                                 values: KVSDK_E_INVALID_ARG). Eviction presets (streaming_llm,
                                 h2o, snapkv, pyramidkv, xkv, their '+kiviN' overlays, and
                                 spindlekv's evicting layers): when an append or observe makes a
                                 layer evict, the layer evicts down to its cap minus
                                 floor(evict_slack x cap) rows, and the following appends fill
                                 that slack without selecting again. So a decode step selects
                                 (scores and compacts the whole layer) about once per slack's
                                 worth of tokens instead of on every token: append is amortized
                                 O(1). smallkv: an eviction that makes room for an append frees
                                 evict_slack x its byte target more than it needs (the same
                                 amortization, counted in bytes over its heads). Cost in
                                 fidelity: up to that many rows are evicted earlier
                                 than the budget requires (on average the layer holds about
                                 evict_slack / 2 x cap fewer rows than it could); the rows kept
                                 are still the selection's best. Measured by kvsdk-eval on
                                 shakespeare-base at 25% and 10% budgets: the default moves top-1
                                 agreement with the full cache by at most 0.03 and KL by at most
                                 0.0014 nats (docs/eval/slack.md). Cost in memory: none; the cache
                                 holds fewer bytes, never more than its budget. 0 = evict exactly
                                 what each append needs (selection on every appended token once
                                 full). Explicit compression (kvsdk_cache_compress, budgets,
                                 allocations) always fits exactly. Default 0.0625 (1/16: a layer
                                 capped at 512 rows selects once per 32 tokens); older structs
                                 and snapshots written before this field: 0. */
  int32_t kivi_weight_bits; /**< KIVI attention on the CPU (kivi, the '+kiviN' overlays of the
                                 eviction presets, and specache's low-bit copy):
                                 the fused kernel multiplies value codes by integer weights, each
                                 64-token segment's softmax weights x value scales rounded per
                                 query row and value group to this many bits. 7: one byte product
                                 per code (KIVI-2 decode attention at 32k tokens 6.0-6.4 ms
                                 against 7.2-7.5 ms with 14 on the AVX-512 VNNI kernel:
                                 docs/benchmarks.md); 14: two. Cost in fidelity of 7 over 14:
                                 outputs move by up to ~2.3% of the head's largest |value| on the
                                 kernel tests (14: ~0.1%), against KIVI-2's own quantization error
                                 of ~10%; kvsdk-eval on three real models measures it
                                 (docs/eval/weight_bits.md: KL within 0.0004 nats at 100%). 0 = the default: 7 when
                                 quant_bits <= 2, else 14, resolved when a cache is created (its
                                 kvsdk_cache_policy and snapshots hold 7 or 14; 0 where
                                 quant_bits is 0). Other values:
                                 KVSDK_E_INVALID_ARG. Older structs and snapshots written before
                                 this field: 14, so such caches continue bit-identically.
                                 minicache+kivi's merged pairs, the reference backend and the
                                 CUDA kernels dequantize instead and ignore it. */
} kvsdk_policy;

/** Initialises the app's `*policy` of `struct_size` bytes: the defaults of `method` (a
 *  kvsdk_method value) for the fields that fit (the ABI rules, "Initialising a struct"). Writes
 *  min(struct_size, sizeof(kvsdk_policy)) bytes, never more, and sets struct_size to that
 *  count.
 *  Errors: KVSDK_E_INVALID_ARG (`policy` NULL, `struct_size` below the first version's: the end
 *          of `match_tokens`; `method` not a kvsdk_method); nothing is written. Thread-safe. */
KVSDK_API kvsdk_status kvsdk_policy_init_sized(kvsdk_policy *policy, size_t struct_size,
                                               int32_t method);
/** Legacy symbol, frozen (the ABI rules, "Legacy init symbols"): as kvsdk_policy_init_sized
 *  with the first version's size, up to `match_tokens` (evict_slack is left out: a cache
 *  created from it evicts with slack 0, as before that field existed). Not for new code or
 *  bindings. */
KVSDK_API kvsdk_status (kvsdk_policy_init)(kvsdk_policy *policy, int32_t method);
/** kvsdk_policy_init_sized with the size of the app's struct. */
#define kvsdk_policy_init(policy, method) \
  kvsdk_policy_init_sized((policy), sizeof(kvsdk_policy), (method))

/** Parses a preset name such as "full", "snapkv", "kivi" or a composition "xkv+kivi2"
 *  (method, then '+kiviN' for N-bit KIVI, N = 1, 2, 4 or 8; `spec` is a NUL-terminated string,
 *  read only during the call) into the app's `*policy` of `struct_size` bytes: the method's
 *  defaults (as kvsdk_policy_init_sized), quant_bits = N, for the fields that fit (the ABI rules,
 *  "Initialising a struct"). Writes min(struct_size, sizeof(kvsdk_policy)) bytes, never more, and
 *  sets struct_size to that count; a larger struct's tail is left as it was. A name that parses
 *  may still name an unsupported combination ("full+kivi2": see kvsdk_method), refused later by
 *  kvsdk_cache_create.
 *  Errors: KVSDK_E_INVALID_ARG (`policy` or `spec` NULL, `struct_size` below the first version's:
 *          the end of `match_tokens`; unknown method name, an overlay other than kiviN, other N);
 *          on every failure nothing is written. Thread-safe. */
KVSDK_API kvsdk_status kvsdk_policy_parse_sized(kvsdk_policy *policy, size_t struct_size,
                                                const char *spec);
/** Legacy symbol, frozen (the ABI rules, "Legacy init symbols"): as kvsdk_policy_parse_sized
 *  with the first version's size, up to `match_tokens` (evict_slack is left out: a cache
 *  created from it evicts with slack 0, as before that field existed). Not for new code or
 *  bindings. */
KVSDK_API kvsdk_status (kvsdk_policy_parse)(kvsdk_policy *policy, const char *spec);
/** kvsdk_policy_parse_sized with the size of the app's struct. */
#define kvsdk_policy_parse(policy, spec) \
  kvsdk_policy_parse_sized((policy), sizeof(kvsdk_policy), (spec))

/** Canonical lower-case name of a kvsdk_method value ("full", "streaming_llm", ...), or NULL if
 *  `method` is not one. Thread-safe. */
KVSDK_API const char *kvsdk_method_name(int32_t method);

/* ------------------------------------------------------------------------------------------ */
/* Cache: one conversation's KV cache for one model geometry                                   */
/* ------------------------------------------------------------------------------------------ */

typedef struct kvsdk_cache kvsdk_cache;

/** Creates an empty cache on `ctx`. `policy` may be NULL for KVSDK_METHOD_FULL. The cache keeps
 *  a reference to `ctx` (see kvsdk_context_destroy). On success `*out` owns the cache; release it
 *  with kvsdk_cache_destroy.
 *  Errors: KVSDK_E_INVALID_ARG (NULL out/ctx/geometry, bad struct_size, invalid geometry or
 *          policy values, e.g. kivi with quant_bits 0, specache with quant_bits other than 1 or
 *          2, boundary_layer beyond the geometry), KVSDK_E_UNSUPPORTED (a KIVI overlay on full,
 *          spindlekv or smallkv; on a KVSDK_BACKEND_CUDA context: a policy that does not run
 *          there (see kvsdk_context_create), a head_dim other than 64, 128 or 256),
 *          KVSDK_E_BACKEND (the device failed), KVSDK_E_NO_MEMORY. */
KVSDK_API kvsdk_status kvsdk_cache_create(kvsdk_cache **out, kvsdk_context *ctx,
                                          const kvsdk_geometry *geometry,
                                          const kvsdk_policy *policy);

/** Destroys a cache and returns its bytes to the context budget. NULL is a no-op. */
KVSDK_API void kvsdk_cache_destroy(kvsdk_cache *cache);

/** Forks a conversation: creates in `*out` an independent copy of `cache` in the same context,
 *  e.g. to branch a chat at its current turn. The copy has the same geometry, policy, rows (every
 *  tier, SpeCache's off-budget backing store included) and policy state (importance scores,
 *  observation windows, allocation, per-cache budget), so that the same calls on either give the
 *  same results, bit for bit, as they would have given on `cache`; afterwards the two change
 *  independently. Its bytes are charged to the context's budget like a second cache's (the
 *  backing store stays off-budget). Not copied: the link to a snapshot file (kvsdk_cache_save_delta on
 *  the copy is KVSDK_E_STATE until it is saved in full), SpeCache's fetch statistics (start
 *  at zero) and SmallKV's proxy (give the copy its own with kvsdk_cache_set_proxy, e.g. a fork of
 *  the original's proxy, before its next attend). Cost: one pass over the cache's bytes, with
 *  transient memory for one copy of them outside the budget. On success release `*out` with
 *  kvsdk_cache_destroy.
 *  Errors: KVSDK_E_INVALID_ARG (NULL out/cache), KVSDK_E_BUDGET (the copy does not fit the
 *          context's budget), KVSDK_E_NO_MEMORY. On failure `*out` is untouched and nothing
 *          stays charged.
 *  Threading: reads `cache` (one thread at a time per cache, as every cache call). */
KVSDK_API kvsdk_status kvsdk_cache_fork(kvsdk_cache **out, const kvsdk_cache *cache);

/** Rewinds a conversation: removes every token at a position >= `position` from every layer and
 *  tier of `cache` and returns their bytes to the budget, e.g. to regenerate or edit the last
 *  reply (position = where it began). Exact or nothing: on success the cache holds exactly what
 *  a cache that never received those tokens would hold (rows, codes, codebooks, merges, policy
 *  state), so appending the same tokens again gives the same attention outputs and the same
 *  snapshot, bit for bit; when some tier cannot guarantee that, the call fails with
 *  KVSDK_E_STATE, says why (kvsdk_last_error), and changes nothing. A position past every held
 *  token is a successful no-op. How far back each policy can go:
 *    - full: always.
 *    - Eviction (streaming_llm, h2o, snapkv, pyramidkv, xkv and their +kivi compositions): back
 *      to the last eviction (the rows it kept depended on every token held then) and, for h2o,
 *      to just after the newest query given to kvsdk_cache_observe (its scores added them up);
 *      window methods also to the last observation that slid their window. With a budget that
 *      forces evictions, that is at most about policy.evict_slack of a layer's cap back.
 *    - kivi (and +kivi): only tokens still in the exact residual window that arrived after its
 *      last flush of a quantized block, i.e. up to quant_group - 1 tokens once a block has been
 *      quantized; any token before the first flush.
 *    - spindlekv, minicache, smallkv, specache: see docs/truncation.md (per-store rules: whole
 *      appends of a codebook layer, tokens merged after the first prefill, tokens no eviction or
 *      attention statistic saw yet, the low-bit shadow's residual window).
 *    - After kvsdk_cache_load or kvsdk_cache_fork, policies whose history a snapshot does not
 *      carry (everything but full, kivi and specache) can remove only tokens appended since
 *      (spindlekv's and minicache's own layers: or every token).
 *  On KVSDK_BACKEND_CUDA a cache removes only its newest rows: when a row at a position below
 *  `position` was appended after one at or above it, the call fails with KVSDK_E_STATE.
 *  A smallkv cache's proxy is a separate cache: truncate it at the same position too.
 *  kvsdk_cache_save_delta records a truncation like any other change (the next delta rewrites
 *  the heads that lost rows).
 *  Errors: KVSDK_E_INVALID_ARG (NULL cache, position outside 0 .. KVSDK_MAX_POSITION),
 *          KVSDK_E_STATE (not exact for this policy here; nothing changed).
 *  Threading: changes `cache` (one thread at a time per cache). */
KVSDK_API kvsdk_status kvsdk_cache_truncate(kvsdk_cache *cache, int32_t position);

/** Freezes `cache`, e.g. a system prompt's, so that it can be the shared prefix of many
 *  conversations (kvsdk_cache_create_on_prefix). A frozen cache is read-only: attend, read,
 *  stats, save and fork work; append, truncate, observe, compress, set_budget, allocations,
 *  prefetch and being a SmallKV proxy fail with KVSDK_E_STATE, changing nothing. Freezing is
 *  final (a fork of a frozen cache is not frozen) and idempotent.
 *  Errors: KVSDK_E_INVALID_ARG (NULL), KVSDK_E_UNSUPPORTED (policies whose attention changes their
 *          own state cannot be shared: smallkv, specache; a cache that itself continues a prefix:
 *          no chains), KVSDK_E_STATE (the cache is a SmallKV proxy right now).
 *  Threading: changes `cache` (one thread at a time per cache). */
KVSDK_API kvsdk_status kvsdk_cache_freeze(kvsdk_cache *cache);

/** Creates in `*out` an empty conversation that continues the frozen cache `prefix`: its
 *  attention runs over the prefix's rows and then its own, in one softmax, without copying the
 *  prefix. It lives in the prefix's context and takes its geometry; `policy` (NULL: full) applies
 *  to its own rows only: eviction never touches the prefix, and the prefix stays as its own
 *  policy stored it (e.g. a kivi prefix stays quantized as it was when frozen, and a conversation
 *  of policy kivi quantizes its own rows in blocks of its own). So the outputs equal those of one
 *  cache holding the prefix's rows and then the conversation's, to float rounding (the two parts
 *  are merged by their log-sum-exps, within about 1e-6 relative); for 'full' over 'full' that is
 *  exactly a private copy of the prefix. (A smallkv or specache conversation's own part weighs
 *  in by the log-sum-exp of the rows kvsdk_cache_read returns, not of the rows it substitutes.) Append the conversation's tokens at positions after the
 *  prefix's: a query sees the prefix tokens at positions <= its own.
 *  Budget: the prefix's bytes are charged once, to the prefix (the handle may be destroyed: the
 *  prefix stays alive, and charged, until its last conversation is destroyed); each conversation
 *  charges, and its stats, read and truncate report, only its own rows. Forks share the prefix.
 *  Snapshots: kvsdk_save_options.prefix says whether a conversation's snapshot embeds its
 *  prefix or references it by content hash (kvsdk_cache_load_on_prefix).
 *  Cost: each attend also computes the two parts' log-sum-exps in a second pass over the keys
 *  (reference speed), and the conversations of one prefix attend over it one at a time (a lock).
 *  Errors: KVSDK_E_INVALID_ARG (NULL out/prefix, invalid policy), KVSDK_E_STATE (the prefix is not
 *          frozen), KVSDK_E_UNSUPPORTED (policy not built), KVSDK_E_NO_MEMORY. On failure `*out`
 *          is untouched.
 *  Threading: reads `prefix`; conversations of one prefix, and the prefix itself, may attend on
 *  different threads (a lock in the prefix serializes those attends). */
KVSDK_API kvsdk_status kvsdk_cache_create_on_prefix(kvsdk_cache **out, kvsdk_cache *prefix,
                                                    const kvsdk_policy *policy);

/** Copies the cache's geometry into `*out` (out->struct_size must be set, e.g. by
 *  kvsdk_geometry_init). A struct of an older kvsdk.h (smaller struct_size) receives the fields
 *  it has; struct_size is set to the bytes written.
 *  Errors: KVSDK_E_INVALID_ARG (NULL, struct_size below the first version's). */
KVSDK_API kvsdk_status kvsdk_cache_geometry(const kvsdk_cache *cache, kvsdk_geometry *out);

/** The largest token position: INT32_MAX - 1. Every position passed to kvsdk (keys to append,
 *  queries to attend, observe or prefetch, a planner's keys and queries) lies in
 *  0 .. KVSDK_MAX_POSITION, except that a query position may also be INT32_MAX: a query without
 *  a position, which sees every key (q_positions NULL means that for every query, and an
 *  observation window saves such queries so). Anything else is refused with
 *  KVSDK_E_INVALID_ARG, naming the offending index and value, before the call changes anything;
 *  a snapshot holding such a position is KVSDK_E_CORRUPT. A key's position + 1 always fits an
 *  int32. */
#define KVSDK_MAX_POSITION 2147483646

/** Appends the keys and values of `n_tokens` tokens to one layer.
 *  `k` and `v`: n_tokens x n_kv_heads x head_dim elements of the geometry's dtype (token-major,
 *  keys already rotated by RoPE), each buffer `kv_bytes` bytes long (checked).
 *  `positions`: n_tokens absolute positions, each in 0 .. KVSDK_MAX_POSITION, kept with every
 *  token through eviction and snapshots. They need not increase, within a call or from one call
 *  to the next, and may repeat (e.g. a token appended again after a rollback): a layer keeps its
 *  tokens in append order, which eviction preserves, and uses positions only for causal masking
 *  (a query sees the tokens at positions <= its own), for RoPE (spindlekv removes the rotation at
 *  the token's position and re-applies it), and as the token's identity where a policy pairs
 *  tokens: minicache's partner layers must hold the same positions; smallkv finds the proxy's
 *  token by position (the proxy holds the same positions), takes the first match_tokens tokens
 *  appended as its matching tokens and the tokens at the highest positions as the recent ones.
 *  Nothing else depends on their order.
 *  Errors: KVSDK_E_INVALID_ARG (NULL pointers, n_tokens == 0, kv_bytes mismatch, a position
 *          outside 0 .. KVSDK_MAX_POSITION; minicache: positions that differ from the partner
 *          layer's for the same tokens), KVSDK_E_OUT_OF_RANGE (layer), KVSDK_E_BUDGET (the
 *          result does not fit the budget and the policy cannot compress enough),
 *          KVSDK_E_STATE (smallkv must evict but has no proxy), KVSDK_E_IO (specache: its
 *          backing file cannot grow), KVSDK_E_NO_MEMORY.
 *  On any error the cache is unchanged: a smallkv cache that must evict first decides what it
 *  evicts (head matching included) and evicts only once the append fits. One exception:
 *  KVSDK_E_NO_MEMORY part-way through an append to a layer that specache, spindlekv (its
 *  codebook layers) or minicache (its merged layers) holds may leave the tokens appended to the
 *  KV heads already done; bytes and budget charge match what the cache then holds. */
KVSDK_API kvsdk_status kvsdk_cache_append(kvsdk_cache *cache, uint32_t layer, size_t n_tokens,
                                          const void *k, const void *v, const int32_t *positions,
                                          size_t kv_bytes);

/** Computes softmax attention of `n_queries` queries of one layer over the cached tokens.
 *  `q`: n_queries x n_q_heads x head_dim elements of the geometry's dtype, `q_bytes` long.
 *  `q_positions`: NULL (every query sees every cached token) or n_queries positions, each in
 *  0 .. KVSDK_MAX_POSITION or INT32_MAX (sees every token); a query then sees only cached tokens
 *  whose position is <= its own (causal prefill).
 *  `out`: n_queries x n_q_heads x head_dim elements of the geometry's dtype, `out_bytes` long.
 *  Query head h reads KV head h / (n_q_heads / n_kv_heads). Scores and the softmax accumulate in
 *  f32. A query that sees no token gets a zero output.
 *  Rows, bytes and budget charges never change. State that does change (the cache is therefore
 *  passed non-const and falls under the one-thread-per-cache rule):
 *   - smallkv: the importance state (the large model's matching statistics over the first
 *     match_tokens tokens, the head mapping once they are complete, each row's accumulated proxy
 *     attention). It decides later matching and evictions, hence later outputs, and is saved in
 *     snapshots.
 *   - a 'full' cache serving as a smallkv proxy: not itself, but its smallkv cache's link (the
 *     proxy queries of the step, which the smallkv cache's next attend reads, and the proxy's
 *     matching statistics). It decides later outputs of the smallkv cache and is not saved.
 *   - specache: the fetch hit-rate measurement (kvsdk_cache_fetch_stats). It never affects
 *     outputs and is not saved.
 *  Every other policy changes nothing (h2o accumulates its scores in kvsdk_cache_observe, not
 *  here).
 *  Errors: KVSDK_E_INVALID_ARG (NULL pointers, zero queries, size mismatch, a query position
 *          outside 0 .. KVSDK_MAX_POSITION and not INT32_MAX),
 *          KVSDK_E_OUT_OF_RANGE (layer), KVSDK_E_STATE (smallkv: marginal rows but no proxy, or
 *          the proxy has not attended this step), KVSDK_E_NO_MEMORY. On error `out` is
 *          untouched and nothing changed: a smallkv cache applies the importance updates of all
 *          KV heads together once every head succeeded, and a proxy's link takes the step's
 *          queries only when the proxy's attend succeeds. */
KVSDK_API kvsdk_status kvsdk_cache_attend(kvsdk_cache *cache, uint32_t layer, size_t n_queries,
                                          const void *q, const int32_t *q_positions,
                                          size_t q_bytes, void *out, size_t out_bytes);

/** Materialises the dense keys, values and positions that one KV head of one layer currently
 *  holds (dequantised/reconstructed for compressed tiers, as attention sees them), in stored
 *  order: append order, which eviction preserves for the surviving tokens (smallkv: position
 *  order, marginal rows with zero keys; specache: fetched rows in full precision).
 *  Size query: with `k`, `v` and `positions` all NULL, writes the token count to `*n_tokens`.
 *  Otherwise `capacity_tokens` is the capacity of the buffers (k and v: capacity x head_dim
 *  elements of the geometry's dtype; positions: capacity int32); any of the three may be NULL
 *  to skip it. Writes the token count to `*n_tokens`.
 *  Errors: KVSDK_E_INVALID_ARG (NULL cache or n_tokens, capacity too small),
 *          KVSDK_E_OUT_OF_RANGE (layer or kv_head). */
KVSDK_API kvsdk_status kvsdk_cache_read(const kvsdk_cache *cache, uint32_t layer,
                                        uint32_t kv_head, void *k, void *v, int32_t *positions,
                                        size_t capacity_tokens, size_t *n_tokens);

/* ------------------------------------------------------------------------------------------ */
/* Compression: observe, compress, plan                                                        */
/* ------------------------------------------------------------------------------------------ */
/*
 * Eviction presets (streaming_llm, h2o, snapkv, pyramidkv, xkv, and spindlekv in its layers from
 * boundary_layer on) keep a cache inside its budget by evicting rows per KV head; survivors keep
 * their original positions and order. The budget of a cache is the smaller of its own byte budget
 * (kvsdk_cache_set_budget, optional) and what its context has left. Every byte counts: f16 keys
 * and values (KIVI codes, scales, zero points and exact residual rows with a '+kiviN' overlay),
 * the int32 position of every row, H2O's f32 accumulated score per row and KV head, and the f32
 * observation-window queries that window methods keep (all but keys/values are reported as
 * KVSDK_TIER_METADATA). The allocation stage converts the bytes into tokens per layer with
 * exactly those per-row sizes (estimated with an overlay: see kvsdk_cache_token_capacity).
 *
 * Typical use:
 *   prefill: per layer, kvsdk_cache_observe(the last obs_window prompt queries), then
 *            kvsdk_cache_append(the prompt's keys/values); appends that exceed the budget compress
 *            automatically (incoming tokens are scored from the caller's buffers, and only rows
 *            that fit are ever stored). Or append everything that fits, observe, then
 *            kvsdk_cache_compress.
 *   decode:  per layer, append the new token, attend, and observe the step's queries (H2O
 *            accumulates them; window methods roll them into the window).
 *
 * Importance per method:
 *   streaming_llm  sink_tokens first rows + the newest rows; observe is accepted and ignored.
 *   h2o            per-row accumulated softmax probabilities of every observed query, averaged
 *                  over the query heads of a GQA group; keeps sinks, heavy hitters (heavy_ratio
 *                  of the rest) and the newest rows. Scores persist for kept rows.
 *   snapkv         the last obs_window observed queries (causal, f32 softmax) summed per key,
 *                  averaged over the group, pooled (pool_kernel, pool_kind) over the context
 *                  before the window; keeps the newest obs_window rows and the top scores.
 *                  Without an observed window a layer keeps its newest rows.
 *   pyramidkv      snapkv selection; tokens per layer decrease linearly with depth (SpindleKV
 *                  §3.3, schedule_alpha / schedule_beta).
 *   xkv            snapkv-style per-layer importance vectors; tokens per layer from the XKV greedy
 *                  allocation (Algorithm 1), top-k per KV head (Algorithm 2).
 * Layers hold the same number of rows in every KV head. full, kivi, minicache and specache never
 * evict; smallkv evicts on its own terms (see its section below).
 */

/** Feeds the queries of `n_queries` tokens of one layer to the policy's importance signal:
 *  the observation window of a prompt (e.g. its last obs_window queries) or a decode step's
 *  queries. `q`: n_queries x n_q_heads x head_dim elements of the geometry's dtype, `q_bytes`
 *  long; `q_positions`: NULL (queries see every key) or n_queries positions, each in
 *  0 .. KVSDK_MAX_POSITION or INT32_MAX (sees every key) (causal).
 *  h2o adds the queries' attention over the currently held rows to their scores; window methods
 *  (snapkv, pyramidkv, xkv, and spindlekv's evicting layers) keep the newest obs_window observed
 *  queries, at most as many as fit in an eighth of the budget spread over all layers (at least
 *  one); a window that grows may evict tokens to make room for its bytes. Every other policy
 *  (full, streaming_llm, kivi, minicache, smallkv, specache) and spindlekv's codebook layers
 *  check the arguments and ignore the queries.
 *  Errors: KVSDK_E_INVALID_ARG (NULL cache/q, zero queries, size mismatch, a query position
 *          outside 0 .. KVSDK_MAX_POSITION and not INT32_MAX, for every policy),
 *          KVSDK_E_OUT_OF_RANGE (layer), KVSDK_E_BUDGET (the window cannot fit),
 *          KVSDK_E_NO_MEMORY. On error the cache is unchanged. */
KVSDK_API kvsdk_status kvsdk_cache_observe(kvsdk_cache *cache, uint32_t layer, size_t n_queries,
                                           const void *q, const int32_t *q_positions,
                                           size_t q_bytes);

/** Enforces the budget (and an applied allocation or profile) now: computes the allocation over
 *  every layer and evicts what does not fit. Without a budget (context or per-cache) or a fixed
 *  allocation it does nothing. Errors: KVSDK_E_INVALID_ARG (NULL), KVSDK_E_BUDGET (the cache
 *  cannot shrink that far: even the policy's fixed metadata and compressed layers do not fit, or
 *  the policy never evicts; nothing changed), KVSDK_E_STATE (smallkv without its proxy),
 *  KVSDK_E_NO_MEMORY. */
KVSDK_API kvsdk_status kvsdk_cache_compress(kvsdk_cache *cache);

/** Sets a byte budget for this cache alone (0 removes it), for hosts that share one context
 *  between several caches; the context budget still applies. A budget below what the cache holds
 *  compresses it now. Errors: KVSDK_E_INVALID_ARG (NULL), KVSDK_E_BUDGET (the cache cannot shrink
 *  that far, e.g. a policy that never evicts; budget and cache unchanged), KVSDK_E_STATE (smallkv
 *  without its proxy; budget and cache unchanged). Every later append honours it: a 'full'
 *  cache (which never evicts) refuses an append past it with KVSDK_E_BUDGET. */
KVSDK_API kvsdk_status kvsdk_cache_set_budget(kvsdk_cache *cache, uint64_t budget_bytes);

/** How many layer-tokens (one row in every KV head of one layer) the cache's budget can hold in
 *  the exact tier besides its fixed bytes (observation windows, and the current bytes of layers a
 *  compressed representation holds), and the bytes of one such layer-token (f16 keys, values,
 *  positions and per-row scores of all KV heads). Meaningful for the exact-tier eviction; the
 *  rows of layers a compressed representation holds (kivi, spindlekv's codebook layers,
 *  minicache's merged layers, smallkv, specache) are described by neither output.
 *  `*out_tokens` is UINT64_MAX when no budget applies. With a '+kiviN' overlay both are
 *  estimates (a fully quantized row; the exact residual windows charged at the f16 cost): the
 *  real cost depends on the data, and the cache keeps fewer rows when the estimate was
 *  optimistic, never more bytes than the budget.
 *  Either output may be NULL. Errors: KVSDK_E_INVALID_ARG (NULL cache). */
KVSDK_API kvsdk_status kvsdk_cache_token_capacity(const kvsdk_cache *cache, uint64_t *out_tokens,
                                                  uint64_t *out_token_bytes);

/** Rows per KV head that each layer holds now (`tokens`: n_layers entries; KV head 0's count
 *  where heads differ, as in smallkv; record these for an allocation profile).
 *  Errors: KVSDK_E_INVALID_ARG (NULL, n_layers != geometry). */
KVSDK_API kvsdk_status kvsdk_cache_allocation(const kvsdk_cache *cache, uint64_t *tokens,
                                              uint32_t n_layers);

/** Fixes the rows per KV head of every layer (e.g. from kvsdk_planner_finish): each layer is
 *  held to its entry from then on, so prefill compresses every layer right after its append.
 *  Compresses now. `tokens` NULL (with n_layers 0) returns to the policy's own allocation.
 *  Errors: KVSDK_E_INVALID_ARG (NULL cache, n_layers != geometry), KVSDK_E_BUDGET (the entries
 *  do not fit the budget), KVSDK_E_UNSUPPORTED (a policy without exact-tier eviction: full, kivi,
 *  minicache, smallkv, specache). On error nothing changed. */
KVSDK_API kvsdk_status kvsdk_cache_set_allocation(kvsdk_cache *cache, const uint64_t *tokens,
                                                  uint32_t n_layers);

/** Modes of kvsdk_plan_allocation. Numbers are never renumbered. */
typedef enum kvsdk_alloc_mode {
  KVSDK_ALLOC_TOTAL_TOKENS = 0,     /**< value = N: place exactly min(N, sum of lengths). */
  KVSDK_ALLOC_TARGET_RETENTION = 1  /**< value = R_avg in (0, 1]: smallest total reaching it. */
} kvsdk_alloc_mode;

/** XKV greedy allocation (XKV paper, Algorithm 1) without a cache: given one importance vector
 *  per layer (`importance[i]`: `lengths[i]` non-negative finite floats, e.g. pooled window
 *  attention), writes to `out_tokens[i]` how many tokens layer i keeps so that the average
 *  importance retention R_avg = mean_i Sum(TopK(n_i, w_i)) / Sum(w_i) is maximal for the total
 *  (mode TOTAL_TOKENS, value = N), or the total is minimal for R_avg >= value (mode
 *  TARGET_RETENTION). A layer whose weights are all zero counts as fully retained. Pure function,
 *  thread-safe. Errors: KVSDK_E_INVALID_ARG (NULL arrays with n_layers > 0, negative/NaN weights,
 *  unknown mode, value outside its range). */
KVSDK_API kvsdk_status kvsdk_plan_allocation(uint32_t n_layers, const float *const *importance,
                                             const size_t *lengths, int32_t mode, double value,
                                             uint64_t *out_tokens);

/* ------------------------------------------------------------------------------------------ */
/* Stats: what the cache holds and what it costs                                               */
/* ------------------------------------------------------------------------------------------ */

/** Storage tiers. Bytes are reported per tier; every byte a cache holds is in exactly one. */
typedef enum kvsdk_tier {
  KVSDK_TIER_EXACT = 0,       /**< f16 keys and values. */
  KVSDK_TIER_QUANTIZED = 1,   /**< KIVI codes, scales and zero points. */
  KVSDK_TIER_CODEBOOK = 2,    /**< SpindleKV codebooks, indices and magnitudes. */
  KVSDK_TIER_MERGED = 3,      /**< MiniCache shared directions, magnitudes, retained tokens. */
  KVSDK_TIER_VALUE_ONLY = 4,  /**< SmallKV marginal tokens (values only). */
  KVSDK_TIER_METADATA = 5     /**< Positions, importance scores, allocation state. */
} kvsdk_tier;
/** Slots reserved in the per-tier arrays below (room for tiers added later). */
#define KVSDK_TIER_SLOTS 8

typedef struct kvsdk_cache_stats {
  uint32_t struct_size;                   /**< sizeof(kvsdk_cache_stats); set by kvsdk_cache_stats_init. */
  uint32_t n_layers;
  uint64_t tokens;                        /**< Cached tokens summed over layers and KV heads. */
  uint64_t appended_tokens;               /**< Tokens ever appended, summed over layers. */
  uint64_t bytes;                         /**< Budgeted bytes this cache holds (all tiers). */
  uint64_t bytes_by_tier[KVSDK_TIER_SLOTS];
  uint64_t full_bytes;                    /**< What an exact f16 cache of every appended token
                                               would hold (keys, values, positions). */
  uint64_t backing_bytes;                 /**< Off-budget full-precision backing store. */
  uint64_t budget_bytes;                  /**< The context budget (0 = unlimited). */
  uint64_t context_used_bytes;            /**< Bytes charged to the context by all its caches. */
  uint64_t device_arena_bytes;            /**< KVSDK_BACKEND_CUDA: the context's device arena, one
                                               allocation of exactly budget_bytes made with the
                                               context; 0 on the CPU. */
  uint64_t device_reserved_bytes;         /**< KVSDK_BACKEND_CUDA: bytes of the arena this cache's
                                               layers are laid out over: their capacities, always
                                               <= device_arena_bytes and >= the rows' share of
                                               `bytes`; 0 on the CPU. */
} kvsdk_cache_stats;

/** Initialises the app's `*stats` of `struct_size` bytes: zeroes the fields that fit, ready for
 *  kvsdk_cache_stats_get (the ABI rules, "Initialising a struct"). Writes min(struct_size,
 *  sizeof(kvsdk_cache_stats)) bytes, never more, and sets struct_size to that count.
 *  Errors: KVSDK_E_INVALID_ARG (`stats` NULL, `struct_size` below the first version's: the end
 *          of `context_used_bytes`); nothing is written. Thread-safe. */
KVSDK_API kvsdk_status kvsdk_cache_stats_init_sized(kvsdk_cache_stats *stats, size_t struct_size);
/** Legacy symbol, frozen (the ABI rules, "Legacy init symbols"): as
 *  kvsdk_cache_stats_init_sized with the first version's size, up to `context_used_bytes`. Not
 *  for new code or bindings. */
KVSDK_API kvsdk_status (kvsdk_cache_stats_init)(kvsdk_cache_stats *stats);
/** kvsdk_cache_stats_init_sized with the size of the app's struct. */
#define kvsdk_cache_stats_init(stats) \
  kvsdk_cache_stats_init_sized((stats), sizeof(kvsdk_cache_stats))

/** Fills `*out`. out->struct_size must be set (kvsdk_cache_stats_init); an older, smaller struct
 *  receives the fields it has, and struct_size is set to the bytes written.
 *  Errors: KVSDK_E_INVALID_ARG (NULL, struct_size below the first version's). */
KVSDK_API kvsdk_status kvsdk_cache_stats_get(const kvsdk_cache *cache, kvsdk_cache_stats *out);

typedef struct kvsdk_layer_stats {
  uint32_t struct_size;                   /**< sizeof(kvsdk_layer_stats); set by kvsdk_layer_stats_init. */
  uint32_t layer;
  uint64_t tokens;                        /**< Cached tokens summed over KV heads. */
  uint64_t tokens_min_head;               /**< Fewest tokens any KV head holds. */
  uint64_t tokens_max_head;               /**< Most tokens any KV head holds. */
  uint64_t appended_tokens;               /**< Tokens ever appended to this layer. */
  uint64_t bytes;                         /**< Budgeted bytes of this layer. */
  uint64_t bytes_by_tier[KVSDK_TIER_SLOTS];
} kvsdk_layer_stats;

/** Initialises the app's `*stats` of `struct_size` bytes: zeroes the fields that fit, ready for
 *  kvsdk_cache_layer_stats_get (the ABI rules, "Initialising a struct"). Writes
 *  min(struct_size, sizeof(kvsdk_layer_stats)) bytes, never more, and sets struct_size to that
 *  count.
 *  Errors: KVSDK_E_INVALID_ARG (`stats` NULL, `struct_size` below the first version's: the end
 *          of `bytes_by_tier`); nothing is written. Thread-safe. */
KVSDK_API kvsdk_status kvsdk_layer_stats_init_sized(kvsdk_layer_stats *stats, size_t struct_size);
/** Legacy symbol, frozen (the ABI rules, "Legacy init symbols"): as
 *  kvsdk_layer_stats_init_sized with the first version's size, up to `bytes_by_tier`. Not for
 *  new code or bindings. */
KVSDK_API kvsdk_status (kvsdk_layer_stats_init)(kvsdk_layer_stats *stats);
/** kvsdk_layer_stats_init_sized with the size of the app's struct. */
#define kvsdk_layer_stats_init(stats) \
  kvsdk_layer_stats_init_sized((stats), sizeof(kvsdk_layer_stats))

/** Fills `*out` for one layer. out->struct_size must be set (kvsdk_layer_stats_init); an older,
 *  smaller struct receives the fields it has, and struct_size is set to the bytes written.
 *  Errors: KVSDK_E_INVALID_ARG (NULL, struct_size below the first version's),
 *  KVSDK_E_OUT_OF_RANGE (layer). */
KVSDK_API kvsdk_status kvsdk_cache_layer_stats_get(const kvsdk_cache *cache, uint32_t layer,
                                                   kvsdk_layer_stats *out);

/* ------------------------------------------------------------------------------------------ */
/* Snapshots: suspend and resume                                                               */
/* ------------------------------------------------------------------------------------------ */

/* A snapshot holds what a cache needs to continue bit-identically: geometry, policy and its
 * parameters, the allocation state, per-layer state (importance scores, observation windows) and
 * every tier's rows with their positions. Three exceptions: a specache cache saved without its
 * backing store (include_backing = 0; the default includes it), a smallkv cache saved before its
 * head matching was complete (see the SmallKV section), and state that never affects results
 * (SpeCache's hit-rate measurement). Format (see formats/kvsdk.fbs and formats/container.h): a
 * header (magic "KVSDKSNP", format major.minor), frames (each one FlatBuffer compressed as a zstd
 * frame with its content checksum, plus a 64-bit hash of the compressed bytes), a footer index, a
 * trailer with a hash of the whole snapshot, then optional journal frames appended by
 * kvsdk_cache_save_delta. Little-endian on every platform, so a snapshot moves between machines.
 * Across backends: a cache on KVSDK_BACKEND_CUDA saves the same bytes as a CPU cache of the same
 * rows, policy state and budget, and either loads on the other (onto CUDA: the policies that run
 * there).
 * Across architectures: a snapshot saved on x86-64 and resumed on aarch64 (or the reverse) by the
 * same kvsdk version continues bit-identically, for every policy, journal deltas included, within
 * the exceptions above: kvsdk fuses no multiply-adds and computes exp, sin, cos, acos and pow
 * itself rather than with the platform's C library (whose results differ in the last bit between
 * platforms and even between CPUs of one architecture), so the same appends and attends give the
 * same stored rows and the same outputs on either side. No tolerance applies.
 *
 * Loading validates everything before it is used (FlatBuffers Verifier with limits, sizes against
 * the geometry, every checksum): corrupt or truncated input yields KVSDK_E_CORRUPT, never a crash.
 * A cache loaded from a snapshot is charged to its context's budget like any other. */

/** Newest snapshot format this library reads and writes. A reader accepts every older major and
 *  every minor version of its major versions (unknown additions are ignored) and rejects a newer
 *  major version with KVSDK_E_VERSION. Snapshots of caches with layers in compressed tiers (kivi,
 *  '+kiviN' overlays, spindlekv's codebook layers, minicache's merged layers, smallkv, specache)
 *  or with observation windows (snapkv, pyramidkv, xkv) are written as format 4.0: every
 *  compressed store is a typed FlatBuffers table of its own (KIVI codes, scales and zero points;
 *  SpindleKV codebook entries, indices and magnitudes; MiniCache merged directions, magnitudes
 *  and retained rows; SmallKV rows, marginal values and head map; SpeCache low-bit shadow,
 *  backing and fetched rows; positions and scores) with explicit field ids, checked by the
 *  FlatBuffers Verifier, and journal deltas refer to its fields by id (a format-3 reader would
 *  not find these records, so it refuses the file). Journal deltas describe compressed stores
 *  field by field and windows by the queries they kept (since format 3.0) and give H2O scores
 *  as differences against the scores before the delta (since 3.1). Other caches hold only exact
 *  rows and are written as format 1.3, so readers that know only major 1 keep loading them.
 *  Minor 1 of format 4 (and 1.3) adds kvsdk_policy.evict_slack; files without it load with
 *  slack 0, and older readers ignore it. Files of formats 1.x, 2.0, 3.0, 3.1 and 4.0 written by
 *  earlier versions load, and their journals continue in their own format.
 *  Format 5.0 is 4.1 plus a reference to the shared prefix a conversation continues
 *  (kvsdk_cache_create_on_prefix), by content hash or with the prefix's snapshot embedded: only
 *  snapshots of such conversations are written as 5.0 (a 4.x reader would load them without
 *  their prefix, so it must refuse them); every other cache is written as before (4.1 or 1.3).
 *  Format 6.0 is 5.0 plus byte-shuffled exact rows and XXH3 hashes: a frame of exact f16 rows may
 *  hold its keys and values as byte planes (low bytes, then high bytes), flagged in its frame
 *  header, which compresses them smaller and faster; and every container hash (headers, frame
 *  payloads, the trailer) is XXH3-64 instead of XXH64. Every cache that holds exact rows (every
 *  preset with a layer or head kept in f16) is written as 6.0, which a 5.x reader refuses with
 *  KVSDK_E_VERSION; caches whose every layer is compressed are written as before (4.1, or 5.0
 *  on a shared prefix). Files of formats 1.x to 5.0 keep loading and verify with XXH64.
 *  These macros name the newest format this library reads and writes. */
#define KVSDK_SNAPSHOT_FORMAT_MAJOR 6
#define KVSDK_SNAPSHOT_FORMAT_MINOR 0

typedef struct kvsdk_save_options {
  uint32_t struct_size;      /**< sizeof(kvsdk_save_options); set by kvsdk_save_options_init. */
  int32_t zstd_level;        /**< zstd compression level, 1..19 (also negative "fast" levels
                                  down to -7). Default 1. Level 0 means the default.
                                  Why 1: f16 rows are mostly literals to zstd (few long matches),
                                  so higher levels find almost nothing more. Measured (zstd
                                  1.5.4, docs/benchmarks.md): real shakespeare-base K/V as byte
                                  planes, size / raw and compress / decompress MB/s: level 1
                                  0.826, 1469 / 3711; level 3 0.824, 931 / 3362; the synthetic
                                  Llama-3-8B-like rows of snapshot_bench, whole saves: level 1
                                  and 3 both 0.743 of raw, level 1 a few percent faster (zstd's
                                  search is a small share there). Negative levels turn off
                                  zstd's literal (Huffman) compression, which is all of the
                                  gain on f16 rows: -1 stores them raw (1.008 of raw). */
  uint32_t include_backing;  /**< 1: also write the off-budget full-precision backing store of
                                  specache, so that the resumed cache fetches the same rows and
                                  continues bit-identically. 0: leave it out (smaller file); the
                                  loaded cache rebuilds the backing rows of the saved tokens from
                                  its low-bit copy. Its attention is identical to the saved
                                  cache's only until its next kvsdk_cache_prefetch: that fetches
                                  those rows at low-bit precision, so from then on results differ
                                  from an uninterrupted run (rows appended after the load, and
                                  layers a later journal delta rewrote, have their f16 backing).
                                  Other policies ignore it. kvsdk_cache_save_delta ignores it:
                                  a delta always writes the backing store of the specache layers
                                  it rewrites. Default 1, so that a default save resumes
                                  exactly. */
  uint64_t max_frame_bytes;  /**< Largest uncompressed rows payload per frame: per-layer data is
                                  split into frames of at most this many bytes of rows (at least
                                  one row per frame), which keeps every FlatBuffer far below its
                                  2 GiB limit. 1..256 MiB; 0 means the default, 8 MiB. */
  uint32_t max_journal_percent; /**< kvsdk_cache_save_delta: once the journal behind the file's
                                  base snapshot exceeds this share of the base (in percent), the
                                  delta is followed by a full atomic save of the cache to the file
                                  (as kvsdk_cache_save with these options), which becomes the base
                                  of later deltas, so that a conversation saved turn by turn keeps
                                  its file near one snapshot's size (e.g. 50: the file stays
                                  within 1.5 snapshots). 0..100000; 0, the default, never folds
                                  the journal. */
  uint32_t embed_prefix;     /**< A conversation on a shared prefix (kvsdk_cache_create_on_prefix):
                                  1 embeds the prefix's whole snapshot, so the file loads alone
                                  (kvsdk_cache_load restores a private frozen copy of the prefix,
                                  charged to the context); 0, the default, references it by
                                  content hash: the file holds only the conversation's own rows
                                  and loads with kvsdk_cache_load_on_prefix. Other caches ignore
                                  it. 0 or 1. Added after the first version: a smaller struct
                                  gets 0. */
  /* Save-time compression (added after the first version; a smaller struct gets NULL and 0, a
   * save of the cache as it is). See "Targeted saves" below kvsdk_cache_save. */
  const kvsdk_policy *target_policy; /**< NULL (default): save the cache as it is. Otherwise the
                                  file holds the cache converted to this policy and compressed to
                                  target_budget_bytes; the live cache is not changed. Read only
                                  during the call. kvsdk_cache_save_delta refuses it. */
  uint64_t target_budget_bytes; /**< With target_policy: the converted cache's per-cache budget
                                  (as kvsdk_cache_set_budget); 0 (default): the cache's current
                                  per-cache budget (none if it has none). Nonzero without
                                  target_policy: KVSDK_E_INVALID_ARG. */
} kvsdk_save_options;

/** Initialises the app's `*options` of `struct_size` bytes: defaults for the fields that fit
 *  (zstd level 1, SpeCache's backing store included, 8 MiB frames, no journal compaction, the
 *  prefix referenced, no target policy: the cache saved as it is) (the
 *  ABI rules, "Initialising a struct"). Writes min(struct_size, sizeof(kvsdk_save_options))
 *  bytes, never more, and sets struct_size to that count.
 *  Errors: KVSDK_E_INVALID_ARG (`options` NULL, `struct_size` below the first version's: the
 *          end of `max_journal_percent`); nothing is written. Thread-safe. */
KVSDK_API kvsdk_status kvsdk_save_options_init_sized(kvsdk_save_options *options,
                                                     size_t struct_size);
/** Legacy symbol, frozen (the ABI rules, "Legacy init symbols"): as
 *  kvsdk_save_options_init_sized with the first version's size, up to `max_journal_percent`.
 *  Not for new code or bindings. */
KVSDK_API kvsdk_status (kvsdk_save_options_init)(kvsdk_save_options *options);
/** kvsdk_save_options_init_sized with the size of the app's struct. */
#define kvsdk_save_options_init(options) \
  kvsdk_save_options_init_sized((options), sizeof(kvsdk_save_options))

/** Saves the whole cache to the file `path` atomically: the snapshot is written to a temporary
 *  file in the same directory, flushed to disk (fsync), renamed over `path`, and the directory is
 *  synced. A crash or power loss at any point leaves either the previous file at `path` or the
 *  new one, never a mix. `options` may be NULL for defaults. Every policy and composition that
 *  kvsdk_cache_create accepts can be saved. The cache is not modified, but it remembers this
 *  save as the base of later kvsdk_cache_save_delta calls on `path`. Bookkeeping for that costs
 *  host memory outside the budget: 8 bytes per exact-tier row (token and KV head) and per
 *  observation-window query, and for compressed tiers 8 bytes per 256 bytes of their stores
 *  plus a few dozen bytes per stored buffer. The file is created with mode 0600 (a conversation is
 *  private data).
 *  Temporary files: on Linux, where the file system supports O_TMPFILE, the temporary file is
 *  unnamed while it is written, so a process killed meanwhile leaves nothing behind; it gets the
 *  name `path`.tmp-XXXXXX (six letters or digits) only for the instant between linking it into
 *  the directory (via /proc/self/fd) and renaming it over `path`. Elsewhere it has that name for
 *  the whole write. The writer holds an exclusive flock(2) on it while it has that name. A process
 *  killed inside that window (or power loss) can leave such a file; every save first removes the
 *  `path`.tmp-XXXXXX regular files of the calling user in that directory that no process holds a
 *  lock on, so such an orphan lasts at most until the next save to the same `path`. The file of
 *  a save in progress in another process is locked and kept. (kvsdk versions before this one
 *  wrote without that lock; do not run them against the same `path` concurrently.)
 *  Writing: where the file system takes O_DIRECT (Linux), the file's bytes bypass the page cache
 *  (it is synced at once, so caching them buys nothing): they are staged in 24 MiB of aligned
 *  host memory, outside the budget, and on a context of 2 or more threads written by a thread
 *  the call starts and joins while the pool compresses the next frames (with n_threads = 1, on
 *  the calling thread); elsewhere they are plain writes. The file is the same either way.
 *  Errors: KVSDK_E_INVALID_ARG (NULL cache/path, bad options), KVSDK_E_IO (cannot create,
 *          write, sync or rename; the previous file at `path` is intact and no temporary file is
 *          left behind), KVSDK_E_NO_MEMORY.
 *  Threading: like every cache call, one thread at a time per cache. */
KVSDK_API kvsdk_status kvsdk_cache_save(kvsdk_cache *cache, const char *path,
                                        const kvsdk_save_options *options);

/* Targeted saves (save-time compression): kvsdk_save_options.target_policy set.
 *  What the file holds: the snapshot of the cache this one becomes when converted to
 *  target_policy and compressed to target_budget_bytes; it loads (kvsdk_cache_load) as a cache
 *  of that policy, which continues (append, attend, save) like any. `kvsdk recompress IN OUT
 *  --policy P --budget B` is the same operation on a file (it loads IN and saves it with these
 *  options), so both write byte-identical files from equal caches and equal options.
 *  The conversion:
 *    - the same method and quant_bits as the cache's: the cache as it is (an exact copy with its
 *      policy state: scores, windows, allocation; its own parameters are kept), then compressed
 *      to the budget by its own policy (kvsdk_cache_set_budget);
 *    - another policy: every layer's rows, as kvsdk_cache_read returns them, appended in stored
 *      order to an empty cache of target_policy, which is then given the budget and compressed
 *      over every layer at once (kvsdk_cache_set_budget). The target sees rows, not the source's
 *      policy state: importance scores and observation windows start empty, so an eviction
 *      target ranks by what it has (positions, recency).
 *  Per source (the cache saved) with another target policy:
 *    - exact rows (full; streaming_llm, h2o, snapkv, pyramidkv, xkv and spindlekv's evicting
 *      layers): exact, bit for bit, when every KV head of a layer holds the same positions (never
 *      evicted, or evicted per layer); a layer evicted per KV head (e.g. h2o or snapkv after they
 *      evicted) is refused, KVSDK_E_UNSUPPORTED (an append takes every KV head of a token);
 *    - kivi and '+kiviN' overlays: their dequantized rows (what attention sees; a KIVI target
 *      quantizes them again), same head rule;
 *    - spindlekv's codebook layers and minicache's merged layers: their reconstructed rows (what
 *      attention sees), not the rows first appended;
 *    - smallkv (its marginal rows keep no keys) and specache (its exact rows are in its backing
 *      store): refused, KVSDK_E_UNSUPPORTED;
 *    - a conversation on a shared prefix: refused, KVSDK_E_UNSUPPORTED (its prefix's rows are
 *      not its own).
 *  Per target: every policy kvsdk_cache_create accepts, except smallkv (refused,
 *  KVSDK_E_UNSUPPORTED: it needs its proxy cache, which a save does not have). A KIVI target
 *  (kivi, a '+kiviN' overlay) with quant_residual = KVSDK_QUANT_RESIDUAL_AUTO gets the window
 *  measured for its head_dim and width (16 rows at head_dim 64 and 2 bits instead of 128): an
 *  evicting cache saved this way is the smallest faithful file kvsdk-eval found
 *  (docs/eval/target.md: h2o at 12.5% saved as h2o+kivi4, 0.078 of the full snapshot on
 *  shakespeare-base at top-1 0.973).
 *  Cost: the converted cache is built in full before it is written, as a temporary cache on the
 *  cache's own context, and destroyed when the save returns. Contexts account bytes, not caches:
 *  every byte a cache holds is charged to its context's budget when it is reserved, and a
 *  per-cache budget caps only that cache, and every cache also compresses to fit what its
 *  context has free. So the temporary cache's bytes are charged to the context's budget like any
 *  other cache's while the save runs, next to the live cache's (with another policy it first
 *  holds every converted row, before target_budget_bytes compresses it). Where the context's
 *  free bytes run short of that, an eviction target evicts to fit them as it goes (its file then
 *  holds fewer rows than one converted with room, e.g. by `kvsdk recompress`, which loads into a
 *  context without a budget), and a target that cannot evict fails with KVSDK_E_BUDGET.
 *  The live cache is not changed, and a targeted save does not become the base of its journal:
 *  kvsdk_cache_save_delta continues only a file of the cache itself (it refuses, KVSDK_E_STATE,
 *  a file written by a targeted save: a delta of the live policy cannot continue a file of
 *  another policy), and the file of its last plain save or load stays its journal's base.
 *  Errors (nothing is written, the live cache is unchanged): KVSDK_E_INVALID_ARG (a bad
 *  target_policy: bad struct_size or values; target_budget_bytes without target_policy; a
 *  target policy whose parameters do not fit the cache's geometry, e.g. boundary_layer),
 *  KVSDK_E_UNSUPPORTED (a pair above that cannot be converted, with the reason in
 *  kvsdk_last_error), KVSDK_E_BUDGET (target_budget_bytes holds too little for the target
 *  policy's fixed bytes, or would leave a layer that held rows with none; or the context's
 *  budget cannot hold the temporary cache), and the errors of the save itself. */

/** Saves the whole cache into a caller-owned buffer. With `buf` NULL it is a size query: writes
 *  the exact number of bytes a save needs to `*out_size` (this encodes and compresses the whole
 *  cache, so it costs as much as a save; with a target policy it converts the cache again).
 *  Otherwise writes the snapshot to `buf` (`capacity` bytes) and its size to `*out_size`. The
 *  cache is not modified, and a buffer save does not change which file kvsdk_cache_save_delta
 *  continues (the last file saved or loaded). A target policy ("Targeted saves") applies as to
 *  kvsdk_cache_save: the buffer holds the bytes the file save writes with the same options.
 *  Errors: KVSDK_E_INVALID_ARG (NULL cache/out_size, bad options, `capacity` smaller than the
 *          snapshot), KVSDK_E_NO_MEMORY. On failure `*out_size` is untouched and the contents of
 *          `buf` are unspecified. */
KVSDK_API kvsdk_status kvsdk_cache_save_to_buffer(kvsdk_cache *cache,
                                                  const kvsdk_save_options *options, void *buf,
                                                  size_t capacity, size_t *out_size);

/** Appends a journal frame (or a few, split by max_frame_bytes) to the snapshot file `path` that
 *  records what changed since the last save, delta or load of that file by this cache: tokens
 *  appended since, and rows removed since (a delta stays exact whatever changed). Much cheaper
 *  than a full save for a long conversation that grew by a few tokens. The frames are written
 *  and fsync-ed, under an exclusive flock(2) on `path`.
 *  Torn tails: a delta counts only once all its frames are in the file. A crash while appending
 *  leaves a torn tail: a torn frame, and/or the complete frames of a delta whose later frames are
 *  missing (an incomplete delta). kvsdk_cache_load ignores it: it loads the state of the last
 *  complete delta and counts the tail's frames, complete ones included, in
 *  kvsdk_load_info.journal_frames_dropped. A cache continues the journal from the end of the last
 *  complete delta it wrote or loaded: its next delta first cuts everything after that end that is
 *  a torn tail (synced before the new frames are written), then appends. So the next delta from
 *  a cache loaded after the crash (or from any cache whose journal ends where the torn tail
 *  begins) replaces the torn tail.
 *  Compressed tiers that changed go into the delta field by field (formats 3 and 4): what was appended
 *  to a store, and the parts of a store that moved (a residual window sliding by whole rows), so
 *  a delta stays small after a few tokens for every preset; a field rewritten in place (KIVI
 *  blocks that lost rows to eviction, H2O's scores) goes whole. A file of an older format gets
 *  whole layers. When the journal outgrows a nonzero `max_journal_percent` of the base snapshot,
 *  the delta is followed by a full save to `path` (see kvsdk_save_options; same atomicity as
 *  kvsdk_cache_save). `include_backing` applies only to that full save; `options` may be NULL for
 *  defaults. A delta records the cache's own changes: options with a target_policy are refused
 *  (KVSDK_E_UNSUPPORTED), and so is a file written by a targeted save (KVSDK_E_STATE, below).
 *  Errors: KVSDK_E_INVALID_ARG (NULL cache/path, bad options), KVSDK_E_UNSUPPORTED (a
 *          target_policy in `options`; nothing is written),
 *          KVSDK_E_STATE (this cache has no base to continue from: it was never saved or loaded;
 *          or `path` is not the file of its last full save/load, or ends before this cache's
 *          last delta; or that file's journal holds, after the end of this cache's journal,
 *          frames no crash leaves behind: a complete delta (another cache continued the file),
 *          or frames out of sequence; or another save_delta holds the lock on `path` right now;
 *          nothing is written: kvsdk_cache_save in full starts over),
 *          KVSDK_E_IO (cannot open, read, write or sync; the file may then end in a torn tail,
 *          which loads as above), KVSDK_E_NO_MEMORY. */
KVSDK_API kvsdk_status kvsdk_cache_save_delta(kvsdk_cache *cache, const char *path,
                                              const kvsdk_save_options *options);

/** What a load found. */
typedef struct kvsdk_load_info {
  uint32_t struct_size;             /**< sizeof(kvsdk_load_info); set by kvsdk_load_info_init. */
  uint32_t format_major;            /**< Format version the snapshot was written with. */
  uint32_t format_minor;
  uint32_t journal_frames_applied;  /**< Journal frames (from kvsdk_cache_save_delta) applied. */
  uint32_t journal_frames_dropped;  /**< Frames of an incomplete (torn) last delta ignored. */
} kvsdk_load_info;

/** Initialises the app's `*info` of `struct_size` bytes: zeroes the fields that fit, ready for
 *  kvsdk_cache_load (the ABI rules, "Initialising a struct"). Writes min(struct_size,
 *  sizeof(kvsdk_load_info)) bytes, never more, and sets struct_size to that count.
 *  Errors: KVSDK_E_INVALID_ARG (`info` NULL, `struct_size` below the first version's: the end
 *          of `journal_frames_dropped`); nothing is written. Thread-safe. */
KVSDK_API kvsdk_status kvsdk_load_info_init_sized(kvsdk_load_info *info, size_t struct_size);
/** Legacy symbol, frozen (the ABI rules, "Legacy init symbols"): as kvsdk_load_info_init_sized
 *  with the first version's size, up to `journal_frames_dropped`. Not for new code or bindings. */
KVSDK_API kvsdk_status (kvsdk_load_info_init)(kvsdk_load_info *info);
/** kvsdk_load_info_init_sized with the size of the app's struct. */
#define kvsdk_load_info_init(info) \
  kvsdk_load_info_init_sized((info), sizeof(kvsdk_load_info))

/** Loads a snapshot file into a new cache on `ctx`, applying every complete
 *  journal delta. `expected`: NULL accepts the file's geometry; otherwise the file's geometry
 *  must equal it (after defaults: attn_scale 0 means 1/sqrt(head_dim)). `info` (NULL ok; its
 *  struct_size must be set, e.g. by kvsdk_load_info_init) receives what the load found (the
 *  fields its struct_size has room for; struct_size is set to the bytes written). On success `*out` owns a new cache
 *  (release it with kvsdk_cache_destroy) whose bytes are charged to `ctx`'s budget, with the
 *  snapshot's policy; later kvsdk_cache_save_delta calls on `path` continue its journal.
 *  A conversation on a shared prefix loads here only when its snapshot embeds the prefix
 *  (kvsdk_save_options.embed_prefix): the prefix becomes a private frozen cache on `ctx`, charged
 *  too; one that references its prefix loads with kvsdk_cache_load_on_prefix.
 *  The file is mapped read-only while loading; it must not be truncated meanwhile.
 *  Errors: KVSDK_E_INVALID_ARG (NULL out/ctx/path, bad struct_size), KVSDK_E_IO (cannot open or
 *          read), KVSDK_E_CORRUPT (bad magic, truncated, checksum mismatch, invalid contents),
 *          KVSDK_E_VERSION (newer major format), KVSDK_E_GEOMETRY (differs from `expected`),
 *          KVSDK_E_UNSUPPORTED (the snapshot's policy or composition is not supported by this
 *          build, or not on `ctx`'s backend: see kvsdk_context_create for CUDA),
 *          KVSDK_E_BUDGET (the cache does not fit the budget), KVSDK_E_STATE (the snapshot
 *          references a shared prefix it does not embed), KVSDK_E_NO_MEMORY.
 *  On failure `*out` and `*info` are untouched and nothing stays charged to `ctx`.
 *  Threading: safe to call concurrently (it creates a new cache). */
KVSDK_API kvsdk_status kvsdk_cache_load(kvsdk_cache **out, kvsdk_context *ctx, const char *path,
                                        const kvsdk_geometry *expected, kvsdk_load_info *info);

/** As kvsdk_cache_load, from `size` bytes at `buf` (a whole snapshot file's contents, journal
 *  included). `buf` is only read during the call. Errors as kvsdk_cache_load (without
 *  KVSDK_E_IO; NULL buf is KVSDK_E_INVALID_ARG). */
KVSDK_API kvsdk_status kvsdk_cache_load_from_buffer(kvsdk_cache **out, kvsdk_context *ctx,
                                                    const void *buf, size_t size,
                                                    const kvsdk_geometry *expected,
                                                    kvsdk_load_info *info);

/** Loads a snapshot of a conversation on a shared prefix (kvsdk_cache_create_on_prefix) that
 *  references its prefix by content hash (kvsdk_save_options.embed_prefix 0): `prefix` must be a
 *  frozen cache holding exactly the state the saved conversation continued (the same content
 *  hash; e.g. the same system prompt appended under the same policy, or that prefix loaded from
 *  its own snapshot). The new cache continues `prefix`, in its context and geometry, as
 *  kvsdk_cache_create_on_prefix's would; later kvsdk_cache_save_delta calls on `path` continue
 *  its journal. kvsdk_cache_load refuses such a snapshot (KVSDK_E_STATE) unless it embeds its
 *  prefix. `info` as kvsdk_cache_load.
 *  Errors: as kvsdk_cache_load, and KVSDK_E_STATE (the snapshot does not continue a shared
 *          prefix, or continues another one than `prefix`, or `prefix` is not frozen). On failure
 *          `*out` and `*info` are untouched and nothing stays charged.
 *  Threading: reads `prefix`; safe to call concurrently. */
KVSDK_API kvsdk_status kvsdk_cache_load_on_prefix(kvsdk_cache **out, kvsdk_cache *prefix,
                                                  const char *path, kvsdk_load_info *info);

/** Copies the cache's policy into `*out` (out->struct_size must be set, e.g. by
 *  kvsdk_policy_init), e.g. to see which policy a loaded snapshot carries. A struct of an
 *  older kvsdk.h (smaller struct_size) receives the fields it has; struct_size is set to the
 *  bytes written. Errors: KVSDK_E_INVALID_ARG (NULL, struct_size below the first version's). */
KVSDK_API kvsdk_status kvsdk_cache_policy(const kvsdk_cache *cache, kvsdk_policy *out);

/* ========================================================================================== */
/* Experimental API                                                                            */
/* ========================================================================================== */
/*
 * Everything above is the stable API: it keeps its ABI and meaning across every 1.x version
 * (structs only grow at their end; see the ABI rules at the top). The declarations below are
 * experimental: XKV allocation profiles and the mini-prefill planner, SpeCache's speculative
 * prefetch and backing store, and SmallKV's proxy link. They work, are tested like the rest, and
 * the policies that use them (specache, smallkv) are stable, but their calls may change in a
 * minor version as the methods evolve. They are declared only when the application defines
 * KVSDK_EXPERIMENTAL before including this header (the library exports them either way), in the
 * manner of zstd's ZSTD_STATIC_LINKING_ONLY.
 */
#if defined(KVSDK_EXPERIMENTAL)

/* ------------------------------------------------------------------------------------------ */
/* Allocation profiles and the mini-prefill planner (XKV)                                      */
/* ------------------------------------------------------------------------------------------ */

/* Allocation profiles (XKV §IV-C sampling): the averaged allocation of sample requests of one
 * task type, reused so that prefill compresses layer by layer without planning. A profile stores
 * per-layer shares of the token budget; applied to a cache, the cache's token capacity is split
 * by these shares. Saved as FlatBuffers (formats/allocation_profile.fbs, identifier "KVAP"). A
 * profile object is used by one thread at a time. */
typedef struct kvsdk_profile kvsdk_profile;

/** Creates an empty profile for `n_layers` layers. Errors: KVSDK_E_INVALID_ARG (NULL out,
 *  n_layers 0 or > 4096), KVSDK_E_NO_MEMORY. */
KVSDK_API kvsdk_status kvsdk_profile_create(kvsdk_profile **out, uint32_t n_layers);
/** Destroys a profile. NULL is a no-op. */
KVSDK_API void kvsdk_profile_destroy(kvsdk_profile *profile);
/** Records the allocation list of one sample request (tokens per layer, e.g. from
 *  kvsdk_cache_allocation); lists are normalised to shares and averaged. Errors:
 *  KVSDK_E_INVALID_ARG (NULL, n_layers mismatch, an all-zero list). */
KVSDK_API kvsdk_status kvsdk_profile_record(kvsdk_profile *profile, const uint64_t *tokens,
                                            uint32_t n_layers);
/** Averaged shares (n_layers entries summing to 1) and the number of recorded samples. Either
 *  output may be NULL. Errors: KVSDK_E_INVALID_ARG (NULL profile, n_layers mismatch),
 *  KVSDK_E_STATE (nothing recorded). */
KVSDK_API kvsdk_status kvsdk_profile_shares(const kvsdk_profile *profile, double *shares,
                                            uint32_t n_layers, uint32_t *out_samples);
/** Saves atomically to `path` (temporary file, fsync, rename). Errors: KVSDK_E_INVALID_ARG,
 *  KVSDK_E_STATE (nothing recorded), KVSDK_E_IO. */
KVSDK_API kvsdk_status kvsdk_profile_save(const kvsdk_profile *profile, const char *path);
/** Loads a profile saved by kvsdk_profile_save; `*out` owns it. Errors: KVSDK_E_INVALID_ARG,
 *  KVSDK_E_IO (unreadable), KVSDK_E_CORRUPT (fails verification), KVSDK_E_VERSION (newer
 *  format). */
KVSDK_API kvsdk_status kvsdk_profile_load(kvsdk_profile **out, const char *path);
/** Applies a profile to a cache (NULL profile: back to the policy's own allocation); with a
 *  budget, compresses now. The cache copies the shares. Errors: KVSDK_E_INVALID_ARG (NULL
 *  cache, layer count differs from the geometry), KVSDK_E_STATE (empty profile),
 *  KVSDK_E_UNSUPPORTED (a policy without exact-tier eviction, as kvsdk_cache_set_allocation),
 *  KVSDK_E_BUDGET. On error nothing changed. */
KVSDK_API kvsdk_status kvsdk_cache_apply_profile(kvsdk_cache *cache,
                                                 const kvsdk_profile *profile);

/* Mini-prefill planner (XKV §IV-A): during a first, cache-free pass over the prompt the host
 * feeds every layer's keys and observation-window queries; the planner scores them (window
 * attention, pooled, averaged over KV heads), keeps only one importance vector per layer
 * (lengths floats) and discards the tensors. kvsdk_planner_finish returns the allocation for the
 * real prefill (pass it to kvsdk_cache_set_allocation). Used by one thread at a time. */
typedef struct kvsdk_planner kvsdk_planner;

/** Creates a planner for a geometry and a window policy (snapkv, pyramidkv or xkv parameters:
 *  obs_window, pool_kernel, pool_kind). Errors: KVSDK_E_INVALID_ARG (NULL, invalid geometry or
 *  policy), KVSDK_E_NO_MEMORY. */
KVSDK_API kvsdk_status kvsdk_planner_create(kvsdk_planner **out, const kvsdk_geometry *geometry,
                                            const kvsdk_policy *policy);
/** Destroys a planner. NULL is a no-op. */
KVSDK_API void kvsdk_planner_destroy(kvsdk_planner *planner);
/** Scores one layer: `k` (n_tokens x n_kv_heads x head_dim, `k_bytes` long) at `positions`, and
 *  `q` (n_queries x n_q_heads x head_dim, `q_bytes` long) at `q_positions` (NULL: see all).
 *  Every position in 0 .. KVSDK_MAX_POSITION (a query's may also be INT32_MAX: sees all).
 *  Feeding a layer again replaces its vector. Errors: KVSDK_E_INVALID_ARG (NULL, zero counts,
 *  size mismatch, a position outside 0 .. KVSDK_MAX_POSITION), KVSDK_E_OUT_OF_RANGE (layer),
 *  KVSDK_E_NO_MEMORY. */
KVSDK_API kvsdk_status kvsdk_planner_feed_layer(kvsdk_planner *planner, uint32_t layer,
                                                size_t n_tokens, const void *k,
                                                const int32_t *positions, size_t k_bytes,
                                                size_t n_queries, const void *q,
                                                const int32_t *q_positions, size_t q_bytes);
/** Rows per KV head for every layer (`out_tokens`, n_layers entries): each layer keeps its
 *  newest min(obs_window, length) rows plus the XKV allocation of the context (mode and value as
 *  in kvsdk_plan_allocation; for TOTAL_TOKENS, value is the total of all entries, e.g. the
 *  cache's kvsdk_cache_token_capacity). Errors: KVSDK_E_INVALID_ARG, KVSDK_E_STATE (a layer was
 *  not fed). */
KVSDK_API kvsdk_status kvsdk_planner_finish(kvsdk_planner *planner, int32_t mode, double value,
                                            uint64_t *out_tokens, uint32_t n_layers);

/* ------------------------------------------------------------------------------------------ */
/* SpeCache: speculative prefetch and the off-budget backing store                             */
/* ------------------------------------------------------------------------------------------ */
/*
 * Policy 'specache' (KVSDK_METHOD_SPECACHE) keeps a 2-bit (or 1-bit: "specache+kivi1") KIVI copy
 * of every layer in the budget (with KIVI's exact f16 window of at least the quant_residual
 * newest rows), and the full-precision f16 rows in a backing store outside it
 * (kvsdk_cache_stats.backing_bytes). A decode step decodes the output token and a speculative
 * next token together: kvsdk_cache_attend for the output token uses the rows the previous step
 * fetched, and the speculative token's queries (its K/V are not appended) go to
 * kvsdk_cache_prefetch, which fetches each KV head's fetch_tokens most attended rows (attention
 * averaged over the GQA group, over the low-bit keys) into the budget for the next attend. Never
 * evicts: an append that does not fit fails with KVSDK_E_BUDGET. For snapshots see
 * kvsdk_save_options.include_backing.
 */

/** Keeps the backing store of a 'specache' cache in the file `path` instead of host memory: the
 *  file is created or truncated (mode 0600), grown with ftruncate and mapped with mmap as tokens
 *  arrive, and kept (not deleted) when the cache is destroyed. Must be called before the first
 *  append. Results are identical to a host-memory backing store.
 *  Errors: KVSDK_E_INVALID_ARG (NULL cache/path), KVSDK_E_UNSUPPORTED (the policy is not
 *          'specache', or the platform lacks mmap: POSIX only), KVSDK_E_STATE (tokens were
 *          already appended), KVSDK_E_IO (cannot create the file). On error the cache is
 *          unchanged. Later appends fail with KVSDK_E_IO (cache unchanged) when the file cannot
 *          grow.
 *  Threading: like every cache call, one thread at a time per cache. */
KVSDK_API kvsdk_status kvsdk_cache_set_backing_file(kvsdk_cache *cache, const char *path);

/** Speculative prefetch for one layer: `q` holds the speculative token's queries (one query:
 *  n_queries must be 1; n_q_heads x head_dim elements of the geometry's dtype, `q_bytes` long),
 *  `q_positions` NULL or its position (0 .. KVSDK_MAX_POSITION or INT32_MAX; causal). For each
 *  KV head the fetch_tokens rows with the most group-averaged attention over the low-bit keys are
 *  copied from the backing store into the budget, replacing the previous fetch of that layer;
 *  every kvsdk_cache_attend of the layer uses them in full precision instead of their low-bit
 *  rows until the next prefetch replaces them (kvsdk_cache_read shows them too). The fetched
 *  rows' bytes are reserved from the budget before fetching.
 *  Errors: KVSDK_E_INVALID_ARG (NULL cache/q, n_queries != 1, q_bytes mismatch, a position
 *          outside 0 .. KVSDK_MAX_POSITION and not INT32_MAX),
 *          KVSDK_E_OUT_OF_RANGE (layer), KVSDK_E_UNSUPPORTED (policy other than 'specache'),
 *          KVSDK_E_BUDGET (the fetched rows would not fit), KVSDK_E_NO_MEMORY, KVSDK_E_BACKEND
 *          (a CUDA context's device failed).
 *  On error the cache is unchanged, except that KVSDK_E_NO_MEMORY or KVSDK_E_BACKEND part-way
 *  through may leave the KV heads that finished with their new fetch, and KVSDK_E_BACKEND the
 *  failing head with none (attention then uses its low-bit rows alone); bytes and budget charge
 *  match either way.
 *  Threading: like every cache call, one thread at a time per cache; on long caches the KV
 *  heads are selected and fetched on the context's threads (kvsdk_context_options.n_threads),
 *  with the same rows at any n_threads. */
KVSDK_API kvsdk_status kvsdk_cache_prefetch(kvsdk_cache *cache, uint32_t layer, size_t n_queries,
                                            const void *q, const int32_t *q_positions,
                                            size_t q_bytes);

/** SpeCache's fetch hit rate: the share of the real query's attention (over the low-bit keys)
 *  that fell on the prefetched rows, measured on the first query of the first kvsdk_cache_attend
 *  of each layer and KV head after a prefetch (a decode step that attends the output and the
 *  speculative token in one call lists the output token first), and averaged over every such
 *  measurement since the cache was created or loaded (not saved in snapshots; it never affects
 *  results). `*hit_rate` is in
 *  [0, 1], or -1 before the first measurement; `*samples` (NULL ok) receives the number of
 *  measurements.
 *  Errors: KVSDK_E_INVALID_ARG (NULL cache/hit_rate), KVSDK_E_UNSUPPORTED (policy other than
 *          'specache'). On error the outputs are untouched.
 *  Threading: like every cache call, one thread at a time per cache. */
KVSDK_API kvsdk_status kvsdk_cache_fetch_stats(const kvsdk_cache *cache, double *hit_rate,
                                               uint64_t *samples);

/* ------------------------------------------------------------------------------------------ */
/* SmallKV: the proxy cache of a smaller model                                                 */
/* ------------------------------------------------------------------------------------------ */
/*
 * Policy 'smallkv' (SmallKV, docs/papers.md) compresses a large model's cache with the help of a
 * small model of the same family (same tokenizer) that runs on the same tokens, in the same
 * order, at the same positions, with its own cache of policy 'full': the proxy.
 * The host runs the proxy's step (append + attend of every layer) just before the large model's
 * step; the large cache reads the proxy's queries of that step. Per KV head the large cache keeps
 * full rows (critical and recent tokens: KVSDK_TIER_EXACT), marginal rows (values only:
 * KVSDK_TIER_VALUE_ONLY) and per row its position and the proxy's accumulated attention
 * (KVSDK_TIER_METADATA, with the head mapping and the matching statistics).
 *  - Head matching: over the first policy.match_tokens tokens every large query head is mapped
 *    to the proxy head (any layer) whose top-10% accumulated-attention tokens have the highest
 *    Jaccard similarity; earlier when the budget forces an eviction before that.
 *  - Until the budget is reached every token is kept full. Beyond it, each KV head's share is
 *    split critical : recent : marginal = 2 : 1 : 2, critical tokens chosen by the matched proxy
 *    heads' accumulated attention over the proxy's full cache; marginal tokens drop their keys;
 *    other tokens are evicted (gone).
 *  - Attention: full rows with the large model's own softmax, marginal rows weighted by the
 *    matched proxy head's attention probability of the same step (SmallKV Eq. 6, normalised so
 *    that the weights sum to 1). kvsdk_cache_attend of a smallkv cache also updates its
 *    importance state (never its bytes). kvsdk_cache_read returns marginal rows with zero keys.
 *  - Without a proxy a smallkv cache appends within its budget and attends over full rows;
 *    evicting (an append beyond the budget, compress, set_budget) and attending over marginal
 *    rows fail with KVSDK_E_STATE and change nothing.
 *  - Snapshots keep the rows, scores, head mapping and the large model's matching statistics, but
 *    not the link: after loading, attach the proxy (itself loaded from its own snapshot) again.
 *    Attaching starts the proxy's matching statistics afresh, so a snapshot taken before every
 *    KV head was matched (before match_tokens tokens and before the first eviction) may resume
 *    with another head mapping, and then other evictions and outputs, than an uninterrupted
 *    run; a snapshot taken after the matching continues bit-identically.
 * The proxy's own cache is budgeted by its own context; the link's working state (the proxy's
 * latest queries, and its matching statistics until the matching is done) is not budgeted.
 */

/** Links `proxy` to the smallkv cache `cache`, replacing any previous proxy, or detaches it
 *  (`proxy` NULL). The proxy must be a cache of policy 'full' holding the same tokens at the same
 *  positions as `cache` (its geometry may differ: smaller model, other head_dim or dtype). A
 *  proxy serves one cache at a time. `cache` does not own the proxy: keep the proxy alive while
 *  `cache` uses it; destroying either cache detaches the link (kvsdk_cache_set_proxy(cache, NULL)
 *  does so explicitly). Both caches must be used from one thread. Setting the current proxy again
 *  is a no-op.
 *  Errors: KVSDK_E_INVALID_ARG (NULL cache, proxy == cache, a proxy whose policy is not 'full'),
 *          KVSDK_E_UNSUPPORTED (`cache`'s policy is not smallkv),
 *          KVSDK_E_STATE (the proxy already serves another cache),
 *          KVSDK_E_GEOMETRY (a head mapping restored from a snapshot names proxy heads this
 *          proxy does not have). On error nothing changed. */
KVSDK_API kvsdk_status kvsdk_cache_set_proxy(kvsdk_cache *cache, kvsdk_cache *proxy);

/** Lets the host run the proxy of the smallkv cache `cache` on another thread, in parallel with
 *  `cache` (SmallKV's Algorithm 1 runs the two models side by side), or turns that off
 *  (`timeout_ms` 0, the default). With `timeout_ms` > 0, a call of `cache` that needs the proxy's
 *  attention of a step waits for it, each wait at most `timeout_ms` milliseconds:
 *  kvsdk_cache_attend waits for the proxy's attend of the matched proxy layers at the same
 *  positions; an append or compression that has to match heads waits for the proxy's attend of
 *  every layer through the newest position involved. A wait spins for up to 0.3 ms before it
 *  sleeps (waking a sleeping thread costs about as much as a small proxy layer). Results are
 *  bit-identical to running the proxy's step first on the same thread. Once every head is
 *  matched, the proxy's thread also computes, in its attend, the proxy attention that `cache`
 *  reads at a decode step (work moved off `cache`'s thread). Rules, which the host keeps:
 *   - one step at a time: the proxy's thread starts the step for positions P (append, then
 *     attend, of each layer in order) no earlier than `cache`'s previous step returned, and
 *     `cache`'s step for P ends only after the proxy's step for P has finished (join the
 *     proxy's thread before calling `cache` for the next positions or anything else);
 *   - both caches pass positions to append and attend (the wait matches them);
 *   - only the proxy's thread uses the proxy during its step; kvsdk_cache_set_proxy, truncate,
 *     fork, save and destroy of either cache only while no step runs.
 *  The wait adds no work when the proxy ran first (it returns at once).
 *  Errors: KVSDK_E_INVALID_ARG (NULL cache), KVSDK_E_UNSUPPORTED (`cache`'s policy is not
 *          smallkv). The setting belongs to the cache, not to the link: it stays across
 *          kvsdk_cache_set_proxy and is not saved. A call that timed out returns KVSDK_E_STATE
 *          and changes nothing (as when the proxy did not run). */
KVSDK_API kvsdk_status kvsdk_cache_set_proxy_wait(kvsdk_cache *cache, uint32_t timeout_ms);

#endif /* KVSDK_EXPERIMENTAL */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVSDK_H */
