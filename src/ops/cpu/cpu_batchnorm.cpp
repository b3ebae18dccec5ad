// CPU batch normalisation over x viewed as [N, C, S] (S = H*W, or 1 for [N, C], which is also how
// a channels-last [N, C, H, W] batch reaches it: [N*H*W, C]).
// Statistics are accumulated in double, one pass (sum and sum of squares), per channel in a fixed
// order, so the result does not depend on the thread count:
// - S > 1: a channel is one thread's, its planes added in sample order.
// - S == 1 (a channel is a strided column): the rows are cut into fixed chunks of kBnRows, each
//   chunk's column sums are taken row by row (vectorised across the contiguous columns), and the
//   chunks' sums are added in chunk order. A batch of at most kBnRows rows is one chunk: the same
//   bits as a single pass. A channels-last batch has N*H*W rows (50176 for ResNet-50's first stage
//   at batch 16), so its chunks, not its few channel blocks, are what the threads split.
// The fused epilogues (ops.hpp: batchnorm_act_forward_*, batchnorm_relu_backward, a bf16 dx) run
// the same arithmetic on each row or plane chunk, then the residual sum, the ReLU and the rounding
// on it while it is in L1, so they give the separate ops' bits (tests/ops/test_fused_ops.cpp) with
// fewer passes over memory.
// x may be a bf16 activation (a convolution's rounded output, ops.hpp): the kernels read it widened
// to f32, exactly, at the same point of the same arithmetic, so the result is the f32 op's on the
// widened x. The row kernels are instantiated for both element types; the NCHW planes widen a
// plane (or a chunk of one) into the thread's scratch and run the f32 loops on it.
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "lockstep/core/bf16.hpp"
#include "lockstep/core/simd_clones.hpp"
#include "ops/cpu/bf16_rows.hpp"
#include "ops/cpu/cpu_backend.hpp"
#include "ops/cpu/parallel.hpp"
#include "ops/cpu/reduce.hpp"

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define LOCKSTEP_BN_AVX512 1
#endif

