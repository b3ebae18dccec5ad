#include "lockstep/data/shard.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <type_traits>

#include "lockstep/core/file.hpp"
#include "lockstep/h5/h5.hpp"

namespace lockstep::data {

static_assert(std::is_same_v<hid_t, std::int64_t>, "ShardFile stores hid_t as int64");

namespace {

hid_t file_type(DType t) {
  LOCKSTEP_CHECK(t == DType::U8 || t == DType::F32 || t == DType::I32,
                 "the shard format stores u8 or f32 samples, not ", dtype_name(t));
  return h5::file_type(t);
}
hid_t native_type(DType t) {
  LOCKSTEP_CHECK(t == DType::U8 || t == DType::F32 || t == DType::I32,
                 "the shard format stores u8 or f32 samples, not ", dtype_name(t));
  return h5::memory_type(t);
}

std::vector<hsize_t> dims_of(std::int64_t n, const Shape& sample_shape) {
  std::vector<hsize_t> dims{static_cast<hsize_t>(n)};
  for (auto d : sample_shape)
    dims.push_back(static_cast<hsize_t>(d));
  return dims;
}

void validate_meta(const ShardMeta& m, const std::string& where, const char* hint) {
  LOCKSTEP_CHECK_HINT(m.dtype == DType::U8 || m.dtype == DType::F32, hint, where,
                      ": samples must be u8 or f32, not ", dtype_name(m.dtype));
  LOCKSTEP_CHECK_HINT(m.num_shards >= 1, hint, where, ": attribute 'num_shards' is ", m.num_shards,
                      ", must be at least 1");
  LOCKSTEP_CHECK_HINT(m.shard_index >= 0 && m.shard_index < m.num_shards, hint, where,
                      ": attribute 'shard_index' is ", m.shard_index, ", outside [0, ",
                      m.num_shards, ")");
  LOCKSTEP_CHECK_HINT(m.num_classes >= 1, hint, where, ": attribute 'num_classes' is ",
                      m.num_classes, ", must be at least 1");
  LOCKSTEP_CHECK_HINT(!m.sample_shape.empty(), hint, where,
                      ": attribute 'sample_shape' is empty (a sample needs at least one axis)");
  for (auto d : m.sample_shape) {
    LOCKSTEP_CHECK_HINT(d >= 1, hint, where, ": attribute 'sample_shape' is ",
                        shape_str(m.sample_shape), ", every extent must be at least 1");
  }
  LOCKSTEP_CHECK_HINT(m.mean.empty() == m.stddev.empty(), hint, where,
                      ": has only one of the attributes 'mean' and 'std'");
  auto c = static_cast<std::size_t>(m.channels());
  LOCKSTEP_CHECK_HINT(m.mean.empty() || m.mean.size() == c, hint, where, ": attribute 'mean' has ",
                      m.mean.size(), " values for ", c, " channels");
  LOCKSTEP_CHECK_HINT(m.stddev.empty() || m.stddev.size() == c, hint, where,
                      ": attribute 'std' has ", m.stddev.size(), " values for ", c, " channels");
  // Statistics computed over data holding a NaN or an Inf are NaN or Inf themselves: say so here,
  // before they normalise every sample into NaN (or before two shards "disagree" on [nan]).
  for (const auto* stat : {&m.mean, &m.stddev}) {
    for (std::size_t ch = 0; ch < stat->size(); ++ch) {
      LOCKSTEP_CHECK_HINT(std::isfinite((*stat)[ch]),
                          "the data it was computed from holds NaN or Inf: clean it and "
                          "regenerate the shards with lockstep-shard",
                          where, ": attribute '", stat == &m.mean ? "mean" : "std", "' of channel ",
                          ch, " is ", (*stat)[ch], ", not a finite number");
    }
  }
  for (float s : m.stddev) {
    LOCKSTEP_CHECK_HINT(s > 0, hint, where, ": attribute 'std' holds ", s,
                        ": every channel's std must be positive");
  }
  LOCKSTEP_CHECK_HINT(m.storage == SampleStorage::Raw ||
                          (m.dtype == DType::U8 && m.sample_shape.size() == 3 &&
                           m.sample_shape[0] == 3 && m.sample_shape[1] == m.sample_shape[2]),
                      hint, where, ": encoded images decode to u8 [3, S, S] samples, but the ",
                      "shard says ", dtype_name(m.dtype), " ", shape_str(m.sample_shape));
  LOCKSTEP_CHECK_HINT(
      m.class_names.empty() || static_cast<std::int64_t>(m.class_names.size()) == m.num_classes,
      hint, where, ": attribute 'class_names' names ", m.class_names.size(),
      " classes but 'num_classes' is ", m.num_classes);
  for (const auto& name : m.class_names) {
    LOCKSTEP_CHECK_HINT(name.find('\n') == std::string::npos, hint, where, ": class name '", name,
                        "' holds a newline, which 'class_names' uses to separate names");
  }
}

std::string join_lines(const std::vector<std::string>& names) {
  std::string joined;
  for (std::size_t i = 0; i < names.size(); ++i)
    joined += (i ? "\n" : "") + names[i];
  return joined;
}

std::vector<std::string> split_lines(const std::string& joined) {
  std::vector<std::string> names;
  std::size_t start = 0;
  for (;;) {
    const std::size_t nl = joined.find('\n', start);
    names.push_back(joined.substr(start, nl == std::string::npos ? nl : nl - start));
    if (nl == std::string::npos) return names;
    start = nl + 1;
  }
}

// A dataspace is only a claim: a few KB of HDF5 can declare 2^40 samples and store none (HDF5
// then reads fill values), which would make the reader allocate for all of them. Every sample a
// shard claims must have stored data, in this file: all chunks present (the writer writes every
// one), or contiguous storage allocated, or compact data. (H5Dget_space_status cannot tell for
// chunks: it compares byte counts, which compression and checksums change.)
void require_stored(hid_t dataset, const char* name, std::int64_t samples,
                    const std::string& where) {
  auto dcpl = h5::plist(LOCKSTEP_H5(H5Dget_create_plist(dataset), kRegenerateHint, where,
                                    "cannot read the storage properties of /", name));
  LOCKSTEP_CHECK_HINT(H5Pget_external_count(dcpl.get()) == 0, kRegenerateHint, where, ": /", name,
                      " is stored in external files, not in the shard");
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  bool stored = true;
  if (samples == 0 || layout == H5D_COMPACT) {
    stored = true;
  } else if (layout == H5D_CONTIGUOUS) {
    H5D_space_status_t status = H5D_SPACE_STATUS_ERROR;
    LOCKSTEP_H5(H5Dget_space_status(dataset, &status), kRegenerateHint, where,
                "cannot query the storage of /", name);
    stored = status == H5D_SPACE_STATUS_ALLOCATED;
  } else if (layout == H5D_CHUNKED) {
    const int rank = LOCKSTEP_H5(H5Pget_chunk(dcpl.get(), 0, nullptr), kRegenerateHint, where,
                                 "cannot read the chunking of /", name);
    std::vector<hsize_t> chunk(static_cast<std::size_t>(rank)), dims(chunk.size());
    H5Pget_chunk(dcpl.get(), rank, chunk.data());
    auto space = h5::space(H5Dget_space(dataset));
    LOCKSTEP_CHECK_HINT(H5Sget_simple_extent_ndims(space.get()) == rank, kRegenerateHint, where,
                        ": /", name, " has chunks of another rank than its data");
    H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    hsize_t expected = 1;
    for (std::size_t i = 0; i < dims.size() && stored; ++i) {
      stored = chunk[i] > 0 &&
               !__builtin_mul_overflow(expected, (dims[i] + chunk[i] - 1) / chunk[i], &expected);
    }
    hsize_t present = 0;
    LOCKSTEP_H5(H5Dget_num_chunks(dataset, space.get(), &present), kRegenerateHint, where,
                "cannot count the chunks of /", name);
    stored = stored && present == expected;
  } else {
    LOCKSTEP_FAIL_HINT(kRegenerateHint, where, ": /", name,
                       " has an unsupported storage layout (virtual?)");
  }
  LOCKSTEP_CHECK_HINT(stored, kRegenerateHint, where, ": /", name, " has no data stored for ",
                      layout == H5D_CHUNKED ? "some of " : "", "its ", samples,
                      " samples (truncated, or never written)");
}

std::int64_t auto_chunk_samples(const ShardMeta& m) {
  return std::max<std::int64_t>(1,
                                kDefaultChunkBytes / std::max<std::int64_t>(1, m.sample_bytes()));
}

}  // namespace

const char* sample_storage_name(SampleStorage storage) {
  return storage == SampleStorage::Encoded ? "encoded" : "raw";
}
SampleStorage sample_storage_from_name(const std::string& name) {
  if (name == "raw") return SampleStorage::Raw;
  if (name == "encoded") return SampleStorage::Encoded;
  LOCKSTEP_FAIL_HINT("raw (decoded u8 pixels) or encoded (the files' own JPEG/PNG bytes)",
                     "unknown sample storage '", name, "'");
}

std::string shard_file_name(const std::string& name, std::int64_t index, std::int64_t count) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05lld-of-%05lld.h5", static_cast<long long>(index),
                static_cast<long long>(count));
  return name + buf;
}

