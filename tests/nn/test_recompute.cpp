// Activation recompute (train.recompute = none | gelu | block): the gradients of a GPT are bitwise
// those without recompute, on the CPU (fp32, and bf16 where the CPU can) and on a device (the
// emulated GPU everywhere, CUDA where a GPU answers); the memory it exists to save is given back.
// Also the other memory saving of a GPT step: the loss writing the softmax and dlogits over the
// logits (SoftmaxCrossEntropy::Logits::Overwrite), bitwise the same, two [N*T, V] buffers fewer.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/core/allocator.hpp"
#include "lockstep/core/rng.hpp"
#include "lockstep/nn/layers.hpp"
#include "lockstep/nn/model.hpp"
#include "lockstep/nn/transformer.hpp"
#include "support/device_test_support.hpp"
#include "support/precision_reference.hpp"

using namespace lockstep;
using namespace lockstep::nn;

namespace {

// T = 70 crosses the CPU attention's 64-row query blocks.
constexpr const char* kSpec = "gpt(layers=3,heads=2,dim=32)";
constexpr std::int64_t kVocab = 40, kBatch = 2, kSeq = 70;

Tensor tokens(std::uint64_t seed) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(kBatch * kSeq));
  Philox rng(seed, 23);
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<std::int32_t>(rng.u32(i) % static_cast<std::uint32_t>(kVocab));
  return Tensor::from_vector(v, {kBatch, kSeq});
}

// What a run of two training steps leaves: each step's loss and, after the second, every
// parameter's gradient, as raw bits.
struct Outcome {
  std::vector<float> losses;
  std::vector<std::vector<float>> grads;
};

// Two steps (zero_grad, forward, loss, backward; the second on other tokens) of the model, with
// an evaluation forward between them, as the trainer does; `device` holds the model and data.
using Logits = SoftmaxCrossEntropy::Logits;

Outcome two_steps(ops::Context& ctx, Recompute mode, Logits logits = Logits::Keep) {
  const Device device = ctx.device();
  Model m = Model::build(kSpec, {kSeq}, kVocab, 31, device);
  EXPECT_EQ(set_recompute(m, mode), 3);
  SoftmaxCrossEntropy loss(0.0f, logits);
  SoftmaxCrossEntropy eval_loss;  // evaluation keeps its logits (it counts correct rows in them)
  Outcome out;
  for (std::uint64_t step = 0; step < 2; ++step) {
    Tensor x = tokens(40 + step).to(device);
    Tensor y = tokens(50 + step).view({kBatch * kSeq}).to(device);
    m.zero_grad(ctx);
    m.set_training(true);
    Tensor logits = m.forward(ctx, x);
    out.losses.push_back(loss.forward(ctx, logits, y).to(Device::cpu()).item());
    m.backward(ctx, loss.backward(ctx, 1.0f / static_cast<float>(kBatch * kSeq)));
    if (step == 0) {  // an evaluation forward, whose caches the next training forward replaces
      m.set_training(false);
      eval_loss.forward(ctx, m.forward(ctx, tokens(60).to(device)), y);
    }
  }
  for (Parameter* p : m.parameters())
    out.grads.push_back(p->grad.to(Device::cpu()).to_vector<float>());
  return out;
}

void expect_bitwise(const Outcome& want, const Outcome& got, const std::string& what) {
  ASSERT_EQ(want.losses.size(), got.losses.size());
  for (std::size_t s = 0; s < want.losses.size(); ++s)
    EXPECT_EQ(std::memcmp(&want.losses[s], &got.losses[s], sizeof(float)), 0)
        << what << ": loss of step " << s << ": " << want.losses[s] << " vs " << got.losses[s];
  ASSERT_EQ(want.grads.size(), got.grads.size());
  for (std::size_t k = 0; k < want.grads.size(); ++k) {
    ASSERT_EQ(want.grads[k].size(), got.grads[k].size());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < want.grads[k].size(); ++i)
      differ += std::memcmp(&want.grads[k][i], &got.grads[k][i], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << what << ": parameter " << k << " differs in " << differ << " of "
                          << want.grads[k].size() << " gradient elements";
  }
}

// The context's device allocator's peak over two steps, less what it held before them.
std::size_t activation_peak(ops::Context& ctx, Recompute mode, Logits logits = Logits::Keep) {
  const Device device = ctx.device();
  Model m = Model::build(kSpec, {kSeq}, kVocab, 31, device);
  set_recompute(m, mode);
  SoftmaxCrossEntropy loss(0.0f, logits);
  Tensor x = tokens(40).to(device), y = tokens(50).view({kBatch * kSeq}).to(device);
  ctx.synchronize();
  Allocator& memory = allocator_for(device);
  const std::size_t before = memory.bytes_in_use();
  memory.reset_peak_bytes();
  for (int step = 0; step < 2; ++step) {
    m.zero_grad(ctx);
    loss.forward(ctx, m.forward(ctx, x), y);
    m.backward(ctx, loss.backward(ctx, 1.0f));
  }
  ctx.synchronize();
  return memory.peak_bytes_in_use() - before;
}

}  // namespace