namespace lockstep::ops::cpu {
namespace {

struct BnShape {
  std::int64_t n, c, s;
};
BnShape bn_shape(const Tensor& x) {
  BnShape sh{x.dim(0), x.dim(1), 1};
  sh.s = (sh.n * sh.c) != 0 ? x.numel() / (sh.n * sh.c) : 1;
  return sh;
}

// ---- S > 1: one channel per work item.

// Runs fn(c) for every channel.
template <class F>
void for_channels(ThreadPool& pool, const BnShape& sh, const F& fn) {
  const std::int64_t per_channel = std::max<std::int64_t>(sh.n * sh.s, 1);
  parallel_range(pool, sh.c, std::max<std::int64_t>(1, kParallelGrain / per_channel),
                 [&](std::int64_t c0, std::int64_t c1) {
                   for (std::int64_t c = c0; c < c1; ++c)
                     fn(c);
                 });
}

// ---- S == 1: rows [N, C].

// Rows per chunk of the statistics (see the top): a multiple of any batch a BatchNorm1d sees in
// practice, and 2 x 1024 x 64 x 8 bytes of accumulators per channel block stay in L2.
constexpr std::int64_t kBnRows = 1024;
// Columns per block: the double accumulators of a block fit in L1.
constexpr std::int64_t kBnCols = 64;

struct RowChunks {
  std::int64_t chunks, col_blocks;
};
RowChunks row_chunks(const BnShape& sh) {
  return {std::max<std::int64_t>(1, (sh.n + kBnRows - 1) / kBnRows),
          (sh.c + kBnCols - 1) / kBnCols};
}

// Runs fn(r0, r1, c0, c1) for every (row chunk, column block): the chunk's rows [r0, r1) of
// columns [c0, c1).
template <class F>
void for_row_chunks(ThreadPool& pool, const BnShape& sh, const F& fn) {
  const RowChunks rc = row_chunks(sh);
  const std::int64_t items = rc.chunks * rc.col_blocks;
  parallel_range(pool, items, std::max<std::int64_t>(1, kParallelGrain / (kBnRows * kBnCols)),
                 [&](std::int64_t i0, std::int64_t i1) {
                   for (std::int64_t i = i0; i < i1; ++i) {
                     const std::int64_t k = i / rc.col_blocks, b = i % rc.col_blocks;
                     fn(k * kBnRows, std::min(sh.n, (k + 1) * kBnRows), b * kBnCols,
                        std::min(sh.c, (b + 1) * kBnCols));
                   }
                 });
}

// s1[j] = sum x[i, c0 + j], s2[j] = sum x[i, c0 + j]^2 over rows [r0, r1), row by row in double.
// The row sums below take the columns kSumCols at a time with their double accumulators in
// vector registers (GCC's vector types: zmm in the AVX-512 clone, pairs of ymm or xmm in the
// others), since a loop over all w columns loads and stores its accumulators for every row, which
// cost more than the reads of x. Each column is still summed row by row, with the scalar
// arithmetic's operations, so a group gives the scalar loop's bits (the last, narrower group runs
// that loop).
constexpr std::int64_t kSumCols = 32;
// The helpers taking and returning these types are always inlined: no call passes them, so the
// ABI GCC warns about never applies.
#pragma GCC diagnostic ignored "-Wpsabi"
constexpr int kSumVecs = kSumCols / 8;
using v8f = float __attribute__((vector_size(32)));
using v8d = double __attribute__((vector_size(64)));
using v8i = std::int32_t __attribute__((vector_size(32)));
using v8h = std::uint16_t __attribute__((vector_size(16)));
using v8u = std::uint32_t __attribute__((vector_size(32)));

[[gnu::always_inline]] inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
[[gnu::always_inline]] inline v8d widen8(v8f v) {
  return __builtin_convertvector(v, v8d);
}
// 8 bf16 values as f32 (exact: the bits shifted into the high half).
[[gnu::always_inline]] inline v8f load8(const std::uint16_t* p) {
  v8h h;
  std::memcpy(&h, p, sizeof h);
  return reinterpret_cast<v8f>(__builtin_convertvector(h, v8u) << 16);
}
// Element k of x (f32 or bf16) as f32.
template <class X>
[[gnu::always_inline]] inline float x_at(const X* x, std::int64_t k) {
  return widened(x[k]);
}
// x[0, n) as f32: x itself, or widened into the thread's scratch slot 3 (the planes of NCHW).
inline const float* x_f32(const float* x, std::int64_t) {
  return x;
}
inline const float* x_f32(const std::uint16_t* x, std::int64_t n) {
  float* wide = thread_scratch(static_cast<std::size_t>(n), 3);
  widen_bf16(x, wide, n);
  return wide;
}

// The gradient a BatchNorm's backward reads at element k: dy itself, or through the ReLU after it
// (batchnorm_relu_backward), dy where that ReLU's output y (f32 or bf16) is positive. The value is
// relu_backward's, so the sums and dx below get the bits of relu_backward then batchnorm_backward.
template <class Y>
[[gnu::always_inline]] inline float grad_at(const float* dy, const Y* y, std::int64_t k) {
  const float g = dy[k];  // loaded unconditionally, so the select vectorises
  if constexpr (std::is_same_v<Y, float>)
    return y[k] > 0.0f ? g : 0.0f;
  else if constexpr (std::is_same_v<Y, std::uint16_t>)
    return bf16_to_float(y[k]) > 0.0f ? g : 0.0f;
  else
    return g;
}

// grad_at for 8 consecutive elements.
template <class Y>
[[gnu::always_inline]] inline v8f grad_at8(const float* dy, const Y* y, std::int64_t k) {
  const v8f g = load8(dy + k);
  if constexpr (std::is_same_v<Y, float>) {
    return reinterpret_cast<v8f>(reinterpret_cast<v8i>(g) & (load8(y + k) > 0.0f));
  } else if constexpr (std::is_same_v<Y, std::uint16_t>) {
    return reinterpret_cast<v8f>(reinterpret_cast<v8i>(g) & (load8(y + k) > 0.0f));
  } else {
    return g;
  }
}

template <class X>
[[gnu::always_inline]] inline void row_moments_tail(const X* x, std::int64_t c, std::int64_t r0,
                                                    std::int64_t r1, std::int64_t c0,
                                                    std::int64_t c1, std::int64_t j0, double* s1,
                                                    double* s2) {
  const std::int64_t w = c1 - c0;
  for (std::int64_t j = j0; j < w; ++j)
    s1[j] = s2[j] = 0.0;
  for (std::int64_t i = r0; i < r1; ++i) {
    const X* row = x + i * c + c0;
    for (std::int64_t j = j0; j < w; ++j) {
      const double v = x_at(row, j);
      s1[j] += v;
      s2[j] += v * v;
    }
  }
}
template <class X>
[[gnu::always_inline]] inline void row_moments_body(const X* x, std::int64_t c, std::int64_t r0,
                                                    std::int64_t r1, std::int64_t c0,
                                                    std::int64_t c1, double* s1, double* s2) {
  const std::int64_t w = c1 - c0;
  std::int64_t j0 = 0;
  for (; j0 + kSumCols <= w; j0 += kSumCols) {
    v8d a1[kSumVecs] = {}, a2[kSumVecs] = {};
    for (std::int64_t i = r0; i < r1; ++i) {
      const X* row = x + i * c + c0 + j0;
      for (int h = 0; h < kSumVecs; ++h) {
        const v8d v = widen8(load8(row + 8 * h));
        a1[h] += v;
        a2[h] += v * v;
      }
    }
    std::memcpy(s1 + j0, a1, sizeof a1);
    std::memcpy(s2 + j0, a2, sizeof a2);
  }
  row_moments_tail(x, c, r0, r1, c0, c1, j0, s1, s2);
}
LOCKSTEP_SIMD_CLONES
void row_moments(const float* x, std::int64_t c, std::int64_t r0, std::int64_t r1, std::int64_t c0,
                 std::int64_t c1, double* s1, double* s2) {
  row_moments_body(x, c, r0, r1, c0, c1, s1, s2);
}
LOCKSTEP_SIMD_CLONES
void row_moments(const std::uint16_t* x, std::int64_t c, std::int64_t r0, std::int64_t r1,
                 std::int64_t c0, std::int64_t c1, double* s1, double* s2) {
  row_moments_body(x, c, r0, r1, c0, c1, s1, s2);
}

// sdy[j] = sum g, sdyx[j] = sum g (x - mean[c0 + j]) over rows [r0, r1), row by row in double,
// g = grad_at(dy, y); kSumCols columns at a time as row_moments.
template <class X, class Y>
[[gnu::always_inline]] inline void row_dy_dyx_tail(const X* x, const float* dy, const Y* y,
                                                   const float* mean, std::int64_t c,
                                                   std::int64_t r0, std::int64_t r1,
                                                   std::int64_t c0, std::int64_t c1,
                                                   std::int64_t j0, double* sdy, double* sdyx) {
  const std::int64_t w = c1 - c0;
  for (std::int64_t j = j0; j < w; ++j)
    sdy[j] = sdyx[j] = 0.0;
  for (std::int64_t i = r0; i < r1; ++i) {
    const std::int64_t off = i * c + c0;
    for (std::int64_t j = j0; j < w; ++j) {
      const double g = grad_at(dy, y, off + j);
      sdy[j] += g;
      sdyx[j] += g * (static_cast<double>(x_at(x, off + j)) - mean[c0 + j]);
    }
  }
}
template <class X, class Y>
[[gnu::always_inline]] inline void row_dy_dyx_body(const X* x, const float* dy, const Y* y,
                                                   const float* mean, std::int64_t c,
                                                   std::int64_t r0, std::int64_t r1,
                                                   std::int64_t c0, std::int64_t c1, double* sdy,
                                                   double* sdyx) {
  const std::int64_t w = c1 - c0;
  std::int64_t j0 = 0;
  for (; j0 + kSumCols <= w; j0 += kSumCols) {
    v8d a1[kSumVecs] = {}, a2[kSumVecs] = {}, m[kSumVecs];
    for (int h = 0; h < kSumVecs; ++h)
      m[h] = widen8(load8(mean + c0 + j0 + 8 * h));
    for (std::int64_t i = r0; i < r1; ++i) {
      const std::int64_t off = i * c + c0 + j0;
      for (int h = 0; h < kSumVecs; ++h) {
        const v8d g = widen8(grad_at8(dy, y, off + 8 * h));
        a1[h] += g;
        a2[h] += g * (widen8(load8(x + off + 8 * h)) - m[h]);
      }
    }
    std::memcpy(sdy + j0, a1, sizeof a1);
    std::memcpy(sdyx + j0, a2, sizeof a2);
  }
  row_dy_dyx_tail(x, dy, y, mean, c, r0, r1, c0, c1, j0, sdy, sdyx);
}
// M(X, Y) for every (x, y) element type the kernels take: x f32 or bf16, y the fused ReLU's output
// (f32 or bf16) or none.
// (clang-format reflows a list of macro calls differently on every run: kept as written.)
// clang-format off
#define LOCKSTEP_BN_XY_TYPES(M) \
  M(float, void)                \
  M(float, float)               \
  M(float, std::uint16_t)       \
  M(std::uint16_t, void)        \
  M(std::uint16_t, float)       \
  M(std::uint16_t, std::uint16_t)
// clang-format on

// One clone set per (x, y) element type.
#define LOCKSTEP_ROW_DY_DYX(X, Y)                                                                  \
  LOCKSTEP_SIMD_CLONES                                                                             \
  void row_dy_dyx(const X* x, const float* dy, const Y* y, const float* mean, std::int64_t c,      \
                  std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1, double* sdy, \
                  double* sdyx) {                                                                  \
    row_dy_dyx_body(x, dy, y, mean, c, r0, r1, c0, c1, sdy, sdyx);                                 \
  }
LOCKSTEP_BN_XY_TYPES(LOCKSTEP_ROW_DY_DYX)
#undef LOCKSTEP_ROW_DY_DYX

#ifdef LOCKSTEP_BN_AVX512
// The column groups of row_moments and row_dy_dyx in AVX-512 intrinsics, picked at run time where
// the CPU has it: GCC 12 splits the vector types' f32 -> f64 (and bf16 -> f32) conversions into
// 128-bit pieces even in the AVX-512 clone, which made these sums bound by instructions rather
// than memory. The arithmetic is the same per column (widen, add, multiply, in the same order, no
// FMA), so the bits are the generic loops'.
// f32 -> f64 of 8 lanes (_mm512_cvtps_pd's undefined pass-through trips GCC 12's
// -Wmaybe-uninitialized; an all-ones mask compiles to the same instruction).
__attribute__((target("avx512f"))) inline __m512d widen8d(__m256 v) {
  return _mm512_mask_cvtps_pd(_mm512_setzero_pd(), 0xFF, v);
}
__attribute__((target("avx512f"))) inline __m512d load8d(const float* p) {
  return widen8d(_mm256_loadu_ps(p));
}
__attribute__((target("avx512f"))) inline __m256 load8s(const std::uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
__attribute__((target("avx512f"))) inline __m256 load8s(const float* p) {
  return _mm256_loadu_ps(p);
}
__attribute__((target("avx512f"))) inline __m512d load8d(const std::uint16_t* p) {
  return widen8d(load8s(p));
}
// grad_at8 as doubles: dy, or dy where y > 0 (an ordered compare: a NaN y gives 0, as there).
template <class Y>
__attribute__((target("avx512f"))) inline __m512d grad8d(const float* dy, const Y* y,
                                                         std::int64_t k) {
  const __m256 g = _mm256_loadu_ps(dy + k);
  if constexpr (std::is_same_v<Y, void>) {
    return widen8d(g);
  } else {
    const __m256 pos = _mm256_cmp_ps(load8s(y + k), _mm256_setzero_ps(), _CMP_GT_OQ);
    return widen8d(_mm256_and_ps(g, pos));
  }
}

template <class X>
__attribute__((target("avx512f"))) std::int64_t row_moments_groups_avx512(
    const X* x, std::int64_t c, std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1,
    double* s1, double* s2) {
  const std::int64_t w = c1 - c0;
  std::int64_t j0 = 0;
  for (; j0 + kSumCols <= w; j0 += kSumCols) {
    __m512d a1[kSumVecs], a2[kSumVecs];
    for (int h = 0; h < kSumVecs; ++h)
      a1[h] = a2[h] = _mm512_setzero_pd();
    for (std::int64_t i = r0; i < r1; ++i) {
      const X* row = x + i * c + c0 + j0;
      for (int h = 0; h < kSumVecs; ++h) {
        const __m512d v = load8d(row + 8 * h);
        a1[h] = _mm512_add_pd(a1[h], v);
        a2[h] = _mm512_add_pd(a2[h], _mm512_mul_pd(v, v));
      }
    }
    for (int h = 0; h < kSumVecs; ++h) {
      _mm512_storeu_pd(s1 + j0 + 8 * h, a1[h]);
      _mm512_storeu_pd(s2 + j0 + 8 * h, a2[h]);
    }
  }
  return j0;
}

template <class X, class Y>
__attribute__((target("avx512f"))) std::int64_t row_dy_dyx_groups_avx512(
    const X* x, const float* dy, const Y* y, const float* mean, std::int64_t c, std::int64_t r0,
    std::int64_t r1, std::int64_t c0, std::int64_t c1, double* sdy, double* sdyx) {
  const std::int64_t w = c1 - c0;
  std::int64_t j0 = 0;
  for (; j0 + kSumCols <= w; j0 += kSumCols) {
    __m512d a1[kSumVecs], a2[kSumVecs], m[kSumVecs];
    for (int h = 0; h < kSumVecs; ++h) {
      a1[h] = a2[h] = _mm512_setzero_pd();
      m[h] = load8d(mean + c0 + j0 + 8 * h);
    }
    for (std::int64_t i = r0; i < r1; ++i) {
      const std::int64_t off = i * c + c0 + j0;
      for (int h = 0; h < kSumVecs; ++h) {
        const __m512d g = grad8d(dy, y, off + 8 * h);
        a1[h] = _mm512_add_pd(a1[h], g);
        a2[h] =
            _mm512_add_pd(a2[h], _mm512_mul_pd(g, _mm512_sub_pd(load8d(x + off + 8 * h), m[h])));
      }
    }
    for (int h = 0; h < kSumVecs; ++h) {
      _mm512_storeu_pd(sdy + j0 + 8 * h, a1[h]);
      _mm512_storeu_pd(sdyx + j0 + 8 * h, a2[h]);
    }
  }
  return j0;
}

bool cpu_has_avx512f() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}
std::atomic<bool>& bn_avx512_setting() {
  static std::atomic<bool> on{cpu_has_avx512f()};
  return on;
}
bool bn_avx512() {
  return bn_avx512_setting().load(std::memory_order_relaxed);
}
#endif

// The row sums as the kernels call them: the AVX-512 groups where the CPU has them, else the
// cloned generic loops.
template <class X>
void moments(const X* x, std::int64_t c, std::int64_t r0, std::int64_t r1, std::int64_t c0,
             std::int64_t c1, double* s1, double* s2) {
#ifdef LOCKSTEP_BN_AVX512
  if (bn_avx512()) {
    const std::int64_t j0 = row_moments_groups_avx512(x, c, r0, r1, c0, c1, s1, s2);
    row_moments_tail(x, c, r0, r1, c0, c1, j0, s1, s2);
    return;
  }
#endif
  row_moments(x, c, r0, r1, c0, c1, s1, s2);
}
template <class X, class Y>
void dy_dyx(const X* x, const float* dy, const Y* y, const float* mean, std::int64_t c,
            std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1, double* sdy,
            double* sdyx) {
#ifdef LOCKSTEP_BN_AVX512
  if (bn_avx512()) {
    const std::int64_t j0 = row_dy_dyx_groups_avx512(x, dy, y, mean, c, r0, r1, c0, c1, sdy, sdyx);
    row_dy_dyx_tail(x, dy, y, mean, c, r0, r1, c0, c1, j0, sdy, sdyx);
    return;
  }
#endif
  row_dy_dyx(x, dy, y, mean, c, r0, r1, c0, c1, sdy, sdyx);
}

// y = x * a[j] + b[j] over one row of n columns: the one place the affine map is written, so the
// fused epilogues below give batchnorm_forward_*'s bits in every SIMD clone.
template <class X>
[[gnu::always_inline]] inline void affine_row_body(const X* x, float* y, std::int64_t n,
                                                   const float* a, const float* b) {
  for (std::int64_t j = 0; j < n; ++j)
    y[j] = x_at(x, j) * a[j] + b[j];
}
LOCKSTEP_SIMD_CLONES
void affine_row(const float* x, float* y, std::int64_t n, const float* a, const float* b) {
  affine_row_body(x, y, n, a, b);
}
LOCKSTEP_SIMD_CLONES
void affine_row(const std::uint16_t* x, float* y, std::int64_t n, const float* a, const float* b) {
  affine_row_body(x, y, n, a, b);
}

// y = x * a + b over one plane of n values (a channel of one sample, NCHW).
void affine_plane(const float* x, float* y, std::int64_t n, float a, float b) {
  for (std::int64_t k = 0; k < n; ++k)
    y[k] = x[k] * a + b;
}

// The epilogue of batchnorm_act_forward_*, in place over z (n values): ops::add's z + residual,
// then relu_forward's select, as those ops compute them.
// The residual is f32 or bf16 (read widened, exact: add's bits on the widened residual).
template <class R>
[[gnu::always_inline]] inline void epilogue_body(float* z, const R* residual, bool relu,
                                                 std::int64_t n) {
  if (residual) {
    for (std::int64_t k = 0; k < n; ++k)
      z[k] = z[k] + widened(residual[k]);
  }
  if (relu) {
    for (std::int64_t k = 0; k < n; ++k)
      z[k] = z[k] > 0.0f ? z[k] : 0.0f;
  }
}
LOCKSTEP_SIMD_CLONES
void epilogue_in_place(float* z, const float* residual, bool relu, std::int64_t n) {
  epilogue_body(z, residual, relu, n);
}
LOCKSTEP_SIMD_CLONES
void epilogue_in_place(float* z, const std::uint16_t* residual, bool relu, std::int64_t n) {
  epilogue_body(z, residual, relu, n);
}

// dx = g * k1[j] + x * k2[j] + k3[j] over one row of n columns, g = grad_at (x, dy, y at the
// row's start).
template <class X, class Y>
[[gnu::always_inline]] inline void backward_dx_row_body(const X* x, const float* dy, const Y* y,
                                                        float* dx, std::int64_t n, const float* k1,
                                                        const float* k2, const float* k3) {
  for (std::int64_t j = 0; j < n; ++j)
    dx[j] = grad_at(dy, y, j) * k1[j] + x_at(x, j) * k2[j] + k3[j];
}
#define LOCKSTEP_BACKWARD_DX_ROW(X, Y)                                                     \
  LOCKSTEP_SIMD_CLONES                                                                     \
  void backward_dx_row(const X* x, const float* dy, const Y* y, float* dx, std::int64_t n, \
                       const float* k1, const float* k2, const float* k3) {                \
    backward_dx_row_body(x, dy, y, dx, n, k1, k2, k3);                                     \
  }
LOCKSTEP_BN_XY_TYPES(LOCKSTEP_BACKWARD_DX_ROW)
#undef LOCKSTEP_BACKWARD_DX_ROW
#undef LOCKSTEP_BN_XY_TYPES

// dx = g * k1 + x * k2 + k3 over one plane of n values (NCHW).
void backward_dx_plane(const float* x, const float* g, float* dx, std::int64_t n, float k1,
                       float k2, float k3) {
  for (std::int64_t k = 0; k < n; ++k)
    dx[k] = g[k] * k1 + x[k] * k2 + k3;
}

// The y argument of row_dy_dyx and backward_dx_row without a ReLU.
constexpr const void* kNoRelu = nullptr;

// Per-chunk column sums (s1, s2) of [N, C] into partial[(chunk * 2 + {0, 1}) * C + col], then
// their totals in chunk order into t1, t2 (C each).
template <class Chunk>
void row_sums(ThreadPool& pool, const BnShape& sh, double* partial, double* t1, double* t2,
              const Chunk& chunk) {
  for_row_chunks(pool, sh, [&](std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1) {
    double* p = partial + (r0 / kBnRows) * 2 * sh.c;
    chunk(r0, r1, c0, c1, p + c0, p + sh.c + c0);
  });
  const std::int64_t chunks = row_chunks(sh).chunks;
  for (std::int64_t col = 0; col < sh.c; ++col) {
    double a = 0.0, b = 0.0;
    for (std::int64_t k = 0; k < chunks; ++k) {
      a += partial[k * 2 * sh.c + col];
      b += partial[k * 2 * sh.c + sh.c + col];
    }
    t1[col] = a;
    t2[col] = b;
  }
}

// Runs fn(r0, r1, c0, c1) over all rows and columns of [N, C] for an elementwise pass.
template <class F>
void for_row_blocks(ThreadPool& pool, const BnShape& sh, const F& fn) {
  const std::int64_t rows =
      std::max<std::int64_t>(1, kParallelGrain / std::max<std::int64_t>(sh.c, 1));
  parallel_range(pool, sh.n, rows, [&](std::int64_t r0, std::int64_t r1) { fn(r0, r1, 0, sh.c); });
}

// Where batchnorm_act_forward_*'s values go: an f32 or a bf16 y, through the epilogue.
struct Epilogue {
  const float* residual = nullptr;
  const std::uint16_t* residual16 = nullptr;  // a bf16 residual instead
  bool relu = false;
  float* y32 = nullptr;
  std::uint16_t* y16 = nullptr;
};
Epilogue make_epilogue(const BatchNormEpilogue& e, Tensor& y) {
  Epilogue out;
  if (e.residual.defined() && e.residual.dtype() == DType::BF16)
    out.residual16 = bf16_in(e.residual);
  else if (e.residual.defined())
    out.residual = e.residual.data<float>();
  out.relu = e.relu;
  if (y.dtype() == DType::BF16)
    out.y16 = bf16_out(y);
  else
    out.y32 = y.data<float>();
  return out;
}

// Stores epilogue(z) at y[off, off + n), z = x * a + b as affine(dst) writes it into dst: in y
// itself when y is f32, else in the thread's scratch, rounded into y afterwards (ops.hpp: the f32
// result cast once, and nothing in between stored).
template <class Affine>
void store(const Epilogue& e, std::int64_t off, std::int64_t n, const Affine& affine) {
  float* z = e.y32 ? e.y32 + off : thread_scratch(static_cast<std::size_t>(n), 2);
  affine(z);
  if (e.residual16)
    epilogue_in_place(z, e.residual16 + off, e.relu, n);
  else if (e.residual || e.relu)
    epilogue_in_place(z, e.residual ? e.residual + off : nullptr, e.relu, n);
  if (e.y16) round_to_bf16(z, e.y16 + off, n);
}

// y = epilogue(x * a[col] + b[col]) over [N, C] rows, a row at a time.
template <class X>
void affine_rows(ThreadPool& pool, const BnShape& sh, const X* px, const float* a, const float* b,
                 const Epilogue& e) {
  for_row_blocks(pool, sh, [&](std::int64_t r0, std::int64_t r1, std::int64_t, std::int64_t) {
    for (std::int64_t i = r0; i < r1; ++i)
      store(e, i * sh.c, sh.c, [&](float* z) { affine_row(px + i * sh.c, z, sh.c, a, b); });
  });
}

// The same for channel c of every sample ([N, C, S], S > 1), in chunks of kBf16Chunk.
template <class X>
void affine_planes(const BnShape& sh, std::int64_t c, const X* px, float a, float b,
                   const Epilogue& e) {
  for (std::int64_t i = 0; i < sh.n; ++i) {
    const std::int64_t plane = (i * sh.c + c) * sh.s;
    for (std::int64_t k0 = 0; k0 < sh.s; k0 += kBf16Chunk) {
      const std::int64_t n = std::min(kBf16Chunk, sh.s - k0);
      store(e, plane + k0, n,
            [&](float* z) { affine_plane(x_f32(px + plane + k0, n), z, n, a, b); });
    }
  }
}

}  // namespace

bool use_bn_avx512(bool on) {
#ifdef LOCKSTEP_BN_AVX512
  return bn_avx512_setting().exchange(on && cpu_has_avx512f());
#else
  (void)on;
  return false;
#endif
}

void CpuBackend::batchnorm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                         Tensor& y, Tensor& save_mean, Tensor& save_invstd,
                                         Tensor& running_mean, Tensor& running_var, float momentum,
                                         float eps) {
  batchnorm_act_forward_train(x, gamma, beta, BatchNormEpilogue{}, y, save_mean, save_invstd,
                              running_mean, running_var, momentum, eps);
}

