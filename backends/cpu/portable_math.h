// Portable transcendental functions: the same bits on every platform.
//
// WHY: snapshots promise that a cache resumed on another machine (x86-64 <-> aarch64) continues
// bit-identically (docs/representations.md, include/kvsdk.h "Snapshots"). The C library's exp,
// sin, cos, acos and pow are not specified to the last bit, and they differ: glibc picks an FMA
// or a non-FMA variant of each at run time on x86-64 (its ifuncs), aarch64 builds them with FMA,
// and other C libraries use other algorithms. Measured with glibc 2.36 on one x86-64 machine with
// and without its FMA variants: about 7 in 10,000 results of sin, acos, exp and pow differ in
// the last bit, and expf differs too. kvsdk's stored rows (MiniCache's SLERP-merged directions
// and magnitudes, SpindleKV's de-rotated keys) and every attention output (the softmax) depend
// on these functions, so kvsdk computes them here instead, from IEEE 754 +, -, *, /, sqrt and
// exact operations (frexp, ldexp, floor, fmod), which every conforming platform rounds the same
// way. The library is built with -ffp-contract=off, so the compiler fuses none of them into an
// FMA either.
//
// Accuracy (tests/backends/cpu/portable_math_test.cpp checks it against the C library):
//   exp, log, sin, cos, acos   within 1 ulp of the exact result for ordinary arguments (the
//                              fdlibm algorithms); sin/cos exactly reduce |x| < 2^32 * pi/2.
//   exp_f32                    exp in double rounded to float: the correctly rounded float
//                              except in rare halfway-close cases (like libm's expf).
//   pow_positive               exp(y * log(x)): relative error below (1 + 2|y ln x|) * 2^-52
//                              (libm's pow is within ~1 ulp; for RoPE's theta^(-2i/d), a
//                              deterministic frequency matters, its last bits do not).
// Special values follow C99 Annex F where a caller can meet them (NaN in, NaN out; exp of +-inf
// is inf / 0; acos outside [-1, 1] is NaN).
#pragma once

namespace kvsdk::cpu::pmath {

double exp(double x);
float exp_f32(float x);
double log(double x);
// x^y for x > 0 (NaN for x <= 0 or NaN arguments); used for RoPE's theta^(-2i/d).
double pow_positive(double x, double y);
double sin(double x);
double cos(double x);
void sincos(double x, double* s, double* c);
double acos(double x);

}  // namespace kvsdk::cpu::pmath
