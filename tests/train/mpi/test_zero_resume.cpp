// ZeRO-1 checkpoints through the real trainer (setup, loop, TrainState), under mpirun with 2 and
// 4 ranks: a run stopped half-way and resumed ends where the uninterrupted run ends, whether the
// two halves use the same ZeRO mode or not, and whether they run on the whole world or on one
// rank (rank 0 alone, over a single-rank communicator, while the others wait). Rank 0 writes the
// same checkpoint file in both modes (the state gathered whole).
//
// Tolerances: the same mode and world size resume bitwise (the state is exact and every rank
// reads it). Another mode or world size adds the gradients in another order (reduce-scatter vs
// allreduce, W partial sums vs one) and sums the clipping norm differently: one f32 rounding per
// sum, ~1e-7 relative, kept small over 8 AdamW steps; 2e-5 is test_ddp.cpp's bound, and a
// lost or misplaced shard of the optimizer state moves parameters by > 1e-3.
#include <gtest/gtest.h>

#include <memory>

#include "lockstep/comm/local.hpp"
#include "lockstep/parallel/ddp.hpp"
#include "lockstep/train/checkpoint.hpp"
#include "lockstep/train/loop.hpp"
#include "lockstep/train/setup.hpp"
#include "support/mpi_env.hpp"
#include "support/tiny_run.hpp"
#include "support/training.hpp"

namespace lockstep::test {
namespace {

constexpr double kTolerance = 2e-5;

struct Trained {
  std::vector<std::vector<float>> params;
  std::string checkpoint;  // the last one written (on every rank)
};

// AdamW with clipping on, tiny buckets (every parameter its own, split unevenly into shards).
train::Config zero_config(const std::string& data, int zero, const std::string& dir) {
  train::Config c = tiny_config(data);
  c.optim_name = "adamw";
  c.optim_lr = 0.01;
  c.optim_weight_decay = 0.01;
  c.optim_clip_norm = 0.5;
  c.dist_bucket_mb = 1e-6;
  c.dist_first_bucket_mb = 1e-6;
  c.dist_zero = zero;
  c.checkpoint_dir = dir;
  return c;
}

Trained run_training(const train::Config& c, comm::Communicator& comm) {
  auto run = train::setup_run(c, comm);
  train::TrainResult r = train::train_loop(*run);
  return {parameter_values(*run->model), comm.broadcast(r.checkpoint, 0)};
}

// A fresh folder on rank 0, named on every rank (kept until the test's final barrier).
std::string shared_folder(std::vector<std::unique_ptr<TempDir>>& keep) {
  std::string path;
  if (world().rank() == 0) {
    keep.push_back(std::make_unique<TempDir>());
    path = keep.back()->path();
  }
  return world().broadcast(path, 0);
}

class ZeroResume : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir = shared_folder(keep_);
    if (world().rank() == 0) write_tiny_set(dir, "tiny");
    data_ = dir + "/tiny";
    world().barrier();
  }
  void TearDown() override { world().barrier(); }

  // 16 steps in all (2 epochs of 8); the first half stops at step 6, mid-epoch.
  train::Config first_half(int zero) {
    train::Config c = zero_config(data_, zero, shared_folder(keep_));
    c.train_max_steps = 6;
    return c;
  }
  train::Config second_half(int zero, const std::string& checkpoint) {
    train::Config c = zero_config(data_, zero, shared_folder(keep_));
    c.train_resume = checkpoint;
    return c;
  }
  train::Config whole(int zero) { return zero_config(data_, zero, shared_folder(keep_)); }

  std::vector<std::unique_ptr<TempDir>> keep_;
  std::string data_;
};

}  // namespace

TEST_F(ZeroResume, ResumedRunEqualsUninterruptedRunBitwise) {
  Trained reference = run_training(whole(1), world());
  Trained half = run_training(first_half(1), world());
  Trained resumed = run_training(second_half(1, half.checkpoint), world());
  EXPECT_EQ(resumed.params, reference.params) << "rank " << world().rank();
  EXPECT_NE(half.params, reference.params);  // the halves did differ
}

