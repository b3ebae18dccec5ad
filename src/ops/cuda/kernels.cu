// lockstep's own CUDA kernels: elementwise ops, dropout, input normalisation, pooling, batch
// norm, softmax cross-entropy, reductions and the fused optimizer steps.
//
// Trade-offs, once for the whole file:
// - Simple grid-stride kernels, 256 threads, i64 indices: these ops are memory-bound and small
//   next to the GEMMs and convolutions; clarity wins over the last 10%.
// - Every reduction is deterministic: fixed grids, a fixed tree inside a block, no float atomics
//   (pool backward gathers instead of scattering). Same inputs, same bits, run after run: the
//   design promises bitwise-identical runs for the same config and world size.
// - Per-channel statistics (batch norm, conv bias gradient) use one block per channel, reading
//   the channel's N*inner values in a coalesced loop when inner >= 32.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ops/cuda/block_reduce.cuh"
#include "ops/cuda/check.hpp"
#include "ops/cuda/kernels.hpp"
#include "ops/cuda/philox.hpp"

namespace lockstep::ops::cuda {
namespace {

constexpr int kThreads = 256;
// Enough blocks to fill an H200 (132 SMs x 8 resident 256-thread blocks) several times over;
// grid-stride loops cover the rest.
constexpr i64 kMaxBlocks = 8192;

unsigned blocks_for(i64 n) {
  i64 b = (n + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  if (b > kMaxBlocks) b = kMaxBlocks;
  return static_cast<unsigned>(b);
}

#define LOCKSTEP_GRID_STRIDE(i, n)                                               \
  for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<i64>(blockDim.x) * gridDim.x)

// ---------------------------------------------------------------- memory and elementwise

__global__ void fill_u32_kernel(std::uint32_t* p, i64 n, std::uint32_t bits) {
  LOCKSTEP_GRID_STRIDE(i, n) p[i] = bits;
}

__global__ void add_row_bias_kernel(float* y, const float* bias, i64 n, i64 cols) {
  LOCKSTEP_GRID_STRIDE(i, n) y[i] += bias[i % cols];
}

// Block (32, 8): 32 columns, 8 row-strided partial sums each, then a fixed-order sum.
__global__ void sum_rows_acc_kernel(const float* dy, float* db, i64 rows, i64 cols) {
  __shared__ float partial[8][33];
  i64 col = static_cast<i64>(blockIdx.x) * 32 + threadIdx.x;
  float acc = 0.0f;
  if (col < cols)
    for (i64 r = threadIdx.y; r < rows; r += 8)
      acc += dy[r * cols + col];
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float sum = 0.0f;
    for (int k = 0; k < 8; ++k)
      sum += partial[k][threadIdx.x];
    db[col] += sum;
  }
}

__global__ void add_channel_bias_kernel(float* y, const float* b, i64 total, i64 channels,
                                        i64 inner) {
  LOCKSTEP_GRID_STRIDE(i, total) y[i] += b[(i / inner) % channels];
}

// Element k of channel c in [n, channels, inner] layout.
__device__ __forceinline__ i64 channel_index(i64 k, i64 c, i64 channels, i64 inner) {
  return (k / inner) * channels * inner + c * inner + k % inner;
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

__global__ void add_kernel(const float* a, const float* b, float* out, i64 n) {
  LOCKSTEP_GRID_STRIDE(i, n) out[i] = a[i] + b[i];
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

// ---------------------------------------------------------------- pooling

// Max pooling keeps the flat in-plane index of each window's first maximum (padding counts as
// -inf, as in PyTorch); the backward gathers, for each input, the dy of the windows whose
// argmax it is, so no atomics and a fixed summation order.
__global__ void max_pool_forward_kernel(const float* x, float* y, std::int32_t* argmax,
                                        PoolShape p) {
  i64 total = p.planes * p.oh * p.ow;
  LOCKSTEP_GRID_STRIDE(i, total) {
    i64 plane = i / (p.oh * p.ow), rem = i % (p.oh * p.ow);
    i64 oy = rem / p.ow, ox = rem % p.ow;
    i64 y0 = oy * p.sh - p.ph, x0 = ox * p.sw - p.pw;
    const float* in = x + plane * p.h * p.w;
    float best = -INFINITY;
    i64 best_index = -1;
    for (int ky = 0; ky < p.kh; ++ky) {
      i64 iy = y0 + ky;
      if (iy < 0 || iy >= p.h) continue;
      for (int kx = 0; kx < p.kw; ++kx) {
        i64 ix = x0 + kx;
        if (ix < 0 || ix >= p.w) continue;
        float v = in[iy * p.w + ix];
        if (best_index < 0 || v > best) {
          best = v;
          best_index = iy * p.w + ix;
        }
      }
    }
    y[i] = best_index < 0 ? 0.0f : best;
    argmax[i] = static_cast<std::int32_t>(best_index);
  }
}

// Output rows [lo, hi] whose windows cover input row `in` (same formula for columns).
__device__ __forceinline__ void covering(i64 in, int k, int stride, int pad, i64 out_size, i64& lo,
                                         i64& hi) {
  i64 t = in + pad;
  lo = t < k ? 0 : (t - k) / stride + 1;
  hi = t / stride;
  if (hi > out_size - 1) hi = out_size - 1;
}

__global__ void max_pool_backward_kernel(const float* dy, const std::int32_t* argmax, float* dx,
                                         PoolShape p) {
  i64 total = p.planes * p.h * p.w;
  LOCKSTEP_GRID_STRIDE(i, total) {
    i64 plane = i / (p.h * p.w), rem = i % (p.h * p.w);
    i64 iy = rem / p.w, ix = rem % p.w;
    i64 oy0, oy1, ox0, ox1;
    covering(iy, p.kh, p.sh, p.ph, p.oh, oy0, oy1);
    covering(ix, p.kw, p.sw, p.pw, p.ow, ox0, ox1);
    const float* g = dy + plane * p.oh * p.ow;
    const std::int32_t* a = argmax + plane * p.oh * p.ow;
    float acc = 0.0f;
    for (i64 oy = oy0; oy <= oy1; ++oy)
      for (i64 ox = ox0; ox <= ox1; ++ox)
        if (a[oy * p.ow + ox] == rem) acc += g[oy * p.ow + ox];
    dx[i] = acc;
  }
}

// Average pooling divides by the full window (PyTorch's count_include_pad=True default).
__global__ void avg_pool_forward_kernel(const float* x, float* y, PoolShape p) {
  i64 total = p.planes * p.oh * p.ow;
  float inv = 1.0f / static_cast<float>(p.kh * p.kw);
  LOCKSTEP_GRID_STRIDE(i, total) {
    i64 plane = i / (p.oh * p.ow), rem = i % (p.oh * p.ow);
    i64 oy = rem / p.ow, ox = rem % p.ow;
    i64 y0 = oy * p.sh - p.ph, x0 = ox * p.sw - p.pw;
    const float* in = x + plane * p.h * p.w;
    float acc = 0.0f;
    for (int ky = 0; ky < p.kh; ++ky) {
      i64 iy = y0 + ky;
      if (iy < 0 || iy >= p.h) continue;
      for (int kx = 0; kx < p.kw; ++kx) {
        i64 ix = x0 + kx;
        if (ix >= 0 && ix < p.w) acc += in[iy * p.w + ix];
      }
    }
    y[i] = acc * inv;
  }
}

__global__ void avg_pool_backward_kernel(const float* dy, float* dx, PoolShape p) {
  i64 total = p.planes * p.h * p.w;
  float inv = 1.0f / static_cast<float>(p.kh * p.kw);
  LOCKSTEP_GRID_STRIDE(i, total) {
    i64 plane = i / (p.h * p.w), rem = i % (p.h * p.w);
    i64 iy = rem / p.w, ix = rem % p.w;
    i64 oy0, oy1, ox0, ox1;
    covering(iy, p.kh, p.sh, p.ph, p.oh, oy0, oy1);
    covering(ix, p.kw, p.sw, p.pw, p.ow, ox0, ox1);
    const float* g = dy + plane * p.oh * p.ow;
    float acc = 0.0f;
    for (i64 oy = oy0; oy <= oy1; ++oy)
      for (i64 ox = ox0; ox <= ox1; ++ox)
        acc += g[oy * p.ow + ox];
    dx[i] = acc * inv;
  }
}

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

// ---------------------------------------------------------------- loss and metrics

__device__ __forceinline__ void record_bad_label(unsigned long long* bad, i64 row,
                                                 std::int32_t label) {
  unsigned long long word =
      (static_cast<unsigned long long>(row) << 32) | static_cast<std::uint32_t>(label);
  atomicMin(bad, word);
}

// One warp per row: max, sum of exp, probabilities, -log p[label] = log(sum) - (x[label] - max).
__global__ void softmax_xent_forward_kernel(const float* logits, const std::int32_t* labels,
                                            float* probs, float* row_loss, i64 rows, i64 classes,
                                            unsigned long long* bad) {
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
  float mx = -INFINITY;
  for (i64 j = lane; j < classes; j += 32)
    mx = fmaxf(mx, x[j]);
  mx = warp_max(mx);
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
      row_loss[row] = logf(sum) - (x_label - mx);
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

__global__ void softmax_xent_backward_kernel(const float* probs, const std::int32_t* labels,
                                             float scale, float* dlogits, i64 rows, i64 classes,
                                             unsigned long long* bad) {
  i64 total = rows * classes;
  LOCKSTEP_GRID_STRIDE(i, total) {
    i64 row = i / classes, j = i % classes;
    std::int32_t label = labels[row];
    if (j == 0 && (label < 0 || label >= classes)) record_bad_label(bad, row, label);
    dlogits[i] = (probs[i] - (j == label ? 1.0f : 0.0f)) * scale;
  }
}

// One warp per row; ties go to the lowest index (std::max_element's rule).
__global__ void count_correct_kernel(const float* logits, const std::int32_t* labels, i64 rows,
                                     i64 classes, unsigned long long* count) {
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
  if (lane == 0 && best_j == labels[row]) atomicAdd(count, 1ull);
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

// ---------------------------------------------------------------- launchers

#define LOCKSTEP_LAUNCH(kernel, n, s, ...)                    \
  do {                                                        \
    if ((n) > 0) {                                            \
      kernel<<<blocks_for(n), kThreads, 0, s>>>(__VA_ARGS__); \
      LOCKSTEP_CHECK_LAUNCH();                                \
    }                                                         \
  } while (0)

void fill_u32(std::uint32_t* p, i64 n, std::uint32_t bits, cudaStream_t s) {
  LOCKSTEP_LAUNCH(fill_u32_kernel, n, s, p, n, bits);
}

void add_row_bias(float* y, const float* bias, i64 rows, i64 cols, cudaStream_t s) {
  LOCKSTEP_LAUNCH(add_row_bias_kernel, rows * cols, s, y, bias, rows * cols, cols);
}

void sum_rows_acc(const float* dy, float* db, i64 rows, i64 cols, cudaStream_t s) {
  if (cols == 0) return;
  dim3 block(32, 8);
  sum_rows_acc_kernel<<<static_cast<unsigned>((cols + 31) / 32), block, 0, s>>>(dy, db, rows, cols);
  LOCKSTEP_CHECK_LAUNCH();
}

void add_channel_bias(float* y, const float* b, i64 n, i64 channels, i64 inner, cudaStream_t s) {
  LOCKSTEP_LAUNCH(add_channel_bias_kernel, n * channels * inner, s, y, b, n * channels * inner,
                  channels, inner);
}

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
void add(const float* a, const float* b, float* out, i64 n, cudaStream_t s) {
  LOCKSTEP_LAUNCH(add_kernel, n, s, a, b, out, n);
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

void normalize_u8(const std::uint8_t* x, float* y, i64 n, i64 channels, i64 inner,
                  const float* scale_shift, cudaStream_t s) {
  LOCKSTEP_LAUNCH(normalize_kernel<std::uint8_t>, n, s, x, y, n, channels, inner, scale_shift);
}

void normalize_f32(const float* x, float* y, i64 n, i64 channels, i64 inner,
                   const float* scale_shift, cudaStream_t s) {
  LOCKSTEP_LAUNCH(normalize_kernel<float>, n, s, x, y, n, channels, inner, scale_shift);
}

void max_pool_forward(const float* x, float* y, std::int32_t* argmax, const PoolShape& p,
                      cudaStream_t s) {
  LOCKSTEP_LAUNCH(max_pool_forward_kernel, p.planes * p.oh * p.ow, s, x, y, argmax, p);
}
void max_pool_backward(const float* dy, const std::int32_t* argmax, float* dx, const PoolShape& p,
                       cudaStream_t s) {
  LOCKSTEP_LAUNCH(max_pool_backward_kernel, p.planes * p.h * p.w, s, dy, argmax, dx, p);
}
void avg_pool_forward(const float* x, float* y, const PoolShape& p, cudaStream_t s) {
  LOCKSTEP_LAUNCH(avg_pool_forward_kernel, p.planes * p.oh * p.ow, s, x, y, p);
}
void avg_pool_backward(const float* dy, float* dx, const PoolShape& p, cudaStream_t s) {
  LOCKSTEP_LAUNCH(avg_pool_backward_kernel, p.planes * p.h * p.w, s, dy, dx, p);
}

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

void softmax_xent_forward(const float* logits, const std::int32_t* labels, float* probs,
                          float* row_loss, float* loss, i64 rows, i64 classes,
                          unsigned long long* bad_label, cudaStream_t s) {
  if (rows == 0) return;
  constexpr int kRowsPerBlock = kThreads / 32;
  unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  softmax_xent_forward_kernel<<<blocks, kThreads, 0, s>>>(logits, labels, probs, row_loss, rows,
                                                          classes, bad_label);
  LOCKSTEP_CHECK_LAUNCH();
  mean_kernel<<<1, kThreads, 0, s>>>(row_loss, rows, loss);
  LOCKSTEP_CHECK_LAUNCH();
}

void softmax_xent_backward(const float* probs, const std::int32_t* labels, float scale,
                           float* dlogits, i64 rows, i64 classes, unsigned long long* bad_label,
                           cudaStream_t s) {
  LOCKSTEP_LAUNCH(softmax_xent_backward_kernel, rows * classes, s, probs, labels, scale, dlogits,
                  rows, classes, bad_label);
}

void count_correct(const float* logits, const std::int32_t* labels, i64 rows, i64 classes,
                   unsigned long long* count, cudaStream_t s) {
  LOCKSTEP_CHECK_CUDA(cudaMemsetAsync(count, 0, sizeof(*count), s));
  if (rows == 0) return;
  constexpr int kRowsPerBlock = kThreads / 32;
  unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  count_correct_kernel<<<blocks, kThreads, 0, s>>>(logits, labels, rows, classes, count);
  LOCKSTEP_CHECK_LAUNCH();
}

void sum_squares(const float* x, i64 n, double* partials, double* out, cudaStream_t s) {
  // Always the same grid, whatever n, so the summation tree (and the result) depends on n only.
  sum_squares_partial_kernel<<<kReducePartials, kThreads, 0, s>>>(x, n, partials);
  LOCKSTEP_CHECK_LAUNCH();
  sum_partials_kernel<<<1, kReducePartials, 0, s>>>(partials, kReducePartials, out);
  LOCKSTEP_CHECK_LAUNCH();
}

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

}  // namespace lockstep::ops::cuda
