// Training-time augmentation of u8 image samples [C, H, W], run by the loader thread after a
// batch is gathered: random-resized-crop (torchvision's RandomResizedCrop, scale and ratio as
// there), pad-and-random-crop (the CIFAR recipe), horizontal flip. Normalisation stays on the
// device (ops::normalize_input). Every random choice for a sample is drawn from Philox keyed by
// (seed, epoch, dataset index), never from a running generator: the same sample of the same
// epoch is augmented the same way on any rank, in any batch position, after any resume, so N ranks
// equal one rank and reruns stay bitwise with augmentation on. Evaluation is never augmented.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/core/tensor.hpp"
#include "lockstep/data/image.hpp"

namespace lockstep::data {

struct AugmentOptions {
  bool random_resized_crop = false;
  double scale_min = 0.08, scale_max = 1.0;             // of the sample's area, as torchvision
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;  // width / height, sampled in log space
  std::int64_t pad_crop = 0;  // pad this many black pixels on each side, cut a random H x W
  bool flip = false;          // mirror left-right with probability 1/2
  std::uint64_t seed = 0;

  bool any() const { return random_resized_crop || pad_crop > 0 || flip; }
};

// Augments one sample in place (u8 [channels, H, W]): random-resized-crop, then pad-and-crop,
// then flip, each when enabled.
void augment_sample(std::uint8_t* sample, std::int64_t channels, std::int64_t H, std::int64_t W,
                    const AugmentOptions& options, std::int64_t epoch, std::int64_t index);

// A sample of an encoded shard (the original JPEG/PNG bytes, docs/IMAGES.md) decoded into u8
// [3, side, side] at out. Without random_resized_crop: decoded, the shorter side scaled to `side`
// and the middle cut, exactly as --fit=crop stores raw samples. With it: torchvision's crop of the
// original photo (drawn from its full upright size, Philox keyed as augment_sample), the JPEG
// decoded at the smallest DCT scale that keeps the crop's shorter side at least `side`, the crop
// resized to side x side. Then pad-and-crop and flip as augment_sample.
void decode_sample(const std::uint8_t* bytes, std::size_t size, const std::string& where,
                   std::int64_t side, const AugmentOptions& options, std::int64_t epoch,
                   std::int64_t index, std::uint8_t* out);

// decode_sample's crop of one sample, in the full-size upright image's pixels (the whole image
// without random_resized_crop), and the scale it decodes a JPEG at (1/denominator).
struct EncodedCrop {
  std::int64_t top = 0, left = 0, height = 0, width = 0;
  int denominator = 1;
  std::uint64_t draws = 0;  // random numbers the crop used
};
EncodedCrop encoded_crop(const EncodedImageInfo& info, std::int64_t side,
                         const AugmentOptions& options, std::int64_t epoch, std::int64_t index);

// Every row of a host u8 batch [b, C, H, W]; indices[i] is row i's dataset index. Throws naming
// the options when the batch is not u8 images.
void augment_batch(Tensor& x, const std::vector<std::int64_t>& indices, std::int64_t epoch,
                   const AugmentOptions& options);

}  // namespace lockstep::data
