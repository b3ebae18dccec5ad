// SGD and AdamW update kernels against values worked out by hand (PyTorch's formulas), and a
// long-tensor check against a double loop so the parallel path is covered too.
#include <gtest/gtest.h>

#include <cmath>

#include "lockstep/core/error.hpp"
#include "lockstep/ops/ops.hpp"
#include "ops_test_util.hpp"

using namespace lockstep;
using lockstep::testing::all_close;
using lockstep::testing::random_tensor;
using lockstep::testing::to_double;

namespace {
Tensor scalar(float v) {
  return Tensor::from_vector<float>({v}, {1});
}
}  // namespace

TEST(SgdUpdate, PlainStepWithWeightDecay) {
  ops::Context ctx;
  Tensor p = scalar(1.0f), g = scalar(0.5f), none;
  ops::SgdParams sp;
  sp.lr = 0.1f;
  sp.weight_decay = 0.1f;
  ops::sgd_update(ctx, p, g, none, sp);
  EXPECT_NEAR(p.item(), 0.94f, 1e-7);  // 1 - 0.1 * (0.5 + 0.1 * 1)
}

TEST(SgdUpdate, MomentumWithDampeningInitialisesTheBufferToTheGradient) {
  ops::Context ctx;
  Tensor p = scalar(1.0f), g = scalar(0.5f),
         buf = scalar(123.0f);  // garbage: first step overwrites
  ops::SgdParams sp;
  sp.lr = 0.1f;
  sp.weight_decay = 0.1f;
  sp.momentum = 0.9f;
  sp.dampening = 0.5f;
  sp.first_step = true;
  ops::sgd_update(ctx, p, g, buf, sp);
  EXPECT_NEAR(buf.item(), 0.6f, 1e-7);  // g + wd * p, no dampening on the first step
  EXPECT_NEAR(p.item(), 0.94f, 1e-7);
  sp.first_step = false;
  ops::sgd_update(ctx, p, g, buf, sp);
  EXPECT_NEAR(buf.item(), 0.837f, 1e-6);  // 0.9 * 0.6 + 0.5 * (0.5 + 0.1 * 0.94)
  EXPECT_NEAR(p.item(), 0.8563f, 1e-6);   // 0.94 - 0.1 * 0.837
}

TEST(SgdUpdate, NesterovLooksAhead) {
  ops::Context ctx;
  Tensor p = scalar(1.0f), g = scalar(0.5f), buf = scalar(0.0f);
  ops::SgdParams sp;
  sp.lr = 0.1f;
  sp.momentum = 0.9f;
  sp.nesterov = true;
  sp.first_step = true;
  ops::sgd_update(ctx, p, g, buf, sp);
  EXPECT_NEAR(p.item(), 0.905f, 1e-7);  // 1 - 0.1 * (0.5 + 0.9 * 0.5)
  sp.first_step = false;
  ops::sgd_update(ctx, p, g, buf, sp);
  EXPECT_NEAR(buf.item(), 0.95f, 1e-6);  // 0.9 * 0.5 + 0.5
  EXPECT_NEAR(p.item(), 0.7695f, 1e-6);  // 0.905 - 0.1 * (0.5 + 0.9 * 0.95)
  sp.dampening = 0.1f;
  EXPECT_THROW(ops::sgd_update(ctx, p, g, buf, sp), Error);  // PyTorch refuses this too
}

TEST(SgdUpdate, MomentumWithoutABufferIsAnError) {
  ops::Context ctx;
  Tensor p = scalar(1.0f), g = scalar(0.5f), none;
  ops::SgdParams sp;
  sp.momentum = 0.9f;
  EXPECT_THROW(ops::sgd_update(ctx, p, g, none, sp), Error);
}

