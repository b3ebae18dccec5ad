// lockstep's one home for HDF5, shared by the shard format (data/) and checkpoints (train/):
// the process-wide lock, one RAII handle type, attribute, string and tensor I/O, and errors that
// name the file and the object. Every failure is a lockstep::Error "FILE: what was being done on
// /object: HDF5's reason", never HDF5's own stderr dump.
//
// Debian's libhdf5 (serial 1.10) is built without thread safety: two threads inside HDF5 at once
// corrupt its global state. Every HDF5 call in the process (the loader thread reading shards on
// demand, evaluation reading the test set, rank 0 writing a checkpoint) therefore runs inside an
// h5::Scope, which holds one process-wide recursive lock and silences HDF5's automatic error
// printing. Handles must be closed inside a scope too (declare them after it).
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/core/error.hpp"
#include "lockstep/core/tensor.hpp"

namespace lockstep::h5 {

std::recursive_mutex& mutex();

class Scope {
 public:
  Scope() : lock_(mutex()) {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~Scope() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  std::unique_lock<std::recursive_mutex> lock_;
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

// The outermost and innermost descriptions on this thread's HDF5 error stack ("unable to open
// file: file signature not found"), then clears it.
std::string last_error();

// Owns one hid_t and closes it with the matching H5*close (inside a Scope).
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  ~Handle() { reset(); }
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, -1)), closer_(o.closer_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, -1);
      closer_ = o.closer_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  hid_t get() const { return id_; }
  hid_t release() { return std::exchange(id_, -1); }
  bool valid() const { return id_ >= 0; }
  void reset() {
    if (id_ >= 0 && closer_) closer_(id_);
    id_ = -1;
  }
  // Closes now and returns HDF5's status (closing a file flushes it, and can fail).
  herr_t close() {
    herr_t r = id_ >= 0 && closer_ ? closer_(id_) : 0;
    id_ = -1;
    return r;
  }

 private:
  hid_t id_ = -1;
  Closer closer_ = nullptr;
};

// Throws lockstep::Error "where: what: HDF5's reason" (with `hint`) when an HDF5 call returned a
// negative id or status; returns the result otherwise.
template <class T>
T check(T result, const std::string& where, const std::string& what, const std::string& hint = "") {
  if (result < 0) [[unlikely]] {
    LOCKSTEP_FAIL_HINT(hint, where, ": ", what, ": ", last_error());
  }
  return result;
}

// Owning wrappers of a freshly returned id, checked: h5::file(H5Fopen(...), path, "opening").
Handle file(hid_t id, const std::string& where = "", const std::string& what = "file");
Handle group(hid_t id, const std::string& where = "", const std::string& what = "group");
Handle dataset(hid_t id, const std::string& where = "", const std::string& what = "dataset");
Handle space(hid_t id, const std::string& where = "", const std::string& what = "dataspace");
Handle type(hid_t id, const std::string& where = "", const std::string& what = "datatype");
Handle attr(hid_t id, const std::string& where = "", const std::string& what = "attribute");
Handle plist(hid_t id, const std::string& where = "", const std::string& what = "property list");

// ---- files ----------------------------------------------------------------------------------

// Opens `path` read-only. Before HDF5 sees it, the file is opened with open(2), so a missing file
// or a permission problem is reported as such ("permission denied") instead of HDF5's "unable to
// open file". `locking` false turns HDF5's file locks off (they fail on some parallel file systems
// and protect nothing for files that never change). Extra properties: chunk-cache etc. go on the
// datasets, not here.
Handle open_file(const std::string& path, bool locking, const std::string& hint = "");

struct CreateOptions {
  std::size_t userblock = 0;  // bytes reserved in front of the HDF5 data (0 or a power of 2 >= 512)
  bool v18_format = false;    // the 1.8 object format: attributes over 64 KiB, readable by h5py
  bool v110_format = false;   // the 1.10 format: checksummed object headers and chunk index
  bool locking = true;
  // Object times in the root group's header; off, the same content makes the same bytes (the
  // caller turns them off for its datasets too, with H5Pset_obj_track_times).
  bool track_times = true;
};
// Creates (truncates) `path`; a failure names the folder problem when there is one.
Handle create_file(const std::string& path, const CreateOptions& options = {},
                   const std::string& hint = "");

