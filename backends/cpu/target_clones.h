// KVSDK_TARGET_CLONES: GCC function multiversioning on x86-64 (ELF): the function is compiled for
// AVX-512, AVX2 and the baseline, and the loader picks the best clone this CPU runs (ifunc), so
// the scalar kernels' elementwise loops vectorize 8-16 wide instead of the baseline's SSE2. Each
// clone computes the same bits: without -ffast-math the vectorizer never reorders floating-point
// operations, and the build passes -ffp-contract=off (no FMA). Elsewhere it expands to nothing.
#pragma once

// Not under ThreadSanitizer: the loader runs ifunc resolvers before the TSan runtime is up, and
// an instrumented resolver crashes there (the baseline clone computes the same bits).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__ELF__) && \
    !defined(__SANITIZE_THREAD__)
#define KVSDK_TARGET_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KVSDK_TARGET_CLONES
#endif
