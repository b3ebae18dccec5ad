#include "lockstep/data/token_dataset.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "lockstep/data/dataset.hpp"

namespace lockstep::data {

std::shared_ptr<TokenDataset> TokenDataset::open(const std::string& spec, std::int64_t context,
                                                 std::int64_t memory_budget_bytes) {
  return open(resolve_shard_files(spec), context, memory_budget_bytes);
}

std::shared_ptr<TokenDataset> TokenDataset::open(const std::vector<std::string>& files,
                                                 std::int64_t context,
                                                 std::int64_t memory_budget_bytes) {
  LOCKSTEP_CHECK_HINT(!files.empty(), "make token shards with lockstep-shard text",
                      "empty token set: no shard files given");
  LOCKSTEP_CHECK(context >= 1, "token windows need a context of at least 1 token, got ", context);
  std::vector<std::unique_ptr<TokenShardFile>> opened;
  for (const auto& f : files)
    opened.push_back(TokenShardFile::open(f));

  // The files must be the shards 0..n-1 of one set: same tokenizer, each index exactly once.
  const TokenShardMeta& first = opened[0]->meta();
  std::map<std::int64_t, const TokenShardFile*> by_index;
  for (const auto& s : opened) {
    const TokenShardMeta& m = s->meta();
    auto agree = [&](const char* field, const auto& mine, const auto& theirs) {
      LOCKSTEP_CHECK_HINT(
          mine == theirs,
          "all shards of a set must come from one lockstep-shard text run; regenerate the set",
          "token shards of one set disagree on '", field, "': ", s->where(), " says ", mine,
          " but ", opened[0]->where(), " says ", theirs);
    };
    agree("num_shards", m.num_shards, first.num_shards);
    agree("tokenizer", m.tokenizer, first.tokenizer);
    agree("vocab_size", m.vocab_size, first.vocab_size);
    agree("eot_token", m.eot_token, first.eot_token);
    auto [it, inserted] = by_index.emplace(m.shard_index, s.get());
    LOCKSTEP_CHECK_HINT(inserted,
                        "a folder may hold several sets (train, val): open DIR/NAME instead",
                        "shard index ", m.shard_index, " appears twice: in ", it->second->path(),
                        " and in ", s->path());
  }
  for (std::int64_t i = 0; i < first.num_shards; ++i) {
    LOCKSTEP_CHECK_HINT(by_index.count(i), "regenerate the token shards with lockstep-shard text",
                        "token set is incomplete: shard ", i, " of ", first.num_shards,
                        " is missing (have ", opened.size(), " files, e.g. ", opened[0]->path(),
                        ")");
  }

  std::shared_ptr<TokenDataset> ds(new TokenDataset());
  ds->meta_ = first;
  ds->meta_.shard_index = 0;
  ds->context_ = context;
  std::sort(opened.begin(), opened.end(), [](const auto& a, const auto& b) {
    return a->meta().shard_index < b->meta().shard_index;
  });
  ds->offsets_.push_back(0);
  for (auto& s : opened) {
    ds->files_.push_back(s->path());
    ds->offsets_.push_back(ds->offsets_.back() + s->meta().num_tokens);
  }
  ds->num_tokens_ = ds->offsets_.back();
  ds->meta_.num_tokens = ds->num_tokens_;
  ds->shards_ = std::move(opened);
  LOCKSTEP_CHECK_HINT(ds->num_tokens_ >= context + 1, "use a shorter context, or more text",
                      ds->describe(), " holds ", ds->num_tokens_,
                      " tokens, fewer than one window of context + 1 = ", context + 1);

  const std::int64_t bytes = ds->num_tokens_ * ds->meta_.token_bytes();
  if (bytes <= memory_budget_bytes) {
    // Every id is checked as it is read, so a bad id fails here, at open, naming its shard.
    const auto n = static_cast<std::size_t>(ds->num_tokens_);
    if (ds->meta_.token_bytes() == 2) {
      ds->resident16_.resize(n);
      for (std::size_t s = 0; s < ds->shards_.size(); ++s)
        ds->shards_[s]->read(0, ds->shards_[s]->meta().num_tokens,
                             ds->resident16_.data() + ds->offsets_[s]);
    } else {
      ds->resident32_.resize(n);
      for (std::size_t s = 0; s < ds->shards_.size(); ++s)
        ds->shards_[s]->read(0, ds->shards_[s]->meta().num_tokens,
                             ds->resident32_.data() + ds->offsets_[s]);
    }
    ds->bytes_read_ += bytes;
  }
  return ds;
}

TokenDataset::~TokenDataset() = default;

std::string TokenDataset::describe() const {
  return files_.size() == 1 ? files_.front()
                            : str(files_.front(), ", ... (", files_.size(), " token shards)");
}

std::vector<std::int64_t> TokenDataset::shard_sizes() const {
  std::vector<std::int64_t> out;
  for (std::size_t s = 0; s + 1 < offsets_.size(); ++s)
    out.push_back(offsets_[s + 1] - offsets_[s]);
  return out;
}

void TokenDataset::read_tokens(std::int64_t begin, std::int64_t count, std::int32_t* out) const {
  LOCKSTEP_CHECK(begin >= 0 && count >= 0 && begin + count <= num_tokens_, describe(), ": tokens [",
                 begin, ", ", begin + count, ") are outside [0, ", num_tokens_, ")");
  if (!resident16_.empty()) {
    std::copy_n(resident16_.begin() + begin, count, out);
    return;
  }
  if (!resident32_.empty()) {
    std::copy_n(resident32_.begin() + begin, count, out);
    return;
  }
  auto s = static_cast<std::size_t>(std::upper_bound(offsets_.begin(), offsets_.end(), begin) -
                                    offsets_.begin() - 1);
  for (std::int64_t pos = begin, end = begin + count; pos < end; ++s) {
    const std::int64_t take = std::min(end, offsets_[s + 1]) - pos;
    if (take <= 0) continue;  // an empty shard
    shards_[s]->read(pos - offsets_[s], take, out + (pos - begin));
    pos += take;
  }
  bytes_read_ += count * meta_.token_bytes();
}

void TokenDataset::gather(std::span<const std::int64_t> indices, Tensor& x, Tensor& y) const {
  const auto k = static_cast<std::int64_t>(indices.size());
  const std::int64_t T = context_;
  const Shape shape{k, T};
  if (!x.defined() || x.shape() != shape || x.dtype() != DType::I32 || !x.device().is_cpu())
    x = Tensor::empty(shape, DType::I32);
  if (!y.defined() || y.shape() != shape || y.dtype() != DType::I32 || !y.device().is_cpu())
    y = Tensor::empty(shape, DType::I32);
  auto* xo = x.data<std::int32_t>();
  auto* yo = y.data<std::int32_t>();
  const std::int64_t windows = size();
  for (std::int64_t j = 0; j < k; ++j) {
    LOCKSTEP_CHECK(indices[j] >= 0 && indices[j] < windows, "window index ", indices[j],
                   " is outside [0, ", windows, ") of ", describe());
  }
  // Visit the windows in index order so that neighbours (which share a token) become one run,
  // read each run's tokens at once (one hyperslab per shard it touches), then scatter.
  std::vector<std::int64_t> order(static_cast<std::size_t>(k));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](std::int64_t a, std::int64_t b) { return indices[a] < indices[b]; });
  std::vector<std::int32_t> run;
  for (std::size_t p = 0; p < order.size();) {
    const std::int64_t first = indices[order[p]];
    std::size_t q = p + 1;
    std::int64_t last = first;
    while (q < order.size() && indices[order[q]] <= last + 1) {
      last = indices[order[q]];
      ++q;
    }
    const std::int64_t count = (last - first + 1) * T + 1;
    run.resize(static_cast<std::size_t>(count));
    read_tokens(first * T, count, run.data());
    for (std::size_t r = p; r < q; ++r) {
      const std::int32_t* w = run.data() + (indices[order[r]] - first) * T;
      std::copy_n(w, T, xo + order[r] * T);
      std::copy_n(w + 1, T, yo + order[r] * T);
    }
    p = q;
  }
}

