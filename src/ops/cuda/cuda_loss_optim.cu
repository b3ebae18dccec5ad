// Softmax cross-entropy, accuracy, the sum of squares and the finiteness check, and the
// per-tensor SGD and AdamW steps: the kernels, their launchers and CudaBackend's methods of the
// family.
//
// Trade-offs:
// - A bad label is recorded on the device and reported by the next call that waits for the
//   stream anyway (the note above softmax_xent_forward's method says why).
// - One warp per row for the softmax and the argmax; the mean loss and the sum of squares are
//   deterministic (fixed grids, block_reduce.cuh, no float atomics).
// - The optimizer formulas are torch.optim's and the CPU backend's; cuda_flat.cu writes them once
//   more per chunk for the fused steps.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ops/cuda/block_reduce.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_backend.hpp"

namespace lockstep::ops::cuda {
namespace {

// ---------------------------------------------------------------- loss and metrics

__device__ __forceinline__ void record_bad_label(unsigned long long* bad, i64 row,
                                                 std::int32_t label) {
  unsigned long long word =
      (static_cast<unsigned long long>(row) << 32) | static_cast<std::uint32_t>(label);
  atomicMin(bad, word);
}

// One warp per row: max, sum of exp, probabilities, -log p[label] = log(sum) - (x[label] - max).
// Label smoothing eps adds eps (x[label] - mean_k x_k) (the CPU backend's note says why).
__global__ void softmax_xent_forward_kernel(const float* logits, const std::int32_t* labels,
                                            float* probs, float* row_loss, i64 rows, i64 classes,
                                            float label_smoothing, unsigned long long* bad) {
  i64 row = (static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float* x = logits + row * classes;
  float* p = probs + row * classes;
  // The label's logit is read before any lane writes p (the __syncwarp orders them): probs may
  // be the logits themselves (a GPT's [B*T, 50257] logits need not be stored twice).
  const std::int32_t label = labels[row];
  const bool label_ok = label >= 0 && label < classes;
  const float x_label = lane == 0 && label_ok ? x[label] : 0.0f;
  __syncwarp();  // orders that read before every lane's writes below
  float mx = -INFINITY, sum_x = 0.0f;
  for (i64 j = lane; j < classes; j += 32) {
    mx = fmaxf(mx, x[j]);
    sum_x += x[j];
  }
  mx = warp_max(mx);
  sum_x = warp_sum(sum_x);  // lane 0 holds the row's sum
  float sum = 0.0f;
  for (i64 j = lane; j < classes; j += 32)
    sum += expf(x[j] - mx);
  sum = warp_sum(sum);
  sum = __shfl_sync(0xffffffffu, sum, 0);
  float inv = 1.0f / sum;
  for (i64 j = lane; j < classes; j += 32)
    p[j] = expf(x[j] - mx) * inv;
  if (lane == 0) {
    if (!label_ok) {
      record_bad_label(bad, row, label);
      row_loss[row] = NAN;
    } else {
      float loss = logf(sum) - (x_label - mx);
      if (label_smoothing > 0.0f)
        loss += label_smoothing * (x_label - sum_x / static_cast<float>(classes));
      row_loss[row] = loss;
    }
  }
}

__global__ void mean_kernel(const float* values, i64 n, float* out) {
  float acc = 0.0f;
  for (i64 i = threadIdx.x; i < n; i += blockDim.x)
    acc += values[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) *out = acc / static_cast<float>(n);
}

// The target is hit * onehot + off: hit = 1 - eps, off = eps / C (1 and 0 without smoothing).
__global__ void softmax_xent_backward_kernel(const float* probs, const std::int32_t* labels,
                                             float scale, float hit, float off, float* dlogits,
                                             i64 rows, i64 classes, unsigned long long* bad) {
  i64 total = rows * classes;
  LOCKSTEP_GRID_STRIDE(i, total) {
    i64 row = i / classes, j = i % classes;
    std::int32_t label = labels[row];
    if (j == 0 && (label < 0 || label >= classes)) record_bad_label(bad, row, label);
    dlogits[i] = (probs[i] - (j == label ? hit : 0.0f) - off) * scale;
  }
}

// The classifier's fused loss over one chunk of rows (ops::softmax_xent_chunk), one warp per row:
// the forward kernel's max, sums and -log p[label] over the first `classes` of `width` columns,
// then dlogits written over the logits (the backward kernel's formula) and zeros in the padded
// columns. Every lane reads its columns for the reductions before the shuffles that end them,
// and writes only its own columns after: in place is safe. labels and row_loss start at the
// chunk's first row (first_row, for the error).
__global__ void softmax_xent_chunk_kernel(float* logits, const std::int32_t* labels, i64 rows,
                                          i64 width, i64 classes, float scale, float hit, float off,
                                          float label_smoothing, double* row_loss, i64 first_row,
                                          unsigned long long* bad) {
  i64 row = (static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  int lane = threadIdx.x & 31;
  if (row >= rows) return;
  float* x = logits + row * width;
  const std::int32_t label = labels[row];
  const bool label_ok = label >= 0 && label < classes;
  const float x_label = label_ok ? x[label] : 0.0f;
  __syncwarp();  // orders that read before the lane that owns x[label] overwrites it below
  float mx = -INFINITY, sum_x = 0.0f;
  for (i64 j = lane; j < classes; j += 32) {
    mx = fmaxf(mx, x[j]);
    sum_x += x[j];
  }
  mx = warp_max(mx);
  sum_x = warp_sum(sum_x);  // lane 0 holds the row's sum
  float sum = 0.0f;
  for (i64 j = lane; j < classes; j += 32)
    sum += expf(x[j] - mx);
  sum = warp_sum(sum);
  sum = __shfl_sync(0xffffffffu, sum, 0);
  const float inv = 1.0f / sum;
  for (i64 j = lane; j < classes; j += 32)
    x[j] = (expf(x[j] - mx) * inv - (j == label ? hit : 0.0f) - off) * scale;
  for (i64 j = classes + lane; j < width; j += 32)
    x[j] = 0.0f;
  if (lane == 0) {
    if (!label_ok) {
      record_bad_label(bad, first_row + row, label);
      row_loss[row] = NAN;
    } else {
      float loss = logf(sum) - (x_label - mx);
      if (label_smoothing > 0.0f)
        loss += label_smoothing * (x_label - sum_x / static_cast<float>(classes));
      row_loss[row] = loss;
    }
  }
}

// The mean of the f64 row losses in one block (a batch has at most some ten thousand rows).
__global__ void mean_row_loss_kernel(const double* row_loss, i64 n, float* out) {
  double acc = 0.0;
  for (i64 i = threadIdx.x; i < n; i += blockDim.x)
    acc += row_loss[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) *out = n > 0 ? static_cast<float>(acc / static_cast<double>(n)) : 0.0f;
}

// One warp per row; ties go to the lowest index (std::max_element's rule). A label outside
// [0, classes) is recorded as the loss kernels do (the CPU backend's count_correct throws).
__global__ void count_correct_kernel(const float* logits, const std::int32_t* labels, i64 rows,
                                     i64 classes, unsigned long long* count,
                                     unsigned long long* bad) {
  i64 row = (static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float* x = logits + row * classes;
  float best = -INFINITY;
  i64 best_j = classes;  // "none yet": loses every comparison below
  for (i64 j = lane; j < classes; j += 32)
    if (best_j == classes || x[j] > best) {
      best = x[j];
      best_j = j;
    }
  for (int offset = 16; offset > 0; offset >>= 1) {
    float other = __shfl_xor_sync(0xffffffffu, best, offset);
    i64 other_j = __shfl_xor_sync(0xffffffffu, best_j, offset);
    bool take = other_j != classes &&
                (best_j == classes || other > best || (other == best && other_j < best_j));
    if (take) {
      best = other;
      best_j = other_j;
    }
  }
  if (lane == 0) {
    const std::int32_t label = labels[row];
    if (label < 0 || label >= classes)
      record_bad_label(bad, row, label);
    else if (best_j == label)
      atomicAdd(count, 1ull);
  }
}

__global__ void sum_squares_partial_kernel(const float* x, i64 n, double* partials) {
  double acc = 0.0;
  LOCKSTEP_GRID_STRIDE(i, n) {
    double v = x[i];
    acc += v * v;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void sum_partials_kernel(const double* partials, int n, double* out) {
  double acc = threadIdx.x < n ? partials[threadIdx.x] : 0.0;
  acc = block_sum(acc);
  if (threadIdx.x == 0) *out = acc;
}

__global__ void find_nonfinite_kernel(const float* x, i64 n, int* flag) {
  LOCKSTEP_GRID_STRIDE(i, n) {
    if (!isfinite(x[i])) *flag = 1;  // every writer writes the same value: no atomic needed
  }
}

// ---------------------------------------------------------------- optimizers

__global__ void sgd_update_kernel(float* param, const float* grad, float* buf, i64 n, SgdArgs a) {
  LOCKSTEP_GRID_STRIDE(i, n) {
    float g = grad[i] + a.weight_decay * param[i];
    if (a.momentum != 0.0f) {
      float b = a.first_step ? g : a.momentum * buf[i] + (1.0f - a.dampening) * g;
      buf[i] = b;
      g = a.nesterov ? g + a.momentum * b : b;
    }
    param[i] -= a.lr * g;
  }
}

// As torch.optim.AdamW (and the CPU backend): step_size = lr / bc1,
// denominator = sqrt(v) / sqrt(bc2) + eps.
__global__ void adamw_update_kernel(float* param, const float* grad, float* m, float* v, i64 n,
                                    AdamWArgs a) {
  LOCKSTEP_GRID_STRIDE(i, n) {
    float g = grad[i];
    float mi = a.beta1 * m[i] + (1.0f - a.beta1) * g;
    float vi = a.beta2 * v[i] + (1.0f - a.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] = param[i] * a.decay - a.step_size * mi / (sqrtf(vi) * a.inv_sqrt_bc2 + a.eps);
  }
}

}  // namespace

// ---- loss and metrics. bad_label: one device word; the first row with a label outside
// [0, classes) is recorded as (row << 32 | label) by atomicMin, never cleared here.
void softmax_xent_forward(const float* logits, const std::int32_t* labels, float* probs,
                          float* row_loss, float* loss, i64 rows, i64 classes,
                          float label_smoothing, unsigned long long* bad_label, cudaStream_t s) {
  if (rows == 0) return;
  constexpr int kRowsPerBlock = kThreads / 32;
  unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  softmax_xent_forward_kernel<<<blocks, kThreads, 0, s>>>(logits, labels, probs, row_loss, rows,
                                                          classes, label_smoothing, bad_label);
  LOCKSTEP_CHECK_LAUNCH();
  mean_kernel<<<1, kThreads, 0, s>>>(row_loss, rows, loss);
  LOCKSTEP_CHECK_LAUNCH();
}

void softmax_xent_backward(const float* probs, const std::int32_t* labels, float scale,
                           float label_smoothing, float* dlogits, i64 rows, i64 classes,
                           unsigned long long* bad_label, cudaStream_t s) {
  const float hit = 1.0f - label_smoothing;
  const float off = classes > 0 ? label_smoothing / static_cast<float>(classes) : 0.0f;
  LOCKSTEP_LAUNCH(softmax_xent_backward_kernel, rows * classes, s, probs, labels, scale, hit, off,
                  dlogits, rows, classes, bad_label);
}

void softmax_xent_chunk(float* logits, const std::int32_t* labels, i64 rows, i64 width, i64 classes,
                        float scale, float label_smoothing, double* row_loss, i64 first_row,
                        unsigned long long* bad_label, cudaStream_t s) {
  if (rows == 0) return;
  const float hit = 1.0f - label_smoothing;
  const float off = label_smoothing / static_cast<float>(classes);
  constexpr int kRowsPerBlock = kThreads / 32;
  unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  softmax_xent_chunk_kernel<<<blocks, kThreads, 0, s>>>(logits, labels, rows, width, classes, scale,
                                                        hit, off, label_smoothing, row_loss,
                                                        first_row, bad_label);
  LOCKSTEP_CHECK_LAUNCH();
}

void mean_row_loss(const double* row_loss, i64 n, float* loss, cudaStream_t s) {
  mean_row_loss_kernel<<<1, kThreads, 0, s>>>(row_loss, n, loss);
  LOCKSTEP_CHECK_LAUNCH();
}

// *count = number of rows whose (first) argmax equals the label.
void count_correct(const float* logits, const std::int32_t* labels, i64 rows, i64 classes,
                   unsigned long long* count, unsigned long long* bad, cudaStream_t s) {
  LOCKSTEP_CHECK_CUDA(cudaMemsetAsync(count, 0, sizeof(*count), s));
  if (rows == 0) return;
  constexpr int kRowsPerBlock = kThreads / 32;
  unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  count_correct_kernel<<<blocks, kThreads, 0, s>>>(logits, labels, rows, classes, count, bad);
  LOCKSTEP_CHECK_LAUNCH();
}

void sum_squares(const float* x, i64 n, double* partials, double* out, cudaStream_t s) {
  // Always the same grid, whatever n, so the summation tree (and the result) depends on n only.
  sum_squares_partial_kernel<<<kReducePartials, kThreads, 0, s>>>(x, n, partials);
  LOCKSTEP_CHECK_LAUNCH();
  sum_partials_kernel<<<1, kReducePartials, 0, s>>>(partials, kReducePartials, out);
  LOCKSTEP_CHECK_LAUNCH();
}

// *nonfinite = 1 when some element is Inf or NaN (set to 0 first).
void find_nonfinite(const float* x, i64 n, int* nonfinite, cudaStream_t s) {
  LOCKSTEP_CHECK_CUDA(cudaMemsetAsync(nonfinite, 0, sizeof(int), s));
  LOCKSTEP_LAUNCH(find_nonfinite_kernel, n, s, x, n, nonfinite);
}

void sgd_update(float* param, const float* grad, float* buf, i64 n, const SgdArgs& a,
                cudaStream_t s) {
  LOCKSTEP_LAUNCH(sgd_update_kernel, n, s, param, grad, buf, n, a);
}

void adamw_update(float* param, const float* grad, float* m, float* v, i64 n, const AdamWArgs& a,
                  cudaStream_t s) {
  LOCKSTEP_LAUNCH(adamw_update_kernel, n, s, param, grad, m, v, n, a);
}

AdamWArgs adamw_args(const AdamWParams& p) {
  const double t = static_cast<double>(p.step);
  return AdamWArgs{
      p.beta1,
      p.beta2,
      p.eps,
      1.0f - p.lr * p.weight_decay,
      static_cast<float>(p.lr / (1.0 - std::pow(static_cast<double>(p.beta1), t))),
      static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(static_cast<double>(p.beta2), t)))};
}

// ---- loss and metrics. A label outside [0, C) is recorded on the device and reported by the
// next call that waits for the stream anyway (synchronize, count_correct, sum_squares, a copy
// to the host): checking here would cost a stream synchronisation per step.
void CudaBackend::softmax_xent_forward(const Tensor& logits, const Tensor& labels, Tensor& probs,
                                       Tensor& loss, float label_smoothing) {
  activate();
  std::int64_t rows = logits.dim(0), classes = logits.dim(1);
  Tensor row_loss = Tensor::empty({rows}, DType::F32, device_);
  label_classes_ = classes;
  note_label_op("softmax_xent_forward");
  cuda::softmax_xent_forward(logits.data<float>(), labels.data<std::int32_t>(), probs.data<float>(),
                             row_loss.data<float>(), loss.data<float>(), rows, classes,
                             label_smoothing, &results()->bad_label, stream_);
}
void CudaBackend::softmax_xent_backward(const Tensor& probs, const Tensor& labels, float scale,
                                        Tensor& dlogits, float label_smoothing) {
  activate();
  label_classes_ = probs.dim(1);
  note_label_op("softmax_xent_backward");
  cuda::softmax_xent_backward(probs.data<float>(), labels.data<std::int32_t>(), scale,
                              label_smoothing, dlogits.data<float>(), probs.dim(0), probs.dim(1),
                              &results()->bad_label, stream_);
}
void CudaBackend::softmax_xent_chunk(Tensor& logits, const Tensor& labels, std::int64_t first_row,
                                     std::int64_t classes, float scale, Tensor& row_loss,
                                     float label_smoothing) {
  activate();
  label_classes_ = classes;
  note_label_op("softmax_xent_chunk");
  cuda::softmax_xent_chunk(logits.data<float>(), labels.data<std::int32_t>() + first_row,
                           logits.dim(0), logits.dim(1), classes, scale, label_smoothing,
                           row_loss.data<double>() + first_row, first_row, &results()->bad_label,
                           stream_);
}
void CudaBackend::mean_row_loss(const Tensor& row_loss, Tensor& loss) {
  activate();
  cuda::mean_row_loss(row_loss.data<double>(), row_loss.dim(0), loss.data<float>(), stream_);
}
std::int64_t CudaBackend::count_correct(const Tensor& logits, const Tensor& labels) {
  activate();
  label_classes_ = logits.dim(1);
  note_label_op("count_correct");
  cuda::count_correct(logits.data<float>(), labels.data<std::int32_t>(), logits.dim(0),
                      logits.dim(1), &results()->correct, &results()->bad_label, stream_);
  return static_cast<std::int64_t>(read_results().correct);
}

double CudaBackend::sum_squares(const Tensor& x) {
  activate();
  cuda::sum_squares(x.data<float>(), x.numel(), partials_.data<double>(), &results()->sum, stream_);
  return read_results().sum;
}
bool CudaBackend::all_finite(const Tensor& x) {
  activate();
  find_nonfinite(x.data<float>(), x.numel(), &results()->nonfinite, stream_);
  return read_results().nonfinite == 0;
}

// ---- optimizers
void CudaBackend::sgd_update(Tensor& param, const Tensor& grad, Tensor& momentum_buf,
                             const SgdParams& p) {
  activate();
  SgdArgs a{p.lr, p.momentum, p.dampening, p.weight_decay, p.nesterov, p.first_step};
  float* buf = momentum_buf.defined() ? momentum_buf.data<float>() : nullptr;
  cuda::sgd_update(param.data<float>(), grad.data<float>(), buf, param.numel(), a, stream_);
}
void CudaBackend::adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                               const AdamWParams& p) {
  activate();
  cuda::adamw_update(param.data<float>(), grad.data<float>(), m.data<float>(), v.data<float>(),
                     param.numel(), adamw_args(p), stream_);
}

}  // namespace lockstep::ops::cuda
