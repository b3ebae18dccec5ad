// A short training-like sequence on one GPU against the same sequence on the CPU, plus the
// memory promises a training loop relies on: no cudaMalloc in the steady state, and pinned
// buffers that feed the compute stream.
#include <cstring>

#include "support/cuda_test_support.hpp"
#ifdef LOCKSTEP_HAVE_CUDA
#include <cuda_runtime.h>

#include "lockstep/ops/cuda.hpp"
#endif

namespace lockstep::testing {
namespace {

// A two-layer MLP written directly over ops (the nn layer is not needed to test the backend):
// x[b, in] -> linear -> relu -> dropout -> linear -> softmax cross-entropy, SGD with momentum.
struct OpsMlp {
  ops::Context& ctx;
  Device device;
  Tensor w1, b1, w2, b2, gw1, gb1, gw2, gb2, bw1, bb1, bw2, bb2;

  OpsMlp(ops::Context& c, std::int64_t in, std::int64_t hidden, std::int64_t out)
      : ctx(c), device(c.device()) {
    float s1 = 1.0f / std::sqrt(static_cast<float>(in)),
          s2 = 1.0f / std::sqrt(static_cast<float>(hidden));
    w1 = random_tensor({hidden, in}, 1, -s1, s1).to(device);
    b1 = random_tensor({hidden}, 2, -s1, s1).to(device);
    w2 = random_tensor({out, hidden}, 3, -s2, s2).to(device);
    b2 = random_tensor({out}, 4, -s2, s2).to(device);
    for (auto [g, p] : {std::pair{&gw1, &w1},
                        {&gb1, &b1},
                        {&gw2, &w2},
                        {&gb2, &b2},
                        {&bw1, &w1},
                        {&bb1, &b1},
                        {&bw2, &w2},
                        {&bb2, &b2}})
      *g = Tensor::empty(p->shape(), DType::F32, device);
  }

  // One step; returns the loss (reading it synchronises, like a trainer's log line).
  float step(const Tensor& x_host, const Tensor& labels_host, int step_index) {
    std::int64_t b = x_host.dim(0);
    Tensor x = Tensor::empty(x_host.shape(), DType::F32, device);
    Tensor labels = Tensor::empty(labels_host.shape(), DType::I32, device);
    ops::copy(ctx, x_host, x);
    ops::copy(ctx, labels_host, labels);
    Tensor h = Tensor::empty({b, w1.dim(0)}, DType::F32, device);
    ops::gemm(ctx, false, true, 1.0f, x, w1, 0.0f, h);
    ops::add_row_bias(ctx, h, b1);
    Tensor a = Tensor::empty(h.shape(), DType::F32, device);
    ops::relu_forward(ctx, h, a);
    Tensor d = Tensor::empty(h.shape(), DType::F32, device);
    Tensor mask = Tensor::empty(h.shape(), DType::U8, device);
    ops::dropout_forward(ctx, a, d, mask, 0.2f, 7, static_cast<std::uint64_t>(step_index));
    Tensor logits = Tensor::empty({b, w2.dim(0)}, DType::F32, device);
    ops::gemm(ctx, false, true, 1.0f, d, w2, 0.0f, logits);
    ops::add_row_bias(ctx, logits, b2);
    Tensor probs = Tensor::empty(logits.shape(), DType::F32, device);
    Tensor loss = Tensor::empty({1}, DType::F32, device);
    ops::softmax_xent_forward(ctx, logits, labels, probs, loss);

    for (Tensor* g : {&gw1, &gb1, &gw2, &gb2})
      ops::fill(ctx, *g, 0.0f);
    Tensor dlogits = Tensor::empty(logits.shape(), DType::F32, device);
    ops::softmax_xent_backward(ctx, probs, labels, 1.0f / static_cast<float>(b), dlogits);
    ops::gemm(ctx, true, false, 1.0f, dlogits, d, 1.0f, gw2);  // accumulate, as layers do
    ops::sum_rows(ctx, dlogits, gb2);
    Tensor dd = Tensor::empty(d.shape(), DType::F32, device);
    ops::gemm(ctx, false, false, 1.0f, dlogits, w2, 0.0f, dd);
    Tensor da = Tensor::empty(d.shape(), DType::F32, device);
    ops::dropout_backward(ctx, dd, mask, 0.2f, da);
    Tensor dh = Tensor::empty(d.shape(), DType::F32, device);
    ops::relu_backward(ctx, a, da, dh);
    ops::gemm(ctx, true, false, 1.0f, dh, x, 1.0f, gw1);
    ops::sum_rows(ctx, dh, gb1);

    ops::SgdParams p{0.2f, 0.9f, 0.0f, 1e-4f, false, step_index == 0};
    ops::sgd_update(ctx, w1, gw1, bw1, p);
    ops::sgd_update(ctx, b1, gb1, bb1, p);
    ops::sgd_update(ctx, w2, gw2, bw2, p);
    ops::sgd_update(ctx, b2, gb2, bb2, p);
    return loss.item();
  }
};

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
