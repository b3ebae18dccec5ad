// The f32 GEMM kernel under every CPU op (linear layers, attention tiles): one row-major sgemm on
// the calling thread, from oneDNN or OpenBLAS, chosen once per process. oneDNN detects the
// processor's ISA itself (AVX2, AVX512, ...), where Debian's OpenBLAS 0.3.21 runs its generic SSE3
// kernels on CPUs newer than itself (4.7x slower on an Emerald Rapids Xeon); measured in
// docs/PERFORMANCE.md, "fp32 GEMM". Results are deterministic for a given library and shape.
#pragma once

#include <cstdint>
#include <string>

namespace lockstep::ops::cpu {

enum class SgemmLibrary { OpenBlas, OneDnn };

// oneDNN where its JIT kernels cover the CPU (AVX2 and up), OpenBLAS otherwise;
// LOCKSTEP_SGEMM=openblas|onednn in the environment overrides the choice (read once).
SgemmLibrary sgemm_library();
// The rule behind it, for a given LOCKSTEP_SGEMM value (null or empty: automatic); an unknown value
// is an error naming the variable.
SgemmLibrary choose_sgemm_library(const char* env_value);
// "oneDNN 2.6.3 sgemm (avx512_core)" or "OpenBLAS sgemm (Prescott kernels)": which kernels ran.
std::string sgemm_description();

// C[m, n] = alpha op(A) op(B) + beta C, row-major, op(X) = X^T when trans_x; single-threaded
// whatever OpenMP or OpenBLAS settings the process has. beta = 0 overwrites C (NaN included).
void sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
           const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
           std::int64_t ldc, SgemmLibrary library = sgemm_library());

}  // namespace lockstep::ops::cpu
