// The backend seam (issue 15): every kernel the core runs goes through one table of function
// pointers, in the manner of ggml's backend interface. A backend is one such table:
//   - the CPU reference backend (backends/cpu/reference_ops.cpp): today's scalar kernels, the
//     oracle every other backend is tested against (tests/backends/backend_ops_test.cpp);
//   - the optimized CPU backend (backends/cpu/optimized_ops.cpp): the reference table with the
//     entries that have a faster kernel replaced (Highway SIMD, runtime dispatch);
//   - CUDA (a later issue) fills the same table with its kernels.
//
// Memory: each backend owns its buffers (alloc/free, copies to and from the host), and the
// pointers that ops receive point into the backend's own memory: host memory for the CPU
// backends, device memory for CUDA. The core never dereferences what a backend allocated. Working
// memory that an op needs between calls (softmax state, dequantized chunks, SIMD scratch) lives
// in a Workspace that the backend creates and the caller keeps per cache and per thread, so a
// call on the decode path allocates nothing once the workspace has grown to its shape.
//
// Tier objects (KiviHeadStore, SpindleHeadStore, MiniCache pairs, SpeCache fetched rows) are the
// CPU stores' layouts; they are host-side until the CUDA backend gives each a device twin.
//
// Errors: CPU entries do not fail (allocation aside: alloc/workspace_create return null). A
// device backend's entries throw kvsdk::Error: KVSDK_E_BACKEND with the driver's message when
// the device fails, KVSDK_E_UNSUPPORTED for an operation it has no kernel for yet.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "attention_scores.h"
#include "partial_state.h"  // split-K: Ops::attend_*_range, merge_partials
#include "kvsdk.h"

namespace kvsdk::cpu {
class KiviHeadStore;
class SpindleHeadStore;
class MiniCacheHeadPair;
class MiniCacheKiviPair;
struct SpeCacheFetched;
}  // namespace kvsdk::cpu

namespace kvsdk::backend {

// A backend's working memory (each backend defines it). Not shared between threads.
struct Workspace;

// The queries of one call: n_rows rows [n_rows][dim] (one query of one query head each; all rows
// share one KV head), each with its position for causal masking (a row sees tokens whose position
// <= its own; INT32_MAX sees everything).
struct QueryRows {
  const float* q = nullptr;
  const int32_t* positions = nullptr;
  size_t n_rows = 0;
  size_t dim = 0;
  float scale = 1.0f;
  // Rows come in runs of `group` with the same position (the query heads of one token that share
  // the KV head); a backend may load each K/V row once per run. 1: no such promise.
  size_t group = 1;
};

// Dense IEEE binary16 rows of one KV head (the exact tier): k, v [n_tokens][dim], positions.
struct F16Rows {
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  const int32_t* positions = nullptr;
  size_t n_tokens = 0;
};

// --- SmallKV (Eq. 6) -----------------------------------------------------------------------------
// The value-only (marginal) rows of a SmallKV head and the proxy's attention probabilities for
// them: v [n_tokens][dim] f16 with positions; weights row r (query row r) starts at
// weights + r * weights_stride and holds one probability per marginal row.
struct SmallKvMarginal {
  const uint16_t* v = nullptr;
  const int32_t* positions = nullptr;
  size_t n_tokens = 0;
  const float* weights = nullptr;
  size_t weights_stride = 0;
};
// --- end SmallKV ---------------------------------------------------------------------------------

// --- A KIVI tier as raw buffers ----------------------------------------------------------------
// The buffers of a KiviHeadStore (backends/cpu/kivi_store.h's layout) in the backend's memory,
// without the host object: what a device store holds in its arena. `tokens` quantized tokens in
// key blocks of `group` tokens, or, with block_starts, in `blocks` ragged key blocks (an eviction's
// retain: block b starts at quantized token block_starts[b], ascending from 0); then the exact
// residual rows (F16Rows).
struct KiviTier {
  const uint8_t* k_codes = nullptr;   // [tokens][packed row bytes]
  const uint8_t* v_codes = nullptr;   // [tokens][packed row bytes]
  const uint16_t* k_scale = nullptr;  // [tokens / group or blocks][dim] f16
  const uint16_t* k_zero = nullptr;
  const uint16_t* v_scale = nullptr;  // [tokens][ceil(dim / group)] f16
  const uint16_t* v_zero = nullptr;
  const int32_t* positions = nullptr;  // [tokens]
  size_t tokens = 0;
  uint32_t bits = 2;
  uint32_t group = 32;
  uint32_t residual = 128;  // R of the store (KiviConfig): bounds the residual rows it may hold
  uint32_t weight_bits = 14;  // KiviConfig::weight_bits: the optimized CPU kernel's value weights
  const uint32_t* block_starts = nullptr;  // [blocks]; null: tokens / group full blocks
  size_t blocks = 0;
};

// --- A MiniCache pair's layer as raw buffers ----------------------------------------------------
// One tensor (keys or values) of one KV head of a MiniCache layer pair, one layer of it, in the
// backend's memory (backends/cpu/minicache_merge.h's MergedLayerPair layout): token t's slot is
// slots[t]; a merged slot s is restored as magnitudes[s] * directions[s * dim ..] (the shared f16
// direction times this layer's f32 magnitude), a retained slot kRetainedBit | j is this layer's
// f16 row retained[j * dim ..].
struct MiniCacheTensor {
  const uint32_t* slots = nullptr;       // [tokens]
  const uint16_t* directions = nullptr;  // [merged][dim] f16
  const float* magnitudes = nullptr;     // [merged], this layer's
  const uint16_t* retained = nullptr;    // [retained_rows][dim] f16, this layer's
  size_t merged = 0, retained_rows = 0;
};
// What a device MiniCache store holds of one layer and KV head (src/repr/device_minicache.h).
struct MiniCacheTier {
  MiniCacheTensor k, v;
  const int32_t* positions = nullptr;  // [tokens]
  size_t tokens = 0;
};

// One host -> backend copy of a batch (Ops::to_backend_many).
struct HostCopy {
  void* dst;            // backend memory
  const void* src;      // host memory
  size_t bytes;
};

struct Ops {
  const char* name;

