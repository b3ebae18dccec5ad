// The ImageNet ResNets (resnet18/34/50 presets), the Bottleneck block, zero_init_residual and the
// label-smoothed loss, each against an independent statement of what it must be: torchvision's
// published parameter counts, finite differences, float64 formulas written here.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "gradcheck.hpp"
#include "lockstep/nn/layers.hpp"
#include "lockstep/nn/model.hpp"
#include "support/precision_reference.hpp"

using namespace lockstep;
using namespace lockstep::nn;
using lockstep::testing::check_gradients;
using lockstep::testing::init;
using lockstep::testing::random_tensor;

namespace {

std::vector<std::string> parameter_names(Module& m, const std::string& prefix) {
  std::vector<Parameter*> params;
  m.collect_parameters(prefix, params);
  std::vector<std::string> names;
  for (Parameter* p : params)
    names.push_back(p->name);
  return names;
}

// As BasicBlock's tests (test_layers.cpp): BatchNorm scales small conv outputs up, so h = 1e-3
// keeps the ReLU kinks out of reach of the finite differences.
lockstep::testing::GradCheckOptions block_options() {
  lockstep::testing::GradCheckOptions opt;
  opt.h = 1e-3;
  return opt;
}

}  // namespace

// torchvision.models.resnet18/34/50(num_classes=1000): sum(p.numel() for p in m.parameters()).
TEST(ImageNetResNets, ParameterCountsEqualTorchvisions) {
  EXPECT_EQ(Model::build("resnet18", {3, 224, 224}, 1000, 1).num_parameters(), 11689512);
  EXPECT_EQ(Model::build("resnet34", {3, 224, 224}, 1000, 1).num_parameters(), 21797672);
  EXPECT_EQ(Model::build("resnet50", {3, 224, 224}, 1000, 1).num_parameters(), 25557032);
}

TEST(ImageNetResNets, ExpandToTheImageNetStemAndFourStages) {
  Model r18 = Model::build("resnet18", {3, 64, 64}, 10, 1);
  EXPECT_EQ(r18.layer_spec(),
            "conv(64,7,stride=2,pad=3,bias=0)-bn-relu-maxpool(3,stride=2,pad=1)-res(64)-res(64)-"
            "res(128,2)-res(128)-res(256,2)-res(256)-res(512,2)-res(512)-gap-linear(10)");
  Model r50 = Model::build("resnet50", {3, 64, 64}, 10, 1);
  EXPECT_EQ(r50.num_layers(), 4u + 3 + 4 + 6 + 3 + 2);
  EXPECT_EQ(r50.layer(4).describe(), "bottleneck(64->64->256, stride=1, downsample)");
  EXPECT_EQ(r50.layer(5).describe(), "bottleneck(256->64->256, stride=1)");
  EXPECT_EQ(r50.layer(7).describe(), "bottleneck(256->128->512, stride=2, downsample)");
  EXPECT_EQ(r50.layer(r50.num_layers() - 1).describe(), "linear(2048->10)");
}

TEST(ImageNetResNets, PresetsTakeNoArguments) {
  try {
    Model::build("resnet50:3", {3, 32, 32}, 10, 1);
    FAIL() << "resnet50:3 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("resnet50 takes no arguments"), std::string::npos) << e.message();
  }
}

TEST(ImageNetResNets, Resnet18MapsImageNetAndCifarSizedImagesToLogits) {
  ops::Context ctx;
  Model m = Model::build("resnet18", {3, 224, 224}, 7, 1);
  EXPECT_EQ(m.forward(ctx, random_tensor({2, 3, 224, 224}, 1)).shape(), (Shape{2, 7}));
  // The same network on 32x32: the last stage's maps are 1x1 (and 7x7 at 224).
  Model small = Model::build("resnet18", {3, 32, 32}, 7, 1);
  Shape shape{2, 3, 32, 32}, big{2, 3, 224, 224};
  for (std::size_t k = 0; small.layer(k).type() != "gap"; ++k) {
    shape = small.layer(k).output_shape(shape);
    big = m.layer(k).output_shape(big);
  }
  EXPECT_EQ(shape, (Shape{2, 512, 1, 1}));
  EXPECT_EQ(big, (Shape{2, 512, 7, 7}));
  EXPECT_EQ(small.forward(ctx, random_tensor({3, 3, 32, 32}, 2)).shape(), (Shape{3, 7}));
}

