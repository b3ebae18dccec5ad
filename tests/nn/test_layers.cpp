// Every layer's input and parameter gradients against finite differences (see gradcheck.hpp for
// the objective, step and tolerance), plus the layer behaviours the gradients do not show.
#include <gtest/gtest.h>

#include <cmath>

#include "gradcheck.hpp"
#include "lockstep/nn/layers.hpp"

using namespace lockstep;
using namespace lockstep::nn;
using lockstep::testing::check_gradients;
using lockstep::testing::init;
using lockstep::testing::random_tensor;
using lockstep::testing::spaced_tensor;

namespace {}  // namespace

TEST(LinearGradients, MatchFiniteDifferences) {
  ops::Context ctx;
  Linear layer(5, 4);
  check_gradients(ctx, init(layer), random_tensor({3, 5}, 1));
}

TEST(LinearGradients, WithoutBiasMatchFiniteDifferences) {
  ops::Context ctx;
  Linear layer(6, 3, /*bias=*/false);
  std::vector<Parameter*> params;
  layer.collect_parameters("", params);
  EXPECT_EQ(params.size(), 1u);
  check_gradients(ctx, init(layer), random_tensor({2, 6}, 2));
}

TEST(LinearForward, MatchesDoubleReference) {
  ops::Context ctx;
  Linear layer(3, 2);
  init(layer);
  Tensor x = random_tensor({4, 3}, 3);
  std::vector<float> y = layer.forward(ctx, x).to_vector<float>();
  auto xv = x.to_vector<float>();
  auto w = layer.weight().value.to_vector<float>();
  auto b = layer.bias().value.to_vector<float>();
  for (int n = 0; n < 4; ++n) {
    for (int o = 0; o < 2; ++o) {
      double ref = b[o];
      for (int i = 0; i < 3; ++i)
        ref += double(xv[n * 3 + i]) * w[o * 3 + i];
      EXPECT_NEAR(y[n * 2 + o], ref, 1e-6);
    }
  }
}

TEST(Conv2dGradients, StridedPaddedWithBiasMatchFiniteDifferences) {
  ops::Context ctx;
  Conv2d layer(2, 3, 3, /*stride=*/2, /*padding=*/1);
  check_gradients(ctx, init(layer), random_tensor({2, 2, 5, 5}, 4));
}

TEST(Conv2dGradients, UnpaddedWithoutBiasMatchFiniteDifferences) {
  ops::Context ctx;
  Conv2d layer(3, 2, 2, 1, 0, /*bias=*/false);
  check_gradients(ctx, init(layer), random_tensor({2, 3, 4, 4}, 5));
}

TEST(Conv2dForward, MatchesDirectConvolutionInDouble) {
  ops::Context ctx;
  Conv2d layer(2, 2, 3, 1, 1);
  init(layer);
  Tensor x = random_tensor({1, 2, 4, 4}, 6);
  auto y = layer.forward(ctx, x).to_vector<float>();
  auto xv = x.to_vector<float>();
  auto w = layer.weight().value.to_vector<float>();
  auto b = layer.bias().value.to_vector<float>();
  for (int o = 0; o < 2; ++o) {
    for (int r = 0; r < 4; ++r) {
      for (int c = 0; c < 4; ++c) {
        double ref = b[o];
        for (int i = 0; i < 2; ++i) {
          for (int kr = 0; kr < 3; ++kr) {
            for (int kc = 0; kc < 3; ++kc) {
              int rr = r + kr - 1, cc = c + kc - 1;
              if (rr < 0 || rr >= 4 || cc < 0 || cc >= 4) continue;
              ref += double(xv[(i * 4 + rr) * 4 + cc]) * w[((o * 2 + i) * 3 + kr) * 3 + kc];
            }
          }
        }
        EXPECT_NEAR(y[(o * 4 + r) * 4 + c], ref, 1e-5);
      }
    }
  }
}

