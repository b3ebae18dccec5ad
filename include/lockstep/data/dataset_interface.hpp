// What the Loader draws batches from: a fixed number of samples addressed by index 0..size()-1,
// gathered in any order (repeats allowed) into host tensors. ShardedDataset (images: x u8/f32
// [k, ...sample_shape], y i32 [k]) and TokenDataset (windows: x and y i32 [k, T]) implement it.
// gather() must be safe to call from several threads at once.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "lockstep/core/tensor.hpp"
#include "lockstep/data/augment.hpp"

namespace lockstep {
class ThreadPool;
}

namespace lockstep::data {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual std::int64_t size() const = 0;
  // Fills x and y with samples `indices` (each in [0, size())), reallocating them when undefined
  // or of another shape or dtype, so a caller can reuse its tensors from batch to batch.
  virtual void gather(std::span<const std::int64_t> indices, Tensor& x, Tensor& y) const = 0;
  // gather, then the training augmentation of `epoch` on x's rows (lockstep/data/augment.hpp).
  // A dataset that decodes its samples (encoded image shards) crops while it decodes, on `pool`'s
  // threads (nullptr: the caller's alone).
  virtual void gather_augmented(std::span<const std::int64_t> indices, Tensor& x, Tensor& y,
                                std::int64_t epoch, const AugmentOptions& augment,
                                ThreadPool* pool) const {
    (void)pool;
    gather(indices, x, y);
    augment_batch(x, std::vector<std::int64_t>(indices.begin(), indices.end()), epoch, augment);
  }
  // Names the data in messages: "DIR/train-00000-of-00004.h5, ... (4 shards)".
  virtual std::string describe() const = 0;
};

}  // namespace lockstep::data
