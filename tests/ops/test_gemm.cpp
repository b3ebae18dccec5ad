// GEMM, bias and row sums against double-precision loops.
#include <gtest/gtest.h>

#include "lockstep/core/error.hpp"
#include "lockstep/ops/ops.hpp"
#include "ops_test_util.hpp"

using namespace lockstep;
using lockstep::testing::all_close;
using lockstep::testing::bitwise_equal;
using lockstep::testing::random_tensor;

namespace {

// c = alpha * op(a) op(b) + beta * c in double.
std::vector<double> gemm_reference(bool ta, bool tb, double alpha, const Tensor& a, const Tensor& b,
                                   double beta, const Tensor& c) {
  const std::int64_t m = c.dim(0), n = c.dim(1), k = ta ? a.dim(0) : a.dim(1);
  auto av = lockstep::testing::to_double(a), bv = lockstep::testing::to_double(b);
  auto cv = lockstep::testing::to_double(c);
  std::vector<double> out(static_cast<std::size_t>(m * n));
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (std::int64_t p = 0; p < k; ++p) {
        double x = ta ? av[p * m + i] : av[i * k + p];
        double y = tb ? bv[j * k + p] : bv[p * n + j];
        s += x * y;
      }
      out[i * n + j] = alpha * s + beta * cv[i * n + j];
    }
  }
  return out;
}

struct GemmShape {
  std::int64_t m, n, k;
};

}  // namespace

TEST(Gemm, MatchesDoubleReferenceForAllTransposesShapesAndThreadCounts) {
  // The last two are above the size at which the CPU backend splits C by rows / by columns.
  const GemmShape shapes[] = {{1, 1, 1},      {7, 5, 3},       {33, 17, 65},  {1, 300, 40},
                              {130, 97, 129}, {203, 150, 101}, {40, 333, 201}};
  for (int threads : {1, 2}) {
    ops::Context ctx(Device::cpu(), threads);
    std::uint64_t stream = 0;
    for (const auto& s : shapes) {
      for (int t = 0; t < 4; ++t) {
        const bool ta = t & 1, tb = t & 2;
        Tensor a = random_tensor(ta ? Shape{s.k, s.m} : Shape{s.m, s.k}, ++stream);
        Tensor b = random_tensor(tb ? Shape{s.n, s.k} : Shape{s.k, s.n}, ++stream);
        for (float beta : {0.0f, 0.75f}) {
          Tensor c = random_tensor({s.m, s.n}, ++stream);
          auto want = gemm_reference(ta, tb, 1.5, a, b, beta, c);
          ops::gemm(ctx, ta, tb, 1.5f, a, b, beta, c);
          EXPECT_TRUE(all_close(c, want, 1e-4, 1e-4))
              << "m=" << s.m << " n=" << s.n << " k=" << s.k << " ta=" << ta << " tb=" << tb
              << " beta=" << beta << " threads=" << threads;
        }
      }
    }
  }
}

TEST(Gemm, MismatchedShapesAreErrorsNamingTheOpAndTensors) {
  ops::Context ctx;
  Tensor a = Tensor::zeros({4, 3}), b = Tensor::zeros({4, 5}), c = Tensor::zeros({4, 5});
  try {
    ops::gemm(ctx, false, false, 1.0f, a, b, 0.0f, c);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gemm"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("f32[4, 3]"), std::string::npos) << e.what();
  }
  Tensor i = Tensor::zeros({4, 5}, DType::I32);
  EXPECT_THROW(ops::gemm(ctx, true, false, 1.0f, a, b, 0.0f, i), Error);
  EXPECT_THROW(ops::gemm(ctx, true, false, 1.0f, a, b, 0.0f, b), Error);  // c aliases b
}

TEST(RowBias, AddRowBiasAddsToEveryRow) {
  ops::Context ctx(Device::cpu(), 2);
  for (auto shape : {Shape{1, 10}, Shape{37, 13}, Shape{300, 1024}}) {
    Tensor y = random_tensor(shape, 3), bias = random_tensor({shape[1]}, 4);
    auto yv = lockstep::testing::to_double(y), bv = lockstep::testing::to_double(bias);
    for (std::size_t i = 0; i < yv.size(); ++i)
      yv[i] += bv[i % bv.size()];
    ops::add_row_bias(ctx, y, bias);
    EXPECT_TRUE(all_close(y, yv, 1e-6, 1e-6)) << shape_str(shape);
  }
}

TEST(RowBias, SumRowsAccumulatesIntoTheGradient) {
  for (int threads : {1, 2}) {
    ops::Context ctx(Device::cpu(), threads);
    for (auto shape : {Shape{1, 7}, Shape{37, 300}, Shape{256, 1024}}) {
      Tensor dy = random_tensor(shape, 5), db = random_tensor({shape[1]}, 6);
      auto want = lockstep::testing::to_double(db);
      auto dyv = lockstep::testing::to_double(dy);
      for (std::size_t i = 0; i < dyv.size(); ++i)
        want[i % want.size()] += dyv[i];
      ops::sum_rows(ctx, dy, db);
      EXPECT_TRUE(all_close(db, want, 1e-5, 1e-5)) << shape_str(shape) << " threads " << threads;
    }
  }
}

TEST(RowBias, SumRowsIsBitwiseIndependentOfThreadCount) {
  Tensor dy = random_tensor({512, 1024}, 7);
  Tensor db1 = Tensor::zeros({1024}), db2 = Tensor::zeros({1024});
  ops::Context one(Device::cpu(), 1), two(Device::cpu(), 2);
  ops::sum_rows(one, dy, db1);
  ops::sum_rows(two, dy, db2);
  EXPECT_TRUE(bitwise_equal(db1, db2));
}