std::vector<std::string> stale_shard_files(const std::string& dir,
                                           const std::vector<std::string>& names,
                                           const std::vector<std::string>& keep) {
  // NAME-<digits>-of-<digits>.h5, as shard_file_name writes it (five digits, more past 99999).
  auto is_shard_of = [](std::string_view file, std::string_view name) {
    const std::string_view suffix = ".h5";
    if (file.size() <= name.size() + 1 + suffix.size() || file.substr(0, name.size()) != name ||
        file[name.size()] != '-' || file.substr(file.size() - suffix.size()) != suffix)
      return false;
    const std::string_view mid =
        file.substr(name.size() + 1, file.size() - name.size() - 1 - suffix.size());
    const auto of = mid.find("-of-");
    auto digits = [](std::string_view d) {
      return !d.empty() &&
             std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    return of != std::string_view::npos && digits(mid.substr(0, of)) && digits(mid.substr(of + 4));
  };
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string file = entry.path().filename().string();
    if (std::find(keep.begin(), keep.end(), file) != keep.end()) continue;
    for (const auto& name : names)
      if (is_shard_of(file, name)) {
        out.push_back(entry.path().string());
        break;
      }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// ---------------------------------------------------------------------------------------------
struct ShardWriter::Impl {
  std::string path, tmp_path;
  ShardMeta meta;
  h5::Handle file, x, y;
  std::int64_t n = 0;
  h5::Handle bytes, offsets;          // Encoded
  std::vector<std::int64_t> ends{0};  // Encoded: /offsets, written at close
  bool closed = false;
};

ShardWriter::ShardWriter(const std::string& path, const ShardMeta& meta, ShardWriterOptions options)
    : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  m.path = path;
  m.tmp_path = path + ".tmp";
  m.meta = meta;
  m.meta.num_samples = 0;
  validate_meta(m.meta, path, "");
  LOCKSTEP_CHECK(options.deflate_level >= 0 && options.deflate_level <= 9, path, ": deflate level ",
                 options.deflate_level, " is outside 0..9");
  h5::Scope scope;
  // Checksums, so a damaged shard is an error instead of wrong samples or a crash inside HDF5
  // (docs/FUZZING.md): the 1.10 format checksums every object header (HDF5 1.10 crashes on some
  // damaged version-1 headers) and the chunk index (1.8's version-1 B-tree has none: a flipped
  // byte there moved a chunk or skipped its filters, reading zeros or deflated bytes as
  // samples), and Fletcher-32 (below) checksums every chunk. Readers need HDF5 1.10 or later.
  h5::CreateOptions create;
  create.v110_format = true;
  // No object times: converting the same data twice, or with any number of ranks, must give
  // byte-identical shards (lockstep-shard images is tested with cmp).
  create.track_times = false;
  m.file = h5::create_file(m.tmp_path, create, "does the output folder exist and is it writable?");

  auto make = [&](const char* name, hid_t type, std::size_t type_size, const Shape& sample_shape,
                  std::int64_t chunk) {
    auto dims = dims_of(0, sample_shape);
    auto maxdims = dims;
    maxdims[0] = H5S_UNLIMITED;
    auto chunk_dims = dims_of(chunk, sample_shape);
    auto space =
        h5::space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), maxdims.data()));
    auto dcpl = h5::plist(H5Pcreate(H5P_DATASET_CREATE));
    H5Pset_obj_track_times(dcpl.get(), 0);
    LOCKSTEP_H5(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk_dims.size()), chunk_dims.data()),
                "", m.tmp_path, "cannot set the chunking of /", name);
    if (options.deflate_level > 0) {
      // Byte-shuffling groups the exponent bytes of floats together, which deflate likes.
      if (type_size > 1) H5Pset_shuffle(dcpl.get());
      LOCKSTEP_H5(H5Pset_deflate(dcpl.get(), static_cast<unsigned>(options.deflate_level)),
                  "is zlib available to HDF5?", m.tmp_path, "cannot enable deflate for /", name);
    }
    // Last in the pipeline: it checksums the stored bytes and is verified first on read.
    LOCKSTEP_H5(H5Pset_fletcher32(dcpl.get()), "", m.tmp_path, "cannot enable checksums for /",
                name);
    return h5::dataset(LOCKSTEP_H5(
        H5Dcreate2(m.file.get(), name, type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), "",
        m.tmp_path, "cannot create /", name));
  };
  std::int64_t chunk =
      options.chunk_samples > 0 ? options.chunk_samples : auto_chunk_samples(m.meta);
  const bool encoded = m.meta.storage == SampleStorage::Encoded;
  if (encoded) {
    m.bytes = make("bytes", H5T_STD_U8LE, 1, {}, kDefaultChunkBytes);
    m.offsets = make("offsets", H5T_STD_I64LE, 8, {}, kLabelChunkSamples);
  } else {
    m.x = make("x", file_type(m.meta.dtype), dtype_size(m.meta.dtype), m.meta.sample_shape, chunk);
  }
  m.y = make("y", file_type(DType::I32), 4, {}, kLabelChunkSamples);

  hid_t f = m.file.get();
  h5::write_string_attr(f, "format", kShardFormatName, m.tmp_path);
  h5::write_int_attr(f, "version", encoded ? kEncodedShardFormatVersion : kShardFormatVersion,
                     m.tmp_path);
  if (encoded) h5::write_string_attr(f, "storage", "encoded", m.tmp_path);
  h5::write_int_attr(f, "shard_index", m.meta.shard_index, m.tmp_path);
  h5::write_int_attr(f, "num_shards", m.meta.num_shards, m.tmp_path);
  h5::write_int_attr(f, "num_classes", m.meta.num_classes, m.tmp_path);
  h5::write_ints_attr(f, "sample_shape", m.meta.sample_shape, m.tmp_path);
  if (!m.meta.class_names.empty())
    h5::write_string_attr(f, "class_names", join_lines(m.meta.class_names), m.tmp_path);
  // mean/std are written at close(): set_stats may still change them.
}