void CpuBackend::batchnorm_act_forward_train(const Tensor& x, const Tensor& gamma,
                                             const Tensor& beta, const BatchNormEpilogue& epilogue,
                                             Tensor& y, Tensor& save_mean, Tensor& save_invstd,
                                             Tensor& running_mean, Tensor& running_var,
                                             float momentum, float eps) {
  if (x.dtype() == DType::BF16)
    bn_forward_train(bf16_in(x), x, gamma, beta, epilogue, y, save_mean, save_invstd, running_mean,
                     running_var, momentum, eps);
  else
    bn_forward_train(x.data<float>(), x, gamma, beta, epilogue, y, save_mean, save_invstd,
                     running_mean, running_var, momentum, eps);
}

template <class X>
void CpuBackend::bn_forward_train(const X* px, const Tensor& x, const Tensor& gamma,
                                  const Tensor& beta, const BatchNormEpilogue& epilogue, Tensor& y,
                                  Tensor& save_mean, Tensor& save_invstd, Tensor& running_mean,
                                  Tensor& running_var, float momentum, float eps) {
  const BnShape sh = bn_shape(x);
  const double count = static_cast<double>(sh.n * sh.s);
  const Epilogue out = make_epilogue(epilogue, y);
  const float* pg = gamma.data<float>();
  const float* pb = beta.data<float>();
  float* pm = save_mean.data<float>();
  float* pis = save_invstd.data<float>();
  float* prm = running_mean.data<float>();
  float* prv = running_var.data<float>();
  // Channel c's statistics from its sum and sum of squares; returns y = x * a + b's (a, b).
  auto finish = [&](std::int64_t c, double s1, double s2) {
    const double mean = s1 / count;
    const double var = std::max(0.0, s2 / count - mean * mean);  // biased, for normalising
    const double invstd = 1.0 / std::sqrt(var + static_cast<double>(eps));
    pm[c] = static_cast<float>(mean);
    pis[c] = static_cast<float>(invstd);
    const double unbiased = count > 1.0 ? var * count / (count - 1.0) : var;
    prm[c] = static_cast<float>((1.0 - momentum) * prm[c] + momentum * mean);
    prv[c] = static_cast<float>((1.0 - momentum) * prv[c] + momentum * unbiased);
    return std::pair<float, float>{static_cast<float>(pg[c] * invstd),
                                   static_cast<float>(pb[c] - mean * pg[c] * invstd)};
  };
  if (sh.s > 1) {
    for_channels(ctx_.pool(), sh, [&](std::int64_t c) {
      double s1 = 0.0, s2 = 0.0;
      for (std::int64_t i = 0; i < sh.n; ++i) {
        double p1, p2;
        sum_and_squares(x_f32(px + (i * sh.c + c) * sh.s, sh.s), sh.s, p1, p2);
        s1 += p1;
        s2 += p2;
      }
      const auto [a, b] = finish(c, s1, s2);
      affine_planes(sh, c, px, a, b, out);
    });
    return;
  }
  const std::int64_t chunks = row_chunks(sh).chunks;
  double* partial = scratch_doubles(static_cast<std::size_t>((chunks + 1) * 2 * sh.c));
  double* t1 = partial + chunks * 2 * sh.c;
  double* t2 = t1 + sh.c;
  row_sums(ctx_.pool(), sh, partial, t1, t2,
           [&](std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1, double* s1,
               double* s2) { moments(px, sh.c, r0, r1, c0, c1, s1, s2); });
  float* ab = scratch_floats(static_cast<std::size_t>(2 * sh.c));
  for (std::int64_t c = 0; c < sh.c; ++c)
    std::tie(ab[c], ab[sh.c + c]) = finish(c, t1[c], t2[c]);
  affine_rows(ctx_.pool(), sh, px, ab, ab + sh.c, out);
}

