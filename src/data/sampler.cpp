#include "lockstep/data/sampler.hpp"

#include <numeric>

#include "lockstep/core/error.hpp"
#include "lockstep/core/rng.hpp"

namespace lockstep::data {

std::vector<std::int64_t> philox_permutation(std::int64_t n, std::uint64_t seed,
                                             std::uint64_t stream) {
  LOCKSTEP_CHECK(n >= 0, "cannot permute ", n, " elements");
  std::vector<std::int64_t> p(static_cast<std::size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  const Philox rng(seed, stream);
  // Fisher-Yates from the back. Draw t is a 64-bit word (two Philox outputs) mapped to [0, i]
  // by a multiply-high: bias below 2^-40 for any realistic n, and no platform-dependent
  // std::uniform_int_distribution.
  for (std::int64_t i = n - 1, t = 0; i > 0; --i, ++t) {
    auto block = rng.block(static_cast<std::uint64_t>(t) / 2);
    const int o = static_cast<int>(t % 2) * 2;
    const std::uint64_t r = (static_cast<std::uint64_t>(block[o]) << 32) | block[o + 1];
    const auto j = static_cast<std::int64_t>(
        (static_cast<unsigned __int128>(r) * static_cast<std::uint64_t>(i + 1)) >> 64);
    std::swap(p[static_cast<std::size_t>(i)], p[static_cast<std::size_t>(j)]);
  }
  return p;
}

DistributedSampler::DistributedSampler(std::int64_t dataset_size, int world_size, int rank,
                                       bool shuffle, std::uint64_t seed, bool drop_last)
    : dataset_size_(dataset_size),
      world_size_(world_size),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  LOCKSTEP_CHECK(dataset_size >= 1, "DistributedSampler: dataset has ", dataset_size, " samples");
  LOCKSTEP_CHECK(world_size >= 1, "DistributedSampler: world_size is ", world_size);
  LOCKSTEP_CHECK(rank >= 0 && rank < world_size, "DistributedSampler: rank ", rank,
                 " is outside [0, ", world_size, ")");
  // As PyTorch: drop_last truncates to a multiple of the world size, otherwise pad up to one.
  num_samples_ =
      drop_last ? dataset_size / world_size : (dataset_size + world_size - 1) / world_size;
  LOCKSTEP_CHECK_HINT(num_samples_ >= 1, "use drop_last=false or fewer ranks",
                      "DistributedSampler: ", dataset_size, " samples leave nothing for each of ",
                      world_size, " ranks with drop_last");
}

std::vector<std::int64_t> DistributedSampler::indices() const {
  // The permutation's stream is the epoch, so each epoch (and only the epoch) changes the order.
  std::vector<std::int64_t> all;
  if (shuffle_) {
    all = philox_permutation(
        dataset_size_, seed_,
        hash_combine(hash_string("DistributedSampler"), static_cast<std::uint64_t>(epoch_)));
  } else {
    all.resize(static_cast<std::size_t>(dataset_size_));
    std::iota(all.begin(), all.end(), 0);
  }
  const std::int64_t total = total_size();
  std::vector<std::int64_t> mine;
  mine.reserve(static_cast<std::size_t>(num_samples_));
  // Position p of the padded epoch is all[p mod n]: padding wraps around to the start (repeatedly
  // when there are fewer samples than ranks), and drop_last simply stops at `total`.
  for (std::int64_t p = rank_; p < total; p += world_size_) {
    mine.push_back(all[static_cast<std::size_t>(p % dataset_size_)]);
  }
  return mine;
}

}  // namespace lockstep::data
