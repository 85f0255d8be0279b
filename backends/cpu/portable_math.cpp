// Portable exp, log, pow, sin, cos and acos (see portable_math.h for why they exist). The
// argument reductions and the published minimax coefficients follow the classic fdlibm designs
// (Sun Microsystems, 1993), written here with IEEE operations only: no FMA (the build passes
// -ffp-contract=off, and std::fma is never called), no long double, no table lookups that differ
// by platform.
#include "portable_math.h"
#include "portable_exp.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace kvsdk::cpu::pmath {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

constexpr double kLn2Hi = 6.93147180369123816490e-01;  // high 32 bits of ln 2: k * kLn2Hi exact
constexpr double kLn2Lo = 1.90821492927058770002e-10;  // ln 2 - kLn2Hi

// Rounds to the nearest integer (halves up), exactly.
double nearest(double x) { return std::floor(x + 0.5); }

// sin and cos of r_hi + r_lo, |r_hi| <= ~pi/4, |r_lo| <= ulp(r_hi) (fdlibm __kernel_sin/cos).
double kernel_sin(double x, double y) {
  constexpr double S1 = -1.66666666666666324348e-01, S2 = 8.33333333332248946124e-03,
                   S3 = -1.98412698298579493134e-04, S4 = 2.75573137070700676789e-06,
                   S5 = -2.50507602534068634195e-08, S6 = 1.58969099521155010221e-10;
  const double z = x * x, v = z * x;
  const double r = S2 + z * (S3 + z * (S4 + z * (S5 + z * S6)));
  return x - ((z * (0.5 * y - v * r) - y) - v * S1);
}

double kernel_cos(double x, double y) {
  constexpr double C1 = 4.16666666666666019037e-02, C2 = -1.38888888888741095749e-03,
                   C3 = 2.48015872894767294178e-05, C4 = -2.75573143513906633035e-07,
                   C5 = 2.08757232129817482790e-09, C6 = -1.13596475577881948265e-11;
  const double z = x * x;
  const double r = z * (C1 + z * (C2 + z * (C3 + z * (C4 + z * (C5 + z * C6)))));
  const double hz = 0.5 * z, w = 1.0 - hz;
  return w + (((1.0 - w) - hz) + (z * r - x * y));
}

// x = k * pi/2 + (*hi + *lo), |*hi| <= ~pi/4; returns k mod 4. pi/2 is split into three 21-bit
// parts and a 53-bit rest (Cody-Waite): k * part is exact for |k| < 2^32, so the reduction is
// as accurate as the final subtractions for |x| < 2^32 * pi/2. Larger arguments (never met by
// kvsdk: RoPE angles stay below 2^31) are first reduced exactly by fmod with 2*pi rounded to
// double, which is deterministic but loses the absolute accuracy such huge arguments carry.
int reduce_pio2(double x, double* hi, double* lo) {
  constexpr double C1 = 0x1.921fbp+0, C2 = 0x1.5110bp-22, C3 = 0x1.18469p-44,
                   C4 = 0x1.13198a2e03707p-65;
  constexpr double kTwoOverPi = 0x1.45f306dc9c883p-1, kTwoPi = 0x1.921fb54442d18p+2;
  if (std::fabs(x) <= 0x1.921fb54442d18p-1) {  // |x| <= pi/4
    *hi = x;
    *lo = 0.0;
    return 0;
  }
  if (std::fabs(x) >= 0x1p32) x = std::fmod(x, kTwoPi);  // exact operation
  const double k = nearest(x * kTwoOverPi);
  const double r2 = (x - k * C1) - k * C2;
  const double w = k * C3;
  const double r3 = r2 - w;
  const double tail = ((r2 - r3) - w) - k * C4;
  *hi = r3 + tail;
  *lo = (r3 - *hi) + tail;
  return int(int64_t(k) & 3);
}

}  // namespace

double exp(double x) { return detail::exp_body(x); }  // (portable_exp.h: host and device)

float exp_f32(float x) { return detail::exp_f32_body(x); }