TEST(Recompute, GradientsAreBitwiseThoseWithoutRecomputeOnTheCpu) {
  ops::Context ctx(Device::cpu(), 2);
  const Outcome none = two_steps(ctx, Recompute::None);
  // The steps trained: a loss near ln V, and gradients that are not all zero.
  ASSERT_NEAR(none.losses[0], std::log(static_cast<float>(kVocab)), 0.2);
  double sum = 0;
  for (float g : none.grads[3])
    sum += std::abs(g);
  ASSERT_GT(sum, 0.0);
  expect_bitwise(none, two_steps(ctx, Recompute::Gelu), "gelu");
  expect_bitwise(none, two_steps(ctx, Recompute::Block), "block");
}

TEST(Recompute, GradientsAreBitwiseThoseWithoutRecomputeUnderBf16) {
  LOCKSTEP_SKIP_WITHOUT_BF16();
  ops::Context ctx(Device::cpu(), 2);
  ctx.set_precision(ops::Precision::BF16);
  const Outcome none = two_steps(ctx, Recompute::None);
  expect_bitwise(none, two_steps(ctx, Recompute::Gelu), "gelu, bf16");
  expect_bitwise(none, two_steps(ctx, Recompute::Block), "block, bf16");
}

TEST(Recompute, BlockKeepsLessActivationMemoryThanGeluAndGeluLessThanNone) {
  ops::Context ctx(Device::cpu(), 1);
  const std::size_t none = activation_peak(ctx, Recompute::None);
  const std::size_t gelu = activation_peak(ctx, Recompute::Gelu);
  const std::size_t block = activation_peak(ctx, Recompute::Block);
  // gelu gives back one [N*T, 4C] f32 activation per block but the last (one is live at a time).
  const std::size_t gelu_output = kBatch * kSeq * 4 * 32 * sizeof(float);
  EXPECT_GE(none - gelu, 2 * gelu_output) << "none " << none << ", gelu " << gelu;
  // block keeps each block's input and one block's activations at a time (the benchmark,
  // bench/recompute.sh, measures how much for gpt2-124m and gpt-mini).
  EXPECT_LT(block, gelu) << "block " << block << ", gelu " << gelu;
  EXPECT_LT(2 * block, none) << "block " << block << ", none " << none;
}

TEST(Recompute, ModelsWithoutBlocksHaveNothingToRecomputeAndClonesKeepTheMode) {
  Model mlp = Model::build("mlp:16", {8}, 3, 1);
  EXPECT_EQ(set_recompute(mlp, Recompute::Block), 0);
  Model gpt = Model::build(kSpec, {kSeq}, kVocab, 31);
  ASSERT_EQ(set_recompute(gpt, Recompute::Block), 3);
  Model copy = gpt.clone(Device::cpu());
  std::int64_t blocks = 0;
  for (std::size_t k = 0; k < copy.num_layers(); ++k)
    if (auto* b = dynamic_cast<TransformerBlock*>(&copy.layer(k))) {
      EXPECT_EQ(b->recompute(), Recompute::Block);
      ++blocks;
    }
  EXPECT_EQ(blocks, 3);
  EXPECT_EQ(recompute_from_name("gelu"), Recompute::Gelu);
  try {
    recompute_from_name("all");
    ADD_FAILURE() << "'all' was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("recompute must be none, gelu or block, got 'all'"),
              std::string::npos)
        << e.what();
  }
}

using RecomputeOnDevice = lockstep::testing::OnDevice;
LOCKSTEP_ON_DEVICES(RecomputeOnDevice);

// On a device each mode runs the device's kernels; recompute must not change one bit of them.
// On the emulated GPU the kernels are the CPU's, so the CPU's outcome is the reference too.
TEST_P(RecomputeOnDevice, GradientsAreBitwiseThoseWithoutRecompute) {
  const Outcome none = two_steps(dev(), Recompute::None);
  expect_bitwise(none, two_steps(dev(), Recompute::Gelu), "gelu on " + device().str());
  expect_bitwise(none, two_steps(dev(), Recompute::Block), "block on " + device().str());
  if (device().is_emu()) {
    ops::Context host(Device::cpu(), 1);
    expect_bitwise(two_steps(host, Recompute::None), none, "emu against the cpu");
  }
}

// The device's allocator gives block's released buffers back (to its cache) and counts them so.
TEST_P(RecomputeOnDevice, BlockKeepsLessActivationMemoryThanNone) {
  const std::size_t none = activation_peak(dev(), Recompute::None);
  const std::size_t block = activation_peak(dev(), Recompute::Block);
  EXPECT_GT(none, 0u);
  EXPECT_LT(2 * block, none) << "block " << block << ", none " << none << " on " << device().str();
}

