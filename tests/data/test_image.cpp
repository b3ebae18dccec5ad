// Image files to samples (lockstep/data/image.hpp, image_folder.hpp, cifar.hpp): every layout a
// JPEG or PNG may have decodes to the RGB a viewer shows, every broken file is an error naming
// it, an ImageFolder's labels follow its sorted class names, and CIFAR records keep their labels.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "lockstep/core/error.hpp"
#include "lockstep/data/cifar.hpp"
#include "lockstep/data/dataset.hpp"
#include "lockstep/data/image.hpp"
#include "lockstep/data/image_folder.hpp"
#include "support/image_files.hpp"
#include "support/temp_dir.hpp"

namespace lockstep::data {
namespace {

using test::encode_jpeg;
using test::solid;
using test::TempDir;
using test::write_bytes;
using test::write_png;

std::array<int, 3> pixel(const Image& img, std::int64_t x, std::int64_t y) {
  const auto* p = &img.rgb[static_cast<std::size_t>((y * img.width + x) * 3)];
  return {p[0], p[1], p[2]};
}

// The message of the Error that fn throws ("" if it throws none).
template <class F>
std::string error_of(F fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Image, JpegAndPngDecodeToTheirColours) {
  TempDir dir;
  write_bytes(dir / "a.jpg", encode_jpeg(20, 10, solid(20, 10, 200, 30, 30)));
  write_png(dir / "b.png", 20, 10, PNG_COLOR_TYPE_RGB, 8, solid(20, 10, 10, 220, 40));
  const Image a = read_image(dir / "a.jpg"), b = read_image(dir / "b.png");
  EXPECT_EQ(a.width, 20);
  EXPECT_EQ(a.height, 10);
  for (int c = 0; c < 3; ++c)
    EXPECT_NEAR(pixel(a, 5, 5)[c], (std::array{200, 30, 30})[c], 3);
  EXPECT_EQ(pixel(b, 19, 9), (std::array{10, 220, 40}));
}

TEST(Image, GrayscaleAndCmykJpegBecomeRgb) {
  TempDir dir;
  write_bytes(dir / "g.jpg", encode_jpeg(16, 16, std::vector<std::uint8_t>(256, 90), TJPF_GRAY));
  std::vector<std::uint8_t> cmyk(16 * 16 * 4);
  for (std::size_t i = 0; i < cmyk.size(); i += 4)  // inverted CMYK of pure red
    cmyk[i] = 255, cmyk[i + 1] = 0, cmyk[i + 2] = 0, cmyk[i + 3] = 255;
  write_bytes(dir / "k.jpg", encode_jpeg(16, 16, cmyk, TJPF_CMYK));
  const auto g = pixel(read_image(dir / "g.jpg"), 8, 8);
  EXPECT_NEAR(g[0], 90, 2);
  EXPECT_EQ(g[0], g[1]);
  EXPECT_EQ(g[1], g[2]);
  const auto k = pixel(read_image(dir / "k.jpg"), 8, 8);
  EXPECT_GE(k[0], 250);
  EXPECT_LE(k[1], 5);
  EXPECT_LE(k[2], 5);
}

TEST(Image, SixteenBitPalettedGrayAndAlphaPngBecomeEightBitRgb) {
  TempDir dir;
  std::vector<std::uint8_t> deep(4 * 4 * 3 * 2, 0);
  for (std::size_t i = 0; i < deep.size(); i += 6)
    deep[i] = 0xC8, deep[i + 1] = 0x00;  // red 0xC800 of 0xFFFF: 199.2 of 255
  write_png(dir / "deep.png", 4, 4, PNG_COLOR_TYPE_RGB, 16, deep);
  write_png(dir / "pal.png", 4, 4, PNG_COLOR_TYPE_PALETTE, 8, std::vector<std::uint8_t>(16, 1),
            {0, 0, 0, 12, 34, 56});
  write_png(dir / "gray.png", 4, 4, PNG_COLOR_TYPE_GRAY, 8, std::vector<std::uint8_t>(16, 77));
  std::vector<std::uint8_t> rgba(4 * 4 * 4, 0);
  for (std::size_t i = 0; i < rgba.size(); i += 4)
    rgba[i] = 100, rgba[i + 1] = 150, rgba[i + 2] = 200, rgba[i + 3] = 0;  // fully transparent
  write_png(dir / "alpha.png", 4, 4, PNG_COLOR_TYPE_RGB_ALPHA, 8, rgba);
  EXPECT_EQ(pixel(read_image(dir / "deep.png"), 0, 0), (std::array{199, 0, 0}));
  EXPECT_EQ(pixel(read_image(dir / "pal.png"), 3, 3), (std::array{12, 34, 56}));
  EXPECT_EQ(pixel(read_image(dir / "gray.png"), 1, 2), (std::array{77, 77, 77}));
  // Alpha is dropped, as PIL's convert("RGB") drops it: the colour stays.
  EXPECT_EQ(pixel(read_image(dir / "alpha.png"), 2, 2), (std::array{100, 150, 200}));
}

TEST(Image, ExifOrientationTurnsTheImageUpright) {
  TempDir dir;
  // Stored 32 wide and 16 high, the left half red; orientation 6 (rotate 90 clockwise to show)
  // makes it 16 wide and 32 high with the top half red.
  std::vector<std::uint8_t> px = solid(32, 16, 0, 0, 0);
  for (int y = 0; y < 16; ++y)
    for (int x = 0; x < 16; ++x)
      px[static_cast<std::size_t>((y * 32 + x) * 3)] = 255;
  write_bytes(dir / "r.jpg", test::with_exif_orientation(encode_jpeg(32, 16, px), 6));
  const Image img = read_image(dir / "r.jpg");
  ASSERT_EQ(img.width, 16);
  ASSERT_EQ(img.height, 32);
  EXPECT_GT(pixel(img, 8, 4)[0], 200);
  EXPECT_LT(pixel(img, 8, 28)[0], 50);
}

TEST(Image, BrokenFilesAreErrorsNamingTheFile) {
  TempDir dir;
  std::vector<std::uint8_t> noise(64 * 64 * 3);
  for (std::size_t i = 0; i < noise.size(); ++i)
    noise[i] = static_cast<std::uint8_t>(i * 131 % 251);
  const auto jpeg = encode_jpeg(64, 64, noise);
  write_bytes(dir / "cut.jpg",
              std::vector<std::uint8_t>(jpeg.begin(), jpeg.begin() + jpeg.size() * 3 / 4));
  write_bytes(dir / "zero.jpg", {});
  write_bytes(dir / "text.png", {'h', 'e', 'l', 'l', 'o'});
  std::filesystem::create_symlink("nowhere.jpg", dir / "link.jpg");
  const auto png_bytes = [&] {
    write_png(dir / "full.png", 64, 64, PNG_COLOR_TYPE_RGB, 8, noise);
    std::ifstream f(dir / "full.png", std::ios::binary);
    return std::vector<std::uint8_t>(std::istreambuf_iterator<char>(f), {});
  }();
  write_bytes(dir / "cut.png", std::vector<std::uint8_t>(png_bytes.begin(),
                                                         png_bytes.begin() + png_bytes.size() / 2));
  // A header claiming 60000 x 60000 pixels: refused before 10 GB are allocated.
  auto huge = encode_jpeg(8, 8, solid(8, 8, 1, 2, 3));
  for (std::size_t i = 2; i + 8 < huge.size(); ++i)
    if (huge[i] == 0xFF && huge[i + 1] == 0xC0) {  // SOF0: length, precision, height, width
      huge[i + 5] = huge[i + 7] = 0xEA;
      huge[i + 6] = huge[i + 8] = 0x60;
      break;
    }
  write_bytes(dir / "huge.jpg", huge);
  EXPECT_NE(error_of([&] {
              read_image(dir / "huge.jpg");
            }).find(dir / "huge.jpg: claims 60000x60000 pixels"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              read_image(dir / "cut.jpg");
            }).find(dir / "cut.jpg" + ": truncated or corrupt JPEG data"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              read_image(dir / "zero.jpg");
            }).find(dir / "zero.jpg" + ": empty file (0 bytes)"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              read_image(dir / "text.png");
            }).find(dir / "text.png" + ": not a JPEG or PNG file"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { read_image(dir / "link.jpg"); }).find(dir / "link.jpg" + ": cannot open"),
      std::string::npos);
  EXPECT_NE(error_of([&] {
              read_image(dir / "cut.png");
            }).find(dir / "cut.png" + ": cannot decode the PNG"),
            std::string::npos);
}

