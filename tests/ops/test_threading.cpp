// Two Contexts used from two std::threads at once (the DataParallel baseline's pattern) must not
// interfere: each gives bitwise the result it gives when run alone. And one Context gives bitwise
// identical results run after run.
#include <gtest/gtest.h>

#include <thread>

#include "lockstep/ops/ops.hpp"
#include "ops_test_util.hpp"

using namespace lockstep;
using lockstep::testing::bitwise_equal;
using lockstep::testing::random_tensor;

namespace {

// A conv -> batchnorm -> relu -> maxpool forward and backward plus an MLP layer's three GEMMs,
// repeated; returns the outputs (weight gradients accumulate across the repeats).
std::vector<Tensor> run_sequence(ops::Context& ctx, std::uint64_t seed, int repeats) {
  const Shape act{8, 16, 12, 12};
  Tensor x = random_tensor({8, 8, 12, 12}, seed + 1);
  Tensor w = random_tensor({16, 8, 3, 3}, seed + 2), b = random_tensor({16}, seed + 3);
  Tensor gamma = random_tensor({16}, seed + 4, 0.5f, 1.5f), beta = random_tensor({16}, seed + 5);
  Tensor a = random_tensor({96, 200}, seed + 6), wl = random_tensor({130, 200}, seed + 7);
  Tensor rm = Tensor::zeros({16}), rv = Tensor::zeros({16});
  Tensor dw = Tensor::zeros({16, 8, 3, 3}), db = Tensor::zeros({16});
  Tensor dgamma = Tensor::zeros({16}), dbeta = Tensor::zeros({16});
  Tensor h = Tensor::empty({96, 130}), dwl = Tensor::zeros({130, 200}),
         da = Tensor::empty({96, 200});
  Tensor y = Tensor::empty(act), z = Tensor::empty(act), r = Tensor::empty(act);
  Tensor pooled = Tensor::empty({8, 16, 6, 6}), ws, dr = Tensor::empty(act),
         dz = Tensor::empty(act);
  Tensor dx = Tensor::empty({8, 8, 12, 12});
  Tensor mean = Tensor::empty({16}), invstd = Tensor::empty({16});
  const ops::Conv2dParams cp{1, 1, 1, 1};
  const ops::Pool2dParams pp{};
  for (int i = 0; i < repeats; ++i) {
    ops::conv2d_forward(ctx, x, w, b, y, cp);
    ops::batchnorm_forward_train(ctx, y, gamma, beta, z, mean, invstd, rm, rv, 0.1f, 1e-5f);
    ops::relu_forward(ctx, z, r);
    ops::pool2d_forward(ctx, ops::PoolKind::Max, r, pooled, ws, pp);
    ops::pool2d_backward(ctx, ops::PoolKind::Max, pooled, ws, dr, pp);
    ops::relu_backward(ctx, r, dr, dz);
    ops::batchnorm_backward(ctx, y, dz, gamma, mean, invstd, dr, dgamma, dbeta);
    ops::conv2d_backward_data(ctx, dr, w, dx, cp);
    ops::conv2d_backward_weights(ctx, x, dr, dw, db, cp);
    ops::gemm(ctx, false, true, 1.0f, a, wl, 0.0f, h);
    ops::gemm(ctx, true, false, 1.0f, h, a, 1.0f, dwl);
    ops::gemm(ctx, false, false, 1.0f, h, wl, 0.0f, da);
  }
  return {pooled, dx, dw, db, dgamma, rv, h, dwl, da};
}

}  // namespace

TEST(Threading, TwoContextsInTwoThreadsMatchSequentialRunsBitwise) {
  for (int threads : {1, 2}) {
    ops::Context c1(Device::cpu(), threads), c2(Device::cpu(), threads);
    auto seq1 = run_sequence(c1, 1000, 3);
    auto seq2 = run_sequence(c2, 2000, 3);
    ops::Context p1(Device::cpu(), threads), p2(Device::cpu(), threads);
    std::vector<Tensor> par1, par2;
    std::thread t1([&] { par1 = run_sequence(p1, 1000, 3); });
    std::thread t2([&] { par2 = run_sequence(p2, 2000, 3); });
    t1.join();
    t2.join();
    ASSERT_EQ(par1.size(), seq1.size());
    ASSERT_EQ(par2.size(), seq2.size());
    for (std::size_t i = 0; i < seq1.size(); ++i) {
      EXPECT_TRUE(bitwise_equal(seq1[i], par1[i])) << "output " << i << ", threads " << threads;
      EXPECT_TRUE(bitwise_equal(seq2[i], par2[i])) << "output " << i << ", threads " << threads;
    }
  }
}

TEST(Threading, SameInputsAndThreadCountGiveBitwiseIdenticalResults) {
  ops::Context a(Device::cpu(), 2), b(Device::cpu(), 2);
  auto r1 = run_sequence(a, 7, 2);
  auto r2 = run_sequence(a, 7, 2);  // same context again: cached primitives
  auto r3 = run_sequence(b, 7, 2);  // fresh context
  for (std::size_t i = 0; i < r1.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(r1[i], r2[i])) << "output " << i;
    EXPECT_TRUE(bitwise_equal(r1[i], r3[i])) << "output " << i;
  }
}
