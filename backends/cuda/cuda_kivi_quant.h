// KIVI quantization, dequantization and bit packing on the device, in exactly the layout of
// backends/cpu/kivi_quant.h (bit-identical codes, f16 scales and zero points): a block quantized
// here can be read by the CPU backend and vice versa. All pointers are device pointers; every
// launcher only enqueues work on `stream` (no synchronisation). Throws kvsdk::Error:
// KVSDK_E_INVALID_ARG for unsupported bits / zero sizes, KVSDK_E_BACKEND for launch failures.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kvsdk::cuda {

// Keys: `n_blocks` independent key blocks k [n_blocks][block_tokens][dim] (f32), each quantized
// per channel over its tokens (one KIVI key group). Writes codes
// [n_blocks][block_tokens][packed_bytes(dim)] and scale/zero [n_blocks][dim].
void kivi_quantize_keys(const float* k, size_t n_blocks, size_t block_tokens, size_t dim,
                        uint32_t bits, uint8_t* codes, uint16_t* scale, uint16_t* zero,
                        cudaStream_t stream);
// Dequantizes every row of such blocks into out [n_blocks][block_tokens][dim] (f32).
void kivi_dequantize_keys(const uint8_t* codes, const uint16_t* scale, const uint16_t* zero,
                          size_t n_blocks, size_t block_tokens, size_t dim, uint32_t bits,
                          float* out, cudaStream_t stream);

// Values: rows v [n_tokens][dim] quantized per token in groups of `group` channels. Writes codes
// [n_tokens][packed_bytes(dim)] and scale/zero [n_tokens][ceil(dim / group)].
void kivi_quantize_values(const float* v, size_t n_tokens, size_t dim, size_t group,
                          uint32_t bits, uint8_t* codes, uint16_t* scale, uint16_t* zero,
                          cudaStream_t stream);
void kivi_dequantize_values(const uint8_t* codes, const uint16_t* scale, const uint16_t* zero,
                            size_t n_tokens, size_t dim, size_t group, uint32_t bits, float* out,
                            cudaStream_t stream);

// Bit packing alone: codes [n_rows][n_codes] (one code per byte) <-> packed rows.
void kivi_pack(const uint8_t* codes, size_t n_rows, size_t n_codes, uint32_t bits,
               uint8_t* packed, cudaStream_t stream);
void kivi_unpack(const uint8_t* packed, size_t n_rows, size_t n_codes, uint32_t bits,
                 uint8_t* codes, cudaStream_t stream);

}  // namespace kvsdk::cuda
