// Activation recompute (train.recompute = none | gelu | block): the gradients of a GPT are bitwise
// those without recompute, on the CPU (fp32, and bf16 where the CPU can) and on a device (the
// emulated GPU everywhere, CUDA where a GPU answers); the memory it exists to save is given back.
// Also the other memory savings of a GPT step: the loss writing the softmax and dlogits over the
// logits (SoftmaxCrossEntropy::Logits::Overwrite), bitwise the same, two [N*T, V] buffers fewer;
// and the loss fused into the LM head over a padded vocabulary (Logits::Fused), no [N*T, V]
// buffer at all: bitwise the unpadded logits path in one chunk, within rounding in several.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/core/allocator.hpp"
#include "lockstep/core/rng.hpp"
#include "lockstep/nn/layers.hpp"
#include "lockstep/nn/loss.hpp"
#include "lockstep/nn/model.hpp"
#include "lockstep/nn/transformer.hpp"
#include "lockstep/ops/ops.hpp"
#include "lockstep/optim/clip.hpp"
#include "lockstep/optim/flat.hpp"
#include "support/device_test_support.hpp"
#include "support/precision_reference.hpp"

using namespace lockstep;
using namespace lockstep::nn;

namespace {

// T = 70 crosses the CPU attention's 64-row query blocks. The vocabulary, 40, is padded to 128
// rows by default (kSpec); kUnpadded is the same model without padding.
constexpr const char* kSpec = "gpt(layers=3,heads=2,dim=32)";
constexpr const char* kUnpadded = "gpt(layers=3,heads=2,dim=32,pad_vocab=1)";
constexpr std::int64_t kVocab = 40, kBatch = 2, kSeq = 70;

Tensor tokens(std::uint64_t seed, std::int64_t vocab = kVocab) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(kBatch * kSeq));
  Philox rng(seed, 23);
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<std::int32_t>(rng.u32(i) % static_cast<std::uint32_t>(vocab));
  return Tensor::from_vector(v, {kBatch, kSeq});
}

// What a run of two training steps leaves: each step's loss and, after the second, every
// parameter's gradient (a padded table's vocabulary rows), as raw bits, and how many elements of
// the padding rows' gradients are not zero.
struct Outcome {
  std::vector<float> losses;
  std::vector<std::vector<float>> grads;
  std::size_t padding_grad_nonzero = 0;
};

using Logits = SoftmaxCrossEntropy::Logits;

// How two_steps trains: the model, the blocks' recompute, the loss, micro-steps per step.
struct Training {
  const char* spec = kSpec;
  Recompute recompute = Recompute::None;
  Logits logits = Logits::Keep;
  std::int64_t chunk_rows = 0;  // Fused: rows of logits at a time; 0: all
  float label_smoothing = 0.0f;
  int micro_steps = 1;
  float padding_value = 0.0f;  // written into a padded table's padding rows before training
};

// Two steps (zero_grad, then per micro-step forward and loss, backward; each on other tokens) of
// the model, with an evaluation forward between them, as the trainer does; `ctx`'s device holds
// the model and data.
Outcome two_steps(ops::Context& ctx, const Training& training) {
  const Device device = ctx.device();
  Model m = Model::build(training.spec, {kSeq}, kVocab, 31, device);
  EXPECT_EQ(set_recompute(m, training.recompute), 3);
  Parameter& wte = *m.parameters().front();
  if (wte.padded_rows > 0 && training.padding_value != 0.0f) {
    Tensor padding = wte.value.sub(kVocab * wte.value.dim(1), {wte.padded_rows, wte.value.dim(1)});
    ops::fill(ctx, padding, training.padding_value);
  }
  SoftmaxCrossEntropy loss(training.label_smoothing, training.logits, training.chunk_rows);
  SoftmaxCrossEntropy eval_loss;  // evaluation keeps its logits (it counts correct rows in them)
  const float scale = 1.0f / static_cast<float>(kBatch * kSeq * training.micro_steps);
  Outcome out;
  for (std::uint64_t step = 0; step < 2; ++step) {
    m.zero_grad(ctx);
    m.set_training(true);
    for (int micro = 0; micro < training.micro_steps; ++micro) {
      const std::uint64_t batch = 10 * step + static_cast<std::uint64_t>(micro);
      Tensor x = tokens(40 + batch).to(device);
      Tensor y = tokens(50 + batch).view({kBatch * kSeq}).to(device);
      out.losses.push_back(m.forward_loss(ctx, x, y, loss, scale).to(Device::cpu()).item());
      m.backward_loss(ctx);
    }
    if (step == 0) {  // an evaluation forward, whose caches the next training forward replaces
      m.set_training(false);
      Tensor y = tokens(50).view({kBatch * kSeq}).to(device);
      eval_loss.forward(ctx, m.forward(ctx, tokens(60).to(device)), y);
    }
  }
  for (Parameter* p : m.parameters()) {
    out.grads.push_back(unpadded(*p, p->grad).to(Device::cpu()).to_vector<float>());
    if (p->padded_rows == 0) continue;
    const std::vector<float> all = p->grad.to(Device::cpu()).to_vector<float>();
    out.padding_grad_nonzero += static_cast<std::size_t>(
        std::count_if(all.begin() + static_cast<std::ptrdiff_t>(out.grads.back().size()), all.end(),
                      [](float g) { return g != 0.0f; }));
  }
  return out;
}