double log(double x) {
  constexpr double Lg1 = 6.666666666666735130e-01, Lg2 = 3.999999999940941908e-01,
                   Lg3 = 2.857142874366239149e-01, Lg4 = 2.222219843214978396e-01,
                   Lg5 = 1.818357216161805012e-01, Lg6 = 1.531383769920937332e-01,
                   Lg7 = 1.479819860511658591e-01;
  if (x != x || x < 0.0) return kNaN;
  if (x == 0.0) return -kInf;
  if (x == kInf) return x;
  int e = 0;
  double m = std::frexp(x, &e);  // exact: x = m * 2^e, m in [0.5, 1)
  if (m < 0x1.6a09e667f3bcdp-1) {  // m < sqrt(1/2): use m in [sqrt(1/2), sqrt(2))
    m *= 2.0;
    --e;
  }
  const double f = m - 1.0;  // exact (Sterbenz)
  const double s = f / (2.0 + f), dk = double(e);
  const double z = s * s, w = z * z;
  const double t1 = w * (Lg2 + w * (Lg4 + w * Lg6));
  const double t2 = z * (Lg1 + w * (Lg3 + w * (Lg5 + w * Lg7)));
  const double hfsq = 0.5 * f * f, R = t2 + t1;
  return dk * kLn2Hi - ((hfsq - (s * (hfsq + R) + dk * kLn2Lo)) - f);
}

double pow_positive(double x, double y) {
  if (x != x || y != y || !(x > 0.0)) return kNaN;
  if (y == 0.0 || x == 1.0) return 1.0;
  return exp(y * log(x));
}

void sincos(double x, double* s, double* c) {
  if (!std::isfinite(x)) {
    *s = *c = kNaN;
    return;
  }
  double hi = 0.0, lo = 0.0;
  const int n = reduce_pio2(x, &hi, &lo);
  const double ks = kernel_sin(hi, lo), kc = kernel_cos(hi, lo);
  switch (n) {
    case 0: *s = ks; *c = kc; break;
    case 1: *s = kc; *c = -ks; break;
    case 2: *s = -ks; *c = -kc; break;
    default: *s = -kc; *c = ks; break;
  }
}

double sin(double x) {
  double s = 0.0, c = 0.0;
  sincos(x, &s, &c);
  return s;
}

double cos(double x) {
  double s = 0.0, c = 0.0;
  sincos(x, &s, &c);
  return c;
}

double acos(double x) {
  constexpr double pio2_hi = 1.57079632679489655800e+00, pio2_lo = 6.12323399573676603587e-17,
                   pi = 3.14159265358979311600e+00;
  constexpr double pS0 = 1.66666666666666657415e-01, pS1 = -3.25565818622400915405e-01,
                   pS2 = 2.01212532134862925881e-01, pS3 = -4.00555345006794114027e-02,
                   pS4 = 7.91534994289814532176e-04, pS5 = 3.47933107596021167570e-05,
                   qS1 = -2.40339491173441421878e+00, qS2 = 2.02094576023350569471e+00,
                   qS3 = -6.88283971605453293030e-01, qS4 = 7.70381505559019352791e-02;
  const auto rational = [&](double z) {
    const double p = z * (pS0 + z * (pS1 + z * (pS2 + z * (pS3 + z * (pS4 + z * pS5)))));
    const double q = 1.0 + z * (qS1 + z * (qS2 + z * (qS3 + z * qS4)));
    return p / q;
  };
  if (x != x) return x;
  if (x == 1.0) return 0.0;
  if (x == -1.0) return pi + 2.0 * pio2_lo;
  if (std::fabs(x) > 1.0) return kNaN;
  if (std::fabs(x) < 0.5) {
    if (std::fabs(x) <= 0x1p-57) return pio2_hi + pio2_lo;
    const double r = rational(x * x);
    return pio2_hi - (x - (pio2_lo - x * r));
  }
  if (x < 0.0) {
    const double z = (1.0 + x) * 0.5;
    const double s = std::sqrt(z);
    const double w = rational(z) * s - pio2_lo;
    return pi - 2.0 * (s + w);
  }
  const double z = (1.0 - x) * 0.5;
  const double s = std::sqrt(z);
  uint64_t bits = 0;
  std::memcpy(&bits, &s, sizeof bits);
  bits &= 0xffffffff00000000ull;  // s with its low 32 bits cleared: df * df is exact
  double df = 0.0;
  std::memcpy(&df, &bits, sizeof df);
  const double c = (z - df * df) / (s + df);
  const double w = rational(z) * s + c;
  return 2.0 * (df + w);
}

}  // namespace kvsdk::cpu::pmath
