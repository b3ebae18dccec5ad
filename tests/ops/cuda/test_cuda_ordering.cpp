// Context::wait_for on GPUs: a context that reads what another context's stream writes must wait
// for it on the device. The producer's stream is held by a host function until a timer thread
// releases it, so an unordered read would see the old values every time, not by chance.
#include <atomic>
#include <chrono>
#include <thread>

#include "support/cuda_test_support.hpp"

#ifdef LOCKSTEP_HAVE_CUDA
#include <cuda_runtime.h>

#include "ops/cuda/cuda_backend.hpp"

namespace lockstep::testing {
namespace {

void CUDART_CB hold_until_released(void* flag) {
  auto* released = static_cast<std::atomic<bool>*>(flag);
  while (!released->load())
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// Holds `ctx`'s stream until release() (or destruction): work queued behind stays queued.
class StreamHold {
 public:
  explicit StreamHold(ops::Context& ctx) {
    EXPECT_EQ(cudaLaunchHostFunc(ops::cuda::compute_stream(ctx), hold_until_released, &released_),
              cudaSuccess);
  }
  ~StreamHold() { release_after(std::chrono::milliseconds(0)); }
  void release_after(std::chrono::milliseconds delay) {
    if (timer_.joinable()) return;
    timer_ = std::thread([this, delay] {
      std::this_thread::sleep_for(delay);
      released_ = true;
    });
    if (delay.count() == 0) timer_.join();
  }
  void join() {
    if (timer_.joinable()) timer_.join();
  }

 private:
  std::atomic<bool> released_{false};
  std::thread timer_;
};

TEST(StreamOrder, AContextWaitingForAnotherSeesItsWritesOnTheSameGpu) {
  LOCKSTEP_SKIP_WITHOUT_GPU();
  ops::Context producer(Device::cuda(0)), consumer(Device::cuda(0));
  // Tensor::zeros is host-only: a device tensor is made empty and filled on a stream.
  Tensor x = Tensor::empty({4096}, DType::F32, Device::cuda(0));
  ops::fill(producer, x, 0.0f);
  producer.synchronize();
  {
    StreamHold hold(producer);
    ops::fill(producer, x, 7.0f);  // queued behind the hold
    consumer.wait_for(producer);
    hold.release_after(std::chrono::milliseconds(300));
    Tensor seen = Tensor::empty({4096});
    ops::copy(consumer, x, seen);  // to the host: waits for the consumer's stream
    hold.join();
    for (float v : seen.to_vector<float>())
      ASSERT_EQ(v, 7.0f) << "the consumer read before the producer's write";
  }
}

TEST(StreamOrder, WaitingForACpuContextOrForItselfIsANoOp) {
  LOCKSTEP_SKIP_WITHOUT_GPU();
  ops::Context cpu, gpu(Device::cuda(0));
  EXPECT_NO_THROW(gpu.wait_for(cpu));
  EXPECT_NO_THROW(gpu.wait_for(gpu));
  Tensor x = Tensor::empty({16}, DType::F32, Device::cuda(0));
  ops::fill(gpu, x, 2.0f);
  EXPECT_NO_THROW(cpu.wait_for(gpu));  // a CPU context waits on the host
  for (float v : x.to_vector<float>())
    EXPECT_EQ(v, 2.0f);
}

}  // namespace
}  // namespace lockstep::testing

#else

TEST(StreamOrder, NeedsTheCudaBuild) {
  GTEST_SKIP() << lockstep::testing::no_gpu_reason();
}

#endif
