// Elementwise ops (ReLU, GELU erf form, add, axpy, scale), fill, the row and channel biases and
// their gradients, dropout and input normalisation: the kernels, their launchers and CudaBackend's
// methods of the family (fill itself is in cuda_backend.cpp; the channel bias serves
// cuda_conv.cpp).
//
// Trade-offs:
// - Grid-stride kernels (common.cuh); the only reductions are the bias gradients: sum_rows with a
//   fixed 32x8 block per 32 columns and slice of kSumRowsSlice rows (then the slices added in a
//   fixed order, 32 lanes per column), sum_channels with one block per channel reading the
//   channel's N*inner values in a coalesced loop when inner >= 32. Both deterministic.
// - Dropout draws from Philox (philox.hpp) exactly as the CPU does, so the masks match bit for bit.
// - normalize_input uploads its per-channel scale and shift only when they change.
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/cuda/block_reduce.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_backend.hpp"
#include "ops/cuda/philox.hpp"

namespace lockstep::ops::cuda {
namespace {

// ---------------------------------------------------------------- memory and elementwise

__global__ void fill_u32_kernel(std::uint32_t* p, i64 n, std::uint32_t bits) {
  LOCKSTEP_GRID_STRIDE(i, n) p[i] = bits;
}

__global__ void add_row_bias_kernel(float* y, const float* bias, i64 n, i64 cols) {
  LOCKSTEP_GRID_STRIDE(i, n) y[i] += bias[i % cols];
}

// sum_rows: rows are cut into slices of kSumRowsSlice. Only 32 columns per block would leave a
// large GPU nearly idle for a transformer's biases (a [8192, 768] dy: 24 blocks on an H200's 132
// SMs, 3.8 ms a step in docs/GPT.md's prediction); with slices the same dy takes 24 x 32 blocks.
// The split depends on the shape alone, so the result does not depend on the GPU or the timing;
// with one slice (rows <= kSumRowsSlice: an MLP's batch) it is what one block per 32 columns gives.
constexpr i64 kSumRowsSlice = 256;

// Block (32, 8) at (column block, slice): 32 columns, 8 row-strided partial sums each over the
// slice's rows, then a fixed-order sum. `add` adds it into out[col] (one slice: out is db);
// otherwise it is stored at out[slice * cols + col] for sum_slices_kernel. dy is f32 or a bf16
// activation (T = std::uint16_t), widened as it is read.
template <class T>
__global__ void sum_rows_slice_kernel(const T* dy, float* out, i64 rows, i64 cols, bool add) {
  __shared__ float partial[8][33];
  i64 col = static_cast<i64>(blockIdx.x) * 32 + threadIdx.x;
  const i64 begin = static_cast<i64>(blockIdx.y) * kSumRowsSlice;
  const i64 end = min(rows, begin + kSumRowsSlice);
  float acc = 0.0f;
  if (col < cols)
    for (i64 r = begin + threadIdx.y; r < end; r += 8)
      acc += load_f32(dy, r * cols + col);
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float sum = 0.0f;
    for (int k = 0; k < 8; ++k)
      sum += partial[k][threadIdx.x];
    if (add)
      out[col] += sum;
    else
      out[static_cast<i64>(blockIdx.y) * cols + col] = sum;
  }
}

// db[col] += the slices' sums in a fixed order: block (32, 32) over 32 columns, row y of the block
// adding slices y, y + 32, ..., then the 32 sums added in y order. One thread per column (3 to 12
// blocks for a transformer's biases) left nearly every SM idle while each thread added all 32
// slices of a gpt2-124m step in turn.
constexpr int kSliceLanes = 32;

__global__ void sum_slices_kernel(const float* slices, float* db, i64 count, i64 cols) {
  __shared__ float partial[kSliceLanes][33];
  const i64 col = static_cast<i64>(blockIdx.x) * 32 + threadIdx.x;
  float acc = 0.0f;
  if (col < cols)
    for (i64 k = threadIdx.y; k < count; k += kSliceLanes)
      acc += slices[k * cols + col];
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float sum = 0.0f;
    for (int k = 0; k < kSliceLanes; ++k)
      sum += partial[k][threadIdx.x];
    db[col] += sum;
  }
}

__global__ void add_channel_bias_kernel(float* y, const float* b, i64 total, i64 channels,
                                        i64 inner) {
  LOCKSTEP_GRID_STRIDE(i, total) y[i] += b[(i / inner) % channels];
}

__global__ void sum_channels_acc_kernel(const float* dy, float* db, i64 n, i64 channels,
                                        i64 inner) {
  i64 c = blockIdx.x, m = n * inner;
  float acc = 0.0f;
  for (i64 k = threadIdx.x; k < m; k += blockDim.x)
    acc += dy[channel_index(k, c, channels, inner)];
  acc = block_sum(acc);
  if (threadIdx.x == 0) db[c] += acc;
}

