// Training augmentation (lockstep/data/augment.hpp): each transform does what its name says, and
// a sample's augmentation depends only on (seed, epoch, dataset index), so two ranks' loaders
// produce exactly the samples one rank's loader produces.
#include <gtest/gtest.h>

#include <map>
#include <numeric>

#include "data_test_util.hpp"
#include "lockstep/data/augment.hpp"
#include "lockstep/data/loader.hpp"

namespace lockstep::data {
namespace {

// A [3, H, W] sample whose every byte says where it is: channel c, row y, column x.
std::vector<std::uint8_t> coordinates(int H, int W) {
  std::vector<std::uint8_t> s(static_cast<std::size_t>(3 * H * W));
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < H; ++y)
      for (int x = 0; x < W; ++x)
        s[static_cast<std::size_t>((c * H + y) * W + x)] =
            static_cast<std::uint8_t>(c * 80 + y * 8 + x);
  return s;
}

TEST(Augment, SameSeedEpochAndSampleGiveTheSameBytesAndOthersDiffer) {
  AugmentOptions o;
  o.random_resized_crop = o.flip = true;
  o.pad_crop = 2;
  o.seed = 5;
  const auto base = coordinates(8, 8);
  auto run = [&](std::int64_t epoch, std::int64_t index) {
    auto s = base;
    augment_sample(s.data(), 3, 8, 8, o, epoch, index);
    return s;
  };
  EXPECT_EQ(run(1, 7), run(1, 7));
  int differ = 0;
  for (int i = 0; i < 10; ++i)
    differ += run(1, i) != run(2, i);
  EXPECT_GE(differ, 8);  // another epoch, another crop (almost always)
  AugmentOptions off;
  auto s = base;
  augment_sample(s.data(), 3, 8, 8, off, 1, 7);
  EXPECT_EQ(s, base);
}

TEST(Augment, FlipMirrorsRowsAboutHalfTheTime) {
  AugmentOptions o;
  o.flip = true;
  const auto base = coordinates(4, 6);
  auto mirrored = base;
  for (int r = 0; r < 12; ++r)
    std::reverse(mirrored.begin() + r * 6, mirrored.begin() + (r + 1) * 6);
  int flips = 0;
  for (int i = 0; i < 200; ++i) {
    auto s = base;
    augment_sample(s.data(), 3, 4, 6, o, 0, i);
    ASSERT_TRUE(s == base || s == mirrored) << i;
    flips += s == mirrored;
  }
  EXPECT_GT(flips, 70);
  EXPECT_LT(flips, 130);
}

TEST(Augment, PadCropShiftsTheSampleByAtMostThePadding) {
  AugmentOptions o;
  o.pad_crop = 2;
  const auto base = coordinates(8, 8);
  for (int i = 0; i < 50; ++i) {
    auto s = base;
    augment_sample(s.data(), 3, 8, 8, o, 0, i);
    // Find the shift (dy, dx) in [-2, 2]^2 that explains every pixel: a copy or black padding.
    bool explained = false;
    for (int dy = -2; dy <= 2 && !explained; ++dy)
      for (int dx = -2; dx <= 2 && !explained; ++dx) {
        bool ok = true;
        for (int c = 0; c < 3 && ok; ++c)
          for (int y = 0; y < 8 && ok; ++y)
            for (int x = 0; x < 8 && ok; ++x) {
              const int sy = y + dy, sx = x + dx;
              const int want = sy < 0 || sy >= 8 || sx < 0 || sx >= 8
                                   ? 0
                                   : base[static_cast<std::size_t>((c * 8 + sy) * 8 + sx)];
              ok = s[static_cast<std::size_t>((c * 8 + y) * 8 + x)] == want;
            }
        explained = ok;
      }
    EXPECT_TRUE(explained) << "sample " << i << " is not a shifted copy";
  }
}

TEST(Augment, RandomResizedCropZoomsIntoTheSample) {
  // Left half 0, right half 200: a crop of scale <= 0.25 is scaled back to 16x16, so most
  // samples show mostly one side (a whole-sample copy would be half and half every time).
  AugmentOptions o;
  o.random_resized_crop = true;
  o.scale_min = 0.05;
  o.scale_max = 0.25;
  std::vector<std::uint8_t> base(3 * 16 * 16, 0);
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 16; ++y)
      for (int x = 8; x < 16; ++x)
        base[static_cast<std::size_t>((c * 16 + y) * 16 + x)] = 200;
  int one_sided = 0;
  for (int i = 0; i < 40; ++i) {
    auto s = base;
    augment_sample(s.data(), 3, 16, 16, o, 0, i);
    const double mean = std::accumulate(s.begin(), s.end(), 0.0) / static_cast<double>(s.size());
    one_sided += mean < 40 || mean > 160;
    EXPECT_EQ(s[0] == s[256], true);  // channels stay aligned
  }
  EXPECT_GE(one_sided, 20);
}

TEST(Augment, TwoRanksLoadersEqualOneRanksLoader) {
  testing::TempDir dir;
  testing::SetSpec spec;
  spec.num_samples = 24;
  spec.sample_shape = {3, 6, 6};
  testing::write_set(dir.path(), spec);
  auto ds = ShardedDataset::open(dir / "train");
  LoaderOptions opts;
  opts.augment.flip = opts.augment.random_resized_crop = true;
  opts.augment.pad_crop = 1;
  opts.augment.seed = 9;
  // One rank, batch 8: each batch's rows by dataset index.
  std::map<std::int64_t, std::vector<std::uint8_t>> one;
  Loader single(ds, DistributedSampler(24, 1, 0, true, 3), 8, opts);
  single.start_epoch(2);
  while (auto b = single.next())
    for (std::size_t i = 0; i < b->indices.size(); ++i)
      one[b->indices[i]].assign(b->x.data<std::uint8_t>() + i * 108,
                                b->x.data<std::uint8_t>() + (i + 1) * 108);
  ASSERT_EQ(one.size(), 24u);
  int augmented = 0;
  for (int rank = 0; rank < 2; ++rank) {
    Loader part(ds, DistributedSampler(24, 2, rank, true, 3), 4, opts);
    part.start_epoch(2);
    while (auto b = part.next())
      for (std::size_t i = 0; i < b->indices.size(); ++i) {
        std::vector<std::uint8_t> row(b->x.data<std::uint8_t>() + i * 108,
                                      b->x.data<std::uint8_t>() + (i + 1) * 108);
        EXPECT_EQ(row, one[b->indices[i]]) << "rank " << rank << ", sample " << b->indices[i];
        augmented += row != testing::reference_sample(spec, b->indices[i]);
      }
  }
  EXPECT_GE(augmented, 20);  // the loader did augment
}

}  // namespace
}  // namespace lockstep::data
