#include "lockstep/h5/h5.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "lockstep/core/file.hpp"

namespace fs = std::filesystem;

namespace lockstep::h5 {

std::recursive_mutex& mutex() {
  static std::recursive_mutex m;
  return m;
}

std::string last_error() {
  std::vector<std::string> descs;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* e, void* out) -> herr_t {
        if (e->desc && *e->desc) static_cast<std::vector<std::string>*>(out)->push_back(e->desc);
        return 0;
      },
      &descs);
  H5Eclear2(H5E_DEFAULT);
  if (descs.empty()) return "HDF5 gave no reason";
  if (descs.size() == 1 || descs.front() == descs.back()) return descs.front();
  return descs.front() + ": " + descs.back();
}

namespace {
Handle owned(hid_t id, Handle::Closer closer, const std::string& where, const std::string& what) {
  return {check(id, where.empty() ? std::string("HDF5") : where, what), closer};
}
}  // namespace

Handle file(hid_t id, const std::string& where, const std::string& what) {
  return owned(id, H5Fclose, where, what);
}
Handle group(hid_t id, const std::string& where, const std::string& what) {
  return owned(id, H5Gclose, where, what);
}
Handle dataset(hid_t id, const std::string& where, const std::string& what) {
  return owned(id, H5Dclose, where, what);
}
Handle space(hid_t id, const std::string& where, const std::string& what) {
  return owned(id, H5Sclose, where, what);
}
Handle type(hid_t id, const std::string& where, const std::string& what) {
  return owned(id, H5Tclose, where, what);
}
Handle attr(hid_t id, const std::string& where, const std::string& what) {
  return owned(id, H5Aclose, where, what);
}
Handle plist(hid_t id, const std::string& where, const std::string& what) {
  return owned(id, H5Pclose, where, what);
}

// ---- files ----------------------------------------------------------------------------------

Handle open_file(const std::string& path, bool locking, const std::string& hint) {
  // open(2) first: HDF5 reports every failure as "unable to open file", which sends the user
  // looking for a damaged file when the problem is a permission or a typo.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    LOCKSTEP_FAIL_HINT(err == EACCES || err == EPERM
                           ? "give this user read permission (ls -l " + path + ")"
                           : hint,
                       path, ": cannot open: ", std::strerror(err));
  }
  ::close(fd);
  Handle fapl = plist(H5Pcreate(H5P_FILE_ACCESS), path, "file access properties");
#if H5_VERSION_GE(1, 10, 7)
  if (!locking)
    check(H5Pset_file_locking(fapl.get(), /*use_file_locking=*/0, /*ignore_when_disabled=*/1), path,
          "file locking");
#else
  (void)locking;
#endif
  return {check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), path,
                "cannot open as HDF5 (truncated or not an HDF5 file?)", hint),
          H5Fclose};
}

Handle create_file(const std::string& path, const CreateOptions& options, const std::string& hint) {
  Handle fcpl = plist(H5Pcreate(H5P_FILE_CREATE), path, "file creation properties");
  if (options.userblock > 0)
    check(H5Pset_userblock(fcpl.get(), options.userblock), path, "user block");
  if (!options.track_times)
    check(H5Pset_obj_track_times(fcpl.get(), 0), path, "the root group's times");
  Handle fapl = plist(H5Pcreate(H5P_FILE_ACCESS), path, "file access properties");
  // The 1.8 object format: readable by every HDF5 since 2008, and it allows attributes over
  // 64 KiB (a large model structure).
  if (options.v18_format)
    check(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_V18), path, "format version");
  if (options.v110_format)
    check(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V110, H5F_LIBVER_V110), path,
          "format version");
#if H5_VERSION_GE(1, 10, 7)
  if (!options.locking) check(H5Pset_file_locking(fapl.get(), 0, 1), path, "file locking");
#endif
  hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get());
  if (id < 0) {
    std::string reason = last_error();
    // Name the folder problem, which HDF5 hides behind "unable to open file".
    const fs::path dir = fs::path(path).has_parent_path() ? fs::path(path).parent_path() : ".";
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
      reason = "folder " + dir.string() + " does not exist";
    else if (::access(dir.c_str(), W_OK) != 0)
      reason = "folder " + dir.string() + ": " + errno_text();
    LOCKSTEP_FAIL_HINT(hint, path, ": cannot create: ", reason);
  }
  return {id, H5Fclose};
}

// ---- groups and names -----------------------------------------------------------------------

