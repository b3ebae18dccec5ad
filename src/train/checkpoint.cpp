// Checkpoint files. HDF5 writes DIR/.tmp-NAME.PID with a 512-byte user block in front; once HDF5
// has closed it, the user block gets a text header with the size and CRC-32 of everything
// after it, then fsync, rename, folder fsync. Reading streams the file through the hash before HDF5
// sees it, because HDF5 1.10 can misbehave on damaged metadata; only a verified file is opened
// (from disk, without file locks, which fail on some parallel file systems and buy nothing for
// immutable files).
#include "lockstep/train/checkpoint.hpp"

#include <fcntl.h>
#include <hdf5.h>

#include <unistd.h>
#include <zlib.h>
#include "lockstep/data/hdf5_lock.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

namespace fs = std::filesystem;

namespace lockstep::train {

namespace {

constexpr const char* kFormat = "lockstep-checkpoint";
constexpr const char* kMagic = "LOCKSTEP-CHECKPOINT";
// The HDF5 user block: the smallest size HDF5 allows, plenty for the text header.
constexpr std::size_t kHeaderBytes = 512;
// Read size while hashing a file.
constexpr std::size_t kHashChunk = std::size_t{4} << 20;

// ---- HDF5 plumbing ---------------------------------------------------------------------------

// Lock + silence for every HDF5 call sequence (see lockstep/data/hdf5_lock.hpp).
using Quiet = ::lockstep::data::Hdf5Scope;

// Innermost and outermost descriptions of HDF5's error stack, then clears it.
std::string h5_last_error() {
  std::vector<std::string> messages;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* e, void* out) -> herr_t {
        if (e->desc && *e->desc) static_cast<std::vector<std::string>*>(out)->push_back(e->desc);
        return 0;
      },
      &messages);
  H5Eclear2(H5E_DEFAULT);
  if (messages.empty()) return "HDF5 gave no reason";
  if (messages.size() == 1) return messages.front();
  return messages.front() + ": " + messages.back();
}

class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  ~Handle() {
    if (id_ >= 0) closer_(id_);
  }
  Handle(Handle&& o) noexcept : id_(o.id_), closer_(o.closer_) { o.id_ = -1; }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle& operator=(Handle&&) = delete;
  hid_t get() const { return id_; }
  // Closes now and reports failure (H5Fclose of an in-memory file flushes).
  herr_t close() {
    herr_t r = id_ >= 0 ? closer_(id_) : 0;
    id_ = -1;
    return r;
  }

 private:
  hid_t id_;
  Closer closer_;
};

// Throws an Error naming the file and the action when an HDF5 call returned a negative id/status.
template <class T>
T h5(T result, const std::string& path, const std::string& what) {
  if (result < 0) [[unlikely]] {
    LOCKSTEP_FAIL(path, ": ", what, ": ", h5_last_error());
  }
  return result;
}

struct H5Types {
  hid_t file;
  hid_t memory;
};

H5Types h5_types(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return {H5T_IEEE_F32LE, H5T_NATIVE_FLOAT};
    case DType::F64:
      return {H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE};
    case DType::I32:
      return {H5T_STD_I32LE, H5T_NATIVE_INT32};
    case DType::U8:
      return {H5T_STD_U8LE, H5T_NATIVE_UINT8};
    case DType::BF16:
      return {H5T_STD_U16LE, H5T_NATIVE_UINT16};  // raw bits; "dtype" says bf16
  }
  LOCKSTEP_FAIL("unknown dtype ", static_cast<int>(dtype));
}

