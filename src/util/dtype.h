// Conversion between the host's tensor dtype (f32/f16/bf16) and the f32 that kernels compute in.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvsdk.h"

namespace kvsdk {

size_t dtype_size(kvsdk_dtype dtype);
bool dtype_valid(int32_t dtype);

// Reads `count` elements of `dtype` starting at element `offset` of `src` into f32.
void load_f32(kvsdk_dtype dtype, const void* src, size_t offset, size_t count, float* dst);
// Writes `count` f32 values as `dtype` starting at element `offset` of `dst`.
void store_f32(kvsdk_dtype dtype, const float* src, size_t count, void* dst, size_t offset);
// Host dtype -> f16 storage (the exact tier), and back.
void load_f16(kvsdk_dtype dtype, const void* src, size_t offset, size_t count, uint16_t* dst);
void store_f16(kvsdk_dtype dtype, const uint16_t* src, size_t count, void* dst, size_t offset);

}  // namespace kvsdk
