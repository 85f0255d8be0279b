#include "util/half_array.h"

#include "util/half.h"

namespace kvsdk {

void f16_to_f32_array_scalar(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

#if !KVSDK_HALF_ARRAY_NEON
void f16_to_f32_array(const uint16_t* src, float* dst, size_t n) {
  f16_to_f32_array_scalar(src, dst, n);
}
#endif

}  // namespace kvsdk
