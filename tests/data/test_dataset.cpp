// ShardedDataset: one global index over all shards, and in-memory and on-demand reading that
// return the same samples.
#include <gtest/gtest.h>

#include <filesystem>

#include "data_test_util.hpp"
#include "lockstep/core/rng.hpp"
#include "lockstep/data/dataset.hpp"

using namespace lockstep;
using namespace lockstep::data;
using namespace lockstep::data::testing;

namespace {
void expect_matches_reference(const SetSpec& spec, const std::vector<std::int64_t>& idx,
                              const Tensor& x, const Tensor& y) {
  ASSERT_EQ(x.dim(0), static_cast<std::int64_t>(idx.size()));
  const auto* bytes = static_cast<const std::uint8_t*>(x.raw_data());
  for (std::size_t j = 0; j < idx.size(); ++j) {
    auto ref = reference_sample(spec, idx[j]);
    EXPECT_TRUE(std::equal(ref.begin(), ref.end(), bytes + j * ref.size()))
        << "batch position " << j << " (sample " << idx[j] << ")";
    EXPECT_EQ(y.data<std::int32_t>()[j], label_of(idx[j], spec.num_classes));
  }
}
}  // namespace

TEST(ShardedDataset, GlobalIndexRunsThroughShardsInShardIndexOrder) {
  TempDir dir;
  SetSpec spec;  // 50 samples over 4 shards of 12, 13, 12, 13
  write_set(dir.path(), spec);
  auto ds = ShardedDataset::open(dir / "train");
  EXPECT_EQ(ds->size(), 50);
  EXPECT_EQ(ds->shard_sizes(), (std::vector<std::int64_t>{12, 13, 12, 13}));
  EXPECT_EQ(ds->sample_shape(), spec.sample_shape);
  EXPECT_EQ(ds->num_classes(), spec.num_classes);
  EXPECT_EQ(ds->dtype(), DType::U8);
  EXPECT_EQ(ds->sample_bytes(), 24);
  ASSERT_EQ(ds->files().size(), 4u);
  EXPECT_EQ(std::filesystem::path(ds->files()[3]).filename(), "train-00003-of-00004.h5");
  for (std::int64_t i = 0; i < 50; ++i)
    EXPECT_EQ(ds->labels()[i], label_of(i, 5));
  std::vector<std::int64_t> all(50);
  for (std::int64_t i = 0; i < 50; ++i)
    all[i] = i;
  Tensor x, y;
  ds->gather(all, x, y);
  EXPECT_EQ(x.shape(), (Shape{50, 2, 3, 4}));
  expect_matches_reference(spec, all, x, y);
}

TEST(ShardedDataset, ShardOrderComesFromShardIndexNotFileNames) {
  TempDir dir;
  SetSpec spec;
  spec.num_shards = 2;
  auto paths = write_set(dir.path(), spec);
  // Swap the names: the file called ...00000... now holds shard 1.
  std::filesystem::rename(paths[0], dir / "tmp.h5");
  std::filesystem::rename(paths[1], paths[0]);
  std::filesystem::rename(dir / "tmp.h5", paths[1]);
  auto ds = ShardedDataset::open(dir / "train");
  EXPECT_EQ(ds->files()[0], paths[1]);
  Tensor x, y;
  std::vector<std::int64_t> idx{0, 49};
  ds->gather(idx, x, y);
  expect_matches_reference(spec, idx, x, y);
}

TEST(ShardedDataset, InMemoryAndOnDemandGiveIdenticalBatches) {
  for (DType dtype : {DType::U8, DType::F32}) {
    for (int deflate : {0, 3}) {
      TempDir dir;
      SetSpec spec;
      spec.dtype = dtype;
      spec.deflate_level = deflate;
      spec.num_samples = 97;
      spec.num_shards = 3;
      write_set(dir.path(), spec);
      auto resident = ShardedDataset::open(dir / "train");
      auto on_demand = ShardedDataset::open(dir / "train", 0);
      ASSERT_TRUE(resident->in_memory());
      ASSERT_FALSE(on_demand->in_memory());
      // Random batches with repeats, plus runs that cross shard boundaries (31|32, 63|64).
      std::vector<std::vector<std::int64_t>> batches{{30, 31, 32, 33, 62, 63, 64, 65, 96},
                                                     {5, 5, 4, 96, 0, 1, 2}};
      Philox rng(7, 0);
      for (int b = 0; b < 8; ++b) {
        std::vector<std::int64_t> idx;
        for (int j = 0; j < 16; ++j)
          idx.push_back(rng.u32(b * 16 + j) % 97);
        batches.push_back(idx);
      }
      for (const auto& idx : batches) {
        Tensor xa, ya, xb, yb;
        resident->gather(idx, xa, ya);
        on_demand->gather(idx, xb, yb);
        ASSERT_EQ(xa.nbytes(), xb.nbytes());
        EXPECT_EQ(0, std::memcmp(xa.raw_data(), xb.raw_data(), xa.nbytes()))
            << dtype_name(dtype) << " deflate " << deflate;
        EXPECT_EQ(ya.to_vector<std::int32_t>(), yb.to_vector<std::int32_t>());
        expect_matches_reference(spec, idx, xb, yb);
      }
    }
  }
}

TEST(ShardedDataset, OnDemandReadsOnlyTheRequestedSamples) {
  TempDir dir;
  SetSpec spec;
  write_set(dir.path(), spec);
  auto ds = ShardedDataset::open(dir / "train", 0);
  EXPECT_EQ(ds->bytes_read(), 0);
  Tensor x, y;
  std::vector<std::int64_t> idx{3, 17, 18, 40};
  ds->gather(idx, x, y);
  EXPECT_EQ(ds->bytes_read(), 4 * ds->sample_bytes());
  auto resident = ShardedDataset::open(dir / "train");
  EXPECT_EQ(resident->bytes_read(), 50 * resident->sample_bytes());
}

TEST(ShardedDataset, MemoryBudgetDecidesTheMode) {
  TempDir dir;
  SetSpec spec;  // 50 * 24 bytes of samples + 50 * 4 of labels = 1400
  write_set(dir.path(), spec);
  EXPECT_TRUE(ShardedDataset::open(dir / "train", 1400)->in_memory());
  EXPECT_FALSE(ShardedDataset::open(dir / "train", 1399)->in_memory());
}

TEST(ShardedDataset, OpensByFileFolderGlobPrefixOrList) {
  TempDir dir;
  SetSpec spec;
  auto paths = write_set(dir.path(), spec);
  EXPECT_EQ(ShardedDataset::open(dir.path())->size(), 50);
  EXPECT_EQ(ShardedDataset::open(dir / "train")->size(), 50);
  EXPECT_EQ(ShardedDataset::open(dir / "train-*.h5")->size(), 50);
  EXPECT_EQ(ShardedDataset::open(paths)->size(), 50);
  EXPECT_EQ(resolve_shard_files(paths[1]), std::vector<std::string>{paths[1]});
  // One file of a four-shard set is an incomplete set.
  EXPECT_THROW(ShardedDataset::open(paths[1]), Error);
}

TEST(ShardedDataset, OutOfRangeIndexIsAnError) {
  TempDir dir;
  SetSpec spec;
  write_set(dir.path(), spec);
  auto ds = ShardedDataset::open(dir / "train");
  Tensor x, y;
  std::vector<std::int64_t> idx{50};
  EXPECT_THROW(ds->gather(idx, x, y), Error);
}
