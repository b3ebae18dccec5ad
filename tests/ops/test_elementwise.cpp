// Elementwise ops, dropout and input normalisation against double-precision loops.
#include <gtest/gtest.h>

#include <cmath>

#include "lockstep/core/error.hpp"
#include "lockstep/ops/ops.hpp"
#include "ops_test_util.hpp"

using namespace lockstep;
using lockstep::testing::all_close;
using lockstep::testing::bitwise_equal;
using lockstep::testing::random_tensor;
using lockstep::testing::to_double;

namespace {
// Odd sizes, one below and one above the size at which the CPU backend goes parallel.
const Shape kShapes[] = {{1}, {3, 5}, {2, 3, 7, 7}, {1000, 301}};

template <class F>
std::vector<double> map1(const Tensor& x, F f) {
  auto v = to_double(x);
  for (auto& e : v)
    e = f(e);
  return v;
}
}  // namespace

TEST(Elementwise, ReluForwardAndBackwardMatchDefinition) {
  ops::Context ctx(Device::cpu(), 2);
  for (const auto& shape : kShapes) {
    Tensor x = random_tensor(shape, 1), dy = random_tensor(shape, 2);
    Tensor y = Tensor::empty(shape), dx = Tensor::empty(shape);
    ops::relu_forward(ctx, x, y);
    EXPECT_TRUE(all_close(y, map1(x, [](double v) { return v > 0 ? v : 0.0; }), 0, 0));
    ops::relu_backward(ctx, y, dy, dx);
    auto xv = to_double(x), dyv = to_double(dy);
    std::vector<double> want(xv.size());
    for (std::size_t i = 0; i < xv.size(); ++i)
      want[i] = xv[i] > 0 ? dyv[i] : 0.0;
    EXPECT_TRUE(all_close(dx, want, 0, 0)) << shape_str(shape);
  }
}

TEST(Elementwise, GeluForwardAndBackwardMatchErfFormula) {
  ops::Context ctx(Device::cpu(), 2);
  for (const auto& shape : kShapes) {
    Tensor x = random_tensor(shape, 3, -4.0f, 4.0f), dy = random_tensor(shape, 4);
    Tensor y = Tensor::empty(shape), dx = Tensor::empty(shape);
    ops::gelu_forward(ctx, x, y);
    auto gelu = [](double v) { return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))); };
    EXPECT_TRUE(all_close(y, map1(x, gelu), 1e-5, 1e-6));
    ops::gelu_backward(ctx, x, dy, dx);
    // Reference derivative by central differences of the double formula.
    auto xv = to_double(x), dyv = to_double(dy);
    std::vector<double> want(xv.size());
    for (std::size_t i = 0; i < xv.size(); ++i) {
      const double h = 1e-6;
      want[i] = dyv[i] * (gelu(xv[i] + h) - gelu(xv[i] - h)) / (2 * h);
    }
    EXPECT_TRUE(all_close(dx, want, 1e-4, 1e-5)) << shape_str(shape);
  }
}

TEST(Elementwise, AddAxpyAndScale) {
  ops::Context ctx(Device::cpu(), 2);
  for (const auto& shape : kShapes) {
    Tensor a = random_tensor(shape, 5), b = random_tensor(shape, 6), out = Tensor::empty(shape);
    auto av = to_double(a), bv = to_double(b);
    ops::add(ctx, a, b, out);
    std::vector<double> want(av.size());
    for (std::size_t i = 0; i < av.size(); ++i)
      want[i] = av[i] + bv[i];
    EXPECT_TRUE(all_close(out, want, 1e-7, 0));
    ops::axpy(ctx, -0.5f, a, b);  // b += -0.5 a
    for (std::size_t i = 0; i < av.size(); ++i)
      want[i] = bv[i] - 0.5 * av[i];
    EXPECT_TRUE(all_close(b, want, 1e-6, 1e-7));
    ops::scale(ctx, a, 3.0f);
    for (std::size_t i = 0; i < av.size(); ++i)
      want[i] = 3.0 * av[i];
    EXPECT_TRUE(all_close(a, want, 1e-7, 0));
  }
  Tensor a = Tensor::zeros({3}), b = Tensor::zeros({4});
  EXPECT_THROW(ops::add(ctx, a, a, b), Error);
}

