// A GPT under train.precision = bf16, whose blocks pass bf16 activations between their layers
// (ops.hpp, "Activations in bf16"; the residual stream, the head's input, parameters and their
// gradients stay f32), against the same GPT in fp32:
//  - one step's loss and every parameter gradient agree within bounds derived from bf16's unit
//    roundoff u = 2^-8 (below), and the activations really are bf16 (the error is of bf16's size,
//    not f32's);
//  - 300 AdamW steps on a learnable token sequence end at the fp32 run's loss to within 1%.
// The emulated GPU's bf16 step is bitwise the CPU's (test_fused_layers.cpp), and recompute modes
// are bitwise each other in bf16 (test_recompute.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "lockstep/core/rng.hpp"
#include "lockstep/nn/layers.hpp"
#include "lockstep/nn/model.hpp"
#include "lockstep/ops/ops.hpp"
#include "support/precision_reference.hpp"

using namespace lockstep;
using namespace lockstep::nn;

namespace {

constexpr double kU = ops::kBf16UnitRoundoff;  // 2^-8

// Tokens of an order-1 Markov chain over `vocab` symbols: each symbol is followed by one of three
// successors (fixed per symbol), so a model can learn the next token to about ln 3 nats.
Tensor markov_tokens(std::int64_t b, std::int64_t t, std::int64_t vocab, std::uint64_t seed) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(b * t));
  Philox rng(seed, 31);
  std::uint64_t draw = 0;
  for (std::int64_t row = 0; row < b; ++row) {
    std::int32_t tok = static_cast<std::int32_t>(rng.u32(draw++) % vocab);
    for (std::int64_t i = 0; i < t; ++i) {
      v[static_cast<std::size_t>(row * t + i)] = tok;
      const std::uint32_t k = rng.u32(draw++) % 3;  // successor k of tok
      tok = static_cast<std::int32_t>((tok * 7 + 3 + 5 * k) % vocab);
    }
  }
  return Tensor::from_vector(v, {b, t});
}

// Row r of x predicts x[r + 1] within its sequence (the last position predicts the first).
Tensor next_tokens(const Tensor& x) {
  const std::int64_t b = x.dim(0), t = x.dim(1);
  auto v = x.to_vector<std::int32_t>();
  std::vector<std::int32_t> out(v.size());
  for (std::int64_t r = 0; r < b; ++r)
    for (std::int64_t i = 0; i < t; ++i)
      out[static_cast<std::size_t>(r * t + i)] = v[static_cast<std::size_t>(r * t + (i + 1) % t)];
  return Tensor::from_vector(out, {b * t});
}

double loss_and_grads(ops::Context& ctx, Model& m, const Tensor& x, const Tensor& y) {
  SoftmaxCrossEntropy loss;
  m.zero_grad(ctx);
  double value = loss.forward(ctx, m.forward(ctx, x), y).item();
  m.backward(ctx, loss.backward(ctx, 1.0f / static_cast<float>(y.numel())));
  return value;
}

std::vector<std::vector<float>> gradients(Model& m) {
  std::vector<std::vector<float>> g;
  for (Parameter* p : m.parameters())
    g.push_back(p->grad.to_vector<float>());
  return g;
}

// ||a - b|| / ||b|| over all elements.
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, norm = 1e-300;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / norm);
}

