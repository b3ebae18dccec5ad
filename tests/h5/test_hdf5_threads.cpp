// Debian's libhdf5 is not thread-safe; lockstep serialises every HDF5 call behind one process-wide
// lock (lockstep/h5/h5.hpp). This runs what a training process does at once: a loader
// thread reading shards on demand while the main thread writes checkpoints and reads the test set.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "lockstep/data/dataset.hpp"
#include "lockstep/data/importers.hpp"
#include "lockstep/train/checkpoint.hpp"

namespace lockstep {

TEST(Hdf5Threads, OnDemandReadsAndCheckpointWritesRunConcurrentlyWithoutCorruption) {
  auto dir =
      std::filesystem::temp_directory_path() / ("lockstep_h5threads_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::int64_t n = 600;
  data::LabeledArray d;
  std::vector<std::uint8_t> pixels(static_cast<std::size_t>(n * 64));
  for (std::size_t i = 0; i < pixels.size(); ++i)
    pixels[i] = static_cast<std::uint8_t>((i * 7 + i / 64) % 251);
  d.x = Tensor::from_vector(pixels, {n, 1, 8, 8});
  for (std::int64_t i = 0; i < n; ++i)
    d.y.push_back(static_cast<std::int32_t>(i % 10));
  d.num_classes = 10;
  data::write_shard_set(d, dir.string(), "train", 3, {}, {});
  auto ds = data::ShardedDataset::open((dir / "train").string(), /*memory_budget_bytes=*/0);
  ASSERT_FALSE(ds->in_memory());

  std::atomic<bool> done{false};
  std::atomic<int> mismatches{0}, reads{0};
  std::thread reader([&] {
    Tensor x, y;
    std::vector<std::int64_t> idx(32);
    for (int round = 0; !done.load() || round < 50; ++round) {
      for (std::size_t j = 0; j < idx.size(); ++j)
        idx[j] = (round * 37 + static_cast<std::int64_t>(j) * 13) % n;
      ds->gather(idx, x, y);
      const auto* px = x.data<std::uint8_t>();
      for (std::size_t j = 0; j < idx.size(); ++j) {
        std::size_t first = static_cast<std::size_t>(idx[j] * 64);
        if (px[j * 64] != pixels[first] || px[j * 64 + 63] != pixels[first + 63]) ++mismatches;
      }
      ++reads;
    }
  });
  for (int k = 0; k < 20; ++k) {
    train::CheckpointState state;
    state.step = k + 1;
    state.tensors.emplace_back(
        "param/w", Tensor::from_vector(std::vector<float>(4096, static_cast<float>(k)), {4096}));
    std::string path = train::checkpoint_path((dir / "ck").string(), k + 1);
    std::filesystem::create_directories(dir / "ck");
    train::write_checkpoint(path, state);
    EXPECT_EQ(train::read_checkpoint(path).tensor("param/w").to_vector<float>()[17],
              static_cast<float>(k));
  }
  done = true;
  reader.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_GE(reads.load(), 50);
  std::filesystem::remove_all(dir);
}

}  // namespace lockstep
