// LOCKSTEP_HOST_DEVICE marks a scalar formula written once for host and device code
// (__host__ __device__ under nvcc, nothing elsewhere): the shared formulas of
// lockstep/ops/step_verdict.hpp and src/ops/gelu_tanh.hpp.
#pragma once

#ifndef LOCKSTEP_HOST_DEVICE
#ifdef __CUDACC__
#define LOCKSTEP_HOST_DEVICE __host__ __device__
#else
#define LOCKSTEP_HOST_DEVICE
#endif
#endif
