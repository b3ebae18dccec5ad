// Whole training steps: a small MLP fits separable data, and replicas stepped concurrently on
// their own Contexts give bitwise what the same steps give run one after the other.
#include <gtest/gtest.h>

#include <thread>

#include "gradcheck.hpp"
#include "lockstep/nn/loss.hpp"
#include "lockstep/nn/model.hpp"
#include "lockstep/optim/sgd.hpp"

using namespace lockstep;
using namespace lockstep::nn;
using lockstep::testing::random_tensor;

namespace {

// n points in `dim` dimensions, label = the nearest of `classes` well-separated centres; each
// point is its centre plus noise smaller than half the distance between centres.
void separable_data(std::int64_t n, std::int64_t dim, std::int64_t classes, Tensor& x, Tensor& y) {
  Philox rng(77, 1);
  std::vector<float> centres(static_cast<std::size_t>(classes * dim));
  for (std::int64_t c = 0; c < classes; ++c) {
    for (std::int64_t d = 0; d < dim; ++d) {
      centres[static_cast<std::size_t>(c * dim + d)] = (d % classes == c) ? 2.0f : -0.5f;
    }
  }
  std::vector<float> xs(static_cast<std::size_t>(n * dim));
  std::vector<std::int32_t> ys(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    auto c = static_cast<std::int32_t>(rng.u32(static_cast<std::uint64_t>(i)) % classes);
    ys[static_cast<std::size_t>(i)] = c;
    for (std::int64_t d = 0; d < dim; ++d) {
      float noise = rng.uniform(static_cast<std::uint64_t>(1000 + i * dim + d)) - 0.5f;
      xs[static_cast<std::size_t>(i * dim + d)] =
          centres[static_cast<std::size_t>(c * dim + d)] + noise;
    }
  }
  x = Tensor::from_vector(xs, {n, dim});
  y = Tensor::from_vector(ys, {n});
}

void train_step(ops::Context& ctx, Model& model, optim::Sgd& sgd, SoftmaxCrossEntropy& loss,
                const Tensor& x, const Tensor& y) {
  model.zero_grad(ctx);
  loss.forward(ctx, model.forward(ctx, x), y);
  model.backward(ctx, loss.backward(ctx, 1.0f / static_cast<float>(x.dim(0))));
  sgd.step(ctx);
}

}  // namespace

TEST(Training, SmallMlpReachesFullTrainingAccuracyOnSeparableData) {
  ops::Context ctx;
  Tensor x, y;
  separable_data(96, 8, 4, x, y);
  Model model = Model::build("mlp:32", {8}, 4, 1);
  optim::Sgd sgd(model.parameters(), {.lr = 0.1f, .momentum = 0.9f});
  SoftmaxCrossEntropy loss;
  float first_loss = 0.0f;
  int steps = 0;
  std::int64_t correct = 0;
  for (; steps < 200 && correct < 96; ++steps) {
    model.zero_grad(ctx);
    Tensor logits = model.forward(ctx, x);
    float l = loss.forward(ctx, logits, y).item();
    if (steps == 0) first_loss = l;
    correct = ops::count_correct(ctx, logits, y);
    model.backward(ctx, loss.backward(ctx, 1.0f / 96));
    sgd.step(ctx);
  }
  EXPECT_EQ(correct, 96) << "after " << steps << " steps";
  model.set_training(false);
  EXPECT_EQ(ops::count_correct(ctx, model.forward(ctx, x), y), 96);
  EXPECT_LT(loss.forward(ctx, model.forward(ctx, x), y).item(), first_loss / 2);
}

TEST(Training, ReplicasSteppedInTwoThreadsMatchSequentialStepsBitwise) {
  const std::string spec = "conv(4,3,pad=1)-bn-relu-maxpool(2)-flatten-dropout(0.2)-linear(5)";
  const Shape sample{2, 6, 6};
  const int kSteps = 4;
  std::vector<Tensor> xs, ys;
  for (int s = 0; s < kSteps; ++s) {
    xs.push_back(random_tensor({8, 2, 6, 6}, 100 + s));
    ys.push_back(Tensor::from_vector<std::int32_t>({0, 1, 2, 3, 4, 0, 1, 2}, {8}));
  }
  auto run = [&](ops::Context& ctx, Model& model) {
    optim::Sgd sgd(model.parameters(), {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-4f});
    SoftmaxCrossEntropy loss;
    for (int s = 0; s < kSteps; ++s)
      train_step(ctx, model, sgd, loss, xs[s], ys[s]);
  };
  auto snapshot = [](const Model& m) {
    std::vector<std::vector<float>> out;
    for (Parameter* p : m.parameters())
      out.push_back(p->value.to_vector<float>());
    for (Buffer* b : m.buffers())
      out.push_back(b->value.to_vector<float>());
    return out;
  };

  ops::Context seq_ctx(Device::cpu(), 2);
  Model seq_a = Model::build(spec, sample, 5, 21);
  Model seq_b = Model::build(spec, sample, 5, 21);
  run(seq_ctx, seq_a);
  run(seq_ctx, seq_b);
  ASSERT_EQ(snapshot(seq_a), snapshot(seq_b));

  ops::Context ctx_a(Device::cpu(), 2), ctx_b(Device::cpu(), 2);
  Model par_a = Model::build(spec, sample, 5, 21);
  Model par_b = Model::build(spec, sample, 5, 21);
  std::thread ta([&] { run(ctx_a, par_a); });
  std::thread tb([&] { run(ctx_b, par_b); });
  ta.join();
  tb.join();
  EXPECT_EQ(snapshot(par_a), snapshot(seq_a));
  EXPECT_EQ(snapshot(par_b), snapshot(seq_a));
  // And training moved the parameters at all.
  EXPECT_NE(snapshot(par_a), snapshot(Model::build(spec, sample, 5, 21)));
}
