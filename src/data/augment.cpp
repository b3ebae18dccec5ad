#include "lockstep/data/augment.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "lockstep/core/error.hpp"
#include "lockstep/core/rng.hpp"
#include "lockstep/core/simd_clones.hpp"
#include "lockstep/data/image.hpp"

namespace lockstep::data {

namespace {

// A sample's draws: stream (epoch, index) under the run's seed; draw k is the k-th number used.
class Draws {
 public:
  Draws(std::uint64_t seed, std::int64_t epoch, std::int64_t index)
      : rng_(hash_combine(seed, 0x61756731ull /* "aug1" */),
             hash_combine(static_cast<std::uint64_t>(epoch), static_cast<std::uint64_t>(index))) {}
  double uniform() { return static_cast<double>(rng_.u32(next_++)) / 4294967296.0; }
  std::uint64_t used() const { return next_; }
  void skip_to(std::uint64_t used) { next_ = used; }
  // Uniform integer in [lo, hi].
  std::int64_t integer(std::int64_t lo, std::int64_t hi) {
    return lo + static_cast<std::int64_t>(uniform() * static_cast<double>(hi - lo + 1));
  }

 private:
  Philox rng_;
  std::uint64_t next_ = 0;
};

// torchvision's RandomResizedCrop.get_params: ten tries at an area fraction and an aspect ratio
// that fit, else the whole sample cut to the nearest allowed ratio.
void crop_params(Draws& d, std::int64_t H, std::int64_t W, const AugmentOptions& o,
                 std::int64_t& top, std::int64_t& left, std::int64_t& h, std::int64_t& w) {
  const double area = static_cast<double>(H * W);
  const double log_lo = std::log(o.ratio_min), log_hi = std::log(o.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * (o.scale_min + (o.scale_max - o.scale_min) * d.uniform());
    const double ratio = std::exp(log_lo + (log_hi - log_lo) * d.uniform());
    w = std::llround(std::sqrt(target * ratio));
    h = std::llround(std::sqrt(target / ratio));
    if (w > 0 && h > 0 && w <= W && h <= H) {
      top = d.integer(0, H - h);
      left = d.integer(0, W - w);
      return;
    }
  }
  const double in_ratio = static_cast<double>(W) / static_cast<double>(H);
  if (in_ratio < o.ratio_min) {
    w = W, h = std::llround(static_cast<double>(W) / o.ratio_min);
  } else if (in_ratio > o.ratio_max) {
    h = H, w = std::llround(static_cast<double>(H) * o.ratio_max);
  } else {
    w = W, h = H;
  }
  top = (H - h) / 2;
  left = (W - w) / 2;
}

// Reverses each of `rows` rows of W bytes: through a copy, which vectorises (std::reverse's
// swaps do not).
LOCKSTEP_SIMD_CLONES void mirror_rows(std::uint8_t* x, std::int64_t rows, std::int64_t W) {
  thread_local std::vector<std::uint8_t> reversed;
  reversed.resize(static_cast<std::size_t>(W));
  std::uint8_t* t = reversed.data();
  for (std::int64_t r = 0; r < rows; ++r) {
    std::uint8_t* row = x + r * W;
    for (std::int64_t i = 0; i < W; ++i)
      t[i] = row[W - 1 - i];
    std::memcpy(row, t, static_cast<std::size_t>(W));
  }
}

// The steps after the crop, on a C x H x W sample, drawing on from where the crop stopped.
void pad_crop_and_flip(Draws& d, std::uint8_t* x, std::int64_t C, std::int64_t H, std::int64_t W,
                       const AugmentOptions& o) {
  if (o.pad_crop > 0) {
    // Offsets in [-P, P]: the window's top-left corner in the unpadded sample.
    const std::int64_t dy = d.integer(-o.pad_crop, o.pad_crop);
    const std::int64_t dx = d.integer(-o.pad_crop, o.pad_crop);
    std::vector<std::uint8_t> tmp(static_cast<std::size_t>(C * H * W), std::uint8_t{0});
    for (std::int64_t c = 0; c < C; ++c)
      for (std::int64_t y = 0; y < H; ++y) {
        const std::int64_t sy = y + dy;
        if (sy < 0 || sy >= H) continue;
        for (std::int64_t xx = 0; xx < W; ++xx) {
          const std::int64_t sx = xx + dx;
          if (sx >= 0 && sx < W)
            tmp[static_cast<std::size_t>((c * H + y) * W + xx)] = x[(c * H + sy) * W + sx];
        }
      }
    std::memcpy(x, tmp.data(), tmp.size());
  }
  if (o.flip && d.uniform() < 0.5) mirror_rows(x, C * H, W);
}

}  // namespace

void augment_sample(std::uint8_t* x, std::int64_t C, std::int64_t H, std::int64_t W,
                    const AugmentOptions& o, std::int64_t epoch, std::int64_t index) {
  if (!o.any()) return;
  Draws d(o.seed, epoch, index);
  if (o.random_resized_crop) {
    std::int64_t top = 0, left = 0, h = H, w = W;
    crop_params(d, H, W, o, top, left, h, w);
    std::vector<std::uint8_t> tmp(static_cast<std::size_t>(C * H * W));
    resize_region(x, C, H, W, top, left, h, w, H, W, tmp.data());
    std::memcpy(x, tmp.data(), tmp.size());
  }
  pad_crop_and_flip(d, x, C, H, W, o);
}

EncodedCrop encoded_crop(const EncodedImageInfo& info, std::int64_t side, const AugmentOptions& o,
                         std::int64_t epoch, std::int64_t index) {
  EncodedCrop crop;
  crop.width = info.width;
  crop.height = info.height;
  if (o.random_resized_crop) {
    Draws d(o.seed, epoch, index);
    crop_params(d, info.height, info.width, o, crop.top, crop.left, crop.height, crop.width);
    crop.draws = d.used();
  }
  crop.denominator = info.jpeg ? jpeg_scale_denominator(crop.width, crop.height, side) : 1;
  return crop;
}

void decode_sample(const std::uint8_t* bytes, std::size_t size, const std::string& where,
                   std::int64_t side, const AugmentOptions& o, std::int64_t epoch,
                   std::int64_t index, std::uint8_t* out) {
  Draws d(o.seed, epoch, index);
  if (!o.random_resized_crop) {
    // As --fit=crop stored it: the same decode, scale and cut, so the same bytes.
    const Image image = decode_image(bytes, size, where, side);
    resize_to_square(image, side, ImageFit::CenterCrop, out);
  } else {
    // torchvision's order: the crop is drawn on the original photo, then resized to side x side.
    // Decoding at 1/2, 1/4 or 1/8 where the crop keeps at least `side` pixels on its shorter side
    // reads up to 64 times fewer pixels. Pixel i of the reduced image is pixels [d*i, d*i + d) of
    // the full one (libjpeg's scaled IDCT), so the crop is the same region at 1/d, edges and all.
    // Only the whole pixels it touches are decoded (as DALI's region-of-interest decode does), to
    // the values the whole image's decode has there, so the sample is the same bytes as a crop of
    // the whole decoded image.
    const EncodedImageInfo info = encoded_image_info(bytes, size, where);
    const EncodedCrop crop = encoded_crop(info, side, o, epoch, index);
    d.skip_to(crop.draws);
    const auto scale = static_cast<double>(crop.denominator);
    const double top = static_cast<double>(crop.top) / scale;
    const double left = static_cast<double>(crop.left) / scale;
    const double h = static_cast<double>(crop.height) / scale;
    const double w = static_cast<double>(crop.width) / scale;
    PixelRect touched;
    touched.top = static_cast<std::int64_t>(std::floor(top));
    touched.left = static_cast<std::int64_t>(std::floor(left));
    touched.height = static_cast<std::int64_t>(std::ceil(top + h)) - touched.top;
    touched.width = static_cast<std::int64_t>(std::ceil(left + w)) - touched.left;
    // Kept by the thread: its buffer is the size of the largest crop so far, not allocated anew.
    thread_local ImageRegion region;
    decode_image_region(bytes, size, where, crop.denominator, touched, region);
    // The region's origin is a whole pixel, so these are the same doubles less whole numbers:
    // exact, and the resampler's weights are the ones it computes on the whole image.
    resize_region(region.image, top - static_cast<double>(region.top),
                  left - static_cast<double>(region.left), h, w, side, side, out);
    release_if_outsized(region.image.rgb);
  }
  pad_crop_and_flip(d, out, 3, side, side, o);
}

void augment_batch(Tensor& x, const std::vector<std::int64_t>& indices, std::int64_t epoch,
                   const AugmentOptions& o) {
  if (!o.any()) return;
  LOCKSTEP_CHECK_HINT(x.dtype() == DType::U8 && x.ndim() == 4 && x.device().is_cpu(),
                      "data.flip, data.pad_crop and data.random_resized_crop are for image shards "
                      "of u8 [C, H, W] samples",
                      "cannot augment a batch of ", x.describe());
  LOCKSTEP_CHECK(static_cast<std::int64_t>(indices.size()) == x.dim(0),
                 "augment_batch: ", indices.size(), " indices for ", x.dim(0), " samples");
  const std::int64_t C = x.dim(1), H = x.dim(2), W = x.dim(3);
  auto* data = x.data<std::uint8_t>();
  for (std::int64_t i = 0; i < x.dim(0); ++i)
    augment_sample(data + i * C * H * W, C, H, W, o, epoch, indices[static_cast<std::size_t>(i)]);
}

}  // namespace lockstep::data
