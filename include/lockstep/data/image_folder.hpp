// Image datasets as users keep them, to image shards (docs/IMAGES.md): an ImageFolder
// (ROOT/<class>/ <file>, torchvision's layout) or a list of "path,label" lines, read in one fixed
// order, and the conversion of any contiguous part of that order into one shard of u8 [3, S, S]
// samples. The order and the shard boundaries depend only on the files and the shard count, never
// on how many ranks convert, so N ranks write the same shards as one (lockstep-shard images).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/data/image.hpp"
#include "lockstep/data/shard.hpp"

namespace lockstep::data {

// The default size of one image shard when --shards is not given: large enough that a set of
// ImageNet's size (150 KB a 224x224 sample) is a few hundred files, small enough that a set of a
// few GB still has a shard for each of a few dozen converting ranks.
inline constexpr std::int64_t kDefaultImageShardBytes = 256ll << 20;

// File names an ImageFolder takes as images (case-insensitive); others are counted as ignored.
inline constexpr const char* kImageExtensions[] = {".jpg", ".jpeg", ".png"};

struct ImageList {
  std::vector<std::string> paths;    // in conversion order
  std::vector<std::int32_t> labels;  // one per path, in [0, num_classes)
  std::int64_t num_classes = 0;
  std::vector<std::string> class_names;    // ImageFolder: label k's folder name; a list: empty
  std::vector<std::string> empty_classes;  // class folders without an image file
  std::int64_t ignored_files = 0;          // files that are not images by their name
  std::string ignored_example;             // one of them, for the summary
};

// ROOT/<class>/... : class folders sorted by name (bytewise, as Python's sorted()) are labels
// 0..K-1; the image files under each (subfolders included, followed as torchvision follows them)
// sorted by path. Names starting with '.' are skipped. A class folder without images is an error
// naming it unless allow_empty_classes (the class keeps its label: later labels never shift).
ImageList list_image_folder(const std::string& root, bool allow_empty_classes);

// A text file of "path,label" lines (the last comma separates; blank lines and lines starting
// with '#' are skipped); relative paths are relative to `base` (the list file's folder when
// empty). num_classes 0: the largest label + 1. Errors name the list file and the line.
ImageList read_image_list(const std::string& list_file, const std::string& base,
                          std::int64_t num_classes);

// Shard s of `count` covers list entries [s*M/count, (s+1)*M/count).
std::int64_t image_shard_begin(std::int64_t entries, std::int64_t shard, std::int64_t count);

struct ImageShardOptions {
  std::int64_t side = 0;  // samples are u8 [3, side, side]
  ImageFit fit = ImageFit::CenterCrop;
  // Encoded: each file's own bytes are stored (decoded here only to check it and for the
  // statistics), and the loader decodes them; fit must be CenterCrop, what the loader makes.
  SampleStorage storage = SampleStorage::Raw;
  // Encoded: JPEGs are stored re-encoded losslessly with restart markers (jpeg_with_restarts), so
  // that the loader's crops decode only the data they touch; false stores the files' bytes as
  // they are.
  bool jpeg_restarts = true;
  bool skip_bad = false;  // a file that cannot be decoded is skipped (and listed), not an error
  int threads = 1;        // images decoded at once (the result does not depend on it)
  ShardWriterOptions writer;
};

// One shard being written: its samples are appended, mean/std not yet known (they need every
// shard's sums). The caller sets them with writer->set_stats and closes it.
struct ImageShard {
  std::unique_ptr<ShardWriter> writer;
  std::vector<std::int64_t> sum, sum_sq;  // per channel, over every pixel written: exact integers
  std::int64_t pixels = 0;                // per channel
  std::int64_t encoded_bytes = 0;         // encoded storage: the bytes stored
  std::int64_t file_bytes = 0;            // encoded storage: the files' own sizes
  std::vector<std::string> skipped;       // "PATH: why", with skip_bad
};

// Decodes entries [begin, end) of `list` into a new shard at `path` described by `meta`
// (sample_shape [3, side, side], u8, storage as options.storage, no mean/std yet). Every file is
// decoded completely whatever the storage, so a bad file is found here, not by the loader. Without
// skip_bad the first bad file throws (naming it); the half-written shard is discarded.
ImageShard convert_image_shard(const ImageList& list, std::int64_t begin, std::int64_t end,
                               const std::string& path, const ShardMeta& meta,
                               const ImageShardOptions& options);

// Mean and population std per channel, in [0, 1] pixel units, from exact sums.
void image_stats(const std::vector<std::int64_t>& sum, const std::vector<std::int64_t>& sum_sq,
                 std::int64_t pixels, std::vector<float>& mean, std::vector<float>& stddev);

}  // namespace lockstep::data
