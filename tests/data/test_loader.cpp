// Loader: batches in sampler order from a background thread, resumable, abandonable, and
// errors from the thread surface in next().
#include <gtest/gtest.h>

#include <fstream>

#include "data_test_util.hpp"
#include "lockstep/data/loader.hpp"

using namespace lockstep;
using namespace lockstep::data;
using namespace lockstep::data::testing;

namespace {
struct Fixture {
  TempDir dir;
  SetSpec spec;
  std::shared_ptr<ShardedDataset> ds;
  explicit Fixture(std::int64_t budget = kDefaultMemoryBudgetBytes, std::int64_t n = 50) {
    spec.num_samples = n;
    write_set(dir.path(), spec);
    ds = ShardedDataset::open(dir / "train", budget);
  }
};

// Everything one epoch yields, checked against the reference samples.
std::vector<Batch> drain(Loader& loader) {
  std::vector<Batch> out;
  while (auto b = loader.next())
    out.push_back(std::move(*b));
  return out;
}
}  // namespace

TEST(Loader, DeliversTheSamplersIndicesInOrderWithAShortLastBatch) {
  for (std::int64_t budget : {kDefaultMemoryBudgetBytes, std::int64_t{0}}) {
    Fixture f(budget);
    DistributedSampler sampler(50, 2, 1, true, 11);
    sampler.set_epoch(4);
    const auto expected = sampler.indices();  // 25 indices
    Loader loader(f.ds, sampler, 8);
    EXPECT_EQ(loader.batches_per_epoch(), 4);
    loader.start_epoch(4);
    auto batches = drain(loader);
    ASSERT_EQ(batches.size(), 4u);
    std::size_t pos = 0;
    for (std::size_t b = 0; b < batches.size(); ++b) {
      const Batch& batch = batches[b];
      EXPECT_EQ(batch.epoch, 4);
      EXPECT_EQ(batch.index_in_epoch, static_cast<std::int64_t>(b));
      EXPECT_EQ(batch.x.dim(0), b < 3 ? 8 : 1);
      EXPECT_EQ(batch.x.dtype(), DType::U8);
      EXPECT_EQ(batch.y.dtype(), DType::I32);
      for (std::int64_t j = 0; j < batch.x.dim(0); ++j, ++pos) {
        auto ref = reference_sample(f.spec, expected[pos]);
        EXPECT_EQ(0,
                  std::memcmp(ref.data(),
                              static_cast<const std::uint8_t*>(batch.x.raw_data()) + j * ref.size(),
                              ref.size()));
        EXPECT_EQ(batch.y.data<std::int32_t>()[j], label_of(expected[pos], f.spec.num_classes));
      }
    }
    EXPECT_EQ(pos, expected.size());
    EXPECT_FALSE(loader.next().has_value());  // stays at the end
  }
}

TEST(Loader, DropLastBatchDropsTheShortOne) {
  Fixture f;
  LoaderOptions o;
  o.drop_last_batch = true;
  Loader loader(f.ds, DistributedSampler(50, 1, 0), 8, o);
  EXPECT_EQ(loader.batches_per_epoch(), 6);
  loader.start_epoch(0);
  auto batches = drain(loader);
  ASSERT_EQ(batches.size(), 6u);
  for (const auto& b : batches)
    EXPECT_EQ(b.x.dim(0), 8);
}

TEST(Loader, RanksTogetherCoverTheEpoch) {
  Fixture f;
  std::int64_t samples = 0;
  for (int r = 0; r < 3; ++r) {
    Loader loader(f.ds, DistributedSampler(50, 3, r, true, 1), 5);
    loader.start_epoch(2);
    for (const auto& b : drain(loader))
      samples += b.x.dim(0);
  }
  EXPECT_EQ(samples, 51);  // 50 padded to 51
}

