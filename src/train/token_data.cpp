#include "lockstep/train/token_data.hpp"

#include "lockstep/core/error.hpp"
#include "lockstep/data/token_shard.hpp"
#include "lockstep/nn/model.hpp"

namespace lockstep::train {
namespace {

std::shared_ptr<data::TokenDataset> open_tokens(const std::string& key, const std::string& spec,
                                                std::int64_t context, std::int64_t budget_mb) {
  try {
    return data::TokenDataset::open(spec, context, budget_mb << 20);
  } catch (const Error& e) {
    rethrow_with_context(e.message().rfind(spec, 0) == 0 ? key : key + " = " + spec);
  }
}

}  // namespace

bool uses_token_data(const Config& config) {
  std::vector<std::string> files;
  try {
    files = data::resolve_shard_files(config.data_train);
  } catch (const Error&) {
    return false;  // the image reader names what is missing
  }
  return !files.empty() && data::is_token_shard(files.front());
}

void open_token_sets(Run& r, const Config& config, const SetupOptions& options) {
  LOCKSTEP_CHECK_HINT(r.parallel != "dp", "use train.parallel = ddp (or none with one rank)",
                      "train.parallel = dp does not train on token shards (", config.data_train,
                      "); DDP does");
  std::int64_t context = config.data_context;
  if (context == 0) context = nn::spec_context(config.model_spec);
  LOCKSTEP_CHECK_HINT(context > 0, "set data.context (tokens per window), or ctx in model.spec",
                      "data.train = ", config.data_train,
                      " holds token shards, but neither data.context nor model.spec = ",
                      config.model_spec, " says how many tokens a training window has");
  r.train_tokens =
      open_tokens("data.train", config.data_train, context, config.data_memory_budget_mb);
  if (!config.data_test.empty() && (config.train_eval || options.eval_only)) {
    r.test_tokens =
        open_tokens("data.test", config.data_test, context, config.data_memory_budget_mb);
    data::check_same_tokens(*r.train_tokens, *r.test_tokens);
  }
  // The loss of the best model that ignores context: what "learned something" must beat. One
  // pass over the (small) evaluation set, on the ranks that print it.
  if (r.logs) {
    const data::TokenDataset& base = r.test_tokens ? *r.test_tokens : *r.train_tokens;
    r.unigram_nats = data::unigram_entropy(data::token_counts(base));
  }
}

void check_token_model(const Run& r) {
  // The embedding's ctx is at least T (Model::build checked it); the vocabulary is the model's.
  std::int64_t ctx = nn::spec_context(r.config.model_spec);
  if (ctx == 0) ctx = r.train_tokens->context();
  data::check_fits_model(*r.train_tokens, r.model->num_classes(), ctx);
  if (r.test_tokens) data::check_fits_model(*r.test_tokens, r.model->num_classes(), ctx);
}

std::map<std::string, std::string> token_attributes(const Run& r) {
  if (!r.train_tokens) return {};
  return {{"tokenizer", r.train_tokens->tokenizer()},
          {"vocab_size", std::to_string(r.train_tokens->vocab_size())},
          {"context", std::to_string(r.train_tokens->context())},
          {"eot_token", std::to_string(r.train_tokens->eot_token())}};
}

}  // namespace lockstep::train