// Every gradient of the bf16 model within these bounds of the fp32 model's, norm-wise. Why these:
// each rounding to bf16 changes a value by at most u of itself, and a GEMM's rounding errors,
// independent from element to element, add up like a random walk rather than in one direction, so
// a gradient's norm-wise error is about u times the square root of the roundings on its path.
// Through 3 blocks a gradient meets about 30 (each block rounds ln output, qkv, attention output,
// branch outputs and their gradients, and each GEMM its operands): u sqrt(30) = 0.021, so 8u =
// 0.031 bounds every parameter, and 3u = 0.012 their mean. The loss is a mean over 140 positions of
// log-probabilities whose errors do not all share a sign: 1u. The last bound says the path is
// really bf16: fp32's error would be 2^-24 sized, 65536 times smaller than u.
TEST(Bf16Gpt, LossAndEveryGradientTrackTheFp32PathWithinBf16Bounds) {
  LOCKSTEP_SKIP_WITHOUT_BF16();
  const std::int64_t vocab = 40, nb = 2, t = 70;  // T = 70 crosses the attention's 64-row blocks
  Tensor x = markov_tokens(nb, t, vocab, 3), y = next_tokens(x);
  ops::Context fp32(Device::cpu(), 2), bf16(Device::cpu(), 2);
  bf16.set_precision(ops::Precision::BF16);
  Model m = Model::build("gpt(layers=3,heads=2,dim=32)", {t}, vocab, 4);
  const double loss32 = loss_and_grads(fp32, m, x, y);
  const auto g32 = gradients(m);
  const double loss16 = loss_and_grads(bf16, m, x, y);
  const auto g16 = gradients(m);

  EXPECT_LE(std::abs(loss16 - loss32), kU * loss32) << "loss " << loss16 << " vs " << loss32;
  double worst = 0.0, mean = 0.0;
  std::string worst_name;
  for (std::size_t k = 0; k < g32.size(); ++k) {
    const double e = relative_error(g16[k], g32[k]);
    mean += e / static_cast<double>(g32.size());
    if (e > worst) worst = e, worst_name = m.parameters()[k]->name;
    EXPECT_LE(e, 8 * kU) << m.parameters()[k]->name;
  }
  EXPECT_LE(mean, 3 * kU);
  EXPECT_GE(worst, kU / 64) << "an error this small is f32's: the bf16 path did not run";
  std::printf(
      "bf16 vs fp32, one step: loss %.6f vs %.6f (%.2e relative); gradients' norm-wise "
      "error mean %.4f, largest %.4f (%s); u = %.4f\n",
      loss16, loss32, std::abs(loss16 - loss32) / loss32, mean, worst, worst_name.c_str(), kU);
}

// The mean loss of the last 25 of `steps` AdamW steps of a small GPT on the Markov sequence.
double trained_loss(ops::Precision precision, int steps, double* first) {
  ops::Context ctx(Device::cpu(), 2);
  ctx.set_precision(precision);
  const std::int64_t vocab = 24, nb = 8, t = 32;
  Model m = Model::build("gpt(layers=2,heads=2,dim=32)", {t}, vocab, 11);
  std::vector<Tensor> mom, var;
  for (Parameter* p : m.parameters()) {
    mom.push_back(Tensor::zeros(p->value.shape()));
    var.push_back(Tensor::zeros(p->value.shape()));
  }
  double tail = 0.0;
  for (int step = 1; step <= steps; ++step) {
    Tensor x = markov_tokens(nb, t, vocab, 100 + static_cast<std::uint64_t>(step));
    const double loss = loss_and_grads(ctx, m, x, next_tokens(x));
    if (step == 1) *first = loss;
    if (step > steps - 25) tail += loss / 25.0;
    for (std::size_t k = 0; k < m.parameters().size(); ++k) {
      Parameter& p = *m.parameters()[k];
      ops::adamw_update(ctx, p.value, p.grad, mom[k], var[k],
                        {.lr = 3e-3f, .weight_decay = 0.0f, .step = step, .verdict = {}});
    }
  }
  return tail;
}

// Training's own noise (fresh batches each step) is a few percent of the loss from step to step;
// averaged over 25 steps it is below 1%, and bf16's rounding must not move the end further than
// that. The loss falls from ln 24 = 3.18 to about ln 3 = 1.10 plus what the model has not learnt.
TEST(Bf16Gpt, TrainsToTheFp32LossOnALearnableSequence) {
  LOCKSTEP_SKIP_WITHOUT_BF16();
  double first32 = 0.0, first16 = 0.0;
  const double end32 = trained_loss(ops::Precision::FP32, 300, &first32);
  const double end16 = trained_loss(ops::Precision::BF16, 300, &first16);
  std::printf("300 AdamW steps: fp32 %.4f -> %.4f, bf16 %.4f -> %.4f (%.2f%% apart at the end)\n",
              first32, end32, first16, end16, 100.0 * std::abs(end16 - end32) / end32);
  EXPECT_NEAR(first32, std::log(24.0), 0.1);
  EXPECT_LT(end32, 1.6) << "the model did not learn the sequence: the comparison proves nothing";
  EXPECT_LE(std::abs(end16 - end32), 0.01 * end32);
}

}  // namespace
