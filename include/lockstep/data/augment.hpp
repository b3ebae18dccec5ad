// Training-time augmentation of u8 image samples [C, H, W], run by the loader thread after a
// batch is gathered: random-resized-crop (torchvision's RandomResizedCrop, scale and ratio as
// there), pad-and-random-crop (the CIFAR recipe), horizontal flip. Normalisation stays on the
// device (ops::normalize_input). Every random choice for a sample is drawn from Philox keyed by
// (seed, epoch, dataset index), never from a running generator: the same sample of the same
// epoch is augmented the same way on any rank, in any batch position, after any resume, so N ranks
// equal one rank and reruns stay bitwise with augmentation on. Evaluation is never augmented.
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/core/tensor.hpp"

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

// Every row of a host u8 batch [b, C, H, W]; indices[i] is row i's dataset index. Throws naming
// the options when the batch is not u8 images.
void augment_batch(Tensor& x, const std::vector<std::int64_t>& indices, std::int64_t epoch,
                   const AugmentOptions& options);

}  // namespace lockstep::data