// ---- the loss in the logits' buffer (Logits::Overwrite)

TEST(LossInPlace, GradientsAreBitwiseThoseWithBuffersOfTheirOwn) {
  ops::Context ctx(Device::cpu(), 2);
  const Outcome keep = two_steps(ctx, Recompute::None);
  expect_bitwise(keep, two_steps(ctx, Recompute::None, Logits::Overwrite), "overwrite");
  expect_bitwise(keep, two_steps(ctx, Recompute::Block, Logits::Overwrite), "overwrite + block");
  if (lockstep::testing::bf16_unavailable().empty()) {
    ctx.set_precision(ops::Precision::BF16);
    expect_bitwise(two_steps(ctx, Recompute::None),
                   two_steps(ctx, Recompute::None, Logits::Overwrite), "overwrite, bf16");
  }
}

TEST(LossInPlace, SavesTheSoftmaxAndDlogitsBuffers) {
  ops::Context ctx(Device::cpu(), 1);
  const std::size_t keep = activation_peak(ctx, Recompute::None);
  const std::size_t overwrite = activation_peak(ctx, Recompute::None, Logits::Overwrite);
  const std::size_t logits_bytes = kBatch * kSeq * kVocab * sizeof(float);
  EXPECT_GE(keep - overwrite, 2 * logits_bytes) << "keep " << keep << ", overwrite " << overwrite;
}

// backward keeps no handle on the buffer it hands on, so the head writes the next step's logits
// into the same memory: no allocation per step.
TEST(LossInPlace, TheHeadReusesItsLogitsBufferEveryStep) {
  ops::Context ctx(Device::cpu(), 1);
  Model m = Model::build(kSpec, {kSeq}, kVocab, 31);
  SoftmaxCrossEntropy loss = SoftmaxCrossEntropy::for_training(m);
  ASSERT_EQ(loss.logits_mode(), Logits::Overwrite);
  Tensor x = tokens(40), y = tokens(50).view({kBatch * kSeq});
  const void* first = nullptr;
  for (int step = 0; step < 3; ++step) {
    m.zero_grad(ctx);
    Tensor logits = m.forward(ctx, x);
    if (step == 0) first = logits.raw_data();
    EXPECT_EQ(logits.raw_data(), first) << "step " << step;
    loss.forward(ctx, logits, y);
    Tensor dlogits = loss.backward(ctx, 1.0f);
    EXPECT_EQ(dlogits.raw_data(), first) << "dlogits not in the logits' buffer, step " << step;
    m.backward(ctx, dlogits);
  }
}

// Only a last layer whose backward does not read its output lets the loss overwrite it.
TEST(LossInPlace, OnlyModelsWhoseLastLayerAllowsItOverwriteTheirLogits) {
  EXPECT_TRUE(Model::build("mlp:16", {8}, 3, 1).logits_overwritable());        // ends in linear
  EXPECT_TRUE(Model::build(kSpec, {kSeq}, kVocab, 31).logits_overwritable());  // the LM head
  Sequential relu_last;
  relu_last.emplace<Linear>(8, 3);
  relu_last.emplace<ReLU>();  // its backward reads its output
  Model m(std::move(relu_last), {8}, 3, 1);
  EXPECT_FALSE(m.logits_overwritable());
  EXPECT_EQ(SoftmaxCrossEntropy::for_training(m).logits_mode(), Logits::Keep);
  // Keep leaves the logits as the model made them.
  ops::Context ctx(Device::cpu(), 1);
  std::vector<float> xs(16);
  for (std::size_t i = 0; i < xs.size(); ++i)
    xs[i] = static_cast<float>(i) / 8.0f - 1.0f;
  Tensor logits = m.forward(ctx, Tensor::from_vector(xs, {2, 8}));
  const std::vector<float> before = logits.to_vector<float>();
  SoftmaxCrossEntropy keep = SoftmaxCrossEntropy::for_training(m);
  keep.forward(ctx, logits, Tensor::from_vector(std::vector<std::int32_t>{0, 2}, {2}));
  EXPECT_EQ(logits.to_vector<float>(), before);
}

TEST_P(RecomputeOnDevice, TheLossInTheLogitsBufferIsBitwiseAndSmaller) {
  expect_bitwise(two_steps(dev(), Recompute::None),
                 two_steps(dev(), Recompute::None, Logits::Overwrite),
                 "overwrite on " + device().str());
  const std::size_t keep = activation_peak(dev(), Recompute::None);
  const std::size_t overwrite = activation_peak(dev(), Recompute::None, Logits::Overwrite);
  EXPECT_GE(keep - overwrite, 2 * kBatch * kSeq * kVocab * sizeof(float))
      << "keep " << keep << ", overwrite " << overwrite << " on " << device().str();
}