__global__ void relu_forward_kernel(const float* x, float* y, i64 n) {
  LOCKSTEP_GRID_STRIDE(i, n) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

__global__ void relu_backward_kernel(const float* y, const float* dy, float* dx, i64 n) {
  LOCKSTEP_GRID_STRIDE(i, n) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

__global__ void gelu_forward_kernel(const float* x, float* y, i64 n) {
  LOCKSTEP_GRID_STRIDE(i, n) {
    float v = x[i];
    y[i] = 0.5f * v * (1.0f + erff(v * kInvSqrt2));
  }
}

__global__ void gelu_backward_kernel(const float* x, const float* dy, float* dx, i64 n) {
  LOCKSTEP_GRID_STRIDE(i, n) {
    float v = x[i];
    float cdf = 0.5f * (1.0f + erff(v * kInvSqrt2));
    float pdf = kInvSqrt2Pi * expf(-0.5f * v * v);
    dx[i] = dy[i] * (cdf + v * pdf);
  }
}

// b f32, or a bf16 activation (a block's branch added to its f32 residual stream).
template <class T>
__global__ void add_kernel(const float* a, const T* b, float* out, i64 n) {
  LOCKSTEP_GRID_STRIDE(i, n) out[i] = a[i] + load_f32(b, i);
}

__global__ void axpy_kernel(float alpha, const float* x, float* y, i64 n) {
  LOCKSTEP_GRID_STRIDE(i, n) y[i] += alpha * x[i];
}

__global__ void scale_kernel(float* x, float alpha, i64 n) {
  LOCKSTEP_GRID_STRIDE(i, n) x[i] *= alpha;
}

// One thread per Philox block: elements 4b .. 4b+3 use its four words, exactly as
// Philox::u32(i) = block(i / 4)[i % 4] on the CPU.
__global__ void dropout_forward_kernel(const float* x, float* y, std::uint8_t* mask, i64 n, float p,
                                       float keep_scale, std::uint64_t seed, std::uint64_t stream) {
  i64 blocks = (n + 3) / 4;
  LOCKSTEP_GRID_STRIDE(b, blocks) {
    PhiloxBlock r = philox_block(seed, stream, static_cast<std::uint64_t>(b));
    for (int j = 0; j < 4; ++j) {
      i64 i = 4 * b + j;
      if (i >= n) break;
      bool keep = philox_uniform(r.v[j]) >= p;
      mask[i] = keep ? 1 : 0;
      y[i] = keep ? x[i] * keep_scale : 0.0f;
    }
  }
}

__global__ void dropout_backward_kernel(const float* dy, const std::uint8_t* mask, float* dx, i64 n,
                                        float keep_scale) {
  LOCKSTEP_GRID_STRIDE(i, n) dx[i] = mask[i] ? dy[i] * keep_scale : 0.0f;
}

// y = x * a[c] + b[c] with a = scale / std, b = -mean / std folded on the host, as the CPU does.
template <class T>
__global__ void normalize_kernel(const T* x, float* y, i64 n, i64 channels, i64 inner,
                                 const float* scale_shift) {
  LOCKSTEP_GRID_STRIDE(i, n) {
    i64 c = (i / inner) % channels;
    y[i] = static_cast<float>(x[i]) * scale_shift[c] + scale_shift[channels + c];
  }
}

}  // namespace

// ---- memory and elementwise
void fill_u32(std::uint32_t* p, i64 n, std::uint32_t bits, cudaStream_t s) {
  LOCKSTEP_LAUNCH(fill_u32_kernel, n, s, p, n, bits);
}

// y viewed as [rows, cols]: y[i, j] += bias[j]
void add_row_bias(float* y, const float* bias, i64 rows, i64 cols, cudaStream_t s) {
  LOCKSTEP_LAUNCH(add_row_bias_kernel, rows * cols, s, y, bias, rows * cols, cols);
}

i64 sum_rows_slices(i64 rows) {
  return std::max<i64>(1, (rows + kSumRowsSlice - 1) / kSumRowsSlice);
}

// dy viewed as [rows, cols]: db[j] += sum_i dy[i, j]. `slices` holds sum_rows_slices(rows) x cols
// floats when that is more than one (else it is not read). T: float, or bf16 (std::uint16_t).
template <class T>
void sum_rows_acc(const T* dy, float* db, float* slices, i64 rows, i64 cols, cudaStream_t s) {
  if (cols == 0) return;
  const i64 count = sum_rows_slices(rows);
  dim3 block(32, 8), grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>(count));
  sum_rows_slice_kernel<T>
      <<<grid, block, 0, s>>>(dy, count == 1 ? db : slices, rows, cols, count == 1);
  LOCKSTEP_CHECK_LAUNCH();
  if (count > 1) {
    sum_slices_kernel<<<grid.x, dim3(32, kSliceLanes), 0, s>>>(slices, db, count, cols);
    LOCKSTEP_CHECK_LAUNCH();
  }
}

