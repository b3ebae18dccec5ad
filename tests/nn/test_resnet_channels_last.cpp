// Channels-last models (Model::set_channels_last, model.channels_last): the same model computes
// what it computes in NCHW, to fp32 rounding (the convolutions sum in another order, BatchNorm's
// statistics too), in the forward pass and in every gradient; the layers' NHWC gradients match
// finite differences; the conversions keep a flatten's feature order and survive layers that
// stay NCHW; and the setting's names and automatic choice.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gradcheck.hpp"
#include "lockstep/nn/layers.hpp"
#include "lockstep/nn/loss.hpp"
#include "lockstep/nn/model.hpp"

using namespace lockstep;
using namespace lockstep::nn;
using lockstep::testing::check_gradients;
using lockstep::testing::init;
using lockstep::testing::random_tensor;

namespace {

// A ResNet in miniature: the ImageNet stem (strided conv, BatchNorm, max pooling with padding),
// a bottleneck with an identity shortcut, a strided basic block with a downsample, the head.
const char* kSmallResNet =
    "conv(8,3,stride=2,pad=1,bias=0)-bn-relu-maxpool(3,stride=2,pad=1)-conv(8,1)-bottleneck(2)-"
    "res(12,2)-gap-linear(5)";

// |got - want| <= tol * max|want| + 1e-6 for every element: the convolutions' float32 sums in
// another order differ by a few ulps of the largest terms, not of each (possibly cancelled)
// result. The absolute 1e-6 is for gradients that are 0 in exact arithmetic, such as the bias of a
// convolution that a BatchNorm follows (its mean is subtracted): there both layouts give rounding
// noise of ~1e-8, where the model's other gradients are 1e-3..1.
::testing::AssertionResult close_to(const Tensor& got, const Tensor& want, double tol) {
  std::vector<float> g = got.to_vector<float>(), w = want.to_vector<float>();
  if (g.size() != w.size()) return ::testing::AssertionFailure() << "sizes differ";
  double scale = 0.0;
  for (float v : w)
    scale = std::max(scale, static_cast<double>(std::abs(v)));
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (!(std::abs(static_cast<double>(g[i]) - w[i]) <= tol * scale + 1e-6))
      return ::testing::AssertionFailure()
             << "element " << i << ": " << g[i] << " vs " << w[i] << " (scale " << scale << ")";
  }
  return ::testing::AssertionSuccess();
}

struct StepResult {
  Tensor logits, loss;
  std::vector<Tensor> grads, buffers;
};

// One training step's forward and backward (no optimizer), everything it produced copied out.
StepResult train_step(ops::Context& ctx, Model& model, const Tensor& x, const Tensor& labels) {
  model.zero_grad(ctx);
  SoftmaxCrossEntropy loss;
  StepResult r;
  r.logits = model.forward(ctx, x).clone();
  r.loss = loss.forward(ctx, r.logits, labels).clone();
  model.backward(ctx, loss.backward(ctx, 1.0f / static_cast<float>(x.dim(0))));
  for (const Parameter* p : model.parameters())
    r.grads.push_back(p->grad.clone());
  for (const Buffer* b : model.buffers())
    r.buffers.push_back(b->value.clone());
  return r;
}

Tensor labels_for(std::int64_t n, std::int64_t classes) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 7 + 3) % classes);
  return Tensor::from_vector(v, {n});
}

// The model in both layouts from the same seed: logits, loss, every gradient and every BatchNorm
// statistic within `tol` (relative to the largest magnitude of each tensor).
void expect_layouts_agree(const std::string& spec, const Shape& sample, std::int64_t classes,
                          std::int64_t batch, std::int64_t expected_nhwc_layers, double tol) {
  ops::Context ctx(Device::cpu(), 2);
  Model nchw = Model::build(spec, sample, classes, 5);
  Model nhwc = Model::build(spec, sample, classes, 5);
  EXPECT_EQ(nhwc.set_channels_last(true), expected_nhwc_layers);
  EXPECT_TRUE(nhwc.channels_last());
  Shape shape{batch};
  shape.insert(shape.end(), sample.begin(), sample.end());
  for (int step = 0; step < 2; ++step) {  // the second reuses every buffer and conversion
    SCOPED_TRACE(::testing::Message() << spec << ", step " << step);
    Tensor x = random_tensor(shape, 40 + step);
    Tensor labels = labels_for(batch, classes);
    StepResult want = train_step(ctx, nchw, x, labels);
    StepResult got = train_step(ctx, nhwc, x, labels);
    EXPECT_TRUE(close_to(got.logits, want.logits, tol)) << "logits";
    EXPECT_TRUE(close_to(got.loss, want.loss, tol)) << "loss";
    ASSERT_EQ(got.grads.size(), want.grads.size());
    for (std::size_t k = 0; k < want.grads.size(); ++k)
      EXPECT_TRUE(close_to(got.grads[k], want.grads[k], tol)) << nchw.parameters()[k]->name;
    for (std::size_t k = 0; k < want.buffers.size(); ++k)
      EXPECT_TRUE(close_to(got.buffers[k], want.buffers[k], tol)) << nchw.buffers()[k]->name;
  }
  // Evaluation mode (running statistics; BatchNorm's fixed-affine backward, as when fine-tuning
  // with frozen statistics) agrees too.
  nchw.set_training(false);
  nhwc.set_training(false);
  {
    SCOPED_TRACE(spec + ", evaluation mode");
    Tensor x = random_tensor(shape, 45);
    StepResult want = train_step(ctx, nchw, x, labels_for(batch, classes));
    StepResult got = train_step(ctx, nhwc, x, labels_for(batch, classes));
    EXPECT_TRUE(close_to(got.logits, want.logits, tol)) << "logits";
    for (std::size_t k = 0; k < want.grads.size(); ++k)
      EXPECT_TRUE(close_to(got.grads[k], want.grads[k], tol)) << nchw.parameters()[k]->name;
  }
  // The input keeps its own layout: what the caller passed is never changed.
  Tensor x = random_tensor(shape, 50);
  std::vector<float> before = x.to_vector<float>();
  nhwc.forward(ctx, x);
  EXPECT_EQ(x.to_vector<float>(), before);
}

}  // namespace

