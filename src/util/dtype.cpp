#include "util/dtype.h"

#include <cstring>

#include "util/half.h"
#include "util/half_array.h"

namespace kvsdk {

size_t dtype_size(kvsdk_dtype dtype) { return dtype == KVSDK_DTYPE_F32 ? 4 : 2; }

bool dtype_valid(int32_t dtype) {
  return dtype == KVSDK_DTYPE_F32 || dtype == KVSDK_DTYPE_F16 || dtype == KVSDK_DTYPE_BF16;
}

void load_f32(kvsdk_dtype dtype, const void* src, size_t offset, size_t count, float* dst) {
  switch (dtype) {
    case KVSDK_DTYPE_F32:
      std::memcpy(dst, static_cast<const float*>(src) + offset, count * sizeof(float));
      return;
    case KVSDK_DTYPE_F16: {
      f16_to_f32_array(static_cast<const uint16_t*>(src) + offset, dst, count);
      return;
    }
    case KVSDK_DTYPE_BF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src) + offset;
      for (size_t i = 0; i < count; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
  }
}

void store_f32(kvsdk_dtype dtype, const float* src, size_t count, void* dst, size_t offset) {
  switch (dtype) {
    case KVSDK_DTYPE_F32:
      std::memcpy(static_cast<float*>(dst) + offset, src, count * sizeof(float));
      return;
    case KVSDK_DTYPE_F16: {
      uint16_t* d = static_cast<uint16_t*>(dst) + offset;
      for (size_t i = 0; i < count; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case KVSDK_DTYPE_BF16: {
      uint16_t* d = static_cast<uint16_t*>(dst) + offset;
      for (size_t i = 0; i < count; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
  }
}

void load_f16(kvsdk_dtype dtype, const void* src, size_t offset, size_t count, uint16_t* dst) {
  switch (dtype) {
    case KVSDK_DTYPE_F32: {
      const float* s = static_cast<const float*>(src) + offset;
      for (size_t i = 0; i < count; ++i) dst[i] = f32_to_f16(s[i]);
      return;
    }
    case KVSDK_DTYPE_F16:
      std::memcpy(dst, static_cast<const uint16_t*>(src) + offset, count * 2);
      return;
    case KVSDK_DTYPE_BF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src) + offset;
      for (size_t i = 0; i < count; ++i) dst[i] = f32_to_f16(bf16_to_f32(s[i]));
      return;
    }
  }
}

void store_f16(kvsdk_dtype dtype, const uint16_t* src, size_t count, void* dst, size_t offset) {
  switch (dtype) {
    case KVSDK_DTYPE_F32: {
      f16_to_f32_array(src, static_cast<float*>(dst) + offset, count);
      return;
    }
    case KVSDK_DTYPE_F16:
      std::memcpy(static_cast<uint16_t*>(dst) + offset, src, count * 2);
      return;
    case KVSDK_DTYPE_BF16: {
      uint16_t* d = static_cast<uint16_t*>(dst) + offset;
      for (size_t i = 0; i < count; ++i) d[i] = f32_to_bf16(f16_to_f32(src[i]));
      return;
    }
  }
}

}  // namespace kvsdk
