// Runs one test of this MPI test binary in a child process: a fresh MPI singleton (the launcher's
// per-job variables removed from its environment), for behaviour that ends the process, such as
// abort_job or a watchdog that gives up on a collective. The child runs only the tests matching
// `gtest_filter`, with LOCKSTEP_TEST_CHILD set to `role`; a test meant only for children skips
// unless child_role() names it.
#pragma once

#include <optional>
#include <string>

namespace lockstep::test {

struct ChildResult {
  bool exited = false;           // returned from main or called exit/_Exit
  int exit_code = -1;            // when exited
  int signal = 0;                // the signal that ended it, when not exited
  bool timed_out = false;        // killed (SIGKILL) after the timeout
  double seconds = 0;            // from spawn to end
  std::string output;            // stdout and stderr, interleaved
  std::string describe() const;  // "exit code 1 after 2.3 s" and the output
};

ChildResult run_test_in_child(const std::string& gtest_filter, const std::string& role,
                              double timeout_s);

// For a test of the MPI binary: rank 0 runs the child while the other ranks wait for it at a
// barrier of world(). The result on rank 0, nothing on the others.
std::optional<ChildResult> run_test_in_child_on_rank_zero(const std::string& gtest_filter,
                                                          const std::string& role,
                                                          double timeout_s);

// LOCKSTEP_TEST_CHILD in this process ("" in the parent).
std::string child_role();

}  // namespace lockstep::test
