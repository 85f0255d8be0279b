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

// f16 -> f32 for arithmetic on stored scales and zero points (a NaN's payload cannot matter
// there; detail::f16_bits_to_f32 keeps it, at a branch per conversion).
__device__ __forceinline__ float f16_arith(uint16_t h) { return __half2float(__ushort_as_half(h)); }

struct ExactLoader {
  ExactTierView t;
  size_t dim;
  template <int EPL>
  struct Cursor {};  // nothing carried from token to token
  __device__ int32_t position(size_t head, size_t tok) const {
    return row_position(t.positions, head * t.capacity + tok);
  }
  template <int EPL>
  __device__ void key(size_t head, size_t tok, int lane, Cursor<EPL>&, float (&out)[EPL]) const {
    load_f16<EPL>(t.k + (head * t.capacity + tok) * dim, lane, out);
  }
  template <int EPL>
  __device__ void value(size_t head, size_t tok, int lane, float (&out)[EPL]) const {
    load_f16<EPL>(t.v + (head * t.capacity + tok) * dim, lane, out);
  }
};

// Fused KIVI dequantization: codes are unpacked and scaled in registers. Index arithmetic is 32-bit
// with the per-tier quotients computed once on the host (make_kivi_loader). The GPU runs of
// 2026-11-28 measured this kernel at 0.41-0.68x the f16 one while its loader divided 64-bit
// integers per token and channel and loaded every code, scale and zero point on its own (about 24
// loads per token and lane); removing the divisions alone gave 0.43x at 4k tokens.
// Now a lane loads its EPL codes of a row as one word (1-8 bytes), a key block's scales and zero
// points once per block (the cursor: a warp walks its tokens in order), and a value row's one
// scale and zero point when its EPL channels share a group.
struct KiviLoader {
  KiviTierView t;
  uint32_t dim;
  uint32_t row_bytes;        // (dim * bits + 7) / 8
  uint32_t n_groups;         // value groups per row: ceil(dim / G)
  uint32_t head_blocks;      // key blocks per head without block_starts: capacity / G
  int32_t group_shift;       // log2(G) when G is a power of two, else -1
  template <int EPL>
  struct Cursor {
    uint32_t first = 1, end = 0;  // quantized tokens [first, end) of the cached block (none)
    float s[EPL], z[EPL];         // its scales and zero points of this lane's channels
  };
  __device__ uint32_t div_group(uint32_t x) const {
    return group_shift >= 0 ? x >> group_shift : x / t.group;
  }
  __device__ int32_t position(size_t head, size_t tok) const {
    return row_position(t.positions, head * t.capacity + tok);
  }
  // This lane's EPL codes of a packed row: EPL * bits consecutive bits starting at a multiple of
  // EPL * bits, so within one byte below 8 bits and whole bytes from 8 on.
  template <int EPL>
  __device__ void codes(const uint8_t* row, int lane, uint32_t (&out)[EPL]) const {
    const uint32_t bits = t.bits, first_bit = uint32_t(lane) * EPL * bits;
    const uint8_t* p = row + (first_bit >> 3);
    const uint32_t n_bytes = (EPL * bits + 7) / 8;
    uint64_t word = 0;
#pragma unroll
    for (uint32_t i = 0; i < uint32_t(EPL); ++i) {  // n_bytes <= EPL (bits <= 8)
      if (i < n_bytes) word |= uint64_t(p[i]) << (8 * i);
    }
    word >>= (first_bit & 7u);
    const uint32_t mask = (1u << bits) - 1u;
#pragma unroll
    for (int j = 0; j < EPL; ++j) out[j] = uint32_t(word >> (uint32_t(j) * bits)) & mask;
  }
  // The key block of a head's quantized token: [b * G, (b + 1) * G), or with ragged blocks the
  // last block starting at or before it (a binary search; every lane of the warp reads the same
  // entries). Reloads the cursor's scales and zero points when the token left its block.
  template <int EPL>
  __device__ void seek_block(size_t head, uint32_t tok, int lane, Cursor<EPL>& c) const {
    if (tok >= c.first && tok < c.end) return;
    size_t block;
    if (!t.block_starts) {
      const uint32_t b = div_group(tok);
      block = head * head_blocks + b;
      c.first = b * t.group;
      c.end = c.first + t.group;
    } else {
      const uint32_t* s = t.block_starts + head * t.block_stride;
      uint32_t lo = 0, hi = uint32_t(t.blocks);  // s[lo] <= tok < s[hi] (s[blocks] = infinity)
      while (hi - lo > 1) {
        const uint32_t mid = (lo + hi) / 2;
        if (s[mid] <= tok) lo = mid;
        else hi = mid;
      }
      block = head * t.block_stride + lo;
      c.first = s[lo];
      c.end = lo + 1 < t.blocks ? s[lo + 1] : UINT32_MAX;
    }
    const uint16_t* sc = t.k_scale + block * dim + uint32_t(lane) * EPL;
    const uint16_t* zp = t.k_zero + block * dim + uint32_t(lane) * EPL;
#pragma unroll
    for (int j = 0; j < EPL; ++j) {
      c.s[j] = f16_arith(sc[j]);
      c.z[j] = f16_arith(zp[j]);
    }
  }
  template <int EPL>
  __device__ void key(size_t head, size_t tok, int lane, Cursor<EPL>& c, float (&out)[EPL]) const {
    seek_block(head, uint32_t(tok), lane, c);
    uint32_t code[EPL];
    codes<EPL>(t.k_codes + (head * t.capacity + tok) * row_bytes, lane, code);
#pragma unroll
    for (int j = 0; j < EPL; ++j) out[j] = kivi_dequant(code[j], c.s[j], c.z[j]);
  }
  template <int EPL>
  __device__ void value(size_t head, size_t tok, int lane, float (&out)[EPL]) const {
    const size_t r = head * t.capacity + tok;
    uint32_t code[EPL];
    codes<EPL>(t.v_codes + r * row_bytes, lane, code);
    const uint16_t* s = t.v_scale + r * n_groups;
    const uint16_t* z = t.v_zero + r * n_groups;
    const uint32_t c0 = uint32_t(lane) * EPL;
    if (t.group % EPL == 0) {  // the lane's channels lie in one group (G = 32: always)
      const uint32_t g = div_group(c0);
      const float sg = f16_arith(s[g]), zg = f16_arith(z[g]);
#pragma unroll
      for (int j = 0; j < EPL; ++j) out[j] = kivi_dequant(code[j], sg, zg);
    } else {
#pragma unroll
      for (int j = 0; j < EPL; ++j) {
        const uint32_t g = div_group(c0 + uint32_t(j));
        out[j] = kivi_dequant(code[j], f16_arith(s[g]), f16_arith(z[g]));
      }
    }
  }
};

