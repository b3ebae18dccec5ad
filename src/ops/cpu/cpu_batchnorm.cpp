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
#include <algorithm>
#include <array>
#include <cmath>
#include <tuple>
#include <utility>

#include "lockstep/core/simd_clones.hpp"
#include "ops/cpu/cpu_backend.hpp"
#include "ops/cpu/parallel.hpp"
#include "ops/cpu/reduce.hpp"

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
LOCKSTEP_SIMD_CLONES
void row_moments(const float* x, std::int64_t c, std::int64_t r0, std::int64_t r1, std::int64_t c0,
                 std::int64_t c1, double* s1, double* s2) {
  const std::int64_t w = c1 - c0;
  for (std::int64_t j = 0; j < w; ++j)
    s1[j] = s2[j] = 0.0;
  for (std::int64_t i = r0; i < r1; ++i) {
    const float* row = x + i * c + c0;
    for (std::int64_t j = 0; j < w; ++j) {
      const double v = row[j];
      s1[j] += v;
      s2[j] += v * v;
    }
  }
}

// sdy[j] = sum dy, sdyx[j] = sum dy (x - mean[c0 + j]) over rows [r0, r1), row by row in double.
LOCKSTEP_SIMD_CLONES
void row_dy_dyx(const float* x, const float* dy, const float* mean, std::int64_t c, std::int64_t r0,
                std::int64_t r1, std::int64_t c0, std::int64_t c1, double* sdy, double* sdyx) {
  const std::int64_t w = c1 - c0;
  for (std::int64_t j = 0; j < w; ++j)
    sdy[j] = sdyx[j] = 0.0;
  for (std::int64_t i = r0; i < r1; ++i) {
    const float* xr = x + i * c + c0;
    const float* gr = dy + i * c + c0;
    for (std::int64_t j = 0; j < w; ++j) {
      const double g = gr[j];
      sdy[j] += g;
      sdyx[j] += g * (static_cast<double>(xr[j]) - mean[c0 + j]);
    }
  }
}

// y = x * a[col] + b[col] over rows [r0, r1) of columns [c0, c1).
LOCKSTEP_SIMD_CLONES
void row_affine(const float* x, float* y, std::int64_t c, std::int64_t r0, std::int64_t r1,
                std::int64_t c0, std::int64_t c1, const float* a, const float* b) {
  for (std::int64_t i = r0; i < r1; ++i) {
    const float* xr = x + i * c;
    float* yr = y + i * c;
    for (std::int64_t j = c0; j < c1; ++j)
      yr[j] = xr[j] * a[j] + b[j];
  }
}

// dx = dy * k1[col] + x * k2[col] + k3[col] over rows [r0, r1) of columns [c0, c1).
LOCKSTEP_SIMD_CLONES
void row_backward_dx(const float* x, const float* dy, float* dx, std::int64_t c, std::int64_t r0,
                     std::int64_t r1, std::int64_t c0, std::int64_t c1, const float* k1,
                     const float* k2, const float* k3) {
  for (std::int64_t i = r0; i < r1; ++i) {
    const std::int64_t off = i * c;
    for (std::int64_t j = c0; j < c1; ++j)
      dx[off + j] = dy[off + j] * k1[j] + x[off + j] * k2[j] + k3[j];
  }
}

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

}  // namespace

void CpuBackend::batchnorm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                         Tensor& y, Tensor& save_mean, Tensor& save_invstd,
                                         Tensor& running_mean, Tensor& running_var, float momentum,
                                         float eps) {
  const BnShape sh = bn_shape(x);
  const double count = static_cast<double>(sh.n * sh.s);
  const float* px = x.data<float>();
  float* py = y.data<float>();
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
        sum_and_squares(px + (i * sh.c + c) * sh.s, sh.s, p1, p2);
        s1 += p1;
        s2 += p2;
      }
      const auto [a, b] = finish(c, s1, s2);
      for (std::int64_t i = 0; i < sh.n; ++i) {
        const std::int64_t off = (i * sh.c + c) * sh.s;
        for (std::int64_t k = 0; k < sh.s; ++k)
          py[off + k] = px[off + k] * a + b;
      }
    });
    return;
  }
  const std::int64_t chunks = row_chunks(sh).chunks;
  double* partial = scratch_doubles(static_cast<std::size_t>((chunks + 1) * 2 * sh.c));
  double* t1 = partial + chunks * 2 * sh.c;
  double* t2 = t1 + sh.c;
  row_sums(ctx_.pool(), sh, partial, t1, t2,
           [&](std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1, double* s1,
               double* s2) { row_moments(px, sh.c, r0, r1, c0, c1, s1, s2); });
  float* ab = scratch_floats(static_cast<std::size_t>(2 * sh.c));
  for (std::int64_t c = 0; c < sh.c; ++c)
    std::tie(ab[c], ab[sh.c + c]) = finish(c, t1[c], t2[c]);
  for_row_blocks(ctx_.pool(), sh,
                 [&](std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1) {
                   row_affine(px, py, sh.c, r0, r1, c0, c1, ab, ab + sh.c);
                 });
}