ShardWriter::~ShardWriter() {
  if (!impl_ || impl_->closed) return;
  h5::Scope scope;
  impl_->x.reset();
  impl_->y.reset();
  impl_->bytes.reset();
  impl_->offsets.reset();
  impl_->file.reset();
  std::error_code ec;
  std::filesystem::remove(impl_->tmp_path, ec);
}

namespace {
// Appends n items of shape item_shape at position at of a dataset extensible along axis 0.
void append_rows(const h5::Handle& ds, const std::string& path, const char* name, hid_t mem_type,
                 std::int64_t at, std::int64_t n, const Shape& item_shape, const void* data) {
  auto new_dims = dims_of(at + n, item_shape);
  LOCKSTEP_H5(H5Dset_extent(ds.get(), new_dims.data()), "", path, "cannot grow /", name);
  auto fspace = h5::space(H5Dget_space(ds.get()));
  auto start = dims_of(at, item_shape);
  std::fill(start.begin() + 1, start.end(), 0);
  auto count = dims_of(n, item_shape);
  LOCKSTEP_H5(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(),
                                  nullptr),
              "", path, "cannot select in /", name);
  auto mspace = h5::space(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr));
  LOCKSTEP_H5(H5Dwrite(ds.get(), mem_type, mspace.get(), fspace.get(), H5P_DEFAULT, data),
              "is the disk full?", path, "cannot write /", name);
}
}  // namespace