Handle create_group(hid_t parent, const std::string& name, const std::string& path) {
  Handle gcpl(h5(H5Pcreate(H5P_GROUP_CREATE), path, "group properties"), H5Pclose);
  // Creation order keeps tensors in the order the caller gave them.
  h5(H5Pset_link_creation_order(gcpl.get(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED), path,
     "link creation order");
  return {h5(H5Gcreate2(parent, name.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT), path,
             "creating group /" + name),
          H5Gclose};
}

// Fixed-length, NUL-padded string type of max(size, 1) bytes (HDF5 has no zero-length strings).
Handle string_type(std::size_t size, const std::string& path) {
  Handle type(h5(H5Tcopy(H5T_C_S1), path, "string type"), H5Tclose);
  h5(H5Tset_size(type.get(), std::max<std::size_t>(size, 1)), path, "string size");
  h5(H5Tset_strpad(type.get(), H5T_STR_NULLPAD), path, "string padding");
  return type;
}

void write_string_attr(hid_t obj, const std::string& name, const std::string& value,
                       const std::string& path) {
  Handle type = string_type(value.size(), path);
  Handle space(h5(H5Screate(H5S_SCALAR), path, "scalar space"), H5Sclose);
  Handle attr(h5(H5Acreate2(obj, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                 path, "creating attribute " + name),
              H5Aclose);
  std::string padded = value.empty() ? std::string(1, '\0') : value;
  h5(H5Awrite(attr.get(), type.get(), padded.data()), path, "writing attribute " + name);
}

template <class T>
void write_scalar_attr(hid_t obj, const std::string& name, T value, hid_t file_type,
                       hid_t memory_type, const std::string& path) {
  Handle space(h5(H5Screate(H5S_SCALAR), path, "scalar space"), H5Sclose);
  Handle attr(h5(H5Acreate2(obj, name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                 path, "creating attribute " + name),
              H5Aclose);
  h5(H5Awrite(attr.get(), memory_type, &value), path, "writing attribute " + name);
}

void write_string_dataset(hid_t group, const std::string& name, const std::string& value,
                          const std::string& path) {
  Handle type = string_type(value.size(), path);
  Handle space(h5(H5Screate(H5S_SCALAR), path, "scalar space"), H5Sclose);
  Handle set(h5(H5Dcreate2(group, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT,
                           H5P_DEFAULT),
                path, "creating dataset " + name),
             H5Dclose);
  std::string padded = value.empty() ? std::string(1, '\0') : value;
  h5(H5Dwrite(set.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, padded.data()), path,
     "writing dataset " + name);
}

// Reads a fixed-length string (attribute when is_attr, else a scalar dataset) and drops the
// NUL padding.
std::string read_string(hid_t obj, bool is_attr, const std::string& path, const std::string& what) {
  Handle type(h5(is_attr ? H5Aget_type(obj) : H5Dget_type(obj), path, "type of " + what), H5Tclose);
  LOCKSTEP_CHECK(H5Tget_class(type.get()) == H5T_STRING && H5Tis_variable_str(type.get()) == 0,
                 path, ": ", what, " is not a fixed-length string");
  Handle space(h5(is_attr ? H5Aget_space(obj) : H5Dget_space(obj), path, "space of " + what),
               H5Sclose);
  LOCKSTEP_CHECK(H5Sget_simple_extent_type(space.get()) == H5S_SCALAR, path, ": ", what,
                 " is not a scalar");
  const std::size_t size = H5Tget_size(type.get());
  LOCKSTEP_CHECK(size > 0, path, ": ", what, " has an invalid string size");
  std::string value(size, '\0');
  Handle memory = string_type(size, path);
  if (is_attr) {
    h5(H5Aread(obj, memory.get(), value.data()), path, "reading " + what);
  } else {
    h5(H5Dread(obj, memory.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, value.data()), path,
       "reading " + what);
  }
  value.erase(value.find_last_not_of('\0') + 1);
  return value;
}

bool has_attr(hid_t obj, const std::string& name, const std::string& path) {
  return h5(H5Aexists(obj, name.c_str()), path, "looking up attribute " + name) > 0;
}

std::string read_string_attr(hid_t obj, const std::string& name, const std::string& path) {
  LOCKSTEP_CHECK(has_attr(obj, name, path), path, ": missing attribute ", name);
  Handle attr(h5(H5Aopen(obj, name.c_str(), H5P_DEFAULT), path, "opening attribute " + name),
              H5Aclose);
  return read_string(attr.get(), true, path, "attribute " + name);
}

template <class T>
T read_scalar_attr(hid_t obj, const std::string& name, hid_t memory_type, H5T_class_t cls,
                   const std::string& path) {
  LOCKSTEP_CHECK(has_attr(obj, name, path), path, ": missing attribute ", name);
  Handle attr(h5(H5Aopen(obj, name.c_str(), H5P_DEFAULT), path, "opening attribute " + name),
              H5Aclose);
  Handle type(h5(H5Aget_type(attr.get()), path, "type of attribute " + name), H5Tclose);
  Handle space(h5(H5Aget_space(attr.get()), path, "space of attribute " + name), H5Sclose);
  LOCKSTEP_CHECK(
      H5Tget_class(type.get()) == cls && H5Sget_simple_extent_type(space.get()) == H5S_SCALAR, path,
      ": attribute ", name, " has the wrong type or shape");
  T value{};
  h5(H5Aread(attr.get(), memory_type, &value), path, "reading attribute " + name);
  return value;
}

std::int64_t read_i64_attr(hid_t obj, const std::string& name, const std::string& path) {
  return read_scalar_attr<std::int64_t>(obj, name, H5T_NATIVE_INT64, H5T_INTEGER, path);
}

void write_i64_attr(hid_t obj, const std::string& name, std::int64_t v, const std::string& path) {
  write_scalar_attr(obj, name, v, H5T_STD_I64LE, H5T_NATIVE_INT64, path);
}

// Names of a group's links in creation order.
std::vector<std::string> link_names(hid_t group, const std::string& path, const std::string& what) {
  H5G_info_t info;
  h5(H5Gget_info(group, &info), path, "listing " + what);
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    ssize_t n = h5(
        H5Lget_name_by_idx(group, ".", H5_INDEX_CRT_ORDER, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT),
        path, "name of entry in " + what);
    std::string name(static_cast<std::size_t>(n) + 1, '\0');
    h5(H5Lget_name_by_idx(group, ".", H5_INDEX_CRT_ORDER, H5_ITER_INC, i, name.data(), name.size(),
                          H5P_DEFAULT),
       path, "name of entry in " + what);
    name.resize(static_cast<std::size_t>(n));
    names.push_back(std::move(name));
  }
  return names;
}

// Writes a host copy of `tensor` as dataset `name` of `group`, with "name" (unescaped) and
// "dtype" attributes.
void write_tensor(hid_t group, const std::string& name, const Tensor& tensor,
                  const std::string& path) {
  LOCKSTEP_CHECK(!name.empty(), path, ": a tensor has an empty name");
  LOCKSTEP_CHECK(tensor.defined(), path, ": tensor ", name, " is undefined");
  LOCKSTEP_CHECK(tensor.ndim() <= H5S_MAX_RANK, path, ": tensor ", name, " has ", tensor.ndim(),
                 " dimensions, HDF5 allows ", H5S_MAX_RANK);
  const Tensor host = tensor.device().is_cpu() ? tensor : tensor.to(Device::cpu());
  const H5Types types = h5_types(host.dtype());
  std::vector<hsize_t> dims(host.shape().begin(), host.shape().end());
  Handle space(h5(host.ndim() == 0 ? H5Screate(H5S_SCALAR)
                                   : H5Screate_simple(host.ndim(), dims.data(), nullptr),
                  path, "dataspace of " + name),
               H5Sclose);
  const std::string link = escape_h5_name(name);
  Handle set(h5(H5Dcreate2(group, link.c_str(), types.file, space.get(), H5P_DEFAULT, H5P_DEFAULT,
                           H5P_DEFAULT),
                path, "creating dataset for tensor " + name),
             H5Dclose);
  if (host.numel() > 0) {
    h5(H5Dwrite(set.get(), types.memory, H5S_ALL, H5S_ALL, H5P_DEFAULT, host.raw_data()), path,
       "writing tensor " + name);
  }
  write_string_attr(set.get(), "name", name, path);
  write_string_attr(set.get(), "dtype", dtype_name(host.dtype()), path);
}

// Reads dataset `link` of `group` (written by write_tensor) into a host tensor; returns its name.
std::pair<std::string, Tensor> read_tensor(hid_t group, const std::string& group_name,
                                           const std::string& link, const std::string& path) {
  const std::string where = group_name + "/" + link;
  Handle set(h5(H5Dopen2(group, link.c_str(), H5P_DEFAULT), path, "opening " + where), H5Dclose);
  std::string name = has_attr(set.get(), "name", path) ? read_string_attr(set.get(), "name", path)
                                                       : unescape_h5_name(link);
  LOCKSTEP_CHECK(escape_h5_name(name) == link, path, ": dataset ", where, " has name attribute '",
                 name, "', which does not match");
  DType dtype = DType::F32;
  Handle type(h5(H5Dget_type(set.get()), path, "type of " + where), H5Tclose);
  if (has_attr(set.get(), "dtype", path)) {
    const std::string dtype_text = read_string_attr(set.get(), "dtype", path);
    try {
      dtype = dtype_from_name(dtype_text);
    } catch (const Error&) {
      LOCKSTEP_FAIL(path, ": tensor ", name, " has unknown dtype '", dtype_text, "'");
    }
  } else {
    // Exports written by other tools: infer from the stored type.
    const H5T_class_t cls = H5Tget_class(type.get());
    const std::size_t size = H5Tget_size(type.get());
    if (cls == H5T_FLOAT && size == 8)
      dtype = DType::F64;
    else if (cls == H5T_INTEGER && size == 4)
      dtype = DType::I32;
    else if (cls == H5T_INTEGER && size == 1)
      dtype = DType::U8;
  }
  const H5Types types = h5_types(dtype);
  LOCKSTEP_CHECK(H5Tequal(type.get(), types.file) > 0, path, ": tensor ", name,
                 " is stored with an HDF5 type that does not match its dtype ", dtype_name(dtype));
  Handle space(h5(H5Dget_space(set.get()), path, "dataspace of " + where), H5Sclose);
  const int rank = h5(H5Sget_simple_extent_ndims(space.get()), path, "rank of " + where);
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  if (rank > 0) h5(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr), path, "shape");
  Shape shape(dims.begin(), dims.end());
  Tensor tensor = Tensor::empty(shape, dtype);
  if (tensor.numel() > 0) {
    h5(H5Dread(set.get(), types.memory, H5S_ALL, H5S_ALL, H5P_DEFAULT, tensor.raw_data()), path,
       "reading tensor " + name);
  }
  return {std::move(name), std::move(tensor)};
}

// ---- checksums -------------------------------------------------------------------------------

struct Hasher {
  std::uint32_t h = 0;
  void bytes(const void* p, std::size_t n) { h = detail::crc32(p, n, h); }
  void i64(std::int64_t v) { bytes(&v, sizeof v); }
  void text(const std::string& s) {
    i64(static_cast<std::int64_t>(s.size()));
    bytes(s.data(), s.size());
  }
};

// Every tensor's name, dtype, shape and bytes, in order (docs/CHECKPOINTS.md has the recipe).
std::uint32_t tensors_checksum(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  Hasher hash;
  for (const auto& [name, tensor] : tensors) {
    const Tensor host = tensor.device().is_cpu() ? tensor : tensor.to(Device::cpu());
    hash.text(name);
    hash.text(dtype_name(host.dtype()));
    hash.i64(host.ndim());
    for (std::int64_t d : host.shape())
      hash.i64(d);
    if (host.numel() > 0) hash.bytes(host.raw_data(), host.nbytes());
  }
  return hash.h;
}

// The metadata, then tensors_checksum, chained.
std::uint32_t content_checksum(const CheckpointState& s, std::uint32_t tensors_hash) {
  Hasher hash;
  hash.i64(s.step);
  hash.i64(s.epoch);
  hash.i64(s.batch_in_epoch);
  hash.i64(s.world_size);
  hash.text(s.config_ini);
  hash.text(s.model_structure);
  for (const auto& [key, value] : s.attrs) {
    hash.text(key);
    hash.text(value);
  }
  hash.bytes(&tensors_hash, sizeof tensors_hash);
  return hash.h;
}

std::string hex32(std::uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08" PRIx32, v);
  return buf;
}

// ---- the user-block header -------------------------------------------------------------------

struct Header {
  int version = 0;
  std::uint64_t file_bytes = 0;
  std::uint32_t file_hash = 0;
  std::uint32_t tensors_hash = 0;
  // Copies of the root attributes, for shell tools (`head -c 512 FILE`); checked on read.
  std::int64_t step = 0;
  std::int64_t epoch = 0;
  std::int64_t batch_in_epoch = 0;
  std::int64_t world_size = 0;
};

std::string format_header(const Header& h) {
  std::string text = str(
      kMagic, " ", h.version, "\nfile_bytes=", h.file_bytes, "\nfile_crc32=", hex32(h.file_hash),
      "\ntensors_crc32=", hex32(h.tensors_hash), "\nstep=", h.step, "\nepoch=", h.epoch,
      "\nbatch_in_epoch=", h.batch_in_epoch, "\nworld_size=", h.world_size, "\ncomplete\n");
  LOCKSTEP_CHECK(text.size() < kHeaderBytes, "checkpoint header too long");
  text.resize(kHeaderBytes, '\0');
  return text;
}

std::uint32_t parse_hex32(const std::string& text) {
  std::size_t used = 0;
  const unsigned long long v = std::stoull(text, &used, 16);
  if (used != text.size() || text.size() != 8) throw std::invalid_argument("not 8 hex digits");
  return static_cast<std::uint32_t>(v);
}

// Parses the first kHeaderBytes of a file; throws naming the file on anything unexpected.
Header parse_header(const char* bytes, const std::string& path) {
  std::string text(bytes, kHeaderBytes);
  const std::string hint =
      "the file is not a finished lockstep checkpoint: delete it, or resume "
      "from an older one";
  LOCKSTEP_CHECK_HINT(text.rfind(kMagic, 0) == 0, hint, path, ": not a lockstep checkpoint (no ",
                      kMagic, " header in the HDF5 user block)");
  const std::size_t end = text.find('\0');
  // The padding is part of the header: all of it must be zero, so no header byte goes unchecked.
  LOCKSTEP_CHECK_HINT(
      end != std::string::npos && text.find_first_not_of('\0', end) == std::string::npos, hint,
      path, ": damaged header (non-zero bytes in its padding)");
  text.resize(end);
  std::istringstream in(text);
  std::string first, line;
  std::getline(in, first);
  Header h;
  std::map<std::string, std::string> fields;
  bool complete = false;
  while (std::getline(in, line)) {
    if (line == "complete") {
      complete = true;
      continue;
    }
    auto eq = line.find('=');
    LOCKSTEP_CHECK_HINT(eq != std::string::npos, hint, path, ": malformed header line '", line,
                        "'");
    fields[line.substr(0, eq)] = line.substr(eq + 1);
  }
  auto field = [&](const char* key) -> const std::string& {
    auto it = fields.find(key);
    LOCKSTEP_CHECK_HINT(it != fields.end(), hint, path, ": header has no ", key, " field");
    return it->second;
  };
  try {
    h.version = std::stoi(first.substr(std::strlen(kMagic)));
    h.file_bytes = std::stoull(field("file_bytes"));
    h.file_hash = parse_hex32(field("file_crc32"));
    h.tensors_hash = parse_hex32(field("tensors_crc32"));
    h.step = std::stoll(field("step"));
    h.epoch = std::stoll(field("epoch"));
    h.batch_in_epoch = std::stoll(field("batch_in_epoch"));
    h.world_size = std::stoll(field("world_size"));
  } catch (const std::logic_error&) {
    LOCKSTEP_FAIL_HINT(hint, path, ": header has an unparsable number");
  }
  LOCKSTEP_CHECK_HINT(
      h.version == kCheckpointVersion, "read it with the lockstep version that wrote it", path,
      ": checkpoint format version ", h.version, ", this build reads version ", kCheckpointVersion);
  LOCKSTEP_CHECK_HINT(complete, hint, path, ": header lacks the complete marker");
  return h;
}

struct Fd {
  int fd;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

std::string errno_text() {
  return std::strerror(errno);
}

std::pair<std::uint32_t, std::uint64_t> hash_fd(int fd, std::size_t from, const std::string& path);

// Reads the header and checks size and whole-file hash by streaming the file.
Header verify_file(const std::string& path, bool hash_contents) {
  Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  LOCKSTEP_CHECK(f.fd >= 0, path, ": cannot open checkpoint: ", errno_text());
  const off_t size = ::lseek(f.fd, 0, SEEK_END);
  LOCKSTEP_CHECK(size >= 0, path, ": cannot seek: ", errno_text());
  LOCKSTEP_CHECK(static_cast<std::size_t>(size) >= kHeaderBytes, path, ": truncated: ", size,
                 " bytes, shorter than the ", kHeaderBytes, "-byte header");
  std::vector<char> buffer(kHeaderBytes);
  LOCKSTEP_CHECK(
      ::pread(f.fd, buffer.data(), kHeaderBytes, 0) == static_cast<ssize_t>(kHeaderBytes), path,
      ": cannot read header: ", errno_text());
  Header h = parse_header(buffer.data(), path);
  LOCKSTEP_CHECK_HINT(static_cast<std::uint64_t>(size) >= h.file_bytes,
                      "the copy or the disk lost its end: resume from an older checkpoint", path,
                      ": truncated: ", size, " of ", h.file_bytes, " bytes");
  LOCKSTEP_CHECK(static_cast<std::uint64_t>(size) == h.file_bytes, path, ": has ", size,
                 " bytes but its header says ", h.file_bytes, " (bytes appended after writing)");
  if (!hash_contents) return h;
  const std::uint32_t hash = hash_fd(f.fd, kHeaderBytes, path).first;
  LOCKSTEP_CHECK_HINT(hash == h.file_hash,
                      "the file was damaged after writing: resume from an "
                      "older checkpoint",
                      path, ": checksum mismatch (file bytes hash to ", hex32(hash),
                      ", header says ", hex32(h.file_hash), ")");
  return h;
}

// Builds the HDF5 file `path` atomically: `fill` writes its content into DIR/.tmp-NAME.PID
// (with a user block of `userblock` bytes in front), `seal` may then edit the closed file through
// its descriptor (the header), and the file is fsynced, renamed to `path` and the folder fsynced.
// On any failure the temporary file is removed and `path` is untouched.
template <class Fill, class Seal>
void write_hdf5_atomically(const std::string& path, std::size_t userblock, Fill fill, Seal seal) {
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(dir, ec);
  LOCKSTEP_CHECK(!ec, dir.string(), ": cannot create folder: ", ec.message());
  const fs::path tmp = dir / str(".tmp-", target.filename().string(), ".", ::getpid());
  const std::string tmp_name = tmp.string();
  try {
    {
      Quiet quiet;
      Handle fcpl(h5(H5Pcreate(H5P_FILE_CREATE), tmp_name, "file creation properties"), H5Pclose);
      if (userblock > 0) h5(H5Pset_userblock(fcpl.get(), userblock), tmp_name, "user block");
      Handle fapl(h5(H5Pcreate(H5P_FILE_ACCESS), tmp_name, "file access properties"), H5Pclose);
      // The 1.8 object format: readable by every HDF5 since 2008, and it allows attributes over
      // 64 KiB (a large model structure).
      h5(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_V18), tmp_name,
         "format version");
#if H5_VERSION_GE(1, 10, 7)
      h5(H5Pset_file_locking(fapl.get(), 0, 1), tmp_name, "file locking");
#endif
      Handle file(h5(H5Fcreate(tmp_name.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get()), tmp_name,
                     "creating"),
                  H5Fclose);
      fill(file.get());
      h5(file.close(), tmp_name, "closing (writing out)");
    }
    Fd f(::open(tmp_name.c_str(), O_RDWR | O_CLOEXEC));
    LOCKSTEP_CHECK(f.fd >= 0, tmp_name, ": cannot reopen: ", errno_text());
    seal(f.fd, tmp_name);
    LOCKSTEP_CHECK_HINT(::fsync(f.fd) == 0, "check free space and quota", tmp_name,
                        ": fsync failed: ", errno_text());
    LOCKSTEP_CHECK(std::rename(tmp.c_str(), target.c_str()) == 0, path, ": rename from ", tmp_name,
                   " failed: ", errno_text());
  } catch (...) {
    fs::remove(tmp, ec);
    throw;
  }
  // Makes the rename itself durable; some file systems refuse fsync on folders, which is harmless.
  Fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d.fd >= 0) ::fsync(d.fd);
}

