// Helpers for the data-layer tests: a temporary folder, synthetic shard sets whose every byte is
// a known function of (global index, element), and a raw-HDF5 shard writer that does not go
// through ShardWriter, so the reader is checked against the format itself and broken files can
// be made on purpose.
#pragma once

#include <hdf5.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/data/shard.hpp"
#include "support/temp_dir.hpp"

namespace lockstep::data::testing {

using TempDir = lockstep::test::TempDir;

// Element k of global sample i.
inline std::uint8_t u8_value(std::int64_t i, std::int64_t k) {
  return static_cast<std::uint8_t>((i * 7 + k * 13) % 251);
}
inline float f32_value(std::int64_t i, std::int64_t k) {
  return static_cast<float>(i) + 0.001f * static_cast<float>(k);
}
inline std::int32_t label_of(std::int64_t i, std::int64_t classes) {
  return static_cast<std::int32_t>((i * 3) % classes);
}

struct SetSpec {
  std::string name = "train";
  std::int64_t num_samples = 50;
  std::int64_t num_shards = 4;
  std::int64_t num_classes = 5;
  Shape sample_shape{2, 3, 4};
  DType dtype = DType::U8;
  int deflate_level = 0;
  std::int64_t chunk_samples = 3;  // small, so runs cross chunks
};

// Writes the set with ShardWriter (shard s holds global samples [s*n/S, (s+1)*n/S)).
std::vector<std::string> write_set(const std::string& dir, const SetSpec& spec);

// The reference sample i as bytes.
std::vector<std::uint8_t> reference_sample(const SetSpec& spec, std::int64_t i);

// A shard written with raw HDF5 calls; every field can be broken on purpose.
struct RawShard {
  std::optional<std::string> format = std::string("lockstep-shard");
  bool variable_length_format = false;  // as h5py writes strings
  std::optional<std::int64_t> version = 1;
  std::optional<std::int64_t> shard_index = 0;
  std::optional<std::int64_t> num_shards = 1;
  std::optional<std::int64_t> num_classes = 10;
  std::optional<std::vector<std::int64_t>> sample_shape = std::vector<std::int64_t>{1, 2, 2};
  std::vector<float> mean, stddev;
  std::vector<hsize_t> x_dims{6, 1, 2, 2};
  bool x_float = false;
  std::vector<std::int32_t> y{0, 1, 2, 3, 4, 5};
  // > 0: /x in chunks of this many samples, deflated at `deflate_level` (as lockstep-shard wrote
  // shards before they carried Fletcher-32 checksums); 0: contiguous.
  hsize_t x_chunk_samples = 0;
  unsigned deflate_level = 0;
};
void write_raw_shard(const std::string& path, const RawShard& spec);

// Overwrites every byte of the first /x chunk of a (chunked) shard with `fill`, found with HDF5
// itself; returns the chunk's size in bytes (0 if it could not be found).
std::uint64_t damage_first_chunk(const std::string& path, char fill);

}  // namespace lockstep::data::testing
