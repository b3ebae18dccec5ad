// Gradient buckets: the Reducer's bucket rule (PyTorch DDP's) as the flat layout applies it.
#include <gtest/gtest.h>

#include "lockstep/parallel/reducer.hpp"

namespace lockstep::parallel {
namespace {
std::vector<nn::Parameter> make_params(const std::vector<std::int64_t>& sizes) {
  std::vector<nn::Parameter> out;
  for (std::size_t i = 0; i < sizes.size(); ++i)
    out.push_back(
        {std::string("p").append(std::to_string(i)), Tensor::zeros({sizes[i]}), Tensor()});
  return out;
}
std::vector<nn::Parameter*> pointers(std::vector<nn::Parameter>& v) {
  std::vector<nn::Parameter*> out;
  for (auto& p : v)
    out.push_back(&p);
  return out;
}
std::vector<optim::FlatBucket> buckets(std::vector<nn::Parameter>& params,
                                       const ReducerOptions& options) {
  return optim::FlatLayout::build(pointers(params), bucket_limits(options)).buckets();
}
std::int64_t data_numel(const std::vector<nn::Parameter>& params, const optim::FlatBucket& b) {
  std::int64_t n = 0;
  for (std::size_t k : b.params)
    n += params[k].value.numel();
  return n;
}
}  // namespace

TEST(Buckets, FilledInReverseParameterOrderWithASmallFirstBucket) {
  // 4-byte floats: sizes in elements; first bucket limit 400 B = 100 floats, others 1000 floats.
  auto params = make_params({300, 50, 700, 20, 80, 60});
  auto layout = buckets(params, {4000, 400});
  ASSERT_EQ(layout.size(), 2u);
  // Bucket 0 (ready first): the last parameters until >= 100 elements: 60 + 80.
  EXPECT_EQ(layout[0].params, (std::vector<std::size_t>{5, 4}));
  EXPECT_EQ(data_numel(params, layout[0]), 140);
  // Then until >= 1000 elements: 20 + 700 + 50 = 770 < 1000, so 300 joins too (1070).
  EXPECT_EQ(layout[1].params, (std::vector<std::size_t>{3, 2, 1, 0}));
  EXPECT_EQ(data_numel(params, layout[1]), 1070);
}

TEST(Buckets, ZeroLimitGivesOneBucketPerParameterAndHugeLimitOneBucket) {
  auto params = make_params({3, 5, 7});
  auto per_param = buckets(params, {0, 0});
  ASSERT_EQ(per_param.size(), 3u);
  EXPECT_EQ(per_param[0].params, (std::vector<std::size_t>{2}));
  EXPECT_EQ(per_param[2].params, (std::vector<std::size_t>{0}));
  auto one = buckets(params, {1u << 30, 1u << 30});
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(data_numel(params, one[0]), 15);
}

TEST(Buckets, EveryParameterIsInExactlyOneBucketAndBucketsAreConsecutiveAlignedRanges) {
  auto params = make_params({17, 1, 1024, 9, 333, 2048, 5});
  auto layout = buckets(params, {2048, 512});
  std::vector<int> seen(params.size(), 0);
  std::int64_t total = 0, end = 0;
  for (const auto& b : layout) {
    for (std::size_t k : b.params)
      ++seen[k];
    total += data_numel(params, b);
    EXPECT_EQ(b.begin, end) << "buckets follow each other";
    EXPECT_EQ(b.begin % (ops::kFlatAlignBytes / 4), 0);
    EXPECT_GE(b.numel(), data_numel(params, b));
    end = b.end;
  }
  EXPECT_EQ(seen, std::vector<int>(params.size(), 1));
  EXPECT_EQ(total, 17 + 1 + 1024 + 9 + 333 + 2048 + 5);
}

}  // namespace lockstep::parallel