// CRC-32 of bytes [from, EOF) of an open file, and the file's size.
std::pair<std::uint32_t, std::uint64_t> hash_fd(int fd, std::size_t from, const std::string& path) {
  const off_t size = ::lseek(fd, 0, SEEK_END);
  LOCKSTEP_CHECK(size >= 0, path, ": cannot seek: ", errno_text());
  std::vector<char> buffer(kHashChunk);
  std::uint32_t hash = 0;
  off_t offset = static_cast<off_t>(from);
  while (offset < size) {
    const ssize_t n = ::pread(fd, buffer.data(), buffer.size(), offset);
    LOCKSTEP_CHECK(n > 0, path, ": read failed at byte ", offset, ": ",
                   n == 0 ? "unexpected end of file" : errno_text());
    hash = detail::crc32(buffer.data(), static_cast<std::size_t>(n), hash);
    offset += n;
  }
  return {hash, static_cast<std::uint64_t>(size)};
}

void remove_stale_tmp_files(const fs::path& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().filename().string().rfind(".tmp-", 0) == 0) fs::remove(entry.path(), ec);
  }
}

Handle open_verified(const std::string& path) {
  Handle fapl(h5(H5Pcreate(H5P_FILE_ACCESS), path, "file access properties"), H5Pclose);
#if H5_VERSION_GE(1, 10, 7)
  h5(H5Pset_file_locking(fapl.get(), /*use_file_locking=*/0, /*ignore_when_disabled=*/1), path,
     "file locking");
#endif
  return {h5(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), path, "opening with HDF5"),
          H5Fclose};
}

