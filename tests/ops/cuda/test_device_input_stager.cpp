// InputStager (ops/device_runtime.hpp), on every device kind: batches reach the compute stream
// intact although their copies run on another stream, and a steady state allocates nothing,
// copies nothing from pageable memory and never waits for the device. Nothing is read back until
// the end, so a copy that overwrote a slot still in use, or one the compute stream did not wait
// for, shows as wrong values. On the emulated device every task is delayed, so the copies really
// are still in flight when the next batch is staged.
#include "ops/emu/emu_runtime.hpp"
#include "support/device_test_support.hpp"

namespace lockstep::testing {
namespace {

class InputStaging : public OnDevice {
 protected:
  void SetUp() override {
    OnDevice::SetUp();
#ifdef LOCKSTEP_HAVE_EMU
    ops::emu::set_delay_us(200);
#endif
  }
  void TearDown() override {
#ifdef LOCKSTEP_HAVE_EMU
    ops::emu::set_delay_us(0);
#endif
  }
};
LOCKSTEP_ON_DEVICES(InputStaging);

// u8 images [rows, 3, 32, 32].
Tensor u8_batch(std::int64_t rows, std::uint64_t stream) {
  Tensor t = Tensor::empty({rows, 3, 32, 32}, DType::U8);
  Philox rng(31, stream);
  for (std::int64_t i = 0; i < t.numel(); ++i)
    t.data<std::uint8_t>()[i] = static_cast<std::uint8_t>(rng.u32(static_cast<std::uint64_t>(i)));
  return t;
}

TEST_P(InputStaging, EveryBatchArrivesIntactWithoutAllocationsPageableCopiesOrSyncs) {
  const std::int64_t rows = 64;
  const int warmup = 2, steady = 10, batches = warmup + steady;
  std::vector<Tensor> xs, ys, got_x, got_y;
  for (int k = 0; k < batches; ++k) {
    xs.push_back(u8_batch(rows, static_cast<std::uint64_t>(k)));
    ys.push_back(random_labels(rows, 10, static_cast<std::uint64_t>(k)));
    // Where the compute stream puts what it read: allocated before counting.
    got_x.push_back(Tensor::empty(xs.back().shape(), DType::F32, device()));
    got_y.push_back(Tensor::empty({rows}, DType::I32, device()));
  }
  ops::InputStager stager(dev());
  // Enough compute per batch (GEMMs on a 512x512 matrix) that the next copies are enqueued while
  // it still runs, which is when a missing wait would show.
  Tensor a = to_dev(random_tensor({512, 512}, 9)),
         b = Tensor::empty({512, 512}, DType::F32, device());
  const std::vector<float> mean = {0.5f, 0.4f, 0.45f}, stddev = {0.25f, 0.2f, 0.3f};
  ops::DeviceCounters before{};
  for (int k = 0; k < batches; ++k) {
    if (k == warmup) {
      before = counters();
    }
    std::vector<Tensor> staged = stager.stage({xs[k], ys[k]});
    ASSERT_EQ(staged.size(), 2u);
    EXPECT_EQ(staged[0].shape(), xs[k].shape());
    EXPECT_EQ(staged[1].dtype(), DType::I32);
    for (int r = 0; r < 4; ++r)
      ops::gemm(dev(), false, false, 1.0f, a, a, 0.0f, b);
    ops::normalize_input(dev(), staged[0], mean, stddev, got_x[k]);
    ops::copy(dev(), staged[1], got_y[k]);
  }
  const ops::DeviceCounters after = counters();
  EXPECT_EQ(after.device_mallocs, before.device_mallocs);
  EXPECT_EQ(after.pageable_copies, before.pageable_copies);
  EXPECT_EQ(after.host_syncs, before.host_syncs);

  ops::Context& host = cpu();
  for (int k = 0; k < batches; ++k) {
    Tensor want = Tensor::empty(xs[k].shape());
    ops::normalize_input(host, xs[k], mean, stddev, want);
    EXPECT_CLOSE(got_x[k], want, 1e-6) << "batch " << k;
    EXPECT_EQ(got_y[k].to_vector<std::int32_t>(), ys[k].to_vector<std::int32_t>()) << "batch " << k;
  }
}

TEST_P(InputStaging, GrowsForABiggerBatchAndShrinksToASmallerOne) {
  ops::InputStager stager(dev());
  for (std::int64_t rows : {8, 32, 4, 32, 16}) {
    Tensor x = random_tensor({rows, 5}, static_cast<std::uint64_t>(rows));
    std::vector<Tensor> staged = stager.stage({x});
    EXPECT_EQ(staged[0].shape(), x.shape());
    EXPECT_EQ(staged[0].to_vector<float>(), x.to_vector<float>()) << rows << " rows";
  }
}

}  // namespace
}  // namespace lockstep::testing