  // Whether the backend's memory is the host's (CPU tables) or a device's (CUDA): the core never
  // dereferences a device backend's pointers, it copies through to_backend / to_host.
  bool device_memory;

  // --- memory owned by the backend -------------------------------------------------------------
  void* (*alloc)(size_t bytes);  // nullptr when out of memory
  void (*free)(void* buffer);    // nullptr is a no-op
  void (*to_backend)(void* dst, const void* host_src, size_t bytes);
  void (*to_host)(void* host_dst, const void* src, size_t bytes);
  // Within the backend's memory; the ranges must not overlap. Complete when it returns.
  void (*copy)(void* dst, const void* src, size_t bytes);
  Workspace* (*workspace_create)();  // nullptr when out of memory
  void (*workspace_destroy)(Workspace* ws);

  // --- append / convert --------------------------------------------------------------------------
  void (*f32_to_f16)(const float* src, size_t n, uint16_t* dst);  // round to nearest even
  void (*f16_to_f32)(const uint16_t* src, size_t n, float* dst);  // exact

  // --- KIVI quantize / dequantize (layouts of backends/cpu/kivi_quant.h) -------------------------
  void (*kivi_quantize_keys)(const float* k, size_t n_tokens, size_t dim, uint32_t bits,
                             uint8_t* codes, uint16_t* scale, uint16_t* zero);
  void (*kivi_dequantize_keys)(const uint8_t* codes, const uint16_t* scale, const uint16_t* zero,
                               size_t first, size_t count, size_t dim, uint32_t bits, float* out);
  void (*kivi_quantize_values)(const float* v, size_t n_tokens, size_t dim, size_t group,
                               uint32_t bits, uint8_t* codes, uint16_t* scale, uint16_t* zero);
  void (*kivi_dequantize_values)(const uint8_t* codes, const uint16_t* scale,
                                 const uint16_t* zero, size_t n_tokens, size_t dim, size_t group,
                                 uint32_t bits, float* out);