TEST(PoolGradients, MaxPoolMatchesFiniteDifferences) {
  ops::Context ctx;
  MaxPool2d layer(2);
  check_gradients(ctx, layer, spaced_tensor({2, 2, 4, 4}, 7));
}

TEST(PoolGradients, OverlappingMaxPoolMatchesFiniteDifferences) {
  ops::Context ctx;
  MaxPool2d layer(3, /*stride=*/2);
  check_gradients(ctx, layer, spaced_tensor({1, 2, 5, 5}, 8));
}

TEST(PoolGradients, AvgPoolMatchesFiniteDifferences) {
  ops::Context ctx;
  AvgPool2d layer(2);
  check_gradients(ctx, layer, random_tensor({2, 3, 4, 4}, 9));
}

TEST(PoolGradients, GlobalAvgPoolMatchesFiniteDifferences) {
  ops::Context ctx;
  GlobalAvgPool layer;
  Tensor x = random_tensor({2, 3, 3, 4}, 10);
  EXPECT_EQ(layer.forward(ctx, x).shape(), (Shape{2, 3}));
  check_gradients(ctx, layer, x);
}

TEST(PoolForward, MaxAndAveragePickTheWindowMaxAndMean) {
  ops::Context ctx;
  Tensor x =
      Tensor::from_vector<float>({1, 5, 2, 0, 3, 4, 8, 1, 0, 0, 6, 7, 2, 9, 1, 1}, {1, 1, 4, 4});
  MaxPool2d maxpool(2);
  AvgPool2d avgpool(2);
  EXPECT_EQ(maxpool.forward(ctx, x).to_vector<float>(), (std::vector<float>{5, 8, 9, 7}));
  EXPECT_EQ(avgpool.forward(ctx, x).to_vector<float>(),
            (std::vector<float>{13 / 4.0f, 11 / 4.0f, 11 / 4.0f, 15 / 4.0f}));
}

TEST(ActivationGradients, ReluMatchesFiniteDifferencesAwayFromZero) {
  ops::Context ctx;
  ReLU layer;
  check_gradients(ctx, layer, spaced_tensor({3, 7}, 11));
}

TEST(ActivationGradients, GeluMatchesFiniteDifferences) {
  ops::Context ctx;
  GELU layer;
  check_gradients(ctx, layer, random_tensor({3, 8}, 12, -3.0f, 3.0f));
}

TEST(ActivationForward, GeluIsTheExactErfForm) {
  ops::Context ctx;
  GELU layer;
  Tensor x = Tensor::from_vector<float>({-2.0f, -0.5f, 0.0f, 0.7f, 3.0f}, {1, 5});
  auto y = layer.forward(ctx, x).to_vector<float>();
  auto xv = x.to_vector<float>();
  for (std::size_t i = 0; i < xv.size(); ++i) {
    double ref = 0.5 * xv[i] * (1.0 + std::erf(xv[i] / std::sqrt(2.0)));
    EXPECT_NEAR(y[i], ref, 1e-6) << "x = " << xv[i];
  }
}

TEST(FlattenGradients, AreAReshape) {
  ops::Context ctx;
  Flatten layer;
  Tensor x = random_tensor({2, 3, 2, 2}, 13);
  EXPECT_EQ(layer.forward(ctx, x).shape(), (Shape{2, 12}));
  check_gradients(ctx, layer, x);
}

TEST(DropoutGradients, MatchFiniteDifferencesWithTheMaskHeldFixed) {
  ops::Context ctx;
  Dropout layer(0.4f);
  layer.reset_parameters(21, "3.");
  lockstep::testing::GradCheckOptions opt;
  opt.before_forward = [&] { layer.set_calls(0); };  // every evaluation draws the same mask
  check_gradients(ctx, layer, random_tensor({4, 10}, 14), opt);
}