Handle create_group(hid_t parent, const std::string& name, const std::string& where) {
  Handle gcpl = plist(H5Pcreate(H5P_GROUP_CREATE), where, "group properties");
  check(H5Pset_link_creation_order(gcpl.get(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED),
        where, "link creation order");
  return group(H5Gcreate2(parent, name.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT), where,
               "creating group /" + name);
}

Handle open_group(hid_t parent, const std::string& name, const std::string& where,
                  const std::string& hint) {
  LOCKSTEP_CHECK_HINT(has_link(parent, name), hint, where, ": group /", name, " is missing");
  return {check(H5Gopen2(parent, name.c_str(), H5P_DEFAULT), where, "opening /" + name, hint),
          H5Gclose};
}

bool has_link(hid_t parent, const std::string& name) {
  return H5Lexists(parent, name.c_str(), H5P_DEFAULT) > 0;
}

std::vector<std::string> link_names(hid_t g, const std::string& where, const std::string& what) {
  Handle gcpl = plist(H5Gget_create_plist(g), where, "properties of " + what);
  unsigned flags = 0;
  check(H5Pget_link_creation_order(gcpl.get(), &flags), where, "creation order of " + what);
  const H5_index_t index = (flags & H5P_CRT_ORDER_INDEXED) ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME;
  H5G_info_t info;
  check(H5Gget_info(g, &info), where, "listing " + what);
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    ssize_t n = check(H5Lget_name_by_idx(g, ".", index, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT),
                      where, "name of an entry in " + what);
    std::string name(static_cast<std::size_t>(n) + 1, '\0');
    check(H5Lget_name_by_idx(g, ".", index, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT),
          where, "name of an entry in " + what);
    name.resize(static_cast<std::size_t>(n));
    names.push_back(std::move(name));
  }
  return names;
}

