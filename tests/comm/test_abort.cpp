// A rank that throws must end the whole job: run test_mpi's abort demo under mpiexec, where
// rank 1 throws while rank 0 waits in a barrier, and check that the job ends, fails and names
// the rank. (A hang shows up as the 60 s timeout's exit code.)
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace {

TEST(AbortJob, EndsEveryRankWhenOneThrows) {
  const char* build = std::getenv("LOCKSTEP_BUILD_DIR");
  if (!build) GTEST_SKIP() << "LOCKSTEP_BUILD_DIR not set (run through ctest)";
  const std::string binary = std::string(build) + "/tests/test_mpi";
  if (!std::filesystem::exists(binary)) GTEST_SKIP() << binary << " not built";
  const std::string command =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 60 mpiexec "
      "--oversubscribe --bind-to none -np 2 " +
      binary + " --lockstep-abort-demo 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  while (std::size_t n = std::fread(buffer, 1, sizeof buffer, pipe))
    output.append(buffer, n);
  const int status = pclose(pipe);
  ASSERT_TRUE(WIFEXITED(status)) << output;
  const int code = WEXITSTATUS(status);
  EXPECT_NE(code, 0) << output;
  EXPECT_NE(code, 124) << "the job hung until timeout killed it:\n" << output;
  EXPECT_NE(output.find("rank 1: error: abort demo: rank 1 failed on purpose"), std::string::npos)
      << output;
}

}  // namespace
