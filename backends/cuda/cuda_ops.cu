// The CUDA kernel table (cuda_ops.h). Memory entries are complete when they return; inside a
// context's DeviceScope they run on the context's queue (cuda_queue.h: copy stream, pinned
// staging), and attention is cuda_decode_attention's split-K kernel over one KV head's f16 rows
// (and, for KIVI stores, its quantized blocks; for MiniCache stores, a layer's merged rows) on
// the queue's compute stream, which the next transfer waits for.
#include <cuda_runtime.h>

#include <algorithm>
#include <new>

#include "cuda_check.h"
#include "cuda_column_sums.h"
#include "cuda_convert.h"
#include "cuda_decode_attention.h"
#include "cuda_kivi_quant.h"
#include "cuda_ops.h"
#include "cuda_queue.h"
#include "cuda_smallkv.h"
#include "cuda_specache_select.h"
#include "util/error.h"

namespace kvsdk::cuda {
namespace {

// The device's working memory for attention: the decode plan's partials, grown to the largest
// call and then reused (the decode path allocates nothing once it has grown).
struct CudaWorkspace {
  void* partials = nullptr;
  size_t bytes = 0;
  // The scoring kernel's logits block and row statistics (column_sums_rows), grown likewise.
  float* scores = nullptr;
  size_t score_floats = 0;
  // SpeCache's selection: the averaged probabilities and the rows' sums, grown likewise.
  void* select = nullptr;
  size_t select_bytes = 0;
};

CudaWorkspace& cuda_workspace(backend::Workspace& ws) {
  return *reinterpret_cast<CudaWorkspace*>(&ws);
}

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  return cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess ? p : nullptr;
}
void device_free(void* p) {
  if (p) cudaFree(p);
}
void to_device(void* dst, const void* src, size_t bytes) { copy_to_device(dst, src, bytes); }
void to_host(void* dst, const void* src, size_t bytes) { copy_to_host(dst, src, bytes); }
void device_copy(void* dst, const void* src, size_t bytes) { copy_on_device(dst, src, bytes); }
backend::Workspace* workspace_create() {
  return reinterpret_cast<backend::Workspace*>(new (std::nothrow) CudaWorkspace());
}
void workspace_destroy(backend::Workspace* ws) {
  if (!ws) return;
  CudaWorkspace* w = &cuda_workspace(*ws);
  if (w->partials) cudaFree(w->partials);
  if (w->scores) cudaFree(w->scores);
  if (w->select) cudaFree(w->select);
  delete w;
}

// One KV head's tiers against query rows of one conversation: each run of q.group rows (one
// token's query heads) is a "sequence" of the decode kernel reading the same rows, masked by
// position. Long prefill chunks go in pieces within the kernel's grid limit: launch(shape, plan,
// partials, first query row) enqueues one piece, planned for the tiers' token counts (a first
// tier of `first_tokens`: KIVI or MiniCache, the exact rows, `extra_tokens` of a second exact
// tier).
template <class Launch>
void attend_pieces(const backend::QueryRows& q, size_t first_tokens, size_t exact_tokens,
                   size_t extra_tokens, backend::Workspace& ws, Launch&& launch) {
  const size_t group =
      q.group >= 1 && q.group <= kDecodeMaxGroup && q.n_rows % q.group == 0 ? q.group : 1;
  KVSDK_REQUIRE(q.dim == 64 || q.dim == 128 || q.dim == 256, "cuda: attention over head_dim ",
                q.dim, " (the kernel has 64, 128 and 256)");
  CudaWorkspace& w = cuda_workspace(ws);
  constexpr size_t kMaxBatch = 32768;
  const size_t sequences = q.n_rows / group;
  for (size_t first = 0; first < sequences; first += kMaxBatch) {
    DecodeShape shape;
    shape.batch = std::min(kMaxBatch, sequences - first);
    shape.kv_heads = 1;
    shape.group = group;
    shape.dim = q.dim;
    shape.scale = q.scale;
    shape.shared_rows = true;
    const DecodePlan plan = plan_decode(shape, first_tokens, exact_tokens, 0, extra_tokens);
    if (plan.workspace_bytes > w.bytes) {
      void* grown = nullptr;
      check_cuda(cudaMalloc(&grown, plan.workspace_bytes), "cudaMalloc (attention workspace)");
      if (w.partials) cudaFree(w.partials);
      w.partials = grown;
      w.bytes = plan.workspace_bytes;
    }
    launch(shape, plan, w.partials, first * group);
  }
  // No synchronisation: the caller's next transfer (to_host) waits for the kernels and reports a
  // fault in them.
}

// `kivi` null: the exact rows alone. `extra`: a second exact tier in the same softmax (null: none).
void attend_tiers(const backend::QueryRows& q, const KiviTierView* kivi, const ExactTierView& exact,
                  backend::Workspace& ws, float* out, const ExactTierView* extra = nullptr) {
  attend_pieces(q, kivi ? kivi->tokens : 0, exact.tokens, extra ? extra->tokens : 0, ws,
                [&](const DecodeShape& shape, const DecodePlan& plan, void* partials, size_t row0) {
                  decode_attention(q.q + row0 * q.dim, shape, kivi, &exact, plan, partials,
                                   out + row0 * q.dim, compute_stream(), q.positions + row0,
                                   extra);
                });
}

ExactTierView exact_view(const backend::F16Rows& rows) {
  ExactTierView view;
  view.k = rows.k;
  view.v = rows.v;
  view.tokens = view.capacity = rows.n_tokens;
  view.positions = rows.positions;
  return view;
}

void attend_f16(const backend::QueryRows& q, const backend::F16Rows& rows, backend::Workspace& ws,
                float* out) {
  attend_tiers(q, nullptr, exact_view(rows), ws, out);
}

// A KIVI tier's buffers as the decode kernel's view of one head (nothing excluded).
KiviTierView kivi_view(const backend::KiviTier& tier) {
  KiviTierView view;
  view.k_codes = tier.k_codes;
  view.v_codes = tier.v_codes;
  view.k_scale = tier.k_scale;
  view.k_zero = tier.k_zero;
  view.v_scale = tier.v_scale;
  view.v_zero = tier.v_zero;
  view.bits = tier.bits;
  view.group = tier.group;
  view.tokens = view.capacity = tier.tokens;
  view.positions = tier.positions;
  view.block_starts = tier.block_starts;
  view.blocks = view.block_stride = tier.blocks;
  return view;
}

// A device KIVI store's head (src/repr/device_kivi.h): its quantized blocks and exact residual
// rows in one softmax, the split-K kernel dequantizing the codes as it loads them.
void attend_kivi_tier(const backend::QueryRows& q, const backend::KiviTier& tier,
                      const backend::F16Rows& residual, backend::Workspace& ws, float* out) {
  const KiviTierView view = kivi_view(tier);
  attend_tiers(q, &view, exact_view(residual), ws, out);
}

// A device SpeCache head (SpeCache (docs/papers.md) §3.3): attend_kivi_tier's two tiers with the
// fetched tokens left out of both (one list over the copy's tokens: the residual's indices start
// at tier.tokens), and the fetched full-precision rows as a third tier at their own positions,
// all in one softmax. The list stays on the device (the kernel walks it); its order is the
// caller's promise, as the contract states.
void attend_specache_tier(const backend::QueryRows& q, const backend::KiviTier& tier,
                          const backend::F16Rows& residual, const backend::F16Rows& fetched,
                          const uint32_t* fetched_tokens, backend::Workspace& ws, float* out) {
  KVSDK_REQUIRE(fetched.n_tokens <= tier.tokens + residual.n_tokens, "cuda: ", fetched.n_tokens,
                " fetched rows for a low-bit copy of ", tier.tokens + residual.n_tokens,
                " tokens");
  const TokenExclusion skip{fetched_tokens, fetched.n_tokens, 0};
  KiviTierView lowbit = kivi_view(tier);
  lowbit.skip = skip;
  ExactTierView exact = exact_view(residual);
  exact.skip = skip;
  exact.skip.exclude_base = uint32_t(tier.tokens);
  const ExactTierView rows = exact_view(fetched);
  attend_tiers(q, &lowbit, exact, ws, out, &rows);
}

// A device MiniCache head (src/repr/device_minicache.h): one layer's merged rows restored in
// registers by the split-K kernel, and the layer's pending exact rows, in one softmax.
MiniCacheTensorView minicache_view(const backend::MiniCacheTensor& t) {
  MiniCacheTensorView view;
  view.slots = t.slots;
  view.directions = t.directions;
  view.magnitudes = t.magnitudes;
  view.retained = t.retained;
  return view;
}

void attend_minicache_tier(const backend::QueryRows& q, const backend::MiniCacheTier& tier,
                           const backend::F16Rows& pending, backend::Workspace& ws, float* out) {
  MiniCacheTierView merged;
  merged.k = minicache_view(tier.k);
  merged.v = minicache_view(tier.v);
  merged.tokens = tier.tokens;
  merged.positions = tier.positions;
  const ExactTierView rows = exact_view(pending);
  attend_pieces(q, tier.tokens, pending.n_tokens, 0, ws,
                [&](const DecodeShape& shape, const DecodePlan& plan, void* partials, size_t row0) {
                  decode_attention_minicache(q.q + row0 * q.dim, shape, merged, &rows, plan,
                                             partials, out + row0 * q.dim, compute_stream(),
                                             q.positions + row0);
                });
}

// Logits held at once by the device scoring (16 MiB of working memory at most: a block of query
// rows at a time, which never changes a result, as on the CPU).
constexpr size_t kMaxScoreLogits = size_t(4) << 20;

// A KIVI tier's key buffers as the scoring kernel reads them.
QuantKeys quant_keys(const backend::KiviTier& tier) {
  QuantKeys quant;
  quant.codes = tier.k_codes;
  quant.scale = tier.k_scale;
  quant.zero = tier.k_zero;
  quant.positions = tier.positions;
  quant.block_starts = tier.block_starts;
  quant.blocks = tier.blocks;
  quant.bits = tier.bits;
  quant.group = tier.group;
  return quant;
}

// The eviction presets' scores over a device store's rows (and an append's incoming rows), with
// the CPU's bits (cuda_column_sums.h), on the compute stream.
void column_sums_rows(const backend::QueryRows& q, const backend::KiviTier* tier,
                      const backend::F16Rows& held, const float* tail, const int32_t* tail_pos,
                      size_t n_tail, backend::Workspace& ws, float* col_sums) {
  ColumnSumsShape shape;
  shape.rows = q.n_rows;
  shape.dim = q.dim;
  shape.scale = q.scale;
  QuantKeys quant;
  if (tier) {
    quant = quant_keys(*tier);
    shape.quant = tier->tokens;
  }
  shape.held = held.n_tokens;
  shape.tail = n_tail;
  CudaWorkspace& w = cuda_workspace(ws);
  const size_t need = column_sums_workspace(shape, kMaxScoreLogits);
  if (need > w.score_floats) {
    void* grown = nullptr;
    check_cuda(cudaMalloc(&grown, need * sizeof(float)), "cudaMalloc (scoring workspace)");
    if (w.scores) cudaFree(w.scores);
    w.scores = static_cast<float*>(grown);
    w.score_floats = need;
  }
  column_sums(q.q, q.positions, quant, held.k, held.positions, tail, tail_pos, shape,
              kMaxScoreLogits, w.scores, col_sums, compute_stream());
}

// SpeCache's selection scores over a device copy (cuda_column_sums.h key_scores: the logits of
// column_sums_rows, the reference's bits) straight into the caller's [rows][n] buffer.
void specache_scores_tier(const backend::QueryRows& q, const backend::KiviTier& tier,
                          const backend::F16Rows& residual, backend::Workspace&, float* scores) {
  ColumnSumsShape shape;
  shape.rows = q.n_rows;
  shape.dim = q.dim;
  shape.scale = q.scale;
  shape.quant = tier.tokens;
  shape.held = residual.n_tokens;
  key_scores(q.q, q.positions, quant_keys(tier), residual.k, residual.positions, nullptr, nullptr,
             shape, scores, compute_stream());
}

// SpeCache's selection and hit-rate share over device scores (cuda_specache_select.h: the
// reference's bits), on the compute stream.
void specache_select_tier(float* scores, size_t group, size_t n, size_t k, backend::Workspace& ws,
                          uint32_t* tokens) {
  CudaWorkspace& w = cuda_workspace(ws);
  const size_t work = specache_select_work_bytes(group);
  const size_t need = work + std::max<size_t>(n, 1) * sizeof(float);
  if (need > w.select_bytes) {
    void* grown = nullptr;
    check_cuda(cudaMalloc(&grown, need), "cudaMalloc (SpeCache selection workspace)");
    if (w.select) cudaFree(w.select);
    w.select = grown;
    w.select_bytes = need;
  }
  float* avg = reinterpret_cast<float*>(static_cast<char*>(w.select) + work);
  specache_select_tokens(scores, group, n, k, w.select, avg, tokens, compute_stream());
}
void specache_shares_tier(const float* scores, size_t rows, size_t n, const uint32_t* tokens,
                          size_t n_tokens, float* shares) {
  specache_fetched_shares(scores, rows, n, tokens, n_tokens, shares, compute_stream());
}

// SmallKV (docs/papers.md) Eq. 6 over device buffers (cuda_smallkv.h), on the compute stream.
// The proxy's probabilities: the reference's bits (cpu::smallkv_softmax_rows), out [rows][n].
void smallkv_softmax_entry(const backend::QueryRows& q, const uint16_t* k,
                           const int32_t* positions, size_t n, backend::Workspace&, float* out) {
  cuda::smallkv_softmax(q.q, q.positions, q.n_rows, k, positions, n, q.dim, q.scale, out,
                        compute_stream());
}

// The marginal term alone on `out` (the full rows' attention): the reference's bits for the
// same `out` (cpu::smallkv_add_marginal).
void smallkv_add_marginal_entry(const backend::QueryRows& q, const backend::SmallKvMarginal& m,
                                backend::Workspace&, float* out) {
  cuda::smallkv_add_marginal(q.positions, q.n_rows, q.dim, m.v, m.positions, m.n_tokens,
                             m.weights, m.weights_stride, out, compute_stream());
}

// The large model's attention over its full rows (attend_f16's split-K kernel: the reference's
// one-chunk OnlineAttention within the decode kernel's tolerance, not its bits), then the
// marginal term. So attend_smallkv with marginal rows is bit for bit attend_smallkv without them
// followed by smallkv_add_marginal, as the contract requires; with none it is plain attention
// over the full rows (the reference skips the rescale by 1 likewise).
void attend_smallkv(const backend::QueryRows& q, const backend::F16Rows& full,
                    const backend::SmallKvMarginal& m, backend::Workspace& ws, float* out) {
  attend_tiers(q, nullptr, exact_view(full), ws, out);
  if (m.n_tokens > 0) smallkv_add_marginal_entry(q, m, ws, out);
}

// Conversion and KIVI quantization over device buffers, on the compute stream: a device KIVI
// store quantizes the residual rows it flushes where they are (src/repr/device_kivi.h). The
// kernels give the CPU's bits (cuda_kivi_quant.h); one key block per call, as the CPU entry.
void f16_to_f32_entry(const uint16_t* src, size_t n, float* dst) {
  f16_to_f32(src, n, dst, compute_stream());
}
void kivi_quantize_keys_entry(const float* k, size_t n_tokens, size_t dim, uint32_t bits,
                              uint8_t* codes, uint16_t* scale, uint16_t* zero) {
  kivi_quantize_keys(k, 1, n_tokens, dim, bits, codes, scale, zero, compute_stream());
}
void kivi_quantize_values_entry(const float* v, size_t n_tokens, size_t dim, size_t group,
                                uint32_t bits, uint8_t* codes, uint16_t* scale, uint16_t* zero) {
  kivi_quantize_values(v, n_tokens, dim, group, bits, codes, scale, zero, compute_stream());
}

void require_device(int32_t device) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    fail(KVSDK_E_BACKEND, "no CUDA device is available (",
         err != cudaSuccess ? cudaGetErrorString(err) : "device count is 0", ")");
  }
  if (device < 0 || device >= count) {
    fail(KVSDK_E_INVALID_ARG, "options.device is ", device, " but ", count,
         " CUDA device(s) are present");
  }
}