TEST(Image, CenterCropKeepsTheMiddleAndPadKeepsEverything) {
  // 30 wide, 10 high: red | green | blue thirds. Cropped to 10x10 only green is left; padded,
  // all three colours fit in the middle rows and the rows above and below are black.
  Image img{30, 10, solid(30, 10, 0, 0, 0)};
  for (int y = 0; y < 10; ++y)
    for (int x = 0; x < 30; ++x)
      img.rgb[static_cast<std::size_t>((y * 30 + x) * 3 + x / 10)] = 255;
  std::vector<std::uint8_t> out(3 * 10 * 10);
  resize_to_square(img, 10, ImageFit::CenterCrop, out.data());
  auto at = [&](int c, int y, int x) {
    return int(out[static_cast<std::size_t>((c * 10 + y) * 10 + x)]);
  };
  for (int x = 0; x < 10; ++x) {
    EXPECT_EQ(at(1, 5, x), 255) << x;
    EXPECT_EQ(at(0, 5, x), 0) << x;
  }
  resize_to_square(img, 9, ImageFit::Pad, out.data());
  auto pad = [&](int c, int y, int x) {
    return int(out[static_cast<std::size_t>((c * 9 + y) * 9 + x)]);
  };
  EXPECT_EQ(pad(0, 4, 1), 255);  // the scaled image is 9x3, rows 3..5
  EXPECT_EQ(pad(1, 4, 4), 255);
  EXPECT_EQ(pad(2, 4, 7), 255);
  EXPECT_EQ(pad(0, 0, 1) + pad(1, 8, 4), 0);
}

