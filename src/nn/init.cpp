#include "lockstep/nn/init.hpp"

#include <algorithm>
#include <thread>
#include <vector>

#include "lockstep/core/rng.hpp"

namespace lockstep::nn {

void init_uniform(Tensor& t, float bound, std::uint64_t seed, const std::string& name) {
  std::vector<float> values(static_cast<std::size_t>(t.numel()));
  Philox(seed, hash_string(name))
      .fill_uniform(values.data(), static_cast<std::int64_t>(values.size()), -bound, bound);
  t.copy_from(values);
}

void init_normal(Tensor& t, float stddev, std::uint64_t seed, const std::string& name) {
  std::vector<float> values(static_cast<std::size_t>(t.numel()));
  const Philox rng(seed, hash_string(name));
  auto fill = [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i)
      values[i] = stddev * rng.normal(i);
  };
  // A GPT-2 token table is 38.6M draws (seconds on one core): large tensors are filled by
  // several threads. Element i is draw i whoever computes it, so the values do not change.
  constexpr std::size_t kParallelDraws = std::size_t{1} << 20;
  const std::size_t n = values.size();
  const std::size_t threads =
      n < kParallelDraws ? 1 : std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, 16);
  std::vector<std::thread> workers;
  for (std::size_t k = 1; k < threads; ++k)
    workers.emplace_back(fill, n * k / threads, n * (k + 1) / threads);
  fill(0, n / threads);
  for (std::thread& w : workers)
    w.join();
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
