// A rank that throws, or stops making progress, must end the whole job: run test_mpi's demos
// under mpiexec and check that the job ends, fails, and says which rank and why. (A hang shows
// up as the `timeout` wrapper's exit code 124.)
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

namespace {

struct JobResult {
  int code = -1;  // exit status; 124 when `timeout` had to end it
  double seconds = 0;
  std::string output;
};

// Runs test_mpi under mpiexec with `np` ranks and `flag`, ended by `timeout` after limit_s.
std::optional<JobResult> run_test_mpi(int np, const std::string& flag, int limit_s) {
  const char* build = std::getenv("LOCKSTEP_BUILD_DIR");
  if (!build) return std::nullopt;
  const std::string binary = std::string(build) + "/tests/test_mpi";
  if (!std::filesystem::exists(binary)) return std::nullopt;
  const std::string command =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -k 5 " +
      std::to_string(limit_s) + " mpiexec --oversubscribe --bind-to none -np " +
      std::to_string(np) + " " + binary + " " + flag + " 2>&1";
  const auto start = std::chrono::steady_clock::now();
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return std::nullopt;
  JobResult result;
  char buffer[4096];
  while (std::size_t n = std::fread(buffer, 1, sizeof buffer, pipe))
    result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string this_host() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return host;
}

TEST(AbortJob, EndsEveryRankWhenOneThrows) {
  auto job = run_test_mpi(2, "--lockstep-abort-demo", 60);
  if (!job) GTEST_SKIP() << "LOCKSTEP_BUILD_DIR/tests/test_mpi not available (run through ctest)";
  EXPECT_NE(job->code, 0) << job->output;
  EXPECT_NE(job->code, 124) << "the job hung until timeout killed it:\n" << job->output;
  EXPECT_TRUE(has(job->output, "rank 1: error: abort demo: rank 1 failed on purpose"))
      << job->output;
}

// The demo's waiting ranks time out after 5 s and ask for 2 s; anything much slower than that
// (plus MPI start-up on a loaded machine) is the hang the timeout exists to prevent.
constexpr int kHungJobLimitSeconds = 40;

TEST(HungRank, AnIdleRankIsNamedWithWhereItStandsAndTheJobEnds) {
  auto job = run_test_mpi(3, "--lockstep-timeout-demo=idle", kHungJobLimitSeconds);
  if (!job) GTEST_SKIP() << "LOCKSTEP_BUILD_DIR/tests/test_mpi not available (run through ctest)";
  EXPECT_NE(job->code, 0) << job->output;
  EXPECT_NE(job->code, 124) << "the job hung until timeout killed it:\n" << job->output;
  // Both waiting ranks report, each naming the collective (#4: three came before) and step 7;
  // rank 1, which arrived 2 s late, when rank 0's question reaches it, before the job ends.
  EXPECT_TRUE(has(job->output,
                  "rank 0: error: collective #4 allreduce(f32[1000] on cpu, sum) at "
                  "training step 7 did not complete within dist.timeout_s = 5 s; "
                  "rank 2 did not arrive"))
      << job->output;
  EXPECT_TRUE(has(job->output,
                  "rank 1: error: collective #4 allreduce(f32[1000] on cpu, sum) at "
                  "training step 7 did not complete within dist.timeout_s = 5 s "
                  "(rank 0's expired first; this rank waited"))
      << job->output;
  EXPECT_TRUE(has(job->output, "rank 2 did not arrive")) << job->output;
  // Every peer line names where the rank runs; the last line lists the suspect host.
  const std::string host = this_host();
  EXPECT_TRUE(has(job->output, "rank 2 (" + host + ", pid ")) << job->output;
  EXPECT_TRUE(has(job->output, "): not in a collective: finished #3 barrier()")) << job->output;
  EXPECT_TRUE(has(job->output, "rank 0:   suspect hosts: " + host + " (of rank 2)\n"))
      << job->output;
  EXPECT_TRUE(has(job->output, "waiting in it too: rank")) << job->output;
  // The idle rank says so itself.
  EXPECT_TRUE(has(job->output,
                  "timed out in collective #4 allreduce(f32[1000] on cpu, sum) (at "
                  "training step 7) waiting for this rank, which is not in a "
                  "collective"))
      << job->output;
}

TEST(HungRank, AStoppedRankIsNamedAsNotAnsweringAndTheJobEnds) {
  auto job = run_test_mpi(2, "--lockstep-timeout-demo=stopped", kHungJobLimitSeconds);
  if (!job) GTEST_SKIP() << "LOCKSTEP_BUILD_DIR/tests/test_mpi not available (run through ctest)";
  EXPECT_NE(job->code, 0) << job->output;
  EXPECT_NE(job->code, 124) << "the job hung until timeout killed it:\n" << job->output;
  EXPECT_TRUE(has(job->output,
                  "rank 0: error: collective #4 allreduce(f32[1000] on cpu, sum) at "
                  "training step 7 did not complete within dist.timeout_s = 5 s; "
                  "rank 1 did not arrive"))
      << job->output;
  EXPECT_TRUE(has(job->output, "rank 0:   rank 1 (" + this_host() + ", pid ")) << job->output;
  EXPECT_TRUE(has(job->output, "): no answer within 2.0 s")) << job->output;
  EXPECT_TRUE(has(job->output, "rank 0:   suspect hosts: " + this_host() + " (of rank 1)\n"))
      << job->output;
}

}  // namespace
