#include "data_test_util.hpp"

#include <algorithm>
#include <cstring>
#include <fstream>

#include "lockstep/core/tensor.hpp"

namespace lockstep::data::testing {

std::vector<std::uint8_t> reference_sample(const SetSpec& spec, std::int64_t i) {
  const std::int64_t numel = shape_numel(spec.sample_shape);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(numel * dtype_size(spec.dtype)));
  for (std::int64_t k = 0; k < numel; ++k) {
    if (spec.dtype == DType::U8) {
      out[k] = u8_value(i, k);
    } else {
      float v = f32_value(i, k);
      std::memcpy(out.data() + k * 4, &v, 4);
    }
  }
  return out;
}

std::vector<std::string> write_set(const std::string& dir, const SetSpec& spec) {
  std::vector<std::string> paths;
  ShardMeta meta;
  meta.num_shards = spec.num_shards;
  meta.num_classes = spec.num_classes;
  meta.sample_shape = spec.sample_shape;
  meta.dtype = spec.dtype;
  ShardWriterOptions options;
  options.deflate_level = spec.deflate_level;
  options.chunk_samples = spec.chunk_samples;
  for (std::int64_t s = 0; s < spec.num_shards; ++s) {
    const std::int64_t begin = s * spec.num_samples / spec.num_shards;
    const std::int64_t end = (s + 1) * spec.num_samples / spec.num_shards;
    meta.shard_index = s;
    std::string path = dir + "/" + shard_file_name(spec.name, s, spec.num_shards);
    ShardWriter w(path, meta, options);
    // Appended in blocks of at most 4 samples, to exercise growing the datasets.
    for (std::int64_t b = begin; b < end; b += 4) {
      std::vector<std::uint8_t> x;
      std::vector<std::int32_t> y;
      for (std::int64_t i = b; i < std::min(end, b + 4); ++i) {
        auto sample = reference_sample(spec, i);
        x.insert(x.end(), sample.begin(), sample.end());
        y.push_back(label_of(i, spec.num_classes));
      }
      w.append(x.data(), y.data(), static_cast<std::int64_t>(y.size()));
    }
    w.close();
    paths.push_back(path);
  }
  return paths;
}

namespace {
void int_attr(hid_t f, const char* name, std::int64_t v) {
  hid_t s = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(f, name, H5T_STD_I32LE, s, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, H5T_NATIVE_INT64, &v);
  H5Aclose(a);
  H5Sclose(s);
}
template <class T>
void array_attr(hid_t f, const char* name, const std::vector<T>& v, hid_t ftype, hid_t mtype) {
  hsize_t n = v.size();
  hid_t s = H5Screate_simple(1, &n, nullptr);
  hid_t a = H5Acreate2(f, name, ftype, s, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, mtype, v.data());
  H5Aclose(a);
  H5Sclose(s);
}
}  // namespace

void write_raw_shard(const std::string& path, const RawShard& spec) {
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (spec.format) {
    hid_t t = H5Tcopy(H5T_C_S1);
    hid_t s = H5Screate(H5S_SCALAR);
    if (spec.variable_length_format) {
      H5Tset_size(t, H5T_VARIABLE);
      hid_t a = H5Acreate2(f, "format", t, s, H5P_DEFAULT, H5P_DEFAULT);
      const char* text = spec.format->c_str();
      H5Awrite(a, t, &text);
      H5Aclose(a);
    } else {
      H5Tset_size(t, spec.format->size());
      hid_t a = H5Acreate2(f, "format", t, s, H5P_DEFAULT, H5P_DEFAULT);
      H5Awrite(a, t, spec.format->c_str());
      H5Aclose(a);
    }
    H5Sclose(s);
    H5Tclose(t);
  }
  if (spec.version) int_attr(f, "version", *spec.version);
  if (spec.shard_index) int_attr(f, "shard_index", *spec.shard_index);
  if (spec.num_shards) int_attr(f, "num_shards", *spec.num_shards);
  if (spec.num_classes) int_attr(f, "num_classes", *spec.num_classes);
  if (spec.sample_shape)
    array_attr(f, "sample_shape", *spec.sample_shape, H5T_STD_I64LE, H5T_NATIVE_INT64);
  if (!spec.mean.empty()) array_attr(f, "mean", spec.mean, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT);
  if (!spec.stddev.empty()) array_attr(f, "std", spec.stddev, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT);

  // /x contiguous unless asked (the format asks writers for chunks; readers must not depend on it).
  hsize_t numel = 1;
  for (auto d : spec.x_dims)
    numel *= d;
  hid_t xs = H5Screate_simple(static_cast<int>(spec.x_dims.size()), spec.x_dims.data(), nullptr);
  hid_t xp = H5Pcreate(H5P_DATASET_CREATE);
  if (spec.x_chunk_samples > 0) {
    std::vector<hsize_t> chunk = spec.x_dims;
    chunk[0] = spec.x_chunk_samples;
    H5Pset_chunk(xp, static_cast<int>(chunk.size()), chunk.data());
    if (spec.deflate_level > 0) H5Pset_deflate(xp, spec.deflate_level);
  }
  hid_t x = H5Dcreate2(f, "x", spec.x_float ? H5T_IEEE_F32LE : H5T_STD_U8LE, xs, H5P_DEFAULT, xp,
                       H5P_DEFAULT);
  H5Pclose(xp);
  if (spec.x_float) {
    std::vector<float> data(numel);
    for (hsize_t i = 0; i < numel; ++i)
      data[i] = static_cast<float>(i);
    H5Dwrite(x, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data());
  } else {
    std::vector<std::uint8_t> data(numel);
    for (hsize_t i = 0; i < numel; ++i)
      data[i] = static_cast<std::uint8_t>(i);
    H5Dwrite(x, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data());
  }
  H5Dclose(x);
  H5Sclose(xs);
  hsize_t ny = spec.y.size();
  hid_t ys = H5Screate_simple(1, &ny, nullptr);
  hid_t y = H5Dcreate2(f, "y", H5T_STD_I32LE, ys, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (ny) H5Dwrite(y, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, spec.y.data());
  H5Dclose(y);
  H5Sclose(ys);
  H5Fclose(f);
}

std::uint64_t damage_first_chunk(const std::string& path, char fill) {
  haddr_t offset = 0;
  hsize_t size = 0;
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t x = H5Dopen2(f, "x", H5P_DEFAULT);
  hsize_t origin[H5S_MAX_RANK] = {};
  unsigned mask = 0;
  const bool found = H5Dget_chunk_info_by_coord(x, origin, &mask, &offset, &size) >= 0;
  H5Dclose(x);
  H5Fclose(f);
  if (!found) return 0;
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  io.seekp(static_cast<std::streamoff>(offset));
  for (hsize_t i = 0; i < size; ++i)
    io.put(fill);
  return size;
}

}  // namespace lockstep::data::testing
