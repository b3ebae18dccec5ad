#include <gtest/gtest.h>

#include "lockstep/dist/reducer.hpp"

namespace lockstep::dist {
namespace {
std::vector<nn::Parameter> make_params(const std::vector<std::int64_t>& sizes) {
  std::vector<nn::Parameter> out;
  for (std::size_t i = 0; i < sizes.size(); ++i)
    out.push_back({"p" + std::to_string(i), Tensor::zeros({sizes[i]}), Tensor()});
  return out;
}
std::vector<nn::Parameter*> pointers(std::vector<nn::Parameter>& v) {
  std::vector<nn::Parameter*> out;
  for (auto& p : v)
    out.push_back(&p);
  return out;
}
}  // namespace

TEST(Buckets, FilledInReverseParameterOrderWithASmallFirstBucket) {
  // 4-byte floats: sizes in elements; first bucket limit 400 B = 100 floats, others 1000 floats.
  auto params = make_params({300, 50, 700, 20, 80, 60});
  auto layout = assign_buckets(pointers(params), {4000, 400});
  ASSERT_EQ(layout.size(), 2u);
  // Bucket 0 (ready first): the last parameters until >= 100 elements: 60 + 80.
  EXPECT_EQ(layout[0].params, (std::vector<std::size_t>{5, 4}));
  EXPECT_EQ(layout[0].numel, 140);
  // Then until >= 1000 elements: 20 + 700 + 50 = 770 < 1000, so 300 joins too (1070).
  EXPECT_EQ(layout[1].params, (std::vector<std::size_t>{3, 2, 1, 0}));
  EXPECT_EQ(layout[1].numel, 1070);
}

TEST(Buckets, ZeroLimitGivesOneBucketPerParameterAndHugeLimitOneBucket) {
  auto params = make_params({3, 5, 7});
  auto per_param = assign_buckets(pointers(params), {0, 0});
  ASSERT_EQ(per_param.size(), 3u);
  EXPECT_EQ(per_param[0].params, (std::vector<std::size_t>{2}));
  EXPECT_EQ(per_param[2].params, (std::vector<std::size_t>{0}));
  auto one = assign_buckets(pointers(params), {1u << 30, 1u << 30});
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].numel, 15);
}

TEST(Buckets, EveryParameterIsInExactlyOneBucket) {
  auto params = make_params({17, 1, 1024, 9, 333, 2048, 5});
  auto layout = assign_buckets(pointers(params), {2048, 512});
  std::vector<int> seen(params.size(), 0);
  std::int64_t total = 0;
  for (const auto& b : layout) {
    std::int64_t numel = 0;
    for (std::size_t k : b.params) {
      ++seen[k];
      numel += params[k].value.numel();
    }
    EXPECT_EQ(numel, b.numel);
    total += numel;
  }
  EXPECT_EQ(seen, std::vector<int>(params.size(), 1));
  EXPECT_EQ(total, 17 + 1 + 1024 + 9 + 333 + 2048 + 5);
}

}  // namespace lockstep::dist
