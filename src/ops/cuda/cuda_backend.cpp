// The CUDA backend: cuBLAS for GEMM, cuDNN for convolutions, own kernels for the rest,
// all queued on one non-blocking compute stream per Context. Nothing here synchronises the
// device; ops that return a host value (count_correct, sum_squares, all_finite) and copies to
// the host wait for this stream only. Arguments were validated by ops.cpp.
//
// This file holds the backend's construction, synchronize, fill and copy, and the device result
// words (bad labels and tokens, counts, sums) read back in one copy; the ops are defined per
// family (the list is in cuda_backend.hpp).
//
// Precision (ops/precision.hpp), read from the Context at every GEMM and convolution: fp32 is
// cublasSgemm with cuBLAS's default math (no TF32) and FMA-only cuDNN algorithms, so CUDA
// matches the CPU to float rounding; tf32 is cublasGemmEx with CUBLAS_COMPUTE_32F_FAST_TF32 and
// tensor-core cuDNN algorithms on the same f32 tensors; bf16 converts the operands (CastCache:
// parameters once per reuse window) and runs cuBLASLt (cuda_gemm.cpp, f32 accumulation and f32
// output) or cuDNN's bf16 convolutions, whose bf16 outputs are widened back to f32 (the weight
// gradient is added into dw in f32).
#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "lockstep/ops/backend.hpp"
#include "lockstep/ops/cuda.hpp"
#include "lockstep/ops/device_runtime.hpp"
#include "ops/bad_input.hpp"
#include "ops/cast_cache.hpp"
#include "ops/cuda/check.hpp"
#include "ops/cuda/conv.hpp"
#include "ops/cuda/cuda_attention_cudnn.hpp"
#include "ops/cuda/cuda_backend.hpp"
#include "ops/cuda/gemm_lt.hpp"

