// Float64 references and error bounds for the precision tests (tests/ops/test_precision.cpp,
// tests/ops/cuda/test_cuda_precision.cpp). Every bound is derived, not tuned:
//  * rounding an input to bf16 (round to nearest even) moves it by at most u_b = 2^-8 of itself
//    (ops::kBf16UnitRoundoff), so a product of two rounded inputs is off by at most
//    (2 u_b + u_b^2) |a b|;
//  * the product of two bf16 values is exact in f32 (8 + 8 significand bits < 24), so an f32
//    accumulation of K of them, then alpha and beta applied in f32, is off by at most
//    gamma(K + 3) * (sum_k |a_k b_k| + |beta c|), with gamma(n) = n u / (1 - n u), u = 2^-24
//    (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., section 3.1).
// The references therefore return, per output element, both the exact value and the sum of
// absolute terms that scales the bound.
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/core/tensor.hpp"
#include "lockstep/ops/ops.hpp"

// Skips the calling test, with the reason, where this CPU cannot run bf16.
#define LOCKSTEP_SKIP_WITHOUT_BF16()                                           \
  if (std::string why = ::lockstep::testing::bf16_unavailable(); !why.empty()) \
  GTEST_SKIP() << "this CPU cannot run bf16 (the policy refuses it): " << why

namespace lockstep::testing {

// Why bf16 cannot run on this CPU (the precision policy refuses it), or "" when it can.
inline std::string bf16_unavailable() {
  try {
    ops::Context ctx;
    ctx.set_precision(ops::Precision::BF16);
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

inline constexpr double kF32UnitRoundoff = 1.0 / 16777216.0;  // 2^-24

// gamma(n) of Higham's analysis: the relative error bound of n rounded f32 operations.
inline double gamma_f32(std::int64_t n) {
  const double nu = static_cast<double>(n) * kF32UnitRoundoff;
  return nu / (1.0 - nu);
}

// Round to nearest even with NaN kept and f32 subnormals flushed, written here independently of
// the library's two implementations (src/ops/cpu/cpu_precision.cpp,
// src/ops/cuda/cuda_precision.cu).
inline std::uint16_t reference_bf16_bits(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if (std::isnan(f)) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  if (std::fpclassify(f) == FP_SUBNORMAL) return static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t lower = u & 0xffffu, upper = u >> 16;
  const bool round_up = lower > 0x8000u || (lower == 0x8000u && (upper & 1u));
  return static_cast<std::uint16_t>(upper + (round_up ? 1u : 0u));
}
inline float reference_bf16(float f) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(reference_bf16_bits(f)) << 16);
}

// A host f32 tensor with every element rounded to bf16 (still f32).
inline Tensor rounded_to_bf16(const Tensor& t) {
  std::vector<float> v = t.to_vector<float>();
  for (float& x : v)
    x = reference_bf16(x);
  return Tensor::from_vector(v, t.shape());
}

// Exact value and sum of absolute terms per output element.
struct Reference {
  std::vector<double> value, abs_sum;
  std::int64_t terms = 0;  // the longest reduction: K in gamma(K + 3)
};

// c = alpha * op(a) op(b) + beta * c in float64; abs_sum = |alpha| sum |a b| + |beta c|.
inline Reference gemm_reference(bool ta, bool tb, double alpha, const Tensor& a, const Tensor& b,
                                double beta, const Tensor& c) {
  const std::int64_t m = c.dim(0), n = c.dim(1), k = ta ? a.dim(0) : a.dim(1);
  std::vector<float> av = a.to_vector<float>(), bv = b.to_vector<float>(),
                     cv = c.to_vector<float>();
  Reference r;
  r.terms = k;
  r.value.resize(static_cast<std::size_t>(m * n));
  r.abs_sum.resize(r.value.size());
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0.0, abs = 0.0;
      for (std::int64_t p = 0; p < k; ++p) {
        double x = ta ? av[p * m + i] : av[i * k + p];
        double y = tb ? bv[j * k + p] : bv[p * n + j];
        s += x * y;
        abs += std::fabs(x * y);
      }
      const std::size_t o = static_cast<std::size_t>(i * n + j);
      r.value[o] = alpha * s + beta * cv[o];
      r.abs_sum[o] = std::fabs(alpha) * abs + std::fabs(beta * cv[o]);
    }
  }
  return r;
}

struct ConvShape {
  std::int64_t n, c, h, w, o, kh, kw;
  int stride, pad;
  std::int64_t oh() const { return ops::window_output_size(h, static_cast<int>(kh), stride, pad); }
  std::int64_t ow() const { return ops::window_output_size(w, static_cast<int>(kw), stride, pad); }
};

