#include "support/child_process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "lockstep/core/error.hpp"
#include "support/mpi_env.hpp"
#include "support/temp_dir.hpp"

extern char** environ;

namespace lockstep::test {
namespace {

bool starts_with(const char* s, const char* prefix) {
  return std::strncmp(s, prefix, std::strlen(prefix)) == 0;
}

// What mpirun (ORTE, PMIx) hands its ranks to join the job. Without them MPI_Init makes the child
// a singleton instead of a second process claiming the parent's rank. Users' own OMPI_MCA_
// settings stay, except those that point at the job (and ess_singleton_isolated, which the child
// gets set to 1).
bool names_the_launchers_job(const char* entry) {
  if (starts_with(entry, "PMIX_") || starts_with(entry, "PMI_")) return true;
  if (!starts_with(entry, "OMPI_")) return false;
  if (starts_with(entry, "OMPI_ALLOW_RUN_AS_ROOT")) return false;
  if (!starts_with(entry, "OMPI_MCA_")) return true;  // OMPI_COMM_WORLD_RANK, OMPI_COMMAND, ...
  for (const char* job : {"OMPI_MCA_orte_", "OMPI_MCA_ess=", "OMPI_MCA_ess_base_",
                          "OMPI_MCA_pmix=", "OMPI_MCA_initial_wdir=",
                          "OMPI_MCA_shmem_RUNTIME_QUERY_hint=", "OMPI_MCA_ess_singleton_isolated="})
    if (starts_with(entry, job)) return true;
  return false;
}

}  // namespace

std::string child_role() {
  const char* role = std::getenv("LOCKSTEP_TEST_CHILD");
  return role ? role : "";
}

std::string ChildResult::describe() const {
  std::ostringstream out;
  if (timed_out) {
    out << "killed after its timeout of " << seconds << " s";
  } else if (exited) {
    out << "exit code " << exit_code << " after " << seconds << " s";
  } else {
    out << "signal " << signal << " (" << strsignal(signal) << ") after " << seconds << " s";
  }
  out << "; its output:\n" << output;
  return out.str();
}

ChildResult run_test_in_child(const std::string& gtest_filter, const std::string& role,
                              double timeout_s) {
  TempDir dir;
  const std::string log = dir / "output.txt";
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e)
    if (!names_the_launchers_job(*e) && !starts_with(*e, "LOCKSTEP_TEST_CHILD=") &&
        !starts_with(*e, "GTEST_OUTPUT="))
      env.emplace_back(*e);
  env.push_back("LOCKSTEP_TEST_CHILD=" + role);
  env.push_back("OMPI_MCA_ess_singleton_isolated=1");  // no orted for a singleton of one test
  const std::string exe = "/proc/self/exe";
  std::vector<std::string> args = {exe, "--gtest_filter=" + gtest_filter, "--gtest_color=no"};
  std::vector<char*> argv, envp;
  for (std::string& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : env)
    envp.push_back(e.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  LOCKSTEP_CHECK(rc == 0, "posix_spawn of ", exe, ": ", std::strerror(rc));

  ChildResult result;
  int status = 0;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    LOCKSTEP_CHECK(done >= 0, "waitpid(", pid, "): ", std::strerror(errno));
    if (done == pid) break;
    if (elapsed() > timeout_s) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      result.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  result.seconds = elapsed();
  if (WIFEXITED(status)) {
    result.exited = true;
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.signal = WTERMSIG(status);
  }
  std::ifstream in(log);
  std::ostringstream text;
  text << in.rdbuf();
  result.output = text.str();
  return result;
}

std::optional<ChildResult> run_test_in_child_on_rank_zero(const std::string& gtest_filter,
                                                          const std::string& role,
                                                          double timeout_s) {
  std::optional<ChildResult> result;
  if (world().rank() == 0) result = run_test_in_child(gtest_filter, role, timeout_s);
  world().barrier();
  return result;
}

}  // namespace lockstep::test
