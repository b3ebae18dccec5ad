// DdpEngine on a device (the emulated GPU everywhere, CUDA where a GPU answers) feeds host
// batches through its InputStager (pinned slots, a copy stream):
// the training it does is the training of the same batches handed over already on the device
// (the engine then copies nothing) and of the CPU engine, and a steady-state step allocates no
// device memory and copies nothing from pageable host memory.
//
// Needs the parallel layer, which the GPU-check build (LOCKSTEP_GPU_CHECK_ONLY: core, ops, nn and
// optim only) does not have: there the file compiles to nothing.
#include "support/device_test_support.hpp"

#if __has_include("lockstep/parallel/ddp.hpp")
#include "lockstep/comm/local.hpp"
#include "lockstep/optim/sgd.hpp"
#include "lockstep/parallel/ddp.hpp"

namespace lockstep::testing {
namespace {

constexpr int kWarmupSteps = 3, kSteadySteps = 8, kMicroSteps = 2;
constexpr std::int64_t kMicroBatch = 24;
const Shape kSample = {3, 8, 8};
constexpr int kClasses = 7;

// u8 images and labels of micro-batch `m` of step `s`: different every time, so a batch read
// from the wrong slot or before its copy finished changes the result.
struct HostBatch {
  Tensor x, y;
};
HostBatch host_batch(int step, int micro) {
  const auto stream = static_cast<std::uint64_t>(step * kMicroSteps + micro);
  Tensor x = Tensor::empty({kMicroBatch, kSample[0], kSample[1], kSample[2]}, DType::U8);
  Philox rng(5, stream);
  for (std::int64_t i = 0; i < x.numel(); ++i)
    x.data<std::uint8_t>()[i] = static_cast<std::uint8_t>(rng.u32(static_cast<std::uint64_t>(i)));
  return {x, random_labels(kMicroBatch, kClasses, 100 + stream)};
}

struct Trained {
  std::vector<std::vector<float>> parameters;
  std::size_t steady_mallocs = 0;
  std::uint64_t steady_pageable_copies = 0;
  double compute_seconds = 0;  // engine.times().compute summed over the steady steps
};

// Trains a small MLP (cuBLAS and own kernels: unlike cuDNN's searched convolution algorithms,
// the same on two GPU runs) with a 1-rank DdpEngine on `device`. on_device: hand the engine batches
// already moved to the device (the engine stages nothing), as the old synchronous path did.
Trained train(Device device, bool on_device) {
  ops::Context ctx(device);
  nn::Model model = nn::Model::build("mlp:32,16", kSample, kClasses, /*seed=*/3, device);
  auto comm = comm::make_single_rank_communicator();
  parallel::DdpOptions options;
  options.input = {{0.5f, 0.4f, 0.45f}, {0.25f, 0.2f, 0.3f}};
  parallel::DdpEngine engine(ctx, model, *comm, options);
  optim::SgdOptions so;
  so.lr = 0.05f;
  so.momentum = 0.9f;
  optim::Sgd sgd(engine.flat_params(), so);
  Trained run;
  std::size_t mallocs = 0;
  std::uint64_t copies = 0;
  auto count = [&](std::size_t& m, std::uint64_t& c) {
    const ops::DeviceCounters now = ops::device_counters(device);
    m = now.device_mallocs;
    c = now.pageable_copies;
  };
  std::vector<HostBatch> moved;  // on_device: moved before the clock starts counting
  for (int s = 0; s < kWarmupSteps + kSteadySteps; ++s) {
    if (on_device) {
      moved.clear();
      for (int m = 0; m < kMicroSteps; ++m) {
        HostBatch b = host_batch(s, m);
        moved.push_back({b.x.to(device), b.y.to(device)});
      }
    }
    if (s == kWarmupSteps) count(mallocs, copies);
    engine.begin_step();
    for (int m = 0; m < kMicroSteps; ++m) {
      HostBatch b = on_device ? moved[static_cast<std::size_t>(m)] : host_batch(s, m);
      engine.forward_backward(b.x, b.y, 1.0f / static_cast<float>(kMicroBatch * kMicroSteps),
                              m + 1 == kMicroSteps);
    }
    engine.finish_gradients();
    engine.step(sgd);
    if (s >= kWarmupSteps) run.compute_seconds += engine.times().compute;
  }
  std::size_t mallocs_after = 0;
  std::uint64_t copies_after = 0;
  count(mallocs_after, copies_after);
  run.steady_mallocs = mallocs_after - mallocs;
  run.steady_pageable_copies = copies_after - copies;
  for (const nn::Parameter* p : model.parameters())
    run.parameters.push_back(p->value.to_vector<float>());
  return run;
}

double max_abs_difference(const Trained& a, const Trained& b) {
  double worst = a.parameters.size() == b.parameters.size() ? 0.0 : INFINITY;
  for (std::size_t i = 0; i < std::min(a.parameters.size(), b.parameters.size()); ++i) {
    if (a.parameters[i].size() != b.parameters[i].size()) return INFINITY;
    for (std::size_t j = 0; j < a.parameters[i].size(); ++j)
      worst =
          std::max(worst, static_cast<double>(std::fabs(a.parameters[i][j] - b.parameters[i][j])));
  }
  return worst;
}

using DdpInputStaging = OnDevice;
LOCKSTEP_ON_DEVICES(DdpInputStaging);

TEST_P(DdpInputStaging, StagedStepsTrainAsSynchronousCopiesWithoutMallocOrPageableCopy) {
  Trained staged = train(device(), /*on_device=*/false);
  EXPECT_EQ(staged.steady_mallocs, 0u) << "device allocations over " << kSteadySteps << " steps";
  EXPECT_EQ(staged.steady_pageable_copies, 0u)
      << "pageable host-to-device copies over " << kSteadySteps << " steps";
  // Timed on the device with events and reported once the GPU has finished a step: later than
  // the step, but not never.
  EXPECT_GT(staged.compute_seconds, 0.0);

  // The same kernels on the same data: only the way the bytes reached the device differs. Equal
  // bitwise when cuBLAS is deterministic (its default); 1e-6 leaves room for rounding only.
  Trained synchronous = train(device(), /*on_device=*/true);
  EXPECT_GT(synchronous.steady_pageable_copies, 0u) << "Tensor::to from the host is counted";
  EXPECT_LE(max_abs_difference(staged, synchronous), 1e-6);

  // And the CPU engine, the independent reference: float rounding differences (~1e-7) compound
  // over 11 steps of momentum SGD; a stale or overwritten batch moves parameters by > 1e-2.
  Trained on_cpu = train(Device::cpu(), false);
  EXPECT_LE(max_abs_difference(staged, on_cpu), 2e-4);
  // The emulated device runs the CPU's kernels: the same bits, or the ordering is wrong.
  if (device().is_emu()) {
    EXPECT_EQ(max_abs_difference(staged, on_cpu), 0.0);
  }
}

}  // namespace
}  // namespace lockstep::testing

#endif  // __has_include("lockstep/parallel/ddp.hpp")