void CpuBackend::batchnorm_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                        const Tensor& running_mean, const Tensor& running_var,
                                        float eps, Tensor& y) {
  batchnorm_act_forward_eval(x, gamma, beta, running_mean, running_var, eps, BatchNormEpilogue{},
                             y);
}

void CpuBackend::batchnorm_act_forward_eval(const Tensor& x, const Tensor& gamma,
                                            const Tensor& beta, const Tensor& running_mean,
                                            const Tensor& running_var, float eps,
                                            const BatchNormEpilogue& epilogue, Tensor& y) {
  const BnShape sh = bn_shape(x);
  const float* pg = gamma.data<float>();
  const float* pb = beta.data<float>();
  const float* prm = running_mean.data<float>();
  const float* prv = running_var.data<float>();
  const Epilogue out = make_epilogue(epilogue, y);
  float* ab = scratch_floats(static_cast<std::size_t>(2 * sh.c));
  for (std::int64_t c = 0; c < sh.c; ++c) {
    const double invstd = 1.0 / std::sqrt(static_cast<double>(prv[c]) + eps);
    ab[c] = static_cast<float>(pg[c] * invstd);
    ab[sh.c + c] = static_cast<float>(pb[c] - prm[c] * pg[c] * invstd);
  }
  auto apply = [&](const auto* px) {
    if (sh.s > 1) {
      for_channels(ctx_.pool(), sh,
                   [&](std::int64_t c) { affine_planes(sh, c, px, ab[c], ab[sh.c + c], out); });
      return;
    }
    affine_rows(ctx_.pool(), sh, px, ab, ab + sh.c, out);
  };
  if (x.dtype() == DType::BF16)
    apply(bf16_in(x));
  else
    apply(x.data<float>());
}

