// Importers behind lockstep-shard: idx (MNIST / Fashion-MNIST, gzipped or raw) and CSV files to
// in-memory arrays, per-channel statistics, and splitting an array into a shard set.
// Bad inputs (bad magic, truncated data, unparsable fields) are errors naming the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/core/tensor.hpp"
#include "lockstep/data/shard.hpp"

namespace lockstep::data {

// An idx file of unsigned bytes (type 0x08), as u8 with the file's dimensions
// (idx3 images: [n, rows, cols]; idx1 labels: [n]). Reads .gz transparently.
Tensor read_idx_u8(const std::string& path);

struct LabeledArray {
  Tensor x;                              // host, U8 or F32, [n, ...sample_shape]
  std::vector<std::int32_t> y;           // [n]
  std::int64_t num_classes = 0;          // max label + 1 unless given
  std::vector<std::string> class_names;  // optional: label k's name (ShardMeta::class_names)
};

// MNIST-style pair: idx3 images and idx1 labels -> u8 [n, 1, rows, cols].
LabeledArray read_idx_pair(const std::string& images_path, const std::string& labels_path);

struct CsvOptions {
  std::string label_column = "0";  // a 0-based index or a header name
  Shape sample_shape;              // product must equal the number of feature columns
  DType dtype = DType::F32;        // U8 requires integers in [0, 255]
  std::int64_t num_classes = 0;    // 0: max label + 1
};
// One sample per row; a first row with any non-numeric field is a header.
LabeledArray read_csv(const std::string& path, const CsvOptions& options);

// Per-channel (x.dim(1)) population mean and standard deviation in double, with u8 data scaled to
// [0, 1]: what ops::normalize_input expects.
void channel_stats(const Tensor& x, std::vector<float>& mean, std::vector<float>& stddev);

// Writes data as num_shards files DIR/NAME-XXXXX-of-NNNNN.h5 (contiguous, near-equal parts, in
// order) carrying the given mean/std; returns the paths.
std::vector<std::string> write_shard_set(const LabeledArray& data, const std::string& out_dir,
                                         const std::string& name, std::int64_t num_shards,
                                         const std::vector<float>& mean,
                                         const std::vector<float>& stddev,
                                         ShardWriterOptions options = {});

}  // namespace lockstep::data
