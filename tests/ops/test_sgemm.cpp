// The sgemm kernel under the CPU backend's GEMMs (src/ops/cpu/cpu_sgemm.hpp): both libraries it
// can call against a double-precision loop, beta = 0 overwriting whatever C held, repeatability
// to the bit, and the rule that picks the library.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "lockstep/core/error.hpp"
#include "lockstep/core/rng.hpp"
#include "ops/cpu/cpu_sgemm.hpp"

using namespace lockstep;
using ops::cpu::sgemm;
using ops::cpu::SgemmLibrary;

namespace {

std::vector<float> uniform(std::size_t n, std::uint64_t stream) {
  std::vector<float> v(n);
  Philox(99, stream).fill_uniform(v.data(), static_cast<std::int64_t>(n), -1.0f, 1.0f);
  return v;
}

const SgemmLibrary kLibraries[] = {SgemmLibrary::OpenBlas, SgemmLibrary::OneDnn};
const char* name(SgemmLibrary l) {
  return l == SgemmLibrary::OneDnn ? "oneDNN" : "OpenBLAS";
}

// A GEMM on strided (padded) operands: lda/ldb/ldc exceed the row lengths, as for attention's
// views into qkv.
struct Case {
  std::int64_t m, n, k;
  bool ta, tb;
  float alpha, beta;
  std::int64_t pad;
};

struct Operands {
  std::int64_t lda, ldb, ldc;
  std::vector<float> a, b, c;
};

Operands make_operands(const Case& s, std::uint64_t seed) {
  Operands o;
  const std::int64_t a_rows = s.ta ? s.k : s.m, a_cols = s.ta ? s.m : s.k;
  const std::int64_t b_rows = s.tb ? s.n : s.k, b_cols = s.tb ? s.k : s.n;
  o.lda = a_cols + s.pad;
  o.ldb = b_cols + s.pad;
  o.ldc = s.n + s.pad;
  o.a = uniform(static_cast<std::size_t>(a_rows * o.lda), seed);
  o.b = uniform(static_cast<std::size_t>(b_rows * o.ldb), seed + 1);
  o.c = uniform(static_cast<std::size_t>(s.m * o.ldc), seed + 2);
  return o;
}

}  // namespace

TEST(Sgemm, BothLibrariesMatchDoubleReferenceOnStridedOperands) {
  const Case cases[] = {
      {1, 1, 1, false, false, 1.0f, 0.0f, 0},        {7, 5, 3, true, false, 1.5f, 0.75f, 3},
      {64, 256, 64, false, true, 0.125f, 0.0f, 128}, {64, 64, 256, false, false, 1.0f, 0.0f, 5},
      {256, 64, 64, true, false, 0.5f, 1.0f, 0},     {130, 97, 129, true, true, 1.0f, 1.0f, 1},
      {256, 10, 1024, false, true, 1.0f, 0.0f, 0}};
  std::uint64_t seed = 0;
  for (SgemmLibrary lib : kLibraries) {
    for (const Case& s : cases) {
      Operands o = make_operands(s, seed += 3);
      std::vector<float> c = o.c;
      sgemm(s.ta, s.tb, s.m, s.n, s.k, s.alpha, o.a.data(), o.lda, o.b.data(), o.ldb, s.beta,
            c.data(), o.ldc, lib);
      int bad = 0;
      for (std::int64_t i = 0; i < s.m; ++i) {
        for (std::int64_t j = 0; j < o.ldc; ++j) {
          const float got = c[i * o.ldc + j];
          if (j >= s.n) {  // the padding of C's rows is never written
            bad += got != o.c[i * o.ldc + j];
            continue;
          }
          double want = 0.0, scale = 0.0;
          for (std::int64_t p = 0; p < s.k; ++p) {
            const double x = s.ta ? o.a[p * o.lda + i] : o.a[i * o.lda + p];
            const double y = s.tb ? o.b[j * o.ldb + p] : o.b[p * o.ldb + j];
            want += x * y;
            scale += std::abs(x * y);
          }
          want = s.alpha * want + s.beta * o.c[i * o.ldc + j];
          // f32 accumulation of k products: within k * 2^-24 of the sum of magnitudes (and C).
          const double tol = (static_cast<double>(s.k) + 2) * 0x1p-24 *
                             (std::abs(s.alpha) * scale + std::abs(s.beta * o.c[i * o.ldc + j]));
          bad += !(std::abs(got - want) <= tol);
        }
      }
      EXPECT_EQ(bad, 0) << name(lib) << " m=" << s.m << " n=" << s.n << " k=" << s.k
                        << " ta=" << s.ta << " tb=" << s.tb << " beta=" << s.beta;
    }
  }
}