// Tolerance: 1e-4 of each tensor's largest magnitude. Every value is a float32 sum of a few
// hundred products (the convolutions) normalised by BatchNorm; the two layouts add them in other
// orders, which moves results by ~1e-6 relative to the terms, and a backward pass through three
// BatchNorms scales such differences up by at most a few tens. A wrong layout anywhere (a
// transposed tensor, a channel read at another's place) changes the results by O(1).
TEST(ChannelsLast, SmallResNetMatchesNchwInLogitsEveryGradientAndStatistic) {
  // Every layer up to gap runs channels-last: conv, bn, relu, maxpool, conv, bottleneck, res, gap.
  expect_layouts_agree(kSmallResNet, {3, 17, 17}, 5, 4, 8, 1e-4);
}

TEST(ChannelsLast, FlattenSeesTheNchwFeatureOrder) {
  // The model converts back to NCHW before the flatten, so the linear layer's weights mean what
  // they mean without channels-last (checkpoints and exported weights stay valid): its gradient
  // would be permuted, not close, if the features came in another order.
  expect_layouts_agree("conv(6,3,pad=1)-bn-relu-maxpool(2)-conv(4,3,pad=1)-relu-flatten-linear(7)",
                       {2, 8, 8}, 7, 3, 6, 1e-4);
}

TEST(ChannelsLast, LayersThatCannotRunItSeeNchwInBothDirections) {
  // Dropout's mask is drawn per element index, so it stays NCHW: the model converts to NCHW in
  // front of it and back to NHWC after it, and the gradients likewise. Same seed, same masks.
  expect_layouts_agree("conv(4,3,pad=1)-relu-dropout(0.5)-conv(4,3,pad=1)-bn-relu-gap", {3, 6, 6},
                       3, 2, 6, 1e-4);
}

TEST(ChannelsLast, ModelsWithoutImagesAreLeftAsTheyAre) {
  Model mlp = Model::build("mlp:16", {1, 4, 4}, 3, 1);
  EXPECT_EQ(mlp.set_channels_last(true), 0);  // flatten first: no layer sees a 4-D input
  ops::Context ctx;
  Model plain = Model::build("mlp:16", {1, 4, 4}, 3, 1);
  Tensor x = random_tensor({2, 1, 4, 4}, 3);
  EXPECT_EQ(mlp.forward(ctx, x).to_vector<float>(), plain.forward(ctx, x).to_vector<float>());
}

TEST(ChannelsLast, CanBeTurnedOffAgainAndIsCopiedByClone) {
  ops::Context ctx;
  Model model = Model::build(kSmallResNet, {3, 17, 17}, 5, 2);
  Model reference = Model::build(kSmallResNet, {3, 17, 17}, 5, 2);
  model.set_channels_last(true);
  Model replica = model.clone(Device::cpu());
  EXPECT_TRUE(replica.channels_last());
  Tensor x = random_tensor({2, 3, 17, 17}, 9);
  EXPECT_EQ(replica.forward(ctx, x).to_vector<float>(), model.forward(ctx, x).to_vector<float>());
  EXPECT_EQ(model.set_channels_last(false), 0);
  EXPECT_FALSE(model.channels_last());
  // Off again: bitwise the model that never ran channels-last (running statistics aside, which
  // the forward passes above moved: evaluation mode reads them, training mode does not).
  EXPECT_EQ(model.forward(ctx, x).to_vector<float>(), reference.forward(ctx, x).to_vector<float>());
}

