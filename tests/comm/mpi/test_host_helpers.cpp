// The trainer's host-side helpers (metric sums, config-hash checks) and barrier semantics.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "lockstep/comm/communicator.hpp"
#include "lockstep/core/error.hpp"
#include "support/mpi_env.hpp"

namespace lockstep::comm {
namespace {

using test::world;

TEST(MpiHostHelpers, AllreduceOfDoublesSumsMaxesAndMins) {
  const int W = world().size(), r = world().rank();
  std::vector<double> sum{0.25 * r, 1.0, -1.0 * r}, hi{1.0 * r, -1.0 * r}, lo{1.0 * r, -1.0 * r};
  world().allreduce(sum, ReduceOp::Sum);
  world().allreduce(hi, ReduceOp::Max);
  world().allreduce(lo, ReduceOp::Min);
  const double ranks_sum = W * (W - 1) / 2.0;
  EXPECT_EQ(sum, (std::vector<double>{0.25 * ranks_sum, 1.0 * W, -ranks_sum}));
  EXPECT_EQ(hi, (std::vector<double>{W - 1.0, 0.0}));
  EXPECT_EQ(lo, (std::vector<double>{0.0, 1.0 - W}));
}

TEST(MpiHostHelpers, AllreduceOfInt64KeepsValuesBeyond32Bits) {
  const int W = world().size(), r = world().rank();
  const std::int64_t big = std::int64_t{1} << 40;
  std::vector<std::int64_t> v{big + r, -big};
  world().allreduce(v, ReduceOp::Sum);
  EXPECT_EQ(v[0], W * big + W * (W - 1) / 2);
  EXPECT_EQ(v[1], -W * big);
  std::vector<std::int64_t> empty;
  world().allreduce(empty, ReduceOp::Sum);
  EXPECT_TRUE(empty.empty());
}

TEST(MpiHostHelpers, StringBroadcastReturnsRootsValueOfAnyLength) {
  const int W = world().size(), r = world().rank();
  const int root = W - 1;
  auto value_of = [](int rank) { return std::string(1000 + rank, static_cast<char>('a' + rank)); };
  EXPECT_EQ(world().broadcast(value_of(r), root), value_of(root));
  // An empty root value empties everybody's; other ranks' inputs are ignored.
  EXPECT_EQ(world().broadcast(r == 0 ? std::string() : value_of(r), 0), std::string());
  // Bytes, not C strings: embedded NULs survive.
  std::string binary("a\0b\0c", 5);
  EXPECT_EQ(world().broadcast(r == 0 ? binary : std::string(), 0), binary);
}

TEST(MpiHostHelpers, StringAllgatherReturnsEveryRanksValueByRank) {
  const int W = world().size(), r = world().rank();
  auto value_of = [](int rank) { return std::string(3 * rank, static_cast<char>('A' + rank)); };
  std::vector<std::string> all = world().allgather(value_of(r));
  ASSERT_EQ(static_cast<int>(all.size()), W);
  for (int q = 0; q < W; ++q)
    EXPECT_EQ(all[q], value_of(q)) << "rank " << q;
}

TEST(MpiHostHelpers, StringGatherReturnsEveryRanksValueOnRootOnly) {
  const int W = world().size(), r = world().rank();
  auto value_of = [](int rank) { return std::string(5 * rank + 1, static_cast<char>('a' + rank)); };
  for (int root : {0, W - 1}) {
    std::vector<std::string> all = world().gather(value_of(r), root);
    if (r != root) {
      EXPECT_TRUE(all.empty()) << "rank " << r << " is not root " << root;
      continue;
    }
    ASSERT_EQ(static_cast<int>(all.size()), W);
    for (int q = 0; q < W; ++q)
      EXPECT_EQ(all[q], value_of(q)) << "rank " << q << ", root " << root;
  }
  EXPECT_THROW(world().gather("x", W), Error);
}

TEST(MpiHostHelpers, CheckSameOnAllRanksNamesTheFirstDifferingRank) {
  const int W = world().size(), r = world().rank();
  EXPECT_NO_THROW(check_same_on_all_ranks(world(), "config hash", "5f3a9c"));
  const std::string mine = r == W - 1 ? "deadbeef" : "5f3a9c";
  try {
    check_same_on_all_ranks(world(), "config hash", mine);
    ADD_FAILURE() << "differing values were not reported";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("config hash differs"), std::string::npos) << message;
    EXPECT_NE(message.find("rank " + std::to_string(W - 1) + " has \"deadbeef\""),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("rank 0 has \"5f3a9c\""), std::string::npos) << message;
  }
}

TEST(MpiHostHelpers, BarrierMakesEveryRanksFileVisibleAfterIt) {
  const int W = world().size(), r = world().rank();
  std::string dir;
  if (r == 0) {
    char templ[] = "/tmp/lockstep-barrier-XXXXXX";
    EXPECT_NE(mkdtemp(templ), nullptr);
    dir = templ;
  }
  dir = world().broadcast(dir, 0);
  std::ofstream(dir + "/rank" + std::to_string(r)) << r;
  world().barrier();
  int seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    (void)entry;
    ++seen;
  }
  EXPECT_EQ(seen, W) << "files present in " << dir << " after the barrier";
  world().barrier_async()->wait();  // nobody deletes before everybody has counted
  if (r == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lockstep::comm