// ---- groups and names -----------------------------------------------------------------------

// A group that remembers the order its links were created in (tensors keep the caller's order).
Handle create_group(hid_t parent, const std::string& name, const std::string& where);
Handle open_group(hid_t parent, const std::string& name, const std::string& where,
                  const std::string& hint = "");
bool has_link(hid_t parent, const std::string& name);
// Names of a group's links, in creation order when the group tracks it, else in name order
// (files written by other tools).
std::vector<std::string> link_names(hid_t group, const std::string& where, const std::string& what);

// HDF5 link names cannot contain '/': names are stored percent-escaped ('%' -> %25, '/' -> %2F,
// a name "." -> %2E).
std::string escape_name(const std::string& name);
std::string unescape_name(const std::string& escaped);

// ---- attributes (every reader names the file and the attribute on failure, with `hint`) -------

// False when absent; an Error (with `hint`) when HDF5 cannot tell, e.g. a damaged object header.
bool has_attr(hid_t obj, const std::string& name, const std::string& where,
              const std::string& hint = "");
// Fixed-length, NUL-padded (HDF5 has no empty strings: "" is one NUL byte).
void write_string_attr(hid_t obj, const std::string& name, const std::string& value,
                       const std::string& where);
// Fixed or variable length (as h5py writes them), one string.
std::string read_string_attr(hid_t obj, const std::string& name, const std::string& where,
                             const std::string& hint = "");
// 64-bit little-endian integers: a scalar, or a 1-D array when `scalar` is false.
void write_int_attr(hid_t obj, const std::string& name, std::int64_t value,
                    const std::string& where);
void write_ints_attr(hid_t obj, const std::string& name, const std::vector<std::int64_t>& values,
                     const std::string& where);
void write_floats_attr(hid_t obj, const std::string& name, const std::vector<float>& values,
                       const std::string& where);
// Any integer type; exactly one value (a scalar or a 1-element array).
std::int64_t read_int_attr(hid_t obj, const std::string& name, const std::string& where,
                           const std::string& hint = "");
std::vector<std::int64_t> read_ints_attr(hid_t obj, const std::string& name,
                                         const std::string& where, const std::string& hint = "");
std::vector<float> read_floats_attr(hid_t obj, const std::string& name, const std::string& where,
                                    const std::string& hint = "");

// ---- datasets -------------------------------------------------------------------------------

// A scalar string dataset (for texts too large for comfort in an attribute).
void write_string_dataset(hid_t group, const std::string& name, const std::string& value,
                          const std::string& where);
std::string read_string_dataset(hid_t group, const std::string& name, const std::string& where);

// HDF5 file and memory types of a dtype (bf16 is stored as raw little-endian uint16 bits).
hid_t file_type(DType dtype);
hid_t memory_type(DType dtype);
// The dtype an HDF5 type holds (f32, f64, i32, u8), or an Error naming `what`.
DType dtype_of_type(hid_t type, const std::string& where, const std::string& what);

// Writes a (host copy of) `tensor` as dataset `link` of `group`: its dtype and shape, a scalar
// dataspace for a 0-d tensor.
Handle write_tensor(hid_t group, const std::string& link, const Tensor& tensor,
                    const std::string& where);
// Reads dataset `link` of `group` as a host tensor of `dtype`, whose HDF5 type must match.
Tensor read_tensor(hid_t group, const std::string& link, DType dtype, const std::string& where);

}  // namespace lockstep::h5

// Evaluates an HDF5 call; a negative result throws lockstep::Error with `where` (the file), what
// was being done, HDF5's own reason and `hint`.
#define LOCKSTEP_H5(call, hint, where, ...)                                                   \
  ([&] {                                                                                      \
    auto lockstep_h5_result = (call);                                                         \
    if (lockstep_h5_result < 0) [[unlikely]] {                                                \
      LOCKSTEP_FAIL_HINT(hint, where, ": ", __VA_ARGS__, ": ", ::lockstep::h5::last_error()); \
    }                                                                                         \
    return lockstep_h5_result;                                                                \
  }())
