#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <type_traits>

#include "cuda_check.h"
#include "cuda_decode_attention.h"
#include "cuda_launch.h"
#include "kivi_device.cuh"

namespace kvsdk::cuda {

namespace {

using namespace detail;

constexpr int kWarps = 4;  // warps per block; each walks every kWarps-th token of the split
constexpr int kMaxG = int(kDecodeMaxGroup);

// Partials of one (sequence, query head): [splits] maxima, [splits] sums, [splits][dim] values.
struct Partials {
  float* m;
  float* l;
  float* acc;
  size_t splits;  // total splits over all tiers
};

// Loads a lane's EPL consecutive channels of one f16 row with one vector load.
template <int EPL>
__device__ __forceinline__ void load_f16(const uint16_t* row, int lane, float (&out)[EPL]) {
  const uint16_t* p = row + lane * EPL;
  if constexpr (EPL == 2) {
    const __half2 h = *reinterpret_cast<const __half2*>(p);
    out[0] = __low2float(h);
    out[1] = __high2float(h);
  } else {
    // 4 halves = 8 bytes, 8 halves = 16 bytes: one vector load, then the register reinterpreted
    // as halves by memcpy (register moves on the device). Reading the uint2/uint4 through a
    // __half2 pointer breaks strict aliasing: GCC at -O2 read garbage there in the host shim's
    // optimized build (dims 128 and 256 gave zeros), and LLVM-based device compilers may too.
    using Vec = typename std::conditional<EPL == 4, uint2, uint4>::type;
    const Vec raw = *reinterpret_cast<const Vec*>(p);
    __half2 h[EPL / 2];
    memcpy(h, &raw, sizeof raw);
#pragma unroll
    for (int j = 0; j < EPL / 2; ++j) {
      out[2 * j] = __low2float(h[j]);
      out[2 * j + 1] = __high2float(h[j]);
    }
  }
}

// Rows beyond a query's position are masked (the tier's positions; none: every row is seen).
__device__ __forceinline__ int32_t row_position(const int32_t* positions, size_t index) {
  return positions ? positions[index] : INT32_MIN;
}

struct ExactLoader {
  ExactTierView t;
  size_t dim;
  __device__ int32_t position(size_t head, size_t tok) const {
    return row_position(t.positions, head * t.capacity + tok);
  }
  template <int EPL>
  __device__ void key(size_t head, size_t tok, int lane, float (&out)[EPL]) const {
    load_f16<EPL>(t.k + (head * t.capacity + tok) * dim, lane, out);
  }
  template <int EPL>
  __device__ void value(size_t head, size_t tok, int lane, float (&out)[EPL]) const {
    load_f16<EPL>(t.v + (head * t.capacity + tok) * dim, lane, out);
  }
};

// Fused KIVI dequantization: codes are unpacked and scaled in registers. Index arithmetic is 32-bit
// with the per-tier quotients computed once on the host (make_kivi_loader): the first GPU run
// measured this loader at 0.41x the f16 one when it divided 64-bit integers per token and channel.
struct KiviLoader {
  KiviTierView t;
  uint32_t dim;
  uint32_t row_bytes;        // (dim * bits + 7) / 8
  uint32_t n_groups;         // value groups per row: ceil(dim / G)
  uint32_t head_blocks;      // key blocks per head without block_starts: capacity / G
  int32_t group_shift;       // log2(G) when G is a power of two, else -1
  __device__ uint32_t div_group(uint32_t x) const {
    return group_shift >= 0 ? x >> group_shift : x / t.group;
  }
  // The key block (row of k_scale/k_zero) of a head's quantized token: token / G, or with ragged
  // blocks the last block starting at or before it (a binary search; every lane of the warp
  // reads the same entries).
  __device__ size_t key_block(size_t head, size_t tok) const {
    if (!t.block_starts) return head * head_blocks + div_group(uint32_t(tok));
    const uint32_t* s = t.block_starts + head * t.block_stride;
    uint32_t lo = 0, hi = uint32_t(t.blocks);  // s[lo] <= tok < s[hi] (s[blocks] = infinity)
    while (hi - lo > 1) {
      const uint32_t mid = (lo + hi) / 2;
      if (s[mid] <= tok) lo = mid;
      else hi = mid;
    }
    return head * t.block_stride + lo;
  }
  __device__ int32_t position(size_t head, size_t tok) const {
    return row_position(t.positions, head * t.capacity + tok);
  }
  template <int EPL>
  __device__ void key(size_t head, size_t tok, int lane, float (&out)[EPL]) const {
    const uint8_t* row = t.k_codes + (head * t.capacity + tok) * row_bytes;
    const size_t block = key_block(head, tok);
    const uint16_t* s = t.k_scale + block * dim;
    const uint16_t* z = t.k_zero + block * dim;
#pragma unroll
    for (int j = 0; j < EPL; ++j) {
      const uint32_t c = uint32_t(lane * EPL + j);
      out[j] = kivi_dequant(kivi_unpack_code(row, c, t.bits), f16_bits_to_f32(s[c]),
                            f16_bits_to_f32(z[c]));
    }
  }
  template <int EPL>
  __device__ void value(size_t head, size_t tok, int lane, float (&out)[EPL]) const {
    const size_t r = head * t.capacity + tok;
    const uint8_t* row = t.v_codes + r * row_bytes;
    const uint16_t* s = t.v_scale + r * n_groups;
    const uint16_t* z = t.v_zero + r * n_groups;
#pragma unroll
    for (int j = 0; j < EPL; ++j) {
      const uint32_t c = uint32_t(lane * EPL + j);
      const uint32_t g = div_group(c);
      out[j] = kivi_dequant(kivi_unpack_code(row, c, t.bits), f16_bits_to_f32(s[g]),
                            f16_bits_to_f32(z[g]));
    }
  }
};

KiviLoader make_kivi_loader(const KiviTierView& t, size_t dim) {
  KiviLoader l;
  l.t = t;
  l.dim = uint32_t(dim);
  l.row_bytes = uint32_t((dim * t.bits + 7) / 8);
  l.n_groups = uint32_t((dim + t.group - 1) / t.group);
  l.head_blocks = uint32_t(t.capacity / t.group);
  l.group_shift = -1;
  for (int32_t b = 0; b < 32; ++b) {
    if (t.group == (1u << b)) l.group_shift = b;
  }
  return l;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Grid (split, kv head, sequence); kWarps warps. Writes this split's partial for every query head
// of the group at column `split_base + blockIdx.x` of the partials.
template <int EPL, class Loader>
__global__ void __launch_bounds__(kWarps * 32)
    decode_split_kernel(const float* q, const int32_t* q_pos, Loader loader, size_t kv_heads,
                        int group, bool shared_rows, size_t tokens, size_t split_tokens,
                        size_t split_base, float scale, Partials part) {
  constexpr int kDim = EPL * 32;
  __shared__ float s_m[kWarps][kMaxG], s_l[kWarps][kMaxG];
  __shared__ float s_acc[kWarps][kMaxG][kDim];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t kvh = blockIdx.y, seq = blockIdx.z;
  const size_t head = shared_rows ? kvh : seq * kv_heads + kvh;  // whose rows
  const size_t first = size_t(blockIdx.x) * split_tokens;
  const size_t last = min(tokens, first + split_tokens);

  float qr[kMaxG][EPL], m[kMaxG], l[kMaxG], acc[kMaxG][EPL];
  int32_t qp[kMaxG];
#pragma unroll
  for (int g = 0; g < kMaxG; ++g) {
    qp[g] = q_pos && g < group ? q_pos[(seq * kv_heads + kvh) * group + g] : INT32_MAX;
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int j = 0; j < EPL; ++j) {
      acc[g][j] = 0.0f;
      qr[g][j] = g < group ? q[((seq * kv_heads + kvh) * group + g) * kDim + lane * EPL + j] : 0.f;
    }
  }
  for (size_t tok = first + warp; tok < last; tok += kWarps) {
    float k[EPL], v[EPL];
    loader.template key<EPL>(head, tok, lane, k);
    loader.template value<EPL>(head, tok, lane, v);
    const int32_t tok_pos = loader.position(head, tok);
#pragma unroll
    for (int g = 0; g < kMaxG; ++g) {
      if (g >= group) break;
      if (tok_pos > qp[g]) continue;  // the same for every lane of the warp: no divergence
      float d = 0.0f;
#pragma unroll
      for (int j = 0; j < EPL; ++j) d += qr[g][j] * k[j];
      const float s = warp_sum(d) * scale;
      const float m_new = fmaxf(m[g], s);
      const float c = expf(m[g] - m_new);  // 0 on the first token (m = -inf)
      const float p = expf(s - m_new);
      l[g] = l[g] * c + p;
#pragma unroll
      for (int j = 0; j < EPL; ++j) acc[g][j] = acc[g][j] * c + p * v[j];
      m[g] = m_new;
    }
  }
  // Merge the warps' states through shared memory.
#pragma unroll
  for (int g = 0; g < kMaxG; ++g) {
    if (g >= group) break;
    if (lane == 0) {
      s_m[warp][g] = m[g];
      s_l[warp][g] = l[g];
    }
#pragma unroll
    for (int j = 0; j < EPL; ++j) s_acc[warp][g][lane * EPL + j] = acc[g][j];
  }
  __syncthreads();
  const size_t col = split_base + blockIdx.x;
  for (int i = threadIdx.x; i < group * kDim; i += blockDim.x) {
    const int g = i / kDim, d = i % kDim;
    float mx = -INFINITY;
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, s_m[w][g]);
    float sum = 0.0f, a = 0.0f;
    if (mx != -INFINITY) {
      for (int w = 0; w < kWarps; ++w) {
        const float c = expf(s_m[w][g] - mx);
        sum += s_l[w][g] * c;
        a += s_acc[w][g][d] * c;
      }
    }
    const size_t row = (seq * kv_heads + kvh) * group + g;  // query head row
    part.acc[(row * part.splits + col) * kDim + d] = a;
    if (d == 0) {
      part.m[row * part.splits + col] = mx;
      part.l[row * part.splits + col] = sum;
    }
  }
}

// One block per query head row: merges its splits into the normalised output.
__global__ void decode_reduce_kernel(Partials part, size_t dim, float* out) {
  const size_t row = blockIdx.x;
  const float* m = part.m + row * part.splits;
  const float* l = part.l + row * part.splits;
  float mx = -INFINITY;
  for (size_t s = 0; s < part.splits; ++s) mx = fmaxf(mx, m[s]);
  float sum = 0.0f;
  if (mx != -INFINITY) {
    for (size_t s = 0; s < part.splits; ++s) sum += l[s] * expf(m[s] - mx);
  }
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  for (size_t d = threadIdx.x; d < dim; d += blockDim.x) {
    float a = 0.0f;
    if (mx != -INFINITY) {
      for (size_t s = 0; s < part.splits; ++s) {
        a += part.acc[(row * part.splits + s) * dim + d] * expf(m[s] - mx);
      }
    }
    out[row * dim + d] = a * inv;
  }
}

template <class Loader>
void launch_splits(const float* q, const int32_t* q_pos, const DecodeShape& sh,
                   const Loader& loader, size_t tokens, size_t splits, size_t split_tokens,
                   size_t split_base, const Partials& part, cudaStream_t stream) {
  if (splits == 0) return;
  const dim3 grid(unsigned(splits), unsigned(sh.kv_heads), unsigned(sh.batch));
  const int group = int(sh.group);
  // One pointer per head dim (a template instance with two arguments is not one macro argument).
  void (*kernel)(const float*, const int32_t*, Loader, size_t, int, bool, size_t, size_t, size_t,
                 float, Partials) =
      sh.dim == 64    ? decode_split_kernel<2, Loader>
      : sh.dim == 128 ? decode_split_kernel<4, Loader>
                      : decode_split_kernel<8, Loader>;
  KVSDK_LAUNCH(kernel, grid, kWarps * 32, 0, stream, q, q_pos, loader, sh.kv_heads, group,
               sh.shared_rows, tokens, split_tokens, split_base, sh.scale, part);
  check_launch("decode_split_kernel");
}

void check_shape(const DecodeShape& s) {
  KVSDK_REQUIRE(s.batch > 0 && s.kv_heads > 0, "decode attention: batch and kv_heads must be > 0");
  KVSDK_REQUIRE(s.group >= 1 && s.group <= kDecodeMaxGroup, "decode attention: group ", s.group,
                " is outside 1..", kDecodeMaxGroup);
  KVSDK_REQUIRE(s.dim == 64 || s.dim == 128 || s.dim == 256, "decode attention: head_dim ", s.dim,
                " is not 64, 128 or 256");
  KVSDK_REQUIRE(s.batch < 65536 && s.kv_heads < 65536, "decode attention: batch and kv_heads ",
                "must be < 65536 (grid limits)");
}

size_t div_up(size_t a, size_t b) { return (a + b - 1) / b; }

}  // namespace

