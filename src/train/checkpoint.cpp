// Checkpoint files. HDF5 writes DIR/.tmp-NAME.PID with a 512-byte user block in front; once HDF5
// has closed it, the user block gets a text header with the size and CRC-32 of everything
// after it, then fsync, rename, folder fsync. Reading streams the file through the hash before HDF5
// sees it, because HDF5 1.10 can misbehave on damaged metadata; only a verified file is opened
// (from disk, without file locks, which fail on some parallel file systems and buy nothing for
// immutable files).
#include "lockstep/train/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>

#include "lockstep/core/file.hpp"
#include "lockstep/h5/h5.hpp"

namespace fs = std::filesystem;

namespace lockstep::train {

namespace {

constexpr const char* kFormat = "lockstep-checkpoint";
constexpr const char* kMagic = "LOCKSTEP-CHECKPOINT";
// The HDF5 user block: the smallest size HDF5 allows, plenty for the text header.
constexpr std::size_t kHeaderBytes = 512;
// Read size while hashing a file.
constexpr std::size_t kHashChunk = std::size_t{4} << 20;

// ---- tensors: a dataset per tensor (lockstep/h5/h5.hpp) plus the checkpoint's own attributes,
// "name" (the unescaped name) and "dtype" (bf16 is stored as raw uint16 bits).

void write_tensor(hid_t group, const std::string& name, const Tensor& tensor,
                  const std::string& path) {
  LOCKSTEP_CHECK(!name.empty(), path, ": a tensor has an empty name");
  LOCKSTEP_CHECK(tensor.defined(), path, ": tensor ", name, " is undefined");
  h5::Handle set = h5::write_tensor(group, h5::escape_name(name), tensor, path);
  h5::write_string_attr(set.get(), "name", name, path);
  h5::write_string_attr(set.get(), "dtype", dtype_name(tensor.dtype()), path);
}

// Reads dataset `link` of `group` (written by write_tensor, or by another tool for exports) into
// a host tensor; returns its name.
std::pair<std::string, Tensor> read_tensor(hid_t group, const std::string& group_name,
                                           const std::string& link, const std::string& path) {
  const std::string where = group_name + "/" + link;
  DType dtype = DType::F32;
  std::string name;
  {
    h5::Handle set =
        h5::dataset(H5Dopen2(group, link.c_str(), H5P_DEFAULT), path, "opening " + where);
    name = h5::has_attr(set.get(), "name", path) ? h5::read_string_attr(set.get(), "name", path)
                                                 : h5::unescape_name(link);
    LOCKSTEP_CHECK(h5::escape_name(name) == link, path, ": dataset ", where,
                   " has name attribute '", name, "', which does not match");
    if (h5::has_attr(set.get(), "dtype", path)) {
      const std::string dtype_text = h5::read_string_attr(set.get(), "dtype", path);
      try {
        dtype = dtype_from_name(dtype_text);
      } catch (const Error&) {
        LOCKSTEP_FAIL(path, ": tensor ", name, " has unknown dtype '", dtype_text, "'");
      }
    } else {
      // Exports written by other tools: the stored type says.
      h5::Handle type = h5::type(H5Dget_type(set.get()), path, "type of " + where);
      dtype = h5::dtype_of_type(type.get(), path, "tensor " + name);
    }
  }
  return {std::move(name), h5::read_tensor(group, link, dtype, path)};
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

std::pair<std::uint32_t, std::uint64_t> hash_fd(int fd, std::size_t from, const std::string& path);

// Reads the header and checks size and whole-file hash by streaming the file.
Header verify_file(const std::string& path, bool hash_contents) {
  UniqueFd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  LOCKSTEP_CHECK(f.valid(), path, ": cannot open checkpoint: ", errno_text());
  const off_t size = ::lseek(f.get(), 0, SEEK_END);
  LOCKSTEP_CHECK(size >= 0, path, ": cannot seek: ", errno_text());
  LOCKSTEP_CHECK(static_cast<std::size_t>(size) >= kHeaderBytes, path, ": truncated: ", size,
                 " bytes, shorter than the ", kHeaderBytes, "-byte header");
  std::vector<char> buffer(kHeaderBytes);
  LOCKSTEP_CHECK(
      ::pread(f.get(), buffer.data(), kHeaderBytes, 0) == static_cast<ssize_t>(kHeaderBytes), path,
      ": cannot read header: ", errno_text());
  Header h = parse_header(buffer.data(), path);
  LOCKSTEP_CHECK_HINT(static_cast<std::uint64_t>(size) >= h.file_bytes,
                      "the copy or the disk lost its end: resume from an older checkpoint", path,
                      ": truncated: ", size, " of ", h.file_bytes, " bytes");
  LOCKSTEP_CHECK(static_cast<std::uint64_t>(size) == h.file_bytes, path, ": has ", size,
                 " bytes but its header says ", h.file_bytes, " (bytes appended after writing)");
  if (!hash_contents) return h;
  const std::uint32_t hash = hash_fd(f.get(), kHeaderBytes, path).first;
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
      h5::Scope scope;
      h5::CreateOptions options;
      options.userblock = userblock;
      options.v18_format = true;
      options.locking = false;
      h5::Handle file = h5::create_file(tmp_name, options);
      fill(file.get());
      h5::check(file.close(), tmp_name, "closing (writing out)");
    }
    {
      UniqueFd f(::open(tmp_name.c_str(), O_RDWR | O_CLOEXEC));
      LOCKSTEP_CHECK(f.valid(), tmp_name, ": cannot reopen: ", errno_text());
      seal(f.get(), tmp_name);
    }
    publish_file(tmp_name, path);
  } catch (...) {
    fs::remove(tmp, ec);
    throw;
  }
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
    h5::write_string_attr(file, "format", kFormat, path);
    h5::write_int_attr(file, "version", kCheckpointVersion, path);
    h5::write_int_attr(file, "step", state.step, path);
    h5::write_int_attr(file, "epoch", state.epoch, path);
    h5::write_int_attr(file, "batch_in_epoch", state.batch_in_epoch, path);
    h5::write_int_attr(file, "world_size", state.world_size, path);
    {
      h5::Handle meta = h5::create_group(file, "meta", path);
      h5::write_string_dataset(meta.get(), "config_ini", state.config_ini, path);
      h5::write_string_dataset(meta.get(), "model_structure", state.model_structure, path);
    }
    {
      h5::Handle attrs = h5::create_group(file, "attrs", path);
      for (const auto& [key, value] : state.attrs) {
        LOCKSTEP_CHECK(!key.empty(), path, ": an attribute has an empty key");
        h5::write_string_dataset(attrs.get(), h5::escape_name(key), value, path);
      }
    }
    {
      h5::Handle tensors = h5::create_group(file, "tensors", path);
      for (const auto& [name, tensor] : host)
        write_tensor(tensors.get(), name, tensor, path);
    }
    h5::write_string_attr(file, "checksum_crc32", hex32(content_hash), path);
    h5::write_int_attr(file, "complete", 1,
                       path);  // last: its presence means everything above is in
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
  h5::Scope scope;
  h5::Handle file = h5::open_file(path, /*locking=*/false);
  const hid_t f = file.get();
  const std::string format = h5::read_string_attr(f, "format", path);
  LOCKSTEP_CHECK(format == kFormat, path, ": format attribute is '", format, "', expected '",
                 kFormat, "'");
  const std::int64_t version = h5::read_int_attr(f, "version", path);
  LOCKSTEP_CHECK(version == kCheckpointVersion, path, ": version attribute is ", version,
                 ", this build reads ", kCheckpointVersion);
  LOCKSTEP_CHECK_HINT(
      h5::has_attr(f, "complete", path) && h5::read_int_attr(f, "complete", path) == 1,
      "the writer stopped before finishing: resume from an older checkpoint", path,
      ": incomplete (no complete marker)");
  CheckpointState s;
  s.step = h5::read_int_attr(f, "step", path);
  s.epoch = h5::read_int_attr(f, "epoch", path);
  s.batch_in_epoch = h5::read_int_attr(f, "batch_in_epoch", path);
  s.world_size = h5::read_int_attr(f, "world_size", path);
  LOCKSTEP_CHECK(s.step == header.step && s.epoch == header.epoch &&
                     s.batch_in_epoch == header.batch_in_epoch && s.world_size == header.world_size,
                 path, ": the attributes (step ", s.step, ", epoch ", s.epoch, ", batch_in_epoch ",
                 s.batch_in_epoch, ", world_size ", s.world_size, ") differ from the header's (",
                 header.step, ", ", header.epoch, ", ", header.batch_in_epoch, ", ",
                 header.world_size, ")");
  {
    h5::Handle meta = h5::open_group(f, "meta", path);
    s.config_ini = h5::read_string_dataset(meta.get(), "config_ini", path);
    s.model_structure = h5::read_string_dataset(meta.get(), "model_structure", path);
  }
  {
    h5::Handle attrs = h5::open_group(f, "attrs", path);
    for (const std::string& link : h5::link_names(attrs.get(), path, "/attrs"))
      s.attrs[h5::unescape_name(link)] = h5::read_string_dataset(attrs.get(), link, path);
  }
  {
    h5::Handle tensors = h5::open_group(f, "tensors", path);
    for (const std::string& link : h5::link_names(tensors.get(), path, "/tensors")) {
      s.tensors.push_back(read_tensor(tensors.get(), "/tensors", link, path));
    }
  }
  const std::uint32_t tensors_hash = tensors_checksum(s.tensors);
  LOCKSTEP_CHECK(tensors_hash == header.tensors_hash, path, ": checksum mismatch: tensors hash to ",
                 hex32(tensors_hash), ", header says ", hex32(header.tensors_hash));
  const std::string stored = h5::read_string_attr(f, "checksum_crc32", path);
  const std::string computed = hex32(content_checksum(s, tensors_hash));
  LOCKSTEP_CHECK(stored == computed, path, ": checksum mismatch: content hashes to ", computed,
                 ", checksum_crc32 attribute says ", stored);
  return s;
}

std::vector<CheckpointFile> list_checkpoints(const std::string& dir) {
  static const std::regex pattern(R"(ckpt-(\d+)\.h5)");
  std::vector<CheckpointFile> out;
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
      out.push_back({step, entry.path().string()});
    }
  }
  std::sort(out.begin(), out.end(), [](const CheckpointFile& a, const CheckpointFile& b) {
    return a.step != b.step ? a.step > b.step : a.path > b.path;
  });
  return out;
}

