// A seeded random host tensor, shared by the CPU ops tests (ops/ops_test_util.hpp) and the
// device tests (support/cuda_test_support.hpp).
#pragma once

#include <cstdint>

#include "lockstep/core/rng.hpp"
#include "lockstep/core/tensor.hpp"

namespace lockstep::testing {

// Host tensor, uniform in [lo, hi) from Philox(seed, stream): reproducible, independent of order.
inline Tensor random_tensor(const Shape& shape, std::uint64_t stream, float lo = -1.0f,
                            float hi = 1.0f, std::uint64_t seed = 2024) {
  Tensor t = Tensor::empty(shape);
  Philox(seed, stream).fill_uniform(t.data<float>(), t.numel(), lo, hi);
  return t;
}

}  // namespace lockstep::testing
