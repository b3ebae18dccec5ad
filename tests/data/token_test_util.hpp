// Helpers for the token-data tests: token sets whose every id is a known function of its position
// in the stream, and a raw-HDF5 token shard writer that does not go through TokenShardWriter, so
// the reader is checked against the format itself and broken files can be made on purpose.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/data/shard.hpp"
#include "lockstep/data/token_shard.hpp"

namespace lockstep::data::testing {

// Id of the token at stream position p.
inline std::int32_t token_at(std::int64_t p, std::int64_t vocab) {
  return static_cast<std::int32_t>((p * 7919 + 13) % vocab);
}

// Writes shards of the given sizes holding token_at(0..), token_at(1..), ... in order.
inline std::vector<std::string> write_token_shards(const std::string& dir, const std::string& name,
                                                   const std::vector<std::int64_t>& sizes,
                                                   std::int64_t vocab = 300,
                                                   const std::string& tokenizer = "test") {
  std::vector<std::string> paths;
  std::int64_t p = 0;
  for (std::size_t s = 0; s < sizes.size(); ++s) {
    TokenShardMeta m;
    m.shard_index = static_cast<std::int64_t>(s);
    m.num_shards = static_cast<std::int64_t>(sizes.size());
    m.tokenizer = tokenizer;
    m.vocab_size = vocab;
    m.eot_token = vocab - 1;
    const std::string path = dir + "/" + shard_file_name(name, m.shard_index, m.num_shards);
    TokenShardWriter w(path, m);
    std::vector<std::int32_t> ids;
    for (std::int64_t i = 0; i < sizes[s]; ++i)
      ids.push_back(token_at(p++, vocab));
    // In two appends, to exercise growing /tokens.
    const auto half = ids.size() / 2;
    w.append(std::span(ids).subspan(0, half));
    w.append(std::span(ids).subspan(half));
    w.close();
    paths.push_back(path);
  }
  return paths;
}

// A token shard written with raw HDF5 calls; every field can be broken on purpose.
struct RawTokenShard {
  std::optional<std::string> format = std::string("lockstep-shard");
  std::optional<std::string> kind = std::string("tokens");
  std::optional<std::int64_t> version = 1;
  std::optional<std::int64_t> shard_index = 0;
  std::optional<std::int64_t> num_shards = 1;
  std::optional<std::string> tokenizer = std::string("bytes");
  std::optional<std::int64_t> vocab_size = 256;
  std::optional<std::int64_t> eot_token = 0;
  hid_t file_type = H5T_STD_U16LE;
  std::vector<std::uint32_t> tokens{0, 72, 105, 0, 33};
  bool chunked = false;  // contiguous by default: readers must not depend on chunking
};

inline void write_raw_token_shard(const std::string& path, const RawTokenShard& spec) {
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  auto str_attr = [&](const char* name, const std::string& v) {
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, v.size());
    hid_t s = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, name, t, s, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, t, v.c_str());
    H5Aclose(a);
    H5Sclose(s);
    H5Tclose(t);
  };
  auto int_attr = [&](const char* name, std::int64_t v) {
    hid_t s = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, name, H5T_STD_I32LE, s, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT64, &v);
    H5Aclose(a);
    H5Sclose(s);
  };
  if (spec.format) str_attr("format", *spec.format);
  if (spec.kind) str_attr("kind", *spec.kind);
  if (spec.version) int_attr("version", *spec.version);
  if (spec.shard_index) int_attr("shard_index", *spec.shard_index);
  if (spec.num_shards) int_attr("num_shards", *spec.num_shards);
  if (spec.tokenizer) str_attr("tokenizer", *spec.tokenizer);
  if (spec.vocab_size) int_attr("vocab_size", *spec.vocab_size);
  if (spec.eot_token) int_attr("eot_token", *spec.eot_token);
  hsize_t n = spec.tokens.size();
  hid_t s = H5Screate_simple(1, &n, nullptr);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  if (spec.chunked) {
    hsize_t chunk = 2;
    H5Pset_chunk(dcpl, 1, &chunk);
  }
  hid_t d = H5Dcreate2(f, "tokens", spec.file_type, s, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  if (n) H5Dwrite(d, H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, spec.tokens.data());
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(s);
  H5Fclose(f);
}

}  // namespace lockstep::data::testing
