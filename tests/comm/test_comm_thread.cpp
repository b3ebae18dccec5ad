// CommThread, the FIFO executor behind the MPI communicator, tested without MPI.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/comm_thread.hpp"
#include "lockstep/core/error.hpp"

namespace lockstep::comm::detail {
namespace {

TEST(CommThread, RunsJobsInSubmissionOrderOnOneThread) {
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  std::vector<WorkPtr> works;
  {
    CommThread thread;
    for (int k = 0; k < 500; ++k) {
      works.push_back(thread.submit("job", [&, k] {
        order.push_back(k);  // only the comm thread touches these
        threads.push_back(std::this_thread::get_id());
      }));
    }
    works.back()->wait();
    for (auto& w : works)
      EXPECT_TRUE(w->test());
  }
  ASSERT_EQ(order.size(), 500u);
  for (int k = 0; k < 500; ++k)
    EXPECT_EQ(order[k], k);
  for (auto id : threads)
    EXPECT_EQ(id, threads[0]);
  EXPECT_NE(threads[0], std::this_thread::get_id());
}

TEST(CommThread, TestIsFalseUntilTheJobHasRun) {
  CommThread thread;
  std::mutex gate;
  std::unique_lock<std::mutex> hold(gate);
  WorkPtr blocked = thread.submit("blocked", [&] { std::lock_guard<std::mutex> wait(gate); });
  WorkPtr behind = thread.submit("behind", [] {});
  EXPECT_FALSE(blocked->test());
  EXPECT_FALSE(behind->test());
  EXPECT_FALSE(thread.idle());
  hold.unlock();
  behind->wait();
  EXPECT_TRUE(blocked->test());
  EXPECT_TRUE(thread.idle());
}

TEST(CommThread, FailureIsRethrownByWaitAndTestAndFailsTheJobsBehindIt) {
  CommThread thread;
  std::atomic<bool> later_ran{false};
  WorkPtr ok = thread.submit("first", [] {});
  WorkPtr bad = thread.submit("allreduce(x)", [] { LOCKSTEP_FAIL("transport broke"); });
  WorkPtr later = thread.submit("broadcast(y)", [&] { later_ran = true; });
  EXPECT_NO_THROW(ok->wait());
  EXPECT_THROW(bad->wait(), Error);
  EXPECT_THROW(bad->test(), Error);
  try {
    later->wait();
    ADD_FAILURE() << "the job behind a failure ran";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("broadcast(y) not run"), std::string::npos) << message;
    EXPECT_NE(message.find("allreduce(x): transport broke"), std::string::npos) << message;
  }
  EXPECT_FALSE(later_ran);
}

TEST(CommThread, DestructorFinishesQueuedJobs) {
  std::atomic<int> ran{0};
  {
    CommThread thread;
    for (int k = 0; k < 100; ++k)
      thread.submit("job", [&] { ++ran; });
  }
  EXPECT_EQ(ran, 100);
}

}  // namespace
}  // namespace lockstep::comm::detail