// y[n, c, k] += b[c] for y of shape [n, channels, inner]
void add_channel_bias(float* y, const float* b, i64 n, i64 channels, i64 inner, cudaStream_t s) {
  LOCKSTEP_LAUNCH(add_channel_bias_kernel, n * channels * inner, s, y, b, n * channels * inner,
                  channels, inner);
}

// db[c] += sum_{n,k} dy[n, c, k]
void sum_channels_acc(const float* dy, float* db, i64 n, i64 channels, i64 inner, cudaStream_t s) {
  if (channels == 0) return;
  sum_channels_acc_kernel<<<static_cast<unsigned>(channels), kThreads, 0, s>>>(dy, db, n, channels,
                                                                               inner);
  LOCKSTEP_CHECK_LAUNCH();
}

void relu_forward(const float* x, float* y, i64 n, cudaStream_t s) {
  LOCKSTEP_LAUNCH(relu_forward_kernel, n, s, x, y, n);
}
void relu_backward(const float* y, const float* dy, float* dx, i64 n, cudaStream_t s) {
  LOCKSTEP_LAUNCH(relu_backward_kernel, n, s, y, dy, dx, n);
}
void gelu_forward(const float* x, float* y, i64 n, cudaStream_t s) {
  LOCKSTEP_LAUNCH(gelu_forward_kernel, n, s, x, y, n);
}
void gelu_backward(const float* x, const float* dy, float* dx, i64 n, cudaStream_t s) {
  LOCKSTEP_LAUNCH(gelu_backward_kernel, n, s, x, dy, dx, n);
}
template <class T>
void add(const float* a, const T* b, float* out, i64 n, cudaStream_t s) {
  LOCKSTEP_LAUNCH(add_kernel<T>, n, s, a, b, out, n);
}
void axpy(float alpha, const float* x, float* y, i64 n, cudaStream_t s) {
  LOCKSTEP_LAUNCH(axpy_kernel, n, s, alpha, x, y, n);
}
void scale(float* x, float alpha, i64 n, cudaStream_t s) {
  LOCKSTEP_LAUNCH(scale_kernel, n, s, x, alpha, n);
}

void dropout_forward(const float* x, float* y, std::uint8_t* mask, i64 n, float p,
                     std::uint64_t seed, std::uint64_t stream, cudaStream_t s) {
  float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  LOCKSTEP_LAUNCH(dropout_forward_kernel, (n + 3) / 4, s, x, y, mask, n, p, keep_scale, seed,
                  stream);
}

void dropout_backward(const float* dy, const std::uint8_t* mask, float* dx, i64 n, float p,
                      cudaStream_t s) {
  float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  LOCKSTEP_LAUNCH(dropout_backward_kernel, n, s, dy, mask, dx, n, keep_scale);
}

// y = x * scale_shift[c] + scale_shift[channels + c] for x of shape [n / (channels * inner),
// channels, inner]: the host folds /255, mean and std into one scale and shift per channel.
void normalize_u8(const std::uint8_t* x, float* y, i64 n, i64 channels, i64 inner,
                  const float* scale_shift, cudaStream_t s) {
  LOCKSTEP_LAUNCH(normalize_kernel<std::uint8_t>, n, s, x, y, n, channels, inner, scale_shift);
}

void normalize_f32(const float* x, float* y, i64 n, i64 channels, i64 inner,
                   const float* scale_shift, cudaStream_t s) {
  LOCKSTEP_LAUNCH(normalize_kernel<float>, n, s, x, y, n, channels, inner, scale_shift);
}

void CudaBackend::add_row_bias(Tensor& y, const Tensor& bias) {
  activate();
  // y may have any rank: its last dimension is the feature dimension.
  cuda::add_row_bias(y.data<float>(), bias.data<float>(),
                     y.numel() / std::max<std::int64_t>(bias.numel(), 1), bias.numel(), stream_);
}