// ---- JPEG decoding through libjpeg's API: the pixels TurboJPEG gave, and regions of them.

// A w x h image of `channels` with smooth colour and noise, so that chroma subsampling, scaled
// IDCTs and upsampling all leave their marks.
std::vector<std::uint8_t> noisy(int w, int h, int channels, std::mt19937& rng) {
  std::vector<std::uint8_t> px(static_cast<std::size_t>(w) * h * channels);
  const double fx = 0.05 + (rng() % 100) * 1e-3, fy = 0.04 + (rng() % 100) * 1e-3;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < channels; ++c)
        px[(static_cast<std::size_t>(y) * w + x) * channels + c] =
            static_cast<std::uint8_t>(std::clamp(
                128 + 90 * std::sin(fx * x * (c + 1) + fy * y) + int(rng() % 41) - 20, 0.0, 255.0));
  return px;
}

struct JpegKind {
  const char* name;
  int format, subsamp, flags;
};
// Every layout libjpeg decodes differently: each chroma subsampling (4:2:2 and 4:2:0 upsample
// with the neighbouring samples), progressive, grayscale, CMYK (stored as YCCK).
const JpegKind kJpegKinds[] = {
    {"4:4:4", TJPF_RGB, TJSAMP_444, 0},
    {"4:2:2", TJPF_RGB, TJSAMP_422, 0},
    {"4:2:0", TJPF_RGB, TJSAMP_420, 0},
    {"4:4:0", TJPF_RGB, TJSAMP_440, 0},
    {"4:1:1", TJPF_RGB, TJSAMP_411, 0},
    {"progressive 4:2:0", TJPF_RGB, TJSAMP_420, TJFLAG_PROGRESSIVE},
    {"grayscale", TJPF_GRAY, TJSAMP_GRAY, 0},
    {"CMYK 4:2:0", TJPF_CMYK, TJSAMP_420, 0},
};

std::vector<std::uint8_t> encode_kind(const JpegKind& k, int w, int h, std::mt19937& rng) {
  const int channels = k.format == TJPF_GRAY ? 1 : k.format == TJPF_CMYK ? 4 : 3;
  return encode_jpeg(w, h, noisy(w, h, channels, rng), k.format, 90, k.subsamp, k.flags);
}

// The decode lockstep made before it used libjpeg's API: tjDecompress2 at 1/denominator with the
// accurate IDCT, inverted CMYK times K. (No EXIF: the tests' orientation is checked apart.)
Image turbojpeg_decode(const std::vector<std::uint8_t>& jpeg, int denominator) {
  tjhandle tj = tjInitDecompress();
  int w = 0, h = 0, subsamp = 0, colorspace = 0;
  EXPECT_EQ(tjDecompressHeader3(tj, jpeg.data(), jpeg.size(), &w, &h, &subsamp, &colorspace), 0);
  const tjscalingfactor f{1, denominator};
  const int sw = TJSCALED(w, f), sh = TJSCALED(h, f);
  const bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  std::vector<std::uint8_t> px(static_cast<std::size_t>(sw) * sh * (cmyk ? 4 : 3));
  EXPECT_EQ(tjDecompress2(tj, jpeg.data(), jpeg.size(), px.data(), sw, 0, sh,
                          cmyk ? TJPF_CMYK : TJPF_RGB, TJFLAG_ACCURATEDCT),
            0)
      << tjGetErrorStr2(tj);
  tjDestroy(tj);
  Image img{sw, sh, {}};
  if (!cmyk) {
    img.rgb = std::move(px);
    return img;
  }
  for (std::size_t i = 0; i < px.size(); i += 4)
    for (int c = 0; c < 3; ++c)
      img.rgb.push_back(static_cast<std::uint8_t>((px[i + c] * px[i + 3] + 127) / 255));
  return img;
}

TEST(Image, JpegsDecodeToTheirTurboJpegPixelsAtEveryScale) {
  std::mt19937 rng(3);
  for (const JpegKind& kind : kJpegKinds) {
    for (int i = 0; i < 3; ++i) {
      const int w = 9 + int(rng() % 120), h = 9 + int(rng() % 120);
      const auto jpeg = encode_kind(kind, w, h, rng);
      for (int d : {1, 2, 4, 8}) {
        const Image got = decode_image_scaled(jpeg.data(), jpeg.size(), "photo", d);
        const Image want = turbojpeg_decode(jpeg, d);
        ASSERT_EQ(got.width, want.width);
        ASSERT_EQ(got.height, want.height);
        EXPECT_TRUE(got.rgb == want.rgb) << kind.name << ", " << w << "x" << h << " at 1/" << d;
      }
    }
  }
}

