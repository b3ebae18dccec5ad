// data.node_shared: the ranks of a node hold one copy of an in-memory set (local rank 0 fills
// shared memory, the others map it read-only). Training must not notice: the same bytes reach
// every rank, so DDP trains bitwise as with one private copy per rank.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "lockstep/comm/node_shared.hpp"
#include "lockstep/train/loop.hpp"
#include "lockstep/train/setup.hpp"
#include "support/mpi_env.hpp"
#include "support/tiny_run.hpp"

namespace lockstep::test {
namespace {

// A folder made by rank 0 and named to every rank; removed after the last rank is done.
struct SharedDir {
  std::unique_ptr<TempDir> dir;
  std::string path;
  explicit SharedDir(const std::function<void(const std::string&)>& make) {
    if (world().rank() == 0) {
      dir = std::make_unique<TempDir>();
      make(dir->path());
      path = dir->path();
    }
    path = world().broadcast(path, 0);
  }
  ~SharedDir() { world().barrier(); }
};

data::ResidentAllocator node_shared_allocator() {
  return [](std::int64_t bytes, const std::string& what) {
    comm::NodeSharedBlock b =
        comm::allocate_node_shared(world(), bytes, what, "set data.node_shared = off");
    return data::ResidentBlock{b.data, b.writer, b.published, b.mapping};
  };
}

std::vector<std::uint8_t> all_sample_bytes(const data::ShardedDataset& set) {
  std::vector<std::int64_t> all(static_cast<std::size_t>(set.size()));
  std::iota(all.begin(), all.end(), 0);
  Tensor x, y;
  set.gather(all, x, y);
  const auto* p = static_cast<const std::uint8_t*>(x.raw_data());
  return {p, p + x.nbytes()};
}

}  // namespace

TEST(NodeSharedData, EveryRankSeesTheBytesOfAPrivateCopyAndOnlyLocalRankZeroReadsThem) {
  // u8 images, as lockstep-shard writes Fashion-MNIST: they stay u8 in the shared block.
  SharedDir dir([](const std::string& d) {
    data::LabeledArray a;
    a.x = Tensor::empty({50, 1, 3, 5}, DType::U8);
    for (std::int64_t i = 0; i < a.x.numel(); ++i)
      a.x.data<std::uint8_t>()[i] = static_cast<std::uint8_t>((i * 37 + 11) % 256);
    for (int i = 0; i < 50; ++i)
      a.y.push_back(i % 4);
    a.num_classes = 4;
    data::write_shard_set(a, d, "img", 3, {0.5f}, {0.25f});
  });
  auto shared =
      data::ShardedDataset::open(dir.path + "/img", std::int64_t{1} << 30, node_shared_allocator());
  auto own = data::ShardedDataset::open(dir.path + "/img", std::int64_t{1} << 30);
  EXPECT_TRUE(shared->in_memory());
  EXPECT_EQ(shared->dtype(), DType::U8);
  EXPECT_EQ(all_sample_bytes(*shared), all_sample_bytes(*own));
  EXPECT_EQ(shared->labels(), own->labels());
  const bool leader = world().local_rank() == 0;
  EXPECT_EQ(shared->shared_copy(), !leader);
  EXPECT_EQ(shared->bytes_read(), leader ? 50 * 15 : 0);
}

TEST(NodeSharedData, DdpTrainsBitwiseAsWithOneCopyPerRank) {
  SharedDir dir([](const std::string& d) {
    write_tiny_set(d, "train");
    write_tiny_set(d, "test", TinySet{.samples = 32, .sample_stream = 5});
  });
  auto train = [&](const std::string& node_shared) {
    train::Config c = tiny_config(dir.path + "/train", dir.path + "/test");
    c.train_global_batch = 16;
    c.data_node_shared = node_shared;
    auto run = train::setup_run(c, world());
    EXPECT_EQ(run->train_set->shared_copy(), node_shared != "off" && world().local_rank() > 0);
    const train::TrainResult result = train::train_loop(*run);
    std::vector<float> values;
    for (const nn::Parameter* p : run->model->parameters()) {
      const auto v = p->value.to_vector<float>();
      values.insert(values.end(), v.begin(), v.end());
    }
    values.push_back(static_cast<float>(result.test_accuracy));
    return values;
  };
  const std::vector<float> shared = train("on"), own = train("off");
  ASSERT_EQ(shared.size(), own.size());
  EXPECT_EQ(std::memcmp(shared.data(), own.data(), shared.size() * sizeof(float)), 0)
      << "node-shared data changed the trained parameters";
  // auto shares exactly when several ranks run on this node, and trains the same.
  EXPECT_EQ(train("auto"), own);
}

TEST(NodeSharedData, ABlockTooLargeForDevShmIsAnErrorNamingTheDataSizeAndKey) {
  std::string what;
  try {
    comm::allocate_node_shared(world(), std::int64_t{1} << 60, "data.train (big-00000-of-00001.h5)",
                               "set data.node_shared = off");
  } catch (const Error& e) {
    what = e.what();
  }
  // Every local rank gets the error, not only the one that tried to create it.
  EXPECT_NE(what.find("data.train (big-00000-of-00001.h5)"), std::string::npos) << what;
  EXPECT_NE(what.find("/dev/shm"), std::string::npos) << what;
  EXPECT_NE(what.find("data.node_shared = off"), std::string::npos) << what;
  EXPECT_NE(what.find(format_bytes(static_cast<double>(std::int64_t{1} << 60))), std::string::npos)
      << what;
  // The communicator survived the failure: collectives still work.
  std::vector<std::int64_t> one = {1};
  world().allreduce(one, comm::ReduceOp::Sum);
  EXPECT_EQ(one[0], world().size());
}

TEST(NodeSharedData, RanksThatDisagreeOnTheSettingAreStoppedByTheConfigCheck) {
  SharedDir dir([](const std::string& d) { write_tiny_set(d, "train"); });
  train::Config c = tiny_config(dir.path + "/train");
  c.data_node_shared = world().rank() == 0 ? "on" : "off";
  std::string what;
  try {
    train::setup_run(c, world());
  } catch (const Error& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("config differs between ranks"), std::string::npos) << what;
  EXPECT_NE(what.find("data.node_shared"), std::string::npos) << what;
}

}  // namespace lockstep::test