std::string escape_name(const std::string& name) {
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

std::string unescape_name(const std::string& escaped) {
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

// ---- attributes -----------------------------------------------------------------------------

namespace {

// Fixed-length, NUL-padded string type of max(size, 1) bytes.
Handle string_type(std::size_t size, const std::string& where) {
  Handle t = type(H5Tcopy(H5T_C_S1), where, "string type");
  check(H5Tset_size(t.get(), std::max<std::size_t>(size, 1)), where, "string size");
  check(H5Tset_strpad(t.get(), H5T_STR_NULLPAD), where, "string padding");
  return t;
}

// Reads one string from an attribute (is_attr) or a dataset, fixed or variable length.
std::string read_string(hid_t obj, bool is_attr, const std::string& where, const std::string& what,
                        const std::string& hint) {
  Handle t = type(is_attr ? H5Aget_type(obj) : H5Dget_type(obj), where, "type of " + what);
  LOCKSTEP_CHECK_HINT(H5Tget_class(t.get()) == H5T_STRING, hint, where, ": ", what,
                      " is not a string");
  Handle s = space(is_attr ? H5Aget_space(obj) : H5Dget_space(obj), where, "dataspace of " + what);
  LOCKSTEP_CHECK_HINT(H5Sget_simple_extent_npoints(s.get()) == 1, hint, where, ": ", what,
                      " is not a single string");
  auto read = [&](hid_t memory, void* out) {
    check(is_attr ? H5Aread(obj, memory, out)
                  : H5Dread(obj, memory, H5S_ALL, H5S_ALL, H5P_DEFAULT, out),
          where, "reading " + what, hint);
  };
  if (H5Tis_variable_str(t.get()) > 0) {  // as h5py writes them
    char* text = nullptr;
    read(t.get(), &text);
    std::string out = text ? text : "";
    H5free_memory(text);
    return out;
  }
  const std::size_t size = H5Tget_size(t.get());
  LOCKSTEP_CHECK_HINT(size > 0, hint, where, ": ", what, " has an invalid string size");
  std::string out(size, '\0');
  read(t.get(), out.data());
  // NUL-terminated strings end at the first NUL; NUL-padded ones lose their padding.
  if (H5Tget_strpad(t.get()) == H5T_STR_NULLTERM)
    out.resize(std::strlen(out.c_str()));
  else
    out.erase(out.find_last_not_of('\0') + 1);
  return out;
}

Handle open_attr(hid_t obj, const std::string& name, const std::string& where,
                 const std::string& hint) {
  LOCKSTEP_CHECK_HINT(has_attr(obj, name, where, hint), hint, where, ": attribute '", name,
                      "' is missing");
  return {check(H5Aopen(obj, name.c_str(), H5P_DEFAULT), where,
                "cannot open attribute '" + name + "'", hint),
          H5Aclose};
}

template <class T>
void write_array_attr(hid_t obj, const std::string& name, const T* values, hsize_t n, bool scalar,
                      hid_t ftype, hid_t mtype, const std::string& where) {
  Handle s = space(scalar ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &n, nullptr), where,
                   "dataspace of attribute '" + name + "'");
  Handle a = attr(H5Acreate2(obj, name.c_str(), ftype, s.get(), H5P_DEFAULT, H5P_DEFAULT), where,
                  "cannot create attribute '" + name + "'");
  check(H5Awrite(a.get(), mtype, values), where, "cannot write attribute '" + name + "'");
}

template <class T>
std::vector<T> read_array_attr(hid_t obj, const std::string& name, const std::string& where,
                               const std::string& hint) {
  constexpr bool is_float = std::is_same_v<T, float>;
  Handle a = open_attr(obj, name, where, hint);
  Handle t = type(H5Aget_type(a.get()), where, "type of attribute '" + name + "'");
  LOCKSTEP_CHECK_HINT(H5Tget_class(t.get()) == (is_float ? H5T_FLOAT : H5T_INTEGER), hint, where,
                      ": attribute '", name, "' is not ",
                      is_float ? "floating-point" : "an integer");
  Handle s = space(H5Aget_space(a.get()), where, "dataspace of attribute '" + name + "'");
  hssize_t n = H5Sget_simple_extent_npoints(s.get());
  LOCKSTEP_CHECK_HINT(n >= 0, hint, where, ": attribute '", name, "' has no extent");
  std::vector<T> out(static_cast<std::size_t>(n));
  check(H5Aread(a.get(), is_float ? H5T_NATIVE_FLOAT : H5T_NATIVE_INT64, out.data()), where,
        "cannot read attribute '" + name + "'", hint);
  return out;
}

}  // namespace

bool has_attr(hid_t obj, const std::string& name, const std::string& where,
              const std::string& hint) {
  // H5Aexists fails (rather than answering no) when the object header is damaged, e.g. its
  // checksum does not match: that is a corrupted file, not a missing attribute.
  return check(H5Aexists(obj, name.c_str()), where,
               "cannot look up attribute '" + name + "' (corrupted file?)", hint) > 0;
}

void write_string_attr(hid_t obj, const std::string& name, const std::string& value,
                       const std::string& where) {
  Handle t = string_type(value.size(), where);
  Handle s = space(H5Screate(H5S_SCALAR), where, "scalar dataspace");
  Handle a = attr(H5Acreate2(obj, name.c_str(), t.get(), s.get(), H5P_DEFAULT, H5P_DEFAULT), where,
                  "cannot create attribute '" + name + "'");
  const std::string padded = value.empty() ? std::string(1, '\0') : value;
  check(H5Awrite(a.get(), t.get(), padded.data()), where, "cannot write attribute '" + name + "'");
}

std::string read_string_attr(hid_t obj, const std::string& name, const std::string& where,
                             const std::string& hint) {
  Handle a = open_attr(obj, name, where, hint);
  return read_string(a.get(), true, where, "attribute '" + name + "'", hint);
}

void write_int_attr(hid_t obj, const std::string& name, std::int64_t value,
                    const std::string& where) {
  write_array_attr(obj, name, &value, 1, /*scalar=*/true, H5T_STD_I64LE, H5T_NATIVE_INT64, where);
}

void write_ints_attr(hid_t obj, const std::string& name, const std::vector<std::int64_t>& values,
                     const std::string& where) {
  write_array_attr(obj, name, values.data(), values.size(), false, H5T_STD_I64LE, H5T_NATIVE_INT64,
                   where);
}

void write_floats_attr(hid_t obj, const std::string& name, const std::vector<float>& values,
                       const std::string& where) {
  write_array_attr(obj, name, values.data(), values.size(), false, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT,
                   where);
}

std::int64_t read_int_attr(hid_t obj, const std::string& name, const std::string& where,
                           const std::string& hint) {
  auto v = read_array_attr<std::int64_t>(obj, name, where, hint);
  LOCKSTEP_CHECK_HINT(v.size() == 1, hint, where, ": attribute '", name,
                      "' should be one integer but has ", v.size(), " values");
  return v[0];
}

std::vector<std::int64_t> read_ints_attr(hid_t obj, const std::string& name,
                                         const std::string& where, const std::string& hint) {
  return read_array_attr<std::int64_t>(obj, name, where, hint);
}

std::vector<float> read_floats_attr(hid_t obj, const std::string& name, const std::string& where,
                                    const std::string& hint) {
  return read_array_attr<float>(obj, name, where, hint);
}

// ---- datasets -------------------------------------------------------------------------------

void write_string_dataset(hid_t g, const std::string& name, const std::string& value,
                          const std::string& where) {
  Handle t = string_type(value.size(), where);
  Handle s = space(H5Screate(H5S_SCALAR), where, "scalar dataspace");
  Handle d =
      dataset(H5Dcreate2(g, name.c_str(), t.get(), s.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
              where, "creating dataset " + name);
  const std::string padded = value.empty() ? std::string(1, '\0') : value;
  check(H5Dwrite(d.get(), t.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, padded.data()), where,
        "writing dataset " + name);
}

std::string read_string_dataset(hid_t g, const std::string& name, const std::string& where) {
  LOCKSTEP_CHECK(has_link(g, name), where, ": dataset ", name, " is missing");
  Handle d = dataset(H5Dopen2(g, name.c_str(), H5P_DEFAULT), where, "opening " + name);
  return read_string(d.get(), false, where, name, "");
}

hid_t file_type(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return H5T_IEEE_F32LE;
    case DType::F64:
      return H5T_IEEE_F64LE;
    case DType::I32:
      return H5T_STD_I32LE;
    case DType::U8:
      return H5T_STD_U8LE;
    case DType::BF16:
      return H5T_STD_U16LE;  // raw bits; the writer records the dtype
  }
  LOCKSTEP_FAIL("unknown dtype ", static_cast<int>(dtype));
}

hid_t memory_type(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return H5T_NATIVE_FLOAT;
    case DType::F64:
      return H5T_NATIVE_DOUBLE;
    case DType::I32:
      return H5T_NATIVE_INT32;
    case DType::U8:
      return H5T_NATIVE_UINT8;
    case DType::BF16:
      return H5T_NATIVE_UINT16;
  }
  LOCKSTEP_FAIL("unknown dtype ", static_cast<int>(dtype));
}

