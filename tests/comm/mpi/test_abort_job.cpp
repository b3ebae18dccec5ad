// abort_job, the one way a rank ends a job on an error it cannot unwind from (watchdogs, errors
// escaping main): run in a child process, since it ends the process. A job of one rank (here an
// MPI singleton) must print "rank 0: <message>" and exit with the given code without MPI_Abort,
// whose launcher noise would bury the message. Also checks tests/support/child_process, which
// the GPU watchdog test builds on, on every machine.
#include <gtest/gtest.h>

#include <string>

#include "lockstep/comm/bootstrap.hpp"
#include "support/child_process.hpp"
#include "support/mpi_env.hpp"

namespace lockstep::comm {
namespace {

using test::world;

TEST(AbortJob, InAJobOfOneRankPrintsTheRankAndMessageAndExitsWithItsCode) {
  const auto child =
      test::run_test_in_child_on_rank_zero("InChildProcess.AbortJob", "abort-job", 60);
  if (!child) return;  // not rank 0
  EXPECT_TRUE(child->exited && !child->timed_out) << child->describe();
  EXPECT_EQ(child->exit_code, 7) << child->describe();
  EXPECT_NE(child->output.find("rank 0: test: ending the job on purpose\n"), std::string::npos)
      << child->describe();
  EXPECT_EQ(child->output.find("MPI_ABORT"), std::string::npos) << child->describe();
  EXPECT_EQ(child->output.find("after abort_job"), std::string::npos) << child->describe();
}

TEST(InChildProcess, AbortJob) {
  if (test::child_role() != "abort-job")
    GTEST_SKIP() << "runs only as the child of AbortJob.* (LOCKSTEP_TEST_CHILD=abort-job)";
  EXPECT_EQ(world().size(), 1)
      << "the child must be an MPI singleton, not a rank of the parent's job";
  abort_job("test: ending the job on purpose", 7);
  ADD_FAILURE() << "after abort_job";  // unreachable: abort_job is [[noreturn]]
}

}  // namespace
}  // namespace lockstep::comm