// The pixels [r.top, ...) x [r.left, ...) of img.
std::vector<std::uint8_t> cut(const Image& img, const PixelRect& r) {
  std::vector<std::uint8_t> out;
  for (std::int64_t y = r.top; y < r.top + r.height; ++y) {
    const auto* row = &img.rgb[static_cast<std::size_t>((y * img.width + r.left) * 3)];
    out.insert(out.end(), row, row + r.width * 3);
  }
  return out;
}

TEST(Image, ARegionDecodesToTheWholeDecodesPixelsAndLittleMore) {
  std::mt19937 rng(5);
  int regions = 0;
  for (const JpegKind& kind : kJpegKinds) {
    for (int i = 0; i < 4; ++i) {
      const int w = 17 + int(rng() % 150), h = 17 + int(rng() % 150);
      auto jpeg = encode_kind(kind, w, h, rng);
      // Every EXIF orientation for one layout; upright and a quarter turn for the others.
      const int orientation = kind.subsamp == TJSAMP_420 && kind.flags == 0
                                  ? 1 + i * 2 + int(rng() % 2)
                              : i % 2 == 0 ? 1
                                           : 6;
      if (orientation != 1) jpeg = test::with_exif_orientation(jpeg, orientation);
      for (int d : {1, 2, 4, 8}) {
        const Image whole = decode_image_scaled(jpeg.data(), jpeg.size(), "photo", d);
        for (int k = 0; k < 12; ++k, ++regions) {
          PixelRect r;
          r.left = rng() % whole.width;
          r.top = rng() % whole.height;
          r.width = 1 + rng() % (whole.width - r.left);
          r.height = 1 + rng() % (whole.height - r.top);
          ImageRegion got;
          decode_image_region(jpeg.data(), jpeg.size(), "photo", d, r, got);
          const PixelRect inside{r.top - got.top, r.left - got.left, r.height, r.width};
          ASSERT_TRUE(inside.top >= 0 && inside.left >= 0 &&
                      inside.top + r.height <= got.image.height &&
                      inside.left + r.width <= got.image.width)
              << kind.name;
          EXPECT_TRUE(cut(got.image, inside) == cut(whole, r))
              << kind.name << ", orientation " << orientation << ", 1/" << d << ": " << r.height
              << "x" << r.width << " at (" << r.top << ", " << r.left << ") of " << whole.height
              << "x" << whole.width;
          // Only the rows asked for, and the columns with at most a block (iMCU, up to 32
          // columns) on the left and a pixel of margin on either side.
          EXPECT_EQ(got.image.height, r.height) << kind.name;
          EXPECT_LE(got.image.width, r.width + 31 + 2) << kind.name;
        }
      }
    }
  }
  EXPECT_EQ(regions, 8 * 4 * 4 * 12);
}

TEST(Image, ARegionAboveTheDamageOfATruncatedJpegDecodesAndOneBelowItFails) {
  std::mt19937 rng(9);
  const auto jpeg = encode_jpeg(64, 64, noisy(64, 64, 3, rng), TJPF_RGB, 90);
  const std::vector<std::uint8_t> cut_jpeg(jpeg.begin(), jpeg.begin() + jpeg.size() * 3 / 4);
  ImageRegion region;
  decode_image_region(cut_jpeg.data(), cut_jpeg.size(), "cut.jpg", 1, {0, 0, 16, 64}, region);
  EXPECT_TRUE(cut(region.image, {0, 0, 16, 64}) ==
              cut(decode_image_scaled(jpeg.data(), jpeg.size(), "whole.jpg", 1), {0, 0, 16, 64}));
  EXPECT_NE(error_of([&] {
              decode_image_region(cut_jpeg.data(), cut_jpeg.size(), "cut.jpg", 1, {48, 0, 16, 64},
                                  region);
            }).find("cut.jpg: truncated or corrupt JPEG data: Premature end of JPEG file"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] {
        decode_image_region(cut_jpeg.data(), cut_jpeg.size(), "cut.jpg", 1, {0, 60, 16, 5}, region);
      }).find("cut.jpg: region 16x5 at (0, 60) is outside the 64x64 image decoded at 1/1"),
      std::string::npos);
}