// The layers' own NHWC paths against finite differences: a block and a pooling layer told to run
// channels-last take an NHWC input (any values: the check perturbs each element in turn).
TEST(ChannelsLastGradients, BottleneckWithDownsampleMatchesFiniteDifferences) {
  ops::Context ctx;
  Bottleneck block(3, 2, 2);
  block.set_channels_last(true);
  lockstep::testing::GradCheckOptions opt;
  opt.h = 1e-3;  // as BottleneckGradients (test_resnet.cpp): BatchNorm amplifies the steps
  check_gradients(ctx, init(block, 11), random_tensor({2, 3, 5, 5}, 104), opt);
}

TEST(ChannelsLastGradients, PoolingLayersMatchFiniteDifferences) {
  ops::Context ctx;
  MaxPool2d max_pool(3, 2, 1);
  AvgPool2d avg_pool(3, 2, 1);
  GlobalAvgPool gap;
  for (Module* m : std::initializer_list<Module*>{&max_pool, &avg_pool, &gap}) {
    m->set_channels_last(true);
    // Values a grid apart, so no max-pool tie is within h of another value.
    check_gradients(ctx, *m, lockstep::testing::spaced_tensor({2, 5, 6, 6}, 21));
  }
}

TEST(ChannelsLastSetting, NamesAreAutoOnOffAndAnythingElseIsAnError) {
  EXPECT_EQ(channels_last_from_name("auto"), ChannelsLast::Auto);
  EXPECT_EQ(channels_last_from_name("on"), ChannelsLast::On);
  EXPECT_EQ(channels_last_from_name("off"), ChannelsLast::Off);
  try {
    channels_last_from_name("nhwc");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.channels_last = 'nhwc'"), std::string::npos)
        << e.what();
    EXPECT_NE(e.hint().find("auto, on or off"), std::string::npos) << e.hint();
  }
}

TEST(ChannelsLastSetting, OnAndOffAreObeyedAndAutoPicksConvolutionalNets) {
  ops::Context ctx;
  Model cnn = Model::build(kSmallResNet, {3, 17, 17}, 5, 1);
  Model mlp = Model::build("mlp:16", {1, 4, 4}, 3, 1);
  EXPECT_TRUE(resolve_channels_last(ChannelsLast::On, cnn, ctx));
  EXPECT_FALSE(resolve_channels_last(ChannelsLast::Off, cnn, ctx));
  EXPECT_TRUE(resolve_channels_last(ChannelsLast::Auto, cnn, ctx));
  EXPECT_FALSE(resolve_channels_last(ChannelsLast::Auto, mlp, ctx));
}

TEST(ChannelsLastSetting, AModuleThatCannotRunItRefusesToBeTold) {
  Flatten flatten;
  EXPECT_FALSE(flatten.supports_channels_last());
  EXPECT_NO_THROW(flatten.set_channels_last(false));
  EXPECT_THROW(flatten.set_channels_last(true), Error);
}

TEST(ConvNetMemory, AStepHoldsOnlyItsLiveActivationsAndStopsAllocatingAfterTheFirst) {
  // The conv-net layers take their outputs and gradients from the context's transients: after a
  // step the context holds the activations that were live at once (those a backward reads, and the
  // gradients in flight) where buffers kept per layer held every layer's output and its gradient,
  // about twice the outputs; later steps reuse them. Here it is about the outputs once (a little
  // more channels-last, with the input's conversion), so 1.5 times bounds it. A flat net, so that
  // the top-level layers' outputs are all the outputs there are.
  const char* spec =
      "conv(8,3,pad=1)-bn-relu-conv(8,3,pad=1)-bn-relu-maxpool(2)-conv(16,3,pad=1)-bn-relu-gap-"
      "linear(5)";
  for (bool channels_last : {false, true}) {
    SCOPED_TRACE(channels_last ? "channels-last" : "NCHW");
    ops::Context ctx;
    Model model = Model::build(spec, {3, 16, 16}, 5, 4);
    model.set_channels_last(channels_last);
    Tensor x = random_tensor({4, 3, 16, 16}, 70);
    Tensor labels = labels_for(4, 5);
    train_step(ctx, model, x, labels);
    const std::size_t after_one = ctx.transient_bytes();
    for (int step = 0; step < 3; ++step)
      train_step(ctx, model, x, labels);
    EXPECT_EQ(ctx.transient_bytes(), after_one);
    std::int64_t every_output = 0;
    Shape shape{4, 3, 16, 16};
    for (std::size_t k = 0; k < model.num_layers(); ++k) {
      shape = model.layer(k).output_shape(shape);
      every_output += shape_numel(shape);
    }
    EXPECT_LT(after_one, static_cast<std::size_t>(every_output) * sizeof(float) * 3 / 2);
  }
}