struct Listed {
  std::int64_t step;
  fs::path path;
};

// Checkpoint files in `dir` (ckpt-<digits>.h5), newest first.
std::vector<Listed> list_checkpoints(const std::string& dir) {
  static const std::regex pattern(R"(ckpt-(\d+)\.h5)");
  std::vector<Listed> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    std::int64_t step = 0;
    // A step beyond 2^63 cannot be lockstep's (std::stoll threw std::out_of_range here): not a
    // checkpoint, and so never pruned either.
    if (entry.is_regular_file(ec) && std::regex_match(name, m, pattern) &&
        std::from_chars(name.data() + m.position(1), name.data() + m.position(1) + m.length(1),
                        step)
                .ec == std::errc()) {
      out.push_back({step, entry.path()});
    }
  }
  std::sort(out.begin(), out.end(), [](const Listed& a, const Listed& b) {
    return a.step != b.step ? a.step > b.step : a.path > b.path;
  });
  return out;
}

}  // namespace

// ---- public API ------------------------------------------------------------------------------

std::uint32_t detail::crc32(const void* data, std::size_t bytes, std::uint32_t crc) {
  return static_cast<std::uint32_t>(
      crc32_z(crc, static_cast<const Bytef*>(data), static_cast<z_size_t>(bytes)));
}

