// ShardedDataset's ResidentAllocator: where an in-memory set lives. The data layer fills a block
// only when told to, tells the block's holders when it is done (or failed), and otherwise
// serves the bytes someone else put there. (The MPI node-shared allocator is tested in
// tests/train/mpi/test_node_shared_data.cpp.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <numeric>

#include "data_test_util.hpp"
#include "lockstep/data/dataset.hpp"

using namespace lockstep;
using namespace lockstep::data;
using namespace lockstep::data::testing;

namespace {
std::vector<std::uint8_t> all_bytes(const ShardedDataset& ds) {
  std::vector<std::int64_t> all(static_cast<std::size_t>(ds.size()));
  std::iota(all.begin(), all.end(), 0);
  Tensor x, y;
  ds.gather(all, x, y);
  const auto* p = static_cast<const std::uint8_t*>(x.raw_data());
  return {p, p + x.nbytes()};
}
}  // namespace

TEST(ResidentAllocator, AFillingHolderGetsTheSamplesInItsBlockAndIsToldWhenTheyAreThere) {
  TempDir dir;
  SetSpec spec;
  write_set(dir.path(), spec);
  auto block = std::make_shared<std::vector<std::uint8_t>>();
  std::vector<bool> filled;
  auto ds = ShardedDataset::open(
      dir / "train", kDefaultMemoryBudgetBytes, [&](std::int64_t bytes, const std::string& what) {
        EXPECT_NE(what.find("train-00000-of-00004.h5"), std::string::npos);
        block->resize(static_cast<std::size_t>(bytes));
        return ResidentBlock{block->data(), true, [&](bool ok) { filled.push_back(ok); }, block};
      });
  EXPECT_EQ(filled, std::vector<bool>{true});
  EXPECT_TRUE(ds->in_memory());
  EXPECT_FALSE(ds->shared_copy());
  std::vector<std::uint8_t> expected;
  for (std::int64_t i = 0; i < spec.num_samples; ++i) {
    auto s = reference_sample(spec, i);
    expected.insert(expected.end(), s.begin(), s.end());
  }
  EXPECT_EQ(*block, expected);  // in the caller's block, in the files' dtype (u8)
  EXPECT_EQ(all_bytes(*ds), expected);
}

TEST(ResidentAllocator, ANonFillingHolderReadsNothingAndServesTheBlocksBytes) {
  TempDir dir;
  SetSpec spec;
  write_set(dir.path(), spec);
  auto own = ShardedDataset::open(dir / "train");
  // "Another rank" already put the samples there: this holder must not read the files.
  auto block = std::make_shared<std::vector<std::uint8_t>>(all_bytes(*own));
  auto ds = ShardedDataset::open(dir / "train", kDefaultMemoryBudgetBytes,
                                 [&](std::int64_t bytes, const std::string&) {
                                   EXPECT_EQ(static_cast<std::size_t>(bytes), block->size());
                                   return ResidentBlock{block->data(), false, {}, block};
                                 });
  EXPECT_TRUE(ds->shared_copy());
  EXPECT_EQ(ds->bytes_read(), 0);
  EXPECT_EQ(all_bytes(*ds), *block);
}

TEST(ResidentAllocator, AFillerWhoseReadFailsTellsTheHoldersBeforeThrowing) {
  TempDir dir;
  SetSpec spec;
  // Shards of MiBs: a tiny file is wholly in HDF5's caches after open, and reads on unharmed.
  spec.num_samples = 4000;
  spec.sample_shape = {3, 32, 32};
  spec.chunk_samples = 64;
  auto files = write_set(dir.path(), spec);
  auto block = std::make_shared<std::vector<std::uint8_t>>();
  std::vector<bool> filled;
  std::string what;
  try {
    ShardedDataset::open(
        dir / "train", kDefaultMemoryBudgetBytes, [&](std::int64_t bytes, const std::string&) {
          // The files were checked at open; break one before the samples are read: its second
          // half overwritten, so the chunks fail their checksums. (Truncating it would not do:
          // HDF5 reads past the end of a file as zeros, and a zero chunk passes Fletcher-32;
          // a file truncated before open is refused at open.)
          const auto size = static_cast<std::streamoff>(std::filesystem::file_size(files[2]));
          std::fstream f(files[2], std::ios::in | std::ios::out | std::ios::binary);
          f.seekp(size / 2);
          const std::string junk(static_cast<std::size_t>(size - size / 2), 'Z');
          f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
          block->resize(static_cast<std::size_t>(bytes));
          return ResidentBlock{block->data(), true, [&](bool ok) { filled.push_back(ok); }, block};
        });
  } catch (const Error& e) {
    what = e.what();
  }
  EXPECT_EQ(filled, std::vector<bool>{false});
  EXPECT_NE(what.find("train-00002-of-00004.h5"), std::string::npos) << what;
}