TEST(DropoutForward, ScalesKeptValuesAndIsReproducible) {
  ops::Context ctx;
  Dropout a(0.25f), b(0.25f), other_name(0.25f);
  a.reset_parameters(5, "2.");
  b.reset_parameters(5, "2.");
  other_name.reset_parameters(5, "4.");
  Tensor x = random_tensor({64, 64}, 15, 0.5f, 1.5f);
  auto ya = a.forward(ctx, x).to_vector<float>();
  auto yb = b.forward(ctx, x).to_vector<float>();
  auto yo = other_name.forward(ctx, x).to_vector<float>();
  auto ya2 = a.forward(ctx, x).to_vector<float>();  // next call: next mask
  EXPECT_EQ(ya, yb) << "same seed, name and call count must give the same mask";
  EXPECT_NE(ya, yo) << "another layer name must give another mask";
  EXPECT_NE(ya, ya2) << "the next training step must give another mask";
  auto xv = x.to_vector<float>();
  std::size_t kept = 0;
  for (std::size_t i = 0; i < xv.size(); ++i) {
    if (ya[i] != 0.0f) {
      ++kept;
      EXPECT_FLOAT_EQ(ya[i], xv[i] / 0.75f);
    }
  }
  // 4096 Bernoulli(0.75) draws: mean 3072, standard deviation 27.7; allow 5 sigma.
  EXPECT_NEAR(static_cast<double>(kept), 3072.0, 140.0);
  a.set_training(false);
  EXPECT_EQ(a.forward(ctx, x).to_vector<float>(), xv) << "evaluation mode is the identity";
}

TEST(BatchNormGradients, TrainingMode1dMatchesFiniteDifferences) {
  ops::Context ctx;
  BatchNorm1d layer(3);
  init(layer);
  // Non-trivial gamma/beta so their gradients and the scale path are exercised.
  layer.weight().value.copy_from(std::vector<float>{1.5f, -0.7f, 0.9f});
  layer.bias().value.copy_from(std::vector<float>{0.1f, 0.2f, -0.3f});
  check_gradients(ctx, layer, random_tensor({5, 3}, 16));
}

TEST(BatchNormGradients, TrainingMode2dMatchesFiniteDifferences) {
  ops::Context ctx;
  BatchNorm2d layer(2);
  init(layer);
  layer.weight().value.copy_from(std::vector<float>{1.3f, 0.6f});
  check_gradients(ctx, layer, random_tensor({2, 2, 3, 3}, 17));
}

TEST(BatchNormGradients, EvaluationModeMatchesFiniteDifferences) {
  ops::Context ctx;
  BatchNorm2d layer(3);
  init(layer);
  layer.weight().value.copy_from(std::vector<float>{1.3f, 0.6f, -0.8f});
  layer.running_mean().value.copy_from(std::vector<float>{0.2f, -0.1f, 0.4f});
  layer.running_var().value.copy_from(std::vector<float>{0.5f, 2.0f, 1.2f});
  layer.set_training(false);
  check_gradients(ctx, layer, random_tensor({2, 3, 2, 2}, 18));
}

TEST(BatchNormForward, TrainingUpdatesRunningStatsAsPyTorch) {
  ops::Context ctx;
  BatchNorm1d layer(2);
  init(layer);
  Tensor x = Tensor::from_vector<float>({1, 10, 2, 20, 3, 30, 6, 40}, {4, 2});
  auto y = layer.forward(ctx, x).to_vector<float>();
  // Channel 0: mean 3, biased var (4+1+0+9)/4 = 3.5, unbiased 14/3.
  EXPECT_NEAR(y[0], (1 - 3) / std::sqrt(3.5 + 1e-5), 1e-5);
  auto rm = layer.running_mean().value.to_vector<float>();
  auto rv = layer.running_var().value.to_vector<float>();
  EXPECT_NEAR(rm[0], 0.1 * 3.0, 1e-6);
  EXPECT_NEAR(rv[0], 0.9 + 0.1 * 14.0 / 3.0, 1e-5);
  EXPECT_NEAR(rm[1], 0.1 * 25.0, 1e-5);
  layer.set_training(false);
  auto ye = layer.forward(ctx, x).to_vector<float>();
  EXPECT_NEAR(ye[0], (1 - rm[0]) / std::sqrt(rv[0] + 1e-5), 1e-5);
}