void CpuBackend::batchnorm_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                        const Tensor& running_mean, const Tensor& running_var,
                                        float eps, Tensor& y) {
  const BnShape sh = bn_shape(x);
  const float* pg = gamma.data<float>();
  const float* pb = beta.data<float>();
  const float* prm = running_mean.data<float>();
  const float* prv = running_var.data<float>();
  const float* px = x.data<float>();
  float* py = y.data<float>();
  float* ab = scratch_floats(static_cast<std::size_t>(2 * sh.c));
  for (std::int64_t c = 0; c < sh.c; ++c) {
    const double invstd = 1.0 / std::sqrt(static_cast<double>(prv[c]) + eps);
    ab[c] = static_cast<float>(pg[c] * invstd);
    ab[sh.c + c] = static_cast<float>(pb[c] - prm[c] * pg[c] * invstd);
  }
  if (sh.s > 1) {
    for_channels(ctx_.pool(), sh, [&](std::int64_t c) {
      const float a = ab[c], b = ab[sh.c + c];
      for (std::int64_t i = 0; i < sh.n; ++i) {
        const std::int64_t off = (i * sh.c + c) * sh.s;
        for (std::int64_t k = 0; k < sh.s; ++k)
          py[off + k] = px[off + k] * a + b;
      }
    });
    return;
  }
  for_row_blocks(ctx_.pool(), sh,
                 [&](std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1) {
                   row_affine(px, py, sh.c, r0, r1, c0, c1, ab, ab + sh.c);
                 });
}

void CpuBackend::batchnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                    const Tensor& save_mean, const Tensor& save_invstd, Tensor& dx,
                                    Tensor& dgamma, Tensor& dbeta) {
  // With xhat = (x - mean) * invstd:  dbeta = sum dy, dgamma = sum dy * xhat,
  // dx = gamma * invstd * (dy - dbeta / count - xhat * dgamma / count).
  const BnShape sh = bn_shape(x);
  const double count = static_cast<double>(sh.n * sh.s);
  const float* px = x.data<float>();
  const float* pdy = dy.data<float>();
  const float* pg = gamma.data<float>();
  const float* pm = save_mean.data<float>();
  const float* pis = save_invstd.data<float>();
  float* pdx = dx.data<float>();
  float* pdg = dgamma.data<float>();
  float* pdb = dbeta.data<float>();
  // Channel c's parameter gradients from its sums; returns dx = dy * k1 + x * k2 + k3's k's.
  auto finish = [&](std::int64_t c, double sdy, double sdyx) {
    const double invstd = pis[c], mean = pm[c];
    const double dgam = sdyx * invstd;  // sum dy * xhat
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
      double t1 = 0.0, t2 = 0.0;
      for (std::int64_t i = 0; i < sh.n; ++i) {
        const std::int64_t off = (i * sh.c + c) * sh.s;
        double p1, p2;
        sum_dy_dyx(px + off, pdy + off, sh.s, pm[c], p1, p2);
        t1 += p1;
        t2 += p2;
      }
      const auto [a, b, d] = finish(c, t1, t2);
      for (std::int64_t i = 0; i < sh.n; ++i) {
        const std::int64_t off = (i * sh.c + c) * sh.s;
        for (std::int64_t k = 0; k < sh.s; ++k)
          pdx[off + k] = pdy[off + k] * a + px[off + k] * b + d;
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
               double* sdyx) { row_dy_dyx(px, pdy, pm, sh.c, r0, r1, c0, c1, sdy, sdyx); });
  float* k = scratch_floats(static_cast<std::size_t>(3 * sh.c));
  for (std::int64_t c = 0; c < sh.c; ++c) {
    const auto [a, b, d] = finish(c, t1[c], t2[c]);
    k[c] = a;
    k[sh.c + c] = b;
    k[2 * sh.c + c] = d;
  }
  for_row_blocks(ctx_.pool(), sh,
                 [&](std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1) {
                   row_backward_dx(px, pdy, pdx, sh.c, r0, r1, c0, c1, k, k + sh.c, k + 2 * sh.c);
                 });
}

}  // namespace lockstep::ops::cpu
