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
// - Rows ([R, C], inner == 1: BatchNorm1d, and a channels-last BatchNorm2d's [N*H*W, C]): a
//   channel is a strided column, which one block per channel would read 4 bytes per 32-byte
//   sector. Instead blocks of 32 channels x 8 row lanes read whole row segments (coalesced) over
//   a fixed chunk of kRowsPerChunk rows each and write per-chunk partial sums in double; one
//   thread per channel adds the chunks in order and folds the statistics into per-channel
//   coefficients; an elementwise pass applies them. Fixed chunks and orders: deterministic.
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

// ---------------------------------------------------------------- rows: x [rows, channels]

constexpr int kRowCols = 32;         // channels per block (a warp reads 32 consecutive floats)
constexpr int kRowLanes = 8;         // row lanes per block
constexpr i64 kRowsPerChunk = 1024;  // rows per partial sum

// partial[(chunk * 2 + {0, 1}) * C + c] = the chunk's sums of a(x, dy) and b(x, dy) for column c:
// (x, x^2) for the statistics, (dy, dy * (x - mean[c])) for the backward.
template <bool kBackward>
__global__ void bn_rows_partials_kernel(const float* x, const float* dy, const float* mean,
                                        double* partial, i64 rows, i64 channels) {
  __shared__ double s1[kRowLanes][kRowCols], s2[kRowLanes][kRowCols];
  const i64 c = static_cast<i64>(blockIdx.x) * kRowCols + threadIdx.x;
  const i64 chunk = blockIdx.y, r0 = chunk * kRowsPerChunk;
  const i64 r1 = r0 + kRowsPerChunk < rows ? r0 + kRowsPerChunk : rows;
  double a = 0.0, b = 0.0;
  if (c < channels) {
    double m = 0.0;
    if constexpr (kBackward) m = mean[c];
    for (i64 r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      const double v = x[r * channels + c];
      if constexpr (kBackward) {
        const double g = dy[r * channels + c];
        a += g;
        b += g * (v - m);
      } else {
        a += v;
        b += v * v;
      }
    }
  }
  s1[threadIdx.y][threadIdx.x] = a;
  s2[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && c < channels) {
    for (int l = 1; l < kRowLanes; ++l) {
      a += s1[l][threadIdx.x];
      b += s2[l][threadIdx.x];
    }
    partial[(chunk * 2) * channels + c] = a;
    partial[(chunk * 2 + 1) * channels + c] = b;
  }
}

// The chunks' sums of channel c, added in chunk order.
__device__ void chunk_totals(const double* partial, i64 chunks, i64 channels, i64 c, double& a,
                             double& b) {
  a = b = 0.0;
  for (i64 k = 0; k < chunks; ++k) {
    a += partial[(k * 2) * channels + c];
    b += partial[(k * 2 + 1) * channels + c];
  }
}

// Statistics (as the per-channel kernel: biased variance for normalising, unbiased for the
// running variance) and y = x * coef[c] + coef[C + c]'s coefficients.
__global__ void bn_rows_finish_forward_kernel(const double* partial, i64 chunks, const float* gamma,
                                              const float* beta, float* save_mean,
                                              float* save_invstd, float* running_mean,
                                              float* running_var, float momentum, float eps,
                                              float* coef, i64 rows, i64 channels) {
  LOCKSTEP_GRID_STRIDE(c, channels) {
    double s1, s2;
    chunk_totals(partial, chunks, channels, c, s1, s2);
    const double count = static_cast<double>(rows);
    const double mean = s1 / count;
    double var = s2 / count - mean * mean;
    var = var > 0.0 ? var : 0.0;
    const double invstd = 1.0 / sqrt(var + static_cast<double>(eps));
    save_mean[c] = static_cast<float>(mean);
    save_invstd[c] = static_cast<float>(invstd);
    const double unbiased = rows > 1 ? var * count / (count - 1.0) : var;
    running_mean[c] = static_cast<float>((1.0 - momentum) * running_mean[c] + momentum * mean);
    running_var[c] = static_cast<float>((1.0 - momentum) * running_var[c] + momentum * unbiased);
    coef[c] = static_cast<float>(gamma[c] * invstd);
    coef[channels + c] = static_cast<float>(beta[c] - mean * gamma[c] * invstd);
  }
}

// dgamma, dbeta (accumulated) and dx = dy * coef[c] + x * coef[C + c] + coef[2C + c]'s
// coefficients (the CPU backend's form).
__global__ void bn_rows_finish_backward_kernel(const double* partial, i64 chunks,
                                               const float* gamma, const float* save_mean,
                                               const float* save_invstd, float* dgamma,
                                               float* dbeta, float* coef, i64 rows, i64 channels) {
  LOCKSTEP_GRID_STRIDE(c, channels) {
    double sdy, sdyx;
    chunk_totals(partial, chunks, channels, c, sdy, sdyx);
    const double count = static_cast<double>(rows);
    const double invstd = save_invstd[c], mean = save_mean[c];
    const double dgam = sdyx * invstd;  // sum dy * xhat
    dgamma[c] += static_cast<float>(dgam);
    dbeta[c] += static_cast<float>(sdy);
    const double g = gamma[c] * invstd;
    coef[c] = static_cast<float>(g);
    coef[channels + c] = static_cast<float>(-g * invstd * dgam / count);
    coef[2 * channels + c] =
        static_cast<float>(-g * sdy / count + g * invstd * dgam / count * mean);
  }
}

__global__ void bn_rows_affine_kernel(const float* x, const float* coef, float* y, i64 total,
                                      i64 channels) {
  LOCKSTEP_GRID_STRIDE(i, total) {
    const i64 c = i % channels;
    y[i] = x[i] * coef[c] + coef[channels + c];
  }
}

