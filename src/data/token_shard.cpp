#include "lockstep/data/token_shard.hpp"

#include <algorithm>
#include <filesystem>
#include <type_traits>

#include "lockstep/data/shard.hpp"
#include "lockstep/h5/h5.hpp"

namespace lockstep::data {

namespace {

constexpr const char* kTokenHint = "regenerate the token shards with lockstep-shard text";

// ---- The HDF5 calls of token shards beyond the h5 home's (its attributes are used as they are):
// one growable 1-D dataset.
namespace h5io {

// A growable, chunked 1-D dataset of the given file type.
h5::Handle create_1d(hid_t file, const char* name, hid_t file_type, hsize_t chunk,
                     int deflate_level, const std::string& where) {
  hsize_t dims = 0, maxdims = H5S_UNLIMITED;
  auto space = h5::space(H5Screate_simple(1, &dims, &maxdims));
  auto dcpl = h5::plist(H5Pcreate(H5P_DATASET_CREATE));
  LOCKSTEP_H5(H5Pset_chunk(dcpl.get(), 1, &chunk), "", where, "cannot set the chunking of /", name);
  // No modification time in the object header: a set made twice, or by any number of threads
  // and ranks, is the same bytes (Note [Text determinism]).
  LOCKSTEP_H5(H5Pset_obj_track_times(dcpl.get(), false), "", where,
              "cannot turn off the time stamps of /", name);
  if (deflate_level > 0) {
    H5Pset_shuffle(dcpl.get());
    LOCKSTEP_H5(H5Pset_deflate(dcpl.get(), static_cast<unsigned>(deflate_level)),
                "is zlib available to HDF5?", where, "cannot enable deflate for /", name);
  }
  return h5::dataset(LOCKSTEP_H5(
      H5Dcreate2(file, name, file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), "",
      where, "cannot create /", name));
}

void append_1d(hid_t ds, hsize_t old_size, const std::int32_t* data, hsize_t n,
               const std::string& where, const char* name) {
  const hsize_t new_size = old_size + n;
  LOCKSTEP_H5(H5Dset_extent(ds, &new_size), "", where, "cannot grow /", name);
  auto fspace = h5::space(H5Dget_space(ds));
  LOCKSTEP_H5(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &old_size, nullptr, &n, nullptr),
              "", where, "cannot select in /", name);
  auto mspace = h5::space(H5Screate_simple(1, &n, nullptr));
  LOCKSTEP_H5(H5Dwrite(ds, H5T_NATIVE_INT32, mspace.get(), fspace.get(), H5P_DEFAULT, data),
              "is the disk full?", where, "cannot write /", name);
}

void read_1d(hid_t ds, hid_t mem_type, hsize_t begin, hsize_t count, void* out,
             const std::string& where, const char* name) {
  auto fspace = h5::space(H5Dget_space(ds));
  LOCKSTEP_H5(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &begin, nullptr, &count, nullptr),
              kTokenHint, where, "cannot select in /", name);
  auto mspace = h5::space(H5Screate_simple(1, &count, nullptr));
  LOCKSTEP_H5(H5Dread(ds, mem_type, mspace.get(), fspace.get(), H5P_DEFAULT, out), kTokenHint,
              where, "cannot read [", begin, ", ", begin + count, ") of /", name,
              " (corrupted file?)");
}

}  // namespace h5io

void validate(const TokenShardMeta& m, const std::string& where, const char* hint) {
  LOCKSTEP_CHECK_HINT(m.num_shards >= 1, hint, where, ": attribute 'num_shards' is ", m.num_shards,
                      ", must be at least 1");
  LOCKSTEP_CHECK_HINT(m.shard_index >= 0 && m.shard_index < m.num_shards, hint, where,
                      ": attribute 'shard_index' is ", m.shard_index, ", outside [0, ",
                      m.num_shards, ")");
  LOCKSTEP_CHECK_HINT(!m.tokenizer.empty(), hint, where, ": attribute 'tokenizer' is empty");
  LOCKSTEP_CHECK_HINT(m.vocab_size >= 1 && m.vocab_size <= (std::int64_t{1} << 31), hint, where,
                      ": attribute 'vocab_size' is ", m.vocab_size, ", outside [1, 2^31]");
  LOCKSTEP_CHECK_HINT(m.eot_token >= 0 && m.eot_token < m.vocab_size, hint, where,
                      ": attribute 'eot_token' is ", m.eot_token,
                      ", outside [0, vocab_size = ", m.vocab_size, ")");
}

