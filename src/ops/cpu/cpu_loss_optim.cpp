// CPU softmax cross-entropy, accuracy count, global reductions and optimizer updates.
// Reductions over many elements go in fixed blocks (kReduceBlock elements, kLossRows rows) whose
// partial sums are added in block order, so they are independent of the thread count.
#include <cmath>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "lockstep/core/error.hpp"
#include "ops/cpu/cpu_backend.hpp"
#include "ops/cpu/parallel.hpp"
#include "ops/cpu/reduce.hpp"
#include "ops/cpu/simd.hpp"

namespace lockstep::ops::cpu {
namespace {

constexpr std::int64_t kLossRows = 64;

// Labels are read on the host once, before any parallel work, so the error names the first bad
// row whatever the thread count.
void check_labels(const char* op, const std::int32_t* labels, std::int64_t n,
                  std::int64_t classes) {
  for (std::int64_t i = 0; i < n; ++i) {
    LOCKSTEP_CHECK_HINT(labels[i] >= 0 && labels[i] < classes,
                        "labels must be class indices in [0, num_classes): check the dataset's "
                        "num_classes against the model's output layer",
                        op, ": label ", labels[i], " in row ", i, " is outside [0, ", classes, ")");
  }
}

// probs = softmax(row) and returns -log p[label]. Vectorised (a GPT's vocabulary makes this
// 50257 exponentials per token); probs may be the logits row itself (in place): the label's logit
// is read before anything is written.
LOCKSTEP_SIMD_CLONES
double softmax_row(const float* row, float* prow, std::int64_t c, std::int32_t label) {
  using simd::kWidth;
  const float x_label = row[label];
  simd::vf vm = simd::splat(-INFINITY);
  std::int64_t j = 0;
  for (; j + kWidth <= c; j += kWidth)
    vm = simd::vmax(vm, simd::load(row + j));
  float mx = simd::hmax(vm);
  for (; j < c; ++j)
    mx = std::max(mx, row[j]);
  simd::vf vs = simd::splat(0.0f);
  for (j = 0; j + kWidth <= c; j += kWidth) {
    simd::vf e = simd::exp(simd::load(row + j) - mx);
    simd::store(prow + j, e);
    vs += e;
  }
  float tail = 0.0f;
  for (; j < c; ++j) {
    prow[j] = simd::exp(simd::splat(row[j] - mx))[0];
    tail += prow[j];
  }
  const float sum = simd::hsum(vs) + tail;
  const float inv = 1.0f / sum;
  for (j = 0; j + kWidth <= c; j += kWidth)
    simd::store(prow + j, simd::load(prow + j) * inv);
  for (; j < c; ++j)
    prow[j] *= inv;
  // -log p[label] = log(sum) - (x[label] - max): finite even when p underflows.
  return std::log(static_cast<double>(sum)) - (x_label - mx);
}

}  // namespace

void CpuBackend::softmax_xent_forward(const Tensor& logits, const Tensor& labels, Tensor& probs,
                                      Tensor& loss) {
  const std::int64_t n = logits.dim(0), c = logits.dim(1);
  const float* px = logits.data<float>();
  const std::int32_t* pl = labels.data<std::int32_t>();
  float* pp = probs.data<float>();
  check_labels("softmax_xent_forward", pl, n, c);
  const std::int64_t blocks = (n + kLossRows - 1) / kLossRows;
  double* partial = scratch_doubles(static_cast<std::size_t>(blocks));
  parallel_range(
      ctx_.pool(), blocks,
      std::max<std::int64_t>(1, kParallelGrain / 8 / std::max<std::int64_t>(kLossRows * c, 1)),
      [&](std::int64_t b0, std::int64_t b1) {
        for (std::int64_t blk = b0; blk < b1; ++blk) {
          double block_loss = 0.0;
          for (std::int64_t i = blk * kLossRows; i < std::min(n, (blk + 1) * kLossRows); ++i)
            block_loss += softmax_row(px + i * c, pp + i * c, c, pl[i]);
          partial[blk] = block_loss;
        }
      });
  double total = 0.0;
  for (std::int64_t blk = 0; blk < blocks; ++blk)
    total += partial[blk];
  loss.data<float>()[0] = n ? static_cast<float>(total / static_cast<double>(n)) : 0.0f;
}

void CpuBackend::softmax_xent_backward(const Tensor& probs, const Tensor& labels, float scale,
                                       Tensor& dlogits) {
  const std::int64_t n = probs.dim(0), c = probs.dim(1);
  const float* pp = probs.data<float>();
  const std::int32_t* pl = labels.data<std::int32_t>();
  float* pd = dlogits.data<float>();
  check_labels("softmax_xent_backward", pl, n, c);
  parallel_range(ctx_.pool(), n,
                 std::max<std::int64_t>(1, kParallelGrain / std::max<std::int64_t>(c, 1)),
                 [&](std::int64_t r0, std::int64_t r1) {
                   for (std::int64_t i = r0; i < r1; ++i) {
                     const float* prow = pp + i * c;
                     float* drow = pd + i * c;
                     const float p_label = prow[pl[i]];  // before drow (maybe prow) changes
                     LOCKSTEP_IVDEP
                     for (std::int64_t j = 0; j < c; ++j)
                       drow[j] = prow[j] * scale;
                     drow[pl[i]] = (p_label - 1.0f) * scale;
                   }
                 });
}

std::int64_t CpuBackend::count_correct(const Tensor& logits, const Tensor& labels) {
  const std::int64_t n = logits.dim(0), c = logits.dim(1);
  const float* px = logits.data<float>();
  const std::int32_t* pl = labels.data<std::int32_t>();
  check_labels("count_correct", pl, n, c);
  std::int64_t correct = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float* row = px + i * c;
    std::int64_t best = 0;  // first maximum wins, as torch.argmax
    for (std::int64_t j = 1; j < c; ++j) {
      if (row[j] > row[best]) best = j;
    }
    correct += best == pl[i] ? 1 : 0;
  }
  return correct;
}