void ShardWriter::append_encoded(const std::uint8_t* bytes, const std::int64_t* sizes,
                                 const std::int32_t* y, std::int64_t n) {
  auto& m = *impl_;
  LOCKSTEP_CHECK(!m.closed, m.path, ": append after close");
  LOCKSTEP_CHECK(m.meta.storage == SampleStorage::Encoded, m.path,
                 ": append_encoded to a shard of raw samples");
  LOCKSTEP_CHECK(n >= 0, m.path, ": cannot append ", n, " samples");
  if (n == 0) return;
  std::int64_t total = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    LOCKSTEP_CHECK(sizes[i] >= 1, m.path, ": encoded sample ", m.n + i, " is empty");
    LOCKSTEP_CHECK(y[i] >= 0 && y[i] < m.meta.num_classes, m.path, ": label of sample ", m.n + i,
                   " is ", y[i], ", outside [0, ", m.meta.num_classes, ")");
    total += sizes[i];
  }
  h5::Scope scope;
  append_rows(m.bytes, m.tmp_path, "bytes", H5T_NATIVE_UINT8, m.ends.back(), total, {}, bytes);
  append_rows(m.y, m.tmp_path, "y", H5T_NATIVE_INT32, m.n, n, {}, y);
  for (std::int64_t i = 0; i < n; ++i)
    m.ends.push_back(m.ends.back() + sizes[i]);
  m.n += n;
}

