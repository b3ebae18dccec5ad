// The example's network, composed in C++ from lockstep's layers and the example's own
// GatedLinearUnit: a conv feature extractor of `width` channels, then a GLU of `hidden` units and
// the classifier. It flattens rather than pools globally: where the bright quadrant is, is the
// whole signal. Shared by main.cpp and lockstep's tests of this example.
#pragma once

#include "gated_linear_unit.hpp"
#include "lockstep/nn/layers.hpp"

namespace custom_model {

// Samples are [1, side, side] images (side even).
inline lockstep::nn::Sequential custom_network(std::int64_t side, std::int64_t width,
                                               std::int64_t hidden, std::int64_t classes) {
  using namespace lockstep::nn;
  Sequential net;
  net.emplace<Conv2d>(1, width, /*kernel=*/3, /*stride=*/1, /*padding=*/1);
  net.emplace<ReLU>();
  net.emplace<MaxPool2d>(2);
  net.emplace<Flatten>();
  net.emplace<GatedLinearUnit>(width * (side / 2) * (side / 2), hidden);
  net.emplace<Linear>(hidden, classes);
  return net;
}

}  // namespace custom_model
