// Sampling from a language model (train/generate.hpp) on a fresh tiny GPT: greedy decoding is the
// argmax of the logits a single forward pass over the finished sequence gives at each position
// (causality makes one pass the reference for every step), also once the sequence outgrows the
// context; sampling depends on the seed and on nothing else.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/core/error.hpp"
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

// The tiny GPT's 20-token table is padded to 128 rows (nn::kVocabPadding): logits stop at the
// vocabulary, so no padded id is ever drawn, even when the padding rows would win every argmax.
TEST(Generate, PaddedTokenIdsAreNeverDrawn) {
  ops::Context ctx(Device::cpu(), 1);
  nn::Model m = tiny_gpt();
  nn::Parameter& wte = *m.parameters().front();
  ASSERT_EQ(wte.value.dim(0), 128);
  // Padding rows along the last position's features, far larger than the real rows.
  std::vector<float> table = wte.value.to_vector<float>();
  const std::vector<std::int32_t> seq = {1, 2, 3, 4, 5, 6, 7};
  m.set_training(false);
  Tensor h = Tensor::from_vector(std::vector<std::int32_t>{1, 2, 3, 4, 5, 6, 7, 0}, {1, kT});
  for (std::size_t k = 0; k + 1 < m.num_layers(); ++k)  // up to the head's input
    h = m.layer(k).forward(ctx, h);
  const std::vector<float> all = h.to_vector<float>();
  const std::vector<float> last(all.begin() + 6 * 16, all.begin() + 7 * 16);  // position 6
  for (std::int64_t row = kVocab; row < 128; ++row)
    for (std::int64_t j = 0; j < 16; ++j)
      table[static_cast<std::size_t>(row * 16 + j)] = 100.0f * last[static_cast<std::size_t>(j)];
  wte.value.copy_from(table);
  const std::vector<float> logits = next_token_logits(ctx, m, seq);
  EXPECT_EQ(logits.size(), static_cast<std::size_t>(kVocab));
  for (const SampleOptions& o :
       {SampleOptions{.temperature = 0}, SampleOptions{.temperature = 1.0, .seed = 3},
        SampleOptions{.temperature = 2.0, .top_k = 5, .seed = 4}}) {
    std::vector<std::int32_t> s = seq;
    for (std::int32_t id : generate_tokens(ctx, m, s, 12, o))
      EXPECT_LT(id, kVocab);
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

namespace {
// parse_generate_args over a checkpoint and a prompt plus `extra` options.
GenerateArgs gen_args(std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"lockstep-generate", "--checkpoint=c.h5", "--prompt=hi"});
  std::vector<const char*> argv;
  for (const auto& a : extra)
    argv.push_back(a.c_str());
  return parse_generate_args(static_cast<int>(argv.size()), argv.data());
}
std::string gen_error(const std::vector<std::string>& extra) {
  try {
    gen_args(extra);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(GenerateArgs, IntegersAreReadExactlyOverTheirWholeRange) {
  EXPECT_EQ(gen_args({"--seed=18446744073709551615"}).sample.seed, UINT64_MAX);
  // 2^53 + 1: a double would read it as 2^53, and generate 2^53's text.
  EXPECT_EQ(gen_args({"--seed=9007199254740993"}).sample.seed, 9007199254740993u);
  EXPECT_EQ(gen_args({"--seed=0"}).sample.seed, 0u);
  EXPECT_EQ(gen_args({"--tokens=9223372036854775807"}).tokens, INT64_MAX);
  EXPECT_EQ(gen_args({"--top-k=3", "--tokens=0", "--threads=2"}).sample.top_k, 3);
  const GenerateArgs d = gen_args({});
  EXPECT_EQ(d.tokens, 200);
  EXPECT_EQ(d.sample.seed, 1u);
  EXPECT_EQ(d.threads, 1);
  EXPECT_FALSE(d.ids);
  EXPECT_TRUE(gen_args({"--ids"}).ids);
  EXPECT_EQ(gen_args({"--seed=3", "--seed=4"}).sample.seed, 4u);  // a later option wins
}

TEST(GenerateArgs, AValueThatIsNotAnIntegerInRangeIsAnErrorNamingTheOptionAndTheValue) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--tokens=inf", "option --tokens: 'inf' is not an integer"},
      {"--tokens=1e30", "option --tokens: '1e30' is not an integer"},
      {"--tokens=-1", "option --tokens: -1 is below the minimum 0"},
      {"--seed=1e30", "option --seed: '1e30' is not an integer"},
      {"--seed=inf", "option --seed: 'inf' is not an integer"},
      {"--seed=1.5", "option --seed: '1.5' is not an integer"},
      {"--seed=-1", "option --seed: -1 is below the minimum 0"},
      {"--seed=18446744073709551616", "option --seed: 18446744073709551616 is out of range"},
      {"--seed=", "option --seed: '' is not an integer"},
      {"--top-k=2.5", "option --top-k: '2.5' is not an integer"},
      {"--temperature=nan", "option --temperature: 'nan' is not a finite number"},
      {"--temperature=-1", "option --temperature: -1 is below the minimum 0"},
  };
  for (const auto& [arg, message] : cases) {
    const std::string e = gen_error({arg});
    EXPECT_NE(e.find(message), std::string::npos) << arg << ": " << e;
  }
}

TEST(GenerateArgs, ThreadsHaveLockstepTrainsBounds) {
  EXPECT_EQ(gen_args({"--threads=" + std::to_string(ops::kMaxCpuThreads)}).threads,
            ops::kMaxCpuThreads);
  std::string e = gen_error({"--threads=100000"});
  EXPECT_NE(e.find("option --threads: 100000 is above the maximum " +
                   std::to_string(ops::kMaxCpuThreads)),
            std::string::npos)
      << e;
  EXPECT_NE(gen_error({"--threads=0"}).find("option --threads: 0 is below the minimum 1"),
            std::string::npos);
  EXPECT_NE(gen_error({"--threads=4294967297"}).find("is above the maximum"), std::string::npos);
}

TEST(GenerateArgs, MalformedCommandLinesSayWhatIsWrong) {
  EXPECT_NE(gen_error({"--tokens"}).find("option --tokens needs a value"), std::string::npos);
  EXPECT_NE(gen_error({"--ids=1"}).find("--ids takes no value"), std::string::npos);
  EXPECT_NE(gen_error({"--sed=1"}).find("unknown option --sed"), std::string::npos);
  EXPECT_NE(gen_error({"extra"}).find("unexpected argument 'extra'"), std::string::npos);
  EXPECT_NE(gen_error({"--prompt="}).find("missing --prompt"), std::string::npos);
  const char* help[] = {"lockstep-generate", "--tokens=x", "-h"};
  EXPECT_TRUE(parse_generate_args(3, help).help);
}
