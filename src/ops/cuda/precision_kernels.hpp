// Launchers of the bf16 conversion kernels (precision_kernels.cu) behind the bf16 policy and
// ops::cast. bf16 values travel as their 16-bit patterns (std::uint16_t), so callers need no
// cuda_bf16.h. The rounding is the CPU backend's, bit for bit: round to nearest even, NaN stays
// NaN, f32 subnormals flush to signed zero. None synchronises.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace lockstep::ops::cuda {

void f32_to_bf16(const float* src, std::uint16_t* dst, std::int64_t n, cudaStream_t s);
void bf16_to_f32(const std::uint16_t* src, float* dst, std::int64_t n, cudaStream_t s);
// dst[i] += float(src[i]): a bf16 parameter gradient accumulated into the f32 one.
void add_bf16_to_f32(const std::uint16_t* src, float* dst, std::int64_t n, cudaStream_t s);

}  // namespace lockstep::ops::cuda
