// Batch normalisation over x [n, channels, inner]: the kernels, their launchers and CudaBackend's
// batchnorm methods.
//
// Trade-offs:
// - Own kernels with PyTorch's semantics: batch statistics with the biased variance for
//   normalisation, running_var updated with the unbiased variance,
//   running = (1 - momentum) * running + momentum * batch_stat.
// - Per-channel statistics use one block per channel, reading the channel's N*inner values in a
//   coalesced loop when inner >= 32; the block reduction is deterministic (block_reduce.cuh), so
//   the same inputs give the same bits run after run.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ops/cuda/block_reduce.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_backend.hpp"

namespace lockstep::ops::cuda {
namespace {

// ---------------------------------------------------------------- batch normalisation

// One block per channel: mean, then the biased variance around it (two passes, no catastrophic
// cancellation), running statistics with the unbiased variance (PyTorch), then y.
__global__ void batchnorm_forward_train_kernel(const float* x, const float* gamma,
                                               const float* beta, float* y, float* save_mean,
                                               float* save_invstd, float* running_mean,
                                               float* running_var, float momentum, float eps, i64 n,
                                               i64 channels, i64 inner) {
  // Statistics in double, as the CPU backend keeps them: a channel of a CNN batch holds
  // 10^5..10^6 values, where float partial sums would cost digits the tests can see.
  i64 c = blockIdx.x, m = n * inner;
  double acc = 0.0;
  for (i64 k = threadIdx.x; k < m; k += blockDim.x)
    acc += x[channel_index(k, c, channels, inner)];
  double mean = block_sum(acc) / static_cast<double>(m);
  acc = 0.0;
  for (i64 k = threadIdx.x; k < m; k += blockDim.x) {
    double d = x[channel_index(k, c, channels, inner)] - mean;
    acc += d * d;
  }
  double sq = block_sum(acc);
  double var = sq / static_cast<double>(m);
  double invstd = 1.0 / sqrt(var + static_cast<double>(eps));
  if (threadIdx.x == 0) {
    save_mean[c] = static_cast<float>(mean);
    save_invstd[c] = static_cast<float>(invstd);
    double unbiased = m > 1 ? sq / static_cast<double>(m - 1) : var;
    running_mean[c] = static_cast<float>((1.0 - momentum) * running_mean[c] + momentum * mean);
    running_var[c] = static_cast<float>((1.0 - momentum) * running_var[c] + momentum * unbiased);
  }
  // y = x * a + b with a, b folded per channel (the CPU backend's form).
  float a = static_cast<float>(gamma[c] * invstd);
  float b = static_cast<float>(beta[c] - mean * gamma[c] * invstd);
  for (i64 k = threadIdx.x; k < m; k += blockDim.x) {
    i64 idx = channel_index(k, c, channels, inner);
    y[idx] = x[idx] * a + b;
  }
}

__global__ void batchnorm_forward_eval_kernel(const float* x, const float* gamma, const float* beta,
                                              const float* running_mean, const float* running_var,
                                              float eps, float* y, i64 total, i64 channels,
                                              i64 inner) {
  LOCKSTEP_GRID_STRIDE(i, total) {
    i64 c = (i / inner) % channels;
    double invstd = 1.0 / sqrt(static_cast<double>(running_var[c]) + eps);
    float a = static_cast<float>(gamma[c] * invstd);
    float b = static_cast<float>(beta[c] - running_mean[c] * gamma[c] * invstd);
    y[i] = x[i] * a + b;
  }
}

__global__ void batchnorm_backward_kernel(const float* x, const float* dy, const float* gamma,
                                          const float* save_mean, const float* save_invstd,
                                          float* dx, float* dgamma, float* dbeta, i64 n,
                                          i64 channels, i64 inner) {
  // With xhat = (x - mean) * invstd: dbeta = sum dy, dgamma = sum dy * xhat,
  // dx = gamma * invstd * (dy - dbeta / m - xhat * dgamma / m).
  i64 c = blockIdx.x, m = n * inner;
  float mean = save_mean[c], invstd = save_invstd[c];
  double sum_dy = 0.0, sum_dy_xhat = 0.0;
  for (i64 k = threadIdx.x; k < m; k += blockDim.x) {
    i64 idx = channel_index(k, c, channels, inner);
    sum_dy += dy[idx];
    sum_dy_xhat += static_cast<double>(dy[idx]) * ((x[idx] - mean) * invstd);
  }
  sum_dy = block_sum(sum_dy);
  sum_dy_xhat = block_sum(sum_dy_xhat);
  if (threadIdx.x == 0) {
    dgamma[c] += static_cast<float>(sum_dy_xhat);
    dbeta[c] += static_cast<float>(sum_dy);
  }
  float scale = gamma[c] * invstd;
  float mean_dy = static_cast<float>(sum_dy / static_cast<double>(m));
  float mean_dy_xhat = static_cast<float>(sum_dy_xhat / static_cast<double>(m));
  for (i64 k = threadIdx.x; k < m; k += blockDim.x) {
    i64 idx = channel_index(k, c, channels, inner);
    float xhat = (x[idx] - mean) * invstd;
    dx[idx] = scale * (dy[idx] - mean_dy - xhat * mean_dy_xhat);
  }
}

}  // namespace

// ---- batch normalisation over x [n, channels, inner]
void batchnorm_forward_train(const float* x, const float* gamma, const float* beta, float* y,
                             float* save_mean, float* save_invstd, float* running_mean,
                             float* running_var, float momentum, float eps, i64 n, i64 channels,
                             i64 inner, cudaStream_t s) {
  if (channels == 0 || n * inner == 0) return;
  batchnorm_forward_train_kernel<<<static_cast<unsigned>(channels), kThreads, 0, s>>>(
      x, gamma, beta, y, save_mean, save_invstd, running_mean, running_var, momentum, eps, n,
      channels, inner);
  LOCKSTEP_CHECK_LAUNCH();
}

void batchnorm_forward_eval(const float* x, const float* gamma, const float* beta,
                            const float* running_mean, const float* running_var, float eps,
                            float* y, i64 n, i64 channels, i64 inner, cudaStream_t s) {
  i64 total = n * channels * inner;
  LOCKSTEP_LAUNCH(batchnorm_forward_eval_kernel, total, s, x, gamma, beta, running_mean,
                  running_var, eps, y, total, channels, inner);
}

void batchnorm_backward(const float* x, const float* dy, const float* gamma, const float* save_mean,
                        const float* save_invstd, float* dx, float* dgamma, float* dbeta, i64 n,
                        i64 channels, i64 inner, cudaStream_t s) {
  if (channels == 0 || n * inner == 0) return;
  batchnorm_backward_kernel<<<static_cast<unsigned>(channels), kThreads, 0, s>>>(
      x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta, n, channels, inner);
  LOCKSTEP_CHECK_LAUNCH();
}

namespace {

struct BnDims {
  std::int64_t n, c, inner;
};
BnDims bn_dims(const Tensor& x) {
  std::int64_t n = x.dim(0), c = x.dim(1);
  return {n, c, n * c > 0 ? x.numel() / (n * c) : 1};
}

}  // namespace

void CudaBackend::batchnorm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                          Tensor& y, Tensor& save_mean, Tensor& save_invstd,
                                          Tensor& running_mean, Tensor& running_var, float momentum,
                                          float eps) {
  activate();
  auto [n, c, inner] = bn_dims(x);
  cuda::batchnorm_forward_train(x.data<float>(), gamma.data<float>(), beta.data<float>(),
                                y.data<float>(), save_mean.data<float>(), save_invstd.data<float>(),
                                running_mean.data<float>(), running_var.data<float>(), momentum,
                                eps, n, c, inner, stream_);
}
void CudaBackend::batchnorm_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                         const Tensor& running_mean, const Tensor& running_var,
                                         float eps, Tensor& y) {
  activate();
  auto [n, c, inner] = bn_dims(x);
  cuda::batchnorm_forward_eval(x.data<float>(), gamma.data<float>(), beta.data<float>(),
                               running_mean.data<float>(), running_var.data<float>(), eps,
                               y.data<float>(), n, c, inner, stream_);
}
void CudaBackend::batchnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                     const Tensor& save_mean, const Tensor& save_invstd, Tensor& dx,
                                     Tensor& dgamma, Tensor& dbeta) {
  activate();
  auto [n, c, inner] = bn_dims(x);
  cuda::batchnorm_backward(x.data<float>(), dy.data<float>(), gamma.data<float>(),
                           save_mean.data<float>(), save_invstd.data<float>(), dx.data<float>(),
                           dgamma.data<float>(), dbeta.data<float>(), n, c, inner, stream_);
}

}  // namespace lockstep::ops::cuda