std::optional<std::string> find_latest_checkpoint(
    const std::string& dir, const std::function<void(const std::string&)>& warn) {
  for (const CheckpointFile& c : list_checkpoints(dir)) {
    try {
      (void)read_checkpoint(c.path);
      return c.path;
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
  for (const CheckpointFile& c : list_checkpoints(dir)) {
    bool complete = true;
    try {
      (void)verify_file(c.path, /*hash_contents=*/false);
    } catch (const Error&) {
      complete = false;
    }
    // A file that does not verify is never deleted: newer than the newest complete one it is
    // left for resume to report; older, it is evidence, or another format version's, not ours to
    // judge.
    if (!complete) continue;
    if (kept < keep) {
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
      h5::write_string_attr(file, key, value, path);
    h5::Handle p = h5::create_group(file, "parameters", path);
    for (const auto& [name, tensor] : params)
      write_tensor(p.get(), name, tensor, path);
    h5::Handle b = h5::create_group(file, "buffers", path);
    for (const auto& [name, tensor] : buffers)
      write_tensor(b.get(), name, tensor, path);
  };
  write_hdf5_atomically(path, /*userblock=*/0, fill, [](int, const std::string&) {});
}

ExportedParameters read_exported_parameters(const std::string& path) {
  h5::Scope scope;
  h5::Handle file = h5::open_file(path, /*locking=*/false);
  ExportedParameters out;
  for (auto [group_name, dest] :
       {std::pair{"parameters", &out.params}, std::pair{"buffers", &out.buffers}}) {
    const std::string where = str("/", group_name);
    h5::Handle g = h5::open_group(file.get(), group_name, path);
    for (const std::string& link : h5::link_names(g.get(), path, where))
      dest->push_back(read_tensor(g.get(), where, link, path));
  }
  H5O_info_t info;
  h5::check(H5Oget_info(file.get(), &info), path, "root info");
  for (hsize_t i = 0; i < info.num_attrs; ++i) {
    std::string name;
    {
      h5::Handle attr = h5::attr(
          H5Aopen_by_idx(file.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, H5P_DEFAULT, H5P_DEFAULT),
          path, "root attribute");
      ssize_t n = h5::check(H5Aget_name(attr.get(), 0, nullptr), path, "attribute name");
      name.assign(static_cast<std::size_t>(n) + 1, '\0');
      h5::check(H5Aget_name(attr.get(), name.size(), name.data()), path, "attribute name");
      name.resize(static_cast<std::size_t>(n));
    }
    out.attrs[name] = h5::read_string_attr(file.get(), name, path);
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
