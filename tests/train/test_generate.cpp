// Sampling from a language model (train/generate.hpp) on a fresh tiny GPT: greedy decoding is the
// argmax of the logits a single forward pass over the finished sequence gives at each position
// (causality makes one pass the reference for every step), also once the sequence outgrows the
// context; sampling depends on the seed and on nothing else.
#include <gtest/gtest.h>

#include <algorithm>

#include "lockstep/train/generate.hpp"

using namespace lockstep;
using namespace lockstep::train;

namespace {

constexpr std::int64_t kT = 8, kVocab = 20;

nn::Model tiny_gpt() {
  return nn::Model::build("gpt(layers=1,heads=2,dim=16)", {kT}, kVocab, 4);
}

// Argmax of each row of one forward pass over exactly kT tokens.
std::vector<std::int32_t> argmax_rows(ops::Context& ctx, nn::Model& m,
                                      const std::vector<std::int32_t>& window) {
  m.set_training(false);
  Tensor logits = m.forward(ctx, Tensor::from_vector(window, {1, kT}));
  std::vector<std::int32_t> out;
  for (std::int64_t r = 0; r < kT; ++r) {
    const float* row = logits.data<float>() + r * kVocab;
    out.push_back(static_cast<std::int32_t>(std::max_element(row, row + kVocab) - row));
  }
  return out;
}

}  // namespace

TEST(Generate, GreedyIsTheArgmaxOfOneForwardPassOverTheResult) {
  ops::Context ctx(Device::cpu(), 1);
  nn::Model m = tiny_gpt();
  std::vector<std::int32_t> seq = {3, 7, 1};
  const auto made = generate_tokens(ctx, m, seq, kT - 3, {.temperature = 0});
  ASSERT_EQ(made.size(), static_cast<std::size_t>(kT - 3));
  ASSERT_EQ(seq.size(), static_cast<std::size_t>(kT));
  const auto best = argmax_rows(ctx, m, seq);
  for (std::int64_t i = 2; i + 1 < kT; ++i)
    EXPECT_EQ(seq[static_cast<std::size_t>(i + 1)], best[static_cast<std::size_t>(i)])
        << "position " << i + 1;
}

TEST(Generate, BeyondTheContextEachTokenFollowsTheLastTTokens) {
  ops::Context ctx(Device::cpu(), 1);
  nn::Model m = tiny_gpt();
  std::vector<std::int32_t> seq = {5, 2};
  generate_tokens(ctx, m, seq, 2 * kT, {.temperature = 0});
  for (std::size_t end = kT; end < seq.size(); ++end) {
    std::vector<std::int32_t> window(seq.begin() + static_cast<std::ptrdiff_t>(end - kT),
                                     seq.begin() + static_cast<std::ptrdiff_t>(end));
    EXPECT_EQ(seq[end], argmax_rows(ctx, m, window).back()) << "token " << end;
  }
}

TEST(Generate, TopOneSamplingIsGreedy) {
  ops::Context ctx(Device::cpu(), 1);
  nn::Model m = tiny_gpt();
  std::vector<std::int32_t> a = {1, 2}, b = {1, 2};
  generate_tokens(ctx, m, a, 10, {.temperature = 0});
  generate_tokens(ctx, m, b, 10, {.temperature = 1.0, .top_k = 1, .seed = 9});
  EXPECT_EQ(a, b);
}

TEST(Generate, TheSameSeedSamplesTheSameTokensAndAnotherSeedOthers) {
  ops::Context ctx(Device::cpu(), 1);
  nn::Model m = tiny_gpt();
  auto sample = [&](std::uint64_t seed) {
    std::vector<std::int32_t> s = {4};
    return generate_tokens(ctx, m, s, 24, {.temperature = 1.0, .seed = seed});
  };
  const auto first = sample(11);
  EXPECT_EQ(first, sample(11));
  EXPECT_NE(first, sample(12));
  for (std::int32_t id : first) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, kVocab);
  }
}

TEST(Generate, TopKDrawsOnlyAmongTheKMostLikely) {
  ops::Context ctx(Device::cpu(), 1);
  nn::Model m = tiny_gpt();
  const std::vector<std::int32_t> prompt = {6, 6, 6};
  std::vector<float> logits = next_token_logits(ctx, m, prompt);
  std::vector<std::int32_t> order(kVocab);
  for (std::int32_t i = 0; i < kVocab; ++i)
    order[static_cast<std::size_t>(i)] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::int32_t a, std::int32_t b) { return logits[a] > logits[b]; });
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    std::vector<std::int32_t> s = prompt;
    const std::int32_t id =
        generate_tokens(ctx, m, s, 1, {.temperature = 5.0, .top_k = 3, .seed = seed})[0];
    EXPECT_TRUE(id == order[0] || id == order[1] || id == order[2])
        << "seed " << seed << ": " << id;
  }
}
