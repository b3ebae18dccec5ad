// TokenDataset: the token shards of one split as training windows. The set's stream is its shards'
// tokens concatenated in shard_index order; window i is tokens [i*T, i*T + T + 1) of it, x its
// first T tokens and y its last T (each position's next token). Windows advance by T, so one
// epoch uses every token but the first exactly once as a target, minus the (n - 1) mod T at the
// end: size() = (n - 1) / T. Windows cross shard (and document) boundaries. A set that fits the
// memory budget is read once at open; a larger one is read on demand, each batch's windows by
// hyperslab, so a rank reads only its own windows and corpora larger than memory stream.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "lockstep/data/dataset_interface.hpp"
#include "lockstep/data/defaults.hpp"
#include "lockstep/data/token_shard.hpp"

namespace lockstep::data {

class TokenDataset : public Dataset {
 public:
  // spec as for resolve_shard_files (a file, folder, glob or DIR/NAME); context = T >= 1. A set
  // of fewer than T + 1 tokens is an error. memory_budget_bytes: 0 forces on-demand reading.
  static std::shared_ptr<TokenDataset> open(
      const std::string& spec, std::int64_t context,
      std::int64_t memory_budget_bytes = kDefaultMemoryBudgetBytes);
  static std::shared_ptr<TokenDataset> open(
      const std::vector<std::string>& files, std::int64_t context,
      std::int64_t memory_budget_bytes = kDefaultMemoryBudgetBytes);
  ~TokenDataset() override;
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;

  std::int64_t size() const override { return (num_tokens_ - 1) / context_; }  // windows
  // x and y: host i32 [k, context()]; window indices in any order, repeats allowed. On demand, an
  // id >= vocab_size() in the windows read is an Error naming the shard and position.
  void gather(std::span<const std::int64_t> indices, Tensor& x, Tensor& y) const override;
  std::string describe() const override;

  std::int64_t context() const { return context_; }
  std::int64_t num_tokens() const { return num_tokens_; }
  const std::string& tokenizer() const { return meta_.tokenizer; }
  std::int64_t vocab_size() const { return meta_.vocab_size; }
  std::int32_t eot_token() const { return static_cast<std::int32_t>(meta_.eot_token); }
  const std::vector<std::string>& files() const { return files_; }  // in shard_index order
  std::vector<std::int64_t> shard_sizes() const;
  bool in_memory() const { return !resident16_.empty() || !resident32_.empty(); }
  // Bytes of /tokens read from the files so far (at open in memory mode, per batch on demand).
  std::int64_t bytes_read() const { return bytes_read_.load(); }

  // Tokens [begin, begin + count) of the stream, across shards, into out.
  void read_tokens(std::int64_t begin, std::int64_t count, std::int32_t* out) const;

 private:
  TokenDataset() = default;
  std::vector<std::unique_ptr<TokenShardFile>> shards_;
  std::vector<std::string> files_;
  std::vector<std::int64_t> offsets_;  // offsets_[s] = first stream position of shard s; + total
  TokenShardMeta meta_;                // the set's common attributes (shard_index meaningless)
  std::int64_t num_tokens_ = 0;
  std::int64_t context_ = 0;
  std::vector<std::uint16_t> resident16_;  // the whole stream in memory mode, 2-byte ids
  std::vector<std::int32_t> resident32_;   // ... or 4-byte ids
  mutable std::atomic<std::int64_t> bytes_read_{0};
};

// How often each id occurs in the whole set ([vocab_size]); reads the stream in blocks, so it works
// on sets of any size.
std::vector<std::int64_t> token_counts(const TokenDataset& data);
// Entropy of the distribution the counts describe, in nats: the loss per token of the best model
// that ignores context (predicting each token with its frequency), the baseline a language model
// must beat.
double unigram_entropy(std::span<const std::int64_t> counts);

// Checks that a model of `model_vocab` ids and `model_context` positions can train on windows of
// `data`: its vocabulary must cover the tokenizer's and its context must hold T. Errors name the
// set and both numbers.
void check_fits_model(const TokenDataset& data, std::int64_t model_vocab,
                      std::int64_t model_context);
// Checks that two sets (train and validation) hold ids of the same tokenizer, vocabulary and
// end-of-text token; the error names both sets and what differs.
void check_same_tokens(const TokenDataset& a, const TokenDataset& b);

}  // namespace lockstep::data
