// Context::wait_for on devices (the emulated GPU everywhere, CUDA where a GPU answers): a context
// that reads what another context's stream writes must wait for it on the device. The producer's
// stream is held by a host function until a timer thread releases it, so an unordered read would
// see the old values every time, not by chance.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "lockstep/ops/backend.hpp"
#include "lockstep/ops/device_runtime.hpp"
#include "support/device_test_support.hpp"

namespace lockstep::testing {
namespace {

// Holds `ctx`'s stream until release() (or destruction): work queued behind stays queued.
class StreamHold {
 public:
  explicit StreamHold(ops::Context& ctx) {
    ops::DeviceRuntime& rt = *ctx.backend().runtime();
    rt.host_func(rt.compute_stream(), [this] {
      while (!released_.load())
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
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

using StreamOrder = OnDevice;
LOCKSTEP_ON_DEVICES(StreamOrder);

TEST_P(StreamOrder, AContextWaitingForAnotherSeesItsWritesOnTheSameDevice) {
  ops::Context producer(device()), consumer(device());
  // Tensor::zeros is host-only: a device tensor is made empty and filled on a stream.
  Tensor x = Tensor::empty({4096}, DType::F32, device());
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

TEST_P(StreamOrder, WaitingForACpuContextOrForItselfIsANoOp) {
  ops::Context cpu, gpu(device());
  EXPECT_NO_THROW(gpu.wait_for(cpu));
  EXPECT_NO_THROW(gpu.wait_for(gpu));
  Tensor x = Tensor::empty({16}, DType::F32, device());
  ops::fill(gpu, x, 2.0f);
  EXPECT_NO_THROW(cpu.wait_for(gpu));  // a CPU context waits on the host
  for (float v : x.to_vector<float>())
    EXPECT_EQ(v, 2.0f);
}

// Tensor::to(device) (like from_vector and copy_from) is a cudaMemcpy on the legacy default
// stream, which returns from pageable memory once the bytes are staged; the backend's streams are
// non-blocking, so not ordered after it (the emulated GPU does the same). The copy must be complete
// when to() returns: a kernel queued next on a compute stream reads what was copied. The race
// window is the last staged chunk, so the data check repeats with large tensors; the count of host
// syncs shows the wait deterministically (one before the copy, for queued kernels, and one after
// it).
TEST_P(StreamOrder, AKernelQueuedRightAfterAHostToDeviceCopyReadsTheCopiedValues) {
  ops::Context& gpu = dev();
  const std::int64_t n = std::int64_t{16} << 20;  // 64 MiB of f32
  Tensor host = Tensor::empty({n});
  Tensor seen = Tensor::empty({n});
  Tensor copied = Tensor::empty({n}, DType::F32, device());
  for (int round = 1; round <= 8; ++round) {
    std::fill(host.data<float>(), host.data<float>() + n, static_cast<float>(round));
    const std::uint64_t syncs = counters().host_syncs;
    Tensor on_gpu = host.to(device());
    EXPECT_EQ(counters().host_syncs, syncs + 2)
        << "to(device) must wait for the device before the copy and for the copy after it";
    ops::copy(gpu, on_gpu, copied);  // queued at once on the compute stream
    ops::copy(gpu, copied, seen);
    const float* v = seen.data<float>();
    for (std::int64_t i = 0; i < n; ++i)
      ASSERT_EQ(v[i], static_cast<float>(round))
          << "round " << round << ", element " << i << ": the kernel read before the copy landed";
  }
}

}  // namespace
}  // namespace lockstep::testing
