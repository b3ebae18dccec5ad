// CPU 2-D max/average pooling: own loops over (n, c) planes (NCHW) or over (n, block of channels)
// (NHWC, vectorised across the contiguous channels), split across the Context's pool.
// oneDNN 2.6 only has its "simple_nchw" kernel for plain NCHW pooling, which measured 5-8x
// slower than these loops on the LeNet shapes (docs/PERFORMANCE.md); its blocked layouts would
// need a reorder on each side of every pooling call.
// Max pooling's workspace is an i32 tensor shaped like y (in y's layout) holding, per output, the
// index of the chosen input within its (n, c) plane (first maximum in row-major window order,
// -inf padding). Average pooling divides by kernel_h * kernel_w, padding included (PyTorch's
// default, count_include_pad=True), and needs no workspace.
// Both layouts visit each window in the same row-major order and add each gradient in the same
// output order, so an NHWC result is bitwise the NCHW one, transposed.
#include <algorithm>
#include <cstring>
#include <limits>

#include "ops/cpu/cpu_backend.hpp"
#include "ops/cpu/parallel.hpp"
#include "ops/cpu/simd.hpp"

namespace lockstep::ops::cpu {
namespace {

struct PoolDims {
  std::int64_t planes, h, w, oh, ow;
};
PoolDims pool_dims(const Tensor& x, const Tensor& y) {
  return {x.dim(0) * x.dim(1), x.dim(2), x.dim(3), y.dim(2), y.dim(3)};
}

// Window rows [y0, y1) and columns [x0, x1) of output (oy, ox), clipped to the input.
struct Window {
  std::int64_t y0, y1, x0, x1;
};
inline Window window(const PoolDims& d, const Pool2dParams& p, std::int64_t oy, std::int64_t ox) {
  const std::int64_t ys = oy * p.stride_h - p.pad_h, xs = ox * p.stride_w - p.pad_w;
  return {std::max<std::int64_t>(ys, 0), std::min<std::int64_t>(ys + p.kernel_h, d.h),
          std::max<std::int64_t>(xs, 0), std::min<std::int64_t>(xs + p.kernel_w, d.w)};
}

template <class F>
void for_planes(ThreadPool& pool, const PoolDims& d, const F& f) {
  const std::int64_t per_plane = std::max<std::int64_t>(d.h * d.w, 1);
  parallel_range(pool, d.planes, std::max<std::int64_t>(1, kParallelGrain / per_plane),
                 [&](std::int64_t p0, std::int64_t p1) {
                   for (std::int64_t q = p0; q < p1; ++q)
                     f(q);
                 });
}

// ---- NHWC: a pixel's channels are contiguous, so each loop body runs across a block of them.

// Channels per work item: enough for the vector units, few enough that the (n, block) items
// split a small batch over the threads.
constexpr std::int64_t kPoolChannels = 64;

// Runs f(n, c0, c1) for every sample n and channel block [c0, c1), over the pool.
template <class F>
void for_channel_blocks(ThreadPool& pool, std::int64_t batch, std::int64_t channels,
                        std::int64_t per_channel, const F& f) {
  const std::int64_t blocks = (channels + kPoolChannels - 1) / kPoolChannels;
  const std::int64_t per_item = std::max<std::int64_t>(per_channel * kPoolChannels, 1);
  parallel_range(pool, batch * blocks, std::max<std::int64_t>(1, kParallelGrain / per_item),
                 [&](std::int64_t i0, std::int64_t i1) {
                   for (std::int64_t i = i0; i < i1; ++i) {
                     const std::int64_t c0 = (i % blocks) * kPoolChannels;
                     f(i / blocks, c0, std::min(channels, c0 + kPoolChannels));
                   }
                 });
}

// One output pixel's window for channels [c0, c0 + w) of one sample: `in` is the sample's first
// pixel at channel c0, `out` and `arg` the output pixel's at c0. Vectorised across the channels
// (kWidth at a time: compares and selects stay branches in plain loops), then a scalar tail; both
// take a larger value only (first maximum in window order, -inf padding), as the NCHW loops do.
LOCKSTEP_SIMD_CLONES
void max_window_nhwc(const float* in, std::int64_t channels, std::int64_t w, const PoolDims& d,
                     const Window& win, float* out, std::int32_t* arg) {
  using simd::kWidth;
  const auto first = static_cast<std::int32_t>(win.y0 * d.w + win.x0);
  std::int64_t c = 0;
  for (; c + kWidth <= w; c += kWidth) {
    simd::vf best = simd::splat(-std::numeric_limits<float>::infinity());
    simd::vi at = simd::vi{} + first;
    for (std::int64_t iy = win.y0; iy < win.y1; ++iy) {
      for (std::int64_t ix = win.x0; ix < win.x1; ++ix) {
        const simd::vf v = simd::load(in + (iy * d.w + ix) * channels + c);
        const simd::vi take = v > best;
        best = take ? v : best;
        at = take ? simd::vi{} + static_cast<std::int32_t>(iy * d.w + ix) : at;
      }
    }
    simd::store(out + c, best);
    std::memcpy(arg + c, &at, sizeof at);
  }
  for (; c < w; ++c) {
    float best = -std::numeric_limits<float>::infinity();
    std::int32_t at = first;
    for (std::int64_t iy = win.y0; iy < win.y1; ++iy) {
      for (std::int64_t ix = win.x0; ix < win.x1; ++ix) {
        const float v = in[(iy * d.w + ix) * channels + c];
        if (v > best) best = v, at = static_cast<std::int32_t>(iy * d.w + ix);
      }
    }
    out[c] = best;
    arg[c] = at;
  }
}

// The same for average pooling: the window's sum in window order, times 1 / area.
LOCKSTEP_SIMD_CLONES
void avg_window_nhwc(const float* in, std::int64_t channels, std::int64_t w, const PoolDims& d,
                     const Window& win, float inv_area, float* out) {
  using simd::kWidth;
  std::int64_t c = 0;
  for (; c + kWidth <= w; c += kWidth) {
    simd::vf sum = simd::splat(0.0f);
    for (std::int64_t iy = win.y0; iy < win.y1; ++iy)
      for (std::int64_t ix = win.x0; ix < win.x1; ++ix)
        sum += simd::load(in + (iy * d.w + ix) * channels + c);
    simd::store(out + c, sum * inv_area);
  }
  for (; c < w; ++c) {
    float sum = 0.0f;
    for (std::int64_t iy = win.y0; iy < win.y1; ++iy)
      for (std::int64_t ix = win.x0; ix < win.x1; ++ix)
        sum += in[(iy * d.w + ix) * channels + c];
    out[c] = sum * inv_area;
  }
}

void pool_forward_nhwc(ThreadPool& pool, PoolKind kind, const Tensor& x, Tensor& y,
                       std::int32_t* argmax, const Pool2dParams& p) {
  const std::int64_t channels = x.dim(1);
  const PoolDims d = pool_dims(x, y);
  const float* px = x.data<float>();
  float* py = y.data<float>();
  const float inv_area = 1.0f / static_cast<float>(p.kernel_h * p.kernel_w);
  for_channel_blocks(pool, x.dim(0), channels, d.h * d.w,
                     [&](std::int64_t n, std::int64_t c0, std::int64_t c1) {
                       const float* in = px + n * d.h * d.w * channels + c0;
                       for (std::int64_t oy = 0; oy < d.oh; ++oy) {
                         for (std::int64_t ox = 0; ox < d.ow; ++ox) {
                           const Window win = window(d, p, oy, ox);
                           const std::int64_t o = ((n * d.oh + oy) * d.ow + ox) * channels + c0;
                           if (kind == PoolKind::Max)
                             max_window_nhwc(in, channels, c1 - c0, d, win, py + o, argmax + o);
                           else
                             avg_window_nhwc(in, channels, c1 - c0, d, win, inv_area, py + o);
                         }
                       }
                     });
}

void pool_backward_nhwc(ThreadPool& pool, PoolKind kind, const Tensor& dy,
                        const std::int32_t* argmax, Tensor& dx, const Pool2dParams& p) {
  const std::int64_t channels = dx.dim(1);
  const PoolDims d = pool_dims(dx, dy);
  const float* pdy = dy.data<float>();
  float* pdx = dx.data<float>();
  const float inv_area = 1.0f / static_cast<float>(p.kernel_h * p.kernel_w);
  for_channel_blocks(
      pool, dx.dim(0), channels, d.h * d.w, [&](std::int64_t n, std::int64_t c0, std::int64_t c1) {
        const std::int64_t w = c1 - c0;
        float* g = pdx + n * d.h * d.w * channels + c0;
        for (std::int64_t i = 0; i < d.h * d.w; ++i)
          std::memset(g + i * channels, 0, sizeof(float) * static_cast<std::size_t>(w));
        for (std::int64_t oy = 0; oy < d.oh; ++oy) {
          for (std::int64_t ox = 0; ox < d.ow; ++ox) {
            const std::int64_t o = (n * d.oh + oy) * d.ow + ox;
            const float* up = pdy + o * channels + c0;
            if (kind == PoolKind::Max) {
              const std::int32_t* arg = argmax + o * channels + c0;
              for (std::int64_t c = 0; c < w; ++c)
                g[arg[c] * channels + c] += up[c];
              continue;
            }
            const Window win = window(d, p, oy, ox);
            for (std::int64_t iy = win.y0; iy < win.y1; ++iy) {
              for (std::int64_t ix = win.x0; ix < win.x1; ++ix) {
                float* t = g + (iy * d.w + ix) * channels;
                for (std::int64_t c = 0; c < w; ++c)
                  t[c] += up[c] * inv_area;
              }
            }
          }
        }
      });
}

}  // namespace

void CpuBackend::pool2d_forward(PoolKind kind, const Tensor& x, Tensor& y, Tensor& workspace,
                                const Pool2dParams& p) {
  if (kind == PoolKind::Max && (!workspace.defined() || workspace.dtype() != DType::I32 ||
                                workspace.shape() != y.shape() || !workspace.device().is_cpu())) {
    workspace = Tensor::empty(y.shape(), DType::I32);
  }
  if (p.layout == ImageLayout::NHWC) {
    pool_forward_nhwc(ctx_.pool(), kind, x, y,
                      kind == PoolKind::Max ? workspace.data<std::int32_t>() : nullptr, p);
    return;
  }
  const PoolDims d = pool_dims(x, y);
  const float* px = x.data<float>();
  float* py = y.data<float>();
  const bool is_2x2 = p.kernel_h == 2 && p.kernel_w == 2 && p.stride_h == 2 && p.stride_w == 2 &&
                      p.pad_h == 0 && p.pad_w == 0;
  if (kind == PoolKind::Max) {
    std::int32_t* pw = workspace.data<std::int32_t>();
    for_planes(ctx_.pool(), d, [&](std::int64_t q) {
      const float* in = px + q * d.h * d.w;
      float* out = py + q * d.oh * d.ow;
      std::int32_t* arg = pw + q * d.oh * d.ow;
      if (is_2x2) {  // the common LeNet/VGG case, without the window bookkeeping
        for (std::int64_t oy = 0; oy < d.oh; ++oy) {
          const float* r0 = in + 2 * oy * d.w;
          const float* r1 = r0 + d.w;
          for (std::int64_t ox = 0; ox < d.ow; ++ox) {
            // Pairwise selects instead of a running maximum: on random activations the
            // comparisons are unpredictable and branch mispredictions dominated. Ties keep the
            // first element in row-major order, like the general path.
            const std::int64_t c = 2 * ox;
            const float a = r0[c], b = r0[c + 1], e = r1[c], f = r1[c + 1];
            const int s01 = b > a, s23 = f > e;
            const float v01 = s01 ? b : a, v23 = s23 ? f : e;
            const int s = v23 > v01;
            out[oy * d.ow + ox] = s ? v23 : v01;
            arg[oy * d.ow + ox] =
                static_cast<std::int32_t>((2 * oy + s) * d.w + c + (s ? s23 : s01));
          }
        }
        return;
      }
      for (std::int64_t oy = 0; oy < d.oh; ++oy) {
        for (std::int64_t ox = 0; ox < d.ow; ++ox) {
          const Window win = window(d, p, oy, ox);
          float best = -std::numeric_limits<float>::infinity();
          std::int64_t at = win.y0 * d.w + win.x0;
          for (std::int64_t iy = win.y0; iy < win.y1; ++iy) {
            for (std::int64_t ix = win.x0; ix < win.x1; ++ix) {
              if (in[iy * d.w + ix] > best) best = in[iy * d.w + ix], at = iy * d.w + ix;
            }
          }
          out[oy * d.ow + ox] = best;
          arg[oy * d.ow + ox] = static_cast<std::int32_t>(at);
        }
      }
    });
    return;
  }
  const float inv_area = 1.0f / static_cast<float>(p.kernel_h * p.kernel_w);
  for_planes(ctx_.pool(), d, [&](std::int64_t q) {
    const float* in = px + q * d.h * d.w;
    float* out = py + q * d.oh * d.ow;
    for (std::int64_t oy = 0; oy < d.oh; ++oy) {
      for (std::int64_t ox = 0; ox < d.ow; ++ox) {
        const Window win = window(d, p, oy, ox);
        float sum = 0.0f;
        for (std::int64_t iy = win.y0; iy < win.y1; ++iy) {
          for (std::int64_t ix = win.x0; ix < win.x1; ++ix)
            sum += in[iy * d.w + ix];
        }
        out[oy * d.ow + ox] = sum * inv_area;
      }
    }
  });
}

void CpuBackend::pool2d_backward(PoolKind kind, const Tensor& dy, const Tensor& workspace,
                                 Tensor& dx, const Pool2dParams& p) {
  const PoolDims d = pool_dims(dx, dy);
  const float* pdy = dy.data<float>();
  float* pdx = dx.data<float>();
  if (kind == PoolKind::Max) {
    LOCKSTEP_CHECK_HINT(workspace.dtype() == DType::I32 && workspace.shape() == dy.shape(),
                        "pass the workspace that pool2d_forward returned for this input",
                        "pool2d_backward: workspace is ", workspace.describe(),
                        ", expected i32 shaped like dy ", dy.describe());
  }
  if (p.layout == ImageLayout::NHWC) {
    pool_backward_nhwc(ctx_.pool(), kind, dy,
                       kind == PoolKind::Max ? workspace.data<std::int32_t>() : nullptr, dx, p);
    return;
  }
  if (kind == PoolKind::Max) {
    const std::int32_t* pw = workspace.data<std::int32_t>();
    for_planes(ctx_.pool(), d, [&](std::int64_t q) {
      float* g = pdx + q * d.h * d.w;
      const float* up = pdy + q * d.oh * d.ow;
      const std::int32_t* arg = pw + q * d.oh * d.ow;
      std::memset(g, 0, sizeof(float) * static_cast<std::size_t>(d.h * d.w));
      for (std::int64_t o = 0; o < d.oh * d.ow; ++o)
        g[arg[o]] += up[o];
    });
    return;
  }
  const float inv_area = 1.0f / static_cast<float>(p.kernel_h * p.kernel_w);
  for_planes(ctx_.pool(), d, [&](std::int64_t q) {
    float* g = pdx + q * d.h * d.w;
    const float* up = pdy + q * d.oh * d.ow;
    std::memset(g, 0, sizeof(float) * static_cast<std::size_t>(d.h * d.w));
    for (std::int64_t oy = 0; oy < d.oh; ++oy) {
      for (std::int64_t ox = 0; ox < d.ow; ++ox) {
        const Window win = window(d, p, oy, ox);
        const float v = up[oy * d.ow + ox] * inv_area;
        for (std::int64_t iy = win.y0; iy < win.y1; ++iy) {
          for (std::int64_t ix = win.x0; ix < win.x1; ++ix)
            g[iy * d.w + ix] += v;
        }
      }
    }
  });
}

}  // namespace lockstep::ops::cpu
