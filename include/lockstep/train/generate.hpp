// Text generation from a trained language model (lockstep-generate): the model, its tokenizer and
// its context are rebuilt from a checkpoint, and tokens are sampled one at a time. Each step runs
// the whole window again (no key/value cache: fine for the small models a CPU trains); the
// causal mask makes position t's logits independent of what follows, so a short window is padded
// to the model's T and read at its last real position. Sampling is a pure function of (model,
// prompt, options): draw i uses Philox(seed) value i, so a seed gives the same text every run.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/nn/model.hpp"
#include "lockstep/ops/context.hpp"

namespace lockstep::train {

struct SampleOptions {
  double temperature = 1.0;  // 0 = greedy (argmax); else softmax(logits / temperature)
  std::int64_t top_k = 0;    // > 0: sample among the k most likely tokens only
  std::uint64_t seed = 1;
};

// The logits of the token following `tokens` (its last context() ids), [vocab] as floats.
std::vector<float> next_token_logits(ops::Context& ctx, nn::Model& model,
                                     const std::vector<std::int32_t>& tokens);

// Appends `count` sampled tokens to `tokens` (non-empty) and returns them. The model must be a
// language model built for windows [T] (outputs_per_sample() == T).
std::vector<std::int32_t> generate_tokens(ops::Context& ctx, nn::Model& model,
                                          std::vector<std::int32_t>& tokens, std::int64_t count,
                                          const SampleOptions& options);

// lockstep-generate's command line: --name=VALUE options, --ids and --help (-h) without one.
struct GenerateArgs {
  std::string checkpoint;
  std::string prompt;
  std::string gpt2_dir;  // "" = the GPT-2 files' default place (data::make_tokenizer)
  std::int64_t tokens = 200;
  int threads = 1;  // CPU threads, 1 to ops::kMaxCpuThreads as for train.threads
  bool ids = false;
  bool help = false;
  SampleOptions sample;
};
// Integers are read exactly over their whole range (--seed: 0 to 2^64 - 1), never through a
// double; a later option wins over an earlier one. Throws lockstep::Error naming the option and
// its value for anything else: "option --seed: '1e30' is not an integer".
GenerateArgs parse_generate_args(int argc, const char* const* argv);

// A language model read back from a training checkpoint, with what encoding prompts needs.
struct LanguageModel {
  std::unique_ptr<nn::Model> model;
  std::string tokenizer;  // "bytes" or "gpt2"
  std::int64_t context = 0;
  std::int32_t eot_token = 0;
};
// Errors name the file: not a checkpoint, or one not written by a run on token shards.
LanguageModel load_language_model(ops::Context& ctx, const std::string& checkpoint);

}  // namespace lockstep::train