// MiniCache's rows restored in registers: a retained token's f16 row as ExactLoader loads it, a
// merged token's f16 direction times its layer's f32 magnitude, the bits of the CPU's
// MergedLayerPair::reconstruct (exact f16 -> f32, one rounded multiply). The slot is the same for
// every lane of the warp (one token), so the branch does not diverge. One head's rows only.
struct MiniCacheLoader {
  MiniCacheTierView t;
  size_t dim;
  template <int EPL>
  struct Cursor {};
  __device__ int32_t position(size_t, size_t tok) const { return row_position(t.positions, tok); }
  template <int EPL>
  __device__ void row(const MiniCacheTensorView& x, size_t tok, int lane, float (&out)[EPL]) const {
    const uint32_t s = x.slots[tok];
    if (s & kMiniCacheRetained) {
      load_f16<EPL>(x.retained + size_t(s & ~kMiniCacheRetained) * dim, lane, out);
      return;
    }
    load_f16<EPL>(x.directions + size_t(s) * dim, lane, out);
    const float m = x.magnitudes[s];
#pragma unroll
    for (int j = 0; j < EPL; ++j) out[j] *= m;
  }
  template <int EPL>
  __device__ void key(size_t, size_t tok, int lane, Cursor<EPL>&, float (&out)[EPL]) const {
    row<EPL>(t.k, tok, lane, out);
  }
  template <int EPL>
  __device__ void value(size_t, size_t tok, int lane, float (&out)[EPL]) const {
    row<EPL>(t.v, tok, lane, out);
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

// A warp's walk through a tier's TokenExclusion: its tokens come in ascending order, so the list
// is searched once (for the warp's first token of the split) and then only stepped forward.
// Every lane reads the same entries: the answers are uniform over the warp.
struct ExclusionCursor {
  const uint32_t* list;  // null: nothing excluded
  size_t n, at;
  uint32_t base;
  __device__ ExclusionCursor(const TokenExclusion& x, size_t first)
      : list(x.exclude), n(x.n_exclude), at(0), base(x.exclude_base) {
    if (!list) return;
    const uint32_t key = uint32_t(first) + base;
    size_t hi = n;  // the first entry >= key
    while (at < hi) {
      const size_t mid = (at + hi) / 2;
      if (list[mid] < key) at = mid + 1;
      else hi = mid;
    }
  }
  // Whether token `tok` is left out; tokens must be asked in ascending order.
  __device__ bool skips(size_t tok) {
    if (!list) return false;
    const uint32_t key = uint32_t(tok) + base;
    while (at < n && list[at] < key) ++at;
    return at < n && list[at] == key;
  }
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Grid (split, kv head, sequence); kWarps warps. Writes this split's partial for every query head
// of the group at column `split_base + blockIdx.x` of the partials. Each warp takes two tokens
// per step (kWarps apart), loading both before it scores either: two rows in flight per warp.
// MaxG (4 or 8) bounds the query heads per KV head the registers hold: with 8 for every group the
// dim-128 kernels needed 128 (f16) / 154 (KIVI) registers a thread, which leaves room for three
// or four blocks an SM; Llama-like models have groups of 4.
// Tokens in `skip` are seen by no query row (a pair of them is not even loaded).
template <int EPL, int MaxG, class Loader>
__global__ void __launch_bounds__(kWarps * 32)
    decode_split_kernel(const float* q, const int32_t* q_pos, Loader loader, size_t kv_heads,
                        int group, bool shared_rows, size_t tokens, size_t split_tokens,
                        size_t split_base, float scale, TokenExclusion skip, Partials part) {
  constexpr int kDim = EPL * 32;
  __shared__ float s_m[kWarps][MaxG], s_l[kWarps][MaxG];
  __shared__ float s_acc[kWarps][MaxG][kDim];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t kvh = blockIdx.y, seq = blockIdx.z;
  const size_t head = shared_rows ? kvh : seq * kv_heads + kvh;  // whose rows
  const size_t first = size_t(blockIdx.x) * split_tokens;
  const size_t last = min(tokens, first + split_tokens);

  float qr[MaxG][EPL], m[MaxG], l[MaxG], acc[MaxG][EPL];
  int32_t qp[MaxG];
#pragma unroll
  for (int g = 0; g < MaxG; ++g) {
    qp[g] = q_pos && g < group ? q_pos[(seq * kv_heads + kvh) * group + g] : INT32_MAX;
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int j = 0; j < EPL; ++j) {
      acc[g][j] = 0.0f;
      qr[g][j] = g < group ? q[((seq * kv_heads + kvh) * group + g) * kDim + lane * EPL + j] : 0.f;
    }
  }
  typename Loader::template Cursor<EPL> cursor;
  ExclusionCursor excluded(skip, first + warp);
  for (size_t tok = first + warp; tok < last; tok += 2 * kWarps) {
    const size_t tok1 = tok + kWarps;
    const bool two = tok1 < last;  // the same for every lane of the warp
    const bool skip0 = excluded.skips(tok), skip1 = two && excluded.skips(tok1);
    if (skip0 && (skip1 || !two)) continue;
    float k0[EPL], v0[EPL], k1[EPL], v1[EPL];
    loader.template key<EPL>(head, tok, lane, cursor, k0);
    loader.template value<EPL>(head, tok, lane, v0);
    if (two) {
      loader.template key<EPL>(head, tok1, lane, cursor, k1);
      loader.template value<EPL>(head, tok1, lane, v1);
    } else {
#pragma unroll
      for (int j = 0; j < EPL; ++j) k1[j] = v1[j] = 0.0f;
    }
    const int32_t pos0 = loader.position(head, tok);
    const int32_t pos1 = two ? loader.position(head, tok1) : INT32_MAX;
#pragma unroll
    for (int g = 0; g < MaxG; ++g) {
      if (g >= group) break;
      // (Uniform over the warp.)
      const bool see0 = !skip0 && pos0 <= qp[g], see1 = two && !skip1 && pos1 <= qp[g];
      if (!see0 && !see1) continue;
      float d0 = 0.0f, d1 = 0.0f;
#pragma unroll
      for (int j = 0; j < EPL; ++j) {
        d0 += qr[g][j] * k0[j];
        d1 += qr[g][j] * k1[j];
      }
      const float s0 = see0 ? warp_sum(d0) * scale : -INFINITY;
      const float s1 = see1 ? warp_sum(d1) * scale : -INFINITY;
      const float m_new = fmaxf(m[g], fmaxf(s0, s1));  // finite: one of them is seen
      const float c = expf(m[g] - m_new);               // 0 on the first tokens (m = -inf)
      const float p0 = see0 ? expf(s0 - m_new) : 0.0f;
      const float p1 = see1 ? expf(s1 - m_new) : 0.0f;
      l[g] = l[g] * c + p0 + p1;
#pragma unroll
      for (int j = 0; j < EPL; ++j) acc[g][j] = acc[g][j] * c + p0 * v0[j] + p1 * v1[j];
      m[g] = m_new;
    }
  }
  // Merge the warps' states through shared memory.
#pragma unroll
  for (int g = 0; g < MaxG; ++g) {
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
using SplitKernel = void (*)(const float*, const int32_t*, Loader, size_t, int, bool, size_t,
                             size_t, size_t, float, TokenExclusion, Partials);

// The instance for a head dim and group size (MaxG 4 up to groups of 4, else 8).
template <class Loader>
SplitKernel<Loader> split_kernel(size_t dim, size_t group) {
  const bool small = group <= 4;
  return dim == 64    ? (small ? decode_split_kernel<2, 4, Loader>
                               : decode_split_kernel<2, 8, Loader>)
         : dim == 128 ? (small ? decode_split_kernel<4, 4, Loader>
                               : decode_split_kernel<4, 8, Loader>)
                      : (small ? decode_split_kernel<8, 4, Loader>
                               : decode_split_kernel<8, 8, Loader>);
}

template <class Loader>
void launch_splits(const float* q, const int32_t* q_pos, const DecodeShape& sh,
                   const Loader& loader, size_t tokens, size_t splits, size_t split_tokens,
                   size_t split_base, const Partials& part, cudaStream_t stream) {
  if (splits == 0) return;
  const dim3 grid(unsigned(splits), unsigned(sh.kv_heads), unsigned(sh.batch));
  // (A named pointer: a template instance with several arguments is not one macro argument.)
  const SplitKernel<Loader> kernel = split_kernel<Loader>(sh.dim, sh.group);
  TokenExclusion skip = loader.t.skip;
  if (skip.n_exclude == 0) skip.exclude = nullptr;  // an empty list: the kernel's no-list path
  KVSDK_LAUNCH(kernel, grid, kWarps * 32, 0, stream, q, q_pos, loader, sh.kv_heads,
               int(sh.group), sh.shared_rows, tokens, split_tokens, split_base, sh.scale, skip,
               part);
  check_launch("decode_split_kernel");
}

// Blocks of the split kernel one SM holds at once (registers and shared memory decide), at least 1.
template <class Loader>
int resident_blocks(const DecodeShape& shape) {
  int blocks = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                 &blocks, split_kernel<Loader>(shape.dim, shape.group), kWarps * 32, 0),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  return std::max(blocks, 1);
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

// A tier's exclusion list: one list for every head, so only over shared rows; its indices
// (tokens + base) within 32 bits.
void check_exclusion(const DecodeShape& s, const TokenExclusion& x, size_t tokens,
                     const char* tier) {
  if (x.n_exclude == 0) return;
  KVSDK_REQUIRE(x.exclude, "decode attention: the ", tier, " tier excludes ", x.n_exclude,
                " tokens without a list");
  KVSDK_REQUIRE(s.shared_rows || s.batch * s.kv_heads == 1, "decode attention: the ", tier,
                " tier's exclusion list needs rows shared by every sequence (or one head)");
  KVSDK_REQUIRE(tokens + x.exclude_base <= UINT32_MAX, "decode attention: the ", tier,
                " tier's excluded indices (base ", x.exclude_base, " + ", tokens,
                " tokens) exceed 32 bits");
}

// The partials of the plan's splits in `workspace`; false (and zeros in `out`, all-zero bits)
// when the plan has no split: no token at all.
bool start_partials(const DecodeShape& shape, const DecodePlan& plan, void* workspace, float* out,
                    cudaStream_t stream, Partials& part) {
  const size_t rows = shape.batch * shape.kv_heads * shape.group;
  const size_t all_splits = plan.kivi_splits + plan.exact_splits + plan.extra_splits;
  part.splits = std::max<size_t>(1, all_splits);
  const size_t ml = div_up(rows * part.splits, 4) * 4;
  part.m = static_cast<float*>(workspace);
  part.l = part.m + ml;
  part.acc = part.l + ml;
  if (all_splits > 0) return true;
  check_cuda(cudaMemsetAsync(out, 0, rows * shape.dim * sizeof(float), stream), "cudaMemsetAsync");
  return false;
}

void reduce_partials(const DecodeShape& shape, const Partials& part, float* out,
                     cudaStream_t stream) {
  const size_t rows = shape.batch * shape.kv_heads * shape.group;
  KVSDK_LAUNCH(decode_reduce_kernel, unsigned(rows), 128, 0, stream, part, shape.dim, out);
  check_launch("decode_reduce_kernel");
}

}  // namespace

DecodePlan plan_decode(const DecodeShape& shape, size_t kivi_tokens, size_t exact_tokens,
                       size_t split_tokens, size_t extra_tokens) {
  check_shape(shape);
  const size_t tokens = kivi_tokens + exact_tokens + extra_tokens;
  if (split_tokens == 0) {
    int device = 0, sms = 1;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
               "cudaDeviceGetAttribute");
    // One wave of as many blocks as the SMs hold (the tier with more tokens decides which
    // kernel). With two blocks an SM (an estimate: ~4 KB of rows in flight per SM) the kernel
    // read 11-19% of the H200's bandwidth.
    const int per_sm = kivi_tokens >= exact_tokens + extra_tokens
                           ? resident_blocks<KiviLoader>(shape)
                           : resident_blocks<ExactLoader>(shape);
    const size_t heads = shape.batch * shape.kv_heads;
    const size_t want_splits =
        std::max<size_t>(1, div_up(size_t(per_sm) * size_t(sms), heads));
    split_tokens = std::max<size_t>(64, div_up(std::max<size_t>(tokens, 1), want_splits));
  }
  DecodePlan p;
  p.kivi_split_tokens = p.exact_split_tokens = p.extra_split_tokens = split_tokens;
  p.kivi_splits = div_up(kivi_tokens, split_tokens);
  p.exact_splits = div_up(exact_tokens, split_tokens);
  p.extra_splits = div_up(extra_tokens, split_tokens);
  const size_t all_splits = p.kivi_splits + p.exact_splits + p.extra_splits;
  KVSDK_REQUIRE(all_splits < 65536, "decode attention: ", all_splits,
                " splits exceed the grid; use longer splits");
  const size_t rows = shape.batch * shape.kv_heads * shape.group;
  const size_t splits = std::max<size_t>(1, all_splits);
  const size_t ml = div_up(rows * splits, 4) * 4;  // keep acc 16-byte aligned
  p.workspace_bytes = sizeof(float) * (2 * ml + rows * splits * shape.dim);
  return p;
}

void decode_attention(const float* q, const DecodeShape& shape, const KiviTierView* kivi,
                      const ExactTierView* exact, const DecodePlan& plan, void* workspace,
                      float* out, cudaStream_t stream, const int32_t* q_positions,
                      const ExactTierView* extra) {
  check_shape(shape);
  KVSDK_REQUIRE(kivi || exact || extra, "decode attention needs at least one tier");
  const size_t kivi_tokens = kivi ? kivi->tokens : 0, exact_tokens = exact ? exact->tokens : 0;
  const size_t extra_tokens = extra ? extra->tokens : 0;
  KVSDK_REQUIRE(div_up(kivi_tokens, std::max<size_t>(plan.kivi_split_tokens, 1)) ==
                        plan.kivi_splits &&
                    div_up(exact_tokens, std::max<size_t>(plan.exact_split_tokens, 1)) ==
                        plan.exact_splits &&
                    div_up(extra_tokens, std::max<size_t>(plan.extra_split_tokens, 1)) ==
                        plan.extra_splits,
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
  for (const ExactTierView* e : {exact, extra}) {
    if (!e) continue;
    KVSDK_REQUIRE(e->capacity >= e->tokens, "decode attention: exact capacity ", e->capacity,
                  " < tokens ", e->tokens);
  }
  if (kivi) check_exclusion(shape, kivi->skip, kivi_tokens, "KIVI");
  if (exact) check_exclusion(shape, exact->skip, exact_tokens, "exact");
  if (extra) check_exclusion(shape, extra->skip, extra_tokens, "extra exact");
  Partials part;
  if (!start_partials(shape, plan, workspace, out, stream, part)) return;
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
  if (extra && plan.extra_splits) {
    launch_splits(q, q_positions, shape, ExactLoader{*extra, shape.dim}, extra_tokens,
                  plan.extra_splits, plan.extra_split_tokens,
                  plan.kivi_splits + plan.exact_splits, part, stream);
  }
  reduce_partials(shape, part, out, stream);
}

void decode_attention_minicache(const float* q, const DecodeShape& shape,
                                const MiniCacheTierView& merged, const ExactTierView* pending,
                                const DecodePlan& plan, void* workspace, float* out,
                                cudaStream_t stream, const int32_t* q_positions) {
  check_shape(shape);
  KVSDK_REQUIRE(shape.shared_rows || shape.batch * shape.kv_heads == 1,
                "decode attention: a MiniCache tier holds one head's rows");
  const size_t pending_tokens = pending ? pending->tokens : 0;
  KVSDK_REQUIRE(div_up(merged.tokens, std::max<size_t>(plan.kivi_split_tokens, 1)) ==
                        plan.kivi_splits &&
                    div_up(pending_tokens, std::max<size_t>(plan.exact_split_tokens, 1)) ==
                        plan.exact_splits &&
                    plan.extra_splits == 0,
                "decode attention: the plan was made for other token counts");
  KVSDK_REQUIRE(!pending || pending->capacity >= pending->tokens, "decode attention: exact ",
                "capacity ", pending ? pending->capacity : 0, " < tokens ", pending_tokens);
  check_exclusion(shape, merged.skip, merged.tokens, "MiniCache");
  if (pending) check_exclusion(shape, pending->skip, pending_tokens, "exact");
  Partials part;
  if (!start_partials(shape, plan, workspace, out, stream, part)) return;
  if (plan.kivi_splits) {
    launch_splits(q, q_positions, shape, MiniCacheLoader{merged, shape.dim}, merged.tokens,
                  plan.kivi_splits, plan.kivi_split_tokens, 0, part, stream);
  }
  if (pending && plan.exact_splits) {
    launch_splits(q, q_positions, shape, ExactLoader{*pending, shape.dim}, pending_tokens,
                  plan.exact_splits, plan.exact_split_tokens, plan.kivi_splits, part, stream);
  }
  reduce_partials(shape, part, out, stream);
}

}  // namespace kvsdk::cuda