  // --- decode attention over each tier: out [n_rows][dim]; rows that see no token get zeros -----
  void (*attend_f16)(const QueryRows& q, const F16Rows& rows, Workspace& ws, float* out);
  void (*attend_kivi)(const QueryRows& q, const cpu::KiviHeadStore& store, Workspace& ws,
                      float* out);
  void (*attend_spindle)(const QueryRows& q, const cpu::SpindleHeadStore& store, Workspace& ws,
                         float* out);
  // Layer 0 or 1 of a MiniCache pair (f16 directions, or KIVI-quantized ones), then `pending`:
  // the layer's exact rows still waiting for the partner layer (n_tokens 0: none), in one softmax.
  void (*attend_minicache)(const QueryRows& q, const cpu::MiniCacheHeadPair& pair, int layer,
                           const F16Rows& pending, Workspace& ws, float* out);
  void (*attend_minicache_kivi)(const QueryRows& q, const cpu::MiniCacheKiviPair& pair, int layer,
                                const F16Rows& pending, Workspace& ws, float* out);
  // SpeCache: the low-bit copy with fetched full-precision rows substituted.
  void (*attend_specache)(const QueryRows& q, const cpu::KiviHeadStore& lowbit,
                          const cpu::SpeCacheFetched& fetched, Workspace& ws, float* out);

  // --- window scoring, pooling, top-k, gather/compaction -----------------------------------------
  // Adds each row's softmax probabilities over the keys it may see to col_sums[n_keys]; keys
  // come in chunks from `keys` (stored rows and a host's incoming buffer in any dtype, without
  // concatenating them first).
  void (*column_sums)(const QueryRows& q, const cpu::KeyChunkLoader& keys, const int32_t* key_pos,
                      size_t n_keys, Workspace& ws, float* col_sums);
  // 1-D pooling of n scores with an odd kernel (max or average over the full kernel).
  void (*pool)(const float* in, size_t n, int kernel, kvsdk_pool_kind kind, float* out);
  // The rows that survive when k of n may stay: the first `sinks`, the newest `recent`, and the
  // highest `scores` of the rest (ties: the older row); scores NULL = recency. Ascending indices.
  void (*select_keep)(size_t n, size_t k, size_t sinks, size_t recent, const float* scores,
                      Workspace& ws, std::vector<uint32_t>& keep);
  // dst[i] = src[rows[i]] for rows of row_bytes bytes (compaction when dst == src and rows are
  // ascending).
  void (*gather_rows)(const void* src, size_t row_bytes, const uint32_t* rows, size_t n,
                      void* dst);

  // --- codebook reconstruction, merge/restore ----------------------------------------------------
  // SpindleKV (Eq. 14): out[i] = entries[index[i]] * magnitude[i], for `count` rows.
  void (*codebook_reconstruct)(const uint16_t* entries, const uint32_t* index,
                               const float* magnitude, size_t count, size_t dim, float* out);
  // MiniCache: the SLERP direction of a and b, and a row restored as magnitude * direction.
  void (*merge_slerp)(const float* a, const float* b, size_t dim, float t, float* out);
  void (*restore_row)(const uint16_t* direction, float magnitude, size_t dim, float* out);

  // --- SpeCache selection ------------------------------------------------------------------------
  // Group-averaged top-k over the low-bit keys for `group` query rows at one position (q.n_rows =
  // group); ascending token indices into `tokens`, and the averaged probabilities when non-null.
  // Both reuse their capacity, and the working memory lives in ws: no allocation once grown.
  void (*specache_select)(const QueryRows& q, const cpu::KiviHeadStore& lowbit, size_t k,
                          Workspace& ws, std::vector<uint32_t>& tokens,
                          std::vector<float>* avg_probs);

