// Token data in the trainer: when data.train names token shards (lockstep-shard text), the run
// trains a language model on windows of T tokens (T = data.context, else the model spec's ctx)
// instead of images. The data layer decides what a shard is; this file only wires the token sets
// into a Run and checks that they and the model fit together.
#pragma once

#include <map>
#include <string>

#include "lockstep/train/setup.hpp"

namespace lockstep::train {

// True when data.train's first file is a token shard (its 'kind' attribute says so).
bool uses_token_data(const Config& config);

// Opens data.train (and data.test when evaluation needs it) as TokenDatasets into
// run.train_tokens / run.test_tokens, checks that both hold the same tokenizer's ids, and (on the
// ranks that log) measures the unigram baseline of the evaluation set into run.unigram_nats.
void open_token_sets(Run& run, const Config& config, const SetupOptions& options);

// After the model is built: it must cover the data's vocabulary and context.
void check_token_model(const Run& run);

// What a checkpoint records about the token data, so lockstep-generate can rebuild the model
// and encode prompts: tokenizer, vocab_size, context, eot_token.
std::map<std::string, std::string> token_attributes(const Run& run);

}  // namespace lockstep::train
