// A short training-like sequence on one GPU against the same sequence on the CPU, plus the
// memory promises a training loop relies on: no cudaMalloc in the steady state, and pinned
// buffers that feed the compute stream.
#include <cstring>

#include "ops_mlp.hpp"
#include "support/cuda_test_support.hpp"
#ifdef LOCKSTEP_HAVE_CUDA
#include <cuda_runtime.h>

#include "lockstep/ops/cuda.hpp"
#endif

namespace lockstep::testing {
namespace {

using Training = CudaVsCpu;

TEST_F(Training, ShortMlpTrainingOnOneGpuMatchesCpu) {
  const std::int64_t batch = 32, in = 64, hidden = 48, classes = 10;
  const int steps = 24;
  OpsMlp on_cpu(cpu(), in, hidden, classes), on_gpu(gpu(), in, hidden, classes);
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    // The same 4 batches over and over: the loss must fall, on both devices alike.
    Tensor x = random_tensor({batch, in}, 1000 + s % 4);
    Tensor labels = random_labels(batch, static_cast<int>(classes), 2000 + s % 4);
    float lc = on_cpu.step(x, labels, s), lg = on_gpu.step(x, labels, s);
    // Float rounding differences (~1e-7) compound through the updates; 1e-3 relative is still
    // far below the loss change of a single step (~5e-2 here).
    EXPECT_NEAR(lg, lc, 1e-3f * std::fabs(lc)) << "step " << s;
    losses.push_back(lc);
  }
  // Measured on the CPU: the mean over the last 4 steps is ~0.43 of the first 4.
  float first = (losses[0] + losses[1] + losses[2] + losses[3]) / 4;
  float last = (losses[steps - 4] + losses[steps - 3] + losses[steps - 2] + losses[steps - 1]) / 4;
  EXPECT_LT(last, 0.75f * first) << "the sequence should learn, or it tests little";
  EXPECT_CLOSE(on_gpu.w1, on_cpu.w1, 1e-3);
  EXPECT_CLOSE(on_gpu.w2, on_cpu.w2, 1e-3);
  EXPECT_CLOSE(on_gpu.b2, on_cpu.b2, 1e-3);
}

#ifdef LOCKSTEP_HAVE_CUDA
TEST_F(Training, SteadyStateStepNeverCallsCudaMalloc) {
  OpsMlp mlp(gpu(), 64, 48, 10);
  Tensor x = random_tensor({32, 64}, 5);
  Tensor labels = random_labels(32, 10, 6);
  mlp.step(x, labels, 0);  // warm-up: the cache fills, cuBLAS sets up its workspace
  mlp.step(x, labels, 1);
  std::size_t before = ops::cuda::allocator_stats(0).cuda_malloc_calls;
  for (int s = 2; s < 6; ++s)
    mlp.step(x, labels, s);
  EXPECT_EQ(ops::cuda::allocator_stats(0).cuda_malloc_calls, before);
  EXPECT_GT(ops::cuda::allocator_stats(0).bytes_cached, 0u);
}

TEST_F(Training, PinnedBufferFeedsTheComputeStream) {
  ops::cuda::PinnedBuffer buffer(1000 * sizeof(float));
  Tensor dst = Tensor::empty({1000}, DType::F32, Device::cuda(0));
  for (int round = 0; round < 3; ++round) {
    buffer.wait();  // the previous copy has read the buffer: safe to refill
    for (int i = 0; i < 1000; ++i)
      buffer.as<float>()[i] = static_cast<float>(round * 1000 + i);
    ops::cuda::copy_to_device_async(gpu(), buffer, dst);
    Tensor twice = Tensor::empty({1000}, DType::F32, Device::cuda(0));
    ops::add(gpu(), dst, dst, twice);  // queued after the copy on the same stream
    auto got = twice.to_vector<float>();
    for (int i = 0; i < 1000; ++i)
      ASSERT_EQ(got[i], 2.0f * static_cast<float>(round * 1000 + i)) << "round " << round;
  }
  {  // moving hands the pages over
    ops::cuda::PinnedBuffer moved = std::move(buffer);
    EXPECT_EQ(buffer.data(), nullptr);
    EXPECT_EQ(moved.bytes(), 1000 * sizeof(float));
  }
}

TEST_F(Training, TensorLivesOnItsDeviceWhateverTheThreadsCurrentGpu) {
  if (cuda_device_count() < 2)
    GTEST_SKIP() << "needs two GPUs; this machine has " << cuda_device_count();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  Tensor t = Tensor::empty({1024}, DType::F32, Device::cuda(1));
  cudaPointerAttributes attributes{};
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, t.raw_data()), cudaSuccess);
  EXPECT_EQ(attributes.device, 1);
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 0) << "allocating must not change the thread's current device";
}
#endif

}  // namespace
}  // namespace lockstep::testing
