// The Bottleneck block and the label-smoothed loss on an accelerator device (the emulated GPU
// everywhere, CUDA where a GPU answers) compute what they compute on the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "lockstep/nn/layers.hpp"
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