TEST(AdamWUpdate, TwoStepsMatchHandComputedValues) {
  ops::Context ctx;
  Tensor p = scalar(1.0f), g = scalar(0.5f), m = scalar(0.0f), v = scalar(0.0f);
  ops::AdamWParams ap;
  ap.lr = 0.1f;
  ap.weight_decay = 0.1f;
  ap.step = 1;
  ops::adamw_update(ctx, p, g, m, v, ap);
  // p = 1 * (1 - 0.01) - 0.1 * (0.05 / 0.1) / (sqrt(0.00025 / 0.001) + 1e-8)
  // (Betas are floats: 1 - 0.999f is 0.00099998713, hence tolerances of ~1e-5 relative.)
  EXPECT_NEAR(m.item(), 0.05f, 1e-7);
  EXPECT_NEAR(v.item(), 0.00025f, 1e-8);
  EXPECT_NEAR(p.item(), 0.89f, 1e-6);
  g.data<float>()[0] = -0.25f;
  ap.step = 2;
  ops::adamw_update(ctx, p, g, m, v, ap);
  EXPECT_NEAR(m.item(), 0.02f, 1e-7);        // 0.9 * 0.05 + 0.1 * -0.25
  EXPECT_NEAR(v.item(), 0.00031225f, 1e-8);  // 0.999 * 0.00025 + 0.001 * 0.0625
  EXPECT_NEAR(p.item(), 0.8544663f, 1e-6);   // 0.8811 - 0.1 * (0.02/0.19) / sqrt(v/0.001999)
}

TEST(OptimizerKernels, LongTensorsMatchDoubleLoopsOnTwoThreads) {
  ops::Context ctx(Device::cpu(), 2);
  const Shape shape{1000, 301};
  Tensor p = random_tensor(shape, 1), g = random_tensor(shape, 2), buf = random_tensor(shape, 3);
  auto pv = to_double(p), gv = to_double(g), bv = to_double(buf);
  ops::SgdParams sp;
  sp.lr = 0.05f;
  sp.momentum = 0.9f;
  sp.dampening = 0.1f;
  sp.weight_decay = 1e-3f;
  ops::sgd_update(ctx, p, g, buf, sp);
  for (std::size_t i = 0; i < pv.size(); ++i) {
    double gg = gv[i] + 1e-3 * pv[i];
    bv[i] = 0.9 * bv[i] + 0.9 * gg;
    pv[i] -= 0.05 * bv[i];
  }
  EXPECT_TRUE(all_close(buf, bv, 1e-5, 1e-6));
  EXPECT_TRUE(all_close(p, pv, 1e-5, 1e-6));

  Tensor m = random_tensor(shape, 4, -0.1f, 0.1f), v = random_tensor(shape, 5, 0.0f, 0.01f);
  auto mv = to_double(m), vv = to_double(v);
  ops::AdamWParams ap;
  ap.step = 7;
  ops::adamw_update(ctx, p, g, m, v, ap);
  const double b1 = 0.9f, b2 = 0.999f;  // the float hyper-parameters, exactly
  for (std::size_t i = 0; i < pv.size(); ++i) {
    pv[i] *= 1.0 - 1e-3 * 1e-2;
    mv[i] = b1 * mv[i] + (1 - b1) * gv[i];
    vv[i] = b2 * vv[i] + (1 - b2) * gv[i] * gv[i];
    const double mhat = mv[i] / (1 - std::pow(b1, 7)), vhat = vv[i] / (1 - std::pow(b2, 7));
    pv[i] -= 1e-3 * mhat / (std::sqrt(vhat) + 1e-8);
  }
  EXPECT_TRUE(all_close(m, mv, 1e-5, 1e-7));
  EXPECT_TRUE(all_close(v, vv, 1e-5, 1e-9));
  EXPECT_TRUE(all_close(p, pv, 1e-5, 1e-6));
}

TEST(OptimizerKernels, UpdatesAreBitwiseIndependentOfThreadCount) {
  // Thread ranges move the boundary between the vectorised body and the scalar tail; both must
  // give the same bits for every element.
  const Shape shape{100003};
  std::vector<Tensor> params;
  for (int threads : {1, 2}) {
    ops::Context ctx(Device::cpu(), threads);
    Tensor p = random_tensor(shape, 1), g = random_tensor(shape, 2);
    Tensor m = random_tensor(shape, 3), v = random_tensor(shape, 4, 0.0f, 1.0f);
    Tensor buf = random_tensor(shape, 5);
    ops::AdamWParams ap;
    ap.step = 3;
    ops::adamw_update(ctx, p, g, m, v, ap);
    ops::SgdParams sp;
    sp.momentum = 0.9f;
    sp.nesterov = true;
    sp.weight_decay = 1e-4f;
    ops::sgd_update(ctx, p, g, buf, sp);
    params.push_back(p);
  }
  EXPECT_TRUE(lockstep::testing::bitwise_equal(params[0], params[1]));
}
