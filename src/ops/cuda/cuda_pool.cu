// Max and average pooling over [N, C, H, W] in NCHW or NHWC: the kernels, their launchers and
// CudaBackend's pool2d methods.
//
// Trade-offs:
// - Own kernels, not cuDNN: cuDNN's pooling backward needs x and y besides dy, but the ops
//   interface hands the backward only dy and a backend-owned workspace, so cuDNN would force a
//   copy of every pooled activation. An i32 argmax (the size of y) is smaller and gives the same
//   tie-breaking (first maximum) as the CPU.
// - One thread per output (forward) or input (backward) element in a grid-stride loop; the
//   backward gathers instead of scattering, so no atomics and a fixed summation order.
// - One kernel per op for both layouts: an element's (n, c) plane is a base offset and a step
//   between its pixels (1 in NCHW, C in NHWC), so consecutive threads read consecutive memory in
//   either layout and the argmax keeps its meaning (the in-plane index).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_backend.hpp"

namespace lockstep::ops::cuda {

struct PoolShape {
  i64 planes;  // N * C
  i64 h, w, oh, ow;
  int kh, kw, sh, sw, ph, pw;
  i64 channels;
  bool nhwc;
};

namespace {

// Element i (in memory order) of a tensor with `pixels` pixels per (n, c) plane: its pixel in the
// plane, and where the same plane lies in the other tensor of the op (`other_pixels` per plane):
// its pixel q at other_base + q * step.
struct PlaneAt {
  i64 pixel, step, other_base;
};
__device__ __forceinline__ PlaneAt plane_at(const PoolShape& p, i64 i, i64 pixels,
                                            i64 other_pixels) {
  if (!p.nhwc) return {i % pixels, 1, (i / pixels) * other_pixels};
  const i64 c = i % p.channels, at = i / p.channels, n = at / pixels;
  return {at % pixels, p.channels, n * other_pixels * p.channels + c};
}

// ---------------------------------------------------------------- pooling

// Max pooling keeps the flat in-plane index of each window's first maximum (padding counts as
// -inf, as in PyTorch); the backward gathers, for each input, the dy of the windows whose
// argmax it is, so no atomics and a fixed summation order.
__global__ void max_pool_forward_kernel(const float* x, float* y, std::int32_t* argmax,
                                        PoolShape p) {
  i64 total = p.planes * p.oh * p.ow;
  LOCKSTEP_GRID_STRIDE(i, total) {
    const PlaneAt at = plane_at(p, i, p.oh * p.ow, p.h * p.w);
    i64 oy = at.pixel / p.ow, ox = at.pixel % p.ow;
    i64 y0 = oy * p.sh - p.ph, x0 = ox * p.sw - p.pw;
    const float* in = x + at.other_base;
    float best = -INFINITY;
    i64 best_index = -1;
    for (int ky = 0; ky < p.kh; ++ky) {
      i64 iy = y0 + ky;
      if (iy < 0 || iy >= p.h) continue;
      for (int kx = 0; kx < p.kw; ++kx) {
        i64 ix = x0 + kx;
        if (ix < 0 || ix >= p.w) continue;
        float v = in[(iy * p.w + ix) * at.step];
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
    const PlaneAt at = plane_at(p, i, p.h * p.w, p.oh * p.ow);
    const i64 rem = at.pixel, iy = rem / p.w, ix = rem % p.w;
    i64 oy0, oy1, ox0, ox1;
    covering(iy, p.kh, p.sh, p.ph, p.oh, oy0, oy1);
    covering(ix, p.kw, p.sw, p.pw, p.ow, ox0, ox1);
    const float* g = dy + at.other_base;
    const std::int32_t* a = argmax + at.other_base;
    float acc = 0.0f;
    for (i64 oy = oy0; oy <= oy1; ++oy)
      for (i64 ox = ox0; ox <= ox1; ++ox)
        if (a[(oy * p.ow + ox) * at.step] == rem) acc += g[(oy * p.ow + ox) * at.step];
    dx[i] = acc;
  }
}

// Average pooling divides by the full window (PyTorch's count_include_pad=True default).
__global__ void avg_pool_forward_kernel(const float* x, float* y, PoolShape p) {
  i64 total = p.planes * p.oh * p.ow;
  float inv = 1.0f / static_cast<float>(p.kh * p.kw);
  LOCKSTEP_GRID_STRIDE(i, total) {
    const PlaneAt at = plane_at(p, i, p.oh * p.ow, p.h * p.w);
    i64 oy = at.pixel / p.ow, ox = at.pixel % p.ow;
    i64 y0 = oy * p.sh - p.ph, x0 = ox * p.sw - p.pw;
    const float* in = x + at.other_base;
    float acc = 0.0f;
    for (int ky = 0; ky < p.kh; ++ky) {
      i64 iy = y0 + ky;
      if (iy < 0 || iy >= p.h) continue;
      for (int kx = 0; kx < p.kw; ++kx) {
        i64 ix = x0 + kx;
        if (ix >= 0 && ix < p.w) acc += in[(iy * p.w + ix) * at.step];
      }
    }
    y[i] = acc * inv;
  }
}

__global__ void avg_pool_backward_kernel(const float* dy, float* dx, PoolShape p) {
  i64 total = p.planes * p.h * p.w;
  float inv = 1.0f / static_cast<float>(p.kh * p.kw);
  LOCKSTEP_GRID_STRIDE(i, total) {
    const PlaneAt at = plane_at(p, i, p.h * p.w, p.oh * p.ow);
    const i64 iy = at.pixel / p.w, ix = at.pixel % p.w;
    i64 oy0, oy1, ox0, ox1;
    covering(iy, p.kh, p.sh, p.ph, p.oh, oy0, oy1);
    covering(ix, p.kw, p.sw, p.pw, p.ow, ox0, ox1);
    const float* g = dy + at.other_base;
    float acc = 0.0f;
    for (i64 oy = oy0; oy <= oy1; ++oy)
      for (i64 ox = ox0; ox <= ox1; ++ox)
        acc += g[(oy * p.ow + ox) * at.step];
    dx[i] = acc * inv;
  }
}

}  // namespace

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

namespace {

PoolShape pool_shape(const Shape& in, const Shape& out, const Pool2dParams& p) {
  return PoolShape{in[0] * in[1],
                   in[2],
                   in[3],
                   out[2],
                   out[3],
                   p.kernel_h,
                   p.kernel_w,
                   p.stride_h,
                   p.stride_w,
                   p.pad_h,
                   p.pad_w,
                   in[1],
                   p.layout == ImageLayout::NHWC};
}

}  // namespace

void CudaBackend::pool2d_forward(PoolKind kind, const Tensor& x, Tensor& y, Tensor& workspace,
                                 const Pool2dParams& p) {
  activate();
  PoolShape s = pool_shape(x.shape(), y.shape(), p);
  if (kind == PoolKind::Avg) {
    avg_pool_forward(x.data<float>(), y.data<float>(), s, stream_);
    return;
  }
  if (!workspace.defined() || workspace.shape() != y.shape() || workspace.dtype() != DType::I32 ||
      workspace.device() != device_)
    workspace = Tensor::empty(y.shape(), DType::I32, device_);
  max_pool_forward(x.data<float>(), y.data<float>(), workspace.data<std::int32_t>(), s, stream_);
}

void CudaBackend::pool2d_backward(PoolKind kind, const Tensor& dy, const Tensor& workspace,
                                  Tensor& dx, const Pool2dParams& p) {
  activate();
  PoolShape s = pool_shape(dx.shape(), dy.shape(), p);
  if (kind == PoolKind::Avg) {
    avg_pool_backward(dy.data<float>(), dx.data<float>(), s, stream_);
    return;
  }
  LOCKSTEP_CHECK(
      workspace.defined() && workspace.shape() == dy.shape() && workspace.dtype() == DType::I32,
      "max pool backward on ", device_.str(), ": the workspace ", workspace.describe(),
      " is not the one pool2d_forward returned for ", dy.describe());
  max_pool_backward(dy.data<float>(), workspace.data<std::int32_t>(), dx.data<float>(), s, stream_);
}

}  // namespace lockstep::ops::cuda
