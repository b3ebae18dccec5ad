// The emulated GPU keeps the rules that host code breaks on a real GPU, so that breaking them
// fails here: device memory the host cannot dereference, work that runs later than it is queued,
// streams ordered only by events, errors reported at the next wait, counters that mean what the
// CUDA backend's mean, and clear errors for devices it does not have.
#ifdef LOCKSTEP_HAVE_EMU

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "lockstep/core/allocator.hpp"
#include "lockstep/core/tensor.hpp"
#include "lockstep/ops/backend.hpp"
#include "lockstep/ops/context.hpp"
#include "lockstep/ops/device_runtime.hpp"
#include "lockstep/ops/ops.hpp"
#include "ops/emu/emu_runtime.hpp"

namespace lockstep {
namespace {

// A delay long enough that the host finishes queuing, and reads, before the worker runs a task.
constexpr int kSlowUs = 100'000;

// LOCKSTEP_EMU_DEVICES=0 leaves a process without emulated devices (the coverage baseline of
// docs/ARCHITECTURE.md runs the suite so): then these tests skip.
#define LOCKSTEP_SKIP_WITHOUT_EMU() \
  if (!emu_available()) GTEST_SKIP() << "LOCKSTEP_EMU_DEVICES=0: no emulated devices"

class EmuDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    LOCKSTEP_SKIP_WITHOUT_EMU();
    ctx_ = std::make_unique<ops::Context>(Device::emu(0));
  }
  void TearDown() override { ops::emu::set_delay_us(0); }
  std::unique_ptr<ops::Context> ctx_;
  ops::DeviceRuntime& rt() { return *ctx_->backend().runtime(); }
};

std::vector<float> host_floats(const void* p, std::size_t n) {
  std::vector<float> v(n);
  std::memcpy(v.data(), p, n * sizeof(float));
  return v;
}

TEST_F(EmuDevice, ItsMemoryIsNotHostAddressableSoAHostReadWithoutACopyFaults) {
  Tensor t = Tensor::empty({16}, DType::F32, ctx_->device());
  ops::fill(*ctx_, t, 1.0f);
  ctx_->synchronize();
  EXPECT_TRUE(ops::emu::is_device_address(t.raw_data()));
  // The same read through a copy is fine.
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>(16, 1.0f));
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        volatile float v = t.data<float>()[3];
        (void)v;
      },
      "");
}

TEST_F(EmuDevice, AHostThatReadsWithoutWaitingSeesStaleDataAndTheWaitFixesIt) {
  Tensor t = Tensor::empty({1024}, DType::F32, ctx_->device());
  auto* pinned = static_cast<float*>(rt().alloc_pinned(t.nbytes()));
  std::memset(pinned, 0, t.nbytes());
  ops::emu::set_delay_us(kSlowUs);
  ops::fill(*ctx_, t, 7.0f);
  rt().copy_async(pinned, t.raw_data(), t.nbytes(), rt().compute_stream());  // returns at once
  EXPECT_EQ(host_floats(pinned, 4), std::vector<float>(4, 0.0f))
      << "a copy into pinned memory must not have run before the host waits";
  rt().host_wait(rt().compute_stream());
  EXPECT_EQ(host_floats(pinned, 1024), std::vector<float>(1024, 7.0f));
  rt().free_pinned(pinned);
}

TEST_F(EmuDevice, StreamsAreOrderedOnlyByEvents) {
  Tensor t = Tensor::empty({256}, DType::F32, ctx_->device());
  ops::fill(*ctx_, t, 0.0f);
  ctx_->synchronize();
  auto* seen = static_cast<float*>(rt().alloc_pinned(t.nbytes()));
  ops::DeviceRuntime::Stream side = rt().create_stream();
  ops::DeviceRuntime::Event written = rt().create_event(false);

  // Without an event the side stream reads before the fill on the compute stream ran: the fill
  // waits behind another kernel there, the copy behind none on its own stream.
  ops::emu::set_delay_us(kSlowUs);
  ops::scale(*ctx_, t, 1.0f);
  ops::fill(*ctx_, t, 3.0f);
  rt().copy_async(seen, t.raw_data(), t.nbytes(), side);
  rt().host_wait(side);
  EXPECT_EQ(host_floats(seen, 1)[0], 0.0f) << "the side stream waited without being told to";
  ctx_->synchronize();

  // With one, it reads what the compute stream wrote.
  ops::fill(*ctx_, t, 5.0f);
  rt().record(written, rt().compute_stream());
  rt().wait(side, written);
  rt().copy_async(seen, t.raw_data(), t.nbytes(), side);
  rt().host_wait(side);
  EXPECT_EQ(host_floats(seen, 256), std::vector<float>(256, 5.0f));
  EXPECT_TRUE(rt().query(written));

  rt().destroy_event(written);
  rt().destroy_stream(side);
  rt().free_pinned(seen);
}

// Tensor::to is core's synchronous copy: any op queued after it, on any stream, must see the
// bytes. cudaMemcpy from pageable memory only stages them and writes them on the legacy stream,
// which the compute stream is not ordered after; the emulator does the same (its legacy stream
// slower than the compute stream), so a copy that returned before the write would fail here.
TEST_F(EmuDevice, AnOpQueuedAfterTensorToSeesTheCopiedBytes) {
  ops::emu::set_delay_us(kSlowUs / 4);
  std::vector<float> values(1000);
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] = static_cast<float>(i) - 500.0f;
  Tensor d = Tensor::from_vector(values, {1000}).to(ctx_->device());
  ops::scale(*ctx_, d, 2.0f);
  std::vector<float> want(values);
  for (float& v : want)
    v *= 2.0f;
  EXPECT_EQ(d.to_vector<float>(), want);
}

