// Launchers for lockstep's own CUDA kernels (kernels.cu): everything that is not a cuBLAS GEMM or
// a cuDNN convolution. Plain pointers and sizes, one stream each: CudaBackend unpacks Tensors and
// calls these, so kernels.cu (the only nvcc translation unit, slow to compile) never sees Tensor.
// Every launcher checks its launch; none synchronises.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace lockstep::ops::cuda {

using i64 = std::int64_t;

// ---- memory and elementwise
void fill_u32(std::uint32_t* p, i64 n, std::uint32_t bits, cudaStream_t s);
// y viewed as [rows, cols]: y[i, j] += bias[j]
void add_row_bias(float* y, const float* bias, i64 rows, i64 cols, cudaStream_t s);
// dy viewed as [rows, cols]: db[j] += sum_i dy[i, j]
void sum_rows_acc(const float* dy, float* db, i64 rows, i64 cols, cudaStream_t s);
// y[n, c, k] += b[c] for y of shape [n, channels, inner]
void add_channel_bias(float* y, const float* b, i64 n, i64 channels, i64 inner, cudaStream_t s);
// db[c] += sum_{n,k} dy[n, c, k]
void sum_channels_acc(const float* dy, float* db, i64 n, i64 channels, i64 inner, cudaStream_t s);
void relu_forward(const float* x, float* y, i64 n, cudaStream_t s);
void relu_backward(const float* y, const float* dy, float* dx, i64 n, cudaStream_t s);
void gelu_forward(const float* x, float* y, i64 n, cudaStream_t s);
void gelu_backward(const float* x, const float* dy, float* dx, i64 n, cudaStream_t s);
void add(const float* a, const float* b, float* out, i64 n, cudaStream_t s);
void axpy(float alpha, const float* x, float* y, i64 n, cudaStream_t s);
void scale(float* x, float alpha, i64 n, cudaStream_t s);
void dropout_forward(const float* x, float* y, std::uint8_t* mask, i64 n, float p,
                     std::uint64_t seed, std::uint64_t stream, cudaStream_t s);
void dropout_backward(const float* dy, const std::uint8_t* mask, float* dx, i64 n, float p,
                      cudaStream_t s);
// y = x * scale_shift[c] + scale_shift[channels + c] for x of shape [n / (channels * inner),
// channels, inner]: the host folds /255, mean and std into one scale and shift per channel.
void normalize_u8(const std::uint8_t* x, float* y, i64 n, i64 channels, i64 inner,
                  const float* scale_shift, cudaStream_t s);
void normalize_f32(const float* x, float* y, i64 n, i64 channels, i64 inner,
                   const float* scale_shift, cudaStream_t s);

// ---- pooling (own kernels; see the note in cuda_backend.cpp on why not cuDNN)
struct PoolShape {
  i64 planes;  // N * C
  i64 h, w, oh, ow;
  int kh, kw, sh, sw, ph, pw;
};
void max_pool_forward(const float* x, float* y, std::int32_t* argmax, const PoolShape& p,
                      cudaStream_t s);
void max_pool_backward(const float* dy, const std::int32_t* argmax, float* dx, const PoolShape& p,
                       cudaStream_t s);
void avg_pool_forward(const float* x, float* y, const PoolShape& p, cudaStream_t s);
void avg_pool_backward(const float* dy, float* dx, const PoolShape& p, cudaStream_t s);

// ---- batch normalisation over x [n, channels, inner]
void batchnorm_forward_train(const float* x, const float* gamma, const float* beta, float* y,
                             float* save_mean, float* save_invstd, float* running_mean,
                             float* running_var, float momentum, float eps, i64 n, i64 channels,
                             i64 inner, cudaStream_t s);
void batchnorm_forward_eval(const float* x, const float* gamma, const float* beta,
                            const float* running_mean, const float* running_var, float eps,
                            float* y, i64 n, i64 channels, i64 inner, cudaStream_t s);
void batchnorm_backward(const float* x, const float* dy, const float* gamma, const float* save_mean,
                        const float* save_invstd, float* dx, float* dgamma, float* dbeta, i64 n,
                        i64 channels, i64 inner, cudaStream_t s);

// ---- loss and metrics. bad_label: one device word; the first row with a label outside
// [0, classes) is recorded as (row << 32 | label) by atomicMin, never cleared here.
void softmax_xent_forward(const float* logits, const std::int32_t* labels, float* probs,
                          float* row_loss, float* loss, i64 rows, i64 classes,
                          unsigned long long* bad_label, cudaStream_t s);
void softmax_xent_backward(const float* probs, const std::int32_t* labels, float scale,
                           float* dlogits, i64 rows, i64 classes, unsigned long long* bad_label,
                           cudaStream_t s);
// *count = number of rows whose (first) argmax equals the label.
void count_correct(const float* logits, const std::int32_t* labels, i64 rows, i64 classes,
                   unsigned long long* count, cudaStream_t s);

// Deterministic sum of squares in double: fixed grid, partials[kReducePartials], then one block.
inline constexpr int kReducePartials = 256;
void sum_squares(const float* x, i64 n, double* partials, double* out, cudaStream_t s);
// *nonfinite = 1 when some element is Inf or NaN (set to 0 first).
void find_nonfinite(const float* x, i64 n, int* nonfinite, cudaStream_t s);

// ---- optimizers
struct SgdArgs {
  float lr, momentum, dampening, weight_decay;
  bool nesterov, first_step;
};
void sgd_update(float* param, const float* grad, float* buf, i64 n, const SgdArgs& a,
                cudaStream_t s);
struct AdamWArgs {
  float beta1, beta2, eps;
  float decay;         // 1 - lr * weight_decay
  float step_size;     // lr / (1 - beta1^t), computed on the host in double
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t), likewise
};
void adamw_update(float* param, const float* grad, float* m, float* v, i64 n, const AdamWArgs& a,
                  cudaStream_t s);

}  // namespace lockstep::ops::cuda
