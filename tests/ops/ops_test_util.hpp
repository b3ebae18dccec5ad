// Helpers for the ops tests: seeded random tensors and tolerance checks against double-precision
// references computed in the tests themselves.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "lockstep/core/error.hpp"
#include "lockstep/core/rng.hpp"
#include "lockstep/core/tensor.hpp"
#include "lockstep/ops/ops.hpp"
#include "support/random_tensor.hpp"

namespace lockstep::testing {

// The same [N, C, H, W] values in the other memory order: from NCHW into `to`, or back.
inline Tensor in_layout(const Tensor& nchw, ops::ImageLayout to) {
  if (to == ops::ImageLayout::NCHW) return nchw.clone();
  const std::int64_t n = nchw.dim(0), c = nchw.dim(1), hw = nchw.dim(2) * nchw.dim(3);
  std::vector<float> v = nchw.to_vector<float>(), out(v.size());
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < c; ++j)
      for (std::int64_t p = 0; p < hw; ++p)
        out[static_cast<std::size_t>((i * hw + p) * c + j)] =
            v[static_cast<std::size_t>((i * c + j) * hw + p)];
  return Tensor::from_vector(out, nchw.shape());
}
inline Tensor from_layout(const Tensor& t, ops::ImageLayout from) {
  if (from == ops::ImageLayout::NCHW) return t.clone();
  const std::int64_t n = t.dim(0), c = t.dim(1), hw = t.dim(2) * t.dim(3);
  std::vector<float> v = t.to_vector<float>(), out(v.size());
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < c; ++j)
      for (std::int64_t p = 0; p < hw; ++p)
        out[static_cast<std::size_t>((i * c + j) * hw + p)] =
            v[static_cast<std::size_t>((i * hw + p) * c + j)];
  return Tensor::from_vector(out, t.shape());
}

inline std::vector<double> to_double(const Tensor& t) {
  std::vector<float> v = t.to_vector<float>();
  return {v.begin(), v.end()};
}

// Every element within atol + rtol * |want|; reports the first few mismatches with their index.
inline ::testing::AssertionResult all_close(const Tensor& got, const std::vector<double>& want,
                                            double rtol = 1e-5, double atol = 1e-5) {
  std::vector<float> g = got.to_vector<float>();
  if (g.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << g.size() << " vs reference " << want.size();
  }
  int bad = 0;
  std::string report;
  for (std::size_t i = 0; i < g.size(); ++i) {
    double err = std::abs(static_cast<double>(g[i]) - want[i]);
    if (!(err <= atol + rtol * std::abs(want[i]))) {
      if (++bad <= 5) {
        report += "\n  [" + std::to_string(i) + "] got " + std::to_string(g[i]) + ", want " +
                  std::to_string(want[i]);
      }
    }
  }
  if (bad)
    return ::testing::AssertionFailure() << bad << " of " << g.size() << " differ:" << report;
  return ::testing::AssertionSuccess();
}

// Bitwise equality of two f32 tensors.
inline ::testing::AssertionResult bitwise_equal(const Tensor& a, const Tensor& b) {
  std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  if (x.size() != y.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::memcmp(&x[i], &y[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << x[i] << " vs " << y[i] << " (bitwise)";
    }
  }
  return ::testing::AssertionSuccess();
}

// f() throws a lockstep::Error whose message contains needle.
template <class F>
void expect_error_containing(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace lockstep::testing
