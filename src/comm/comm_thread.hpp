// CommThread: one worker thread running submitted jobs strictly in submission (FIFO) order,
// each with a Work handle. It is how the MPI backend keeps every MPI call on one thread (so
// MPI_THREAD_SERIALIZED suffices) and in the same order on every rank. After a job fails, the
// jobs queued behind it fail too without running: a collective that failed on one rank leaves
// the ranks out of step, so later collectives could only hang or mix up data. While idle it runs
// an optional periodic task (the MPI backend answers peers' "where are you?" queries with it).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "lockstep/comm/communicator.hpp"

namespace lockstep::comm::detail {

// Work for the thread to do while nothing is queued, every `period` until a job arrives.
struct IdleTask {
  std::chrono::milliseconds period{200};
  std::function<void()> run;  // empty: sleep until a job arrives
};

class CommThread {
 public:
  explicit CommThread(IdleTask idle = {});
  ~CommThread();  // runs what is queued, then joins
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Queues job; `what` names it in errors ("allreduce(f32[1024], sum)").
  WorkPtr submit(std::string what, std::function<void()> job);
  // True when nothing is queued or running.
  bool idle() const;

 private:
  struct Job;
  void loop();

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool running_job_ = false;
  bool stop_ = false;
  std::string first_error_;  // set once a job failed; later jobs fail with it
  IdleTask idle_;
  std::thread thread_;
};

}  // namespace lockstep::comm::detail
