// bf16 conversions for the bf16 policy and ops::cast, and CudaBackend's precision methods (the
// check that the GPU has tensor cores, the description printed at start-up, cast). Which library
// runs each precision's GEMMs and convolutions is cuda_gemm.cpp's and cuda_conv.cpp's.
//
// Trade-offs: grid-stride loops over 16-bit patterns, memory-bound and tiny next to the GEMMs
// they feed. The rounding (common.cuh's to_bf16) is written out with integer operations so that
// it matches the CPU backend bit for bit, subnormal flush included. bf16 values travel as their
// 16-bit patterns (std::uint16_t), so callers need no cuda_bf16.h.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "lockstep/ops/cuda.hpp"
#include "lockstep/ops/precision.hpp"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_backend.hpp"

namespace lockstep::ops::cuda {
namespace {

__global__ void f32_to_bf16_kernel(const float* src, std::uint16_t* dst, std::int64_t n) {
  LOCKSTEP_GRID_STRIDE(i, n) dst[i] = to_bf16(src[i]);
}
__global__ void bf16_to_f32_kernel(const std::uint16_t* src, float* dst, std::int64_t n) {
  LOCKSTEP_GRID_STRIDE(i, n) dst[i] = from_bf16(src[i]);
}
__global__ void add_bf16_to_f32_kernel(const std::uint16_t* src, float* dst, std::int64_t n) {
  LOCKSTEP_GRID_STRIDE(i, n) dst[i] += from_bf16(src[i]);
}

}  // namespace

void f32_to_bf16(const float* src, std::uint16_t* dst, std::int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  f32_to_bf16_kernel<<<blocks_for(n), kThreads, 0, s>>>(src, dst, n);
  LOCKSTEP_CHECK_LAUNCH();
}
void bf16_to_f32(const std::uint16_t* src, float* dst, std::int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  bf16_to_f32_kernel<<<blocks_for(n), kThreads, 0, s>>>(src, dst, n);
  LOCKSTEP_CHECK_LAUNCH();
}
void add_bf16_to_f32(const std::uint16_t* src, float* dst, std::int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  add_bf16_to_f32_kernel<<<blocks_for(n), kThreads, 0, s>>>(src, dst, n);
  LOCKSTEP_CHECK_LAUNCH();
}

// ---- precision
void CudaBackend::check_precision(Precision p) {
  if (p == Precision::FP32) return;
  int major = 0;
  LOCKSTEP_CHECK_CUDA(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_.index));
  LOCKSTEP_CHECK_HINT(major >= 8, "set train.precision = fp32 on this GPU",
                      "train.precision = ", precision_name(p),
                      " needs tensor cores of compute capability 8.0 or "
                      "later (Ampere), but ",
                      device_description(device_.index), " has ", major, ".x");
}
std::string CudaBackend::precision_info(Precision p) {
  const std::string gpu = " on " + device_description(device_.index);
  switch (p) {
    case Precision::FP32:
      return "fp32: cublasSgemm and FMA-only cuDNN convolutions" + gpu;
    case Precision::TF32:
      return "tf32: cublasGemmEx with CUBLAS_COMPUTE_32F_FAST_TF32 and tensor-core cuDNN "
             "convolutions" +
             gpu;
    case Precision::BF16:
      return "bf16: cuBLASLt with CUBLAS_COMPUTE_32F (f32 output) and cuDNN bf16 convolutions" +
             gpu;
  }
  return "?";
}
void CudaBackend::cast(const Tensor& src, Tensor& dst) {
  activate();
  if (src.dtype() == DType::F32)
    f32_to_bf16(src.data<float>(), bf16_data(dst), src.numel(), stream_);
  else
    bf16_to_f32(bf16_data(src), dst.data<float>(), src.numel(), stream_);
}

}  // namespace lockstep::ops::cuda
