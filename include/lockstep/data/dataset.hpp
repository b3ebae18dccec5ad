// ShardedDataset: all shards of one set (train or test) behind one global index 0..size()-1, in
// shard_index order. Opening checks every file and that the files form one set. A set that fits
// the memory budget is read into host memory once; a larger one is read on demand, each batch's
// samples by hyperslab (contiguous runs in one call). Both modes return identical samples.
// In memory, samples keep the files' dtype (u8 stays u8; batches are normalised on the device),
// and the block holding them may be one shared by the ranks of a node (ResidentAllocator).
// Encoded image sets (JPEG/PNG bytes, SampleStorage::Encoded) are always read on demand and
// decoded per sample by gather (center crop) or gather_augmented (the crop of the original).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "lockstep/core/tensor.hpp"
#include "lockstep/data/dataset_interface.hpp"
#include "lockstep/data/defaults.hpp"
#include "lockstep/data/shard.hpp"

namespace lockstep::data {

// Resolves a shard-set spec to its files, sorted by name:
//   an existing file -> that file;  a pattern with * ? [ -> its glob matches;
//   a folder -> every *.h5 in it;   DIR/NAME -> DIR/NAME-*-of-*.h5.
// Throws when nothing matches (naming what was looked for).
std::vector<std::string> resolve_shard_files(const std::string& spec);

// Host memory for an in-memory set's samples. The data layer knows no MPI: train/ passes an
// allocator from comm/ that hands every rank of a node the same block, which one of them fills.
struct ResidentBlock {
  void* data = nullptr;  // at least the bytes asked for
  bool fill = true;      // true: this process reads the samples into data; false: another one does
  // Called by every holder once its filling is done (ok = false: it failed and is about to
  // throw), or at once when it fills nothing. Returns when the block holds every sample (for a
  // shared block: after the node's ranks agree); throws on a rank whose filler failed.
  std::function<void(bool ok)> filled;
  std::shared_ptr<void> owner;  // keeps data valid while the dataset lives
};
// Called once per in-memory set with its sample bytes and the set's name for messages. When the
// block is shared, every rank sharing it opens the same set with the same budget (so all call
// it, in the same order). Empty: the process's own heap.
using ResidentAllocator = std::function<ResidentBlock(std::int64_t bytes, const std::string& what)>;

class ShardedDataset : public Dataset {
 public:
  // spec as for resolve_shard_files. memory_budget_bytes: see kDefaultMemoryBudgetBytes
  // (0 forces on-demand reading). allocator: where an in-memory set is held (see above).
  static std::shared_ptr<ShardedDataset> open(
      const std::string& spec, std::int64_t memory_budget_bytes = kDefaultMemoryBudgetBytes,
      const ResidentAllocator& allocator = {});
  static std::shared_ptr<ShardedDataset> open(
      const std::vector<std::string>& files,
      std::int64_t memory_budget_bytes = kDefaultMemoryBudgetBytes,
      const ResidentAllocator& allocator = {});
  ~ShardedDataset() override;
  ShardedDataset(const ShardedDataset&) = delete;
  ShardedDataset& operator=(const ShardedDataset&) = delete;

  std::int64_t size() const override { return size_; }
  const Shape& sample_shape() const { return meta_.sample_shape; }
  std::int64_t num_classes() const { return meta_.num_classes; }
  DType dtype() const { return meta_.dtype; }
  const std::vector<float>& mean() const { return meta_.mean; }      // empty if not stored
  const std::vector<float>& stddev() const { return meta_.stddev; }  // empty if not stored
  // What each label means (ShardMeta::class_names); empty if not stored.
  const std::vector<std::string>& class_names() const { return meta_.class_names; }
  const std::vector<std::string>& files() const { return files_; }  // in shard_index order
  std::vector<std::int64_t> shard_sizes() const;
  std::int64_t sample_bytes() const { return meta_.sample_bytes(); }
  bool in_memory() const { return resident_ != nullptr; }
  // In memory, in a block another process filled (a node-shared copy): it only maps it.
  bool shared_copy() const { return shared_copy_; }

  // Labels are always held in memory (4 bytes a sample), checked against num_classes at open.
  const std::vector<std::int32_t>& labels() const { return labels_; }

  // Copies samples `indices` (any order, repeats allowed) into x (host, dtype(),
  // [k, ...sample_shape]) and their labels into y (host, i32 [k]); x and y are allocated when
  // undefined or of the wrong shape. Thread-safe.
  // Encoded storage: each sample is decoded, resized and center-cropped (as raw storage's
  // --fit=crop stored it).
  void gather(std::span<const std::int64_t> indices, Tensor& x, Tensor& y) const override;
  // Encoded storage: each sample decoded with its augmentation (data::decode_sample: the
  // random-resized-crop of the original image). Raw storage: gather, then augment_batch.
  void gather_augmented(std::span<const std::int64_t> indices, Tensor& x, Tensor& y,
                        std::int64_t epoch, const AugmentOptions& augment,
                        ThreadPool* pool) const override;
  SampleStorage storage() const { return meta_.storage; }
  std::string describe() const override;

  // Where global sample `index` lives: its shard and its index within that shard's /x.
  struct Location {
    const ShardFile* shard;
    std::int64_t index;
  };
  Location locate(std::int64_t index) const;

  // "train-00001-of-00002.h5 (shard 1 of 2): 3 samples in [10, 47]; ..." for a set of global
  // indices (any order, repeats allowed), grouped by shard: for messages about bad samples.
  std::string describe_samples(std::vector<std::int64_t> indices) const;

  // Bytes of /x (or /bytes) this process read from the files so far (at open in memory mode, per
  // batch on demand; 0 for a shared_copy()).
  std::int64_t bytes_read() const { return bytes_read_.load(); }

 private:
  ShardedDataset() = default;
  // Sizes x and y for the batch and fills y (checking each index).
  void allocate(std::span<const std::int64_t> indices, Tensor& x, Tensor& y) const;
  // Decodes encoded samples into x, on pool's threads (nullptr: this one).
  void decode(std::span<const std::int64_t> indices, Tensor& x, std::int64_t epoch,
              const AugmentOptions& augment, ThreadPool* pool) const;
  std::vector<std::unique_ptr<ShardFile>> shards_;
  std::vector<std::string> files_;
  std::vector<std::int64_t> offsets_;  // offsets_[s] = first global index of shard s; + size()
  ShardMeta meta_;                     // the set's common metadata (shard_index meaningless)
  std::int64_t size_ = 0;
  std::vector<std::int32_t> labels_;
  // [size, ...sample_shape] of dtype() in memory mode, null on demand; owned by resident_owner_.
  const char* resident_ = nullptr;
  std::shared_ptr<void> resident_owner_;
  bool shared_copy_ = false;
  mutable std::atomic<std::int64_t> bytes_read_{0};
};

}  // namespace lockstep::data