template <class T>
void check_ids(const T* ids, std::int64_t count, std::int64_t first, const TokenShardMeta& m,
               const std::string& where, const char* hint) {
  for (std::int64_t i = 0; i < count; ++i) {
    const auto v = static_cast<std::int64_t>(ids[i]);
    if (v < 0 || v >= m.vocab_size) [[unlikely]] {
      LOCKSTEP_FAIL_HINT(hint, where, ": token ", first + i, " is ", v,
                         ", outside [0, vocab_size = ", m.vocab_size, ") of tokenizer '",
                         m.tokenizer, "'");
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
struct TokenShardWriter::Impl {
  std::string path, tmp_path;
  TokenShardMeta meta;
  h5::Handle file, tokens;
  std::int64_t n = 0;
  bool closed = false;
};

TokenShardWriter::TokenShardWriter(const std::string& path, const TokenShardMeta& meta,
                                   int deflate_level)
    : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  m.path = path;
  m.tmp_path = path + ".tmp";
  m.meta = meta;
  m.meta.num_tokens = 0;
  validate(m.meta, path, "");
  LOCKSTEP_CHECK(deflate_level >= 0 && deflate_level <= 9, path, ": deflate level ", deflate_level,
                 " is outside 0..9");
  h5::Scope scope;
  m.file = h5::file(LOCKSTEP_H5(
      H5Fcreate(m.tmp_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
      "does the output folder exist and is it writable?", m.tmp_path, "cannot create the file"));
  const hid_t type = m.meta.token_bytes() == 2 ? H5T_STD_U16LE : H5T_STD_U32LE;
  const auto chunk = static_cast<hsize_t>(kDefaultChunkBytes / m.meta.token_bytes());
  m.tokens = h5io::create_1d(m.file.get(), "tokens", type, chunk, deflate_level, m.tmp_path);
  const hid_t f = m.file.get();
  h5::write_string_attr(f, "format", kShardFormatName, m.tmp_path);
  h5::write_int_attr(f, "version", kShardFormatVersion, m.tmp_path);
  h5::write_string_attr(f, "kind", kTokenShardKind, m.tmp_path);
  h5::write_int_attr(f, "shard_index", m.meta.shard_index, m.tmp_path);
  h5::write_int_attr(f, "num_shards", m.meta.num_shards, m.tmp_path);
  h5::write_string_attr(f, "tokenizer", m.meta.tokenizer, m.tmp_path);
  h5::write_int_attr(f, "vocab_size", m.meta.vocab_size, m.tmp_path);
  h5::write_int_attr(f, "eot_token", m.meta.eot_token, m.tmp_path);
}

TokenShardWriter::~TokenShardWriter() {
  if (!impl_ || impl_->closed) return;
  h5::Scope scope;
  impl_->tokens.reset();
  impl_->file.reset();
  std::error_code ec;
  std::filesystem::remove(impl_->tmp_path, ec);
}

void TokenShardWriter::append(std::span<const std::int32_t> tokens) {
  auto& m = *impl_;
  LOCKSTEP_CHECK(!m.closed, m.path, ": append after close");
  if (tokens.empty()) return;
  check_ids(tokens.data(), static_cast<std::int64_t>(tokens.size()), m.n, m.meta, m.path, "");
  h5::Scope scope;
  h5io::append_1d(m.tokens.get(), static_cast<hsize_t>(m.n), tokens.data(), tokens.size(),
                  m.tmp_path, "tokens");
  m.n += static_cast<std::int64_t>(tokens.size());
}

void TokenShardWriter::close() {
  auto& m = *impl_;
  if (m.closed) return;
  h5::Scope scope;
  m.tokens.reset();
  LOCKSTEP_H5(H5Fclose(m.file.release()), "is the disk full?", m.tmp_path, "cannot close the file");
  std::filesystem::rename(m.tmp_path, m.path);
  m.closed = true;
  m.meta.num_tokens = m.n;
}

std::int64_t TokenShardWriter::num_tokens() const {
  return impl_->n;
}

// ---------------------------------------------------------------------------------------------
std::unique_ptr<TokenShardFile> TokenShardFile::open(const std::string& path,
                                                     std::size_t chunk_cache_bytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  LOCKSTEP_CHECK_HINT(fs::is_regular_file(path, ec), kTokenHint, "token shard ", path,
                      fs::exists(path, ec) ? " is not a regular file" : " does not exist");
  std::unique_ptr<TokenShardFile> s(new TokenShardFile());
  s->path_ = path;
  const std::string& where = s->path_;
  h5::Scope scope;
  s->file_ = LOCKSTEP_H5(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), kTokenHint, where,
                         "cannot open as HDF5 (truncated or not an HDF5 file?)");
  const hid_t f = s->file_;
  TokenShardMeta& m = s->meta_;
  const std::string format = h5::read_string_attr(f, "format", where, kTokenHint);
  LOCKSTEP_CHECK_HINT(format == kShardFormatName, kTokenHint, where, ": attribute 'format' is '",
                      format, "', expected '", kShardFormatName, "'");
  LOCKSTEP_CHECK_HINT(H5Aexists(f, "kind") > 0,
                      "open it as an image set, or make token shards "
                      "with lockstep-shard text",
                      where, " is an image shard (it has no attribute 'kind' = 'tokens')");
  const std::string kind = h5::read_string_attr(f, "kind", where, kTokenHint);
  LOCKSTEP_CHECK_HINT(kind == kTokenShardKind, kTokenHint, where, ": attribute 'kind' is '", kind,
                      "', expected '", kTokenShardKind, "'");
  const std::int64_t version = h5::read_int_attr(f, "version", where, kTokenHint);
  LOCKSTEP_CHECK_HINT(
      version == kShardFormatVersion,
      version > kShardFormatVersion ? "a newer lockstep wrote it: upgrade" : kTokenHint, where,
      ": shard format version ", version, " is not supported (this reader reads version ",
      kShardFormatVersion, ")");
  m.shard_index = h5::read_int_attr(f, "shard_index", where, kTokenHint);
  m.num_shards = h5::read_int_attr(f, "num_shards", where, kTokenHint);
  m.tokenizer = h5::read_string_attr(f, "tokenizer", where, kTokenHint);
  m.vocab_size = h5::read_int_attr(f, "vocab_size", where, kTokenHint);
  m.eot_token = h5::read_int_attr(f, "eot_token", where, kTokenHint);
  validate(m, where, kTokenHint);

  LOCKSTEP_CHECK_HINT(H5Lexists(f, "tokens", H5P_DEFAULT) > 0, kTokenHint, where,
                      ": dataset /tokens is missing");
  auto dapl = h5::plist(H5Pcreate(H5P_DATASET_ACCESS));
  H5Pset_chunk_cache(dapl.get(), kChunkCacheSlots, chunk_cache_bytes, 1.0);
  s->tokens_ =
      LOCKSTEP_H5(H5Dopen2(f, "tokens", dapl.get()), kTokenHint, where, "cannot open /tokens");
  auto t = h5::type(H5Dget_type(s->tokens_));
  const std::size_t size = H5Tget_size(t.get());
  LOCKSTEP_CHECK_HINT(H5Tget_class(t.get()) == H5T_INTEGER &&
                          H5Tget_sign(t.get()) == H5T_SGN_NONE &&
                          static_cast<int>(size) == m.token_bytes(),
                      kTokenHint, where, ": /tokens must hold uint", m.token_bytes() * 8,
                      " ids for vocab_size ", m.vocab_size, " (found a ", size * 8, "-bit ",
                      H5Tget_class(t.get()) == H5T_INTEGER ? "integer" : "non-integer", " type)");
  auto space = h5::space(H5Dget_space(s->tokens_));
  LOCKSTEP_CHECK_HINT(H5Sget_simple_extent_ndims(space.get()) == 1, kTokenHint, where,
                      ": /tokens must be one-dimensional");
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space.get(), &n, nullptr);
  m.num_tokens = static_cast<std::int64_t>(n);
  return s;
}

TokenShardFile::~TokenShardFile() {
  h5::Scope scope;
  if (tokens_ >= 0) H5Dclose(tokens_);
  if (file_ >= 0) H5Fclose(file_);
}

std::string TokenShardFile::where() const {
  return str(path_, " (token shard ", meta_.shard_index, " of ", meta_.num_shards, ")");
}

template <class T>
void TokenShardFile::read(std::int64_t begin, std::int64_t count, T* out) const {
  static_assert(std::is_same_v<T, std::uint16_t> || std::is_same_v<T, std::int32_t>);
  LOCKSTEP_CHECK(begin >= 0 && count >= 0 && begin + count <= meta_.num_tokens, where(),
                 ": tokens [", begin, ", ", begin + count, ") are outside [0, ", meta_.num_tokens,
                 ")");
  if constexpr (std::is_same_v<T, std::uint16_t>) {
    LOCKSTEP_CHECK(meta_.token_bytes() == 2, where(), ": 32-bit ids cannot be read as uint16");
  }
  if (count == 0) return;
  {
    h5::Scope scope;
    h5io::read_1d(tokens_, std::is_same_v<T, std::uint16_t> ? H5T_NATIVE_UINT16 : H5T_NATIVE_INT32,
                  static_cast<hsize_t>(begin), static_cast<hsize_t>(count), out, where(), "tokens");
  }
  check_ids(out, count, begin, meta_, where(), kTokenHint);
}
template void TokenShardFile::read<std::uint16_t>(std::int64_t, std::int64_t, std::uint16_t*) const;
template void TokenShardFile::read<std::int32_t>(std::int64_t, std::int64_t, std::int32_t*) const;

bool is_token_shard(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  h5::Scope scope;
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) {
    H5Eclear2(H5E_DEFAULT);
    return false;
  }
  auto file = h5::file(f);
  if (H5Aexists(f, "kind") <= 0) return false;
  try {
    return h5::read_string_attr(f, "kind", path) == kTokenShardKind;
  } catch (const Error&) {
    return false;
  }
}