int32_t select_device(int32_t device) {
  int current = 0;
  check_cuda(cudaGetDevice(&current), "cudaGetDevice");
  if (current != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
  return current;
}

// Entries without a device kernel yet: each throws KVSDK_E_UNSUPPORTED (the cache refuses the
// policies that need them first, so this is a second line of defence, not a path users take).
template <class F>
struct Refuse;
template <class R, class... A>
struct Refuse<R (*)(A...)> {
  static R call(A...) {
    fail(KVSDK_E_UNSUPPORTED, "the CUDA backend has no kernel for this operation yet "
         "(docs/gpu.md lists what runs on CUDA)");
  }
};
template <class F>
void refuse(F& entry) {
  entry = &Refuse<F>::call;
}

backend::Ops make_ops() {
  backend::Ops ops{};
  ops.name = "cuda";
  ops.device_memory = true;
  ops.alloc = device_alloc;
  ops.free = device_free;
  ops.to_backend = to_device;
  ops.to_backend_many = copy_many_to_device;
  ops.to_host = to_host;
  ops.copy = device_copy;
  ops.workspace_create = workspace_create;
  ops.workspace_destroy = workspace_destroy;
  ops.attend_f16 = attend_f16;
  ops.attend_kivi_tier = attend_kivi_tier;
  ops.column_sums_rows = column_sums_rows;
  ops.attend_specache_tier = attend_specache_tier;
  ops.attend_minicache_tier = attend_minicache_tier;
  ops.specache_scores_tier = specache_scores_tier;
  ops.specache_select_tier = specache_select_tier;
  ops.specache_shares_tier = specache_shares_tier;
  ops.f16_to_f32 = f16_to_f32_entry;
  ops.kivi_quantize_keys = kivi_quantize_keys_entry;
  ops.kivi_quantize_values = kivi_quantize_values_entry;
  ops.smallkv_softmax = smallkv_softmax_entry;  // SmallKV (Eq. 6)
  ops.attend_smallkv = attend_smallkv;
  ops.smallkv_add_marginal = smallkv_add_marginal_entry;
  refuse(ops.f32_to_f16);
  refuse(ops.kivi_dequantize_keys), refuse(ops.kivi_dequantize_values);
  refuse(ops.attend_kivi), refuse(ops.attend_spindle), refuse(ops.attend_minicache);
  refuse(ops.attend_minicache_kivi), refuse(ops.attend_specache);
  refuse(ops.column_sums), refuse(ops.pool), refuse(ops.select_keep), refuse(ops.gather_rows);
  refuse(ops.codebook_reconstruct), refuse(ops.merge_slerp), refuse(ops.restore_row);
  refuse(ops.specache_select), refuse(ops.attend_specache_scored);
  refuse(ops.specache_select_scored);
  return ops;
}

}  // namespace

const backend::DeviceBackend& device_backend() {
  static const backend::Ops ops = make_ops();
  static const backend::DeviceBackend backend{&ops,         require_device, select_device,
                                              queue_create, queue_destroy,  bind_queue};
  return backend;
}

}  // namespace kvsdk::cuda
