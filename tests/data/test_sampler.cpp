// DistributedSampler follows PyTorch's DistributedSampler: one permutation per (seed, epoch),
// padded by wrapping (or truncated) to a multiple of the world size, rank r takes r, r+W, ...
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "lockstep/core/error.hpp"
#include "lockstep/data/sampler.hpp"

using namespace lockstep;
using namespace lockstep::data;

namespace {
std::vector<std::vector<std::int64_t>> all_ranks(std::int64_t n, int world, bool shuffle,
                                                 std::uint64_t seed, bool drop_last,
                                                 std::int64_t epoch) {
  std::vector<std::vector<std::int64_t>> out;
  for (int r = 0; r < world; ++r) {
    DistributedSampler s(n, world, r, shuffle, seed, drop_last);
    s.set_epoch(epoch);
    out.push_back(s.indices());
  }
  return out;
}
// Interleaves the ranks back into the epoch's order: position p = i*W + r.
std::vector<std::int64_t> interleave(const std::vector<std::vector<std::int64_t>>& ranks) {
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < ranks[0].size(); ++i)
    for (const auto& r : ranks)
      out.push_back(r[i]);
  return out;
}
}  // namespace

TEST(PhiloxPermutation, IsAPermutationAndAPureFunctionOfSeedAndStream) {
  auto p = philox_permutation(1000, 42, 3);
  auto sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (std::int64_t i = 0; i < 1000; ++i)
    EXPECT_EQ(sorted[i], i);
  EXPECT_EQ(p, philox_permutation(1000, 42, 3));
  EXPECT_NE(p, philox_permutation(1000, 43, 3));
  EXPECT_NE(p, philox_permutation(1000, 42, 4));
}

TEST(PhiloxPermutation, AllOrdersOfThreeAreAboutEquallyLikely) {
  std::map<std::vector<std::int64_t>, int> count;
  const int trials = 6000;
  for (int s = 0; s < trials; ++s)
    ++count[philox_permutation(3, 1, s)];
  ASSERT_EQ(count.size(), 6u);
  // Chi-square with 5 degrees of freedom; 20.5 is the 0.1% tail.
  double chi2 = 0;
  for (auto& [perm, c] : count)
    chi2 += (c - 1000.0) * (c - 1000.0) / 1000.0;
  EXPECT_LT(chi2, 20.5);
}

TEST(DistributedSampler, RanksPartitionThePaddedEpoch) {
  const std::int64_t n = 10;
  const int world = 4;  // 10 -> 12: the first two of the permutation appear twice
  auto ranks = all_ranks(n, world, true, 5, false, 0);
  for (const auto& r : ranks)
    EXPECT_EQ(r.size(), 3u);
  auto epoch = interleave(ranks);
  // Every index appears; exactly the first total-n positions are repeated at the end.
  std::multiset<std::int64_t> seen(epoch.begin(), epoch.end());
  for (std::int64_t i = 0; i < n; ++i)
    EXPECT_GE(seen.count(i), 1u) << i;
  EXPECT_EQ(epoch[10], epoch[0]);
  EXPECT_EQ(epoch[11], epoch[1]);
  std::set<std::int64_t> first_ten(epoch.begin(), epoch.begin() + 10);
  EXPECT_EQ(first_ten.size(), 10u);
}

TEST(DistributedSampler, UnshuffledMatchesPyTorchsPaddingByHand) {
  // torch DistributedSampler(range(5), num_replicas=3, shuffle=False):
  // indices [0,1,2,3,4,0]; rank0 [0,3], rank1 [1,4], rank2 [2,0].
  auto ranks = all_ranks(5, 3, false, 0, false, 0);
  EXPECT_EQ(ranks[0], (std::vector<std::int64_t>{0, 3}));
  EXPECT_EQ(ranks[1], (std::vector<std::int64_t>{1, 4}));
  EXPECT_EQ(ranks[2], (std::vector<std::int64_t>{2, 0}));
  // drop_last: [0,1,2] -> one each.
  auto dropped = all_ranks(5, 3, false, 0, true, 0);
  EXPECT_EQ(dropped[0], (std::vector<std::int64_t>{0}));
  EXPECT_EQ(dropped[2], (std::vector<std::int64_t>{2}));
  // Fewer samples than ranks wraps more than once: [0,1,0,1,0].
  auto wrapped = all_ranks(2, 5, false, 0, false, 0);
  EXPECT_EQ(interleave(wrapped), (std::vector<std::int64_t>{0, 1, 0, 1, 0}));
}

TEST(DistributedSampler, DropLastTruncatesToDistinctIndices) {
  auto ranks = all_ranks(10, 4, true, 9, true, 2);
  auto epoch = interleave(ranks);
  EXPECT_EQ(epoch.size(), 8u);
  EXPECT_EQ(std::set<std::int64_t>(epoch.begin(), epoch.end()).size(), 8u);
  DistributedSampler s(10, 4, 0, true, 9, true);
  EXPECT_EQ(s.num_samples(), 2);
  EXPECT_EQ(s.total_size(), 8);
}

TEST(DistributedSampler, EachEpochIsADifferentOrderAndTheSameSeedAndEpochRepeatIt) {
  DistributedSampler a(1000, 2, 1, true, 17);
  DistributedSampler b(1000, 2, 1, true, 17);
  a.set_epoch(3);
  b.set_epoch(3);
  EXPECT_EQ(a.indices(), b.indices());
  auto e3 = a.indices();
  a.set_epoch(4);
  EXPECT_NE(a.indices(), e3);
  DistributedSampler c(1000, 2, 1, true, 18);
  c.set_epoch(3);
  EXPECT_NE(c.indices(), e3);
  // Shuffled and unshuffled epochs hold the same samples.
  auto sorted = interleave(all_ranks(1000, 2, true, 17, false, 3));
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, interleave(all_ranks(1000, 2, false, 17, false, 3)));
}

TEST(DistributedSampler, BadArgumentsAreErrors) {
  EXPECT_THROW(DistributedSampler(10, 2, 2), Error);
  EXPECT_THROW(DistributedSampler(10, 0, 0), Error);
  EXPECT_THROW(DistributedSampler(0, 1, 0), Error);
  EXPECT_THROW(DistributedSampler(3, 4, 0, true, 0, true), Error);
}