std::vector<std::int64_t> token_counts(const TokenDataset& data) {
  std::vector<std::int64_t> counts(static_cast<std::size_t>(data.vocab_size()), 0);
  constexpr std::int64_t kBlock = std::int64_t{1} << 20;
  std::vector<std::int32_t> block;
  for (std::int64_t b = 0; b < data.num_tokens(); b += kBlock) {
    const std::int64_t n = std::min(kBlock, data.num_tokens() - b);
    block.resize(static_cast<std::size_t>(n));
    data.read_tokens(b, n, block.data());
    for (auto id : block)
      ++counts[static_cast<std::size_t>(id)];
  }
  return counts;
}

double unigram_entropy(std::span<const std::int64_t> counts) {
  double total = 0;
  for (auto c : counts)
    total += static_cast<double>(c);
  LOCKSTEP_CHECK(total > 0, "unigram entropy of an empty count");
  double h = 0;
  for (auto c : counts) {
    if (c == 0) continue;
    const double p = static_cast<double>(c) / total;
    h -= p * std::log(p);
  }
  return h;
}

void check_fits_model(const TokenDataset& data, std::int64_t model_vocab,
                      std::int64_t model_context) {
  LOCKSTEP_CHECK_HINT(data.vocab_size() <= model_vocab,
                      "give the model a vocabulary at least as large as the tokenizer's",
                      data.describe(), " holds '", data.tokenizer(), "' tokens (vocabulary ",
                      data.vocab_size(), ") but the model's vocabulary is ", model_vocab);
  LOCKSTEP_CHECK_HINT(data.context() <= model_context,
                      "shorten the data's context or lengthen the model's", "a context of ",
                      data.context(), " tokens is longer than the model's context of ",
                      model_context, " (data ", data.describe(), ")");
}

void check_same_tokens(const TokenDataset& a, const TokenDataset& b) {
  auto same = [&](const char* what, const auto& x, const auto& y) {
    LOCKSTEP_CHECK_HINT(x == y, "shard both sets with the same lockstep-shard text run",
                        a.describe(), " and ", b.describe(), " differ in ", what, ": ", x, " vs ",
                        y);
  };
  same("tokenizer", a.tokenizer(), b.tokenizer());
  same("vocabulary size", a.vocab_size(), b.vocab_size());
  same("end-of-text token", a.eot_token(), b.eot_token());
}

}  // namespace lockstep::data
