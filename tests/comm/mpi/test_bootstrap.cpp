// Who-am-I from MPI (rank, size, local rank from MPI_Comm_split_type) against what the launcher
// says, and MPI errors turned into lockstep::Error.
#include <gtest/gtest.h>

#include <string>

#include "comm/mpi_check.hpp"
#include "lockstep/comm/bootstrap.hpp"
#include "lockstep/comm/mpi_communicator.hpp"
#include "lockstep/core/error.hpp"
#include "support/mpi_env.hpp"

namespace lockstep::comm {
namespace {

using test::session;
using test::world;

TEST(MpiBootstrap, CommunicatorAgreesWithSession) {
  EXPECT_EQ(world().rank(), session().rank());
  EXPECT_EQ(world().size(), session().size());
  EXPECT_EQ(world().local_rank(), session().local_rank());
  EXPECT_EQ(world().local_size(), session().local_size());
  EXPECT_EQ(world().backend(), "mpi");
  EXPECT_GE(session().thread_level(), ThreadLevel::Serialized);
}

TEST(MpiBootstrap, RanksAreDistinctAndCoverTheWorld) {
  std::vector<std::string> ranks = world().allgather(std::to_string(world().rank()));
  for (int q = 0; q < world().size(); ++q)
    EXPECT_EQ(ranks[q], std::to_string(q));
}

TEST(MpiBootstrap, LocalRankAndSizeMatchTheLauncher) {
  const LaunchInfo& launch = session().launch();
  if (auto rank = launch.get_int("OMPI_COMM_WORLD_RANK")) {
    EXPECT_EQ(session().rank(), *rank);
    EXPECT_EQ(session().size(), launch.get_int("OMPI_COMM_WORLD_SIZE").value_or(-1));
    EXPECT_EQ(session().local_rank(), launch.get_int("OMPI_COMM_WORLD_LOCAL_RANK").value_or(-1));
    EXPECT_EQ(session().local_size(), launch.get_int("OMPI_COMM_WORLD_LOCAL_SIZE").value_or(-1));
  } else if (launch.launcher == "srun") {
    EXPECT_EQ(session().rank(), launch.get_int("SLURM_PROCID").value_or(-1));
    EXPECT_EQ(session().local_rank(), launch.get_int("SLURM_LOCALID").value_or(-1));
  } else {
    GTEST_SKIP() << "launcher " << launch.launcher << " sets no rank variables to compare with";
  }
  // Local ranks of one node are 0..local_size-1: count how many ranks share each host.
  std::vector<std::string> hosts = world().allgather(session().hostname());
  int same_host = 0;
  for (const auto& h : hosts)
    same_host += h == session().hostname() ? 1 : 0;
  EXPECT_EQ(session().local_size(), same_host);
  EXPECT_LT(session().local_rank(), session().local_size());
}

TEST(MpiBootstrap, DescribeNamesRankAndLauncher) {
  const std::string text = session().describe();
  EXPECT_NE(text.find("rank " + std::to_string(session().rank()) + "/"), std::string::npos) << text;
  EXPECT_NE(text.find("launcher="), std::string::npos) << text;
}

TEST(MpiBootstrap, FailingMpiCallBecomesErrorWithMpiText) {
  // A bad root is caught by MPI's own argument check, on this rank only, with no communication.
  // On the world communicator's thread: it polls MPI even when idle, and MPI_THREAD_SERIALIZED
  // forbids a second thread in MPI meanwhile.
  std::string message;
  run_on_mpi_thread(world(), [&] {
    MPI_Comm comm;
    LOCKSTEP_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
    LOCKSTEP_CHECK_MPI(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    int value = 0;
    try {
      LOCKSTEP_CHECK_MPI(MPI_Bcast(&value, 1, MPI_INT, -7, comm));
    } catch (const Error& e) {
      message = e.what();
    }
    MPI_Comm_free(&comm);
  });
  ASSERT_FALSE(message.empty()) << "no error";
  EXPECT_NE(message.find("MPI_Bcast(&value, 1, MPI_INT, -7, comm) failed"), std::string::npos)
      << message;
  EXPECT_NE(message.find("MPI_ERR_ROOT"), std::string::npos) << message;
  EXPECT_NE(message.find("rank " + std::to_string(session().rank()) + ":"), std::string::npos)
      << message;
}

TEST(MpiBootstrap, RunOnMpiThreadRethrowsAndLeavesTheCommunicatorUsable) {
  EXPECT_THROW(run_on_mpi_thread(world(), [] { LOCKSTEP_FAIL("on purpose"); }), Error);
  std::vector<double> one{1.0};
  world().allreduce(one, ReduceOp::Sum);
  EXPECT_EQ(one[0], world().size());
}

TEST(MpiBootstrap, SecondMpiCommunicatorNeedsThreadMultiple) {
  if (session().thread_level() == ThreadLevel::Multiple) {
    GTEST_SKIP() << "session runs with MPI_THREAD_MULTIPLE, where a second one is allowed";
  }
  EXPECT_THROW(make_mpi_communicator(session()), Error);
}

}  // namespace
}  // namespace lockstep::comm
