// Loader: a background thread that turns a rank's sampler indices into batches and keeps up to
// prefetch_depth of them ready in a bounded queue, so the training step rarely waits for data.
// It serves any Dataset (image shards, token windows); batches are host tensors as the dataset's
// gather() makes them; normalisation is the trainer's job (ops::normalize_input with the image
// set's mean/std, on the device). One consumer thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "lockstep/core/tensor.hpp"
#include "lockstep/data/augment.hpp"
#include "lockstep/data/dataset.hpp"  // ShardedDataset, what most callers pass
#include "lockstep/data/dataset_interface.hpp"
#include "lockstep/data/defaults.hpp"
#include "lockstep/data/sampler.hpp"

namespace lockstep::data {

struct Batch {
  Tensor x;  // host; images: dataset dtype (u8 or f32) [b, ...sample_shape]; tokens: i32 [b, T]
  Tensor y;  // host; images: i32 [b]; tokens: i32 [b, T] (x shifted by one)
  std::int64_t epoch = 0;
  std::int64_t index_in_epoch = 0;    // batch number within the epoch, counting skipped ones
  std::vector<std::int64_t> indices;  // the dataset indices of x's rows (to trace bad data)
};

struct LoaderOptions {
  int prefetch_depth = kDefaultPrefetchDepth;
  bool drop_last_batch = false;  // drop the epoch's last batch when it is short
  // Resume: the first epoch started skips this many batches (their samples are never read).
  std::int64_t start_batch = 0;
  // Applied to every batch in the loader thread (training only; lockstep/data/augment.hpp).
  AugmentOptions augment;
  // Threads that decode the samples of encoded image shards (docs/IMAGES.md); raw samples need
  // none. One: a 2-core node running two ranks has no core to spare.
  int decode_threads = kDefaultDecodeThreads;
};

class Loader {
 public:
  Loader(std::shared_ptr<const Dataset> dataset, DistributedSampler sampler,
         std::int64_t batch_size, LoaderOptions options = {});
  // Stops the thread without waiting for the epoch to be consumed.
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Starts producing `epoch` (abandoning whatever is left of the previous one).
  void start_epoch(std::int64_t epoch);
  // The next batch of the current epoch, or nullopt at its end. Rethrows an exception raised
  // while assembling the batch (e.g. a read error naming the shard).
  std::optional<Batch> next();

  std::int64_t batches_per_epoch() const;
  std::int64_t batch_size() const { return batch_size_; }
  const DistributedSampler& sampler() const { return sampler_; }
  const Dataset& dataset() const { return *dataset_; }

  // Seconds the consumer spent blocked in next() since construction or the last reset.
  double data_wait_seconds() const { return data_wait_seconds_; }
  void reset_data_wait() { data_wait_seconds_ = 0; }

 private:
  struct Item {
    std::optional<Batch> batch;  // nullopt: end of epoch
    std::exception_ptr error;
  };
  void run();

  std::shared_ptr<const Dataset> dataset_;
  DistributedSampler sampler_;
  std::int64_t batch_size_;
  LoaderOptions options_;
  // The threads that decode encoded samples besides the loader thread (decode_threads > 1 only):
  // kept for the loader's life, with their decoders and buffers, not started per batch.
  std::unique_ptr<ThreadPool> decode_pool_;

  std::mutex mutex_;
  std::condition_variable changed_;  // queue, generation or stop changed
  std::deque<Item> queue_;
  std::uint64_t generation_ = 0;  // bumped by start_epoch; 0 = no epoch started yet
  std::int64_t epoch_ = 0;
  std::int64_t first_batch_ = 0;
  bool first_start_ = true;
  bool stop_ = false;
  bool epoch_done_ = false;  // consumer side: end of epoch already returned
  double data_wait_seconds_ = 0;
  std::thread thread_;
};

}  // namespace lockstep::data
