// Parameter initialisation. Every random tensor is drawn from Philox(seed, hash_string(name)) with
// the full parameter name ("3.weight"), so a value depends only on (seed, name, index): not on
// the thread count, the device, or which other layers exist.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "lockstep/core/tensor.hpp"
#include "lockstep/nn/module.hpp"

namespace lockstep::nn {

// Overwrites t (in place, so views of it stay valid) with U(-bound, bound) drawn from
// Philox(seed, hash_string(name)), element i from draw i.
void init_uniform(Tensor& t, float bound, std::uint64_t seed, const std::string& name);
// Overwrites t with N(0, stddev^2) drawn from Philox(seed, hash_string(name)), element i from
// Philox::normal(i) (GPT-2's initialisation).
void init_normal(Tensor& t, float stddev, std::uint64_t seed, const std::string& name);
// Overwrites every element of t with value.
void init_constant(Tensor& t, float value);
// A parameter of `shape` with value and gradient zero (layers fill the value in
// reset_parameters); the name is set when the owner's collect_parameters runs.
Parameter make_parameter(const Shape& shape, Device device);
// PyTorch's default for Linear/Conv weights and biases: kaiming_uniform(a = sqrt(5)) reduces to
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for both.
inline float default_init_bound(std::int64_t fan_in) {
  return fan_in > 0 ? 1.0f / static_cast<float>(std::sqrt(static_cast<double>(fan_in))) : 0.0f;
}

}  // namespace lockstep::nn