void CpuBackend::batchnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                    const Tensor& save_mean, const Tensor& save_invstd, Tensor& dx,
                                    Tensor& dgamma, Tensor& dbeta) {
  batchnorm_backward_impl(x, dy, Tensor(), gamma, save_mean, save_invstd, dx, dgamma, dbeta);
}

void CpuBackend::batchnorm_relu_backward(const Tensor& x, const Tensor& y, const Tensor& dy,
                                         const Tensor& gamma, const Tensor& save_mean,
                                         const Tensor& save_invstd, Tensor& dx, Tensor& dgamma,
                                         Tensor& dbeta) {
  batchnorm_backward_impl(x, dy, y, gamma, save_mean, save_invstd, dx, dgamma, dbeta);
}

void CpuBackend::batchnorm_backward_impl(const Tensor& x, const Tensor& dy, const Tensor& relu_y,
                                         const Tensor& gamma, const Tensor& save_mean,
                                         const Tensor& save_invstd, Tensor& dx, Tensor& dgamma,
                                         Tensor& dbeta) {
  // With xhat = (x - mean) * invstd and g the gradient reaching the BatchNorm's output (dy, or dy
  // through the ReLU: grad_at): dbeta = sum g, dgamma = sum g * xhat,
  // dx = gamma * invstd * (g - dbeta / count - xhat * dgamma / count).
  if (x.dtype() == DType::BF16)
    bn_backward(bf16_in(x), x, dy, relu_y, gamma, save_mean, save_invstd, dx, dgamma, dbeta);
  else
    bn_backward(x.data<float>(), x, dy, relu_y, gamma, save_mean, save_invstd, dx, dgamma, dbeta);
}