TEST(Image, AKeptBufferIsFreedOnlyWhenAnOutsizedImageGrewIt) {
  std::vector<std::uint8_t> usual(4 << 20), outsized(kKeptBufferBytes + 1);
  std::vector<float> rows(kKeptBufferBytes / sizeof(float) + 1);
  release_if_outsized(usual);
  release_if_outsized(outsized);
  release_if_outsized(rows);
  EXPECT_EQ(usual.size(), std::size_t{4} << 20);
  EXPECT_EQ(outsized.capacity(), 0u);
  EXPECT_EQ(rows.capacity(), 0u);
}

// ---- The resampler: the same bytes as the plain loops it replaced.

// lockstep's resampler as it was before it was vectorised (2d0c22e), kept as the reference:
// scalar loops, each output summing its taps in order from 0.
namespace plain {

struct AxisWeights {
  std::vector<std::int64_t> first;
  std::vector<std::vector<float>> weights;
};

AxisWeights axis_weights(std::int64_t in_len, double scale, double offset, std::int64_t out_len) {
  const double support = std::max(scale, 1.0);
  AxisWeights a;
  for (std::int64_t o = 0; o < out_len; ++o) {
    const double center = (static_cast<double>(o) + offset + 0.5) * scale;
    std::int64_t lo =
        std::max<std::int64_t>(0, static_cast<std::int64_t>(std::floor(center - support)));
    std::int64_t hi =
        std::min<std::int64_t>(in_len, static_cast<std::int64_t>(std::ceil(center + support)));
    std::vector<float> w;
    double total = 0;
    for (std::int64_t i = lo; i < hi; ++i) {
      const double d = std::abs((static_cast<double>(i) + 0.5 - center) / support);
      const double v = std::max(0.0, 1.0 - d);
      w.push_back(static_cast<float>(v));
      total += v;
    }
    if (total <= 0) {
      lo = std::clamp<std::int64_t>(static_cast<std::int64_t>(center), 0, in_len - 1);
      w.assign(1, 1.0f);
      total = 1;
    }
    for (auto& v : w)
      v = static_cast<float>(v / total);
    a.first.push_back(lo);
    a.weights.push_back(std::move(w));
  }
  return a;
}

std::uint8_t round_to_u8(float v) {
  if (!(v > 0.0f)) return 0;
  if (v >= 255.0f) return 255;
  const auto whole = static_cast<int>(v);
  return static_cast<std::uint8_t>(whole + (v - static_cast<float>(whole) >= 0.5f ? 1 : 0));
}

// Channel c of pixel (y, x) at at(c, y, x); output (y, x) to out[(c * out_h + y0 + y) * out_w +
// x0 + x]. The horizontal pass over every source row, then the vertical one, both in float.
template <class At>
void resample(At at, int channels, const AxisWeights& ax, const AxisWeights& ay, std::int64_t out_h,
              std::int64_t out_w, std::int64_t y0, std::int64_t x0, std::uint8_t* out) {
  std::int64_t rows_needed = 0;
  for (std::size_t y = 0; y < ay.first.size(); ++y)
    rows_needed =
        std::max(rows_needed, ay.first[y] + static_cast<std::int64_t>(ay.weights[y].size()));
  const auto nx = ax.first.size();
  std::vector<float> rows(static_cast<std::size_t>(rows_needed) * nx);
  for (int c = 0; c < channels; ++c) {
    for (std::int64_t y = 0; y < rows_needed; ++y)
      for (std::size_t x = 0; x < nx; ++x) {
        float r = 0;
        for (std::size_t k = 0; k < ax.weights[x].size(); ++k)
          r += ax.weights[x][k] *
               static_cast<float>(at(c, y, ax.first[x] + static_cast<std::int64_t>(k)));
        rows[static_cast<std::size_t>(y) * nx + x] = r;
      }
    for (std::size_t y = 0; y < ay.first.size(); ++y)
      for (std::size_t x = 0; x < nx; ++x) {
        float a = 0;
        for (std::size_t k = 0; k < ay.weights[y].size(); ++k)
          a += ay.weights[y][k] *
               rows[static_cast<std::size_t>(ay.first[y] + static_cast<std::int64_t>(k)) * nx + x];
        out[(c * out_h + y0 + static_cast<std::int64_t>(y)) * out_w + x0 +
            static_cast<std::int64_t>(x)] = round_to_u8(a);
      }
  }
}

}  // namespace plain

// Runs body twice: with the resampler's AVX-512 code allowed (where this CPU has AVX-512F and
// AVX-512BW it runs) and with it forbidden (the SIMD clones every x86-64 CPU runs).
template <class Body>
void with_and_without_avx512(Body body) {
  for (bool allow : {true, false}) {
    SCOPED_TRACE(allow ? "AVX-512 code allowed" : "AVX-512 code forbidden");
    const bool before = allow_avx512_resampler(allow);
    body();
    allow_avx512_resampler(before);
  }
}