double CpuBackend::sum_squares(const Tensor& x) {
  const std::int64_t n = x.numel();
  const float* px = x.data<float>();
  const std::int64_t blocks = (n + kReduceBlock - 1) / kReduceBlock;
  double* partial = scratch_doubles(static_cast<std::size_t>(blocks));
  parallel_range(ctx_.pool(), blocks, std::max<std::int64_t>(1, kParallelGrain / kReduceBlock),
                 [&](std::int64_t b0, std::int64_t b1) {
                   for (std::int64_t blk = b0; blk < b1; ++blk) {
                     const std::int64_t s = blk * kReduceBlock, e = std::min(n, s + kReduceBlock);
                     double unused, sq;
                     sum_and_squares(px + s, e - s, unused, sq);
                     partial[blk] = sq;
                   }
                 });
  double total = 0.0;
  for (std::int64_t blk = 0; blk < blocks; ++blk)
    total += partial[blk];
  return total;
}

bool CpuBackend::all_finite(const Tensor& x) {
  const std::int64_t n = x.numel();
  const float* px = x.data<float>();
  const std::int64_t blocks = (n + kReduceBlock - 1) / kReduceBlock;
  double* partial = scratch_doubles(static_cast<std::size_t>(blocks));
  // x * 0 is 0 for finite x and NaN for Inf or NaN, and NaN survives any sum: a branch-free,
  // vectorisable test.
  parallel_range(ctx_.pool(), blocks, std::max<std::int64_t>(1, kParallelGrain / kReduceBlock),
                 [&](std::int64_t b0, std::int64_t b1) {
                   for (std::int64_t blk = b0; blk < b1; ++blk) {
                     const std::int64_t s = blk * kReduceBlock, e = std::min(n, s + kReduceBlock);
                     float acc[kLanes] = {};
                     std::int64_t i = s;
                     for (; i + kLanes <= e; i += kLanes) {
                       for (int j = 0; j < kLanes; ++j)
                         acc[j] += px[i + j] * 0.0f;
                     }
                     for (; i < e; ++i)
                       acc[0] += px[i] * 0.0f;
                     float t = 0.0f;
                     for (int j = 0; j < kLanes; ++j)
                       t += acc[j];
                     partial[blk] = t;
                   }
                 });
  for (std::int64_t blk = 0; blk < blocks; ++blk) {
    if (std::isnan(partial[blk])) return false;
  }
  return true;
}

