// "[N, 16, 8, 8]": a shape whose first dimension is the batch, as errors and structure() show it.
#pragma once

#include <string>

#include "lockstep/core/error.hpp"
#include "lockstep/core/tensor.hpp"

namespace lockstep::nn {

inline std::string batch_shape_str(const Shape& shape) {
  std::string s = "[N";
  for (std::size_t i = 1; i < shape.size(); ++i)
    s += str(", ", shape[i]);
  return s + "]";
}

}  // namespace lockstep::nn
