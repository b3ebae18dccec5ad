// Batch normalisation, softmax cross-entropy, accuracy and global reductions against double
// references.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "lockstep/core/error.hpp"
#include "lockstep/ops/ops.hpp"
#include "ops_test_util.hpp"

using namespace lockstep;
using lockstep::testing::all_close;
using lockstep::testing::bitwise_equal;
using lockstep::testing::random_tensor;
using lockstep::testing::to_double;

namespace {

// x viewed as [N, C, S]; element (n, c, s) at (n * C + c) * S + s.
struct BnRef {
  std::vector<double> y, mean, invstd, run_mean, run_var, dx, dgamma, dbeta;
};

BnRef batchnorm_reference(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                          const Tensor& dy, const Tensor& rm, const Tensor& rv, double momentum,
                          double eps) {
  const std::int64_t n = x.dim(0), c = x.dim(1), s = x.numel() / (n * c);
  auto xv = to_double(x), g = to_double(gamma), b = to_double(beta), dyv = to_double(dy);
  BnRef r;
  r.y.resize(xv.size());
  r.dx.resize(xv.size());
  r.run_mean = to_double(rm);
  r.run_var = to_double(rv);
  auto idx = [&](std::int64_t i, std::int64_t ch, std::int64_t k) { return (i * c + ch) * s + k; };
  const double cnt = static_cast<double>(n * s);
  for (std::int64_t ch = 0; ch < c; ++ch) {
    double mean = 0, var = 0;
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t k = 0; k < s; ++k)
        mean += xv[idx(i, ch, k)];
    mean /= cnt;
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t k = 0; k < s; ++k)
        var += (xv[idx(i, ch, k)] - mean) * (xv[idx(i, ch, k)] - mean);
    var /= cnt;  // biased, for normalising
    const double invstd = 1.0 / std::sqrt(var + eps);
    r.mean.push_back(mean);
    r.invstd.push_back(invstd);
    r.run_mean[ch] = (1 - momentum) * r.run_mean[ch] + momentum * mean;
    r.run_var[ch] = (1 - momentum) * r.run_var[ch] + momentum * var * cnt / (cnt - 1);  // unbiased
    double sdy = 0, sdyxhat = 0;
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t k = 0; k < s; ++k) {
        const double xhat = (xv[idx(i, ch, k)] - mean) * invstd;
        r.y[idx(i, ch, k)] = g[ch] * xhat + b[ch];
        sdy += dyv[idx(i, ch, k)];
        sdyxhat += dyv[idx(i, ch, k)] * xhat;
      }
    r.dbeta.push_back(sdy);
    r.dgamma.push_back(sdyxhat);
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t k = 0; k < s; ++k) {
        const double xhat = (xv[idx(i, ch, k)] - mean) * invstd;
        r.dx[idx(i, ch, k)] =
            g[ch] * invstd / cnt * (cnt * dyv[idx(i, ch, k)] - sdy - xhat * sdyxhat);
      }
  }
  return r;
}

}  // namespace

TEST(BatchNorm, TrainEvalAndBackwardMatchDoubleReference) {
  // [N, C] with more rows than one chunk of the row sums (kBnRows = 1024: a channels-last batch
  // reaches batchnorm as [N*H*W, C]), with a partial last chunk and column block.
  const Shape shapes[] = {{2, 3},       {7, 130},     {256, 64},      {2500, 70},
                          {1, 3, 5, 5}, {4, 5, 7, 3}, {16, 8, 14, 14}};
  for (int threads : {1, 2}) {
    ops::Context ctx(Device::cpu(), threads);
    std::uint64_t st = 300;
    for (const auto& shape : shapes) {
      const std::int64_t c = shape[1];
      Tensor x = random_tensor(shape, ++st, -2.0f, 3.0f), dy = random_tensor(shape, ++st);
      Tensor gamma = random_tensor({c}, ++st, 0.5f, 1.5f), beta = random_tensor({c}, ++st);
      Tensor rm = random_tensor({c}, ++st), rv = random_tensor({c}, ++st, 0.5f, 2.0f);
      const float momentum = 0.1f, eps = 1e-5f;
      BnRef ref = batchnorm_reference(x, gamma, beta, dy, rm, rv, momentum, eps);
      const std::string what = shape_str(shape) + " threads " + std::to_string(threads);

      Tensor y = Tensor::empty(shape), mean = Tensor::empty({c}), invstd = Tensor::empty({c});
      ops::batchnorm_forward_train(ctx, x, gamma, beta, y, mean, invstd, rm, rv, momentum, eps);
      EXPECT_TRUE(all_close(y, ref.y, 1e-4, 1e-4)) << what;
      EXPECT_TRUE(all_close(mean, ref.mean, 1e-5, 1e-6)) << what;
      EXPECT_TRUE(all_close(invstd, ref.invstd, 1e-5, 1e-6)) << what;
      EXPECT_TRUE(all_close(rm, ref.run_mean, 1e-5, 1e-6)) << what;
      EXPECT_TRUE(all_close(rv, ref.run_var, 1e-5, 1e-6)) << what;

      // Gradients of gamma and beta accumulate.
      Tensor dx = Tensor::empty(shape);
      Tensor dgamma = random_tensor({c}, ++st), dbeta = random_tensor({c}, ++st);
      auto dg0 = to_double(dgamma), db0 = to_double(dbeta);
      for (std::int64_t i = 0; i < c; ++i)
        ref.dgamma[i] += dg0[i], ref.dbeta[i] += db0[i];
      ops::batchnorm_backward(ctx, x, dy, gamma, mean, invstd, dx, dgamma, dbeta);
      EXPECT_TRUE(all_close(dx, ref.dx, 1e-3, 1e-4)) << what;
      EXPECT_TRUE(all_close(dgamma, ref.dgamma, 1e-4, 1e-4)) << what;
      EXPECT_TRUE(all_close(dbeta, ref.dbeta, 1e-4, 1e-4)) << what;

      // Eval uses the running statistics: y = gamma (x - rm) / sqrt(rv + eps) + beta.
      auto xv = to_double(x), g = to_double(gamma), b = to_double(beta);
      auto rmv = to_double(rm), rvv = to_double(rv);
      const std::int64_t s = x.numel() / (shape[0] * c);
      std::vector<double> want(xv.size());
      for (std::size_t i = 0; i < xv.size(); ++i) {
        const std::size_t ch = (i / s) % c;
        want[i] = g[ch] * (xv[i] - rmv[ch]) / std::sqrt(rvv[ch] + eps) + b[ch];
      }
      ops::batchnorm_forward_eval(ctx, x, gamma, beta, rm, rv, eps, y);
      EXPECT_TRUE(all_close(y, want, 1e-4, 1e-4)) << what;
    }
  }
}