const Tensor& CheckpointState::tensor(const std::string& name) const {
  for (const auto& [n, t] : tensors) {
    if (n == name) return t;
  }
  std::string names;
  for (std::size_t i = 0; i < tensors.size() && i < 8; ++i)
    names += " " + tensors[i].first;
  LOCKSTEP_FAIL("checkpoint has no tensor '", name, "' (it has ", tensors.size(), ":", names,
                tensors.size() > 8 ? " ..." : "", ")");
}

std::string escape_h5_name(const std::string& name) {
  if (name == ".") return "%2E";
  std::string out;
  for (char c : name) {
    if (c == '%')
      out += "%25";
    else if (c == '/')
      out += "%2F";
    else
      out += c;
  }
  return out;
}

std::string unescape_h5_name(const std::string& escaped) {
  std::string out;
  for (std::size_t i = 0; i < escaped.size(); ++i) {
    if (escaped[i] != '%') {
      out += escaped[i];
      continue;
    }
    const std::string code = escaped.substr(i + 1, 2);
    if (code == "25")
      out += '%';
    else if (code == "2F")
      out += '/';
    else if (code == "2E")
      out += '.';
    else
      LOCKSTEP_FAIL("malformed escaped HDF5 name '", escaped, "' (unknown %", code, ")");
    i += 2;
  }
  return out;
}

