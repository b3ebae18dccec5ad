#include "lockstep/data/loader.hpp"

#include <algorithm>
#include <chrono>

#include "lockstep/core/thread_pool.hpp"

namespace lockstep::data {

Loader::Loader(std::shared_ptr<const Dataset> dataset, DistributedSampler sampler,
               std::int64_t batch_size, LoaderOptions options)
    : dataset_(std::move(dataset)),
      sampler_(std::move(sampler)),
      batch_size_(batch_size),
      options_(options) {
  LOCKSTEP_CHECK(dataset_ != nullptr, "Loader: no dataset");
  LOCKSTEP_CHECK(batch_size_ >= 1, "Loader: batch size is ", batch_size_);
  LOCKSTEP_CHECK(options_.decode_threads >= 1, "Loader: decode_threads is ",
                 options_.decode_threads, ", must be at least 1");
  LOCKSTEP_CHECK(options_.prefetch_depth >= 1, "Loader: prefetch_depth is ",
                 options_.prefetch_depth, ", must be at least 1");
  LOCKSTEP_CHECK(sampler_.dataset_size() == dataset_->size(), "Loader: the sampler covers ",
                 sampler_.dataset_size(), " samples but the dataset (", dataset_->describe(),
                 ") has ", dataset_->size());
  LOCKSTEP_CHECK(options_.start_batch >= 0 && options_.start_batch <= batches_per_epoch(),
                 "Loader: start_batch ", options_.start_batch, " is outside [0, ",
                 batches_per_epoch(), "]");
  if (options_.decode_threads > 1)
    decode_pool_ = std::make_unique<ThreadPool>(options_.decode_threads);
  thread_ = std::thread([this] { run(); });
}

Loader::~Loader() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

std::int64_t Loader::batches_per_epoch() const {
  const std::int64_t n = sampler_.num_samples();
  return options_.drop_last_batch ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
}

void Loader::start_epoch(std::int64_t epoch) {
  {
    std::lock_guard lock(mutex_);
    ++generation_;
    epoch_ = epoch;
    first_batch_ = first_start_ ? options_.start_batch : 0;
    first_start_ = false;
    queue_.clear();  // batches of an abandoned epoch
    sampler_.set_epoch(epoch);
  }
  epoch_done_ = false;
  changed_.notify_all();
}

std::optional<Batch> Loader::next() {
  LOCKSTEP_CHECK_HINT(generation_ != 0, "call start_epoch(e) before next()",
                      "Loader::next: no epoch started");
  if (epoch_done_) return std::nullopt;
  const auto t0 = std::chrono::steady_clock::now();
  Item item;
  {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return !queue_.empty(); });
    item = std::move(queue_.front());
    queue_.pop_front();
  }
  changed_.notify_all();
  data_wait_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (item.error) {
    epoch_done_ = true;
    std::rethrow_exception(item.error);
  }
  if (!item.batch) epoch_done_ = true;
  return std::move(item.batch);
}

void Loader::run() {
  std::uint64_t seen = 0;
  for (;;) {
    std::uint64_t generation;
    std::int64_t epoch, first;
    std::optional<DistributedSampler> sampler;  // a copy: start_epoch may change sampler_
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      generation = seen = generation_;
      epoch = epoch_;
      first = first_batch_;
      sampler.emplace(sampler_);
    }
    // Pushes an item unless the epoch was abandoned meanwhile; false when the thread must stop
    // or move on to the new epoch.
    auto push = [&](Item item) {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] {
        return stop_ || generation_ != generation ||
               static_cast<int>(queue_.size()) < options_.prefetch_depth;
      });
      if (stop_ || generation_ != generation) return false;
      queue_.push_back(std::move(item));
      lock.unlock();
      changed_.notify_all();
      return true;
    };

    try {
      const std::vector<std::int64_t> indices = sampler->indices();
      const auto n = static_cast<std::int64_t>(indices.size());
      const std::int64_t batches = batches_per_epoch();
      bool live = true;
      for (std::int64_t b = first; b < batches && live; ++b) {
        const std::int64_t begin = b * batch_size_;
        const std::int64_t end = std::min(n, begin + batch_size_);
        Batch batch;
        batch.epoch = epoch;
        batch.index_in_epoch = b;
        batch.indices.assign(indices.begin() + begin, indices.begin() + end);
        dataset_->gather_augmented(batch.indices, batch.x, batch.y, epoch, options_.augment,
                                   decode_pool_.get());
        live = push(Item{std::move(batch), nullptr});
      }
      if (live) push(Item{std::nullopt, nullptr});
    } catch (...) {
      push(Item{std::nullopt, std::current_exception()});
    }
  }
}

}  // namespace lockstep::data