void resizes_give_the_bytes_of_the_plain_loops() {
  // Mostly shrinking, as a crop to 224 does (three taps or more: the order of two does not
  // matter), and enough outputs (about 4 million) that a sum taken in another order shows: that
  // changes a few bytes in a million (the float sum lands on the other side of a half).
  std::mt19937 rng(11);
  for (int t = 0; t < 40; ++t) {
    const bool small = t < 4;
    const std::int64_t W = small ? 1 + rng() % 20 : 150 + rng() % 450;
    const std::int64_t H = small ? 1 + rng() % 20 : 150 + rng() % 450;
    const std::int64_t out_w = small ? 1 + rng() % 30 : 64 + rng() % 161;
    const std::int64_t out_h = small ? 1 + rng() % 30 : 64 + rng() % 161;
    Image img{W, H, noisy(static_cast<int>(W), static_cast<int>(H), 3, rng)};
    auto rgb = [&](int c, std::int64_t y, std::int64_t x) {
      return img.rgb[static_cast<std::size_t>((y * W + x) * 3 + c)];
    };
    std::vector<std::uint8_t> got(static_cast<std::size_t>(3 * out_h * out_w)), want(got.size());

    // A region with fractional edges (a crop placed on a JPEG decoded at 1/2, 1/4, 1/8).
    const double left = (rng() % (8 * W)) / 8.0, top = (rng() % (8 * H)) / 8.0;
    const double w = std::max(0.125, (rng() % static_cast<unsigned>(8 * (W - left) + 1)) / 8.0);
    const double h = std::max(0.125, (rng() % static_cast<unsigned>(8 * (H - top) + 1)) / 8.0);
    resize_region(img, top, left, h, w, out_h, out_w, got.data());
    auto region = [](double start, double len, std::int64_t out_len) {
      const auto first = static_cast<std::int64_t>(std::floor(start));
      const auto end = static_cast<std::int64_t>(std::ceil(start + len));
      const double scale = len / static_cast<double>(out_len);
      auto a = plain::axis_weights(end - first, scale, (start - static_cast<double>(first)) / scale,
                                   out_len);
      for (auto& f : a.first)
        f += first;
      return a;
    };
    plain::resample(rgb, 3, region(left, w, out_w), region(top, h, out_h), out_h, out_w, 0, 0,
                    want.data());
    EXPECT_TRUE(got == want) << "region " << h << "x" << w << " at (" << top << ", " << left
                             << ") of " << H << "x" << W << " to " << out_h << "x" << out_w;

    // A planar sample of 1 to 6 channels (raw storage's random-resized-crop).
    const int C = 1 + static_cast<int>(rng() % 6);
    const auto planar = noisy(static_cast<int>(W), static_cast<int>(H), C, rng);  // as planes
    const std::int64_t pl = rng() % W, pt = rng() % H;
    const std::int64_t pw = 1 + rng() % (W - pl), ph = 1 + rng() % (H - pt);
    std::vector<std::uint8_t> pgot(static_cast<std::size_t>(C * out_h * out_w)), pwant(pgot.size());
    resize_region(planar.data(), C, H, W, pt, pl, ph, pw, out_h, out_w, pgot.data());
    plain::resample(
        [&](int c, std::int64_t y, std::int64_t x) {
          return planar[static_cast<std::size_t>((c * H + pt + y) * W + pl + x)];
        },
        C, plain::axis_weights(pw, double(pw) / double(out_w), 0, out_w),
        plain::axis_weights(ph, double(ph) / double(out_h), 0, out_h), out_h, out_w, 0, 0,
        pwant.data());
    EXPECT_TRUE(pgot == pwant) << C << " planes, " << ph << "x" << pw << " at (" << pt << ", " << pl
                               << ") of " << H << "x" << W << " to " << out_h << "x" << out_w;
  }
}

void square_resizes_give_the_bytes_of_the_plain_loops() {
  std::mt19937 rng(13);
  for (int t = 0; t < 40; ++t) {
    const std::int64_t W = 1 + rng() % 120, H = 1 + rng() % 120, side = 1 + rng() % 60;
    Image img{W, H, noisy(static_cast<int>(W), static_cast<int>(H), 3, rng)};
    for (ImageFit fit : {ImageFit::CenterCrop, ImageFit::Pad}) {
      std::vector<std::uint8_t> got(static_cast<std::size_t>(3 * side * side));
      resize_to_square(img, side, fit, got.data());
      // resize_to_square's placement, as it was: the scaled image and the window in it.
      const std::int64_t shorter = std::min(W, H), longer = std::max(W, H);
      const std::int64_t reference = fit == ImageFit::CenterCrop ? shorter : longer;
      const double scale = static_cast<double>(reference) / static_cast<double>(side);
      auto scaled = [&](std::int64_t n) {
        if (n == reference) return side;
        return std::max<std::int64_t>(1, static_cast<std::int64_t>(std::llround(n / scale)));
      };
      const std::int64_t sw = scaled(W), sh = scaled(H), ow = sw - side, oh = sh - side;
      std::vector<std::uint8_t> want(got.size(), 0);
      plain::resample(
          [&](int c, std::int64_t y, std::int64_t x) {
            return img.rgb[static_cast<std::size_t>((y * W + x) * 3 + c)];
          },
          3,
          plain::axis_weights(W, double(W) / double(sw), ow >= 0 ? ow / 2 : 0, std::min(side, sw)),
          plain::axis_weights(H, double(H) / double(sh), oh >= 0 ? oh / 2 : 0, std::min(side, sh)),
          side, side, oh >= 0 ? 0 : -oh / 2, ow >= 0 ? 0 : -ow / 2, want.data());
      EXPECT_TRUE(got == want) << H << "x" << W << " to " << side << ", " << image_fit_name(fit);
    }
  }
}