// The block's two ReLUs sit behind BatchNorm, whose outputs cannot be kept off 0 the way
// spaced_tensor keeps a bare ReLU's inputs; a parameter step of h moves the normalised
// activations by up to ~10 h here (small conv outputs, scaled up by BN), so with h = 1e-2 some
// of them cross the kink. h = 1e-3 makes that ten times rarer; the rounding term grows to
// eps * sum|w_i y_i| / h = 1.2e-7 * ~16 / 1e-3 = 2e-3 in the worst case (independent roundings
// mostly cancel, the typical error is several times smaller), still within the tolerance.
lockstep::testing::GradCheckOptions block_options() {
  lockstep::testing::GradCheckOptions opt;
  opt.h = 1e-3;
  return opt;
}

TEST(BasicBlockGradients, IdentityShortcutMatchesFiniteDifferences) {
  ops::Context ctx;
  BasicBlock block(2, 2, 1);
  EXPECT_FALSE(block.has_downsample());
  check_gradients(ctx, init(block), random_tensor({2, 2, 4, 4}, 19), block_options());
}

TEST(BasicBlockGradients, DownsampleShortcutMatchesFiniteDifferences) {
  ops::Context ctx;
  BasicBlock block(2, 3, 2);
  EXPECT_TRUE(block.has_downsample());
  std::vector<Parameter*> params;
  block.collect_parameters("5.", params);
  std::vector<std::string> names;
  for (auto* p : params)
    names.push_back(p->name);
  EXPECT_EQ(names, (std::vector<std::string>{"5.conv1.weight", "5.bn1.weight", "5.bn1.bias",
                                             "5.conv2.weight", "5.bn2.weight", "5.bn2.bias",
                                             "5.downsample.0.weight", "5.downsample.1.weight",
                                             "5.downsample.1.bias"}));
  check_gradients(ctx, init(block), random_tensor({2, 2, 5, 5}, 20), block_options());
}

TEST(SoftmaxCrossEntropyGradients, MatchFiniteDifferencesOfTheMeanLoss) {
  ops::Context ctx;
  SoftmaxCrossEntropy loss;
  Tensor logits = random_tensor({4, 5}, 22, -2.0f, 2.0f);
  Tensor labels = Tensor::from_vector<std::int32_t>({0, 3, 4, 1}, {4});
  double value = loss.forward(ctx, logits, labels).item();
  // Reference: mean over rows of logsumexp(row) - row[label], in double.
  auto lv = logits.to_vector<float>();
  double ref = 0.0;
  for (int n = 0; n < 4; ++n) {
    double mx = -1e30, sum = 0.0;
    for (int c = 0; c < 5; ++c)
      mx = std::max(mx, double(lv[n * 5 + c]));
    for (int c = 0; c < 5; ++c)
      sum += std::exp(lv[n * 5 + c] - mx);
    int label = std::vector<int>{0, 3, 4, 1}[n];
    ref += (mx + std::log(sum) - lv[n * 5 + label]) / 4.0;
  }
  EXPECT_NEAR(value, ref, 1e-5);
  auto analytic = loss.backward(ctx, 1.0f / 4).to_vector<float>();
  float* l = logits.data<float>();
  const double h = 1e-2;
  for (int i = 0; i < 20; ++i) {
    float saved = l[i];
    l[i] = static_cast<float>(saved + h);
    double plus = loss.forward(ctx, logits, labels).item();
    l[i] = static_cast<float>(saved - h);
    double minus = loss.forward(ctx, logits, labels).item();
    l[i] = saved;
    EXPECT_NEAR((plus - minus) / (2 * h), analytic[i], 1e-3) << "logit " << i;
  }
}