TEST(Dropout, KeepsAboutOneMinusPAndScalesKeptValues) {
  ops::Context ctx(Device::cpu(), 2);
  const Shape shape{256, 1001};
  Tensor x = random_tensor(shape, 7), y = Tensor::empty(shape), dy = random_tensor(shape, 8);
  Tensor mask = Tensor::empty(shape, DType::U8), dx = Tensor::empty(shape);
  const float p = 0.3f;
  ops::dropout_forward(ctx, x, y, mask, p, /*seed=*/11, /*stream=*/5);
  auto m = mask.to_vector<std::uint8_t>();
  auto xv = to_double(x), dyv = to_double(dy);
  std::int64_t kept = 0;
  std::vector<double> want_y(xv.size()), want_dx(xv.size());
  Philox rng(11, 5);
  for (std::size_t i = 0; i < m.size(); ++i) {
    const bool keep = rng.uniform(i) >= p;  // the documented decision rule
    ASSERT_EQ(m[i], keep ? 1 : 0) << "element " << i;
    kept += keep;
    want_y[i] = keep ? xv[i] / (1.0 - p) : 0.0;
    want_dx[i] = keep ? dyv[i] / (1.0 - p) : 0.0;
  }
  const double rate = static_cast<double>(kept) / static_cast<double>(m.size());
  EXPECT_NEAR(rate, 1.0 - p, 0.005);  // 256k Bernoulli draws: sd ~ 0.0009
  EXPECT_TRUE(all_close(y, want_y, 1e-6, 0));
  ops::dropout_backward(ctx, dy, mask, p, dx);
  EXPECT_TRUE(all_close(dx, want_dx, 1e-6, 0));
}

TEST(Dropout, SameSeedAndStreamGiveTheSameMaskOnAnyThreadCount) {
  const Shape shape{129, 513};
  Tensor x = random_tensor(shape, 9);
  auto run = [&](int threads, std::uint64_t stream) {
    ops::Context ctx(Device::cpu(), threads);
    Tensor y = Tensor::empty(shape), mask = Tensor::empty(shape, DType::U8);
    ops::dropout_forward(ctx, x, y, mask, 0.5f, 3, stream);
    return mask.to_vector<std::uint8_t>();
  };
  EXPECT_EQ(run(1, 1), run(2, 1));
  EXPECT_NE(run(2, 1), run(2, 2));
}

TEST(Dropout, PZeroIsIdentityAndPOneDropsEverything) {
  ops::Context ctx;
  Tensor x = random_tensor({5, 7}, 10), y = Tensor::empty({5, 7});
  Tensor mask = Tensor::empty({5, 7}, DType::U8);
  ops::dropout_forward(ctx, x, y, mask, 0.0f, 1, 1);
  EXPECT_TRUE(bitwise_equal(x, y));
  ops::dropout_forward(ctx, x, y, mask, 1.0f, 1, 1);
  EXPECT_TRUE(all_close(y, std::vector<double>(35, 0.0), 0, 0));
}

TEST(NormalizeInput, U8PixelsAreScaledAndNormalisedPerChannel) {
  ops::Context ctx(Device::cpu(), 2);
  const Shape shape{3, 2, 5, 7};
  std::vector<std::uint8_t> pix(static_cast<std::size_t>(shape_numel(shape)));
  Philox rng(1, 1);
  for (std::size_t i = 0; i < pix.size(); ++i)
    pix[i] = static_cast<std::uint8_t>(rng.u32(i) & 255);
  Tensor x = Tensor::from_vector(pix, shape), y = Tensor::empty(shape);
  const std::vector<float> mean{0.25f, 0.5f}, stddev{0.5f, 0.125f};
  ops::normalize_input(ctx, x, mean, stddev, y);
  std::vector<double> want(pix.size());
  for (std::size_t i = 0; i < pix.size(); ++i) {
    std::size_t c = (i / 35) % 2;
    want[i] = (pix[i] / 255.0 - mean[c]) / stddev[c];
  }
  EXPECT_TRUE(all_close(y, want, 1e-6, 1e-6));
  ops::normalize_input(ctx, x, {}, {}, y);  // empty: mean 0, std 1
  for (std::size_t i = 0; i < pix.size(); ++i)
    want[i] = pix[i] / 255.0;
  EXPECT_TRUE(all_close(y, want, 1e-6, 1e-7));
}

TEST(NormalizeInput, F32InputSkipsThePixelScaleAndWrongChannelCountIsAnError) {
  ops::Context ctx;
  Tensor x = random_tensor({4, 3}, 11), y = Tensor::empty({4, 3});
  ops::normalize_input(ctx, x, {1.0f, 2.0f, 3.0f}, {2.0f, 4.0f, 8.0f}, y);
  auto xv = to_double(x);
  std::vector<double> want(xv.size());
  for (std::size_t i = 0; i < xv.size(); ++i) {
    const double m[] = {1, 2, 3}, s[] = {2, 4, 8};
    want[i] = (xv[i] - m[i % 3]) / s[i % 3];
  }
  EXPECT_TRUE(all_close(y, want, 1e-6, 1e-7));
  EXPECT_THROW(ops::normalize_input(ctx, x, {0.5f, 0.5f}, {}, y), Error);
}
