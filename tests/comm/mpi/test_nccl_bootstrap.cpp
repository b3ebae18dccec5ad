// NCCL bootstrap over MPI: rank 0's unique id reaches every rank unchanged (runs without a GPU:
// ncclGetUniqueId needs none), the rank-to-GPU mapping refuses more local ranks than GPUs, and
// on GPU machines the NCCL communicator's collectives agree with the MPI communicator's.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lockstep/core/device.hpp"
#include "lockstep/core/error.hpp"
#include "support/mpi_env.hpp"
#ifdef LOCKSTEP_HAVE_CUDA
#include "lockstep/comm/nccl_communicator.hpp"
#include "lockstep/ops/context.hpp"
#include "lockstep/ops/ops.hpp"
#endif

namespace lockstep::comm {
namespace {

using test::session;
using test::world;

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
    Device d = nccl_device_for(world());
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

// Needs one GPU per local rank; the result is checked against values every rank can compute.
TEST(NcclCommunicator, CollectivesMatchHandComputedValues) {
  // Every rank must take the same branch, so decide on the minimum over ranks.
  std::vector<std::int64_t> enough{cuda_device_count() >= session().local_size() ? 1 : 0};
  world().allreduce(enough, ReduceOp::Min);
  if (enough[0] == 0)
    GTEST_SKIP() << "needs one GPU per local rank; this node has " << cuda_device_count() << " for "
                 << session().local_size() << " ranks (no GPU on CPU-only machines)";
  ops::Context ctx(nccl_device_for(world()));
  auto nccl = make_nccl_communicator(world(), ctx);
  EXPECT_EQ(nccl->backend(), "nccl");
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

#else

TEST(NcclBootstrap, NeedsTheCudaBuild) {
  GTEST_SKIP() << "this build has no CUDA backend, so no NCCL communicator";
}

#endif

}  // namespace
}  // namespace lockstep::comm