Outcome two_steps(ops::Context& ctx, Recompute mode, Logits logits = Logits::Keep) {
  return two_steps(ctx, Training{.recompute = mode, .logits = logits});
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
  EXPECT_EQ(got.padding_grad_nonzero, 0u) << what << ": the padding rows got a gradient";
}

// Losses within `loss_rel` of want's (relative), and each parameter's gradient within
// `grad_rel` of its largest element: rounding, where a wrong term would be off by O(1) of it.
void expect_close(const Outcome& want, const Outcome& got, double loss_rel, double grad_rel,
                  const std::string& what) {
  ASSERT_EQ(want.losses.size(), got.losses.size());
  for (std::size_t s = 0; s < want.losses.size(); ++s)
    EXPECT_NEAR(got.losses[s], want.losses[s], loss_rel * std::abs(want.losses[s]))
        << what << ": loss of step " << s;
  ASSERT_EQ(want.grads.size(), got.grads.size());
  for (std::size_t k = 0; k < want.grads.size(); ++k) {
    ASSERT_EQ(want.grads[k].size(), got.grads[k].size());
    double largest = 0, err = 0;
    for (std::size_t i = 0; i < want.grads[k].size(); ++i) {
      largest = std::max(largest, std::abs(static_cast<double>(want.grads[k][i])));
      err = std::max(err, std::abs(static_cast<double>(got.grads[k][i]) - want.grads[k][i]));
    }
    EXPECT_LE(err, grad_rel * largest) << what << ": parameter " << k;
  }
  EXPECT_EQ(got.padding_grad_nonzero, 0u) << what << ": the padding rows got a gradient";
}

// The context's device allocator's peak over two steps, less what it held before them.
std::size_t activation_peak(ops::Context& ctx, const Training& training,
                            std::int64_t vocab = kVocab) {
  const Device device = ctx.device();
  Model m = Model::build(training.spec, {kSeq}, vocab, 31, device);
  set_recompute(m, training.recompute);
  SoftmaxCrossEntropy loss(0.0f, training.logits, training.chunk_rows);
  Tensor x = tokens(40, vocab).to(device), y = tokens(50, vocab).view({kBatch * kSeq}).to(device);
  ctx.synchronize();
  Allocator& memory = allocator_for(device);
  const std::size_t before = memory.bytes_in_use();
  memory.reset_peak_bytes();
  for (int step = 0; step < 2; ++step) {
    m.zero_grad(ctx);
    m.forward_loss(ctx, x, y, loss, 1.0f);
    m.backward_loss(ctx);
  }
  ctx.synchronize();
  return memory.peak_bytes_in_use() - before;
}