TEST(Sgemm, BetaZeroOverwritesCEvenWhereItHeldNaN) {
  // Attention writes its score tiles into uninitialised scratch with beta = 0.
  for (SgemmLibrary lib : kLibraries) {
    const std::int64_t m = 64, n = 96, k = 32;
    std::vector<float> a = uniform(m * k, 1), b = uniform(k * n, 2);
    std::vector<float> c(m * n, std::numeric_limits<float>::quiet_NaN());
    sgemm(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n, lib);
    int nonfinite = 0;
    for (float v : c)
      nonfinite += !std::isfinite(v);
    EXPECT_EQ(nonfinite, 0) << name(lib);
  }
}

TEST(Sgemm, RepeatsAreBitwiseIdenticalWhateverTheOperandsAddresses) {
  // The MLP's shapes at the sizes the backend hands one thread; the second run reads copies of
  // the operands at other addresses (a 4-byte offset: no longer 64-byte aligned).
  const Case cases[] = {{128, 1024, 784, false, true, 1.0f, 0.0f, 0},
                        {1024, 784, 128, true, false, 1.0f, 1.0f, 0},
                        {128, 784, 1024, false, false, 1.0f, 0.0f, 0}};
  for (SgemmLibrary lib : kLibraries) {
    for (const Case& s : cases) {
      Operands o = make_operands(s, 40);
      std::vector<float> c1 = o.c;
      sgemm(s.ta, s.tb, s.m, s.n, s.k, s.alpha, o.a.data(), o.lda, o.b.data(), o.ldb, s.beta,
            c1.data(), o.ldc, lib);
      std::vector<float> a2(o.a.size() + 1), b2(o.b.size() + 1), c2(o.c.size() + 1);
      std::copy(o.a.begin(), o.a.end(), a2.begin() + 1);
      std::copy(o.b.begin(), o.b.end(), b2.begin() + 1);
      std::copy(o.c.begin(), o.c.end(), c2.begin() + 1);
      sgemm(s.ta, s.tb, s.m, s.n, s.k, s.alpha, a2.data() + 1, o.lda, b2.data() + 1, o.ldb, s.beta,
            c2.data() + 1, o.ldc, lib);
      EXPECT_TRUE(std::equal(c1.begin(), c1.end(), c2.begin() + 1,
                             [](float x, float y) { return std::memcmp(&x, &y, 4) == 0; }))
          << name(lib) << " m=" << s.m << " n=" << s.n << " k=" << s.k;
    }
  }
}

TEST(Sgemm, OneDnnIsChosenOnX86WithAvx2AndTheVariableOverrides) {
  // The CPU's own flags, not oneDNN's view of them (unless a cap on oneDNN's ISA is set).
#if defined(__x86_64__)
  const bool avx2 = std::getenv("ONEDNN_MAX_CPU_ISA") == nullptr
                        ? __builtin_cpu_supports("avx2")
                        : (static_cast<unsigned>(dnnl::get_effective_cpu_isa()) &
                           static_cast<unsigned>(dnnl::cpu_isa::avx2)) ==
                              static_cast<unsigned>(dnnl::cpu_isa::avx2);
#else
  const bool avx2 = false;
#endif
  const SgemmLibrary automatic = avx2 ? SgemmLibrary::OneDnn : SgemmLibrary::OpenBlas;
  EXPECT_EQ(ops::cpu::choose_sgemm_library(nullptr), automatic);
  EXPECT_EQ(ops::cpu::choose_sgemm_library(""), automatic);
  EXPECT_EQ(ops::cpu::choose_sgemm_library("openblas"), SgemmLibrary::OpenBlas);
  EXPECT_EQ(ops::cpu::choose_sgemm_library("onednn"), SgemmLibrary::OneDnn);
  try {
    ops::cpu::choose_sgemm_library("mkl");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("LOCKSTEP_SGEMM=mkl"), std::string::npos) << e.what();
  }
  const std::string what = ops::cpu::sgemm_description();
  EXPECT_NE(what.find(ops::cpu::sgemm_library() == SgemmLibrary::OneDnn ? "oneDNN" : "OpenBLAS"),
            std::string::npos)
      << what;
}