TEST(Loader, StartBatchResumesTheFirstEpochOnly) {
  Fixture f;
  DistributedSampler sampler(50, 1, 0, true, 3);
  LoaderOptions o;
  o.start_batch = 4;
  Loader loader(f.ds, sampler, 8, o);
  loader.start_epoch(1);
  auto resumed = drain(loader);
  ASSERT_EQ(resumed.size(), 3u);  // batches 4, 5, 6 of 7
  EXPECT_EQ(resumed[0].index_in_epoch, 4);

  Loader full(f.ds, sampler, 8);
  full.start_epoch(1);
  auto all = drain(full);
  ASSERT_EQ(all.size(), 7u);
  EXPECT_EQ(resumed[0].y.to_vector<std::int32_t>(), all[4].y.to_vector<std::int32_t>());
  EXPECT_EQ(0, std::memcmp(resumed[2].x.raw_data(), all[6].x.raw_data(), all[6].x.nbytes()));

  loader.start_epoch(2);
  auto next_epoch = drain(loader);
  EXPECT_EQ(next_epoch.size(), 7u);
  EXPECT_EQ(next_epoch[0].index_in_epoch, 0);
}

TEST(Loader, StartingANewEpochAbandonsTheOldOne) {
  Fixture f;
  LoaderOptions o;
  o.prefetch_depth = 2;
  Loader loader(f.ds, DistributedSampler(50, 1, 0, true, 3), 4, o);
  loader.start_epoch(0);
  ASSERT_TRUE(loader.next().has_value());
  loader.start_epoch(1);
  auto batches = drain(loader);
  ASSERT_EQ(batches.size(), 13u);
  for (std::size_t b = 0; b < batches.size(); ++b) {
    EXPECT_EQ(batches[b].epoch, 1);
    EXPECT_EQ(batches[b].index_in_epoch, static_cast<std::int64_t>(b));
  }
}

TEST(Loader, DestructorDoesNotHangWhenTheConsumerStopsEarly) {
  Fixture f;
  LoaderOptions o;
  o.prefetch_depth = 1;
  {
    Loader loader(f.ds, DistributedSampler(50, 1, 0), 2, o);
    loader.start_epoch(0);
    ASSERT_TRUE(loader.next().has_value());
  }  // the thread is blocked on a full queue here
  { Loader never_started(f.ds, DistributedSampler(50, 1, 0), 2, o); }
  SUCCEED();
}

TEST(Loader, ReadErrorsInTheLoaderThreadAreRethrownInNext) {
  TempDir dir;
  SetSpec spec;
  spec.num_shards = 1;
  spec.num_samples = 40;
  spec.deflate_level = 1;
  spec.chunk_samples = 40;
  auto paths = write_set(dir.path(), spec);
  auto ds = ShardedDataset::open(paths[0], 0);
  // Damage the compressed chunk after open: the first read of /x happens in the loader thread.
  ASSERT_GT(damage_first_chunk(paths[0], 0x5A), 0u);
  Loader loader(ds, DistributedSampler(40, 1, 0), 8);
  loader.start_epoch(0);
  try {
    loader.next();
    FAIL() << "expected the read error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(paths[0]), std::string::npos) << e.what();
  }
  EXPECT_FALSE(loader.next().has_value());
}

TEST(Loader, CountsTheTimeTheConsumerWaitsAndResetsIt) {
  Fixture f;
  Loader loader(f.ds, DistributedSampler(50, 1, 0), 10);
  EXPECT_EQ(loader.data_wait_seconds(), 0.0);
  loader.start_epoch(0);
  drain(loader);
  EXPECT_GT(loader.data_wait_seconds(), 0.0);
  loader.reset_data_wait();
  EXPECT_EQ(loader.data_wait_seconds(), 0.0);
}

TEST(Loader, MisuseIsAnError) {
  Fixture f;
  EXPECT_THROW(Loader(f.ds, DistributedSampler(49, 1, 0), 8), Error);  // sampler for another set
  EXPECT_THROW(Loader(f.ds, DistributedSampler(50, 1, 0), 0), Error);
  Loader loader(f.ds, DistributedSampler(50, 1, 0), 8);
  EXPECT_THROW(loader.next(), Error);  // no epoch started
}