DecodePlan plan_decode(const DecodeShape& shape, size_t kivi_tokens, size_t exact_tokens,
                       size_t split_tokens) {
  check_shape(shape);
  const size_t tokens = kivi_tokens + exact_tokens;
  if (split_tokens == 0) {
    int device = 0, sms = 1;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
               "cudaDeviceGetAttribute");
    const size_t heads = shape.batch * shape.kv_heads;
    const size_t want_splits = std::max<size_t>(1, div_up(2 * size_t(sms), heads));
    split_tokens = std::max<size_t>(64, div_up(std::max<size_t>(tokens, 1), want_splits));
  }
  DecodePlan p;
  p.kivi_split_tokens = p.exact_split_tokens = split_tokens;
  p.kivi_splits = div_up(kivi_tokens, split_tokens);
  p.exact_splits = div_up(exact_tokens, split_tokens);
  KVSDK_REQUIRE(p.kivi_splits + p.exact_splits < 65536, "decode attention: ",
                p.kivi_splits + p.exact_splits, " splits exceed the grid; use longer splits");
  const size_t rows = shape.batch * shape.kv_heads * shape.group;
  const size_t splits = std::max<size_t>(1, p.kivi_splits + p.exact_splits);
  const size_t ml = div_up(rows * splits, 4) * 4;  // keep acc 16-byte aligned
  p.workspace_bytes = sizeof(float) * (2 * ml + rows * splits * shape.dim);
  return p;
}