__global__ void bn_rows_dx_kernel(const float* x, const float* dy, const float* coef, float* dx,
                                  i64 total, i64 channels) {
  LOCKSTEP_GRID_STRIDE(i, total) {
    const i64 c = i % channels;
    dx[i] = dy[i] * coef[c] + x[i] * coef[channels + c] + coef[2 * channels + c];
  }
}

i64 row_chunks(i64 rows) {
  return (rows + kRowsPerChunk - 1) / kRowsPerChunk;
}

// Launches the partial sums over `chunks` chunks of 1024 rows (at most 65535: 67M rows).
template <bool kBackward>
void bn_rows_partials(const float* x, const float* dy, const float* mean, double* partial, i64 rows,
                      i64 channels, cudaStream_t s) {
  const i64 chunks = row_chunks(rows);
  LOCKSTEP_CHECK(chunks <= 65535, "batchnorm over ", rows,
                 " rows: more than 65535 x 1024 rows per launch");
  const dim3 grid(static_cast<unsigned>((channels + kRowCols - 1) / kRowCols),
                  static_cast<unsigned>(chunks));
  bn_rows_partials_kernel<kBackward>
      <<<grid, dim3(kRowCols, kRowLanes), 0, s>>>(x, dy, mean, partial, rows, channels);
  LOCKSTEP_CHECK_LAUNCH();
}

}  // namespace

// ---- batch normalisation over rows x [rows, channels]; scratch: partial (2 * chunks * channels
// doubles) and coef (3 * channels floats) on the device.
void batchnorm_rows_forward_train(const float* x, const float* gamma, const float* beta, float* y,
                                  float* save_mean, float* save_invstd, float* running_mean,
                                  float* running_var, float momentum, float eps, double* partial,
                                  float* coef, i64 rows, i64 channels, cudaStream_t s) {
  if (channels == 0 || rows == 0) return;
  bn_rows_partials<false>(x, nullptr, nullptr, partial, rows, channels, s);
  LOCKSTEP_LAUNCH(bn_rows_finish_forward_kernel, channels, s, partial, row_chunks(rows), gamma,
                  beta, save_mean, save_invstd, running_mean, running_var, momentum, eps, coef,
                  rows, channels);
  LOCKSTEP_LAUNCH(bn_rows_affine_kernel, rows * channels, s, x, coef, y, rows * channels, channels);
}

void batchnorm_rows_backward(const float* x, const float* dy, const float* gamma,
                             const float* save_mean, const float* save_invstd, float* dx,
                             float* dgamma, float* dbeta, double* partial, float* coef, i64 rows,
                             i64 channels, cudaStream_t s) {
  if (channels == 0 || rows == 0) return;
  bn_rows_partials<true>(x, dy, save_mean, partial, rows, channels, s);
  LOCKSTEP_LAUNCH(bn_rows_finish_backward_kernel, channels, s, partial, row_chunks(rows), gamma,
                  save_mean, save_invstd, dgamma, dbeta, coef, rows, channels);
  LOCKSTEP_LAUNCH(bn_rows_dx_kernel, rows * channels, s, x, dy, coef, dx, rows * channels,
                  channels);
}

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

// The rows kernels' device scratch, from the caching allocator (stream-ordered: freed when the
// call returns, reused by later work on the same stream).
class BnRowsScratch {
 public:
  BnRowsScratch(i64 rows, i64 channels, Device device)
      : partial_(Tensor::empty({2 * row_chunks(rows) * channels}, DType::F64, device)),
        coef_(Tensor::empty({3 * channels}, DType::F32, device)) {}
  double* partial() { return partial_.data<double>(); }
  float* coef() { return coef_.data<float>(); }

 private:
  Tensor partial_, coef_;
};

}  // namespace

void CudaBackend::batchnorm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                          Tensor& y, Tensor& save_mean, Tensor& save_invstd,
                                          Tensor& running_mean, Tensor& running_var, float momentum,
                                          float eps) {
  activate();
  auto [n, c, inner] = bn_dims(x);
  if (inner == 1) {
    BnRowsScratch scratch(n, c, device_);
    cuda::batchnorm_rows_forward_train(
        x.data<float>(), gamma.data<float>(), beta.data<float>(), y.data<float>(),
        save_mean.data<float>(), save_invstd.data<float>(), running_mean.data<float>(),
        running_var.data<float>(), momentum, eps, scratch.partial(), scratch.coef(), n, c, stream_);
    return;
  }
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
  if (dx.dtype() == DType::BF16) {  // the f32 result rounded once (ops.hpp)
    Tensor wide = Tensor::empty(dx.shape(), DType::F32, dx.device());
    batchnorm_backward(x, dy, gamma, save_mean, save_invstd, wide, dgamma, dbeta);
    cast(wide, dx);
    return;
  }
  activate();
  auto [n, c, inner] = bn_dims(x);
  if (inner == 1) {
    BnRowsScratch scratch(n, c, device_);
    cuda::batchnorm_rows_backward(x.data<float>(), dy.data<float>(), gamma.data<float>(),
                                  save_mean.data<float>(), save_invstd.data<float>(),
                                  dx.data<float>(), dgamma.data<float>(), dbeta.data<float>(),
                                  scratch.partial(), scratch.coef(), n, c, stream_);
    return;
  }
  cuda::batchnorm_backward(x.data<float>(), dy.data<float>(), gamma.data<float>(),
                           save_mean.data<float>(), save_invstd.data<float>(), dx.data<float>(),
                           dgamma.data<float>(), dbeta.data<float>(), n, c, inner, stream_);
}

}  // namespace lockstep::ops::cuda