TEST(BottleneckSpec, OutputsFourTimesItsWidthAndChecksItsInput) {
  Model m =
      Model::build("conv(8,3,pad=1)-bottleneck(4)-bottleneck(width=4,stride=2)", {3, 8, 8}, 5, 1);
  EXPECT_EQ(m.layer_spec(),
            "conv(8,3,pad=1)-bottleneck(4)-bottleneck(width=4,stride=2)-flatten-linear(5)");
  EXPECT_EQ(m.layer(1).output_shape({1, 8, 8, 8}), (Shape{1, 16, 8, 8}));
  EXPECT_EQ(m.layer(2).output_shape({1, 16, 8, 8}), (Shape{1, 16, 4, 4}));
  try {
    Model::build("linear(8)-bottleneck(4)", {6}, 5, 1);
    FAIL() << "a bottleneck on [N, features] was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("bottleneck expects input [N, C, H, W]"), std::string::npos)
        << e.message();
  }
}

TEST(BottleneckGradients, IdentityShortcutMatchesFiniteDifferences) {
  ops::Context ctx;
  Bottleneck block(8, 2, 1);  // 8 -> 2 -> 8 channels: the shortcut is the identity
  EXPECT_FALSE(block.has_downsample());
  check_gradients(ctx, init(block), random_tensor({2, 8, 4, 4}, 31), block_options());
}

// Three BatchNorms over 18 to 50 values per channel amplify a step of h in the early layers
// enough that, for some draws, the finite differences cross a ReLU kink (as they do for a plain
// Sequential of the same layers): these draws cross none. The test after it checks the block's
// gradients exactly, for any draw, against the same layers composed by hand.
TEST(BottleneckGradients, StridedDownsampleShortcutMatchesFiniteDifferences) {
  ops::Context ctx;
  Bottleneck block(3, 2, 2);
  EXPECT_TRUE(block.has_downsample());
  EXPECT_EQ(parameter_names(block, "5."),
            (std::vector<std::string>{
                "5.conv1.weight", "5.bn1.weight", "5.bn1.bias", "5.conv2.weight", "5.bn2.weight",
                "5.bn2.bias", "5.conv3.weight", "5.bn3.weight", "5.bn3.bias",
                "5.downsample.0.weight", "5.downsample.1.weight", "5.downsample.1.bias"}));
  EXPECT_EQ(block.output_shape({2, 3, 5, 5}), (Shape{2, 8, 3, 3}));
  check_gradients(ctx, init(block, 11), random_tensor({2, 3, 5, 5}, 104), block_options());
}

