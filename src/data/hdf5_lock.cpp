#include "lockstep/data/hdf5_lock.hpp"

namespace lockstep::data {

std::recursive_mutex& hdf5_mutex() {
  static std::recursive_mutex mutex;
  return mutex;
}

}  // namespace lockstep::data