void ShardWriter::append(const void* x, const std::int32_t* y, std::int64_t n) {
  auto& m = *impl_;
  LOCKSTEP_CHECK(!m.closed, m.path, ": append after close");
  LOCKSTEP_CHECK(m.meta.storage == SampleStorage::Raw, m.path,
                 ": append of raw samples to a shard of encoded ones (append_encoded)");
  LOCKSTEP_CHECK(n >= 0, m.path, ": cannot append ", n, " samples");
  if (n == 0) return;
  for (std::int64_t i = 0; i < n; ++i) {
    LOCKSTEP_CHECK(y[i] >= 0 && y[i] < m.meta.num_classes, m.path, ": label of sample ", m.n + i,
                   " is ", y[i], ", outside [0, ", m.meta.num_classes, ")");
  }
  h5::Scope scope;
  append_rows(m.x, m.tmp_path, "x", native_type(m.meta.dtype), m.n, n, m.meta.sample_shape, x);
  append_rows(m.y, m.tmp_path, "y", native_type(DType::I32), m.n, n, {}, y);
  m.n += n;
}

void ShardWriter::append(const Tensor& x, const Tensor& y) {
  auto& m = *impl_;
  LOCKSTEP_CHECK(x.device().is_cpu() && y.device().is_cpu(), m.path, ": append takes host tensors");
  LOCKSTEP_CHECK(x.dtype() == m.meta.dtype, m.path, ": appending ", x.describe(), " to a ",
                 dtype_name(m.meta.dtype), " shard");
  LOCKSTEP_CHECK(
      x.ndim() >= 1 && Shape(x.shape().begin() + 1, x.shape().end()) == m.meta.sample_shape, m.path,
      ": appending ", x.describe(), " to a shard of sample shape ", shape_str(m.meta.sample_shape));
  LOCKSTEP_CHECK(y.ndim() == 1 && y.dim(0) == x.dim(0), m.path, ": labels ", y.describe(),
                 " do not match samples ", x.describe());
  append(x.raw_data(), y.data<std::int32_t>(), x.dim(0));
}

void ShardWriter::set_stats(const std::vector<float>& mean, const std::vector<float>& stddev) {
  auto& m = *impl_;
  LOCKSTEP_CHECK(!m.closed, m.path, ": set_stats after close");
  ShardMeta with = m.meta;
  with.mean = mean;
  with.stddev = stddev;
  validate_meta(with, m.path, "");
  m.meta = std::move(with);
}

void ShardWriter::close() {
  auto& m = *impl_;
  if (m.closed) return;
  h5::Scope scope;
  if (!m.meta.mean.empty()) {
    h5::write_floats_attr(m.file.get(), "mean", m.meta.mean, m.tmp_path);
    h5::write_floats_attr(m.file.get(), "std", m.meta.stddev, m.tmp_path);
  }
  if (m.meta.storage == SampleStorage::Encoded) {
    append_rows(m.offsets, m.tmp_path, "offsets", H5T_NATIVE_INT64, 0,
                static_cast<std::int64_t>(m.ends.size()), {}, m.ends.data());
    m.meta.encoded_bytes = m.ends.back();
  }
  m.x.reset();
  m.bytes.reset();
  m.offsets.reset();
  m.y.reset();
  h5::check(m.file.close(), m.tmp_path, "cannot close the file", "is the disk full?");
  publish_file(m.tmp_path, m.path);
  m.closed = true;
  m.meta.num_samples = m.n;
}

std::int64_t ShardWriter::num_samples() const {
  return impl_->n;
}
const std::string& ShardWriter::path() const {
  return impl_->path;
}