DType dtype_of_type(hid_t t, const std::string& where, const std::string& what) {
  const H5T_class_t cls = H5Tget_class(t);
  const std::size_t size = H5Tget_size(t);
  if (cls == H5T_FLOAT && size == 4) return DType::F32;
  if (cls == H5T_FLOAT && size == 8) return DType::F64;
  if (cls == H5T_INTEGER && size == 4 && H5Tget_sign(t) == H5T_SGN_2) return DType::I32;
  if (cls == H5T_INTEGER && size == 1 && H5Tget_sign(t) == H5T_SGN_NONE) return DType::U8;
  LOCKSTEP_FAIL(where, ": ", what, " has an HDF5 type lockstep does not read (a ", size * 8,
                "-bit ",
                cls == H5T_FLOAT     ? "float"
                : cls == H5T_INTEGER ? "integer"
                                     : "non-numeric",
                " type)");
}

Handle write_tensor(hid_t g, const std::string& link, const Tensor& tensor,
                    const std::string& where) {
  LOCKSTEP_CHECK(tensor.defined(), where, ": tensor ", link, " is undefined");
  LOCKSTEP_CHECK(tensor.ndim() <= H5S_MAX_RANK, where, ": tensor ", link, " has ", tensor.ndim(),
                 " dimensions, HDF5 allows ", H5S_MAX_RANK);
  const Tensor host = tensor.device().is_cpu() ? tensor : tensor.to(Device::cpu());
  std::vector<hsize_t> dims(host.shape().begin(), host.shape().end());
  Handle s = space(host.ndim() == 0 ? H5Screate(H5S_SCALAR)
                                    : H5Screate_simple(host.ndim(), dims.data(), nullptr),
                   where, "dataspace of " + link);
  Handle d = dataset(H5Dcreate2(g, link.c_str(), file_type(host.dtype()), s.get(), H5P_DEFAULT,
                                H5P_DEFAULT, H5P_DEFAULT),
                     where, "creating dataset " + link);
  if (host.numel() > 0) {
    check(H5Dwrite(d.get(), memory_type(host.dtype()), H5S_ALL, H5S_ALL, H5P_DEFAULT,
                   host.raw_data()),
          where, "writing dataset " + link);
  }
  return d;
}

Tensor read_tensor(hid_t g, const std::string& link, DType dtype, const std::string& where) {
  Handle d = dataset(H5Dopen2(g, link.c_str(), H5P_DEFAULT), where, "opening " + link);
  Handle t = type(H5Dget_type(d.get()), where, "type of " + link);
  LOCKSTEP_CHECK(H5Tequal(t.get(), file_type(dtype)) > 0, where, ": dataset ", link,
                 " is stored with an HDF5 type that does not match its dtype ", dtype_name(dtype));
  Handle s = space(H5Dget_space(d.get()), where, "dataspace of " + link);
  const int rank = check(H5Sget_simple_extent_ndims(s.get()), where, "rank of " + link);
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  if (rank > 0) check(H5Sget_simple_extent_dims(s.get(), dims.data(), nullptr), where, "shape");
  Tensor tensor = Tensor::empty(Shape(dims.begin(), dims.end()), dtype);
  if (tensor.numel() > 0) {
    check(H5Dread(d.get(), memory_type(dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, tensor.raw_data()),
          where, "reading dataset " + link);
  }
  return tensor;
}

}  // namespace lockstep::h5