void decode_attention(const float* q, const DecodeShape& shape, const KiviTierView* kivi,
                      const ExactTierView* exact, const DecodePlan& plan, void* workspace,
                      float* out, cudaStream_t stream, const int32_t* q_positions) {
  check_shape(shape);
  KVSDK_REQUIRE(kivi || exact, "decode attention needs at least one tier");
  const size_t kivi_tokens = kivi ? kivi->tokens : 0, exact_tokens = exact ? exact->tokens : 0;
  KVSDK_REQUIRE(div_up(kivi_tokens, std::max<size_t>(plan.kivi_split_tokens, 1)) ==
                        plan.kivi_splits &&
                    div_up(exact_tokens, std::max<size_t>(plan.exact_split_tokens, 1)) ==
                        plan.exact_splits,
                "decode attention: the plan was made for other token counts");
  if (kivi) {
    KVSDK_REQUIRE(kivi->bits == 1 || kivi->bits == 2 || kivi->bits == 4 || kivi->bits == 8,
                  "decode attention: KIVI bits ", kivi->bits, " is not 1, 2, 4 or 8");
    KVSDK_REQUIRE(kivi->capacity <= UINT32_MAX, "decode attention: a KIVI tier of ",
                  kivi->capacity, " tokens per head (the kernel indexes tokens with 32 bits)");
    if (kivi->block_starts) {
      KVSDK_REQUIRE(kivi->group > 0 && kivi->capacity >= kivi->tokens &&
                        kivi->block_stride >= kivi->blocks && (kivi->blocks > 0 || !kivi->tokens),
                    "decode attention: ragged KIVI tier with ", kivi->blocks, " blocks (stride ",
                    kivi->block_stride, ") for ", kivi->tokens, " tokens");
    } else {
      KVSDK_REQUIRE(kivi->group > 0 && kivi->tokens % kivi->group == 0 &&
                        kivi->capacity % kivi->group == 0 && kivi->capacity >= kivi->tokens,
                    "decode attention: KIVI tokens/capacity must be multiples of G = ",
                    kivi->group);
    }
  }
  if (exact) {
    KVSDK_REQUIRE(exact->capacity >= exact->tokens, "decode attention: exact capacity ",
                  exact->capacity, " < tokens ", exact->tokens);
  }
  const size_t rows = shape.batch * shape.kv_heads * shape.group;
  Partials part;
  part.splits = std::max<size_t>(1, plan.kivi_splits + plan.exact_splits);
  const size_t ml = div_up(rows * part.splits, 4) * 4;
  part.m = static_cast<float*>(workspace);
  part.l = part.m + ml;
  part.acc = part.l + ml;
  if (plan.kivi_splits + plan.exact_splits == 0) {  // no token at all: zeros (all-zero bits)
    check_cuda(cudaMemsetAsync(out, 0, rows * shape.dim * sizeof(float), stream),
               "cudaMemsetAsync");
    return;
  }
  if (kivi && plan.kivi_splits) {
    launch_splits(q, q_positions, shape, make_kivi_loader(*kivi, shape.dim), kivi_tokens,
                  plan.kivi_splits,
                  plan.kivi_split_tokens, 0, part, stream);
  }
  if (exact && plan.exact_splits) {
    launch_splits(q, q_positions, shape, ExactLoader{*exact, shape.dim}, exact_tokens,
                  plan.exact_splits,
                  plan.exact_split_tokens, plan.kivi_splits, part, stream);
  }
  KVSDK_LAUNCH(decode_reduce_kernel, unsigned(rows), 128, 0, stream, part, shape.dim, out);
  check_launch("decode_reduce_kernel");
}

}  // namespace kvsdk::cuda
