// CPU softmax cross-entropy, accuracy count, global reductions and optimizer updates.
// Reductions over many elements go in fixed blocks (kReduceBlock elements, kLossRows rows) whose
// partial sums are added in block order, so they are independent of the thread count.
#include <cmath>

#include "lockstep/core/error.hpp"
#include "ops/bad_input.hpp"
#include "ops/cpu/cpu_backend.hpp"
#include "ops/cpu/optim_loops.hpp"
#include "ops/cpu/parallel.hpp"
#include "ops/cpu/reduce.hpp"
#include "ops/cpu/simd.hpp"

namespace lockstep::ops::cpu {
namespace {

constexpr std::int64_t kLossRows = 64;

// Labels are read on the host once, before any parallel work, so the error names the first bad
// row whatever the thread count.
// `first_row`: the batch row of labels[0], which the error names.
void check_labels(const char* op, const std::int32_t* labels, std::int64_t n, std::int64_t classes,
                  std::int64_t first_row = 0) {
  for (std::int64_t i = 0; i < n; ++i) {
    LOCKSTEP_CHECK_HINT(labels[i] >= 0 && labels[i] < classes, kBadLabelHint,
                        bad_label_message(op, labels[i], first_row + i, classes));
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

// With label smoothing eps a row's loss is (1 - eps) nll + eps mean_k(-log p_k), and
// -log p_k = nll + x[label] - x_k, so it is nll + eps (x[label] - mean_k x_k): the mean of the
// logits is read before softmax_row may overwrite them (in place).
void CpuBackend::softmax_xent_forward(const Tensor& logits, const Tensor& labels, Tensor& probs,
                                      Tensor& loss, float label_smoothing) {
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
          for (std::int64_t i = blk * kLossRows; i < std::min(n, (blk + 1) * kLossRows); ++i) {
            const float* row = px + i * c;
            double smoothing = 0.0;
            if (label_smoothing > 0.0f) {
              double sum_x = 0.0;
              for (std::int64_t j = 0; j < c; ++j)
                sum_x += row[j];
              smoothing = label_smoothing * (row[pl[i]] - sum_x / static_cast<double>(c));
            }
            block_loss += softmax_row(row, pp + i * c, c, pl[i]) + smoothing;
          }
          partial[blk] = block_loss;
        }
      });
  double total = 0.0;
  for (std::int64_t blk = 0; blk < blocks; ++blk)
    total += partial[blk];
  loss.data<float>()[0] = n ? static_cast<float>(total / static_cast<double>(n)) : 0.0f;
}

void CpuBackend::softmax_xent_backward(const Tensor& probs, const Tensor& labels, float scale,
                                       Tensor& dlogits, float label_smoothing) {
  const std::int64_t n = probs.dim(0), c = probs.dim(1);
  // The target is (1 - eps) onehot + eps / C; eps = 0 subtracts 0 and 1 exactly as before.
  const float off = label_smoothing / static_cast<float>(c);
  const float hit = 1.0f - label_smoothing;
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
                       drow[j] = (prow[j] - off) * scale;
                     drow[pl[i]] = (p_label - hit - off) * scale;
                   }
                 });
}

// Per row, softmax_xent_forward's loss and softmax_xent_backward's dlogits with the same
// expressions in the same order (so the same bits), the second written over the first.
void CpuBackend::softmax_xent_chunk(Tensor& logits, const Tensor& labels, std::int64_t first_row,
                                    std::int64_t classes, float scale, Tensor& row_loss,
                                    float label_smoothing) {
  const std::int64_t rows = logits.dim(0), width = logits.dim(1), c = classes;
  float* px = logits.data<float>();
  const std::int32_t* pl = labels.data<std::int32_t>() + first_row;
  double* pr = row_loss.data<double>() + first_row;
  check_labels("softmax_xent_chunk", pl, rows, c, first_row);
  const float off = label_smoothing / static_cast<float>(c);
  const float hit = 1.0f - label_smoothing;
  parallel_range(ctx_.pool(), rows, std::max<std::int64_t>(1, kParallelGrain / width),
                 [&](std::int64_t r0, std::int64_t r1) {
                   for (std::int64_t i = r0; i < r1; ++i) {
                     float* row = px + i * width;
                     double smoothing = 0.0;
                     if (label_smoothing > 0.0f) {
                       double sum_x = 0.0;
                       for (std::int64_t j = 0; j < c; ++j)
                         sum_x += row[j];
                       smoothing = label_smoothing * (row[pl[i]] - sum_x / static_cast<double>(c));
                     }
                     pr[i] = softmax_row(row, row, c, pl[i]) + smoothing;
                     const float p_label = row[pl[i]];
                     LOCKSTEP_IVDEP
                     for (std::int64_t j = 0; j < c; ++j)
                       row[j] = (row[j] - off) * scale;
                     row[pl[i]] = (p_label - hit - off) * scale;
                     std::fill(row + c, row + width, 0.0f);  // the padded columns: no gradient
                   }
                 });
}

void CpuBackend::mean_row_loss(const Tensor& row_loss, Tensor& loss) {
  const std::int64_t n = row_loss.dim(0);
  const double* pr = row_loss.data<double>();
  double total = 0.0;
  for (std::int64_t b0 = 0; b0 < n; b0 += kLossRows) {
    double block_loss = 0.0;
    for (std::int64_t i = b0; i < std::min(n, b0 + kLossRows); ++i)
      block_loss += pr[i];
    total += block_loss;
  }
  loss.data<float>()[0] = n ? static_cast<float>(total / static_cast<double>(n)) : 0.0f;
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
                     partial[blk] = sum_of_squares(px + s, e - s);
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
  parallel_range(ctx_.pool(), blocks, std::max<std::int64_t>(1, kParallelGrain / kReduceBlock),
                 [&](std::int64_t b0, std::int64_t b1) {
                   for (std::int64_t blk = b0; blk < b1; ++blk) {
                     const std::int64_t s = blk * kReduceBlock, e = std::min(n, s + kReduceBlock);
                     partial[blk] = nonfinite_probe(px + s, e - s);
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
  float* pbuf = p.momentum != 0.0f ? momentum_buf.data<float>() : nullptr;
  const SgdLoop loop(p, /*decay=*/true);
  parallel_range(ctx_.pool(), param.numel(), kParallelGrain, [&](std::int64_t b, std::int64_t e) {
    loop(pw + b, pg + b, pbuf ? pbuf + b : nullptr, e - b);
  });
}

void CpuBackend::adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                              const AdamWParams& p) {
  float* pw = param.data<float>();
  const float* pg = grad.data<float>();
  float* pm = m.data<float>();
  float* pv = v.data<float>();
  const AdamWLoop loop(p, /*apply_decay=*/true);
  parallel_range(
      ctx_.pool(), param.numel(), kParallelGrain / 4,
      [&](std::int64_t b, std::int64_t e) { loop(pw + b, pg + b, pm + b, pv + b, e - b); });
}

}  // namespace lockstep::ops::cpu