TEST(Image, ResizesGiveTheBytesOfThePlainLoops) {
  with_and_without_avx512([] { resizes_give_the_bytes_of_the_plain_loops(); });
}
TEST(Image, SquareResizesGiveTheBytesOfThePlainLoops) {
  with_and_without_avx512([] { square_resizes_give_the_bytes_of_the_plain_loops(); });
}

TEST(ImageFolder, LabelsFollowSortedClassNamesAndFilesAreSorted) {
  TempDir dir;
  for (const char* c : {"zebra", "ant", "moose"}) {
    std::filesystem::create_directories(dir / c);
    write_bytes(dir / c + "/b.jpg", encode_jpeg(4, 4, solid(4, 4, 1, 2, 3)));
    write_png(dir / c + "/a.png", 4, 4, PNG_COLOR_TYPE_RGB, 8, solid(4, 4, 1, 2, 3));
    write_bytes(dir / c + "/notes.txt", {'x'});
  }
  const ImageList list = list_image_folder(dir.path(), false);
  EXPECT_EQ(list.class_names, (std::vector<std::string>{"ant", "moose", "zebra"}));
  ASSERT_EQ(list.paths.size(), 6u);
  EXPECT_EQ(list.paths[0], dir / "ant/a.png");
  EXPECT_EQ(list.paths[1], dir / "ant/b.jpg");
  EXPECT_EQ(list.paths[5], dir / "zebra/b.jpg");
  EXPECT_EQ(list.labels, (std::vector<std::int32_t>{0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(list.ignored_files, 3);
}

TEST(ImageFolder, AnEmptyClassIsAnErrorOrKeepsItsLabel) {
  TempDir dir;
  for (const char* c : {"a", "b", "c"})
    std::filesystem::create_directories(dir / c);
  write_bytes(dir / "a/1.jpg", encode_jpeg(4, 4, solid(4, 4, 1, 2, 3)));
  write_bytes(dir / "c/1.jpg", encode_jpeg(4, 4, solid(4, 4, 1, 2, 3)));
  EXPECT_NE(error_of([&] {
              list_image_folder(dir.path(), false);
            }).find("class folder " + dir / "b (class 1) holds no"),
            std::string::npos);
  const ImageList kept = list_image_folder(dir.path(), true);
  EXPECT_EQ(kept.num_classes, 3);
  EXPECT_EQ(kept.labels, (std::vector<std::int32_t>{0, 2}));  // c keeps label 2
  EXPECT_EQ(kept.empty_classes, (std::vector<std::string>{dir / "b"}));
}

TEST(ImageFolder, AListGivesPathsRelativeToItsFolderAndChecksLabels) {
  TempDir dir;
  write_bytes(dir / "list.txt", std::vector<std::uint8_t>{});
  {
    std::ofstream f(dir / "list.txt");
    f << "# path,label\nx/1,2.jpg,3\n/abs/2.png,0\n\n";
  }
  const ImageList list = read_image_list(dir / "list.txt", "", 0);
  EXPECT_EQ(list.paths, (std::vector<std::string>{dir / "x/1,2.jpg", "/abs/2.png"}));
  EXPECT_EQ(list.labels, (std::vector<std::int32_t>{3, 0}));
  EXPECT_EQ(list.num_classes, 4);
  EXPECT_NE(error_of([&] {
              read_image_list(dir / "list.txt", "", 3);
            }).find(dir / "list.txt, line 2: label 3 is outside [0, 3)"),
            std::string::npos);
  {
    std::ofstream f(dir / "bad.txt");
    f << "a.jpg,cat\n";
  }
  EXPECT_NE(error_of([&] {
              read_image_list(dir / "bad.txt", "", 0);
            }).find(dir / "bad.txt, line 1: label 'cat'"),
            std::string::npos);
}

TEST(ImageFolder, ConvertedShardsCarryLabelsClassNamesAndStats) {
  TempDir dir;
  for (const char* c : {"blue", "red"})
    std::filesystem::create_directories(dir / ("in/" + std::string(c)));
  write_bytes(dir / "in/red/1.jpg", encode_jpeg(12, 8, solid(12, 8, 255, 0, 0), TJPF_RGB, 100));
  write_png(dir / "in/blue/1.png", 8, 12, PNG_COLOR_TYPE_RGB, 8, solid(8, 12, 0, 0, 255));
  write_bytes(dir / "in/blue/2.jpg", {});  // skipped
  const ImageList list = list_image_folder(dir / "in", false);
  ShardMeta meta;
  meta.num_classes = 2;
  meta.sample_shape = {3, 4, 4};
  meta.class_names = list.class_names;
  ImageShardOptions opts;
  opts.side = 4;
  opts.skip_bad = true;
  std::filesystem::create_directories(dir / "out");
  ImageShard shard =
      convert_image_shard(list, 0, 3, dir / "out/train-00000-of-00001.h5", meta, opts);
  ASSERT_EQ(shard.skipped.size(), 1u);
  EXPECT_NE(shard.skipped[0].find(dir / "in/blue/2.jpg: empty file"), std::string::npos);
  std::vector<float> mean, stddev;
  image_stats(shard.sum, shard.sum_sq, shard.pixels, mean, stddev);
  EXPECT_NEAR(mean[0], 0.5, 0.01);  // one red, one blue sample
  EXPECT_NEAR(mean[2], 0.5, 0.01);
  shard.writer->set_stats(mean, stddev);
  shard.writer->close();
  auto ds = ShardedDataset::open(dir / "out/train");
  EXPECT_EQ(ds->class_names(), (std::vector<std::string>{"blue", "red"}));
  EXPECT_EQ(ds->labels(), (std::vector<std::int32_t>{0, 1}));
  EXPECT_EQ(ds->mean(), mean);
  opts.skip_bad = false;
  EXPECT_NE(error_of([&] {
              convert_image_shard(list, 0, 3, dir / "out/x.h5", meta, opts);
            }).find(dir / "in/blue/2.jpg: empty file"),
            std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir / "out/x.h5"));
}

TEST(Cifar, RecordsKeepTheirLabelsAndPlanes) {
  TempDir dir;
  auto record = [](int coarse, int label, bool two) {
    std::vector<std::uint8_t> r;
    if (two) r.push_back(static_cast<std::uint8_t>(coarse));
    r.push_back(static_cast<std::uint8_t>(label));
    for (int p = 0; p < 3072; ++p)
      r.push_back(static_cast<std::uint8_t>(p / 1024 * 10 + label));
    return r;
  };
  std::vector<std::uint8_t> train, test;
  for (int i = 0; i < 3; ++i) {
    auto r = record(i % 20, 90 + i, true);
    train.insert(train.end(), r.begin(), r.end());
  }
  test = record(4, 7, true);
  write_bytes(dir / "train.bin", train);
  write_bytes(dir / "test.bin", test);
  const CifarSplits fine = read_cifar(dir.path());
  EXPECT_EQ(fine.kind, "cifar-100");
  EXPECT_EQ(fine.train.y, (std::vector<std::int32_t>{90, 91, 92}));
  EXPECT_EQ(fine.train.num_classes, 100);
  EXPECT_EQ(fine.train.x.shape(), (Shape{3, 3, 32, 32}));
  const auto* x = fine.train.x.data<std::uint8_t>();
  EXPECT_EQ(x[1 * 3072 + 0], 91);              // red plane of sample 1
  EXPECT_EQ(x[1 * 3072 + 2048 + 5], 20 + 91);  // its blue plane
  EXPECT_EQ(read_cifar(dir.path(), true).train.y, (std::vector<std::int32_t>{0, 1, 2}));
  train.pop_back();
  write_bytes(dir / "train.bin", train);
  EXPECT_NE(error_of([&] {
              read_cifar(dir.path());
            }).find(dir / "train.bin: 9221 bytes is not a whole number of 3074-byte records"),
            std::string::npos);
}

TEST(Cifar, TenClassBatchesNeedAllFiveAndValidLabels) {
  TempDir dir;
  std::vector<std::uint8_t> rec(3073, 1);
  for (int b = 1; b <= 4; ++b)
    write_bytes(dir / ("data_batch_" + std::to_string(b) + ".bin"), rec);
  write_bytes(dir / "test_batch.bin", rec);
  EXPECT_NE(error_of([&] { read_cifar(dir.path()); }).find(dir / "data_batch_5.bin is missing"),
            std::string::npos);
  rec[0] = 10;
  write_bytes(dir / "data_batch_5.bin", rec);
  EXPECT_NE(error_of([&] {
              read_cifar(dir.path());
            }).find(dir / "data_batch_5.bin: record 0 has label 10"),
            std::string::npos);
}

}  // namespace
}  // namespace lockstep::data
