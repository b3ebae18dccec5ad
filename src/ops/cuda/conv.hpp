// cuDNN convolutions with the algorithm chosen once per shape. The first call for a shape and
// direction runs cudnnFind (it times every algorithm, host-blocking and allocating, once); the
// fastest deterministic algorithm within kConvWorkspaceLimit is cached with its descriptors, so
// the steady state is one cudnnConvolution* call per op and bitwise-repeatable results.
#pragma once

#include <cudnn.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>

#include "lockstep/core/tensor.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::ops::cuda {

// Largest scratch a convolution algorithm may use. cuDNN's fastest algorithms (FFT, Winograd)
// want large workspaces; 256 MiB fits next to a ResNet-50 batch on a 16 GB card and leaves the
// H200 untouched, while still admitting all but the most memory-hungry choices.
inline constexpr std::size_t kConvWorkspaceLimit = std::size_t{256} << 20;

class ConvPlans {
 public:
  // tf32: let cuDNN use TF32 tensor cores for f32 data (faster, ~1e-3 relative error);
  // otherwise plain FMA math, matching the CPU to float rounding.
  ConvPlans(cudnnHandle_t handle, Device device, bool tf32);
  ~ConvPlans();
  ConvPlans(const ConvPlans&) = delete;
  ConvPlans& operator=(const ConvPlans&) = delete;

  void forward(const Tensor& x, const Tensor& w, Tensor& y, const Conv2dParams& p);
  void backward_data(const Tensor& dy, const Tensor& w, Tensor& dx, const Conv2dParams& p);
  // dw += dL/dw (beta = 1).
  void backward_filter(const Tensor& x, const Tensor& dy, Tensor& dw, const Conv2dParams& p);

 private:
  struct Plan;
  using Key = std::array<std::int64_t, 12>;
  Plan& plan_for(const Shape& x, const Shape& w, const Shape& y, const Conv2dParams& p);
  Tensor workspace(std::size_t bytes);

  cudnnHandle_t handle_;
  Device device_;
  bool tf32_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace lockstep::ops::cuda
