// NEON f16 -> f32 for AArch64 (Jetson, phones, Graviton): FCVTL converts 4 halves exactly,
// subnormals included (Linux runs user code with FPCR.FZ16 = 0).
#include "util/half_array.h"

#if KVSDK_HALF_ARRAY_NEON
#include <arm_neon.h>

namespace kvsdk {

void f16_to_f32_array(const uint16_t* src, float* dst, size_t n) {
  const uint16_t abs_mask = 0x7fff, inf_bits = 0x7c00;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint16x8_t h = vld1q_u16(src + i);
    // A NaN (magnitude above infinity's) is quieted by the hardware, while the reference keeps
    // a signalling NaN's bits; such blocks are rare and go to the reference so both agree.
    const uint16x8_t nan_lanes = vcgtq_u16(vandq_u16(h, vdupq_n_u16(abs_mask)), vdupq_n_u16(inf_bits));
    if (vmaxvq_u16(nan_lanes) != 0) {
      f16_to_f32_array_scalar(src + i, dst + i, 8);
      continue;
    }
    const float16x8_t f = vreinterpretq_f16_u16(h);
    vst1q_f32(dst + i, vcvt_f32_f16(vget_low_f16(f)));
    vst1q_f32(dst + i + 4, vcvt_high_f32_f16(f));
  }
  f16_to_f32_array_scalar(src + i, dst + i, n - i);
}

}  // namespace kvsdk
#endif
