// test_mpi's entry: MPI up through MpiSession, RUN_ALL_TESTS on every rank, the verdict
// combined so every rank exits non-zero when any rank failed. Only rank 0 prints gtest's usual
// output; other ranks print their failures prefixed with their rank. A watchdog ends the job
// when the run stalls (one rank stuck in a collective the others skipped) instead of waiting
// for CTest's timeout.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/comm/mpi_communicator.hpp"
#include "lockstep/core/error.hpp"
#include "support/mpi_env.hpp"

namespace lockstep::test {
namespace {
comm::Communicator* g_world = nullptr;
const comm::MpiSession* g_session = nullptr;

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "rank %d: %s:%d: failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
  }

 private:
  int rank_;
};

// Ends the job if the tests take longer than `seconds`, naming the test that was running.
class Watchdog : public ::testing::EmptyTestEventListener {
 public:
  explicit Watchdog(int seconds) : thread_([this, seconds] { run(seconds); }) {}
  ~Watchdog() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void OnTestStart(const ::testing::TestInfo& info) override {
    std::lock_guard<std::mutex> lock(mutex_);
    current_ = str(info.test_suite_name(), ".", info.name());
  }

 private:
  void run(int seconds) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, std::chrono::seconds(seconds), [&] { return done_; })) {
      comm::abort_job(str("test_mpi watchdog: no result after ", seconds, " s, during ", current_,
                          " (a rank is probably stuck in a collective)"));
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::string current_ = "(start-up)";
  std::thread thread_;
};

}  // namespace

comm::Communicator& world() {
  return *g_world;
}
const comm::MpiSession& session() {
  return *g_session;
}

}  // namespace lockstep::test

int main(int argc, char** argv) {
  using namespace lockstep;
  comm::MpiSession session(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  return comm::run_or_abort([&] {
    // --lockstep-abort-demo: rank 1 throws while the others wait in a barrier; the job must end
    // (used by test_comm's AbortJobEndsEveryRankWhenOneThrows).
    for (int i = 1; i < argc; ++i) {
      if (std::string(argv[i]) == "--lockstep-abort-demo") {
        auto comm = comm::make_mpi_communicator(session);
        if (session.rank() == 1) LOCKSTEP_FAIL("abort demo: rank 1 failed on purpose");
        comm->barrier();
        return 0;
      }
      // --lockstep-timeout-demo=idle|stopped: after three collectives at step 7, the last rank
      // stays away from the fourth (idle: it sleeps, its communication thread alive; stopped: it
      // SIGSTOPs itself) while the others wait in it with a 5 s timeout, long enough for the
      // first three on a loaded machine. The job must end with the reports (test_comm's HungRank).
      const std::string arg = argv[i];
      if (arg.rfind("--lockstep-timeout-demo=", 0) == 0) {
        const std::string mode = arg.substr(arg.find('=') + 1);
        auto comm = comm::make_mpi_communicator(session, {.timeout_s = 5});
        comm->set_step(7);
        comm->barrier();
        std::vector<double> v{1.0};
        comm->allreduce(v, comm::ReduceOp::Sum);
        comm->barrier();
        if (session.rank() == session.size() - 1) {
          if (mode == "stopped") raise(SIGSTOP);
          std::this_thread::sleep_for(std::chrono::seconds(60));
        }
        // With 3 ranks or more, rank 1 arrives 2 s late: rank 0's timeout expires first and its
        // question must make rank 1 report too, before rank 0 ends the job.
        if (session.rank() == 1 && session.size() >= 3)
          std::this_thread::sleep_for(std::chrono::seconds(2));
        Tensor t = Tensor::zeros({1000});
        comm->allreduce(t);
        return 0;
      }
    }
    auto comm = comm::make_mpi_communicator(session);
    test::g_world = comm.get();
    test::g_session = &session;

    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    if (session.rank() != 0) {
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new test::RankFailurePrinter(session.rank()));
    }
    const char* limit = std::getenv("LOCKSTEP_TEST_WATCHDOG_S");
    auto* watchdog = new test::Watchdog(limit ? std::atoi(limit) : 300);
    listeners.Append(watchdog);  // gtest owns it from here

    const int local_rc = RUN_ALL_TESTS();
    std::vector<std::int64_t> failed{local_rc != 0 ? 1 : 0};
    comm->allreduce(failed, comm::ReduceOp::Max);
    delete listeners.Release(watchdog);
    test::g_world = nullptr;
    comm.reset();
    if (failed[0] != 0 && session.rank() == 0) {
      std::fprintf(stderr, "test_mpi: failures on at least one rank (see 'rank R:' lines)\n");
    }
    return failed[0] != 0 ? 1 : 0;
  });
}
