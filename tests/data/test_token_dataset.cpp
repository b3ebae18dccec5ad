// TokenDataset: window i is tokens [i*T, i*T + T + 1) of the set's stream, x its first T and y
// its last T, across shard boundaries; in-memory and on-demand reading give identical windows;
// the Loader serves them like image samples.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "data_test_util.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/data/loader.hpp"
#include "lockstep/data/token_dataset.hpp"
#include "token_test_util.hpp"

using namespace lockstep;
using namespace lockstep::data;
using namespace lockstep::data::testing;

namespace {
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}
bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

constexpr std::int64_t kVocab = 300;

// Checks x and y of batch row r against window w of the position-coded stream.
void expect_window(const Tensor& x, const Tensor& y, std::int64_t r, std::int64_t w,
                   std::int64_t T) {
  const auto* xs = x.data<std::int32_t>() + r * T;
  const auto* ys = y.data<std::int32_t>() + r * T;
  for (std::int64_t j = 0; j < T; ++j) {
    ASSERT_EQ(xs[j], token_at(w * T + j, kVocab)) << "window " << w << " x[" << j << "]";
    ASSERT_EQ(ys[j], token_at(w * T + j + 1, kVocab)) << "window " << w << " y[" << j << "]";
  }
}
}  // namespace

TEST(TokenDataset, WindowsAreStrideTSlicesOfTheStreamWithYShiftedByOne) {
  TempDir dir;
  // 23 tokens in shards of 5, 1, 9 and 8: stream positions 0..22.
  write_token_shards(dir.path(), "train", {5, 1, 9, 8}, kVocab);
  auto ds = TokenDataset::open(dir / "train", 4);
  EXPECT_EQ(ds->num_tokens(), 23);
  EXPECT_EQ(ds->size(), 5);  // (23 - 1) / 4: targets 1..20, tokens 21 and 22 are left over
  EXPECT_EQ(ds->shard_sizes(), (std::vector<std::int64_t>{5, 1, 9, 8}));
  Tensor x, y;
  const std::vector<std::int64_t> all{0, 1, 2, 3, 4};
  ds->gather(all, x, y);
  EXPECT_EQ(x.dtype(), DType::I32);
  EXPECT_EQ(x.shape(), (Shape{5, 4}));
  EXPECT_EQ(y.shape(), (Shape{5, 4}));
  // Window 1 is tokens 4..8: its x starts in shard 0 (position 4), crosses the one-token shard 1
  // (position 5) into shard 2; window 3 (12..16) crosses from shard 2 into shard 3.
  std::vector<std::int32_t> row1(x.data<std::int32_t>() + 4, x.data<std::int32_t>() + 8);
  EXPECT_EQ(row1, (std::vector<std::int32_t>{token_at(4, kVocab), token_at(5, kVocab),
                                             token_at(6, kVocab), token_at(7, kVocab)}));
  EXPECT_EQ(y.data<std::int32_t>()[4 + 3], token_at(8, kVocab));
  for (std::int64_t w = 0; w < 5; ++w)
    expect_window(x, y, w, w, 4);
}

TEST(TokenDataset, GatherTakesAnyOrderAndRepeats) {
  TempDir dir;
  write_token_shards(dir.path(), "train", {40, 13, 30}, kVocab);
  for (std::int64_t budget : {kDefaultMemoryBudgetBytes, std::int64_t{0}}) {
    auto ds = TokenDataset::open(dir / "train", 8, budget);
    EXPECT_EQ(ds->in_memory(), budget != 0);
    const std::vector<std::int64_t> idx{9, 3, 4, 4, 0, 8, 5, 6};
    Tensor x, y;
    ds->gather(idx, x, y);
    for (std::size_t r = 0; r < idx.size(); ++r)
      expect_window(x, y, static_cast<std::int64_t>(r), idx[r], 8);
    const std::vector<std::int64_t> outside{10};
    EXPECT_TRUE(contains(error_of([&] { ds->gather(outside, x, y); }), "window index 10"));
  }
}

TEST(TokenDataset, InMemoryAndOnDemandGiveIdenticalBatches) {
  TempDir dir;
  write_token_shards(dir.path(), "train", {1000, 17, 600, 383}, kVocab);
  auto mem = TokenDataset::open(dir / "train", 16);
  auto disk = TokenDataset::open(dir / "train", 16, 0);
  ASSERT_TRUE(mem->in_memory());
  ASSERT_FALSE(disk->in_memory());
  EXPECT_EQ(disk->bytes_read(), 0);
  std::mt19937_64 rng(5);
  for (int b = 0; b < 20; ++b) {
    std::vector<std::int64_t> idx(12);
    for (auto& i : idx)
      i = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(mem->size()));
    Tensor xm, ym, xd, yd;
    mem->gather(idx, xm, ym);
    disk->gather(idx, xd, yd);
    ASSERT_EQ(xm.to_vector<std::int32_t>(), xd.to_vector<std::int32_t>());
    ASSERT_EQ(ym.to_vector<std::int32_t>(), yd.to_vector<std::int32_t>());
  }
  // On demand reads only the windows asked for (T + 1 tokens each, 2 bytes a token), not the set.
  EXPECT_GT(disk->bytes_read(), 0);
  EXPECT_LE(disk->bytes_read(), 20 * 12 * 17 * 2);
  EXPECT_EQ(mem->bytes_read(), 2000 * 2);
}

