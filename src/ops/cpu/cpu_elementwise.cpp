// CPU elementwise kernels: one pass over memory each, plain loops the compiler vectorises,
// split over the Context's pool above kParallelGrain elements.
#include <algorithm>
#include <cmath>

#include "lockstep/core/rng.hpp"
#include "ops/cpu/bf16_rows.hpp"
#include "ops/cpu/cpu_backend.hpp"
#include "ops/cpu/parallel.hpp"

namespace lockstep::ops::cpu {
namespace {
constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;
}  // namespace

void CpuBackend::relu_forward(const Tensor& x, Tensor& y) {
  const float* px = x.data<float>();
  float* py = y.data<float>();
  parallel_range(ctx_.pool(), x.numel(), kParallelGrain, [&](std::int64_t b, std::int64_t e) {
    LOCKSTEP_IVDEP
    for (std::int64_t i = b; i < e; ++i)
      py[i] = px[i] > 0.0f ? px[i] : 0.0f;
  });
}

void CpuBackend::relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  const float* py = y.data<float>();
  const float* pdy = dy.data<float>();
  float* pdx = dx.data<float>();
  parallel_range(ctx_.pool(), y.numel(), kParallelGrain, [&](std::int64_t b, std::int64_t e) {
    LOCKSTEP_IVDEP
    for (std::int64_t i = b; i < e; ++i) {
      const float g = pdy[i];  // loaded unconditionally, so the select vectorises
      pdx[i] = py[i] > 0.0f ? g : 0.0f;
    }
  });
}

void CpuBackend::gelu_forward(const Tensor& x, Tensor& y) {
  const float* px = x.data<float>();
  float* py = y.data<float>();
  parallel_range(ctx_.pool(), x.numel(), kParallelGrain / 8, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      float v = px[i];
      py[i] = 0.5f * v * (1.0f + std::erf(v * kInvSqrt2));
    }
  });
}

void CpuBackend::gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  const float* px = x.data<float>();
  const float* pdy = dy.data<float>();
  float* pdx = dx.data<float>();
  parallel_range(ctx_.pool(), x.numel(), kParallelGrain / 8, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      float v = px[i];
      float cdf = 0.5f * (1.0f + std::erf(v * kInvSqrt2));
      float pdf = kInvSqrt2Pi * std::exp(-0.5f * v * v);
      pdx[i] = pdy[i] * (cdf + v * pdf);
    }
  });
}

void CpuBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  const float* pa = a.data<float>();
  float* po = out.data<float>();
  if (b.dtype() == DType::BF16) {  // a block's residual stream plus its bf16 branch
    const std::uint16_t* pb = bf16_in(b);
    parallel_range(ctx_.pool(), a.numel(), kParallelGrain, [&](std::int64_t s, std::int64_t e) {
      float* wide = thread_scratch(kBf16Chunk);
      for (std::int64_t c0 = s; c0 < e; c0 += kBf16Chunk) {
        const std::int64_t n = std::min(kBf16Chunk, e - c0);
        widen_bf16(pb + c0, wide, n);
        LOCKSTEP_IVDEP
        for (std::int64_t i = 0; i < n; ++i)
          po[c0 + i] = pa[c0 + i] + wide[i];
      }
    });
    return;
  }
  const float* pb = b.data<float>();
  parallel_range(ctx_.pool(), a.numel(), kParallelGrain, [&](std::int64_t s, std::int64_t e) {
    LOCKSTEP_IVDEP
    for (std::int64_t i = s; i < e; ++i)
      po[i] = pa[i] + pb[i];
  });
}

// relu_backward then add in one pass: the same two roundings (none, then the sum's). y is f32, or
// a bf16 block output (whose sign is its widened value's).
void CpuBackend::relu_backward_add(const Tensor& y, const Tensor& dy, const Tensor& a, Tensor& dx) {
  const float* pdy = dy.data<float>();
  const float* pa = a.data<float>();
  float* pdx = dx.data<float>();
  auto run = [&](const auto* py) {
    parallel_range(ctx_.pool(), y.numel(), kParallelGrain, [&](std::int64_t b, std::int64_t e) {
      LOCKSTEP_IVDEP
      for (std::int64_t i = b; i < e; ++i) {
        const float g = pdy[i];
        pdx[i] = pa[i] + (widened(py[i]) > 0.0f ? g : 0.0f);
      }
    });
  };
  if (y.dtype() == DType::BF16)
    run(bf16_in(y));
  else
    run(y.data<float>());
}

