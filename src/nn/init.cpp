#include "lockstep/nn/init.hpp"

#include <vector>

#include "lockstep/core/rng.hpp"

namespace lockstep::nn {

void init_uniform(Tensor& t, float bound, std::uint64_t seed, const std::string& name) {
  std::vector<float> values(static_cast<std::size_t>(t.numel()));
  Philox(seed, hash_string(name))
      .fill_uniform(values.data(), static_cast<std::int64_t>(values.size()), -bound, bound);
  t.copy_from(values);
}

void init_constant(Tensor& t, float value) {
  t.copy_from(std::vector<float>(static_cast<std::size_t>(t.numel()), value));
}

Parameter make_parameter(const Shape& shape, Device device) {
  Parameter p{"", Tensor::empty(shape, DType::F32, device),
              Tensor::empty(shape, DType::F32, device)};
  init_constant(p.value, 0.0f);
  init_constant(p.grad, 0.0f);
  return p;
}

}  // namespace lockstep::nn