TEST_F(ZeroResume, CheckpointFileIsTheSameWithAndWithoutZero) {
  Trained plain = run_training(first_half(0), world());
  Trained zero = run_training(first_half(1), world());
  if (world().rank() == 0) {
    const train::CheckpointState a = train::read_checkpoint(plain.checkpoint);
    const train::CheckpointState b = train::read_checkpoint(zero.checkpoint);
    ASSERT_EQ(a.tensors.size(), b.tensors.size());
    for (std::size_t i = 0; i < a.tensors.size(); ++i) {
      EXPECT_EQ(a.tensors[i].first, b.tensors[i].first);
      EXPECT_EQ(a.tensors[i].second.shape(), b.tensors[i].second.shape()) << a.tensors[i].first;
      std::vector<float> x = a.tensors[i].second.to_vector<float>();
      std::vector<float> y = b.tensors[i].second.to_vector<float>();
      ASSERT_EQ(x.size(), y.size());
      for (std::size_t k = 0; k < x.size(); ++k)
        EXPECT_NEAR(x[k], y[k], kTolerance) << a.tensors[i].first << "[" << k << "]";
    }
    EXPECT_GT(a.tensors.size(), 4u);  // parameters and both Adam moments of each
  }
}

TEST_F(ZeroResume, ResumesAcrossModes) {
  Trained reference = run_training(whole(0), world());
  for (int first : {0, 1}) {
    Trained half = run_training(first_half(first), world());
    Trained resumed = run_training(second_half(1 - first, half.checkpoint), world());
    EXPECT_LE(max_abs_difference(resumed.params, reference.params), kTolerance)
        << "zero " << first << " then " << 1 - first << ", rank " << world().rank();
  }
}

TEST_F(ZeroResume, WrittenByAllRanksResumedByOne) {
  Trained reference = run_training(whole(1), world());
  Trained half = run_training(first_half(1), world());
  const train::Config second = second_half(1, half.checkpoint);  // collective: names a folder
  if (world().rank() == 0) {
    auto alone = comm::make_single_rank_communicator();
    Trained resumed = run_training(second, *alone);
    EXPECT_LE(max_abs_difference(resumed.params, reference.params), kTolerance)
        << "written by " << world().size() << " ranks, resumed by 1";
  }
  world().barrier();
}

TEST_F(ZeroResume, WrittenByOneRankResumedByAll) {
  Trained reference = run_training(whole(1), world());
  std::string checkpoint;
  train::Config first = first_half(1);
  if (world().rank() == 0) {
    auto alone = comm::make_single_rank_communicator();
    checkpoint = run_training(first, *alone).checkpoint;
  }
  checkpoint = world().broadcast(checkpoint, 0);
  Trained resumed = run_training(second_half(1, checkpoint), world());
  EXPECT_LE(max_abs_difference(resumed.params, reference.params), kTolerance)
      << "written by 1 rank, resumed by " << world().size() << ", rank " << world().rank();
}

// dist.grad_dtype = bf16 through the real trainer (config -> setup -> DdpEngine -> Reducer), in
// both ZeRO modes: the reducer sends bf16, the run repeats bit for bit and resumes bitwise from a
// mid-run checkpoint, and the parameters stay near the f32 run's (the bound of test_ddp.cpp's
// Bf16GradientsTrainLikeF32UpToTheirRounding: 2 u = 2^-7 of how far training moved them) without
// equalling them.
TEST_F(ZeroResume, Bf16GradientsThroughTheTrainerResumeBitwiseAndStayNearF32) {
  for (int zero : {0, 1}) {
    auto bf16 = [](train::Config c) {
      c.dist_grad_dtype = "bf16";
      return c;
    };
    train::Config c = bf16(whole(zero));
    auto run = train::setup_run(c, world());
    auto* ddp = dynamic_cast<parallel::DdpEngine*>(run->engine.get());
    ASSERT_NE(ddp, nullptr);
    EXPECT_EQ(ddp->reducer().grad_dtype(), DType::BF16);
    const std::vector<std::vector<float>> start = parameter_values(*run->model);
    train::train_loop(*run);
    const std::vector<std::vector<float>> params = parameter_values(*run->model);

    Trained f32 = run_training(whole(zero), world());
    const double moved = max_abs_difference(f32.params, start);
    const double diff = max_abs_difference(params, f32.params);
    EXPECT_LE(diff, 2 * ops::kBf16UnitRoundoff * moved) << "zero " << zero;
    if (world().size() > 1) {
      EXPECT_GT(diff, 0.0) << "zero " << zero;
    }

    Trained half = run_training(bf16(first_half(zero)), world());
    Trained resumed = run_training(bf16(second_half(zero, half.checkpoint)), world());
    EXPECT_EQ(resumed.params, params) << "zero " << zero << ", rank " << world().rank();
  }
}

}  // namespace lockstep::test