// Forward (y = conv(x, w) + b), backward data (dx = conv^T(dy, w)) and backward weights
// (dw_old + dL/dw) in float64 from direct loops over the taps.
struct ConvReferences {
  Reference y, dx, dw;
};
inline ConvReferences conv_reference(const ConvShape& k, const Tensor& x, const Tensor& w,
                                     const Tensor& b, const Tensor& dy, const Tensor& dw_old) {
  std::vector<float> xv = x.to_vector<float>(), wv = w.to_vector<float>(),
                     bv = b.to_vector<float>(), dyv = dy.to_vector<float>(),
                     dwv = dw_old.to_vector<float>();
  const std::int64_t oh = k.oh(), ow = k.ow();
  auto xi = [&](auto n, auto c, auto y, auto x_) { return ((n * k.c + c) * k.h + y) * k.w + x_; };
  auto wi = [&](auto o, auto c, auto y, auto x_) { return ((o * k.c + c) * k.kh + y) * k.kw + x_; };
  auto yi = [&](auto n, auto o, auto y, auto x_) { return ((n * k.o + o) * oh + y) * ow + x_; };
  ConvReferences r;
  r.y.value.assign(dyv.size(), 0.0);
  r.y.abs_sum.assign(dyv.size(), 0.0);
  r.dx.value.assign(xv.size(), 0.0);
  r.dx.abs_sum.assign(xv.size(), 0.0);
  r.dw.value.assign(wv.size(), 0.0);
  r.dw.abs_sum.assign(wv.size(), 0.0);
  r.y.terms = k.c * k.kh * k.kw;
  r.dx.terms = k.o * k.kh * k.kw;
  r.dw.terms = k.n * oh * ow;
  for (std::int64_t n = 0; n < k.n; ++n)
    for (std::int64_t o = 0; o < k.o; ++o)
      for (std::int64_t oy = 0; oy < oh; ++oy)
        for (std::int64_t ox = 0; ox < ow; ++ox)
          for (std::int64_t ci = 0; ci < k.c; ++ci)
            for (std::int64_t ky = 0; ky < k.kh; ++ky)
              for (std::int64_t kx = 0; kx < k.kw; ++kx) {
                const std::int64_t iy = oy * k.stride - k.pad + ky, ix = ox * k.stride - k.pad + kx;
                if (iy < 0 || iy >= k.h || ix < 0 || ix >= k.w) continue;
                const auto X = static_cast<std::size_t>(xi(n, ci, iy, ix));
                const auto W = static_cast<std::size_t>(wi(o, ci, ky, kx));
                const auto Y = static_cast<std::size_t>(yi(n, o, oy, ox));
                r.y.value[Y] += double{xv[X]} * wv[W];
                r.y.abs_sum[Y] += std::fabs(double{xv[X]} * wv[W]);
                r.dx.value[X] += double{dyv[Y]} * wv[W];
                r.dx.abs_sum[X] += std::fabs(double{dyv[Y]} * wv[W]);
                r.dw.value[W] += double{dyv[Y]} * xv[X];
                r.dw.abs_sum[W] += std::fabs(double{dyv[Y]} * xv[X]);
              }
  for (std::size_t i = 0; i < r.y.value.size(); ++i) {
    const double bias = bv[(i / static_cast<std::size_t>(oh * ow)) % static_cast<std::size_t>(k.o)];
    r.y.value[i] += bias;
    r.y.abs_sum[i] += std::fabs(bias);
  }
  for (std::size_t i = 0; i < r.dw.value.size(); ++i) {
    r.dw.value[i] += dwv[i];
    r.dw.abs_sum[i] += std::fabs(double{dwv[i]});
  }
  return r;
}

// Every |got - want.value| <= rel * want.abs_sum (+ out_rel * |want.value|, for results that are
// themselves rounded to a narrower type, such as cuDNN's bf16 outputs); reports the worst element.
inline ::testing::AssertionResult within_bound(const Tensor& got, const Reference& want, double rel,
                                               double out_rel = 0.0) {
  std::vector<float> g = got.to_vector<float>();
  if (g.size() != want.value.size())
    return ::testing::AssertionFailure() << "size " << g.size() << " vs " << want.value.size();
  double worst = 0.0;
  std::size_t at = 0;
  int bad = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double err = std::fabs(static_cast<double>(g[i]) - want.value[i]);
    const double bound = rel * want.abs_sum[i] + out_rel * std::fabs(want.value[i]);
    if (!(err <= bound)) ++bad;
    const double ratio = bound > 0 ? err / bound : (err > 0 ? INFINITY : 0.0);
    if (!(ratio <= worst)) worst = ratio, at = i;
  }
  if (bad)
    return ::testing::AssertionFailure()
           << bad << " of " << g.size() << " elements outside the bound; worst [" << at << "]: got "
           << g[at] << ", want " << want.value[at] << " (error "
           << std::fabs(g[at] - want.value[at]) << " = " << worst << " x the bound)";
  return ::testing::AssertionSuccess() << "worst element at " << worst << " of the bound";
}

// max_i |got_i - want_i| / abs_sum_i: the observed error in units of the sum of |terms|.
inline double relative_error(const Tensor& got, const Reference& want) {
  std::vector<float> g = got.to_vector<float>();
  double worst = 0.0;
  for (std::size_t i = 0; i < g.size() && i < want.value.size(); ++i) {
    if (want.abs_sum[i] > 0)
      worst = std::max(worst, std::fabs(g[i] - want.value[i]) / want.abs_sum[i]);
  }
  return worst;
}

}  // namespace lockstep::testing