TEST(BatchNorm, StatisticsAreBitwiseIndependentOfThreadCount) {
  for (const Shape& shape : {Shape{512, 256}, Shape{5000, 80}, Shape{32, 16, 14, 14}}) {
    Tensor x = random_tensor(shape, 1), dy = random_tensor(shape, 2);
    Tensor gamma = random_tensor({shape[1]}, 3), beta = random_tensor({shape[1]}, 4);
    std::vector<Tensor> out;
    for (int threads : {1, 2}) {
      ops::Context ctx(Device::cpu(), threads);
      Tensor y = Tensor::empty(shape), m = Tensor::empty({shape[1]}),
             is = Tensor::empty({shape[1]});
      Tensor rm = Tensor::zeros({shape[1]}), rv = Tensor::zeros({shape[1]});
      Tensor dx = Tensor::empty(shape), dg = Tensor::zeros({shape[1]}),
             db = Tensor::zeros({shape[1]});
      ops::batchnorm_forward_train(ctx, x, gamma, beta, y, m, is, rm, rv, 0.1f, 1e-5f);
      ops::batchnorm_backward(ctx, x, dy, gamma, m, is, dx, dg, db);
      out.insert(out.end(), {y, rv, dx, dg});
    }
    for (int i = 0; i < 4; ++i)
      EXPECT_TRUE(bitwise_equal(out[i], out[i + 4])) << i;
  }
}

TEST(BatchNorm, TrainingWithOneValuePerChannelIsAnError) {
  ops::Context ctx;
  Tensor x = Tensor::zeros({1, 4}), c4 = Tensor::zeros({4}), y = Tensor::zeros({1, 4});
  Tensor a = c4.clone(), b = c4.clone(), m = c4.clone(), s = c4.clone(), rm = c4.clone(),
         rv = c4.clone();
  EXPECT_THROW(ops::batchnorm_forward_train(ctx, x, a, b, y, m, s, rm, rv, 0.1f, 1e-5f), Error);
}

TEST(SoftmaxXent, ForwardAndBackwardMatchDoubleReference) {
  for (int threads : {1, 2}) {
    ops::Context ctx(Device::cpu(), threads);
    for (const Shape& shape :
         {Shape{1, 1}, Shape{1, 10}, Shape{7, 3}, Shape{300, 10}, Shape{65, 1000}}) {
      const std::int64_t n = shape[0], c = shape[1];
      Tensor logits = random_tensor(shape, 11, -8.0f, 8.0f);
      std::vector<std::int32_t> lab(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i)
        lab[i] = static_cast<std::int32_t>((i * 7 + 3) % c);
      Tensor labels = Tensor::from_vector(lab, {n});
      auto lv = to_double(logits);
      std::vector<double> probs(lv.size()), grad(lv.size());
      double loss = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        double mx = -1e300, sum = 0;
        for (std::int64_t j = 0; j < c; ++j)
          mx = std::max(mx, lv[i * c + j]);
        for (std::int64_t j = 0; j < c; ++j)
          sum += std::exp(lv[i * c + j] - mx);
        for (std::int64_t j = 0; j < c; ++j) {
          probs[i * c + j] = std::exp(lv[i * c + j] - mx) / sum;
          grad[i * c + j] = (probs[i * c + j] - (j == lab[i] ? 1.0 : 0.0)) * 0.25;
        }
        loss -= std::log(probs[i * c + lab[i]]);
      }
      loss /= n;
      Tensor p = Tensor::empty(shape), l = Tensor::empty({1}), d = Tensor::empty(shape);
      ops::softmax_xent_forward(ctx, logits, labels, p, l);
      EXPECT_TRUE(all_close(p, probs, 1e-5, 1e-7)) << shape_str(shape);
      EXPECT_NEAR(l.item(), loss, 1e-5 * std::max(1.0, loss)) << shape_str(shape);
      ops::softmax_xent_backward(ctx, p, labels, 0.25f, d);
      EXPECT_TRUE(all_close(d, grad, 1e-5, 1e-7)) << shape_str(shape);
    }
  }
}

