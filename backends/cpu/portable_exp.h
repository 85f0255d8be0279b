// pmath::exp (portable_math.h: why kvsdk computes its own) as an inline function for host and
// device code alike. The CPU library calls it through pmath::exp; the CUDA scoring kernel
// (backends/cuda/cuda_column_sums.cu, compiled with --fmad=false, so that nvcc fuses none of these
// operations into an FMA either) calls it so that device scores carry the CPU's bits. Only IEEE
// +, -, *, / and exact operations (fabs, floor, ldexp): the same bits wherever it runs.
#pragma once

#include <math.h>

#if defined(__CUDACC__)
#define KVSDK_PMATH_HD __host__ __device__
#else
#define KVSDK_PMATH_HD
#endif

namespace kvsdk::cpu::pmath::detail {

// fdlibm's exp (Sun Microsystems, 1993): x = k ln2 + r, |r| <= ln2 / 2, then a minimax
// polynomial for r, scaled by 2^k exactly.
KVSDK_PMATH_HD inline double exp_body(double x) {
  constexpr double P1 = 1.66666666666666019037e-01, P2 = -2.77777777770155933842e-03,
                   P3 = 6.61375632143793436117e-05, P4 = -1.65339022054652515390e-06,
                   P5 = 4.13813679705723846039e-08;
  constexpr double kLn2Hi = 6.93147180369123816490e-01;  // high 32 bits of ln 2: k * kLn2Hi exact
  constexpr double kLn2Lo = 1.90821492927058770002e-10;  // ln 2 - kLn2Hi
  constexpr double kInvLn2 = 1.44269504088896338700e+00;
  if (x != x) return x;
  if (x > 7.09782712893383973096e+02) return HUGE_VAL;
  if (x < -7.45133219101941108420e+02) return 0.0;
  if (fabs(x) < 0x1p-28) return 1.0 + x;
  double hi = x, lo = 0.0, k = 0.0;
  if (fabs(x) > 0.5 * kLn2Hi) {
    k = floor(x * kInvLn2 + 0.5);  // the nearest integer (halves up), exactly
    hi = x - k * kLn2Hi;           // exact: k * kLn2Hi has at most 43 bits
    lo = k * kLn2Lo;
  }
  const double r = hi - lo;
  const double t = r * r;
  const double c = r - t * (P1 + t * (P2 + t * (P3 + t * (P4 + t * P5))));
  if (k == 0.0) return 1.0 - ((r * c) / (c - 2.0) - r);
  const double y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi);
  return ldexp(y, int(k));  // exact scaling (one correct rounding for subnormal results)
}

// exp in double rounded to float (pmath::exp_f32).
KVSDK_PMATH_HD inline float exp_f32_body(float x) { return float(exp_body(double(x))); }

}  // namespace kvsdk::cpu::pmath::detail
