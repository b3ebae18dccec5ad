// Encoded image shards (docs/IMAGES.md, "Storage"): the files' own JPEG/PNG bytes, decoded by the
// loader. Evaluation gives exactly the samples raw storage stores; the random-resized-crop of the
// original photo depends only on (seed, epoch, index), so two ranks' loaders equal one rank's;
// a JPEG is decoded at the smallest DCT scale the crop allows, and that changes the crop's pixels
// by no more than the scale's rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>

#include "lockstep/core/error.hpp"
#include "lockstep/data/augment.hpp"
#include "lockstep/data/dataset.hpp"
#include "lockstep/data/image.hpp"
#include "lockstep/data/image_folder.hpp"
#include "lockstep/data/loader.hpp"
#include "support/image_files.hpp"
#include "support/temp_dir.hpp"

namespace lockstep::data {
namespace {

using test::encode_jpeg;
using test::TempDir;
using test::write_bytes;
using test::write_png;

// w x h RGB with detail at every scale (gradients and a checker), so that a crop, a scale or an
// offset that is off by a pixel shows.
std::vector<std::uint8_t> textured(int w, int h, int seed) {
  std::vector<std::uint8_t> px(static_cast<std::size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      auto* p = &px[(static_cast<std::size_t>(y) * w + x) * 3];
      p[0] = static_cast<std::uint8_t>((x * 255) / w);
      p[1] = static_cast<std::uint8_t>((y * 255) / h);
      p[2] = static_cast<std::uint8_t>(((x / 7 + y / 5 + seed) % 2) * 160 + seed * 9 % 60);
    }
  return px;
}

// A folder of two classes: JPEGs and PNGs of several sizes and shapes, one turned by EXIF.
ImageList make_folder(const std::filesystem::path& root) {
  const int sizes[][2] = {{40, 30}, {30, 40}, {64, 64}, {100, 37}, {23, 50}, {80, 60}};
  for (int c = 0; c < 2; ++c) {
    const auto dir = root / (c == 0 ? "a" : "b");
    std::filesystem::create_directories(dir);
    for (int i = 0; i < 6; ++i) {
      const int w = sizes[i][0], h = sizes[i][1], seed = c * 6 + i;
      const auto name = dir / ("img" + std::to_string(i));
      if (i % 3 == 2) {
        write_png(name.string() + ".png", w, h, PNG_COLOR_TYPE_RGB, 8, textured(w, h, seed));
      } else {
        auto jpeg = encode_jpeg(w, h, textured(w, h, seed), TJPF_RGB, 90);
        if (i == 4) jpeg = test::with_exif_orientation(jpeg, 6);
        write_bytes(name.string() + ".jpg", jpeg);
      }
    }
  }
  return list_image_folder(root.string(), false);
}

// The list converted into `shards` shards of `storage` at OUT/train-*.
std::shared_ptr<ShardedDataset> convert(const ImageList& list, const std::filesystem::path& out,
                                        SampleStorage storage, std::int64_t side,
                                        std::int64_t shards = 2, bool jpeg_restarts = true) {
  std::filesystem::create_directories(out);
  ShardMeta meta;
  meta.num_shards = shards;
  meta.num_classes = list.num_classes;
  meta.sample_shape = {3, side, side};
  meta.storage = storage;
  ImageShardOptions opts;
  opts.side = side;
  opts.storage = storage;
  opts.jpeg_restarts = jpeg_restarts;
  const auto m = static_cast<std::int64_t>(list.paths.size());
  for (std::int64_t s = 0; s < shards; ++s) {
    meta.shard_index = s;
    ImageShard shard = convert_image_shard(
        list, image_shard_begin(m, s, shards), image_shard_begin(m, s + 1, shards),
        (out / shard_file_name("train", s, shards)).string(), meta, opts);
    shard.writer->set_stats({0.5f, 0.5f, 0.5f}, {0.25f, 0.25f, 0.25f});
    shard.writer->close();
  }
  return ShardedDataset::open((out / "train").string());
}

// Every sample a loader gives in one epoch, by dataset index.
std::map<std::int64_t, std::vector<std::uint8_t>> epoch_samples(std::shared_ptr<ShardedDataset> ds,
                                                                int world, int rank,
                                                                std::int64_t batch,
                                                                const LoaderOptions& opts,
                                                                std::int64_t epoch) {
  std::map<std::int64_t, std::vector<std::uint8_t>> out;
  const auto bytes = static_cast<std::size_t>(ds->sample_bytes());
  Loader loader(ds, DistributedSampler(ds->size(), world, rank, true, 3), batch, opts);
  loader.start_epoch(epoch);
  while (auto b = loader.next())
    for (std::size_t i = 0; i < b->indices.size(); ++i)
      out[b->indices[i]].assign(b->x.data<std::uint8_t>() + i * bytes,
                                b->x.data<std::uint8_t>() + (i + 1) * bytes);
  return out;
}

TEST(EncodedImages, EvaluationSamplesEqualTheRawStoragesBytes) {
  TempDir dir;
  const ImageList list = make_folder(dir / "in");
  for (std::int64_t side : {16, 24}) {  // 16: some JPEGs decode at 1/2
    auto raw = convert(list, dir / ("raw" + std::to_string(side)), SampleStorage::Raw, side);
    auto enc = convert(list, dir / ("enc" + std::to_string(side)), SampleStorage::Encoded, side);
    ASSERT_EQ(enc->storage(), SampleStorage::Encoded);
    ASSERT_FALSE(enc->in_memory());
    ASSERT_EQ(enc->size(), 12);
    std::vector<std::int64_t> all(12);
    for (int i = 0; i < 12; ++i)
      all[static_cast<std::size_t>(i)] = 11 - i;
    Tensor xr, yr, xe, ye;
    raw->gather(all, xr, yr);
    enc->gather(all, xe, ye);
    ASSERT_EQ(xe.shape(), xr.shape());
    EXPECT_EQ(0, std::memcmp(xe.raw_data(), xr.raw_data(), static_cast<std::size_t>(xr.numel())))
        << "side " << side;
    EXPECT_EQ(0, std::memcmp(ye.raw_data(), yr.raw_data(), 12 * sizeof(std::int32_t)));
  }
}

TEST(EncodedImages, FlipAndPadCropWithoutCropEqualRawStorageAugmented) {
  TempDir dir;
  const ImageList list = make_folder(dir / "in");
  auto raw = convert(list, dir / "raw", SampleStorage::Raw, 16);
  auto enc = convert(list, dir / "enc", SampleStorage::Encoded, 16);
  LoaderOptions opts;
  opts.augment.flip = true;
  opts.augment.pad_crop = 2;
  opts.augment.seed = 4;
  EXPECT_EQ(epoch_samples(enc, 1, 0, 5, opts, 1), epoch_samples(raw, 1, 0, 5, opts, 1));
}

TEST(EncodedImages, CropOfTheOriginalIsTheSameOnAnyRankAndRerun) {
  TempDir dir;
  const ImageList list = make_folder(dir / "in");
  auto enc = convert(list, dir / "enc", SampleStorage::Encoded, 16);
  LoaderOptions opts;
  opts.augment.random_resized_crop = opts.augment.flip = true;
  opts.augment.seed = 9;
  const auto one = epoch_samples(enc, 1, 0, 8, opts, 2);
  ASSERT_EQ(one.size(), 12u);
  EXPECT_EQ(one, epoch_samples(enc, 1, 0, 8, opts, 2));  // rerun
  opts.decode_threads = 3;                               // threads change nothing
  for (int rank = 0; rank < 2; ++rank)
    for (const auto& [index, sample] : epoch_samples(enc, 2, rank, 4, opts, 2))
      EXPECT_EQ(sample, one.at(index)) << "rank " << rank << ", sample " << index;
  // The crop did crop: most samples differ from the evaluation sample and from another epoch's.
  Tensor x, y;
  std::vector<std::int64_t> all(12);
  for (int i = 0; i < 12; ++i)
    all[static_cast<std::size_t>(i)] = i;
  enc->gather(all, x, y);
  const auto other = epoch_samples(enc, 1, 0, 8, opts, 3);
  int cropped = 0, changed = 0;
  for (std::int64_t i = 0; i < 12; ++i) {
    const auto* eval = x.data<std::uint8_t>() + i * enc->sample_bytes();
    cropped += !std::equal(one.at(i).begin(), one.at(i).end(), eval);
    changed += one.at(i) != other.at(i);
  }
  EXPECT_GE(cropped, 10);
  EXPECT_GE(changed, 10);
}

TEST(EncodedImages, TheDecodeScaleIsTheSmallestTheCropAllows) {
  // Only 1/2, 1/4 and 1/8, each side rounded up as libjpeg-turbo scales it.
  EXPECT_EQ(jpeg_scale_denominator(500, 375, 224), 1);  // 188 < 224
  EXPECT_EQ(jpeg_scale_denominator(500, 375, 160), 2);  // 188
  EXPECT_EQ(jpeg_scale_denominator(500, 375, 64), 4);   // 94; 1/8 would be 47
  EXPECT_EQ(jpeg_scale_denominator(1000, 1000, 100), 8);
  EXPECT_EQ(jpeg_scale_denominator(500, 375, 0), 1);

  // A 400x300 photo; a square crop of a quarter of its area (173x173) at side 64 allows 1/2
  // (87 >= 64) but not 1/4 (44).
  const int W = 400, H = 300, side = 64;
  // Smooth detail (a period of about 60 pixels): what a DCT-scaled decode keeps.
  std::vector<std::uint8_t> px(static_cast<std::size_t>(W) * H * 3);
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x)
      for (int c = 0; c < 3; ++c)
        px[(static_cast<std::size_t>(y) * W + x) * 3 + c] = static_cast<std::uint8_t>(
            128 + 100 * std::sin(x / (9.0 + c)) * std::cos(y / (7.0 + c)));
  const auto jpeg = encode_jpeg(W, H, px, TJPF_RGB, 95);
  const EncodedImageInfo info = encoded_image_info(jpeg.data(), jpeg.size(), "photo");
  ASSERT_EQ(info.width, W);
  ASSERT_EQ(info.height, H);
  ASSERT_TRUE(info.jpeg);
  AugmentOptions o;
  o.random_resized_crop = true;
  o.scale_min = o.scale_max = 0.25;
  o.ratio_min = o.ratio_max = 1.0;
  o.seed = 1;
  const EncodedCrop crop = encoded_crop(info, side, o, 0, 5);
  EXPECT_EQ(crop.width, 173);
  EXPECT_EQ(crop.height, 173);
  EXPECT_EQ(crop.denominator, 2);
  // Without the crop the whole photo's shorter side, 300, allows 1/4 (75).
  EXPECT_EQ(encoded_crop(info, side, AugmentOptions{}, 0, 5).denominator, 4);