TEST(SoftmaxCrossEntropyGradients, ScaleSetsWhatTheMeanIsOver) {
  ops::Context ctx;
  SoftmaxCrossEntropy loss;
  Tensor logits = random_tensor({4, 3}, 23);
  Tensor labels = Tensor::from_vector<std::int32_t>({2, 0, 1, 1}, {4});
  loss.forward(ctx, logits, labels);
  auto local = loss.backward(ctx, 1.0f / 4).to_vector<float>();
  loss.forward(ctx, logits, labels);
  auto global = loss.backward(ctx, 1.0f / 16).to_vector<float>();  // 4 replicas of 4
  auto probs = loss.probabilities().to_vector<float>();
  for (std::size_t i = 0; i < local.size(); ++i) {
    EXPECT_NEAR(global[i] * 4.0f, local[i], 1e-7);
    int row = static_cast<int>(i / 3), col = static_cast<int>(i % 3);
    float onehot = (std::vector<int>{2, 0, 1, 1}[row] == col) ? 1.0f : 0.0f;
    EXPECT_NEAR(local[i], (probs[i] - onehot) / 4.0f, 1e-7);
  }
}

TEST(Accumulation, TwoBackwardPassesDoubleEveryParameterGradient) {
  ops::Context ctx;
  Conv2d conv(2, 3, 3, 1, 1);
  BatchNorm2d bn(3);
  Linear linear(3 * 4 * 4, 2);
  Flatten flatten;
  std::vector<Module*> layers{&conv, &bn, &flatten, &linear};
  std::vector<Parameter*> params;
  for (std::size_t k = 0; k < layers.size(); ++k) {
    layers[k]->collect_parameters(str(k, "."), params);
    layers[k]->reset_parameters(3, str(k, "."));
  }
  Tensor x = random_tensor({2, 2, 4, 4}, 24);
  Tensor dy = random_tensor({2, 2}, 25);
  auto pass = [&] {
    Tensor h = x;
    for (Module* m : layers)
      h = m->forward(ctx, h);
    Tensor d = dy;
    for (auto it = layers.rbegin(); it != layers.rend(); ++it)
      d = (*it)->backward(ctx, d);
  };
  pass();
  std::vector<std::vector<float>> once;
  for (Parameter* p : params)
    once.push_back(p->grad.to_vector<float>());
  pass();
  for (std::size_t i = 0; i < params.size(); ++i) {
    auto twice = params[i]->grad.to_vector<float>();
    for (std::size_t j = 0; j < twice.size(); ++j) {
      EXPECT_NEAR(twice[j], 2.0f * once[i][j], 1e-6f * (1.0f + std::abs(once[i][j])))
          << params[i]->name << "[" << j << "]";
    }
  }
}

TEST(Backward, WithoutForwardIsAnError) {
  ops::Context ctx;
  Linear layer(2, 2);
  init(layer);
  Tensor x = random_tensor({1, 2}, 26);
  layer.forward(ctx, x);
  layer.backward(ctx, random_tensor({1, 2}, 27));
  EXPECT_THROW(layer.backward(ctx, random_tensor({1, 2}, 27)), Error);
}

TEST(Buffers, AnOutputTheCallerKeepsIsNeverOverwritten) {
  ops::Context ctx;
  ReLU layer;
  Tensor first = layer.forward(ctx, Tensor::from_vector<float>({1, -1}, {1, 2}));
  layer.backward(ctx, Tensor::from_vector<float>({1, 1}, {1, 2}));
  Tensor second = layer.forward(ctx, Tensor::from_vector<float>({3, 4}, {1, 2}));
  EXPECT_EQ(first.to_vector<float>(), (std::vector<float>{1, 0}));
  EXPECT_EQ(second.to_vector<float>(), (std::vector<float>{3, 4}));
}