void CpuBackend::sgd_update(Tensor& param, const Tensor& grad, Tensor& momentum_buf,
                            const SgdParams& p) {
  float* pw = param.data<float>();
  const float* pg = grad.data<float>();
  const float lr = p.lr, wd = p.weight_decay, mu = p.momentum, damp = 1.0f - p.dampening;
  if (mu == 0.0f) {
    parallel_range(ctx_.pool(), param.numel(), kParallelGrain, [&](std::int64_t b, std::int64_t e) {
      LOCKSTEP_IVDEP
      for (std::int64_t i = b; i < e; ++i)
        pw[i] -= lr * (pg[i] + wd * pw[i]);
    });
    return;
  }
  float* pbuf = momentum_buf.data<float>();
  const bool first = p.first_step, nesterov = p.nesterov;
  parallel_range(ctx_.pool(), param.numel(), kParallelGrain, [&](std::int64_t b, std::int64_t e) {
    LOCKSTEP_IVDEP
    for (std::int64_t i = b; i < e; ++i) {
      const float g = pg[i] + wd * pw[i];
      const float buf = first ? g : mu * pbuf[i] + damp * g;
      pbuf[i] = buf;
      pw[i] -= lr * (nesterov ? g + mu * buf : buf);
    }
  });
}

void CpuBackend::adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                              const AdamWParams& p) {
  float* pw = param.data<float>();
  const float* pg = grad.data<float>();
  float* pm = m.data<float>();
  float* pv = v.data<float>();
  const double t = static_cast<double>(p.step);
  const float decay = 1.0f - p.lr * p.weight_decay;
  const float b1 = p.beta1, b2 = p.beta2, eps = p.eps;
  // As torch.optim.AdamW: step_size = lr / bc1, denom = sqrt(v) / sqrt(bc2) + eps.
  const float step_size = static_cast<float>(p.lr / (1.0 - std::pow(static_cast<double>(b1), t)));
  const float inv_sqrt_bc2 =
      static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(static_cast<double>(b2), t)));
  const float one_b1 = 1.0f - b1, one_b2 = 1.0f - b2;
  parallel_range(
      ctx_.pool(), param.numel(), kParallelGrain / 4, [&](std::int64_t b, std::int64_t e) {
        std::int64_t i = b;
#if defined(__SSE2__)
        // std::sqrt keeps errno semantics, which stops GCC from vectorising this loop; _mm_sqrt_ps
        // is the same correctly rounded square root four at a time, and the operations below are
        // the scalar loop's, in the same order, so every element gets the same bits on either path.
        const __m128 vb1 = _mm_set1_ps(b1), vb2 = _mm_set1_ps(b2), v1b1 = _mm_set1_ps(one_b1);
        const __m128 v1b2 = _mm_set1_ps(one_b2), vdecay = _mm_set1_ps(decay);
        const __m128 vstep = _mm_set1_ps(step_size), vbc2 = _mm_set1_ps(inv_sqrt_bc2);
        const __m128 veps = _mm_set1_ps(eps);
        for (; i + 4 <= e; i += 4) {
          const __m128 g = _mm_loadu_ps(pg + i);
          const __m128 mi = _mm_add_ps(_mm_mul_ps(vb1, _mm_loadu_ps(pm + i)), _mm_mul_ps(v1b1, g));
          const __m128 vi =
              _mm_add_ps(_mm_mul_ps(vb2, _mm_loadu_ps(pv + i)), _mm_mul_ps(_mm_mul_ps(v1b2, g), g));
          _mm_storeu_ps(pm + i, mi);
          _mm_storeu_ps(pv + i, vi);
          const __m128 denom = _mm_add_ps(_mm_mul_ps(_mm_sqrt_ps(vi), vbc2), veps);
          const __m128 w = _mm_sub_ps(_mm_mul_ps(_mm_loadu_ps(pw + i), vdecay),
                                      _mm_div_ps(_mm_mul_ps(vstep, mi), denom));
          _mm_storeu_ps(pw + i, w);
        }
#endif
        for (; i < e; ++i) {
          const float g = pg[i];
          const float mi = b1 * pm[i] + one_b1 * g;
          const float vi = b2 * pv[i] + one_b2 * g * g;
          pm[i] = mi;
          pv[i] = vi;
          pw[i] = pw[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
        }
      });
}

}  // namespace lockstep::ops::cpu