std::size_t activation_peak(ops::Context& ctx, Recompute mode, Logits logits = Logits::Keep) {
  return activation_peak(ctx, Training{.recompute = mode, .logits = logits});
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
  SoftmaxCrossEntropy loss(0.0f, Logits::Overwrite);
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
  Model mlp = Model::build("mlp:16", {8}, 3, 1);
  EXPECT_TRUE(mlp.logits_overwritable());  // ends in linear
  EXPECT_EQ(SoftmaxCrossEntropy::for_training(mlp).logits_mode(), Logits::Overwrite);
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

// ---- the loss fused into the LM head (Logits::Fused) over a padded vocabulary

// A GPT trains with the fused loss; other models keep theirs; the two halves of a fused loss
// cannot be called as an ordinary loss, nor a fused loss run on a model that cannot fuse it.
TEST(FusedLoss, AGptsTrainingLossIsFusedIntoItsHead) {
  Model gpt = Model::build(kSpec, {kSeq}, kVocab, 31);
  EXPECT_TRUE(gpt.fuses_loss());
  SoftmaxCrossEntropy loss = SoftmaxCrossEntropy::for_training(gpt, 0.1f);
  EXPECT_EQ(loss.logits_mode(), Logits::Fused);
  EXPECT_EQ(loss.chunk_rows(), kLossChunkAuto);
  // The default chunk: as many rows as fit 100 MiB of f32 logits, a multiple of 64.
  EXPECT_EQ(loss_chunk_rows(50304), 512);   // GPT-2's padded vocabulary
  EXPECT_EQ(loss_chunk_rows(256), 102400);  // gpt-mini's: its logits are one chunk
  EXPECT_EQ(loss_chunk_rows(1 << 30), 64);
  EXPECT_EQ(loss.label_smoothing(), 0.1f);
  ops::Context ctx(Device::cpu(), 1);
  try {
    loss.forward(ctx, gpt.forward(ctx, tokens(40)), tokens(50).view({kBatch * kSeq}));
    ADD_FAILURE() << "a Fused loss took logits";
  } catch (const Error& e) {
    EXPECT_NE(e.hint().find("Model::forward_loss"), std::string::npos) << e.what();
  }
  gpt.backward(ctx, Tensor::zeros({kBatch * kSeq, kVocab}));  // consume the forward's caches
  Model mlp = Model::build("mlp:16", {8}, 3, 1);
  EXPECT_FALSE(mlp.fuses_loss());
  try {
    mlp.forward_loss(ctx, Tensor::zeros({2, 8}),
                     Tensor::from_vector(std::vector<std::int32_t>{0, 1}, {2}), loss, 1.0f);
    ADD_FAILURE() << "a model ending in linear ran a Fused loss";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not"), std::string::npos) << e.what();
  }
}

// In one chunk the fused step is the unfused one's operations on the same rows, and the padded
// columns change nothing: losses and every gradient bit for bit those of the unpadded model's
// loss over its whole logits, with recompute, label smoothing and micro-steps as well.
TEST(FusedLoss, OneChunkOfAPaddedVocabularyIsBitwiseTheUnpaddedLogitsPath) {
  ops::Context ctx(Device::cpu(), 2);
  const Training fused{.logits = Logits::Fused, .chunk_rows = 0};
  const Training logits{.spec = kUnpadded};
  const Outcome want = two_steps(ctx, logits);
  // The steps trained: a loss near ln V, and gradients that are not all zero.
  ASSERT_NEAR(want.losses[0], std::log(static_cast<float>(kVocab)), 0.2);
  ASSERT_GT(std::abs(want.grads[0][5]) + std::abs(want.grads[0][77]), 0.0f);
  expect_bitwise(want, two_steps(ctx, fused), "fused");
  Training block = fused;
  block.recompute = Recompute::Block;
  expect_bitwise(want, two_steps(ctx, block), "fused + block");
  Training smooth = fused, smooth_logits = logits;
  smooth.label_smoothing = smooth_logits.label_smoothing = 0.1f;
  expect_bitwise(two_steps(ctx, smooth_logits), two_steps(ctx, smooth), "fused, smoothing 0.1");
  Training micro = fused, micro_logits = logits;
  micro.micro_steps = micro_logits.micro_steps = 2;
  expect_bitwise(two_steps(ctx, micro_logits), two_steps(ctx, micro), "fused, 2 micro-steps");
  Training unpadded_fused = fused;
  unpadded_fused.spec = kUnpadded;
  expect_bitwise(want, two_steps(ctx, unpadded_fused), "fused, unpadded");
  if (lockstep::testing::bf16_unavailable().empty()) {
    ctx.set_precision(ops::Precision::BF16);
    expect_bitwise(two_steps(ctx, logits), two_steps(ctx, fused), "fused, bf16");
  }
}

// Chunks of rows change the order in which the table's gradient adds up the rows (a sum the GEMM
// library blocks its own way: docs/GPT.md, "The chunked classifier and loss") and, through the
// GEMMs' edge tiles, the last bits of some rows' dh: within rounding of the whole, fp32 and bf16
// (2.4e-7 of the largest element at most, observed; about half the gradients are bitwise).
// The loss is the same operations per row, summed as before: equal.
TEST(FusedLoss, ChunksOfRowsAgreeWithTheWholeLossWithinRounding) {
  ops::Context ctx(Device::cpu(), 2);
  const Outcome want = two_steps(ctx, Training{.spec = kUnpadded});
  for (std::int64_t chunk : {16, 64, 100}) {
    const Outcome got = two_steps(ctx, Training{.logits = Logits::Fused, .chunk_rows = chunk});
    expect_close(want, got, 1e-6, 2e-6, "chunks of " + std::to_string(chunk) + " rows");
  }
  if (lockstep::testing::bf16_unavailable().empty()) {
    ctx.set_precision(ops::Precision::BF16);
    const Outcome got = two_steps(ctx, Training{.logits = Logits::Fused, .chunk_rows = 64});
    expect_close(two_steps(ctx, Training{.spec = kUnpadded}), got, 1e-6, 2e-6,
                 "bf16, chunks of 64");
  }
}

// The padded columns are masked out of the loss, not merely zero: whatever the padding rows hold,
// the losses and gradients are the same, and the padding gets no gradient.
TEST(FusedLoss, PaddedColumnsAreMaskedOutWhateverThePaddingHolds) {
  ops::Context ctx(Device::cpu(), 1);
  const Training zero{.logits = Logits::Fused, .chunk_rows = 32};
  Training junk = zero;
  junk.padding_value = 3.0f;  // padded logits of h . 3: far above the real ones
  expect_bitwise(two_steps(ctx, zero), two_steps(ctx, junk), "padding rows of 3");
}

// No buffer holds all the logits: the fused step's peak is below the logits path's by the
// [N*T, V] logits less one chunk of the padded ones (vocabulary 1000, padded to 1024).
TEST(FusedLoss, NoBufferHoldsAllTheLogits) {
  ops::Context ctx(Device::cpu(), 1);
  const std::int64_t vocab = 1000, padded = 1024, chunk = 16, rows = kBatch * kSeq;
  const std::size_t logits =
      activation_peak(ctx, Training{.spec = kUnpadded, .logits = Logits::Overwrite}, vocab);
  const std::size_t fused =
      activation_peak(ctx, Training{.logits = Logits::Fused, .chunk_rows = chunk}, vocab);
  const std::size_t saved = (rows * vocab - chunk * padded) * sizeof(float) - rows * sizeof(double);
  EXPECT_GE(logits - fused, saved - 4096) << "logits path " << logits << ", fused " << fused;
}

// A non-finite value before the head makes the loss and the gradients non-finite, so the
// trainer's gradient check (deferred on a device) skips the step as it does without fusion.
TEST(FusedLoss, ANonFiniteHeadInputGivesANonFiniteLossAndGradients) {
  ops::Context ctx(Device::cpu(), 1);
  Model m = Model::build(kSpec, {kSeq}, kVocab, 31);
  optim::FlatParams flat(m.parameters());
  for (Parameter* p : m.parameters())
    if (p->name == "4.weight") ops::fill(ctx, p->value, NAN);  // the final LayerNorm's scale
  SoftmaxCrossEntropy loss = SoftmaxCrossEntropy::for_training(m);
  flat.zero_grad(ctx);
  const float value =
      m.forward_loss(ctx, tokens(40), tokens(50).view({kBatch * kSeq}), loss, 1.0f).item();
  m.backward_loss(ctx);
  EXPECT_TRUE(std::isnan(value)) << value;
  EXPECT_FALSE(optim::check_gradients(ctx, flat, false).finite());
}

TEST_P(RecomputeOnDevice, TheFusedLossIsTheCpusOnTheEmulatedGpuAndCloseOnCuda) {
  const Training fused{.logits = Logits::Fused, .chunk_rows = 32};
  const Outcome got = two_steps(dev(), fused);
  if (device().is_emu()) {
    ops::Context host(Device::cpu(), 1);
    expect_bitwise(two_steps(host, fused), got, "fused on emu against the cpu");
    expect_bitwise(two_steps(dev(), Training{.spec = kUnpadded}),
                   two_steps(dev(), Training{.logits = Logits::Fused, .chunk_rows = 0}),
                   "one chunk on emu");
  } else {
    expect_close(two_steps(dev(), Training{.spec = kUnpadded}), got, 1e-5, 1e-4,
                 "fused on " + device().str());
  }
  const std::size_t logits =
      activation_peak(dev(), Training{.spec = kUnpadded, .logits = Logits::Overwrite}, 1000);
  const std::size_t fused_peak =
      activation_peak(dev(), Training{.logits = Logits::Fused, .chunk_rows = 16}, 1000);
  EXPECT_LT(fused_peak + kBatch * kSeq * 1000 * sizeof(float) / 2, logits)
      << "fused " << fused_peak << ", logits path " << logits << " on " << device().str();
}