// ---------------------------------------------------------------------------------------------
std::unique_ptr<ShardFile> ShardFile::open(const std::string& path, std::size_t chunk_cache_bytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  LOCKSTEP_CHECK_HINT(fs::is_regular_file(path, ec), kRegenerateHint, "shard file ", path,
                      fs::exists(path, ec) ? " is not a regular file" : " does not exist");
  std::unique_ptr<ShardFile> s(new ShardFile());
  s->path_ = path;
  const std::string& where = s->path_;
  h5::Scope scope;
  s->file_ = h5::open_file(path, /*locking=*/true, kRegenerateHint).release();
  hid_t f = s->file_;
  ShardMeta& m = s->meta_;

  const char* hint = kRegenerateHint;
  std::string format = h5::read_string_attr(f, "format", where, hint);
  LOCKSTEP_CHECK_HINT(format == kShardFormatName, kRegenerateHint, where,
                      ": attribute 'format' is '", format, "', expected '", kShardFormatName, "'");
  std::int64_t version = h5::read_int_attr(f, "version", where, hint);
  LOCKSTEP_CHECK_HINT(
      version == kShardFormatVersion || version == kEncodedShardFormatVersion,
      version > kEncodedShardFormatVersion
          ? "a newer lockstep wrote it: upgrade, or regenerate the shards with this lockstep-shard"
          : kRegenerateHint,
      where, ": shard format version ", version, " is not supported (this reader reads versions ",
      kShardFormatVersion, " and ", kEncodedShardFormatVersion, ")");
  if (version == kEncodedShardFormatVersion) {
    const std::string storage = h5::read_string_attr(f, "storage", where, hint);
    LOCKSTEP_CHECK_HINT(storage == "encoded", hint, where, ": attribute 'storage' is '", storage,
                        "', but a version 2 shard holds 'encoded' samples");
    m.storage = SampleStorage::Encoded;
  }
  m.shard_index = h5::read_int_attr(f, "shard_index", where, hint);
  m.num_shards = h5::read_int_attr(f, "num_shards", where, hint);
  m.num_classes = h5::read_int_attr(f, "num_classes", where, hint);
  m.sample_shape = h5::read_ints_attr(f, "sample_shape", where, hint);
  const bool has_mean = h5::has_attr(f, "mean", where), has_std = h5::has_attr(f, "std", where);
  if (has_mean || has_std) {
    LOCKSTEP_CHECK_HINT(has_mean && has_std, hint, where,
                        ": has only one of the attributes 'mean' and 'std'");
    m.mean = h5::read_floats_attr(f, "mean", where, hint);
    m.stddev = h5::read_floats_attr(f, "std", where, hint);
  }
  if (h5::has_attr(f, "class_names", where))
    m.class_names = split_lines(h5::read_string_attr(f, "class_names", where, hint));

  if (m.storage == SampleStorage::Raw) {
    s->open_raw_x(chunk_cache_bytes);
  } else {
    m.dtype = DType::U8;
    validate_meta(m, where, kRegenerateHint);
  }
  // /y: int32 [n]
  LOCKSTEP_CHECK_HINT(H5Lexists(f, "y", H5P_DEFAULT) > 0, kRegenerateHint, where,
                      ": dataset /y is missing");
  s->y_ = LOCKSTEP_H5(H5Dopen2(f, "y", H5P_DEFAULT), kRegenerateHint, where, "cannot open /y");
  {
    auto t = h5::type(H5Dget_type(s->y_));
    LOCKSTEP_CHECK_HINT(H5Tget_class(t.get()) == H5T_INTEGER && H5Tget_size(t.get()) == 4 &&
                            H5Tget_sign(t.get()) == H5T_SGN_2,
                        kRegenerateHint, where, ": /y must hold int32 labels");
    auto yspace = h5::space(H5Dget_space(s->y_));
    LOCKSTEP_CHECK_HINT(H5Sget_simple_extent_ndims(yspace.get()) == 1, kRegenerateHint, where,
                        ": /y must be one-dimensional");
    hsize_t ny = 0;
    H5Sget_simple_extent_dims(yspace.get(), &ny, nullptr);
    if (m.storage == SampleStorage::Encoded) m.num_samples = static_cast<std::int64_t>(ny);
    LOCKSTEP_CHECK_HINT(static_cast<std::int64_t>(ny) == m.num_samples, kRegenerateHint, s->where(),
                        ": /y has ", ny, " labels but /x has ", m.num_samples, " samples");
    require_stored(s->y_, "y", m.num_samples, where);
  }
  if (m.storage == SampleStorage::Encoded) s->open_encoded(chunk_cache_bytes);
  return s;
}

