// DistributedSampler: which samples each rank sees in an epoch, with PyTorch's DistributedSampler
// semantics. One permutation of all indices from (seed, epoch), padded by wrapping around to a
// multiple of world_size (or truncated with drop_last); rank r takes positions r, r+W, r+2W, ...
// The permutation is a Philox-driven Fisher-Yates shuffle, so it is identical on every platform.
#pragma once

#include <cstdint>
#include <vector>

namespace lockstep::data {

// A permutation of 0..n-1 that is a pure function of (seed, stream).
std::vector<std::int64_t> philox_permutation(std::int64_t n, std::uint64_t seed,
                                             std::uint64_t stream);

class DistributedSampler {
 public:
  DistributedSampler(std::int64_t dataset_size, int world_size, int rank, bool shuffle = true,
                     std::uint64_t seed = 0, bool drop_last = false);

  void set_epoch(std::int64_t epoch) { epoch_ = epoch; }
  std::int64_t epoch() const { return epoch_; }
  // This rank's dataset indices for the current epoch, in the order they are to be used.
  std::vector<std::int64_t> indices() const;
  // Every rank gets this many (PyTorch's num_samples).
  std::int64_t num_samples() const { return num_samples_; }
  std::int64_t total_size() const { return num_samples_ * world_size_; }
  std::int64_t dataset_size() const { return dataset_size_; }
  int world_size() const { return world_size_; }
  int rank() const { return rank_; }

 private:
  std::int64_t dataset_size_;
  int world_size_;
  int rank_;
  bool shuffle_;
  std::uint64_t seed_;
  bool drop_last_;
  std::int64_t num_samples_;
  std::int64_t epoch_ = 0;
};

}  // namespace lockstep::data
