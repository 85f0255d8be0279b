// Element conversions on the device: IEEE binary16 bits to f32 (exact), as the CPU's
// f16_to_f32 (util/half.h) gives them. What a device KIVI store needs to quantize its f16
// residual rows where they are (src/repr/device_kivi.h). Device pointers; enqueued on `stream`.
// Throws kvsdk::Error KVSDK_E_BACKEND for a launch failure.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kvsdk::cuda {

void f16_to_f32(const uint16_t* src, size_t n, float* dst, cudaStream_t stream);

}  // namespace kvsdk::cuda
