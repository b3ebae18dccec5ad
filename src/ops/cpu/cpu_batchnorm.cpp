// CPU batch normalisation over x viewed as [N, C, S] (S = H*W, or 1 for [N, C]).
// Statistics are accumulated in double, one pass (sum and sum of squares), per channel in a fixed
// order: a channel (S > 1) or a block of channels (S == 1, where a channel is a strided column)
// is always reduced by one thread, so the result does not depend on the thread count.
#include <algorithm>
#include <cmath>

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

// Columns per block for the [N, C] layout: the double accumulators fit in L1.
constexpr std::int64_t kBnCols = 64;

// Runs fn(c0, c1) over channel ranges: single channels for S > 1, column blocks for S == 1.
template <class F>
void for_channel_blocks(ThreadPool& pool, const BnShape& sh, const F& fn) {
  const std::int64_t per_channel = sh.n * sh.s;
  if (sh.s > 1) {
    parallel_range(
        pool, sh.c,
        std::max<std::int64_t>(1, kParallelGrain / std::max<std::int64_t>(per_channel, 1)),
        [&](std::int64_t c0, std::int64_t c1) {
          for (std::int64_t c = c0; c < c1; ++c)
            fn(c, c + 1);
        });
  } else {
    const std::int64_t blocks = (sh.c + kBnCols - 1) / kBnCols;
    parallel_range(pool, blocks,
                   std::max<std::int64_t>(
                       1, kParallelGrain / std::max<std::int64_t>(per_channel * kBnCols, 1)),
                   [&](std::int64_t b0, std::int64_t b1) {
                     for (std::int64_t b = b0; b < b1; ++b)
                       fn(b * kBnCols, std::min(sh.c, (b + 1) * kBnCols));
                   });
  }
}

// Per-channel sum and sum of squares of x over channels [c0, c1).
void channel_moments(const float* x, const BnShape& sh, std::int64_t c0, std::int64_t c1,
                     double* s1, double* s2) {
  if (sh.s > 1) {
    for (std::int64_t c = c0; c < c1; ++c) {
      double t1 = 0.0, t2 = 0.0;
      for (std::int64_t i = 0; i < sh.n; ++i) {
        double p1, p2;
        sum_and_squares(x + (i * sh.c + c) * sh.s, sh.s, p1, p2);
        t1 += p1;
        t2 += p2;
      }
      s1[c - c0] = t1;
      s2[c - c0] = t2;
    }
  } else {
    const std::int64_t w = c1 - c0;
    for (std::int64_t j = 0; j < w; ++j)
      s1[j] = s2[j] = 0.0;
    for (std::int64_t i = 0; i < sh.n; ++i) {
      const float* row = x + i * sh.c + c0;
      for (std::int64_t j = 0; j < w; ++j) {
        double v = row[j];
        s1[j] += v;
        s2[j] += v * v;
      }
    }
  }
}