TEST(SoftmaxXent, LossStaysFiniteWhenTheLabelsProbabilityUnderflows) {
  ops::Context ctx;
  Tensor logits = Tensor::from_vector<float>({200.0f, -200.0f}, {1, 2});
  Tensor labels = Tensor::from_vector<std::int32_t>({1}, {1});
  Tensor p = Tensor::empty({1, 2}), l = Tensor::empty({1});
  ops::softmax_xent_forward(ctx, logits, labels, p, l);
  EXPECT_NEAR(l.item(), 400.0f, 1e-3);
}

TEST(SoftmaxXent, LabelOutsideTheClassesIsAnErrorNamingLabelAndRow) {
  ops::Context ctx;
  Tensor logits = Tensor::zeros({5, 10}), p = Tensor::empty({5, 10}), l = Tensor::empty({1});
  for (std::int32_t bad : {10, -1}) {
    Tensor labels = Tensor::from_vector<std::int32_t>({0, 9, 4, bad, 2}, {5});
    auto expect_named = [&](auto&& call) {
      try {
        call();
        ADD_FAILURE() << "expected an error for label " << bad;
      } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("label " + std::to_string(bad)), std::string::npos) << msg;
        EXPECT_NE(msg.find("row 3"), std::string::npos) << msg;
      }
    };
    expect_named([&] { ops::softmax_xent_forward(ctx, logits, labels, p, l); });
    expect_named([&] { ops::softmax_xent_backward(ctx, p, labels, 1.0f, p); });
    expect_named([&] { ops::count_correct(ctx, logits, labels); });
  }
}

TEST(CountCorrect, CountsRowsWhoseArgmaxIsTheLabelFirstMaximumWinningTies) {
  ops::Context ctx;
  Tensor logits = Tensor::from_vector<float>({0.1f, 0.9f, 0.0f,      // argmax 1
                                              2.0f, -1.0f, 1.0f,     // argmax 0
                                              0.5f, 0.5f, 0.2f,      // tie: first (0) wins
                                              -3.0f, -2.0f, -1.0f},  // argmax 2
                                             {4, 3});
  Tensor labels = Tensor::from_vector<std::int32_t>({1, 2, 0, 2}, {4});
  EXPECT_EQ(ops::count_correct(ctx, logits, labels), 3);
  Tensor labels2 = Tensor::from_vector<std::int32_t>({1, 0, 1, 2}, {4});
  EXPECT_EQ(ops::count_correct(ctx, logits, labels2), 3);
}

TEST(Reductions, SumSquaresMatchesDoubleSumAndIsThreadCountIndependent) {
  ops::Context one(Device::cpu(), 1), two(Device::cpu(), 2);
  for (const Shape& shape : {Shape{1}, Shape{17}, Shape{1000, 333}}) {
    Tensor x = random_tensor(shape, 21, -3.0f, 3.0f);
    double want = 0;
    for (double v : to_double(x))
      want += v * v;
    const double a = ops::sum_squares(one, x), b = ops::sum_squares(two, x);
    EXPECT_NEAR(a, want, 1e-12 * std::max(1.0, want)) << shape_str(shape);
    EXPECT_EQ(a, b) << shape_str(shape);
  }
}

TEST(Reductions, AllFiniteDetectsNanAndInfAnywhere) {
  ops::Context ctx(Device::cpu(), 2);
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  for (const Shape& shape : {Shape{1}, Shape{13}, Shape{1000, 333}}) {
    Tensor x = random_tensor(shape, 22, -1e30f, 1e30f);  // large but finite
    EXPECT_TRUE(ops::all_finite(ctx, x)) << shape_str(shape);
    const std::int64_t n = x.numel();
    for (std::int64_t pos : {std::int64_t{0}, n / 2, n - 1}) {
      for (float v : bad) {
        Tensor y = x.clone();
        y.data<float>()[pos] = v;
        EXPECT_FALSE(ops::all_finite(ctx, y))
            << shape_str(shape) << " value " << v << " at " << pos;
      }
    }
  }
}
