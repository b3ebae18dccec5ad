// Optimizers against hand-computed values and PyTorch's documented update rules (in double),
// schedules against their formulas, global-norm clipping, and optimizer state restore.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "lockstep/nn/module.hpp"
#include "lockstep/ops/ops.hpp"
#include "lockstep/optim/adamw.hpp"
#include "lockstep/optim/clip.hpp"
#include "lockstep/optim/schedule.hpp"
#include "lockstep/optim/sgd.hpp"

using namespace lockstep;
using namespace lockstep::optim;

namespace {

nn::Parameter param(const std::string& name, std::vector<float> value) {
  Shape shape{static_cast<std::int64_t>(value.size())};
  return nn::Parameter{name, Tensor::from_vector(value, shape), Tensor::zeros(shape)};
}

// Gradient of step t for element i: varied in sign and size so that momentum matters.
float grad_at(int t, std::size_t i) {
  return std::vector<float>{0.5f, -0.3f, 1.2f, 0.1f}[(t + i) % 4] * (i + 1);
}

// torch.optim.SGD's documented algorithm, in double.
std::vector<double> sgd_reference(std::vector<double> p, int steps, double lr, double momentum,
                                  double dampening, double wd, bool nesterov) {
  std::vector<double> buf(p.size(), 0.0);
  for (int t = 0; t < steps; ++t) {
    for (std::size_t i = 0; i < p.size(); ++i) {
      double g = grad_at(t, i) + wd * p[i];
      if (momentum != 0.0) {
        buf[i] = t == 0 ? g : momentum * buf[i] + (1 - dampening) * g;
        g = nesterov ? g + momentum * buf[i] : buf[i];
      }
      p[i] -= lr * g;
    }
  }
  return p;
}

// torch.optim.AdamW's documented algorithm, in double.
std::vector<double> adamw_reference(std::vector<double> p, int steps, double lr, double b1,
                                    double b2, double eps, double wd) {
  std::vector<double> m(p.size(), 0.0), v(p.size(), 0.0);
  for (int t = 1; t <= steps; ++t) {
    for (std::size_t i = 0; i < p.size(); ++i) {
      double g = grad_at(t - 1, i);
      p[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      double mhat = m[i] / (1 - std::pow(b1, t)), vhat = v[i] / (1 - std::pow(b2, t));
      p[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
  }
  return p;
}

void run_steps(ops::Context& ctx, Optimizer& opt, nn::Parameter& p, int from, int to) {
  for (int t = from; t < to; ++t) {
    std::vector<float> g(static_cast<std::size_t>(p.value.numel()));
    for (std::size_t i = 0; i < g.size(); ++i)
      g[i] = grad_at(t, i);
    p.grad.copy_from(g);
    opt.step(ctx);
  }
}

void expect_close(const Tensor& actual, const std::vector<double>& expected) {
  auto a = actual.to_vector<float>();
  ASSERT_EQ(a.size(), expected.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], expected[i], 1e-6 * (1 + std::abs(expected[i]))) << "element " << i;
  }
}

}  // namespace

TEST(Sgd, MomentumStepsMatchHandComputedValues) {
  // p = 1, g = 0.5 twice, lr 0.1, momentum 0.9:
  //   step 1: buf = g = 0.5, p = 1 - 0.05 = 0.95
  //   step 2: buf = 0.9 * 0.5 + 0.5 = 0.95, p = 0.95 - 0.095 = 0.855
  ops::Context ctx;
  nn::Parameter p = param("w", {1.0f});
  Sgd sgd({&p}, {.lr = 0.1f, .momentum = 0.9f});
  p.grad.copy_from(std::vector<float>{0.5f});
  sgd.step(ctx);
  EXPECT_FLOAT_EQ(p.value.item(), 0.95f);
  sgd.step(ctx);
  EXPECT_FLOAT_EQ(p.value.item(), 0.855f);
  EXPECT_EQ(sgd.steps(), 2);
}

TEST(Sgd, FollowsPyTorchsRuleWithWeightDecayDampeningAndNesterov) {
  ops::Context ctx;
  struct Case {
    float momentum, dampening, wd;
    bool nesterov;
  };
  for (const Case& c : std::vector<Case>{{0.0f, 0.0f, 0.0f, false},
                                         {0.9f, 0.0f, 0.0f, false},
                                         {0.9f, 0.1f, 0.01f, false},
                                         {0.9f, 0.0f, 0.05f, true}}) {
    SCOPED_TRACE(str("momentum ", c.momentum, " dampening ", c.dampening, " wd ", c.wd,
                     " nesterov ", c.nesterov));
    nn::Parameter p = param("w", {1.0f, -2.0f, 0.5f});
    Sgd sgd({&p}, {.lr = 0.05f,
                   .momentum = c.momentum,
                   .dampening = c.dampening,
                   .weight_decay = c.wd,
                   .nesterov = c.nesterov});
    run_steps(ctx, sgd, p, 0, 5);
    expect_close(p.value, sgd_reference({1.0, -2.0, 0.5}, 5, 0.05, c.momentum, c.dampening, c.wd,
                                        c.nesterov));
  }
}

TEST(Sgd, NesterovWithoutMomentumIsAnError) {
  nn::Parameter p = param("w", {1.0f});
  EXPECT_THROW(Sgd({&p}, {.lr = 0.1f, .nesterov = true}), Error);
}

TEST(AdamW, FirstStepMatchesHandComputedValue) {
  // p = 1, g = 0.5, lr 0.1, wd 0.01: decay to 0.999; m = 0.05, v = 0.00025; bias-corrected
  // mhat = 0.5, vhat = 0.25, so the step is 0.1 * 0.5 / (0.5 + 1e-8): p = 0.899.
  ops::Context ctx;
  nn::Parameter p = param("w", {1.0f});
  AdamW adam({&p}, {.lr = 0.1f, .weight_decay = 0.01f});
  p.grad.copy_from(std::vector<float>{0.5f});
  adam.step(ctx);
  EXPECT_NEAR(p.value.item(), 0.899f, 1e-6);
}

TEST(AdamW, FollowsPyTorchsRuleOverSeveralSteps) {
  ops::Context ctx;
  nn::Parameter p = param("w", {1.0f, -2.0f, 0.5f, 3.0f});
  AdamW adam({&p},
             {.lr = 0.01f, .beta1 = 0.8f, .beta2 = 0.99f, .eps = 1e-6f, .weight_decay = 0.1f});
  run_steps(ctx, adam, p, 0, 6);
  expect_close(p.value, adamw_reference({1.0, -2.0, 0.5, 3.0}, 6, 0.01, 0.8, 0.99, 1e-6, 0.1));
}

TEST(OptimizerState, IsNamedAfterTheParametersAndRestoresARun) {
  // Run 3 steps; then restore a fresh optimizer from state() after step 2 and redo step 3.
  ops::Context ctx;
  for (std::string kind : {"sgd", "adamw"}) {
    SCOPED_TRACE(kind);
    auto make = [&](nn::Parameter& p) -> std::unique_ptr<Optimizer> {
      if (kind == "sgd")
        return std::make_unique<Sgd>(std::vector{&p}, SgdOptions{.lr = 0.1f, .momentum = 0.9f});
      return std::make_unique<AdamW>(std::vector{&p}, AdamWOptions{.lr = 0.1f});
    };
    nn::Parameter p = param("3.weight", {1.0f, 2.0f});
    auto opt = make(p);
    run_steps(ctx, *opt, p, 0, 2);
    std::vector<std::string> names;
    for (auto& s : opt->state())
      names.push_back(s.name);
    std::vector<std::string> expected{"3.weight.momentum_buffer"};
    if (kind == "adamw") expected = {"3.weight.exp_avg", "3.weight.exp_avg_sq"};
    EXPECT_EQ(names, expected);
    nn::Parameter q = param("3.weight", {0.0f, 0.0f});
    q.value.copy_from(p.value.to_vector<float>());
    auto restored = make(q);
    auto from = opt->state();
    auto to = restored->state();
    for (std::size_t i = 0; i < from.size(); ++i)
      ops::copy(ctx, from[i].value, to[i].value);
    restored->set_steps(opt->steps());
    run_steps(ctx, *opt, p, 2, 3);
    run_steps(ctx, *restored, q, 2, 3);
    EXPECT_EQ(q.value.to_vector<float>(), p.value.to_vector<float>());
  }
}

TEST(Schedules, ConstantWithWarmupRampsLinearly) {
  auto s = make_schedule({.kind = "constant", .base_lr = 0.1, .warmup_steps = 5});
  EXPECT_DOUBLE_EQ(s->lr_at(0), 0.02);
  EXPECT_DOUBLE_EQ(s->lr_at(2), 0.06);
  EXPECT_DOUBLE_EQ(s->lr_at(4), 0.1);
  EXPECT_DOUBLE_EQ(s->lr_at(5), 0.1);
  EXPECT_DOUBLE_EQ(s->lr_at(100000), 0.1);
}

TEST(Schedules, StepDecaysByGammaEveryStepSizeAfterWarmup) {
  auto s = make_schedule(
      {.kind = "step", .base_lr = 0.1, .warmup_steps = 2, .step_size = 10, .gamma = 0.5});
  EXPECT_DOUBLE_EQ(s->lr_at(1), 0.1);
  EXPECT_DOUBLE_EQ(s->lr_at(2), 0.1);
  EXPECT_DOUBLE_EQ(s->lr_at(11), 0.1);
  EXPECT_DOUBLE_EQ(s->lr_at(12), 0.05);
  EXPECT_DOUBLE_EQ(s->lr_at(31), 0.025);
  EXPECT_DOUBLE_EQ(s->lr_at(32), 0.0125);
  auto plain = make_schedule({.kind = "step", .base_lr = 1.0, .step_size = 3, .gamma = 0.1});
  EXPECT_DOUBLE_EQ(plain->lr_at(0), 1.0);
  EXPECT_NEAR(plain->lr_at(7), 0.01, 1e-15);
}

TEST(Schedules, CosineFallsFromBaseToMinOverTheRun) {
  auto s = make_schedule(
      {.kind = "cosine", .base_lr = 0.1, .warmup_steps = 5, .total_steps = 105, .min_lr = 0.001});
  EXPECT_DOUBLE_EQ(s->lr_at(0), 0.02);
  EXPECT_DOUBLE_EQ(s->lr_at(5), 0.1);
  EXPECT_NEAR(s->lr_at(55), 0.0505, 1e-12);  // half-way: the mean of base and min
  EXPECT_NEAR(s->lr_at(30), 0.001 + 0.099 * (1 + std::cos(std::numbers::pi / 4)) / 2, 1e-12);
  EXPECT_DOUBLE_EQ(s->lr_at(105), 0.001);
  EXPECT_DOUBLE_EQ(s->lr_at(500), 0.001);
}

TEST(Schedules, BadOptionsAreErrorsNamingTheField) {
  try {
    make_schedule({.kind = "cosine", .base_lr = 0.1, .warmup_steps = 10, .total_steps = 10});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("total_steps"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_schedule({.kind = "step", .base_lr = 0.1}), Error);
  EXPECT_THROW(make_schedule({.kind = "linear"}), Error);
}

TEST(ClipGradNorm, ScalesAllGradientsToTheMaxNormAndReturnsTheNormBefore) {
  ops::Context ctx;
  nn::Parameter a = param("a", {0.0f, 0.0f}), b = param("b", {0.0f});
  a.grad.copy_from(std::vector<float>{3.0f, 4.0f});
  b.grad.copy_from(std::vector<float>{12.0f});  // global norm sqrt(9 + 16 + 144) = 13
  EXPECT_NEAR(clip_grad_norm(ctx, {&a, &b}, 100.0), 13.0, 1e-9);
  EXPECT_EQ(a.grad.to_vector<float>(), (std::vector<float>{3.0f, 4.0f})) << "under the limit";
  EXPECT_NEAR(clip_grad_norm(ctx, {&a, &b}, 6.5), 13.0, 1e-9);
  double coef = 6.5 / (13.0 + 1e-6);
  auto ga = a.grad.to_vector<float>();
  EXPECT_NEAR(ga[0], 3.0 * coef, 1e-6);
  EXPECT_NEAR(ga[1], 4.0 * coef, 1e-6);
  EXPECT_NEAR(b.grad.item(), 12.0 * coef, 1e-6);
  EXPECT_NEAR(clip_grad_norm(ctx, {&a, &b}, 100.0), 6.5, 1e-5);
}
