// Precision: the arithmetic a Context's GEMMs and convolutions use (config key train.precision).
// It is a policy of the Context, not a tensor type: layers pass f32 tensors and get f32 results,
// and only the backend's GEMM and convolution kernels change, with one exception: under bf16 a
// GPT block's layers pass bf16 activations between them (ops.hpp, "Activations in bf16"). Master
// weights, gradients, optimizer state, bias, the residual stream, normalisation statistics,
// softmax and the loss stay f32 under every policy.
//   fp32  IEEE single precision (the default; the CPU and CUDA backends agree to float rounding).
//   tf32  CUDA: f32 GEMMs/convolutions on TF32 tensor cores (inputs rounded to a 10-bit mantissa,
//         f32 accumulation). CPU: exactly fp32, since no CPU has TF32 units.
//   bf16  GEMM and convolution inputs rounded to bfloat16 (round to nearest even), products
//         accumulated in f32, outputs and parameter gradients written in f32 (dw += ...), except
//         a GPT block's activations, written in bf16 from the f32 result.
//         CPU: oneDNN's bf16 kernels (AMX or AVX512-BF16; refused with an error naming the CPU's
//         ISA where neither exists). CUDA: cuBLASLt and cuDNN on bf16 tensor cores.
#pragma once

#include <string>

namespace lockstep::ops {

enum class Precision { FP32, TF32, BF16 };

const char* precision_name(Precision p);  // "fp32", "tf32", "bf16"
// Parses "fp32" | "tf32" | "bf16"; throws lockstep::Error listing the choices.
Precision precision_from_name(const std::string& name);

// bf16 has an 8-bit significand (7 stored bits + the implicit one): rounding to nearest even
// changes a value by at most this fraction of its magnitude. Tests derive tolerances from it.
inline constexpr double kBf16UnitRoundoff = 1.0 / 256.0;  // 2^-8
// TF32 keeps 10 stored mantissa bits; tensor cores may truncate, hence 2^-10 rather than 2^-11.
inline constexpr double kTf32UnitRoundoff = 1.0 / 1024.0;

}  // namespace lockstep::ops
