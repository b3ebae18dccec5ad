// Private HDF5 helpers for the data layer: RAII handles, and turning HDF5's error stack into a
// lockstep::Error that names the file instead of letting the library print to stderr.
#pragma once

#include <hdf5.h>

#include "lockstep/data/hdf5_lock.hpp"

#include <string>
#include <utility>

#include "lockstep/core/error.hpp"

namespace lockstep::data::h5 {

// Lock + silence for every HDF5 call sequence (see lockstep/data/hdf5_lock.hpp).
using Quiet = ::lockstep::data::Hdf5Scope;

// The outermost and innermost descriptions on this thread's HDF5 error stack ("unable to open
// file: file signature not found"), then clears it.
std::string last_error();

// Owns one hid_t and closes it with the matching H5*close.
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

 private:
  hid_t id_ = -1;
  Closer closer_ = nullptr;
};

inline Handle file(hid_t id) {
  return {id, H5Fclose};
}
inline Handle dataset(hid_t id) {
  return {id, H5Dclose};
}
inline Handle space(hid_t id) {
  return {id, H5Sclose};
}
inline Handle type(hid_t id) {
  return {id, H5Tclose};
}
inline Handle attr(hid_t id) {
  return {id, H5Aclose};
}
inline Handle plist(hid_t id) {
  return {id, H5Pclose};
}

}  // namespace lockstep::data::h5

// Evaluates an HDF5 call; a negative result throws lockstep::Error with `where` (the file), what
// was being done, HDF5's own reason and `hint`.
#define LOCKSTEP_H5(call, hint, where, ...)                    \
  ([&] {                                                       \
    auto lockstep_h5_result = (call);                          \
    if (lockstep_h5_result < 0) [[unlikely]] {                 \
      LOCKSTEP_FAIL_HINT(hint, where, ": ", __VA_ARGS__, ": ", \
                         ::lockstep::data::h5::last_error());  \
    }                                                          \
    return lockstep_h5_result;                                 \
  }())
