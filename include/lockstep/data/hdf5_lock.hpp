// Debian's libhdf5 (serial 1.10) is built without thread safety: two threads inside HDF5 at once
// corrupt its global state. Every HDF5 call in the process (the loader thread reading shards on
// demand, evaluation reading the test set, rank 0 writing a checkpoint) therefore runs inside an
// Hdf5Scope, which holds one process-wide recursive lock and silences HDF5's automatic error
// printing, so failures surface only as lockstep::Errors. HDF5 handles must be closed inside a
// scope too (declare them after it).
#pragma once

#include <hdf5.h>

#include <mutex>

namespace lockstep::data {

std::recursive_mutex& hdf5_mutex();

class Hdf5Scope {
 public:
  Hdf5Scope() : lock_(hdf5_mutex()) {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~Hdf5Scope() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
  Hdf5Scope(const Hdf5Scope&) = delete;
  Hdf5Scope& operator=(const Hdf5Scope&) = delete;

 private:
  std::unique_lock<std::recursive_mutex> lock_;
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

}  // namespace lockstep::data
