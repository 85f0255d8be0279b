// The Highway targets every SIMD file of kvsdk compiles, included by each of them before any
// Highway header. They must be the same everywhere: Highway picks one target per process (the
// best this CPU runs among those compiled), and a file whose dispatch table lacks that target
// would call a null entry. So no file may widen or narrow the set on its own.
//
// - HWY_COMPILE_ALL_ATTAINABLE: every attainable target, so the scalar fallback is built and
//   tested on aarch64 too;
// - HWY_WANT_AVX3_DL: AVX-512 with VNNI/VBMI (Ice Lake, Zen 4 and later), for the integer dot
//   products of the KIVI kernel (fast_attention.cpp);
// - disabled: SSSE3 (SSE4 covers 128-bit x86; every x86-64-v2 CPU has it) and the SVE family,
//   whose vector length is only known at run time (the kernels' fixed lane counts need it at
//   compile time; NEON serves the aarch64 devices we target: Jetson Orin has no SVE).
#pragma once

#ifndef HWY_COMPILE_ALL_ATTAINABLE
#define HWY_COMPILE_ALL_ATTAINABLE
#endif
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128)
#endif
