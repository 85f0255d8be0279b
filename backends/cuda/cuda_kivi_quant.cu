#include "cuda_check.h"
#include "cuda_kivi_quant.h"
#include "cuda_launch.h"
#include "kivi_device.cuh"

namespace kvsdk::cuda {

namespace {

using namespace detail;

constexpr unsigned kThreads = 256;

size_t packed_bytes(size_t n_codes, uint32_t bits) { return (n_codes * bits + 7) / 8; }

void check_args(uint32_t bits, size_t dim, const char* what) {
  KVSDK_REQUIRE(bits == 1 || bits == 2 || bits == 4 || bits == 8, what, ": KIVI bits ", bits,
                " is not 1, 2, 4 or 8");
  KVSDK_REQUIRE(dim > 0, what, ": dim must be > 0");
}

// One thread per (block, channel): min/max over the block's tokens -> scale and zero point.
__global__ void key_params_kernel(const float* k, size_t n_blocks, size_t tokens, size_t dim,
                                  uint32_t bits, uint16_t* scale, uint16_t* zero) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_blocks * dim) return;
  const size_t b = i / dim, c = i % dim;
  const float* x = k + b * tokens * dim + c;
  float mn = x[0], mx = x[0];
  for (size_t t = 1; t < tokens; ++t) {  // consecutive threads read consecutive channels
    const float v = x[t * dim];
    mn = fminf(mn, v);
    mx = fmaxf(mx, v);
  }
  kivi_params(mn, mx, bits, &scale[i], &zero[i]);
}

// One thread per output byte of a packed key row: quantizes the byte's channels with their
// per-channel parameters.
__global__ void key_pack_kernel(const float* k, size_t n_rows, size_t tokens, size_t dim,
                                uint32_t bits, const uint16_t* scale, const uint16_t* zero,
                                uint8_t* codes) {
  const size_t row_bytes = (dim * bits + 7) / 8;
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_rows * row_bytes) return;
  const size_t row = i / row_bytes, byte = i % row_bytes, b = row / tokens;
  const uint32_t per_byte = 8 / bits;
  uint32_t out = 0;
  for (uint32_t j = 0; j < per_byte; ++j) {
    const size_t c = byte * per_byte + j;
    if (c >= dim) break;
    const float s = f16_bits_to_f32(scale[b * dim + c]), z = f16_bits_to_f32(zero[b * dim + c]);
    out |= kivi_code(k[row * dim + c], s, z, bits) << (j * bits);
  }
  codes[i] = uint8_t(out);
}

__global__ void key_dequant_kernel(const uint8_t* codes, const uint16_t* scale,
                                   const uint16_t* zero, size_t n_rows, size_t tokens, size_t dim,
                                   uint32_t bits, float* out) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_rows * dim) return;
  const size_t row = i / dim, c = i % dim, b = row / tokens;
  const size_t row_bytes = (dim * bits + 7) / 8;
  const uint32_t code = kivi_unpack_code(codes + row * row_bytes, uint32_t(c), bits);
  out[i] = kivi_dequant(code, f16_bits_to_f32(scale[b * dim + c]),
                        f16_bits_to_f32(zero[b * dim + c]));
}

// One thread per (token, channel group).
__global__ void value_params_kernel(const float* v, size_t n_tokens, size_t dim, size_t group,
                                    uint32_t bits, uint16_t* scale, uint16_t* zero) {
  const size_t n_groups = (dim + group - 1) / group;
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_tokens * n_groups) return;
  const size_t t = i / n_groups, g = i % n_groups;
  const size_t lo = g * group, hi = min(dim, lo + group);
  const float* x = v + t * dim;
  float mn = x[lo], mx = x[lo];
  for (size_t c = lo + 1; c < hi; ++c) {
    mn = fminf(mn, x[c]);
    mx = fmaxf(mx, x[c]);
  }
  kivi_params(mn, mx, bits, &scale[i], &zero[i]);
}

__global__ void value_pack_kernel(const float* v, size_t n_tokens, size_t dim, size_t group,
                                  uint32_t bits, const uint16_t* scale, const uint16_t* zero,
                                  uint8_t* codes) {
  const size_t row_bytes = (dim * bits + 7) / 8, n_groups = (dim + group - 1) / group;
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_tokens * row_bytes) return;
  const size_t t = i / row_bytes, byte = i % row_bytes;
  const uint32_t per_byte = 8 / bits;
  uint32_t out = 0;
  for (uint32_t j = 0; j < per_byte; ++j) {
    const size_t c = byte * per_byte + j;
    if (c >= dim) break;
    const size_t g = t * n_groups + c / group;
    out |= kivi_code(v[t * dim + c], f16_bits_to_f32(scale[g]), f16_bits_to_f32(zero[g]), bits)
           << (j * bits);
  }
  codes[i] = uint8_t(out);
}

__global__ void value_dequant_kernel(const uint8_t* codes, const uint16_t* scale,
                                     const uint16_t* zero, size_t n_tokens, size_t dim,
                                     size_t group, uint32_t bits, float* out) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_tokens * dim) return;
  const size_t t = i / dim, c = i % dim;
  const size_t row_bytes = (dim * bits + 7) / 8, n_groups = (dim + group - 1) / group;
  const size_t g = t * n_groups + c / group;
  out[i] = kivi_dequant(kivi_unpack_code(codes + t * row_bytes, uint32_t(c), bits),
                        f16_bits_to_f32(scale[g]), f16_bits_to_f32(zero[g]));
}