  // --- SpeCache decode step in one pass --------------------------------------------------------
  // attend_specache's output (the same bits), and in the same pass over the low-bit copy the
  // selection's scores [q.n_rows][lowbit.size()]: each row's scaled dot product with the
  // dequantized LOW-BIT keys (no fetched row substituted), -inf for tokens after the row's
  // position, exactly as specache_select scores them. SpeCache (§3.3) picks the speculative
  // token's top-k from its own attention pass instead of a second scan. `fetched_share`: NULL, or
  // [q.n_rows] for each row's softmax over those scores summed over the fetched tokens (the share
  // of its low-bit attention the fetched rows hold, 0 for a row that sees no token: SpeCache's
  // fetch hit rate, §4), from the same pass.
  void (*attend_specache_scored)(const QueryRows& q, const cpu::KiviHeadStore& lowbit,
                                 const cpu::SpeCacheFetched& fetched, Workspace& ws, float* out,
                                 float* scores, float* fetched_share);
  // specache_select's result from those scores of `group` rows at one position, [group][n]
  // (overwritten: working memory): bit for bit what specache_select returns for those rows.
  void (*specache_select_scored)(float* scores, size_t group, size_t n, size_t k, Workspace& ws,
                                 std::vector<uint32_t>& tokens, std::vector<float>* avg_probs);
  // --- SmallKV (backends/cpu/smallkv.h; these entries come last, as one block) -----------------
  // The proxy side of Eq. 6: softmax probabilities of each query row over f16 keys k [n][q.dim]
  // (causal by position) into out [q.n_rows][n]; 0 where masked, all 0 for a row that sees none.
  // Each row's probabilities are the bits of a call for that row alone (rows are independent).
  void (*smallkv_softmax)(const QueryRows& q, const uint16_t* k, const int32_t* positions,
                          size_t n, Workspace& ws, float* out);
  // Eq. 6: the large model's softmax over the full rows, rescaled by the mass the proxy leaves
  // them, plus the marginal rows weighted by the proxy's probabilities (cpu::smallkv_attend).
  void (*attend_smallkv)(const QueryRows& q, const F16Rows& full, const SmallKvMarginal& marginal,
                         Workspace& ws, float* out);
  // Eq. 6's marginal term alone, on `out` [q.n_rows][q.dim] holding attend_smallkv's result for
  // the full rows with no marginal rows: rescales each row by the mass the proxy leaves the full
  // rows and adds the marginal rows weighted by the proxy's probabilities. attend_smallkv with
  // `marginal` gives the same bits as attend_smallkv with none followed by this, so a cache can
  // attend its own rows before the proxy's probabilities of the step exist (SmallKV's proxy may
  // still be running on another thread) and add them after.
  void (*smallkv_add_marginal)(const QueryRows& q, const SmallKvMarginal& marginal, Workspace& ws,
                               float* out);
  // --- end SmallKV -------------------------------------------------------------------------------

  // --- KIVI over raw buffers (device stores: src/repr/device_kivi.h) ----------------------------
  // attend_kivi of the KiviHeadStore that holds `tier`'s quantized tokens followed by the exact
  // `residual` rows, in one softmax. The CPU tables rebuild that store on the host (a copy: for
  // tests and tools, not the decode path); a device table reads the buffers where they are.
  void (*attend_kivi_tier)(const QueryRows& q, const KiviTier& tier, const F16Rows& residual,
                           Workspace& ws, float* out);

  // --- memory, batched ---------------------------------------------------------------------------
  // Several host -> backend copies as one transfer (a device backend stages them together and
  // waits once; a decode step's append writes three rows per KV head). Complete when it returns;
  // destinations must not overlap. Null (the CPU tables): to_backend one copy at a time.
  void (*to_backend_many)(const HostCopy* copies, size_t n) = nullptr;

  // --- split-K: a head's tokens in ranges on separate threads, merged in a fixed order ----------
  // attend_f16 / attend_kivi over the tokens [first, first + count) only (append order; KIVI:
  // the quantized tokens, then the residual window; a range may start or end inside a key
  // block), into the softmax state `out`. Ranges of one head may run at the same time, each with
  // its own Workspace. A range past the rows' end throws kvsdk::Error (KVSDK_E_INVALID_ARG).
  // merge_partials writes out [n_rows][dim] = the attention over the union of the parts' ranges:
  // max over the parts, then each part rescaled by exp(max_i - max) and added, part 0 first
  // (deterministic for a given split; it differs from one whole-range call only by rounding).
  // Null (the device tables for now): the core attends whole heads.
  void (*attend_f16_range)(const QueryRows& q, const F16Rows& rows, size_t first, size_t count,
                           Workspace& ws, const PartialState& out) = nullptr;
  void (*attend_kivi_range)(const QueryRows& q, const cpu::KiviHeadStore& store, size_t first,
                            size_t count, Workspace& ws, const PartialState& out) = nullptr;
  void (*merge_partials)(const PartialState* parts, size_t n_parts, size_t n_rows, size_t dim,
                         float* out) = nullptr;