// /x: the samples of raw storage, its type setting meta_.dtype.
void ShardFile::open_raw_x(std::size_t chunk_cache_bytes) {
  ShardFile* s = this;
  const std::string& where = s->path_;
  hid_t f = s->file_;
  ShardMeta& m = s->meta_;
  // /x: u8 or f32, [n, ...sample_shape]
  LOCKSTEP_CHECK_HINT(H5Lexists(f, "x", H5P_DEFAULT) > 0, kRegenerateHint, where,
                      ": dataset /x is missing");
  auto dapl = h5::plist(H5Pcreate(H5P_DATASET_ACCESS));
  H5Pset_chunk_cache(dapl.get(), kChunkCacheSlots, chunk_cache_bytes, 1.0);
  s->x_ = LOCKSTEP_H5(H5Dopen2(f, "x", dapl.get()), kRegenerateHint, where, "cannot open /x");
  {
    auto t = h5::type(H5Dget_type(s->x_));
    H5T_class_t cls = H5Tget_class(t.get());
    std::size_t size = H5Tget_size(t.get());
    if (cls == H5T_INTEGER && size == 1 && H5Tget_sign(t.get()) == H5T_SGN_NONE) {
      m.dtype = DType::U8;
    } else if (cls == H5T_FLOAT && size == 4) {
      m.dtype = DType::F32;
    } else {
      LOCKSTEP_FAIL_HINT(kRegenerateHint, where,
                         ": /x must hold uint8 or float32 samples (found an ", size * 8, "-bit ",
                         cls == H5T_FLOAT ? "float" : "integer", " type)");
    }
  }
  validate_meta(m, where, kRegenerateHint);
  auto xspace = h5::space(H5Dget_space(s->x_));
  int rank = H5Sget_simple_extent_ndims(xspace.get());
  std::vector<hsize_t> xdims(static_cast<std::size_t>(std::max(rank, 0)));
  H5Sget_simple_extent_dims(xspace.get(), xdims.data(), nullptr);
  Shape x_sample(xdims.size() > 1 ? xdims.size() - 1 : 0);
  for (std::size_t i = 1; i < xdims.size(); ++i)
    x_sample[i - 1] = static_cast<std::int64_t>(xdims[i]);
  LOCKSTEP_CHECK_HINT(rank >= 1 && x_sample == m.sample_shape, kRegenerateHint, where,
                      ": /x has sample shape ", shape_str(x_sample),
                      " but attribute 'sample_shape' says ", shape_str(m.sample_shape));
  std::int64_t x_bytes = 0;
  LOCKSTEP_CHECK_HINT(
      xdims[0] <= static_cast<hsize_t>(INT64_MAX) &&
          !__builtin_mul_overflow(static_cast<std::int64_t>(xdims[0]), m.sample_bytes(), &x_bytes),
      kRegenerateHint, where, ": /x claims ", xdims[0], " samples of ", shape_str(m.sample_shape),
      ", more than 2^63 bytes");
  m.num_samples = static_cast<std::int64_t>(xdims[0]);
  require_stored(s->x_, "x", m.num_samples, where);
}

// /bytes: u8 [B]; /offsets: int64 [n + 1], 0 = offsets[0] <= ... <= offsets[n] = B, each sample
// at least one byte. Read whole (8 bytes a sample) and checked here, so a damaged table is an
// error at open, not a read past /bytes.
void ShardFile::open_encoded(std::size_t chunk_cache_bytes) {
  const std::string& where = path_;
  const std::int64_t n = meta_.num_samples;
  for (const char* name : {"bytes", "offsets"})
    LOCKSTEP_CHECK_HINT(H5Lexists(file_, name, H5P_DEFAULT) > 0, kRegenerateHint, where,
                        ": dataset /", name, " is missing (an encoded shard needs it)");
  auto dapl = h5::plist(H5Pcreate(H5P_DATASET_ACCESS));
  H5Pset_chunk_cache(dapl.get(), kChunkCacheSlots, chunk_cache_bytes, 1.0);
  bytes_ = LOCKSTEP_H5(H5Dopen2(file_, "bytes", dapl.get()), kRegenerateHint, where,
                       "cannot open /bytes");
  auto one_dim = [&](hid_t ds, const char* name, bool is_u8) {
    auto t = h5::type(H5Dget_type(ds));
    const bool ok = H5Tget_class(t.get()) == H5T_INTEGER &&
                    H5Tget_size(t.get()) == (is_u8 ? 1u : 8u) &&
                    H5Tget_sign(t.get()) == (is_u8 ? H5T_SGN_NONE : H5T_SGN_2);
    LOCKSTEP_CHECK_HINT(ok, kRegenerateHint, where, ": /", name, " must hold ",
                        is_u8 ? "uint8 bytes" : "int64 offsets");
    auto space = h5::space(H5Dget_space(ds));
    LOCKSTEP_CHECK_HINT(H5Sget_simple_extent_ndims(space.get()) == 1, kRegenerateHint, where, ": /",
                        name, " must be one-dimensional");
    hsize_t len = 0;
    H5Sget_simple_extent_dims(space.get(), &len, nullptr);
    return static_cast<std::int64_t>(len);
  };
  const std::int64_t total = one_dim(bytes_, "bytes", true);
  require_stored(bytes_, "bytes", total, where);
  auto offsets = h5::dataset(LOCKSTEP_H5(H5Dopen2(file_, "offsets", H5P_DEFAULT), kRegenerateHint,
                                         where, "cannot open /offsets"));
  const std::int64_t count = one_dim(offsets.get(), "offsets", false);
  LOCKSTEP_CHECK_HINT(count == n + 1, kRegenerateHint, where, ": /offsets has ", count,
                      " entries but /y has ", n, " labels (it needs one more than the samples)");
  require_stored(offsets.get(), "offsets", count, where);
  offsets_.resize(static_cast<std::size_t>(count));
  LOCKSTEP_H5(
      H5Dread(offsets.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, offsets_.data()),
      kRegenerateHint, where, "cannot read /offsets (corrupted file?)");
  LOCKSTEP_CHECK_HINT(offsets_.front() == 0 && offsets_.back() == total, kRegenerateHint, where,
                      ": /offsets runs from ", offsets_.front(), " to ", offsets_.back(),
                      ", not from 0 to the length of /bytes, ", total);
  for (std::int64_t i = 0; i < n; ++i) {
    const auto k = static_cast<std::size_t>(i);
    LOCKSTEP_CHECK_HINT(offsets_[k] < offsets_[k + 1], kRegenerateHint, where, ": /offsets[", i,
                        "] = ", offsets_[k], " is not below /offsets[", i + 1,
                        "] = ", offsets_[k + 1], " (every sample has at least one byte)");
  }
  meta_.encoded_bytes = total;
}