std::vector<std::string> write_token_set(std::span<const std::int32_t> tokens,
                                         const std::string& out_dir, const std::string& name,
                                         std::int64_t num_shards, const TokenShardMeta& meta,
                                         int deflate_level) {
  const auto n = static_cast<std::int64_t>(tokens.size());
  LOCKSTEP_CHECK(num_shards >= 1, "--shards must be at least 1, got ", num_shards);
  LOCKSTEP_CHECK_HINT(n >= num_shards, "use fewer shards", "cannot split ", n, " tokens of '", name,
                      "' into ", num_shards, " non-empty shards");
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  std::vector<std::string> paths;
  for (std::int64_t s = 0; s < num_shards; ++s) {
    const std::int64_t begin = s * n / num_shards, end = (s + 1) * n / num_shards;
    TokenShardMeta m = meta;
    m.shard_index = s;
    m.num_shards = num_shards;
    const std::string path = out_dir + "/" + shard_file_name(name, s, num_shards);
    TokenShardWriter w(path, m, deflate_level);
    // In pieces, so one append never needs a second copy of a large shard in HDF5's buffers.
    constexpr std::int64_t kBlock = std::int64_t{1} << 20;
    for (std::int64_t b = begin; b < end; b += kBlock)
      w.append(tokens.subspan(static_cast<std::size_t>(b),
                              static_cast<std::size_t>(std::min(end, b + kBlock) - b)));
    w.close();
    paths.push_back(path);
  }
  return paths;
}

}  // namespace lockstep::data
