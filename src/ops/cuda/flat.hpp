// The CUDA backend's fused flat-buffer ops (flat.cpp): the plan (a chunk table, per-slot chunk
// ranges and a partial-sum buffer, all on the device, made once) and the calls that unpack
// Tensors for flat_kernels.cu. CudaBackend forwards its flat_* methods here.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "lockstep/ops/ops.hpp"
#include "ops/cuda/kernels.hpp"

namespace lockstep::ops::cuda {

// AdamW's per-step constants, the bias corrections computed on the host in double as the CPU does.
AdamWArgs adamw_args(const AdamWParams& p);

std::shared_ptr<const FlatPlan> make_flat_plan(Device device, std::vector<FlatSegment> segments,
                                               std::int64_t numel, cudaStream_t s);
void flat_sgd_update(const FlatPlan& plan, FlatRange range, Tensor& param, const Tensor& grad,
                     Tensor& momentum_buf, std::int64_t state_origin, const SgdParams& p,
                     cudaStream_t s);
void flat_adamw_update(const FlatPlan& plan, FlatRange range, Tensor& param, const Tensor& grad,
                       Tensor& m, Tensor& v, std::int64_t state_origin, const AdamWParams& p,
                       cudaStream_t s);
void flat_sum_squares(const FlatPlan& plan, FlatRange range, const Tensor& x, Tensor& sums,
                      bool squares, cudaStream_t s);

}  // namespace lockstep::ops::cuda