namespace lockstep::ops {
namespace cuda {

CudaBackend::CudaBackend(Context& ctx) : ctx_(ctx), device_(ctx.device()) {
  activate_device(device_.index);
  LOCKSTEP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  runtime_ = make_runtime(device_.index, stream_);
  LOCKSTEP_CHECK_CUBLAS(dyn::cublasCreate(&cublas_));
  LOCKSTEP_CHECK_CUBLAS(dyn::cublasSetStream(cublas_, stream_));
  // Default math: cublasSgemm stays true f32 (TF32 only where the policy asks, per call).
  LOCKSTEP_CHECK_CUBLAS(dyn::cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
  results_ = Tensor::empty({static_cast<std::int64_t>(sizeof(DeviceResults))}, DType::U8, device_);
  partials_ = Tensor::empty({kReducePartials}, DType::F64, device_);
  LOCKSTEP_CHECK_CUDA(cudaHostAlloc(&host_results_, sizeof(DeviceResults), cudaHostAllocDefault));
  reset_bad_words();
}

CudaBackend::~CudaBackend() {
  // Destructors must not throw; a failure here has nobody left to report to.
  (void)cudaSetDevice(device_.index);
  (void)cudaStreamSynchronize(stream_);
  casts_ = CastCache();
  lt_.reset();
  conv_.reset();
  fused_attention_.reset();
  dyn::cublasDestroy(cublas_);
  (void)cudaFreeHost(host_results_);
  results_ = Tensor();
  partials_ = Tensor();
  scale_shift_ = Tensor();
  (void)cudaStreamDestroy(stream_);
}

void CudaBackend::synchronize() {
  activate();
  read_results();  // syncs the stream and reports a bad label seen since the last check
}

// ---- memory
void CudaBackend::fill(Tensor& t, float value) {
  activate();
  std::uint32_t bits = t.dtype() == DType::F32
                           ? std::bit_cast<std::uint32_t>(value)
                           : static_cast<std::uint32_t>(static_cast<std::int32_t>(value));
  fill_u32(static_cast<std::uint32_t*>(t.raw_data()), t.numel(), bits, stream_);
}

void CudaBackend::copy(const Tensor& src, Tensor& dst) {
  activate();
  if (src.device().is_cpu() && dst.device().is_cpu()) {
    std::memcpy(dst.raw_data(), src.raw_data(), src.nbytes());
    return;
  }
  // From pageable host memory the call returns once the bytes are staged, so the source may
  // be reused at once; to the host we wait, since the caller reads the data next.
  if (src.device().is_cpu()) note_pageable_copy();
  LOCKSTEP_CHECK_CUDA(
      cudaMemcpyAsync(dst.raw_data(), src.raw_data(), src.nbytes(), cudaMemcpyDefault, stream_));
  if (dst.device().is_cpu()) {
    // The bad-label and bad-token words come back in the same wait (16 bytes into pinned
    // memory, no extra sync): this is how the trainer reads its gradient check, and a bad
    // label must be reported as one, not as the NaN gradient it leads to.
    LOCKSTEP_CHECK_CUDA(cudaMemcpyAsync(&host_results_->bad_label, &results()->bad_label,
                                        kBadWordsBytes, cudaMemcpyDeviceToHost, stream_));
    LOCKSTEP_CHECK_CUDA(cudaStreamSynchronize(stream_));
    note_host_sync();
    raise_bad_input(host_results_->bad_label, host_results_->bad_token);
  }
}

// Sets bad_label and bad_token to ~0: none seen.
void CudaBackend::reset_bad_words() {
  LOCKSTEP_CHECK_CUDA(cudaMemsetAsync(&results()->bad_label, 0xFF, kBadWordsBytes, stream_));
  label_op_ = nullptr;
}

// Raises a recorded bad token or bad label (a token first: the embedding runs before the loss)
// with the CPU backend's words (ops/bad_input.hpp) and the device. The stream has finished.
void CudaBackend::raise_bad_input(unsigned long long bad_label, unsigned long long bad_token) {
  if (bad_token != ~0ull) {
    reset_bad_words();
    const auto pos = static_cast<std::int64_t>(bad_token >> 32);
    const auto token = static_cast<std::int32_t>(static_cast<std::uint32_t>(bad_token));
    LOCKSTEP_FAIL_HINT(
        kBadTokenHint,
        bad_token_message(str("embedding_forward on ", device_.str()), token, pos,
                          std::max<std::int64_t>(token_positions_, 1), token_vocab_));
  }
  if (bad_label != ~0ull) {
    const char* op = label_op_ ? label_op_ : "softmax_xent_forward";
    reset_bad_words();
    const auto row = static_cast<std::int64_t>(bad_label >> 32);
    const auto label = static_cast<std::int32_t>(static_cast<std::uint32_t>(bad_label));
    LOCKSTEP_FAIL_HINT(kBadLabelHint, bad_label_message(str(op, " on ", device_.str()), label, row,
                                                        label_classes_));
  }
}

// Copies the result words to pinned host memory in one copy, waits for this stream only (one
// host sync), and raises a recorded bad token or bad label.
DeviceResults CudaBackend::read_results() {
  LOCKSTEP_CHECK_CUDA(cudaMemcpyAsync(host_results_, results(), sizeof(DeviceResults),
                                      cudaMemcpyDeviceToHost, stream_));
  LOCKSTEP_CHECK_CUDA(cudaStreamSynchronize(stream_));
  note_host_sync();
  DeviceResults r = *host_results_;
  raise_bad_input(r.bad_label, r.bad_token);
  return r;
}

cudaStream_t compute_stream(Context& ctx) {
  auto* backend = dynamic_cast<CudaBackend*>(&ctx.backend());
  LOCKSTEP_CHECK(backend != nullptr, "a CUDA stream was asked of a context on ", ctx.device().str(),
                 ", which has no CUDA backend");
  return backend->stream();
}

}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(Context& ctx) {
  Device device = ctx.device();
  int count = cuda::visible_device_count();
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  LOCKSTEP_CHECK_HINT(count > 0, "run on a node with a GPU, or set device = cpu", "device ",
                      device.str(),
                      " requested but no GPU is visible to this process (CUDA_VISIBLE_DEVICES=",
                      visible ? visible : "unset", ")");
  LOCKSTEP_CHECK_HINT(device.index < count, "use cuda:0 .. cuda:" + std::to_string(count - 1),
                      "device ", device.str(), " requested but only ", count,
                      " GPU(s) are visible (CUDA_VISIBLE_DEVICES=", visible ? visible : "unset",
                      ")");
  cuda::register_memory_hooks();
  return std::make_unique<cuda::CudaBackend>(ctx);
}

}  // namespace lockstep::ops