std::string checkpoint_path(const std::string& dir, std::int64_t step) {
  LOCKSTEP_CHECK(step >= 0, "checkpoint_path: negative step ", step);
  char name[40];
  std::snprintf(name, sizeof name, "ckpt-%08" PRId64 ".h5", step);
  return (fs::path(dir) / name).string();
}

void write_checkpoint(const std::string& path, const CheckpointState& state) {
  std::vector<std::string> seen;
  for (const auto& [name, tensor] : state.tensors)
    seen.push_back(name);
  std::sort(seen.begin(), seen.end());
  auto dup = std::adjacent_find(seen.begin(), seen.end());
  LOCKSTEP_CHECK(dup == seen.end(), path, ": two tensors are named '",
                 dup == seen.end() ? "" : *dup, "'");

  // One host copy of device tensors, shared by the checksum and the write.
  std::vector<std::pair<std::string, Tensor>> host;
  host.reserve(state.tensors.size());
  for (const auto& [name, tensor] : state.tensors) {
    LOCKSTEP_CHECK(tensor.defined(), path, ": tensor ", name, " is undefined");
    host.push_back({name, tensor.device().is_cpu() ? tensor : tensor.to(Device::cpu())});
  }
  const std::uint32_t tensors_hash = tensors_checksum(host);
  const std::uint32_t content_hash = content_checksum(state, tensors_hash);
  const fs::path dir = fs::path(path).has_parent_path() ? fs::path(path).parent_path() : ".";
  remove_stale_tmp_files(dir);
  auto fill = [&](hid_t file) {
    write_string_attr(file, "format", kFormat, path);
    write_i64_attr(file, "version", kCheckpointVersion, path);
    write_i64_attr(file, "step", state.step, path);
    write_i64_attr(file, "epoch", state.epoch, path);
    write_i64_attr(file, "batch_in_epoch", state.batch_in_epoch, path);
    write_i64_attr(file, "world_size", state.world_size, path);
    {
      Handle meta = create_group(file, "meta", path);
      write_string_dataset(meta.get(), "config_ini", state.config_ini, path);
      write_string_dataset(meta.get(), "model_structure", state.model_structure, path);
    }
    {
      Handle attrs = create_group(file, "attrs", path);
      for (const auto& [key, value] : state.attrs) {
        LOCKSTEP_CHECK(!key.empty(), path, ": an attribute has an empty key");
        write_string_dataset(attrs.get(), escape_h5_name(key), value, path);
      }
    }
    {
      Handle tensors = create_group(file, "tensors", path);
      for (const auto& [name, tensor] : host)
        write_tensor(tensors.get(), name, tensor, path);
    }
    write_string_attr(file, "checksum_crc32", hex32(content_hash), path);
    write_i64_attr(file, "complete", 1, path);  // last: its presence means everything above is in
  };
  auto seal = [&](int fd, const std::string& tmp_name) {
    const auto [file_hash, file_bytes] = hash_fd(fd, kHeaderBytes, tmp_name);
    const std::string text =
        format_header({kCheckpointVersion, file_bytes, file_hash, tensors_hash, state.step,
                       state.epoch, state.batch_in_epoch, state.world_size});
    LOCKSTEP_CHECK(::pwrite(fd, text.data(), text.size(), 0) == static_cast<ssize_t>(text.size()),
                   tmp_name, ": cannot write header: ", errno_text());
  };
  write_hdf5_atomically(path, kHeaderBytes, fill, seal);
}

