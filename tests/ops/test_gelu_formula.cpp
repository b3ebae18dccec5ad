// GELU (tanh form): the scalar formula shared by host and device code (ops/gelu_tanh.hpp, which
// the CUDA kernels run) against a float64 reference at the extremes, and the CPU backend's SIMD
// kernels against that scalar formula. Runs on any machine: this is how the CUDA kernel's math
// is checked where no GPU is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "lockstep/ops/context.hpp"
#include "lockstep/ops/ops.hpp"
#include "ops/gelu_tanh.hpp"

using namespace lockstep;

namespace {

// The points the review named: both tails, where e^{-2u} over- or underflows in float32
// (|x| >= 10.4), and the ordinary range.
const std::vector<float> kPoints = {-1e4f, -100.0f, -20.0f, -10.5f, -10.0f, -5.0f,
                                    0.0f,  5.0f,    10.0f,  20.0f,  100.0f, 1e4f};

// float64, sigmoid form with s and 1 - s each from an exp that cannot overflow into a product
// with 0 (exp(2u) and exp(-2u) separately), no clamp: an independent derivation of
// gelu = x s and gelu' = s + 2 x s (1 - s) u'.
struct Reference {
  double value, grad;
};
Reference reference(double x) {
  const double k = std::sqrt(2.0 / M_PI), c = 0.044715;
  const double u = k * (x + c * x * x * x);
  const double s = 1.0 / (1.0 + std::exp(-2.0 * u)), one_minus_s = 1.0 / (1.0 + std::exp(2.0 * u));
  const double du = k * (1.0 + 3.0 * c * x * x);
  return {x * s, s + 2.0 * x * s * one_minus_s * du};
}

// Where float64 says gelu or gelu' is below this, the clamp in gelu_tanh_exp leaves a tiny
// non-zero float32 instead (|gelu'(-1e4)| = 6e-28, see ops/gelu_tanh.hpp): 1e-20 is 14 orders
// below the float32 resolution of a gradient of order one.
constexpr double kTailFloor = 1e-20;
// Elsewhere: a few float32 roundings (exp, the divisions and products), relative.
constexpr double kRelative = 4e-7;

void expect_near_reference(double got, double want, float x, const char* what) {
  ASSERT_TRUE(std::isfinite(got)) << what << "(" << x << ") = " << got << ", want " << want;
  EXPECT_LE(std::abs(got - want), kRelative * std::abs(want) + kTailFloor)
      << what << "(" << x << ") = " << got << ", float64 says " << want;
}

// Distance in representable floats (0 = bitwise equal); +0 and -0 are 0 apart.
std::int64_t ulps(float a, float b) {
  auto key = [](float f) {
    std::int32_t i;
    std::memcpy(&i, &f, sizeof i);
    return i < 0 ? -static_cast<std::int64_t>(i & 0x7fffffff) : static_cast<std::int64_t>(i);
  };
  return std::abs(key(a) - key(b));
}

TEST(GeluTanhFormula, ValueMatchesFloat64AtTheExtremes) {
  for (float x : kPoints)
    expect_near_reference(ops::gelu_tanh(x), reference(x).value, x, "gelu_tanh");
}

// The CUDA backward kernel used to give NaN here for every x below about -10.3: its unclamped
// e^{-2u} overflowed to inf and s * e was 0 * inf.
TEST(GeluTanhFormula, DerivativeMatchesFloat64AtTheExtremesWithoutNaN) {
  for (float x : kPoints)
    expect_near_reference(ops::gelu_tanh_grad(x, 1.0f), reference(x).grad, x, "gelu_tanh_grad");
  // g scales the result exactly (one multiplication by a power of two).
  EXPECT_EQ(ops::gelu_tanh_grad(-10.5f, 0.5f), 0.5f * ops::gelu_tanh_grad(-10.5f, 1.0f));
}

// Documented in ops/gelu_tanh.hpp: infinities stay infinities of the same sign (so the gradient
// check reports them), NaN stays NaN.
TEST(GeluTanhFormula, NonFiniteInputsStayNonFinite) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(ops::gelu_tanh(inf), inf);
  EXPECT_EQ(ops::gelu_tanh(-inf), -inf);
  EXPECT_EQ(ops::gelu_tanh_grad(inf, 1.0f), inf);
  EXPECT_EQ(ops::gelu_tanh_grad(-inf, 1.0f), -inf);
  EXPECT_TRUE(std::isnan(ops::gelu_tanh(nan)));
  EXPECT_TRUE(std::isnan(ops::gelu_tanh_grad(nan, 1.0f)));
  EXPECT_TRUE(std::isnan(ops::gelu_tanh_grad(1.0f, nan)));
}

// The CPU backend's SIMD kernels against the shared scalar formula, on the same points plus the
// infinities. They do the same float operations in the same order (no FMA contraction in ISO C++
// mode); only e^t differs: simd::exp is a Cephes polynomial, the scalar formula the C library's
// expf. At these points the exp arguments are clamped, 0 or exps both round alike, and the
// results are bitwise equal (measured with glibc); the bound is 1 ulp, not 0, because nothing
// promises the two exps round alike. Elsewhere they do not always: over a sweep of [-12, 12] one
// ulp of e^t differs for a quarter of the points, which the derivative's cancellation near its
// zero (x = -0.75) turns into thousands of ulps of a result near 0 (an absolute 1e-7 or so).
constexpr std::int64_t kSimdUlps = 1;

TEST(GeluTanhFormula, CpuSimdKernelsAgreeWithTheScalarFormula) {
  std::vector<float> xs = kPoints;
  for (float x : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()})
    xs.push_back(x);
  const auto n = static_cast<std::int64_t>(xs.size());
  ops::Context cpu;
  Tensor x = Tensor::from_vector(xs, {n}), y = Tensor::empty({n}), dx = Tensor::empty({n});
  Tensor ones = Tensor::from_vector(std::vector<float>(xs.size(), 1.0f), {n});
  ops::gelu_tanh_forward(cpu, x, y);
  ops::gelu_tanh_backward(cpu, x, ones, dx);
  const std::vector<float> value = y.to_vector<float>(), grad = dx.to_vector<float>();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    EXPECT_LE(ulps(value[i], ops::gelu_tanh(xs[i])), kSimdUlps)
        << "gelu_tanh(" << xs[i] << "): CPU " << value[i] << ", scalar " << ops::gelu_tanh(xs[i]);
    EXPECT_LE(ulps(grad[i], ops::gelu_tanh_grad(xs[i], 1.0f)), kSimdUlps)
        << "gelu_tanh_grad(" << xs[i] << "): CPU " << grad[i] << ", scalar "
        << ops::gelu_tanh_grad(xs[i], 1.0f);
  }
}

}  // namespace
