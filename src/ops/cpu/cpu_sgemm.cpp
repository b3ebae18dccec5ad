// Why oneDNN's sgemm by default: Debian's OpenBLAS picks its kernels from a table of CPU models
// it knew when it was built, and on a newer one (an Emerald Rapids Xeon, family 6 model 207, for
// 0.3.21) falls back to its generic Prescott/SSE3 kernels: 31 GFLOP/s on one core where its own
// AVX512 kernels (OPENBLAS_CORETYPE=SkylakeX) give 140-160. OpenBLAS reads that variable in its
// own load-time constructor, which runs before any constructor of a program linked with it
// (checked: a setenv() there leaves openblas_get_corename() at "Prescott"), so lockstep could only
// set it by re-executing itself (missing every program that embeds the library, tests included)
// or through OpenBLAS internals. oneDNN's JIT sgemm picks its kernels from the CPU's feature flags
// at run time: 145-165 GFLOP/s on the MLP's shapes there, and 1.5-2.5x OpenBLAS's AVX512 kernels
// on the narrow 1024x10 ones. With oneDNN capped at AVX2 it matched OpenBLAS's Haswell kernels;
// capped at AVX or SSE4.1 it was 5-15% slower than OpenBLAS's kernels for those, so below AVX2
// (and off x86) OpenBLAS keeps the job (docs/PERFORMANCE.md, "fp32 GEMM").
//
// Both are called single-threaded: the backend splits a large GEMM over its own pool
// (cpu_backend.cpp), so one call must not start threads of its own. OpenBLAS is set to one thread
// at start-up (init_openblas_once); oneDNN's sgemm sizes its OpenMP team by the calling thread's
// omp_get_max_threads(), which the convolutions set to the Context's thread count, so it is set to
// 1 right before each call.
#include "ops/cpu/cpu_sgemm.hpp"

#include <cblas.h>
#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>

#include "lockstep/core/error.hpp"

extern "C" char* openblas_get_corename(void);

namespace lockstep::ops::cpu {
namespace {

bool onednn_has_tuned_sgemm() {
#if defined(__x86_64__)
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto avx2 = static_cast<unsigned>(dnnl::cpu_isa::avx2);
  return (isa & avx2) == avx2;
#else
  return false;
#endif
}

const char* onednn_isa_name() {
  using dnnl::cpu_isa;
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  for (auto [want, name] :
       {std::pair{cpu_isa::avx512_core_amx, "avx512_core_amx"},
        std::pair{cpu_isa::avx512_core, "avx512_core"}, std::pair{cpu_isa::avx2, "avx2"},
        std::pair{cpu_isa::avx, "avx"}, std::pair{cpu_isa::sse41, "sse41"}}) {
    const auto w = static_cast<unsigned>(want);
    if ((isa & w) == w) return name;
  }
  return "no JIT ISA";
}

}  // namespace

SgemmLibrary choose_sgemm_library(const char* env) {
  if (env == nullptr || *env == '\0') {
    return onednn_has_tuned_sgemm() ? SgemmLibrary::OneDnn : SgemmLibrary::OpenBlas;
  }
  if (std::strcmp(env, "onednn") == 0) return SgemmLibrary::OneDnn;
  if (std::strcmp(env, "openblas") == 0) return SgemmLibrary::OpenBlas;
  LOCKSTEP_FAIL_HINT(
      "set LOCKSTEP_SGEMM to onednn or openblas, or unset it for the automatic choice",
      "LOCKSTEP_SGEMM=", env, " names no GEMM library");
}

SgemmLibrary sgemm_library() {
  static const SgemmLibrary library = choose_sgemm_library(std::getenv("LOCKSTEP_SGEMM"));
  return library;
}

std::string sgemm_description() {
  if (sgemm_library() == SgemmLibrary::OpenBlas)
    return str("OpenBLAS sgemm (", openblas_get_corename(), " kernels)");
  const dnnl_version_t* v = dnnl_version();
  return str("oneDNN ", v->major, ".", v->minor, ".", v->patch, " sgemm (", onednn_isa_name(), ")");
}

void sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
           const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
           std::int64_t ldc, SgemmLibrary library) {
  if (library == SgemmLibrary::OneDnn) {
    omp_set_num_threads(1);
    const dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k,
                                            alpha, a, lda, b, ldb, beta, c, ldc);
    LOCKSTEP_CHECK(status == dnnl_success, "dnnl_sgemm(m=", m, ", n=", n, ", k=", k,
                   ") failed with oneDNN status ", static_cast<int>(status));
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

}  // namespace lockstep::ops::cpu
