// LOCKSTEP_SIMD_CLONES: compile a hot loop three times (AVX-512F, AVX2, baseline x86-64) and let
// the loader pick the best the CPU has, since the project builds for baseline x86-64 unless
// LOCKSTEP_NATIVE is on. A loop marked with it must give the same bits in every clone: only IEEE
// operations in a fixed order (ISO C++ mode turns off FMA contraction) and integer ones.
// Off under AddressSanitizer (which does not support ifuncs) and on compilers other than GCC.
#pragma once

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && \
    !defined(__SANITIZE_ADDRESS__)
#define LOCKSTEP_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define LOCKSTEP_SIMD_CLONES
#endif