TEST_F(EmuDevice, AKernelErrorIsReportedAtTheNextWaitAndLaterKernelsOnTheStreamAreSkipped) {
  Tensor logits = Tensor::empty({2, 3}, DType::F32, ctx_->device());
  ops::fill(*ctx_, logits, 0.5f);
  Tensor labels = Tensor::from_vector(std::vector<std::int32_t>{1, 7}, {2}).to(ctx_->device());
  Tensor probs = Tensor::empty({2, 3}, DType::F32, ctx_->device());
  Tensor loss = Tensor::empty({1}, DType::F32, ctx_->device());
  Tensor marker = Tensor::empty({4}, DType::F32, ctx_->device());
  ops::fill(*ctx_, marker, 1.0f);
  ctx_->synchronize();
  // Queuing succeeds: the kernel has not run yet, as on a GPU.
  EXPECT_NO_THROW(ops::softmax_xent_forward(*ctx_, logits, labels, probs, loss));
  ops::fill(*ctx_, marker, 2.0f);  // skipped: the stream has an error
  try {
    ctx_->synchronize();
    FAIL() << "the bad label was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find('7'), std::string::npos) << e.what();
  }
  // Reported once; the stream runs again, and the kernel after the error never ran.
  EXPECT_EQ(marker.to_vector<float>(), std::vector<float>(4, 1.0f));
}

TEST_F(EmuDevice, CountersCountHostSyncsPageableCopiesAndAllocationsAsTheCudaBackendDoes) {
  const ops::DeviceCounters start = ops::device_counters(ctx_->device());
  Tensor a = Tensor::empty({300}, DType::F32, ctx_->device());
  const ops::DeviceCounters allocated = ops::device_counters(ctx_->device());
  EXPECT_GE(allocated.device_mallocs, start.device_mallocs);
  ops::fill(*ctx_, a, 1.0f);
  ops::scale(*ctx_, a, 3.0f);
  const ops::DeviceCounters queued = ops::device_counters(ctx_->device());
  EXPECT_EQ(queued.host_syncs, allocated.host_syncs) << "queuing ops must not wait";
  EXPECT_EQ(queued.pageable_copies, allocated.pageable_copies);
  (void)ops::sum_squares(*ctx_, a);  // a value on the host: one wait
  EXPECT_EQ(ops::device_counters(ctx_->device()).host_syncs, queued.host_syncs + 1);
  // An upload from pageable memory is counted.
  const std::uint64_t copies = ops::device_counters(ctx_->device()).pageable_copies;
  Tensor b = Tensor::from_vector(std::vector<float>(300, 2.0f), {300}, ctx_->device());
  EXPECT_EQ(ops::device_counters(ctx_->device()).pageable_copies, copies + 1);
  // A block freed and asked for again comes from the cache.
  const void* where = b.raw_data();
  b = Tensor();
  const std::uint64_t mallocs = ops::device_counters(ctx_->device()).device_mallocs;
  Tensor c = Tensor::empty({300}, DType::F32, ctx_->device());
  EXPECT_EQ(c.raw_data(), where);
  EXPECT_EQ(ops::device_counters(ctx_->device()).device_mallocs, mallocs);
}

TEST_F(EmuDevice, ZerosIsHostOnlyAndSaysWhatToUseInstead) {
  try {
    (void)Tensor::zeros({4}, DType::F32, ctx_->device());
    FAIL() << "Tensor::zeros wrote device memory from the host";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ops::fill on emu:0"), std::string::npos) << e.what();
  }
}

TEST(EmuDevices, ADeviceItDoesNotHaveIsAClearError) {
  LOCKSTEP_SKIP_WITHOUT_EMU();
  EXPECT_EQ(parse_device("emu"), Device::emu(0));
  EXPECT_EQ(parse_device("emu:1"), Device::emu(1));
  EXPECT_EQ(Device::emu(2).str(), "emu:2");
  const int n = emu_device_count();
  try {
    (void)parse_device("emu:" + std::to_string(n));
    FAIL() << "emu:" << n << " accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("LOCKSTEP_EMU_DEVICES"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops::Context(Device::emu(n)), Error);
  EXPECT_THROW(parse_device("emu:x"), Error);
  EXPECT_THROW(parse_device("emu:-1"), Error);
}

TEST(EmuDevices, TwoDevicesExchangeDataThroughACopyOrderedByAnEvent) {
  LOCKSTEP_SKIP_WITHOUT_EMU();
  ops::Context a(Device::emu(0)), b(Device::emu(1));
  ops::emu::set_delay_us(kSlowUs / 10);
  Tensor x = Tensor::empty({512}, DType::F32, a.device());
  Tensor y = Tensor::empty({512}, DType::F32, b.device());
  ops::fill(b, y, -1.0f);
  ops::fill(a, x, 4.0f);
  // DataParallel's pattern: copy on a's stream after b has finished with y, then b waits for a.
  a.wait_for(b);
  ops::copy(a, x, y);
  b.wait_for(a);
  ops::scale(b, y, 0.5f);
  EXPECT_EQ(y.to_vector<float>(), std::vector<float>(512, 2.0f));
  ops::emu::set_delay_us(0);
}

}  // namespace
}  // namespace lockstep

#endif  // LOCKSTEP_HAVE_EMU
