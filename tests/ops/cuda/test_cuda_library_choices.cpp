// How the CUDA backend copes with what its libraries offer: the convolution algorithm choice
// (deterministic first, else the fastest non-deterministic one, else a clear error) runs on the
// host with made-up cudnnFind results, so it is checked on every machine; that cuDNN is loaded
// only by the first convolution needs a GPU. (cuBLASLt's fallback to cublasGemmEx when its
// heuristic has nothing cannot be provoked on demand: no shape is known to lack an algorithm.)
#include "support/cuda_test_support.hpp"

#ifdef LOCKSTEP_HAVE_CUDA
#include <vector>

#include "lockstep/ops/dynload.hpp"
#include "ops/cuda/conv.hpp"

namespace lockstep::testing {
namespace {

using Perf = cudnnConvolutionFwdAlgoPerf_t;

// A cudnnFind result: algorithm `algo`, in list (speed) order.
Perf perf(int algo, bool deterministic, std::size_t memory = 0,
          cudnnStatus_t status = CUDNN_STATUS_SUCCESS) {
  Perf p{};
  p.algo = static_cast<cudnnConvolutionFwdAlgo_t>(algo);
  p.status = status;
  p.memory = memory;
  p.determinism = deterministic ? CUDNN_DETERMINISTIC : CUDNN_NON_DETERMINISTIC;
  return p;
}

int chosen(const std::vector<Perf>& perfs) {
  const Perf* p = ops::cuda::pick_conv_algorithm(perfs.data(), static_cast<int>(perfs.size()));
  return p ? static_cast<int>(p->algo) : -1;
}

constexpr std::size_t kTooBig = ops::cuda::kConvWorkspaceLimit + 1;

TEST(ConvAlgorithmChoice, TheFastestDeterministicAlgorithmThatRunsWithinTheWorkspaceLimitWins) {
  EXPECT_EQ(chosen({perf(1, false), perf(2, true, kTooBig),
                    perf(3, true, 0, CUDNN_STATUS_NOT_SUPPORTED), perf(4, true), perf(5, true)}),
            4);
}

// Before: no deterministic algorithm was an error, so such a shape (some bf16 ones) could not
// train at all.
TEST(ConvAlgorithmChoice, WithoutADeterministicOneTheFastestNonDeterministicOneRuns) {
  EXPECT_EQ(
      chosen({perf(1, false, kTooBig), perf(2, true, kTooBig), perf(3, false), perf(4, false)}), 3);
}

TEST(ConvAlgorithmChoice, NothingThatRunsWithinTheLimitIsNoChoice) {
  EXPECT_EQ(chosen({perf(1, false, kTooBig), perf(2, true, 0, CUDNN_STATUS_NOT_SUPPORTED)}), -1);
  EXPECT_EQ(chosen({}), -1);
}

// A GPT's context never convolves: it must not pay for cuDNN (loading it, creating a handle).
TEST(CudnnHandle, IsCreatedByTheFirstConvolutionNotByTheContext) {
  LOCKSTEP_SKIP_WITHOUT_GPU();
  if (dyn::is_open(dyn::Library::Cudnn))
    GTEST_SKIP() << "an earlier test in this process opened cuDNN; ctest runs each test alone";
  ops::Context gpu(Device::cuda(0));
  Tensor a = Tensor::empty({8, 8}, DType::F32, gpu.device());
  Tensor c = Tensor::empty({8, 8}, DType::F32, gpu.device());
  ops::fill(gpu, a, 1.0f);
  ops::gemm(gpu, false, false, 1.0f, a, a, 0.0f, c);
  gpu.synchronize();
  EXPECT_FALSE(dyn::is_open(dyn::Library::Cudnn)) << "a context without convolutions opened cuDNN";
  Tensor x = Tensor::empty({1, 1, 4, 4}, DType::F32, gpu.device());
  Tensor w = Tensor::empty({1, 1, 3, 3}, DType::F32, gpu.device());
  Tensor b = Tensor::empty({1}, DType::F32, gpu.device());
  Tensor y = Tensor::empty({1, 1, 2, 2}, DType::F32, gpu.device());
  ops::fill(gpu, x, 1.0f);
  ops::fill(gpu, w, 1.0f);
  ops::fill(gpu, b, 0.0f);
  ops::conv2d_forward(gpu, x, w, b, y, ops::Conv2dParams{});
  EXPECT_EQ(y.to_vector<float>(), std::vector<float>(4, 9.0f));
  EXPECT_TRUE(dyn::is_open(dyn::Library::Cudnn));
}

}  // namespace
}  // namespace lockstep::testing

#else

TEST(ConvAlgorithmChoice, NeedsTheCudaBuild) {
  GTEST_SKIP() << lockstep::testing::no_gpu_reason();
}

#endif