  // --- window scoring where a device store's rows are (src/repr/device_rows.h, device_kivi.h) ---
  // column_sums with the same bits over keys in backend memory, in this order: a KIVI tier's
  // quantized keys as attention dequantizes them (`quant`, null: none; its values unused), the
  // f16 rows `held` (k and positions; v unused), then `tail` (f32 [n_tail][q.dim], positions
  // tail_pos: an append's incoming rows); q too. Overwrites col_sums [quant tokens +
  // held.n_tokens + n_tail] (backend memory). Null (the CPU tables): their stores are scored
  // through column_sums over a loader.
  void (*column_sums_rows)(const QueryRows& q, const KiviTier* quant, const F16Rows& held,
                           const float* tail, const int32_t* tail_pos, size_t n_tail,
                           Workspace& ws, float* col_sums) = nullptr;

  // --- SpeCache over raw buffers (device stores: src/repr/device_specache.h) ------------------
  // The low-bit copy is the KiviHeadStore of `tier`'s quantized tokens followed by `residual`'s
  // exact rows (as attend_kivi_tier). attend_specache of that copy with `fetched` substituted:
  // the tokens fetched_tokens[0 .. fetched.n_tokens) (strictly ascending indices into the copy's
  // tokens) leave the low-bit part and fetched.k / fetched.v (f16 [n][dim], fetched.positions:
  // those tokens' positions) join the same softmax in their place. Everything in backend memory.
  // The CPU tables rebuild the copy and a SpeCacheFetched on the host and run their own
  // attend_specache (tests and tools; it puts each fetched row at its token's position in the
  // copy, so they do not read fetched.positions), and throw kvsdk::Error (KVSDK_E_INVALID_ARG)
  // for tokens that are not strictly ascending or not in the copy; a device table reads the
  // buffers where they are (and trusts the order of tokens it cannot see).
  void (*attend_specache_tier)(const QueryRows& q, const KiviTier& tier, const F16Rows& residual,
                               const F16Rows& fetched, const uint32_t* fetched_tokens,
                               Workspace& ws, float* out) = nullptr;
  // The selection's scores over that copy (no row substituted): scores [q.n_rows][tier.tokens +
  // residual.n_tokens] (backend memory, row-major) = each row's dot product with each key as
  // attention dequantizes it, times q.scale; -inf for a key after the row's position. The bits
  // of the reference's SpeCache scoring (cpu::specache_score_chunk: dot_f32 over
  // kivi_dequantize_keys' keys) in the reference and device tables; the optimized table gives
  // its own kernel's (fast::kivi_scores), as its specache_select ranks them.
  void (*specache_scores_tier)(const QueryRows& q, const KiviTier& tier, const F16Rows& residual,
                               Workspace& ws, float* scores) = nullptr;
  // The reference's selection (cpu::specache_select_from_scores, bit for bit) where the scores
  // are: scores [group][n] (overwritten: working memory) -> tokens [min(k, n)], the top k of the
  // group-averaged probabilities, ascending. And the hit rate's measurement
  // (cpu::specache_fetched_shares, bit for bit): shares [rows] = each row's softmax over scores
  // [rows][n] summed over tokens [n_tokens]. Backend memory throughout. Null in the CPU tables
  // (their stores select through specache_select_scored on the host).
  void (*specache_select_tier)(float* scores, size_t group, size_t n, size_t k, Workspace& ws,
                               uint32_t* tokens) = nullptr;
  void (*specache_shares_tier)(const float* scores, size_t rows, size_t n, const uint32_t* tokens,
                               size_t n_tokens, float* shares) = nullptr;

