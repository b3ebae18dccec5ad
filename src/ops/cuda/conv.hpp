// cuDNN convolutions with the algorithm chosen once per shape. The first call for a shape and
// direction runs cudnnFind (it times every algorithm, host-blocking and allocating, once); the
// fastest deterministic algorithm within kConvWorkspaceLimit is cached with its descriptors, so
// the steady state is one cudnnConvolution* call per op and bitwise-repeatable results. Where
// cuDNN offers no deterministic algorithm (it happens for some bf16 shapes), the fastest
// non-deterministic one runs instead, with a warning once per process: a run that is not
// bitwise-repeatable beats one that cannot start. The cuDNN handle is created by the first
// convolution, so a context that never convolves (a GPT's) never loads cuDNN.
// The image layout (Conv2dParams::layout) is part of the plan: NHWC plans take x, y and the filter
// channels-last (the filter as [O, KH, KW, I], which the backend transposes to and from).
// Precision (ops/precision.hpp) is part of the plan: fp32 plans allow FMA math only; tf32 plans
// allow tensor-core math on f32 tensors; bf16 plans take bf16 x, w and y (cuDNN's
// PSEUDO_BFLOAT16 configuration: f32 accumulation, bf16 storage), so the backend converts around
// them. Each op's tensors have the dtype of its precision's data (f32, or bf16 for bf16).
#pragma once

#include <cuda_runtime.h>
#include <cudnn.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "lockstep/core/tensor.hpp"
#include "lockstep/ops/ops.hpp"
#include "lockstep/ops/precision.hpp"

namespace lockstep::ops::cuda {

// Largest scratch a convolution algorithm may use. cuDNN's fastest algorithms (FFT, Winograd)
// want large workspaces; 256 MiB fits next to a ResNet-50 batch on a 16 GB card and leaves the
// H200 untouched, while still admitting all but the most memory-hungry choices.
inline constexpr std::size_t kConvWorkspaceLimit = std::size_t{256} << 20;

// cudnnFind lists its results fastest first: the first that ran and fits kConvWorkspaceLimit,
// deterministic if any is (this excludes the atomics-based backward-filter algorithms), else the
// fastest non-deterministic one; nullptr when none ran within the limit. A template over the three
// directions' result types (cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t).
template <class Perf>
const Perf* pick_conv_algorithm(const Perf* perfs, int count) {
  const Perf* fallback = nullptr;
  for (int i = 0; i < count; ++i) {
    const Perf& p = perfs[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.memory > kConvWorkspaceLimit) continue;
    if (p.determinism == CUDNN_DETERMINISTIC) return &p;
    if (!fallback) fallback = &p;
  }
  return fallback;
}

class ConvPlans {
 public:
  // Creates the cuDNN handle (loading cuDNN on first use) and binds it to `stream`.
  ConvPlans(Device device, cudaStream_t stream);
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
  struct Algo;
  struct Plan;
  using Key = std::array<std::int64_t, 14>;
  Plan& plan_for(const Shape& x, const Shape& w, const Shape& y, const Conv2dParams& p,
                 Precision precision);
  Tensor workspace(std::size_t bytes);

  template <class Perf, int kCount, class Find>
  Algo find(const char* direction, const std::string& operands, Find&& call);

  cudnnHandle_t handle_ = nullptr;
  Device device_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace lockstep::ops::cuda