template <class X>
void CpuBackend::bn_backward(const X* px, const Tensor& x, const Tensor& dy, const Tensor& relu_y,
                             const Tensor& gamma, const Tensor& save_mean,
                             const Tensor& save_invstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const BnShape sh = bn_shape(x);
  const double count = static_cast<double>(sh.n * sh.s);
  const float* pdy = dy.data<float>();
  const float* y32 =
      relu_y.defined() && relu_y.dtype() == DType::F32 ? relu_y.data<float>() : nullptr;
  const std::uint16_t* y16 =
      relu_y.defined() && relu_y.dtype() == DType::BF16 ? bf16_in(relu_y) : nullptr;
  const float* pg = gamma.data<float>();
  const float* pm = save_mean.data<float>();
  const float* pis = save_invstd.data<float>();
  const Epilogue dx_out = make_epilogue({}, dx);  // f32, or a bf16 dx rounded once
  float* pdg = dgamma.data<float>();
  float* pdb = dbeta.data<float>();
  // Channel c's parameter gradients from its sums; returns dx = g * k1 + x * k2 + k3's k's.
  auto finish = [&](std::int64_t c, double sdy, double sdyx) {
    const double invstd = pis[c], mean = pm[c];
    const double dgam = sdyx * invstd;  // sum g * xhat
    const double dbet = sdy;
    pdg[c] += static_cast<float>(dgam);
    pdb[c] += static_cast<float>(dbet);
    const double g = pg[c] * invstd;
    return std::array<float, 3>{
        static_cast<float>(g), static_cast<float>(-g * invstd * dgam / count),
        static_cast<float>(-g * dbet / count + g * invstd * dgam / count * mean)};
  };
  if (sh.s > 1) {
    for_channels(ctx_.pool(), sh, [&](std::int64_t c) {
      // Through a ReLU, a plane's g is made once into the thread's scratch and read twice.
      float* g = (y32 || y16) ? thread_scratch(static_cast<std::size_t>(sh.s), 1) : nullptr;
      auto grad = [&](std::int64_t off) -> const float* {
        if (y32) {
          for (std::int64_t k = 0; k < sh.s; ++k)
            g[k] = grad_at(pdy + off, y32 + off, k);
        } else if (y16) {
          for (std::int64_t k = 0; k < sh.s; ++k)
            g[k] = grad_at(pdy + off, y16 + off, k);
        } else {
          return pdy + off;
        }
        return g;
      };
      double t1 = 0.0, t2 = 0.0;
      for (std::int64_t i = 0; i < sh.n; ++i) {
        const std::int64_t off = (i * sh.c + c) * sh.s;
        double p1, p2;
        sum_dy_dyx(x_f32(px + off, sh.s), grad(off), sh.s, pm[c], p1, p2);
        t1 += p1;
        t2 += p2;
      }
      const auto [a, b, d] = finish(c, t1, t2);
      for (std::int64_t i = 0; i < sh.n; ++i) {
        const std::int64_t off = (i * sh.c + c) * sh.s;
        const float* g_plane = grad(off);
        for (std::int64_t k0 = 0; k0 < sh.s; k0 += kBf16Chunk) {
          const std::int64_t n = std::min(kBf16Chunk, sh.s - k0);
          store(dx_out, off + k0, n, [&](float* z) {
            backward_dx_plane(x_f32(px + off + k0, n), g_plane + k0, z, n, a, b, d);
          });
        }
      }
    });
    return;
  }
  const std::int64_t chunks = row_chunks(sh).chunks;
  double* partial = scratch_doubles(static_cast<std::size_t>((chunks + 1) * 2 * sh.c));
  double* t1 = partial + chunks * 2 * sh.c;
  double* t2 = t1 + sh.c;
  row_sums(ctx_.pool(), sh, partial, t1, t2,
           [&](std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1, double* sdy,
               double* sdyx) {
             if (y32)
               dy_dyx(px, pdy, y32, pm, sh.c, r0, r1, c0, c1, sdy, sdyx);
             else if (y16)
               dy_dyx(px, pdy, y16, pm, sh.c, r0, r1, c0, c1, sdy, sdyx);
             else
               dy_dyx(px, pdy, kNoRelu, pm, sh.c, r0, r1, c0, c1, sdy, sdyx);
           });
  float* k = scratch_floats(static_cast<std::size_t>(3 * sh.c));
  for (std::int64_t c = 0; c < sh.c; ++c) {
    const auto [a, b, d] = finish(c, t1[c], t2[c]);
    k[c] = a;
    k[sh.c + c] = b;
    k[2 * sh.c + c] = d;
  }
  const float *k1 = k, *k2 = k + sh.c, *k3 = k + 2 * sh.c;
  for_row_blocks(ctx_.pool(), sh,
                 [&](std::int64_t r0, std::int64_t r1, std::int64_t, std::int64_t) {
                   for (std::int64_t i = r0; i < r1; ++i) {
                     const std::int64_t off = i * sh.c;
                     store(dx_out, off, sh.c, [&](float* z) {
                       if (y32)
                         backward_dx_row(px + off, pdy + off, y32 + off, z, sh.c, k1, k2, k3);
                       else if (y16)
                         backward_dx_row(px + off, pdy + off, y16 + off, z, sh.c, k1, k2, k3);
                       else
                         backward_dx_row(px + off, pdy + off, kNoRelu, z, sh.c, k1, k2, k3);
                     });
                   }
                 });
}

}  // namespace lockstep::ops::cpu