ShardFile::~ShardFile() {
  h5::Scope scope;
  if (x_ >= 0) H5Dclose(x_);
  if (y_ >= 0) H5Dclose(y_);
  if (bytes_ >= 0) H5Dclose(bytes_);
  if (file_ >= 0) H5Fclose(file_);
}

std::string ShardFile::where() const {
  return str(path_, " (shard ", meta_.shard_index, " of ", meta_.num_shards, ")");
}

void ShardFile::read_x(std::int64_t begin, std::int64_t count, void* out) const {
  LOCKSTEP_CHECK(meta_.storage == SampleStorage::Raw, where(),
                 ": holds encoded images, which ShardedDataset::gather decodes; there is no /x");
  LOCKSTEP_CHECK(begin >= 0 && count >= 0 && begin + count <= meta_.num_samples, where(),
                 ": samples [", begin, ", ", begin + count, ") are outside [0, ", meta_.num_samples,
                 ")");
  if (count == 0) return;
  h5::Scope scope;
  auto fspace = h5::space(H5Dget_space(x_));
  auto start = dims_of(begin, meta_.sample_shape);
  std::fill(start.begin() + 1, start.end(), 0);
  auto counts = dims_of(count, meta_.sample_shape);
  LOCKSTEP_H5(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr,
                                  counts.data(), nullptr),
              kRegenerateHint, where(), "cannot select samples in /x");
  auto mspace =
      h5::space(H5Screate_simple(static_cast<int>(counts.size()), counts.data(), nullptr));
  LOCKSTEP_H5(H5Dread(x_, native_type(meta_.dtype), mspace.get(), fspace.get(), H5P_DEFAULT, out),
              kRegenerateHint, where(), "cannot read samples [", begin, ", ", begin + count,
              ") of /x (corrupted file?)");
}

void ShardFile::read_encoded(std::int64_t index, std::vector<std::uint8_t>& out) const {
  LOCKSTEP_CHECK(meta_.storage == SampleStorage::Encoded, where(),
                 ": holds raw samples (/x), not encoded ones");
  LOCKSTEP_CHECK(index >= 0 && index < meta_.num_samples, where(), ": sample ", index,
                 " is outside [0, ", meta_.num_samples, ")");
  const auto k = static_cast<std::size_t>(index);
  const hsize_t start = static_cast<hsize_t>(offsets_[k]);
  const hsize_t count = static_cast<hsize_t>(offsets_[k + 1] - offsets_[k]);
  out.resize(count);
  h5::Scope scope;
  auto fspace = h5::space(H5Dget_space(bytes_));
  LOCKSTEP_H5(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr),
              kRegenerateHint, where(), "cannot select sample ", index, " in /bytes");
  auto mspace = h5::space(H5Screate_simple(1, &count, nullptr));
  LOCKSTEP_H5(
      H5Dread(bytes_, H5T_NATIVE_UINT8, mspace.get(), fspace.get(), H5P_DEFAULT, out.data()),
      kRegenerateHint, where(), "cannot read sample ", index, " of /bytes (corrupted file?)");
}

std::vector<std::int32_t> ShardFile::read_y() const {
  std::vector<std::int32_t> y(static_cast<std::size_t>(meta_.num_samples));
  if (!y.empty()) {
    h5::Scope scope;
    LOCKSTEP_H5(H5Dread(y_, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, y.data()),
                kRegenerateHint, where(), "cannot read /y (corrupted file?)");
  }
  for (std::size_t i = 0; i < y.size(); ++i) {
    LOCKSTEP_CHECK_HINT(y[i] >= 0 && y[i] < meta_.num_classes, kRegenerateHint, where(),
                        ": label at index ", i, " is ", y[i],
                        ", outside [0, num_classes = ", meta_.num_classes, ")");
  }
  return y;
}

}  // namespace lockstep::data
