// One file of the lockstep shard format (docs/SHARD-FORMAT.md): version 1, /x samples (u8 or
// f32, [n, ...sample_shape], chunked), /y int32 labels [n], and attributes describing the set;
// version 2, image files' original bytes (/bytes, /offsets) decoded by the reader, and /y.
// ShardWriter produces such files; ShardFile opens one and refuses anything that does not match
// the format, naming the file and the field and saying how to fix it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/core/dtype.hpp"
#include "lockstep/core/tensor.hpp"
#include "lockstep/data/defaults.hpp"

namespace lockstep::data {

inline constexpr const char* kShardFormatName = "lockstep-shard";
inline constexpr std::int64_t kShardFormatVersion = 1;
// Image shards holding each image's original compressed bytes (SampleStorage::Encoded) are
// version 2, so that readers of version 1 refuse them ("a newer lockstep wrote it") instead of
// looking for /x. Raw shards stay version 1, readable by every lockstep.
inline constexpr std::int64_t kEncodedShardFormatVersion = 2;
// Appended to every shard-format error.
inline constexpr const char* kRegenerateHint = "regenerate the shards with lockstep-shard";

// How a shard holds its samples. Raw: /x, [n, ...sample_shape] of dtype. Encoded: each sample's
// original JPEG or PNG file, bytes /bytes[offsets[i], offsets[i+1]), decoded by the reader into
// u8 sample_shape = [3, S, S] (docs/SHARD-FORMAT.md, docs/IMAGES.md).
enum class SampleStorage { Raw, Encoded };
const char* sample_storage_name(SampleStorage storage);           // "raw", "encoded"
SampleStorage sample_storage_from_name(const std::string& name);  // throws naming the choices

// What the attributes and shapes of one shard say.
struct ShardMeta {
  std::int64_t shard_index = 0;
  std::int64_t num_shards = 1;
  std::int64_t num_classes = 0;
  Shape sample_shape;            // rank >= 1; sample_shape[0] is the channel axis
  DType dtype = DType::U8;       // of /x: U8 or F32
  std::int64_t num_samples = 0;  // length of /x and /y (set by the writer on close)
  // Per-channel mean and standard deviation (sample_shape[0] entries each), in [0, 1] pixel units
  // for u8 data; both empty when the shard does not carry them.
  std::vector<float> mean;
  std::vector<float> stddev;
  // The name of each class (num_classes entries, none holding a newline), or empty: what label k
  // means, e.g. the folder names of an ImageFolder. Stored as one string attribute 'class_names',
  // the names joined by newlines.
  std::vector<std::string> class_names;
  SampleStorage storage = SampleStorage::Raw;
  std::int64_t encoded_bytes = 0;  // Encoded: the length of /bytes (set by the writer on close)

  std::int64_t channels() const { return sample_shape.empty() ? 0 : sample_shape[0]; }
  std::int64_t sample_numel() const { return shape_numel(sample_shape); }
  std::int64_t sample_bytes() const {
    return sample_numel() * static_cast<std::int64_t>(dtype_size(dtype));
  }
};

// "train-00003-of-00008.h5"
std::string shard_file_name(const std::string& name, std::int64_t index, std::int64_t count);
// The files DIR/NAME-*-of-*.h5 of the given set names whose file names are not in `keep`, sorted:
// what an earlier run left in a folder that a new run will not overwrite (other shard counts, a
// set the new run does not write). DIR/NAME and DIR readers would take them in with the new set.
std::vector<std::string> stale_shard_files(const std::string& dir,
                                           const std::vector<std::string>& names,
                                           const std::vector<std::string>& keep);

struct ShardWriterOptions {
  int deflate_level = kDefaultDeflateLevel;  // 0 = off, 1..9 = gzip level
  std::int64_t chunk_samples = 0;            // samples per /x chunk; 0 = from kDefaultChunkBytes
};

// Writes one shard. Samples are appended in any number of blocks; the file appears under its
// final name only when close() succeeds (it is written as PATH.tmp first), so an importer that
// dies half-way never leaves a valid-looking shard behind.
class ShardWriter {
 public:
  // meta.num_samples is ignored; mean/stddev are written when non-empty.
  ShardWriter(const std::string& path, const ShardMeta& meta, ShardWriterOptions options = {});
  ~ShardWriter();  // closes and discards the temporary file if close() was not called
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // x: n samples of meta.dtype, contiguous; y: n labels in [0, num_classes).
  void append(const void* x, const std::int32_t* y, std::int64_t n);
  // x: [n, ...sample_shape] host tensor of meta.dtype; y: i32 [n].
  void append(const Tensor& x, const Tensor& y);
  // Encoded storage: n samples whose bytes lie one after another in `bytes`, sample i
  // sizes[i] bytes long (at least 1); y: n labels.
  void append_encoded(const std::uint8_t* bytes, const std::int64_t* sizes, const std::int32_t* y,
                      std::int64_t n);
  // Sets the per-channel mean/std written at close(), replacing the constructor's: for importers
  // that know them only once every sample (of every rank) is seen. Before close().
  void set_stats(const std::vector<float>& mean, const std::vector<float>& stddev);
  void close();
  std::int64_t num_samples() const;
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One opened, validated shard. Safe to read from several threads (HDF5 here is built
// thread-safe and serialises calls); the handles stay open until destruction.
class ShardFile {
 public:
  // Checks every attribute and shape; throws lockstep::Error naming the file and the field.
  static std::unique_ptr<ShardFile> open(const std::string& path,
                                         std::size_t chunk_cache_bytes = kDefaultChunkCacheBytes);
  ~ShardFile();
  ShardFile(const ShardFile&) = delete;
  ShardFile& operator=(const ShardFile&) = delete;

  const std::string& path() const { return path_; }
  const ShardMeta& meta() const { return meta_; }
  // "/data/train-00003-of-00008.h5 (shard 3 of 8)", for messages.
  std::string where() const;

  // Samples [begin, begin + count) of /x, as meta().dtype, into out (count * sample_bytes).
  // Raw storage only.
  void read_x(std::int64_t begin, std::int64_t count, void* out) const;
  // Encoded storage: sample `index`'s file bytes, into out (resized to fit).
  void read_encoded(std::int64_t index, std::vector<std::uint8_t>& out) const;
  // All of /y, each label checked against [0, num_classes).
  std::vector<std::int32_t> read_y() const;

 private:
  ShardFile() = default;
  void open_raw_x(std::size_t chunk_cache_bytes);
  void open_encoded(std::size_t chunk_cache_bytes);
  std::string path_;
  ShardMeta meta_;
  std::int64_t file_ = -1;  // hid_t
  std::int64_t x_ = -1;
  std::int64_t y_ = -1;
  std::int64_t bytes_ = -1;            // Encoded: /bytes
  std::vector<std::int64_t> offsets_;  // Encoded: /offsets, n + 1 entries, checked at open
};

}  // namespace lockstep::data