__global__ void pack_kernel(const uint8_t* codes, size_t n_rows, size_t n_codes, uint32_t bits,
                            uint8_t* packed) {
  const size_t row_bytes = (n_codes * bits + 7) / 8;
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_rows * row_bytes) return;
  const size_t row = i / row_bytes, byte = i % row_bytes;
  const uint32_t per_byte = 8 / bits, mask = (1u << bits) - 1u;
  uint32_t out = 0;
  for (uint32_t j = 0; j < per_byte; ++j) {
    const size_t c = byte * per_byte + j;
    if (c >= n_codes) break;
    out |= (uint32_t(codes[row * n_codes + c]) & mask) << (j * bits);
  }
  packed[i] = uint8_t(out);
}

__global__ void unpack_kernel(const uint8_t* packed, size_t n_rows, size_t n_codes, uint32_t bits,
                              uint8_t* codes) {
  const size_t row_bytes = (n_codes * bits + 7) / 8;
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_rows * n_codes) return;
  const size_t row = i / n_codes, c = i % n_codes;
  codes[i] = uint8_t(kivi_unpack_code(packed + row * row_bytes, uint32_t(c), bits));
}

}  // namespace

void kivi_quantize_keys(const float* k, size_t n_blocks, size_t block_tokens, size_t dim,
                        uint32_t bits, uint8_t* codes, uint16_t* scale, uint16_t* zero,
                        cudaStream_t stream) {
  check_args(bits, dim, "kivi_quantize_keys");
  if (n_blocks == 0 || block_tokens == 0) return;
  KVSDK_LAUNCH(key_params_kernel, blocks_for(n_blocks * dim, kThreads), kThreads, 0, stream, k,
               n_blocks, block_tokens, dim, bits, scale, zero);
  check_launch("key_params_kernel");
  const size_t n_rows = n_blocks * block_tokens;
  KVSDK_LAUNCH(key_pack_kernel, blocks_for(n_rows * packed_bytes(dim, bits), kThreads), kThreads, 0,
               stream, k, n_rows, block_tokens, dim, bits, scale, zero, codes);
  check_launch("key_pack_kernel");
}

void kivi_dequantize_keys(const uint8_t* codes, const uint16_t* scale, const uint16_t* zero,
                          size_t n_blocks, size_t block_tokens, size_t dim, uint32_t bits,
                          float* out, cudaStream_t stream) {
  check_args(bits, dim, "kivi_dequantize_keys");
  const size_t n_rows = n_blocks * block_tokens;
  if (n_rows == 0) return;
  KVSDK_LAUNCH(key_dequant_kernel, blocks_for(n_rows * dim, kThreads), kThreads, 0, stream, codes,
               scale, zero, n_rows, block_tokens, dim, bits, out);
  check_launch("key_dequant_kernel");
}

void kivi_quantize_values(const float* v, size_t n_tokens, size_t dim, size_t group,
                          uint32_t bits, uint8_t* codes, uint16_t* scale, uint16_t* zero,
                          cudaStream_t stream) {
  check_args(bits, dim, "kivi_quantize_values");
  KVSDK_REQUIRE(group > 0, "kivi_quantize_values: group must be > 0");
  if (n_tokens == 0) return;
  const size_t n_groups = (dim + group - 1) / group;
  KVSDK_LAUNCH(value_params_kernel, blocks_for(n_tokens * n_groups, kThreads), kThreads, 0, stream,
               v, n_tokens, dim, group, bits, scale, zero);
  check_launch("value_params_kernel");
  KVSDK_LAUNCH(value_pack_kernel, blocks_for(n_tokens * packed_bytes(dim, bits), kThreads),
               kThreads, 0, stream, v, n_tokens, dim, group, bits, scale, zero, codes);
  check_launch("value_pack_kernel");
}

void kivi_dequantize_values(const uint8_t* codes, const uint16_t* scale, const uint16_t* zero,
                            size_t n_tokens, size_t dim, size_t group, uint32_t bits, float* out,
                            cudaStream_t stream) {
  check_args(bits, dim, "kivi_dequantize_values");
  KVSDK_REQUIRE(group > 0, "kivi_dequantize_values: group must be > 0");
  if (n_tokens == 0) return;
  KVSDK_LAUNCH(value_dequant_kernel, blocks_for(n_tokens * dim, kThreads), kThreads, 0, stream,
               codes, scale, zero, n_tokens, dim, group, bits, out);
  check_launch("value_dequant_kernel");
}

void kivi_pack(const uint8_t* codes, size_t n_rows, size_t n_codes, uint32_t bits,
               uint8_t* packed, cudaStream_t stream) {
  check_args(bits, n_codes, "kivi_pack");
  if (n_rows == 0) return;
  KVSDK_LAUNCH(pack_kernel, blocks_for(n_rows * packed_bytes(n_codes, bits), kThreads), kThreads, 0,
               stream, codes, n_rows, n_codes, bits, packed);
  check_launch("pack_kernel");
}

void kivi_unpack(const uint8_t* packed, size_t n_rows, size_t n_codes, uint32_t bits,
                 uint8_t* codes, cudaStream_t stream) {
  check_args(bits, n_codes, "kivi_unpack");
  if (n_rows == 0) return;
  KVSDK_LAUNCH(unpack_kernel, blocks_for(n_rows * n_codes, kThreads), kThreads, 0, stream, packed,
               n_rows, n_codes, bits, codes);
  check_launch("unpack_kernel");
}

}  // namespace kvsdk::cuda