  // --- MiniCache over raw buffers (device stores: src/repr/device_minicache.h) -----------------
  // attend_minicache of one layer of a pair whose buffers `tier` are, then `pending` (that
  // layer's exact rows still waiting for the partner layer; n_tokens 0: none), in one softmax.
  // The CPU tables rebuild the pair on the host (a copy: for tests and tools, not the decode
  // path; throws kvsdk::Error KVSDK_E_CORRUPT for slots that do not number the buffers' rows);
  // a device table restores the rows in registers where they are.
  void (*attend_minicache_tier)(const QueryRows& q, const MiniCacheTier& tier,
                                const F16Rows& pending, Workspace& ws, float* out) = nullptr;
};

// The copies through ops.to_backend_many where the backend has it, else one by one.
inline void to_backend_all(const Ops& ops, const HostCopy* copies, size_t n) {
  if (ops.to_backend_many) return ops.to_backend_many(copies, n);
  for (size_t i = 0; i < n; ++i) ops.to_backend(copies[i].dst, copies[i].src, copies[i].bytes);
}

// The scalar reference backend (the oracle) and the optimized CPU backend.
const Ops& cpu_reference();
const Ops& cpu_optimized();

// A backend on a device (CUDA): its table, and the check that a context on `device` can run it
// (throws kvsdk::Error: KVSDK_E_BACKEND when no device is usable, with the driver's reason;
// KVSDK_E_INVALID_ARG for an ordinal that is not present).
//
// A device context's own queue (CUDA: a compute stream, a copy stream and pinned staging
// buffers), created with its arena. While a context's DeviceScope binds it to the calling thread,
// the table's entries run on it: kernels on the compute stream, to_backend / to_host / copy on
// the copy stream through the pinned buffers (after the kernels enqueued before them). Unbound,
// they run synchronously on the device's default stream (the tests of the table itself).
struct DeviceQueue;
struct DeviceBackend {
  const Ops* ops;
  void (*require_device)(int32_t device);
  // Makes `device` the calling thread's current device and returns the one that was, so that a
  // call can put it back (the app's own choice of device on its threads is left as it was).
  int32_t (*select_device)(int32_t device);
  // A queue on the current device (throws kvsdk::Error: KVSDK_E_NO_MEMORY when the pinned
  // buffers cannot be allocated, KVSDK_E_BACKEND for the driver's other failures), its release
  // (waits for its work; never throws), and the calling thread's binding: returns the queue
  // bound before (nullptr: none), so that a scope can put it back.
  DeviceQueue* (*queue_create)();
  void (*queue_destroy)(DeviceQueue* queue) noexcept;
  DeviceQueue* (*bind_queue)(DeviceQueue* queue) noexcept;
};
// The CUDA backend of this build (backends/backend_registry.cpp): the one installed by
// install_cuda_backend, else the CUDA table when the build has CUDA, else nullptr.
const DeviceBackend* cuda_backend();
// Installs `backend` as the CUDA backend (nullptr: back to the build's own). For the tests of a
// build without CUDA: the CUDA kernels compiled against the host execution shim
// (backends/cuda/host) run every device-cache path on the CPU. Not thread-safe with contexts
// being created.
void install_cuda_backend(const DeviceBackend* backend);

// The table of a context's backend kind: KVSDK_BACKEND_CPU -> optimized, KVSDK_BACKEND_CPU_REFERENCE
// -> reference, KVSDK_BACKEND_CUDA -> cuda_backend()'s; nullptr for kinds without a table in this
// build.
const Ops* ops_for(kvsdk_backend kind);

// Owns a workspace of one backend (move-only).
class WorkspaceHandle {
 public:
  WorkspaceHandle() = default;
  explicit WorkspaceHandle(const Ops& ops);  // throws kvsdk::Error KVSDK_E_NO_MEMORY
  ~WorkspaceHandle() { reset(); }
  WorkspaceHandle(WorkspaceHandle&& o) noexcept : ops_(o.ops_), ws_(o.ws_) { o.ws_ = nullptr; }
  WorkspaceHandle& operator=(WorkspaceHandle&& o) noexcept;
  WorkspaceHandle(const WorkspaceHandle&) = delete;
  WorkspaceHandle& operator=(const WorkspaceHandle&) = delete;
  Workspace& get() const { return *ws_; }
  explicit operator bool() const { return ws_ != nullptr; }
  void reset() noexcept;

 private:
  const Ops* ops_ = nullptr;
  Workspace* ws_ = nullptr;
};

}  // namespace kvsdk::backend