// relu(branch(x) + downsample(x)) with the branch and the shortcut as Sequentials of the same
// layers (each checked against finite differences in test_layers.cpp): the block's output, dL/dx
// and every parameter gradient equal theirs bit for bit, in training and evaluation mode.
TEST(BottleneckGradients, EqualTheSameLayersComposedByHand) {
  for (bool training : {true, false}) {
    SCOPED_TRACE(training ? "training" : "evaluation");
    ops::Context ctx;
    Bottleneck block(3, 4, 2);
    init(block, 3);
    Sequential branch, shortcut;
    branch.emplace<Conv2d>(3, 4, 1, 1, 0, false);
    branch.emplace<BatchNorm2d>(4);
    branch.emplace<ReLU>();
    branch.emplace<Conv2d>(4, 4, 3, 2, 1, false);
    branch.emplace<BatchNorm2d>(4);
    branch.emplace<ReLU>();
    branch.emplace<Conv2d>(4, 16, 1, 1, 0, false);
    branch.emplace<BatchNorm2d>(16);
    shortcut.emplace<Conv2d>(3, 16, 1, 2, 0, false);
    shortcut.emplace<BatchNorm2d>(16);
    std::vector<Parameter*> mine, theirs;
    block.collect_parameters("", mine);
    branch.collect_parameters("", theirs);
    shortcut.collect_parameters("", theirs);
    ASSERT_EQ(mine.size(), theirs.size());
    for (std::size_t k = 0; k < mine.size(); ++k)
      theirs[k]->value.copy_from(mine[k]->value.to_vector<float>());
    block.set_training(training);
    branch.set_training(training);
    shortcut.set_training(training);

    Tensor x = random_tensor({3, 3, 7, 7}, 40), dy = random_tensor({3, 16, 4, 4}, 41);
    std::vector<float> y = block.forward(ctx, x).to_vector<float>();
    std::vector<float> dx = block.backward(ctx, dy).to_vector<float>();

    Tensor sum = Tensor::empty({3, 16, 4, 4}), out = Tensor::empty({3, 16, 4, 4});
    ops::add(ctx, branch.forward(ctx, x), shortcut.forward(ctx, x), sum);
    ops::relu_forward(ctx, sum, out);
    Tensor dsum = Tensor::empty({3, 16, 4, 4}), want_dx = Tensor::empty({3, 3, 7, 7});
    ops::relu_backward(ctx, out, dy, dsum);
    ops::add(ctx, branch.backward(ctx, dsum), shortcut.backward(ctx, dsum), want_dx);
    EXPECT_EQ(y, out.to_vector<float>());
    EXPECT_EQ(dx, want_dx.to_vector<float>());
    for (std::size_t k = 0; k < mine.size(); ++k)
      EXPECT_EQ(mine[k]->grad.to_vector<float>(), theirs[k]->grad.to_vector<float>())
          << mine[k]->name;
  }
}

TEST(BottleneckClone, ReplicaComputesWhatTheOriginalDoes) {
  ops::Context ctx;
  Bottleneck block(3, 2, 2);
  init(block);
  std::unique_ptr<Module> copy = block.clone(Device::cpu());
  EXPECT_EQ(copy->describe(), block.describe());
  Tensor x = random_tensor({2, 3, 6, 6}, 36);
  EXPECT_EQ(copy->forward(ctx, x).to_vector<float>(), block.forward(ctx, x).to_vector<float>());
}

TEST(BottleneckFlops, CountTheFourConvolutions) {
  Bottleneck block(16, 4, 2);
  // Per sample on 8x8 input: conv1 1x1 16->4 at 8x8, conv2 3x3 4->4 at 4x4, conv3 1x1 4->16 at
  // 4x4, downsample 1x1 16->16 at 4x4; two FLOPs per multiply-add.
  const double want = 2.0 * (16 * 4 * 64 + 9 * 4 * 4 * 16 + 4 * 16 * 16 + 16 * 16 * 16);
  EXPECT_DOUBLE_EQ(block.forward_flops({1, 16, 8, 8}), want);
}

