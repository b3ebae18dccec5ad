// The stream communicator (comm/stream_communicator.hpp) on the emulated GPU, at 2 and 4 ranks:
// its collectives agree with hand-computed values, Work::wait() orders the compute stream without
// blocking the host (NCCL's contract, which DdpEngine relies on), and its watchdog ends the job,
// naming the collective, when one outlives dist.timeout_s because the device never reaches it.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/comm/stream_communicator.hpp"
#include "lockstep/core/device.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/ops/backend.hpp"
#include "lockstep/ops/context.hpp"
#include "lockstep/ops/device_runtime.hpp"
#include "lockstep/ops/ops.hpp"
#include "support/child_process.hpp"
#include "support/mpi_env.hpp"

namespace lockstep::comm {
namespace {

using test::world;

std::unique_ptr<Communicator> over_world(ops::Context& ctx, double timeout_s = 0) {
  return make_stream_communicator(world(), std::shared_ptr<Communicator>(&world(), [](auto*) {}),
                                  ctx, timeout_s);
}

// Holds ctx's compute stream until the returned flag is set (a host function spinning on it).
std::shared_ptr<std::atomic<bool>> hold(ops::Context& ctx) {
  auto released = std::make_shared<std::atomic<bool>>(false);
  ops::DeviceRuntime& rt = *ctx.backend().runtime();
  rt.host_func(rt.compute_stream(), [released] {
    while (!released->load())
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  return released;
}

#define LOCKSTEP_SKIP_WITHOUT_EMU() \
  if (!emu_available()) GTEST_SKIP() << "LOCKSTEP_EMU_DEVICES=0: no emulated devices"

TEST(StreamCommunicator, CollectivesMatchHandComputedValues) {
  LOCKSTEP_SKIP_WITHOUT_EMU();
  ops::Context ctx(Device::emu(0));
  auto comm = over_world(ctx);
  EXPECT_EQ(comm->backend(), "stream(mpi)");
  EXPECT_EQ(comm->timeout_s(), world().timeout_s()) << "dist.timeout_s reaches it";
  const int n = world().size(), r = world().rank();
  // allreduce: rank r contributes (r + 1) * (i + 1); the sum is n(n+1)/2 * (i + 1).
  std::vector<float> mine(1000);
  for (int i = 0; i < 1000; ++i)
    mine[i] = static_cast<float>((r + 1) * (i + 1));
  Tensor t = Tensor::from_vector(mine, {1000}, ctx.device());
  comm->allreduce_async(t, ReduceOp::Sum)->wait();
  std::vector<float> got = t.to_vector<float>();
  for (int i = 0; i < 1000; ++i)
    ASSERT_EQ(got[i], static_cast<float>(n * (n + 1) / 2 * (i + 1))) << "element " << i;
  Tensor m = Tensor::from_vector<std::int32_t>({r, -r}, {2}, ctx.device());
  comm->allreduce(m, ReduceOp::Max);
  EXPECT_EQ(m.to_vector<std::int32_t>(), (std::vector<std::int32_t>{n - 1, 0}));
  // broadcast from the last rank, allgather of ranks, reduce-scatter of ones.
  Tensor b = Tensor::from_vector<std::int32_t>({r, r, r}, {3}, ctx.device());
  comm->broadcast(b, n - 1);
  EXPECT_EQ(b.to_vector<std::int32_t>(), (std::vector<std::int32_t>{n - 1, n - 1, n - 1}));
  Tensor in = Tensor::from_vector<std::int32_t>({r}, {1}, ctx.device());
  Tensor out = Tensor::empty({n}, DType::I32, ctx.device());
  comm->allgather(in, out);
  std::vector<std::int32_t> ranks = out.to_vector<std::int32_t>();
  for (int q = 0; q < n; ++q)
    EXPECT_EQ(ranks[q], q);
  Tensor all = Tensor::from_vector(std::vector<float>(2 * n, 1.0f), {2 * n}, ctx.device());
  Tensor block = Tensor::empty({2}, DType::F32, ctx.device());
  comm->reduce_scatter(all, block, ReduceOp::Sum);
  EXPECT_EQ(block.to_vector<float>(), (std::vector<float>{float(n), float(n)}));
  comm->barrier();
}

// DdpEngine issues each bucket's allreduce from the backward pass and waits for all of them
// before the optimizer: the waits must order the device, not stop the host, or nothing overlaps.
// The compute stream is held while the host issues an allreduce, waits for it, and queues a
// scale after it: all of that returns while the stream is still held, and the scale then sees the
// reduced values.
TEST(StreamCommunicator, WaitOrdersTheComputeStreamWithoutBlockingTheHost) {
  LOCKSTEP_SKIP_WITHOUT_EMU();
  ops::Context ctx(Device::emu(0));
  auto comm = over_world(ctx);
  const int n = world().size();
  Tensor t = Tensor::from_vector(std::vector<float>(64, 1.0f), {64}, ctx.device());
  auto released = hold(ctx);
  std::thread releaser([released] {
    std::this_thread::sleep_for(std::chrono::seconds(2));
    released->store(true);
  });
  comm->allreduce_async(t, ReduceOp::Sum)->wait();
  ops::scale(ctx, t, 0.5f);
  const bool host_went_on = !released->load();
  releaser.join();
  EXPECT_TRUE(host_went_on) << "Work::wait() or the allreduce blocked the host on rank "
                            << world().rank();
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>(64, 0.5f * static_cast<float>(n)));
}

// A group (NCCL's ncclGroupStart/End, which ZeRO-1's allgathers use) issues its collectives as
// one: they run after the compute stream's work queued before the group, group_end() does not block
// the host, a Work may not be waited on inside its group, and groups nest.
TEST(StreamCommunicator, AGroupIssuesItsCollectivesAsOneAfterTheComputeStreamsWork) {
  LOCKSTEP_SKIP_WITHOUT_EMU();
  ops::Context ctx(Device::emu(0));
  auto comm = over_world(ctx);
  const int n = world().size(), r = world().rank();
  std::vector<Tensor> t;
  for (int k = 0; k < 3; ++k)
    t.push_back(Tensor::empty({100 + 50 * k}, DType::F32, ctx.device()));
  auto released = hold(ctx);
  std::thread releaser([released] {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    released->store(true);
  });
  for (int k = 0; k < 3; ++k)
    ops::fill(ctx, t[k], static_cast<float>((r + 1) * (k + 1)));  // queued behind the hold
  std::vector<WorkPtr> work;
  {
    Group outer(*comm);
    work.push_back(comm->allreduce_async(t[0], ReduceOp::Sum));
    {
      Group inner(*comm);  // nested: issued by the outer group's end
      work.push_back(comm->allreduce_async(t[1], ReduceOp::Sum));
    }
    EXPECT_THROW(work[1]->wait(), Error) << "waited on inside its group";
    work.push_back(comm->allreduce_async(t[2], ReduceOp::Max));
  }
  for (auto& w : work)
    w->wait();
  const bool host_went_on = !released->load();
  releaser.join();
  EXPECT_TRUE(host_went_on) << "the group or its waits blocked the host on rank " << r;
  const float sum = static_cast<float>(n * (n + 1) / 2);
  EXPECT_EQ(t[0].to_vector<float>(), std::vector<float>(100, sum));
  EXPECT_EQ(t[1].to_vector<float>(), std::vector<float>(150, 2 * sum));
  EXPECT_EQ(t[2].to_vector<float>(), std::vector<float>(200, static_cast<float>(3 * n)));
  EXPECT_THROW(comm->group_end(), Error) << "group_end() without group_start()";
  comm->barrier();
}

// abort() (ncclCommAbort's part) ends a collective a peer never joins: its Work throws naming the
// reason, the communication stream drains (the communicator goes without hanging), and later
// collectives are refused. MPI cannot cancel the host half, so the peers join it late (after 2 s,
// rank 0 aborts after 0.3 s), directly on the MPI communicator, to leave the job's MPI state clean
// for the next test; no collective may come between, or the ranks' MPI orders would differ.
TEST(StreamCommunicator, AbortEndsACollectiveThatAPeerNeverJoins) {
  LOCKSTEP_SKIP_WITHOUT_EMU();
  if (world().size() < 2) GTEST_SKIP() << "needs a peer";
  const int r = world().rank();
  Tensor host = Tensor::from_vector(std::vector<float>(64, 1.0f), {64});
  if (r == 0) {
    ops::Context ctx(Device::emu(0));
    auto comm = over_world(ctx);
    Tensor t = host.to(ctx.device());
    WorkPtr w = comm->allreduce_async(t, ReduceOp::Sum);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_FALSE(w->test()) << "no peer joined, yet the allreduce finished";
    comm->abort("a test's peers are elsewhere");
    EXPECT_TRUE(comm->aborted());
    std::string error;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    try {
      while (!w->test() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } catch (const Error& e) {
      error = e.what();
    }
    EXPECT_NE(error.find("was aborted: a test's peers are elsewhere"), std::string::npos)
        << "the aborted collective's Work said: \"" << error << "\"";
    try {
      comm->allreduce_async(t, ReduceOp::Sum);
      ADD_FAILURE() << "a collective after abort() was issued";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("refused: the communicator was aborted"),
                std::string::npos)
          << e.what();
    }
    comm.reset();  // drains and goes, although the host half is still in flight
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(2));
    world().allreduce(host, ReduceOp::Sum);  // the half rank 0 issued before aborting
  }
  world().barrier();
}

// The watchdog ends the process, so the stalled collective runs in a child process, an MPI
// singleton; rank 0 spawns it and reads its output.
TEST(StreamCommunicator, WatchdogEndsTheJobWhenTheDeviceNeverReachesACollective) {
  LOCKSTEP_SKIP_WITHOUT_EMU();
  const auto child = test::run_test_in_child_on_rank_zero("InChildProcess.StalledStreamCollective",
                                                          "stalled-stream-collective", 45);
  if (!child) return;  // not rank 0
  EXPECT_TRUE(child->exited && !child->timed_out && child->exit_code == 1) << child->describe();
  for (const char* part : {"rank 0: collective #1 allreduce(", "not finished after",
                           "(dist.timeout_s = 1 s)", "aborting the job"})
    EXPECT_NE(child->output.find(part), std::string::npos)
        << "no \"" << part << "\" in the report; " << child->describe();
  EXPECT_EQ(child->output.find("the host outlived the watchdog"), std::string::npos)
      << child->describe();
}

TEST(InChildProcess, StalledStreamCollective) {
  if (test::child_role() != "stalled-stream-collective")
    GTEST_SKIP() << "runs only as the child of StreamCommunicator.WatchdogEndsTheJob... "
                    "(LOCKSTEP_TEST_CHILD=stalled-stream-collective)";
  ASSERT_EQ(world().size(), 1) << "the child must be an MPI singleton";
  ops::Context ctx(Device::emu(0));
  auto comm = over_world(ctx, 1.0);
  Tensor t = Tensor::empty({1024}, DType::F32, ctx.device());
  ops::fill(ctx, t, 1.0f);
  auto released = hold(ctx);  // never released: the device never reaches the allreduce
  comm->allreduce_async(t, ReduceOp::Sum)->wait();
  std::this_thread::sleep_for(std::chrono::seconds(20));  // the watchdog ends the process here
  ADD_FAILURE() << "the host outlived the watchdog";
  released->store(true);
}

}  // namespace
}  // namespace lockstep::comm