TEST(TokenDataset, ThirtyTwoBitIdsReadTheSame) {
  TempDir dir;
  write_token_shards(dir.path(), "big", {50, 50}, 100000);
  for (std::int64_t budget : {kDefaultMemoryBudgetBytes, std::int64_t{0}}) {
    auto ds = TokenDataset::open(dir / "big", 7, budget);
    std::vector<std::int32_t> all(100);
    ds->read_tokens(0, 100, all.data());
    for (int p = 0; p < 100; ++p)
      ASSERT_EQ(all[p], token_at(p, 100000));
  }
}

TEST(TokenDataset, AContextLongerThanTheSetIsAnError) {
  TempDir dir;
  write_token_shards(dir.path(), "tiny", {3, 2}, kVocab);
  EXPECT_EQ(TokenDataset::open(dir / "tiny", 4)->size(), 1);  // exactly one window of 5 tokens
  const std::string msg = error_of([&] { TokenDataset::open(dir / "tiny", 5); });
  EXPECT_TRUE(contains(msg, "holds 5 tokens, fewer than one window of context + 1 = 6")) << msg;
  EXPECT_TRUE(contains(error_of([&] { TokenDataset::open(dir / "tiny", 0); }), "at least 1"));
}

TEST(TokenDataset, CheckFitsModelNamesVocabularyAndContextMismatches) {
  TempDir dir;
  write_token_shards(dir.path(), "t", {100}, kVocab, "bytes-ish");
  auto ds = TokenDataset::open(dir / "t", 32);
  EXPECT_NO_THROW(check_fits_model(*ds, 300, 32));
  EXPECT_NO_THROW(check_fits_model(*ds, 512, 64));
  std::string msg = error_of([&] { check_fits_model(*ds, 256, 64); });
  EXPECT_TRUE(contains(msg, "vocabulary 300")) << msg;
  EXPECT_TRUE(contains(msg, "model's vocabulary is 256")) << msg;
  msg = error_of([&] { check_fits_model(*ds, 300, 16); });
  EXPECT_TRUE(contains(msg, "context of 32 tokens is longer than the model's context of 16"))
      << msg;
}

TEST(TokenDataset, CheckSameTokensNamesBothSetsAndWhatDiffers) {
  TempDir dir;
  write_token_shards(dir.path(), "train", {50}, kVocab, "bytes");
  write_token_shards(dir.path(), "val", {20}, kVocab, "bytes");
  write_token_shards(dir.path(), "other", {20}, kVocab, "gpt2");
  auto train = TokenDataset::open(dir / "train", 4);
  EXPECT_NO_THROW(check_same_tokens(*train, *TokenDataset::open(dir / "val", 4)));
  const std::string msg =
      error_of([&] { check_same_tokens(*train, *TokenDataset::open(dir / "other", 4)); });
  EXPECT_TRUE(contains(msg, "train-00000-of-00001.h5 and ")) << msg;
  EXPECT_TRUE(contains(msg, "other-00000-of-00001.h5 differ in tokenizer: bytes vs gpt2")) << msg;
}

TEST(TokenDataset, UnigramEntropyIsThatOfTheTokenFrequencies) {
  const std::vector<std::int64_t> uniform{5, 5, 5, 5, 0};
  EXPECT_NEAR(unigram_entropy(uniform), std::log(4.0), 1e-12);
  const std::vector<std::int64_t> skewed{1, 1, 2};
  EXPECT_NEAR(unigram_entropy(skewed), -(0.25 * std::log(0.25) * 2 + 0.5 * std::log(0.5)), 1e-12);
  const std::vector<std::int64_t> one{0, 9};
  EXPECT_EQ(unigram_entropy(one), 0.0);

  TempDir dir;
  write_token_shards(dir.path(), "t", {70, 31}, 10);
  for (std::int64_t budget : {kDefaultMemoryBudgetBytes, std::int64_t{0}}) {
    auto counts = token_counts(*TokenDataset::open(dir / "t", 1, budget));
    std::vector<std::int64_t> brute(10, 0);
    for (int p = 0; p < 101; ++p)
      ++brute[static_cast<std::size_t>(token_at(p, 10))];
    EXPECT_EQ(counts, brute);
  }
}

TEST(TokenDataset, TheLoaderServesWindowsInSamplerOrderAndRanksCoverTheEpoch) {
  TempDir dir;
  write_token_shards(dir.path(), "train", {300, 200, 141}, kVocab);  // 641 tokens, T=8: 80 windows
  for (std::int64_t budget : {kDefaultMemoryBudgetBytes, std::int64_t{0}}) {
    std::shared_ptr<const Dataset> ds = TokenDataset::open(dir / "train", 8, budget);
    ASSERT_EQ(ds->size(), 80);
    std::vector<int> seen(80, 0);
    for (int rank = 0; rank < 2; ++rank) {
      DistributedSampler sampler(80, 2, rank, true, 17);
      sampler.set_epoch(3);
      const auto expected = sampler.indices();
      Loader loader(ds, sampler, 6);
      loader.start_epoch(3);
      std::size_t pos = 0;
      while (auto b = loader.next()) {
        EXPECT_EQ(b->x.shape(), (Shape{b->x.dim(0), 8}));
        EXPECT_EQ(b->y.dtype(), DType::I32);
        for (std::int64_t r = 0; r < b->x.dim(0); ++r, ++pos) {
          expect_window(b->x, b->y, r, expected[pos], 8);
          ++seen[static_cast<std::size_t>(expected[pos])];
        }
      }
      EXPECT_EQ(pos, expected.size());
    }
    for (int w = 0; w < 80; ++w)
      EXPECT_EQ(seen[static_cast<std::size_t>(w)], 1) << "window " << w;
  }
}