// y = x * a[c] + b[c] over channels [c0, c1) (a, b indexed from c0).
void channel_affine(const float* x, float* y, const BnShape& sh, std::int64_t c0, std::int64_t c1,
                    const float* a, const float* b) {
  if (sh.s > 1) {
    for (std::int64_t c = c0; c < c1; ++c) {
      const float ac = a[c - c0], bc = b[c - c0];
      for (std::int64_t i = 0; i < sh.n; ++i) {
        const std::int64_t off = (i * sh.c + c) * sh.s;
        for (std::int64_t k = 0; k < sh.s; ++k)
          y[off + k] = x[off + k] * ac + bc;
      }
    }
  } else {
    const std::int64_t w = c1 - c0;
    for (std::int64_t i = 0; i < sh.n; ++i) {
      const float* xr = x + i * sh.c + c0;
      float* yr = y + i * sh.c + c0;
      for (std::int64_t j = 0; j < w; ++j)
        yr[j] = xr[j] * a[j] + b[j];
    }
  }
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
  for_channel_blocks(ctx_.pool(), sh, [&](std::int64_t c0, std::int64_t c1) {
    double s1[kBnCols], s2[kBnCols];
    float a[kBnCols], b[kBnCols];
    channel_moments(px, sh, c0, c1, s1, s2);
    for (std::int64_t c = c0; c < c1; ++c) {
      const std::int64_t j = c - c0;
      const double mean = s1[j] / count;
      const double var = std::max(0.0, s2[j] / count - mean * mean);  // biased, for normalising
      const double invstd = 1.0 / std::sqrt(var + static_cast<double>(eps));
      pm[c] = static_cast<float>(mean);
      pis[c] = static_cast<float>(invstd);
      const double unbiased = count > 1.0 ? var * count / (count - 1.0) : var;
      prm[c] = static_cast<float>((1.0 - momentum) * prm[c] + momentum * mean);
      prv[c] = static_cast<float>((1.0 - momentum) * prv[c] + momentum * unbiased);
      a[j] = static_cast<float>(pg[c] * invstd);
      b[j] = static_cast<float>(pb[c] - mean * pg[c] * invstd);
    }
    channel_affine(px, py, sh, c0, c1, a, b);
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
  for_channel_blocks(ctx_.pool(), sh, [&](std::int64_t c0, std::int64_t c1) {
    float a[kBnCols], b[kBnCols];
    for (std::int64_t c = c0; c < c1; ++c) {
      const double invstd = 1.0 / std::sqrt(static_cast<double>(prv[c]) + eps);
      a[c - c0] = static_cast<float>(pg[c] * invstd);
      b[c - c0] = static_cast<float>(pb[c] - prm[c] * pg[c] * invstd);
    }
    channel_affine(px, py, sh, c0, c1, a, b);
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
  for_channel_blocks(ctx_.pool(), sh, [&](std::int64_t c0, std::int64_t c1) {
    double sdy[kBnCols], sdyx[kBnCols];
    // dx = dy * k1 + x * k2 + k3 per channel.
    float k1[kBnCols], k2[kBnCols], k3[kBnCols];
    const std::int64_t w = c1 - c0;
    if (sh.s > 1) {
      for (std::int64_t c = c0; c < c1; ++c) {
        double t1 = 0.0, t2 = 0.0;
        for (std::int64_t i = 0; i < sh.n; ++i) {
          const std::int64_t off = (i * sh.c + c) * sh.s;
          double p1, p2;
          sum_dy_dyx(px + off, pdy + off, sh.s, pm[c], p1, p2);
          t1 += p1;
          t2 += p2;
        }
        sdy[c - c0] = t1;
        sdyx[c - c0] = t2;
      }
    } else {
      for (std::int64_t j = 0; j < w; ++j)
        sdy[j] = sdyx[j] = 0.0;
      for (std::int64_t i = 0; i < sh.n; ++i) {
        const float* xr = px + i * sh.c + c0;
        const float* gr = pdy + i * sh.c + c0;
        for (std::int64_t j = 0; j < w; ++j) {
          double g = gr[j];
          sdy[j] += g;
          sdyx[j] += g * (static_cast<double>(xr[j]) - pm[c0 + j]);
        }
      }
    }
    for (std::int64_t c = c0; c < c1; ++c) {
      const std::int64_t j = c - c0;
      const double invstd = pis[c], mean = pm[c];
      const double dgam = sdyx[j] * invstd;  // sum dy * xhat
      const double dbet = sdy[j];
      pdg[c] += static_cast<float>(dgam);
      pdb[c] += static_cast<float>(dbet);
      const double g = pg[c] * invstd;
      k1[j] = static_cast<float>(g);
      k2[j] = static_cast<float>(-g * invstd * dgam / count);
      k3[j] = static_cast<float>(-g * dbet / count + g * invstd * dgam / count * mean);
    }
    if (sh.s > 1) {
      for (std::int64_t c = c0; c < c1; ++c) {
        const float a = k1[c - c0], b = k2[c - c0], d = k3[c - c0];
        for (std::int64_t i = 0; i < sh.n; ++i) {
          const std::int64_t off = (i * sh.c + c) * sh.s;
          for (std::int64_t k = 0; k < sh.s; ++k)
            pdx[off + k] = pdy[off + k] * a + px[off + k] * b + d;
        }
      }
    } else {
      for (std::int64_t i = 0; i < sh.n; ++i) {
        const std::int64_t off = i * sh.c + c0;
        for (std::int64_t j = 0; j < w; ++j)
          pdx[off + j] = pdy[off + j] * k1[j] + px[off + j] * k2[j] + k3[j];
      }
    }
  });
}

}  // namespace lockstep::ops::cpu