void CpuBackend::axpy(float alpha, const Tensor& x, Tensor& y) {
  const float* px = x.data<float>();
  float* py = y.data<float>();
  parallel_range(ctx_.pool(), x.numel(), kParallelGrain, [&](std::int64_t b, std::int64_t e) {
    LOCKSTEP_IVDEP
    for (std::int64_t i = b; i < e; ++i)
      py[i] += alpha * px[i];
  });
}

void CpuBackend::scale(Tensor& x, float alpha) {
  float* px = x.data<float>();
  parallel_range(ctx_.pool(), x.numel(), kParallelGrain, [&](std::int64_t b, std::int64_t e) {
    LOCKSTEP_IVDEP
    for (std::int64_t i = b; i < e; ++i)
      px[i] *= alpha;
  });
}

void CpuBackend::dropout_forward(const Tensor& x, Tensor& y, Tensor& mask, float p,
                                 std::uint64_t seed, std::uint64_t stream) {
  const float* px = x.data<float>();
  float* py = y.data<float>();
  std::uint8_t* pm = mask.data<std::uint8_t>();
  const float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  const Philox rng(seed, stream);
  // Philox yields four words per counter: cut the range at multiples of 4 so each block is
  // computed once. The decision for element i is exactly Philox::uniform(i) >= p.
  parallel_range_aligned(
      ctx_.pool(), x.numel(), kParallelGrain / 8, 4, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t base = b; base < e; base += 4) {
          auto words = rng.block(static_cast<std::uint64_t>(base / 4));
          std::int64_t lim = std::min<std::int64_t>(4, e - base);
          for (std::int64_t j = 0; j < lim; ++j) {
            float u =
                static_cast<float>(words[static_cast<std::size_t>(j)] >> 8) * (1.0f / 16777216.0f);
            bool keep = u >= p;
            pm[base + j] = keep ? 1 : 0;
            py[base + j] = keep ? px[base + j] * keep_scale : 0.0f;
          }
        }
      });
}

void CpuBackend::dropout_backward(const Tensor& dy, const Tensor& mask, float p, Tensor& dx) {
  const float* pdy = dy.data<float>();
  const std::uint8_t* pm = mask.data<std::uint8_t>();
  float* pdx = dx.data<float>();
  const float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  parallel_range(ctx_.pool(), dy.numel(), kParallelGrain, [&](std::int64_t b, std::int64_t e) {
    LOCKSTEP_IVDEP
    for (std::int64_t i = b; i < e; ++i) {
      const float g = pdy[i] * keep_scale;  // unconditional, so the select vectorises
      pdx[i] = pm[i] ? g : 0.0f;
    }
  });
}

void CpuBackend::normalize_input(const Tensor& x, const std::vector<float>& mean,
                                 const std::vector<float>& stddev, Tensor& y) {
  const std::int64_t n = x.dim(0), c = x.ndim() >= 2 ? x.dim(1) : 1;
  const std::int64_t inner = (n * c) != 0 ? x.numel() / (n * c) : 0;
  const float in_scale = x.dtype() == DType::U8 ? 1.0f / 255.0f : 1.0f;
  float* py = y.data<float>();
  const std::uint8_t* pu = x.dtype() == DType::U8 ? x.data<std::uint8_t>() : nullptr;
  const float* pf = x.dtype() == DType::F32 ? x.data<float>() : nullptr;
  // One (n, c) plane per unit of work: y = x * a[c] + b[c], a and b folded once per plane.
  parallel_range(ctx_.pool(), n * c,
                 std::max<std::int64_t>(1, kParallelGrain / std::max<std::int64_t>(inner, 1)),
                 [&](std::int64_t p0, std::int64_t p1) {
                   for (std::int64_t plane = p0; plane < p1; ++plane) {
                     const auto ch = static_cast<std::size_t>(plane % c);
                     const float m = mean.empty() ? 0.0f : mean[ch];
                     const float s = stddev.empty() ? 1.0f : stddev[ch];
                     const float a = in_scale / s, b = -m / s;
                     float* out = py + plane * inner;
                     if (pu) {
                       const std::uint8_t* in = pu + plane * inner;
                       for (std::int64_t i = 0; i < inner; ++i)
                         out[i] = static_cast<float>(in[i]) * a + b;
                     } else {
                       const float* in = pf + plane * inner;
                       for (std::int64_t i = 0; i < inner; ++i)
                         out[i] = in[i] * a + b;
                     }
                   }
                 });
}

}  // namespace lockstep::ops::cpu
