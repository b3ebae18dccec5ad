#include "comm/comm_thread.hpp"

#include <pthread.h>

#include "lockstep/core/error.hpp"
#include "lockstep/core/trace.hpp"

namespace lockstep::comm::detail {

struct CommThread::Job : Work {
  std::string what;
  std::function<void()> fn;

  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  std::exception_ptr error;

  void finish(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      error = std::move(e);
      done = true;
    }
    done_cv.notify_all();
  }
  void wait() override {
    std::unique_lock<std::mutex> lock(mutex);
    done_cv.wait(lock, [&] { return done; });
    if (error) std::rethrow_exception(error);
  }
  bool test() override {
    std::lock_guard<std::mutex> lock(mutex);
    if (done && error) std::rethrow_exception(error);
    return done;
  }
};

CommThread::CommThread(IdleTask idle) : idle_(std::move(idle)), thread_([this] { loop(); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

WorkPtr CommThread::submit(std::string what, std::function<void()> fn) {
  auto job = std::make_shared<Job>();
  job->what = std::move(what);
  job->fn = std::move(fn);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    LOCKSTEP_CHECK(!stop_, job->what, ": communicator is shutting down");
    queue_.push_back(job);
  }
  wake_.notify_one();
  return job;
}

bool CommThread::idle() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return queue_.empty() && !running_job_;
}

void CommThread::loop() {
  // Named so that per-thread CPU time (top -H, /proc/<pid>/task/*/comm) shows what communication
  // costs next to compute.
  pthread_setname_np(pthread_self(), "lockstep-comm");
  for (;;) {
    std::shared_ptr<Job> job;
    std::string earlier_error;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      auto ready = [&] { return stop_ || !queue_.empty(); };
      if (!idle_.run) {
        wake_.wait(lock, ready);
      } else if (!wake_.wait_for(lock, idle_.period, ready)) {
        lock.unlock();
        try {
          idle_.run();
        } catch (const std::exception& e) {
          // MPI failed outside any job: the collectives behind would fail or hang, so fail them.
          std::lock_guard<std::mutex> relock(mutex_);
          if (first_error_.empty()) first_error_ = str("idle task: ", e.what());
        }
        continue;
      }
      if (queue_.empty()) return;  // stop_ and drained
      job = std::move(queue_.front());
      queue_.pop_front();
      running_job_ = true;
      earlier_error = first_error_;
    }
    std::exception_ptr error;
    if (!earlier_error.empty()) {
      error = std::make_exception_ptr(
          Error(str(job->what, " not run: an earlier collective failed: ", earlier_error),
                "the ranks are out of step; end the job", __FILE__, __LINE__));
    } else {
      try {
        trace::Span span("comm", job->what);
        job->fn();
      } catch (const std::exception& e) {
        error = std::current_exception();
        std::lock_guard<std::mutex> lock(mutex_);
        first_error_ = str(job->what, ": ", e.what());
      } catch (...) {
        error = std::current_exception();
        std::lock_guard<std::mutex> lock(mutex_);
        first_error_ = str(job->what, ": unknown exception");
      }
    }
    job->fn = nullptr;  // release the tensors the job held before signalling
    {
      // Idle before the waiter wakes: a caller that saw its last job finish must see idle().
      std::lock_guard<std::mutex> lock(mutex_);
      running_job_ = false;
    }
    job->finish(error);
  }
}

}  // namespace lockstep::comm::detail