CheckpointState read_checkpoint(const std::string& path) {
  const Header header = verify_file(path, /*hash_contents=*/true);
  Quiet quiet;
  Handle file = open_verified(path);
  const hid_t f = file.get();
  const std::string format = read_string_attr(f, "format", path);
  LOCKSTEP_CHECK(format == kFormat, path, ": format attribute is '", format, "', expected '",
                 kFormat, "'");
  const std::int64_t version = read_i64_attr(f, "version", path);
  LOCKSTEP_CHECK(version == kCheckpointVersion, path, ": version attribute is ", version,
                 ", this build reads ", kCheckpointVersion);
  LOCKSTEP_CHECK_HINT(has_attr(f, "complete", path) && read_i64_attr(f, "complete", path) == 1,
                      "the writer stopped before finishing: resume from an older checkpoint", path,
                      ": incomplete (no complete marker)");
  CheckpointState s;
  s.step = read_i64_attr(f, "step", path);
  s.epoch = read_i64_attr(f, "epoch", path);
  s.batch_in_epoch = read_i64_attr(f, "batch_in_epoch", path);
  s.world_size = read_i64_attr(f, "world_size", path);
  LOCKSTEP_CHECK(s.step == header.step && s.epoch == header.epoch &&
                     s.batch_in_epoch == header.batch_in_epoch && s.world_size == header.world_size,
                 path, ": the attributes (step ", s.step, ", epoch ", s.epoch, ", batch_in_epoch ",
                 s.batch_in_epoch, ", world_size ", s.world_size, ") differ from the header's (",
                 header.step, ", ", header.epoch, ", ", header.batch_in_epoch, ", ",
                 header.world_size, ")");
  {
    Handle meta(h5(H5Gopen2(f, "meta", H5P_DEFAULT), path, "opening /meta"), H5Gclose);
    for (auto [name, out] : {std::pair{"config_ini", &s.config_ini},
                             std::pair{"model_structure", &s.model_structure}}) {
      Handle set(h5(H5Dopen2(meta.get(), name, H5P_DEFAULT), path, str("opening /meta/", name)),
                 H5Dclose);
      *out = read_string(set.get(), false, path, str("/meta/", name));
    }
  }
  {
    Handle attrs(h5(H5Gopen2(f, "attrs", H5P_DEFAULT), path, "opening /attrs"), H5Gclose);
    for (const std::string& link : link_names(attrs.get(), path, "/attrs")) {
      Handle set(
          h5(H5Dopen2(attrs.get(), link.c_str(), H5P_DEFAULT), path, "opening /attrs/" + link),
          H5Dclose);
      s.attrs[unescape_h5_name(link)] = read_string(set.get(), false, path, "/attrs/" + link);
    }
  }
  {
    Handle tensors(h5(H5Gopen2(f, "tensors", H5P_DEFAULT), path, "opening /tensors"), H5Gclose);
    for (const std::string& link : link_names(tensors.get(), path, "/tensors")) {
      s.tensors.push_back(read_tensor(tensors.get(), "/tensors", link, path));
    }
  }
  const std::uint32_t tensors_hash = tensors_checksum(s.tensors);
  LOCKSTEP_CHECK(tensors_hash == header.tensors_hash, path, ": checksum mismatch: tensors hash to ",
                 hex32(tensors_hash), ", header says ", hex32(header.tensors_hash));
  const std::string stored = read_string_attr(f, "checksum_crc32", path);
  const std::string computed = hex32(content_checksum(s, tensors_hash));
  LOCKSTEP_CHECK(stored == computed, path, ": checksum mismatch: content hashes to ", computed,
                 ", checksum_crc32 attribute says ", stored);
  return s;
}

std::optional<std::string> find_latest_checkpoint(
    const std::string& dir, const std::function<void(const std::string&)>& warn) {
  for (const Listed& c : list_checkpoints(dir)) {
    try {
      (void)read_checkpoint(c.path.string());
      return c.path.string();
    } catch (const Error& e) {
      if (warn) warn(str(e.message(), ", skipped"));
    }
  }
  return std::nullopt;
}