  // The crop decoded at 1/2 is the crop decoded at full size, up to the half-size decode's
  // rounding: a crop placed wrongly (by a pixel, or unscaled) would differ by far more.
  std::vector<std::uint8_t> got(3 * side * side), want(3 * side * side);
  decode_sample(jpeg.data(), jpeg.size(), "photo", side, o, 0, 5, got.data());
  const Image full = decode_image_scaled(jpeg.data(), jpeg.size(), "photo", 1);
  resize_region(full, crop.top, crop.left, crop.height, crop.width, side, side, want.data());
  double diff = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    diff += std::abs(int(got[i]) - int(want[i]));
  // The same crop one full-size pixel off differs by about 7 on average here; the 1/2 decode by
  // well under 1.
  std::vector<std::uint8_t> off(3 * side * side);
  resize_region(full, crop.top + 1, crop.left + 1, crop.height, crop.width, side, side, off.data());
  double off_diff = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    off_diff += std::abs(int(off[i]) - int(want[i]));
  EXPECT_GT(off_diff / static_cast<double>(got.size()), 4.0);
  EXPECT_LT(diff / static_cast<double>(got.size()), 1.0);
}

// A photo of a given layout: format -1 is a PNG (RGB), else a TurboJPEG pixel format.
struct Photo {
  const char* name;
  int w, h, format, subsamp, flags, orientation;
};

// Its pixels: smooth, with detail to the pixel.
std::vector<std::uint8_t> photo_pixels(const Photo& p) {
  const int channels = p.format == TJPF_GRAY ? 1 : p.format == TJPF_CMYK ? 4 : 3;
  std::vector<std::uint8_t> px(static_cast<std::size_t>(p.w) * p.h * channels);
  for (std::size_t i = 0; i < px.size(); ++i)
    px[i] = static_cast<std::uint8_t>(
        128 + 90 * std::sin(i % (p.w * channels) * 0.013 + i / (p.w * channels) * 0.021) +
        (i * 7919 % 23) - 11);
  return px;
}

// The JPEG of quality 90, turned by its EXIF orientation.
std::vector<std::uint8_t> photo_jpeg(const Photo& p) {
  auto bytes = encode_jpeg(p.w, p.h, photo_pixels(p), p.format, 90, p.subsamp, p.flags);
  if (p.orientation != 1) bytes = test::with_exif_orientation(bytes, p.orientation);
  return bytes;
}

TEST(EncodedImages, TheCropDecodesOnlyItsRegionToTheBytesOfACropOfTheWholeDecode) {
  // decode_sample decodes only the pixels the crop touches; the sample must be the bytes the
  // crop of the whole decoded image gives (how it was made before), for every JPEG layout (the
  // chroma upsampling at the region's edges), EXIF orientation, CMYK, progressive, and a PNG.
  const Photo photos[] = {
      {"4:2:0", 400, 300, TJPF_RGB, TJSAMP_420, 0, 1},
      {"4:2:2", 333, 250, TJPF_RGB, TJSAMP_422, 0, 1},
      {"4:4:4", 300, 301, TJPF_RGB, TJSAMP_444, 0, 1},
      {"progressive 4:2:0", 350, 270, TJPF_RGB, TJSAMP_420, TJFLAG_PROGRESSIVE, 1},
      {"4:2:0 turned by EXIF 6", 400, 300, TJPF_RGB, TJSAMP_420, 0, 6},
      {"4:2:2 turned by EXIF 3", 301, 222, TJPF_RGB, TJSAMP_422, 0, 3},
      {"4:2:0 mirrored by EXIF 7", 280, 360, TJPF_RGB, TJSAMP_420, 0, 7},
      {"grayscale", 300, 260, TJPF_GRAY, TJSAMP_GRAY, 0, 1},
      {"CMYK 4:2:0", 320, 240, TJPF_CMYK, TJSAMP_420, 0, 1},
      {"CMYK turned by EXIF 8", 320, 240, TJPF_CMYK, TJSAMP_444, 0, 8},
      {"PNG", 200, 150, -1, 0, 0, 1},
  };
  TempDir dir;
  AugmentOptions o;
  o.random_resized_crop = true;
  o.seed = 17;
  std::map<int, int> scales;
  for (const Photo& p : photos) {
    std::vector<std::uint8_t> bytes;
    if (p.format < 0) {
      write_png(dir / "p.png", p.w, p.h, PNG_COLOR_TYPE_RGB, 8, photo_pixels(p));
      bytes = read_image_bytes(dir / "p.png");
    } else {
      bytes = photo_jpeg(p);
    }
    const EncodedImageInfo info = encoded_image_info(bytes.data(), bytes.size(), p.name);
    for (std::int64_t side : {32, 100}) {
      std::vector<std::uint8_t> got(static_cast<std::size_t>(3 * side * side)), want(got.size());
      for (std::int64_t index = 0; index < 12; ++index) {
        decode_sample(bytes.data(), bytes.size(), p.name, side, o, 1, index, got.data());
        const EncodedCrop crop = encoded_crop(info, side, o, 1, index);
        ++scales[crop.denominator];
        const Image whole =
            decode_image_scaled(bytes.data(), bytes.size(), p.name, crop.denominator);
        const auto d = static_cast<double>(crop.denominator);
        resize_region(whole, crop.top / d, crop.left / d, crop.height / d, crop.width / d, side,
                      side, want.data());
        EXPECT_TRUE(got == want) << p.name << ", side " << side << ", sample " << index << ": crop "
                                 << crop.height << "x" << crop.width << " at (" << crop.top << ", "
                                 << crop.left << ") at 1/" << crop.denominator;
      }
    }
  }
  // Every DCT scale was exercised.
  for (int d : {1, 2, 4, 8})
    EXPECT_GT(scales[d], 0) << "1/" << d;
}

TEST(EncodedImages, ASampleThatFailsToDecodeIsNamedByShardAndIndex) {
  // Conversion decodes every file, so a shard holds only good bytes; a shard written otherwise
  // (here directly, with text for sample 1) fails in the loader with the sample's place named,
  // also when decode threads decode it.
  TempDir dir;
  const std::vector<std::uint8_t> good = encode_jpeg(40, 30, textured(40, 30, 1), TJPF_RGB, 90);
  const std::string text = "not an image";
  std::vector<std::uint8_t> bytes = good;
  bytes.insert(bytes.end(), text.begin(), text.end());
  bytes.insert(bytes.end(), good.begin(), good.end());
  const std::int64_t sizes[] = {static_cast<std::int64_t>(good.size()),
                                static_cast<std::int64_t>(text.size()),
                                static_cast<std::int64_t>(good.size())};
  const std::int32_t labels[] = {0, 1, 0};
  ShardMeta meta;
  meta.num_shards = 1;
  meta.num_classes = 2;
  meta.sample_shape = {3, 16, 16};
  meta.storage = SampleStorage::Encoded;
  const std::string path = dir / shard_file_name("train", 0, 1);
  {
    ShardWriter w(path, meta);
    w.append_encoded(bytes.data(), sizes, labels, 3);
    w.close();
  }
  auto ds = ShardedDataset::open(path);
  for (int threads : {1, 2}) {
    LoaderOptions opts;
    opts.augment.random_resized_crop = true;
    opts.decode_threads = threads;
    Loader loader(ds, DistributedSampler(3, 1, 0, false, 0), 3, opts);
    loader.start_epoch(0);
    std::string message;
    try {
      loader.next();
    } catch (const Error& e) {
      message = e.what();
    }
    EXPECT_NE(message.find(" (shard 0 of 1), sample 1: not a JPEG or PNG file"), std::string::npos)
        << threads << " threads: " << message;
  }
}

// Whether a JPEG holds a DRI (define restart interval) marker before its scan.
bool has_restart_interval(const std::vector<std::uint8_t>& jpeg) {
  for (std::size_t p = 2; p + 4 <= jpeg.size() && jpeg[p] == 0xFF;) {
    if (jpeg[p + 1] == 0xDD) return true;
    if (jpeg[p + 1] == 0xDA) return false;
    p += 2 + (std::size_t{jpeg[p + 2]} << 8 | jpeg[p + 3]);
  }
  return false;
}

// The pixels `r` (upright, at the decode's scale) of a region decode, row after row.
std::vector<std::uint8_t> pixels_of(const ImageRegion& region, const PixelRect& r) {
  std::vector<std::uint8_t> px;
  for (std::int64_t y = r.top; y < r.top + r.height; ++y) {
    const std::uint8_t* row = region.image.rgb.data() +
                              ((y - region.top) * region.image.width + (r.left - region.left)) * 3;
    px.insert(px.end(), row, row + r.width * 3);
  }
  return px;
}

TEST(EncodedImages, RestartMarkersKeepEveryPixelAndACropReadsOnlyTheIntervalsItTouches) {
  // jpeg_with_restarts re-encodes the coefficients as they are: every decode, whole at any scale
  // or a region (which then decodes from a JPEG cut out of the intervals it touches), gives the
  // bytes the original gives, for every layout, MCU rows of a prime number of MCUs (intervals of
  // one MCU) included. Widths: 400 4:2:0 (25 MCUs a row), 208 (13), 333 4:2:2 (21), 300 4:4:4
  // (38), 232 4:4:4 (29); 4:4:0's MCUs are 8 wide and 16 high, 4:1:1's 32 wide.
  const Photo photos[] = {
      {"4:2:0", 400, 300, TJPF_RGB, TJSAMP_420, 0, 1},
      {"4:2:0, 13 MCUs a row", 208, 150, TJPF_RGB, TJSAMP_420, 0, 1},
      {"4:2:2", 333, 250, TJPF_RGB, TJSAMP_422, 0, 1},
      {"4:4:4", 300, 301, TJPF_RGB, TJSAMP_444, 0, 1},
      {"4:4:4, 29 MCUs a row", 232, 97, TJPF_RGB, TJSAMP_444, 0, 1},
      {"4:4:0", 250, 200, TJPF_RGB, TJSAMP_440, 0, 1},
      {"4:1:1", 320, 120, TJPF_RGB, TJSAMP_411, 0, 1},
      {"progressive 4:2:0", 350, 270, TJPF_RGB, TJSAMP_420, TJFLAG_PROGRESSIVE, 1},
      {"4:2:0 turned by EXIF 6", 400, 300, TJPF_RGB, TJSAMP_420, 0, 6},
      {"4:2:2 mirrored by EXIF 7", 301, 222, TJPF_RGB, TJSAMP_422, 0, 7},
      {"grayscale", 300, 260, TJPF_GRAY, TJSAMP_GRAY, 0, 1},
      {"CMYK 4:2:0", 320, 240, TJPF_CMYK, TJSAMP_420, 0, 1},
      {"CMYK turned by EXIF 8", 320, 240, TJPF_CMYK, TJSAMP_444, 0, 8},
  };
  std::mt19937 rng(5);
  for (const Photo& p : photos) {
    const auto original = photo_jpeg(p);
    const auto recoded = jpeg_with_restarts(original.data(), original.size());
    ASSERT_FALSE(recoded.empty()) << p.name;
    EXPECT_TRUE(has_restart_interval(recoded)) << p.name;
    EXPECT_FALSE(has_restart_interval(original)) << p.name;
    const EncodedImageInfo info = encoded_image_info(original.data(), original.size(), p.name);
    const EncodedImageInfo info2 = encoded_image_info(recoded.data(), recoded.size(), p.name);
    EXPECT_EQ(info2.width, info.width) << p.name << ": the EXIF orientation was lost";
    EXPECT_EQ(info2.height, info.height) << p.name;
    int regions = 0;
    for (int d : {1, 2, 4, 8}) {
      const Image a = decode_image_scaled(original.data(), original.size(), p.name, d);
      const Image b = decode_image_scaled(recoded.data(), recoded.size(), p.name, d);
      ASSERT_EQ(b.width, a.width) << p.name << " at 1/" << d;
      ASSERT_EQ(b.height, a.height) << p.name << " at 1/" << d;
      EXPECT_TRUE(a.rgb == b.rgb) << p.name << ": the whole image at 1/" << d;
      for (int k = 0; k < 25; ++k) {
        PixelRect r;
        r.height = std::uniform_int_distribution<std::int64_t>(1, a.height)(rng);
        r.width = std::uniform_int_distribution<std::int64_t>(1, a.width)(rng);
        r.top = std::uniform_int_distribution<std::int64_t>(0, a.height - r.height)(rng);
        r.left = std::uniform_int_distribution<std::int64_t>(0, a.width - r.width)(rng);
        ImageRegion ra, rb;
        decode_image_region(original.data(), original.size(), p.name, d, r, ra);
        decode_image_region(recoded.data(), recoded.size(), p.name, d, r, rb);
        EXPECT_TRUE(pixels_of(ra, r) == pixels_of(rb, r))
            << p.name << " at 1/" << d << ": region " << r.height << "x" << r.width << " at ("
            << r.top << ", " << r.left << ")";
        ++regions;
      }
    }
    EXPECT_EQ(regions, 100);
  }

  // The cut reads only the intervals a region touches: damage in the first interval (all
  // 1-bits, no Huffman code) fails a decode of the whole image and of a region over it, and a
  // region away from it decodes to the undamaged file's pixels. The file's own bytes, without
  // restart markers, cannot: every region reads the damaged top-left corner's row.
  const Photo& p = photos[0];
  std::vector<std::uint8_t> px(static_cast<std::size_t>(p.w) * p.h * 3);
  for (std::size_t i = 0; i < px.size(); ++i)
    px[i] = static_cast<std::uint8_t>(i * 2654435761u >> 24);
  const auto original = encode_jpeg(p.w, p.h, px, TJPF_RGB, 90, TJSAMP_420);
  const auto recoded = jpeg_with_restarts(original.data(), original.size());
  ASSERT_FALSE(recoded.empty());
  // The first interval: from the end of the SOS header to the first RST0.
  std::size_t scan = 2;
  while (recoded[scan + 1] != 0xDA)
    scan += 2 + (std::size_t{recoded[scan + 2]} << 8 | recoded[scan + 3]);
  scan += 2 + (std::size_t{recoded[scan + 2]} << 8 | recoded[scan + 3]);
  std::size_t rst0 = scan;
  while (!(recoded[rst0] == 0xFF && recoded[rst0 + 1] == 0xD0))
    ++rst0;
  ASSERT_GE(rst0 - scan, 2u);
  auto damaged = recoded;
  for (std::size_t q = scan; q + 1 < rst0; q += 2) {
    damaged[q] = 0xFF;  // a stuffed 0xFF: eight 1-bits
    damaged[q + 1] = 0x00;
  }
  EXPECT_THROW(decode_image_scaled(damaged.data(), damaged.size(), "damaged", 1), Error);
  const PixelRect over{0, 0, 40, 40}, away{150, 200, 150, 200};
  ImageRegion got, want;
  EXPECT_THROW(decode_image_region(damaged.data(), damaged.size(), "damaged", 1, over, got), Error);
  decode_image_region(damaged.data(), damaged.size(), "damaged", 1, away, got);
  decode_image_region(original.data(), original.size(), "original", 1, away, want);
  EXPECT_TRUE(pixels_of(got, away) == pixels_of(want, away));
  // Not JPEGs it can re-encode: the caller keeps the bytes.
  TempDir dir;
  write_png(dir / "p.png", 8, 8, PNG_COLOR_TYPE_RGB, 8, textured(8, 8, 1));
  const auto png = read_image_bytes(dir / "p.png");
  EXPECT_TRUE(jpeg_with_restarts(png.data(), png.size()).empty());
  const std::vector<std::uint8_t> truncated(original.begin(),
                                            original.begin() + original.size() / 2);
  EXPECT_TRUE(jpeg_with_restarts(truncated.data(), truncated.size()).empty());
}

TEST(EncodedImages, ShardsHoldTheJpegsReEncodedWithRestartsOrAsTheyAre) {
  TempDir dir;
  const ImageList list = make_folder(dir / "in");
  auto recoded = convert(list, dir / "recoded", SampleStorage::Encoded, 16, 1);
  auto kept = convert(list, dir / "kept", SampleStorage::Encoded, 16, 1, false);
  const auto a = ShardFile::open(dir / "recoded/train-00000-of-00001.h5");
  const auto b = ShardFile::open(dir / "kept/train-00000-of-00001.h5");
  int jpegs = 0;
  for (std::size_t i = 0; i < list.paths.size(); ++i) {
    const auto file = read_image_bytes(list.paths[i]);
    std::vector<std::uint8_t> stored, as_is;
    a->read_encoded(static_cast<std::int64_t>(i), stored);
    b->read_encoded(static_cast<std::int64_t>(i), as_is);
    EXPECT_EQ(as_is, file) << list.paths[i];  // --jpeg-restarts=0: the file itself
    if (list.paths[i].ends_with(".png")) {
      EXPECT_EQ(stored, file) << list.paths[i];
      continue;
    }
    ++jpegs;
    EXPECT_NE(stored, file) << list.paths[i];
    EXPECT_TRUE(has_restart_interval(stored)) << list.paths[i];
    const Image x = decode_image_scaled(file.data(), file.size(), list.paths[i], 1);
    const Image y = decode_image_scaled(stored.data(), stored.size(), list.paths[i], 1);
    EXPECT_TRUE(x.width == y.width && x.height == y.height && x.rgb == y.rgb) << list.paths[i];
  }
  EXPECT_EQ(jpegs, 8);
  // The samples the loader makes are the same from either, evaluation and random crops (which
  // cut the re-encoded JPEGs) alike.
  LoaderOptions opts;
  EXPECT_EQ(epoch_samples(recoded, 1, 0, 5, opts, 0), epoch_samples(kept, 1, 0, 5, opts, 0));
  opts.augment.random_resized_crop = opts.augment.flip = true;
  opts.augment.seed = 4;
  for (std::int64_t epoch : {0, 1, 2})
    EXPECT_EQ(epoch_samples(recoded, 1, 0, 5, opts, epoch),
              epoch_samples(kept, 1, 0, 5, opts, epoch))
        << "epoch " << epoch;
}

TEST(EncodedImages, ShardsHoldTheFilesOwnBytesAndRefuseRawReads) {
  TempDir dir;
  const ImageList list = make_folder(dir / "in");
  auto enc = convert(list, dir / "enc", SampleStorage::Encoded, 16, 1, false);
  const auto shard = ShardFile::open(dir / "enc/train-00000-of-00001.h5");
  EXPECT_EQ(shard->meta().storage, SampleStorage::Encoded);
  EXPECT_GT(shard->meta().encoded_bytes, 0);
  std::vector<std::uint8_t> x(16 * 16 * 3);
  try {
    shard->read_x(0, 1, x.data());
    ADD_FAILURE() << "read_x of an encoded shard did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds encoded images"), std::string::npos) << e.what();
  }
  std::vector<std::uint8_t> bytes;
  shard->read_encoded(0, bytes);
  EXPECT_EQ(bytes, read_image_bytes(list.paths[0]));  // the file itself
}

}  // namespace
}  // namespace lockstep::data