TEST(ZeroInitResidual, EveryBlockStartsAsReluOfItsShortcut) {
  ops::Context ctx;
  Model m = Model::build("conv(8,3,pad=1,bias=0)-bn-relu-res(8)-bottleneck(4,2)-gap-linear(3)",
                         {3, 6, 6}, 3, 1);
  EXPECT_EQ(zero_init_residual(m), 2);
  for (std::size_t k : {3u, 4u}) {
    auto& block = dynamic_cast<ResidualBlock&>(m.layer(k));
    for (float g : block.last_bn().weight().value.to_vector<float>())
      EXPECT_EQ(g, 0.0f) << "layer " << k;
  }
  Parameter* bn3 = nullptr;
  for (Parameter* p : m.parameters())
    if (p->name == "4.bn3.weight") bn3 = p;
  ASSERT_NE(bn3, nullptr);
  EXPECT_EQ(bn3->value.to_vector<float>(), std::vector<float>(16, 0.0f));

  // The identity block: relu(x).
  Tensor x = random_tensor({2, 8, 6, 6}, 41);
  std::vector<float> y = m.layer(3).forward(ctx, x).to_vector<float>();
  std::vector<float> xv = x.to_vector<float>();
  for (std::size_t i = 0; i < y.size(); ++i)
    ASSERT_EQ(y[i], std::max(xv[i], 0.0f)) << i;

  // The downsampling block: relu(bn(conv1x1/2(x))), the shortcut rebuilt from its parameters.
  Tensor x2 = random_tensor({2, 8, 6, 6}, 42);
  std::vector<float> y2 = m.layer(4).forward(ctx, x2).to_vector<float>();
  Conv2d conv(8, 16, 1, 2, 0, false);
  BatchNorm2d bn(16);
  std::vector<Parameter*> conv_params;
  conv.collect_parameters("", conv_params);
  for (Parameter* p : m.parameters())
    if (p->name == "4.downsample.0.weight")
      conv_params[0]->value.copy_from(p->value.to_vector<float>());
  ReLU relu;
  std::vector<float> want =
      relu.forward(ctx, bn.forward(ctx, conv.forward(ctx, x2))).to_vector<float>();
  ASSERT_EQ(y2.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(y2[i], want[i]) << i;
}

TEST(ZeroInitResidual, ModelsWithoutBlocksAreLeftAlone) {
  Model m = Model::build("mlp:8", {4}, 3, 1);
  EXPECT_EQ(zero_init_residual(m), 0);
}

// ---- label smoothing

namespace {

// torch.nn.CrossEntropyLoss(label_smoothing=eps), in float64: the mean over rows of
// (1 - eps) (-log p[label]) + eps mean_k(-log p_k), and its gradient (p - (1 - eps) onehot -
// eps / C) * scale.
struct SmoothedReference {
  double loss = 0.0;
  std::vector<double> dlogits;
};

SmoothedReference smoothed_reference(const std::vector<float>& logits,
                                     const std::vector<std::int32_t>& labels, std::int64_t classes,
                                     double eps, double scale) {
  SmoothedReference r;
  const std::size_t n = labels.size(), c = static_cast<std::size_t>(classes);
  r.dlogits.resize(n * c);
  for (std::size_t i = 0; i < n; ++i) {
    double mx = -INFINITY, sum = 0.0;
    for (std::size_t k = 0; k < c; ++k)
      mx = std::max(mx, static_cast<double>(logits[i * c + k]));
    for (std::size_t k = 0; k < c; ++k)
      sum += std::exp(logits[i * c + k] - mx);
    double nll = 0.0, mean_nll = 0.0;
    for (std::size_t k = 0; k < c; ++k) {
      const double log_p = logits[i * c + k] - mx - std::log(sum);
      if (static_cast<std::int32_t>(k) == labels[i]) nll = -log_p;
      mean_nll += -log_p / static_cast<double>(c);
      const double target = (static_cast<std::int32_t>(k) == labels[i] ? 1.0 - eps : 0.0) +
                            eps / static_cast<double>(c);
      r.dlogits[i * c + k] = (std::exp(log_p) - target) * scale;
    }
    r.loss += ((1.0 - eps) * nll + eps * mean_nll) / static_cast<double>(n);
  }
  return r;
}

}  // namespace

TEST(LabelSmoothing, LossAndGradientMatchTorchsFormulaInDouble) {
  ops::Context ctx;
  const std::int64_t n = 5, c = 7;
  Tensor logits = random_tensor({n, c}, 51, -3.0f, 3.0f);
  std::vector<std::int32_t> lv = {0, 6, 3, 3, 1};
  Tensor labels = Tensor::from_vector<std::int32_t>(lv, {n});
  for (float eps : {0.0f, 0.1f, 0.5f}) {
    SoftmaxCrossEntropy loss(eps);
    const double got = loss.forward(ctx, logits, labels).item();
    std::vector<float> grad = loss.backward(ctx, 1.0f / n).to_vector<float>();
    SmoothedReference want =
        smoothed_reference(logits.to_vector<float>(), lv, c, eps, 1.0 / static_cast<double>(n));
    EXPECT_NEAR(got, want.loss, 1e-6 * std::max(1.0, want.loss)) << "eps " << eps;
    for (std::size_t i = 0; i < grad.size(); ++i)
      EXPECT_NEAR(grad[i], want.dlogits[i], 1e-7) << "eps " << eps << " element " << i;
  }
}

TEST(LabelSmoothing, GradientIsTheDerivativeOfTheLoss) {
  ops::Context ctx;
  SoftmaxCrossEntropy loss(0.2f);
  Tensor logits = random_tensor({3, 4}, 52, -2.0f, 2.0f);
  Tensor labels = Tensor::from_vector<std::int32_t>({1, 0, 3}, {3});
  loss.forward(ctx, logits, labels);
  std::vector<float> analytic = loss.backward(ctx, 1.0f / 3).to_vector<float>();
  float* l = logits.data<float>();
  const double h = 1e-2;
  for (int i = 0; i < 12; ++i) {
    const float saved = l[i];
    l[i] = static_cast<float>(saved + h);
    const double plus = loss.forward(ctx, logits, labels).item();
    l[i] = static_cast<float>(saved - h);
    const double minus = loss.forward(ctx, logits, labels).item();
    l[i] = saved;
    EXPECT_NEAR((plus - minus) / (2 * h), analytic[i], 1e-3) << "logit " << i;
  }
}

TEST(LabelSmoothing, ZeroIsThePlainLossBitForBit) {
  ops::Context ctx;
  Tensor logits = random_tensor({6, 5}, 53, -4.0f, 4.0f);
  Tensor labels = Tensor::from_vector<std::int32_t>({4, 0, 2, 2, 1, 3}, {6});
  SoftmaxCrossEntropy plain, zero(0.0f);
  const float a = plain.forward(ctx, logits, labels).item();
  const float b = zero.forward(ctx, logits, labels).item();
  EXPECT_EQ(a, b);
  std::vector<float> probs = plain.probabilities().to_vector<float>();
  std::vector<float> ga = plain.backward(ctx, 0.25f).to_vector<float>();
  std::vector<float> gb = zero.backward(ctx, 0.25f).to_vector<float>();
  EXPECT_EQ(ga, gb);
  // And both are the unsmoothed formula, (p - onehot) * scale, as float computes it.
  std::vector<std::int32_t> lv = labels.to_vector<std::int32_t>();
  for (std::size_t i = 0; i < ga.size(); ++i) {
    const bool hit = static_cast<std::int32_t>(i % 5) == lv[i / 5];
    EXPECT_EQ(ga[i], hit ? (probs[i] - 1.0f) * 0.25f : probs[i] * 0.25f) << i;
  }
}

TEST(LabelSmoothing, InPlaceEqualsOutOfPlace) {
  ops::Context ctx;
  Tensor logits = random_tensor({4, 9}, 54, -2.0f, 2.0f);
  Tensor labels = Tensor::from_vector<std::int32_t>({8, 0, 4, 1}, {4});
  Tensor probs = Tensor::empty({4, 9}), loss = Tensor::empty({1}), loss2 = Tensor::empty({1});
  Tensor d = Tensor::empty({4, 9});
  ops::softmax_xent_forward(ctx, logits, labels, probs, loss, 0.1f);
  ops::softmax_xent_backward(ctx, probs, labels, 0.25f, d, 0.1f);
  Tensor inplace = logits.clone();
  ops::softmax_xent_forward(ctx, inplace, labels, inplace, loss2, 0.1f);
  EXPECT_EQ(loss2.item(), loss.item());
  ops::softmax_xent_backward(ctx, inplace, labels, 0.25f, inplace, 0.1f);
  EXPECT_EQ(inplace.to_vector<float>(), d.to_vector<float>());
}

TEST(LabelSmoothing, OutsideZeroToOneIsAnError) {
  EXPECT_THROW(SoftmaxCrossEntropy(-0.1f), Error);
  EXPECT_THROW(SoftmaxCrossEntropy(1.0f), Error);
}

// A block's output kept in bf16 for the next block (Module::set_output_bf16: the residual stream in
// bf16, as autocast keeps it, on a bf16 context whose backend reads it in its kernels): the output
// is the f32-output block's rounded once and every gradient is that block's bit for bit (the
// backward reads the output only as the closing ReLU's mask); the next block computes from it
// what it computes from its widened value, through an identity shortcut (the bf16 residual) and
// through a strided downsample (a convolution's bf16 input). Both layouts.
TEST(Bf16ResidualStream, ABlockOutputIsRoundedOnceAndReadAsItsWidenedValue) {
  LOCKSTEP_SKIP_WITHOUT_BF16();
  ops::Context ctx(Device::cpu(), 2);
  ctx.set_precision(ops::Precision::BF16);
  ASSERT_TRUE(ops::bf16_conv_bn_activations(ctx));
  auto grads = [](Module& m) {
    std::vector<Parameter*> ps;
    m.collect_parameters("", ps);
    std::vector<std::vector<float>> out;
    for (Parameter* p : ps)
      out.push_back(p->grad.to_vector<float>());
    return out;
  };
  for (bool nhwc : {false, true}) {
    for (int next_stride : {1, 2}) {
      SCOPED_TRACE(str(nhwc ? "NHWC" : "NCHW", ", next block's stride ", next_stride));
      Bottleneck a16(8, 2), a32(8, 2), b16(8, 2, next_stride), b32(8, 2, next_stride);
      for (Module* m : std::initializer_list<Module*>{&a16, &a32, &b16, &b32}) {
        init(*m, m == &a16 || m == &a32 ? 5 : 6);
        m->set_channels_last(nhwc);
      }
      a16.set_output_bf16(true);
      const Tensor x = random_tensor({2, 8, 7, 7}, 50);
      const Tensor y16 = a16.forward(ctx, x), y32 = a32.forward(ctx, x);
      ASSERT_EQ(y16.dtype(), DType::BF16);
      ASSERT_EQ(y32.dtype(), DType::F32);
      Tensor rounded = Tensor::empty(y32.shape(), DType::BF16);
      ops::cast(ctx, y32, rounded);
      Tensor wide16 = Tensor::empty(y16.shape()), wide_rounded = Tensor::empty(y16.shape());
      ops::cast(ctx, y16, wide16);
      ops::cast(ctx, rounded, wide_rounded);
      EXPECT_EQ(wide16.to_vector<float>(), wide_rounded.to_vector<float>());

      const Tensor z16 = b16.forward(ctx, y16), z32 = b32.forward(ctx, wide16);
      EXPECT_EQ(z16.to_vector<float>(), z32.to_vector<float>());
      const Tensor dz = random_tensor(z16.shape(), 51);
      const Tensor dy16 = b16.backward(ctx, dz), dy32 = b32.backward(ctx, dz);
      EXPECT_EQ(dy16.to_vector<float>(), dy32.to_vector<float>());
      EXPECT_EQ(grads(b16), grads(b32));
      const Tensor dx16 = a16.backward(ctx, dy16), dx32 = a32.backward(ctx, dy32);
      EXPECT_EQ(dx16.to_vector<float>(), dx32.to_vector<float>());
      EXPECT_EQ(grads(a16), grads(a32));
    }
  }
}

// The model tells a block that another block follows (its output may be bf16), and not the last
// block, whose output the pooling reads, nor a layer followed by one that reads f32.
TEST(Bf16ResidualStream, TheModelLinksEachBlockToTheNextAndNotTheLast) {
  for (bool channels_last : {false, true}) {
    Model model = Model::build(
        "conv(8,3,stride=2,pad=1,bias=0)-bn-relu-maxpool(3,stride=2,pad=1)-bottleneck(2)-"
        "bottleneck(2)-res(12,2)-gap-linear(5)",
        {3, 17, 17}, 5, 2);
    model.set_channels_last(channels_last);
    std::vector<bool> linked;
    for (std::size_t k = 0; k < model.num_layers(); ++k)
      if (auto* block = dynamic_cast<ResidualBlock*>(&model.layer(k)))
        linked.push_back(block->output_bf16());
    EXPECT_EQ(linked, (std::vector<bool>{true, true, false}));
  }
}
