// The Bottleneck block, a channels-last ResNet and the label-smoothed loss on an accelerator
// device (the emulated GPU everywhere, CUDA where a GPU answers) compute what they compute on the
// CPU: bit for bit on the emulated device, whose kernels are the CPU's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "lockstep/nn/layers.hpp"
#include "lockstep/nn/loss.hpp"
#include "lockstep/nn/model.hpp"
#include "support/device_test_support.hpp"

using namespace lockstep;
using namespace lockstep::nn;
using lockstep::testing::random_tensor;

using ResNetOnDevice = lockstep::testing::OnDevice;
LOCKSTEP_ON_DEVICES(ResNetOnDevice);

TEST_P(ResNetOnDevice, BottleneckForwardAndBackwardMatchTheCpu) {
  Bottleneck host(3, 2, 2);
  std::vector<Parameter*> names;
  host.collect_parameters("", names);
  host.reset_parameters(7, "");
  std::unique_ptr<Module> on_dev = host.clone(device());
  Tensor x = random_tensor({2, 3, 6, 6}, 61), dy = random_tensor({2, 8, 3, 3}, 62);
  std::vector<float> y_cpu = host.forward(cpu(), x).to_vector<float>();
  std::vector<float> dx_cpu = host.backward(cpu(), dy).to_vector<float>();
  Tensor y_dev = on_dev->forward(dev(), to_dev(x));
  Tensor dx_dev = on_dev->backward(dev(), to_dev(dy));
  auto close = [](const std::vector<float>& want, const Tensor& got, const char* what) {
    std::vector<float> g = got.to(Device::cpu()).to_vector<float>();
    ASSERT_EQ(g.size(), want.size()) << what;
    for (std::size_t i = 0; i < g.size(); ++i)
      EXPECT_NEAR(g[i], want[i], 1e-4 * (1.0f + std::abs(want[i]))) << what << " " << i;
  };
  close(y_cpu, y_dev, "y");
  close(dx_cpu, dx_dev, "dx");
  std::vector<Parameter*> hp, dp;
  host.collect_parameters("", hp);
  on_dev->collect_parameters("", dp);
  for (std::size_t k = 0; k < hp.size(); ++k)
    close(hp[k]->grad.to_vector<float>(), dp[k]->grad, hp[k]->name.c_str());
}

TEST_P(ResNetOnDevice, SmoothedLossMatchesTheCpu) {
  Tensor logits = random_tensor({5, 6}, 63, -3.0f, 3.0f);
  Tensor labels = Tensor::from_vector<std::int32_t>({5, 0, 2, 2, 1}, {5});
  SoftmaxCrossEntropy on_cpu(0.1f), on_dev(0.1f);
  const float want = on_cpu.forward(cpu(), logits, labels).item();
  const float got = on_dev.forward(dev(), to_dev(logits), to_dev(labels)).to(Device::cpu()).item();
  EXPECT_NEAR(got, want, 1e-6f * std::max(1.0f, std::abs(want)));
  std::vector<float> g_cpu = on_cpu.backward(cpu(), 0.2f).to_vector<float>();
  std::vector<float> g_dev = on_dev.backward(dev(), 0.2f).to(Device::cpu()).to_vector<float>();
  for (std::size_t i = 0; i < g_cpu.size(); ++i)
    EXPECT_NEAR(g_dev[i], g_cpu[i], 1e-7f) << i;
}

TEST_P(ResNetOnDevice, ChannelsLastModelMatchesTheCpu) {
  // The stem, a bottleneck, a strided basic block and the head, channels-last on both sides: the
  // model's conversions, the NHWC pooling and the convolutions in NHWC (cuDNN's NHWC tensors and
  // channels-last filters on CUDA). On CUDA within 1e-4 of the largest magnitude: cuDNN sums the
  // products in its own order.
  const std::string spec =
      "conv(8,3,stride=2,pad=1,bias=0)-bn-relu-maxpool(3,stride=2,pad=1)-bottleneck(2)-res(12,2)-"
      "gap-linear(5)";
  Model host = Model::build(spec, {3, 17, 17}, 5, 3);
  ASSERT_GT(host.set_channels_last(true), 0);
  Model on_dev = host.clone(device());
  ASSERT_TRUE(on_dev.channels_last());
  Tensor x = random_tensor({4, 3, 17, 17}, 64);
  Tensor labels = Tensor::from_vector<std::int32_t>({1, 4, 0, 2}, {4});
  auto step = [&](ops::Context& ctx, Model& m, const Tensor& xs, const Tensor& ls) {
    m.zero_grad(ctx);
    SoftmaxCrossEntropy loss;
    Tensor logits = m.forward(ctx, xs);
    Tensor copy = logits.to(Device::cpu());
    loss.forward(ctx, logits, ls);
    m.backward(ctx, loss.backward(ctx, 0.25f));
    return copy;
  };
  const Tensor want = step(cpu(), host, x, labels);
  const Tensor got = step(dev(), on_dev, to_dev(x), to_dev(labels));
  const bool bitwise = device().kind == DeviceKind::EMU;
  auto expect_same = [&](const Tensor& w, const Tensor& g, const std::string& what) {
    std::vector<float> a = w.to(Device::cpu()).to_vector<float>();
    std::vector<float> b = g.to(Device::cpu()).to_vector<float>();
    ASSERT_EQ(a.size(), b.size()) << what;
    float scale = 0.0f;
    for (float v : a)
      scale = std::max(scale, std::abs(v));
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (bitwise)
        ASSERT_EQ(std::memcmp(&a[i], &b[i], sizeof(float)), 0) << what << " " << i;
      else
        ASSERT_NEAR(b[i], a[i], 1e-4f * scale) << what << " " << i;
    }
  };
  expect_same(want, got, "logits");
  for (std::size_t k = 0; k < host.parameters().size(); ++k)
    expect_same(host.parameters()[k]->grad, on_dev.parameters()[k]->grad,
                host.parameters()[k]->name);
  for (std::size_t k = 0; k < host.buffers().size(); ++k)
    expect_same(host.buffers()[k]->value, on_dev.buffers()[k]->value, host.buffers()[k]->name);
}