void CudaBackend::sum_rows(const Tensor& dy, Tensor& db) {
  activate();
  const std::int64_t cols = db.numel(), rows = dy.numel() / std::max<std::int64_t>(cols, 1);
  const std::int64_t slices = sum_rows_slices(rows);
  // Stream-ordered, from the caching allocator: no allocation in a steady-state step.
  Tensor partial = slices > 1 ? Tensor::empty({slices * cols}, DType::F32, device_) : Tensor();
  float* scratch = slices > 1 ? partial.data<float>() : nullptr;
  if (dy.dtype() == DType::BF16)
    sum_rows_acc(bf16_data(dy), db.data<float>(), scratch, rows, cols, stream_);
  else
    sum_rows_acc(dy.data<float>(), db.data<float>(), scratch, rows, cols, stream_);
}

// ---- elementwise
void CudaBackend::relu_forward(const Tensor& x, Tensor& y) {
  activate();
  cuda::relu_forward(x.data<float>(), y.data<float>(), x.numel(), stream_);
}
void CudaBackend::relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  activate();
  cuda::relu_backward(y.data<float>(), dy.data<float>(), dx.data<float>(), y.numel(), stream_);
}
void CudaBackend::gelu_forward(const Tensor& x, Tensor& y) {
  activate();
  cuda::gelu_forward(x.data<float>(), y.data<float>(), x.numel(), stream_);
}
void CudaBackend::gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  activate();
  cuda::gelu_backward(x.data<float>(), dy.data<float>(), dx.data<float>(), x.numel(), stream_);
}
void CudaBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  activate();
  if (b.dtype() == DType::BF16)
    cuda::add(a.data<float>(), static_cast<const std::uint16_t*>(b.raw_data()), out.data<float>(),
              a.numel(), stream_);
  else
    cuda::add(a.data<float>(), b.data<float>(), out.data<float>(), a.numel(), stream_);
}
void CudaBackend::axpy(float alpha, const Tensor& x, Tensor& y) {
  activate();
  cuda::axpy(alpha, x.data<float>(), y.data<float>(), x.numel(), stream_);
}
void CudaBackend::scale(Tensor& x, float alpha) {
  activate();
  cuda::scale(x.data<float>(), alpha, x.numel(), stream_);
}
void CudaBackend::dropout_forward(const Tensor& x, Tensor& y, Tensor& mask, float p,
                                  std::uint64_t seed, std::uint64_t stream) {
  activate();
  cuda::dropout_forward(x.data<float>(), y.data<float>(), mask.data<std::uint8_t>(), x.numel(), p,
                        seed, stream, stream_);
}
void CudaBackend::dropout_backward(const Tensor& dy, const Tensor& mask, float p, Tensor& dx) {
  activate();
  cuda::dropout_backward(dy.data<float>(), mask.data<std::uint8_t>(), dx.data<float>(), dy.numel(),
                         p, stream_);
}

void CudaBackend::normalize_input(const Tensor& x, const std::vector<float>& mean,
                                  const std::vector<float>& stddev, Tensor& y) {
  activate();
  const std::int64_t n = x.dim(0), channels = x.ndim() >= 2 ? x.dim(1) : 1;
  const std::int64_t inner = n * channels != 0 ? x.numel() / (n * channels) : 1;
  // One scale and shift per channel, folded exactly as the CPU backend does. Uploaded only
  // when they change (every step normalises with the same ones): no pageable copy per step.
  // The upload is ordered after the kernels that read the previous values on this stream.
  const float in_scale = x.dtype() == DType::U8 ? 1.0f / 255.0f : 1.0f;
  std::vector<float> host(static_cast<std::size_t>(2 * channels));
  for (std::int64_t c = 0; c < channels; ++c) {
    float m = mean.empty() ? 0.0f : mean[c], s = stddev.empty() ? 1.0f : stddev[c];
    host[c] = in_scale / s;
    host[channels + c] = -m / s;
  }
  if (host != scale_shift_host_) {
    if (!scale_shift_.defined() || scale_shift_.numel() < 2 * channels)
      scale_shift_ = Tensor::empty({2 * channels}, DType::F32, device_);
    scale_shift_host_ = std::move(host);
    // The pageable source is staged before cudaMemcpyAsync returns.
    note_pageable_copy();
    LOCKSTEP_CHECK_CUDA(cudaMemcpyAsync(scale_shift_.raw_data(), scale_shift_host_.data(),
                                        scale_shift_host_.size() * sizeof(float),
                                        cudaMemcpyHostToDevice, stream_));
  }
  if (x.dtype() == DType::U8)
    normalize_u8(x.data<std::uint8_t>(), y.data<float>(), x.numel(), channels, inner,
                 scale_shift_.data<float>(), stream_);
  else
    normalize_f32(x.data<float>(), y.data<float>(), x.numel(), channels, inner,
                  scale_shift_.data<float>(), stream_);
}

}  // namespace lockstep::ops::cuda
