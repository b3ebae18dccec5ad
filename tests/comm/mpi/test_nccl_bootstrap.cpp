// NCCL bootstrap over MPI: rank 0's unique id reaches every rank unchanged (runs without a GPU:
// ncclGetUniqueId needs none), the rank-to-GPU choice works for both launch layouts (with
// made-up GPU lists, so it runs without a GPU) and refuses more local ranks than GPUs, and on
// GPU machines the NCCL communicator's collectives agree with hand-computed values and a rank
// that throws tears its communicator down without waiting for its peers.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/comm/gpu_select.hpp"
#include "lockstep/core/device.hpp"
#include "lockstep/core/error.hpp"
#include "support/child_process.hpp"
#include "support/mpi_env.hpp"
#ifdef LOCKSTEP_HAVE_CUDA
#include "lockstep/comm/nccl_communicator.hpp"
#include "lockstep/ops/context.hpp"
#include "lockstep/ops/ops.hpp"
#include "ops/cuda/cuda_backend.hpp"
#endif

namespace lockstep::comm {
namespace {

using test::session;
using test::world;

// Every rank of this job runs on one machine, so its local rank is its rank.
TEST(GpuSelection, RanksThatSeeEveryGpuOfTheNodeTakeTheirLocalRank) {
  VisibleGpus node_gpus;
  for (int g = 0; g < 8; ++g)
    node_gpus.push_back("GPU-node-" + std::to_string(g));
  EXPECT_EQ(select_local_gpu(world(), GpuChoice{}, node_gpus), session().local_rank());
}

TEST(GpuSelection, RanksGivenOneGpuEachByTheLauncherTakeTheirOnlyDevice) {
  // srun --gpus-per-task=1 --gpu-bind=single:1: CUDA_VISIBLE_DEVICES holds one entry per rank,
  // a different GPU for each, which every rank sees as device 0.
  VisibleGpus mine{"GPU-own-" + std::to_string(world().rank())};
  EXPECT_EQ(select_local_gpu(world(), GpuChoice{}, mine), 0);
  EXPECT_EQ(select_local_gpu(world(), GpuChoice::parse("first_visible"), mine), 0);
}

TEST(GpuSelection, MoreRanksThanSharedGpusIsAnErrorOnEveryRankNamingTheCounts) {
  VisibleGpus one{"GPU-shared"};
  try {
    select_local_gpu(world(), GpuChoice{}, one);
    ADD_FAILURE() << "rank " << world().rank() << " was given a GPU";
  } catch (const Error& e) {
    const std::string what = e.message();
    EXPECT_NE(what.find(std::to_string(session().local_size()) + " ranks on this node but only 1"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("rank " + std::to_string(world().rank())), std::string::npos) << what;
  }
}

TEST(GpuSelection, ForcingLocalRankWhereTheLauncherBoundOneGpuPerRankIsAnError) {
  VisibleGpus mine{"GPU-own-" + std::to_string(world().rank())};
  EXPECT_THROW(select_local_gpu(world(), GpuChoice::parse("local_rank"), mine), Error);
}

#ifdef LOCKSTEP_HAVE_CUDA

TEST(NcclBootstrap, EveryRankHoldsRankZerosUniqueId) {
  NcclUniqueIdBytes id = share_nccl_unique_id(world());
  std::string mine(id.begin(), id.end());
  std::vector<std::string> all = world().allgather(mine);
  for (int r = 0; r < world().size(); ++r)
    EXPECT_EQ(all[r], all[0]) << "rank " << r << " holds a different id than rank 0";
  EXPECT_NE(mine, std::string(mine.size(), '\0')) << "the id is all zeros";
  // A second bootstrap makes a fresh id: ids identify one communicator, never reused.
  NcclUniqueIdBytes again = share_nccl_unique_id(world());
  EXPECT_NE(std::string(again.begin(), again.end()), mine);
}

TEST(NcclBootstrap, MoreLocalRanksThanGpusIsAnErrorNamingBothCounts) {
  int gpus = cuda_device_count();
  if (session().local_size() <= gpus)
    GTEST_SKIP() << "this node has " << gpus << " GPUs for " << session().local_size()
                 << " local ranks: every rank gets its own";
  try {
    Device d = select_gpu(world(), "auto");
    ADD_FAILURE() << "rank " << world().rank() << " was given " << d.str();
  } catch (const Error& e) {
    std::string what = e.what();
    if (gpus == 0) {
      EXPECT_NE(what.find("sees no GPU"), std::string::npos) << what;
    } else {
      EXPECT_NE(what.find(std::to_string(session().local_size()) + " ranks"), std::string::npos)
          << what;
      EXPECT_NE(what.find(std::to_string(gpus) + " GPUs"), std::string::npos) << what;
    }
  }
}

// Every rank must take the same branch, so decide on the minimum over ranks.
bool every_rank_has_its_own_gpu() {
  std::vector<std::int64_t> enough{cuda_device_count() >= session().local_size() ? 1 : 0};
  world().allreduce(enough, ReduceOp::Min);
  return enough[0] != 0;
}

// Needs one GPU per local rank; the result is checked against values every rank can compute.
TEST(NcclCommunicator, CollectivesMatchHandComputedValues) {
  if (!every_rank_has_its_own_gpu())
    GTEST_SKIP() << "needs one GPU per local rank; this node has " << cuda_device_count() << " for "
                 << session().local_size() << " ranks (no GPU on CPU-only machines)";
  ops::Context ctx(select_gpu(world(), "auto"));
  auto nccl = make_nccl_communicator(world(), ctx);
  EXPECT_EQ(nccl->backend(), "nccl");
  EXPECT_EQ(nccl->timeout_s(), world().timeout_s()) << "dist.timeout_s reaches NCCL";
  const int n = world().size(), r = world().rank();
  // allreduce: rank r contributes (r + 1) * (i + 1); the sum is n(n+1)/2 * (i + 1).
  std::vector<float> mine(1000);
  for (int i = 0; i < 1000; ++i)
    mine[i] = static_cast<float>((r + 1) * (i + 1));
  Tensor t = Tensor::from_vector(mine, {1000}, ctx.device());
  nccl->allreduce_async(t, ReduceOp::Sum)->wait();
  std::vector<float> got = t.to_vector<float>();
  for (int i = 0; i < 1000; ++i)
    ASSERT_EQ(got[i], static_cast<float>(n * (n + 1) / 2 * (i + 1))) << "element " << i;
  // broadcast from the last rank, allgather of ranks, max-reduction.
  Tensor b = Tensor::from_vector<std::int32_t>({r, r, r}, {3}, ctx.device());
  nccl->broadcast(b, n - 1);
  EXPECT_EQ(b.to_vector<std::int32_t>(), (std::vector<std::int32_t>{n - 1, n - 1, n - 1}));
  Tensor in = Tensor::from_vector<std::int32_t>({r}, {1}, ctx.device());
  Tensor out = Tensor::empty({n}, DType::I32, ctx.device());
  nccl->allgather(in, out);
  std::vector<std::int32_t> ranks = out.to_vector<std::int32_t>();
  for (int q = 0; q < n; ++q)
    EXPECT_EQ(ranks[q], q);
  nccl->barrier();
}

// A rank that throws with a collective in flight that its peers never join (here: every rank
// but 0 throws before joining rank 0's allreduce) must not block in ncclCommDestroy: the
// communicator, destroyed while the exception unwinds, aborts instead. Before the fix each
// thrower sat in cudaStreamSynchronize/ncclCommDestroy until rank 0's watchdog fired.
TEST(NcclCommunicator, DestroyedWhileAnErrorUnwindsItAbortsWithoutWaitingForPeers) {
  if (!every_rank_has_its_own_gpu())
    GTEST_SKIP() << "needs one GPU per local rank; this node has " << cuda_device_count() << " for "
                 << session().local_size() << " ranks (no GPU on CPU-only machines)";
  if (world().size() < 2) GTEST_SKIP() << "needs a peer that does not join";
  ops::Context ctx(select_gpu(world(), "auto"));
  const auto start = std::chrono::steady_clock::now();
  std::string caught;
  try {
    auto nccl = make_nccl_communicator(world(), ctx, {.timeout_s = 120});
    // Tensor::zeros is host-only: a device tensor is made empty and filled on the stream.
    Tensor t = Tensor::empty({1 << 20}, DType::F32, ctx.device());
    ops::fill(ctx, t, 0.0f);
    // Rank 0 issues an allreduce that nobody else joins; everyone else "fails" at once.
    if (world().rank() == 0) nccl->allreduce_async(t, ReduceOp::Sum);
    LOCKSTEP_FAIL("rank ", world().rank(), " fails on purpose");
  } catch (const Error& e) {
    caught = e.message();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Only the planned failure counts: any other error (making the tensor, say) would skip the
  // very teardown this test is about and still arrive here quickly.
  EXPECT_NE(caught.find("fails on purpose"), std::string::npos)
      << "rank " << world().rank() << " failed before the teardown under test: " << caught;
  EXPECT_LT(seconds, 60.0) << "the communicator's teardown waited for peers (rank "
                           << world().rank() << ")";
  world().barrier();
}

// The watchdog must end the job when a collective outlives dist.timeout_s. On one GPU there is no
// peer to withhold, so the collective is held back on the device instead: the allreduce waits for
// the compute stream, which a host function holds for kStallSeconds, against a 1 s timeout. The
// watchdog ends the process (abort_job), so the stalled collective runs in a child process, an
// MPI singleton of its own; rank 0 spawns it and reads its output.
TEST(NcclCommunicator, WatchdogEndsTheJobWhenACollectiveOutlivesItsTimeout) {
  if (!every_rank_has_its_own_gpu())
    GTEST_SKIP() << "needs one GPU per local rank; this node has " << cuda_device_count() << " for "
                 << session().local_size() << " ranks (no GPU on CPU-only machines)";
  const auto child = test::run_test_in_child_on_rank_zero("InChildProcess.StalledCollective",
                                                          "stalled-collective", 45);
  if (!child) return;  // not rank 0
  EXPECT_TRUE(child->exited && !child->timed_out && child->exit_code == 1) << child->describe();
  for (const char* part : {"rank 0: NCCL collective #", "allreduce(", "not finished after",
                           "(dist.timeout_s = 1 s)", "aborting the job"})
    EXPECT_NE(child->output.find(part), std::string::npos)
        << "no \"" << part << "\" in the report; " << child->describe();
  EXPECT_EQ(child->output.find("the allreduce finished"), std::string::npos) << child->describe();
  EXPECT_EQ(child->output.find("could not set up"), std::string::npos) << child->describe();
}

// How long the child's compute stream is held: far past the 1 s timeout and the watchdog's
// 200 ms poll, and well inside the parent's 45 s limit, so the stall never depends on how fast
// the GPU is (the first version queued GEMMs, whose length varied with the GPU).
constexpr double kStallSeconds = 15.0;

// Runs on the CUDA driver's callback thread and holds the stream for kStallSeconds. It never
// hangs for good: if the watchdog failed to fire, the child would go on to report that.
void CUDART_CB hold_stream(void*) {
  std::this_thread::sleep_for(std::chrono::duration<double>(kStallSeconds));
}

TEST(InChildProcess, StalledCollective) {
  if (test::child_role() != "stalled-collective")
    GTEST_SKIP() << "runs only as the child of NcclCommunicator.WatchdogEndsTheJob... "
                    "(LOCKSTEP_TEST_CHILD=stalled-collective)";
  ASSERT_EQ(world().size(), 1) << "the child must be an MPI singleton";
  ops::Context ctx(Device::cuda(0));
  auto nccl = make_nccl_communicator(world(), ctx, {.timeout_s = 1});
  // Tensor::zeros is host-only: a device tensor is made empty and filled on the stream.
  Tensor t = Tensor::empty({1024}, DType::F32, ctx.device());
  ops::fill(ctx, t, 1.0f);
  ctx.synchronize();
  ASSERT_EQ(cudaLaunchHostFunc(ops::cuda::compute_stream(ctx), hold_stream, nullptr), cudaSuccess)
      << "could not set up the stall";
  WorkPtr work = nccl->allreduce_async(t, ReduceOp::Sum);
  // wait() only orders the compute stream after the collective (NcclWork::wait does not block
  // the host); the host blocks here, in the context's synchronise, while the watchdog (which
  // polls every 200 ms) finds the collective unfinished after 1 s and ends the process.
  work->wait();
  ctx.synchronize();
  ADD_FAILURE() << "the allreduce finished: the watchdog did not end the job within "
                << kStallSeconds << " s";
}

#else

TEST(NcclBootstrap, NeedsTheCudaBuild) {
  GTEST_SKIP() << "this build has no CUDA backend, so no NCCL communicator";
}

#endif

}  // namespace
}  // namespace lockstep::comm
