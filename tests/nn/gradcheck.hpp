// Finite-difference gradient checks for modules.
//
// Objective: L = sum_i w_i * y_i with fixed random weights w, accumulated in double, so dL/dy = w
// and the module's backward(w) must return dL/dx and accumulate dL/dparam.
// Numerical gradient: central differences (L(v + h) - L(v - h)) / 2h, evaluated in float32.
// Its error has two parts: float32 rounding of L, about eps_f32 * sum|w_i y_i| / h (eps = 1.2e-7;
// for our ~10^2 outputs of size ~1 that is ~1e-5 / h), and truncation, h^2/6 * |L'''| (zero for
// the piecewise-linear layers away from their kinks). h = 1e-2 balances the two for the smooth
// layers: both terms come to ~1e-3 at worst, so we accept |num - ana| <= 2e-3 + 1e-2 |ana|; a
// wrong gradient (a missing term, a transposed weight, a wrong scale) is off by O(|ana|) ~ 0.1-1.
// Kinks (ReLU at 0, max-pool ties) are kept further than h from every input by construction.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/core/rng.hpp"
#include "lockstep/nn/module.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::testing {

struct GradCheckOptions {
  double h = 1e-2;
  double atol = 2e-3;
  double rtol = 1e-2;
  bool check_input = true;
  std::function<void()> before_forward;  // e.g. rewind a dropout layer to the same mask
};

// Random f32 tensor U(lo, hi) from Philox(seed, stream).
inline Tensor random_tensor(const Shape& shape, std::uint64_t seed, float lo = -1.0f,
                            float hi = 1.0f, std::uint64_t stream = 0) {
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  Philox(seed, stream).fill_uniform(v.data(), static_cast<std::int64_t>(v.size()), lo, hi);
  return Tensor::from_vector(v, shape);
}

// Distinct values a shuffled grid apart by `spacing`, centred on 0 and never closer than
// spacing/2 to it: no ReLU kink or max-pool tie within +-spacing/2 of any input.
inline Tensor spaced_tensor(const Shape& shape, std::uint64_t seed, float spacing = 0.1f) {
  std::int64_t n = shape_numel(shape);
  // Odd multiples of spacing/2: (i - (n-1)/2) is a half-integer for even n; shift odd n by 1/2.
  double shift = (n % 2 == 1) ? 0.5 : 0.0;
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    v[static_cast<std::size_t>(i)] =
        static_cast<float>((static_cast<double>(i) - (n - 1) / 2.0 + shift) * spacing);
  }
  Philox rng(seed, 99);
  for (std::int64_t i = n - 1; i > 0; --i) {  // Fisher-Yates
    auto j = static_cast<std::size_t>(rng.u32(static_cast<std::uint64_t>(i)) %
                                      static_cast<std::uint32_t>(i + 1));
    std::swap(v[static_cast<std::size_t>(i)], v[j]);
  }
  return Tensor::from_vector(v, shape);
}

// Initialises a module's parameters as a model would (seeded, no name prefix).
template <class M>
M& init(M& m, std::uint64_t seed = 7) {
  std::vector<nn::Parameter*> params;
  m.collect_parameters("", params);
  m.reset_parameters(seed, "");
  return m;
}

inline double weighted_sum(const Tensor& y, const std::vector<float>& w) {
  std::vector<float> v = y.to_vector<float>();
  double s = 0.0;
  for (std::size_t i = 0; i < v.size(); ++i)
    s += static_cast<double>(w[i]) * v[i];
  return s;
}

// Compares backward's dL/dx and every parameter gradient with central differences; returns
// nothing, reports mismatches (at most a few per tensor) through gtest.
inline void check_gradients(ops::Context& ctx, nn::Module& m, Tensor x,
                            const GradCheckOptions& opt = {}) {
  auto run = [&]() {
    if (opt.before_forward) opt.before_forward();
    return m.forward(ctx, x);
  };
  Tensor y = run();
  std::vector<float> w(static_cast<std::size_t>(y.numel()));
  Philox(1234, 5).fill_uniform(w.data(), y.numel(), -1.0f, 1.0f);
  std::vector<nn::Parameter*> params;
  m.collect_parameters("", params);
  for (nn::Parameter* p : params)
    ops::fill(ctx, p->grad, 0.0f);
  Tensor dx = m.backward(ctx, Tensor::from_vector(w, y.shape()));

  auto objective = [&]() { return weighted_sum(run(), w); };
  auto compare = [&](const std::string& what, float* values, std::int64_t n,
                     const std::vector<float>& analytic) {
    int failures = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      float saved = values[i];
      values[i] = static_cast<float>(saved + opt.h);
      double plus = objective();
      values[i] = static_cast<float>(saved - opt.h);
      double minus = objective();
      values[i] = saved;
      double numeric = (plus - minus) / (2.0 * opt.h);
      double ana = analytic[static_cast<std::size_t>(i)];
      if (std::abs(numeric - ana) > opt.atol + opt.rtol * std::abs(ana) && failures++ < 5) {
        ADD_FAILURE() << m.describe() << ": d/d" << what << "[" << i << "] analytic " << ana
                      << " vs finite difference " << numeric;
      }
    }
  };
  if (opt.check_input) {
    ASSERT_TRUE(dx.defined()) << m.describe() << " returned no input gradient";
    ASSERT_EQ(dx.shape(), x.shape());
    compare("x", x.data<float>(), x.numel(), dx.to_vector<float>());
  }
  for (nn::Parameter* p : params) {
    std::vector<float> analytic = p->grad.to_vector<float>();
    compare(p->name, p->value.data<float>(), p->value.numel(), analytic);
  }
}

}  // namespace lockstep::testing
