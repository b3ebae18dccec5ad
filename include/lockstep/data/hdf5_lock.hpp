// Debian's libhdf5 (serial 1.10) is built without thread safety: two threads inside HDF5 at once
// corrupt its global state. Every HDF5 call in the process (the loader thread reading shards on
// demand, evaluation reading the test set, rank 0 writing a checkpoint) therefore holds this one
// recursive lock; data/ and train/checkpoint take it in their error-silencing scopes.
#pragma once

#include <mutex>

namespace lockstep::data {

std::recursive_mutex& hdf5_mutex();

}  // namespace lockstep::data