void prune_checkpoints(const std::string& dir, int keep) {
  LOCKSTEP_CHECK(keep >= 1, "prune_checkpoints: keep is ", keep, ", must be at least 1",
                 " (checkpoint.keep)");
  remove_stale_tmp_files(dir);
  int kept = 0;
  std::error_code ec;
  for (const Listed& c : list_checkpoints(dir)) {
    bool complete = true;
    try {
      (void)verify_file(c.path.string(), /*hash_contents=*/false);
    } catch (const Error&) {
      complete = false;
    }
    if (kept == 0 && !complete) continue;  // newer than the newest complete: left to report
    if (complete && kept < keep) {
      ++kept;
      continue;
    }
    fs::remove(c.path, ec);
  }
}

void export_parameters(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& params,
                       const std::vector<std::pair<std::string, Tensor>>& buffers,
                       const std::map<std::string, std::string>& attrs) {
  auto fill = [&](hid_t file) {
    for (const auto& [key, value] : attrs)
      write_string_attr(file, key, value, path);
    Handle p = create_group(file, "parameters", path);
    for (const auto& [name, tensor] : params)
      write_tensor(p.get(), name, tensor, path);
    Handle b = create_group(file, "buffers", path);
    for (const auto& [name, tensor] : buffers)
      write_tensor(b.get(), name, tensor, path);
  };
  write_hdf5_atomically(path, /*userblock=*/0, fill, [](int, const std::string&) {});
}

ExportedParameters read_exported_parameters(const std::string& path) {
  Quiet quiet;
  std::error_code ec;
  LOCKSTEP_CHECK(fs::is_regular_file(path, ec), path, ": no such file");
  Handle file = open_verified(path);
  ExportedParameters out;
  for (auto [group_name, dest] :
       {std::pair{"parameters", &out.params}, std::pair{"buffers", &out.buffers}}) {
    const std::string where = str("/", group_name);
    Handle g(h5(H5Gopen2(file.get(), group_name, H5P_DEFAULT), path, "opening " + where), H5Gclose);
    // Files written by other tools may lack creation order; fall back to name order.
    Handle gcpl(h5(H5Gget_create_plist(g.get()), path, "group properties"), H5Pclose);
    unsigned flags = 0;
    h5(H5Pget_link_creation_order(gcpl.get(), &flags), path, "creation order");
    std::vector<std::string> links;
    if (flags & H5P_CRT_ORDER_INDEXED) {
      links = link_names(g.get(), path, where);
    } else {
      H5G_info_t info;
      h5(H5Gget_info(g.get(), &info), path, "listing " + where);
      for (hsize_t i = 0; i < info.nlinks; ++i) {
        ssize_t n = h5(H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0,
                                          H5P_DEFAULT),
                       path, "entry of " + where);
        std::string name(static_cast<std::size_t>(n) + 1, '\0');
        h5(H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(),
                              H5P_DEFAULT),
           path, "entry of " + where);
        name.resize(static_cast<std::size_t>(n));
        links.push_back(name);
      }
    }
    for (const std::string& link : links)
      dest->push_back(read_tensor(g.get(), where, link, path));
  }
  H5O_info_t info;
  h5(H5Oget_info(file.get(), &info), path, "root info");
  for (hsize_t i = 0; i < info.num_attrs; ++i) {
    Handle attr(
        h5(H5Aopen_by_idx(file.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, H5P_DEFAULT, H5P_DEFAULT),
           path, "root attribute"),
        H5Aclose);
    ssize_t n = h5(H5Aget_name(attr.get(), 0, nullptr), path, "attribute name");
    std::string name(static_cast<std::size_t>(n) + 1, '\0');
    h5(H5Aget_name(attr.get(), name.size(), name.data()), path, "attribute name");
    name.resize(static_cast<std::size_t>(n));
    out.attrs[name] = read_string(attr.get(), true, path, "attribute " + name);
  }
  return out;
}

std::int64_t rescale_batch_in_epoch(std::int64_t batch_in_epoch, std::int64_t old_samples_per_batch,
                                    std::int64_t new_samples_per_batch) {
  LOCKSTEP_CHECK(batch_in_epoch >= 0 && old_samples_per_batch > 0 && new_samples_per_batch > 0,
                 "rescale_batch_in_epoch: batch_in_epoch ", batch_in_epoch, ", samples per batch ",
                 old_samples_per_batch, " -> ", new_samples_per_batch);
  return batch_in_epoch * old_samples_per_batch / new_samples_per_batch;
}

void detail::reseal_checkpoint_for_test(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LOCKSTEP_CHECK(in, path, ": cannot open");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  LOCKSTEP_CHECK(bytes.size() > kHeaderBytes, path, ": too short to reseal");
  Header h = parse_header(bytes.data(), path);
  h.file_bytes = bytes.size();
  h.file_hash = crc32(bytes.data() + kHeaderBytes, bytes.size() - kHeaderBytes);
  const std::string text = format_header(h);
  std::fstream out(path, std::ios::binary | std::ios::in | std::ios::out);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  LOCKSTEP_CHECK(out, path, ": cannot rewrite header");
}

}  // namespace lockstep::train
