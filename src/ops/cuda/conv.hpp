// cuDNN convolutions with the algorithm chosen once per shape. The first call for a shape and
// direction runs cudnnFind (it times every algorithm, host-blocking and allocating, once); the
// fastest deterministic algorithm within kConvWorkspaceLimit is cached with its descriptors, so
// the steady state is one cudnnConvolution* call per op and bitwise-repeatable results.
// Precision (ops/precision.hpp) is part of the plan: fp32 plans allow FMA math only; tf32 plans
// allow tensor-core math on f32 tensors; bf16 plans take bf16 x, w and y (cuDNN's
// PSEUDO_BFLOAT16 configuration: f32 accumulation, bf16 storage), so the backend converts around
// them. Each op's tensors have the dtype of its precision's data (f32, or bf16 for bf16).
#pragma once

#include <cudnn.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>

#include "lockstep/core/tensor.hpp"
#include "lockstep/ops/ops.hpp"
#include "lockstep/ops/precision.hpp"

namespace lockstep::ops::cuda {

// Largest scratch a convolution algorithm may use. cuDNN's fastest algorithms (FFT, Winograd)
// want large workspaces; 256 MiB fits next to a ResNet-50 batch on a 16 GB card and leaves the
// H200 untouched, while still admitting all but the most memory-hungry choices.
inline constexpr std::size_t kConvWorkspaceLimit = std::size_t{256} << 20;

class ConvPlans {
 public:
  ConvPlans(cudnnHandle_t handle, Device device);
  ~ConvPlans();
  ConvPlans(const ConvPlans&) = delete;
  ConvPlans& operator=(const ConvPlans&) = delete;

  void forward(const Tensor& x, const Tensor& w, Tensor& y, const Conv2dParams& p,
               Precision precision);
  void backward_data(const Tensor& dy, const Tensor& w, Tensor& dx, const Conv2dParams& p,
                     Precision precision);
  // dw += dL/dw when accumulate (beta = 1), else dw = dL/dw.
  void backward_filter(const Tensor& x, const Tensor& dy, Tensor& dw, const Conv2dParams& p,
                       Precision precision, bool accumulate);

 private:
  struct Plan;
  using Key = std::array<std::int64_t, 13>;
  Plan& plan_for(const Shape& x, const Shape& w, const Shape& y, const Conv2dParams& p,
                 Precision precision);
  Tensor workspace(std::size_t bytes);

  cudnnHandle_t handle_;
  Device device_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace lockstep::ops::cuda
