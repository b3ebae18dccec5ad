#include "lockstep/core/thread_pool.hpp"

#include <pthread.h>

#include <algorithm>
#include <system_error>

#include "lockstep/core/error.hpp"

namespace lockstep {

ThreadPool::ThreadPool(int threads) {
  LOCKSTEP_CHECK(threads >= 1, "thread pool needs at least one thread, got ", threads);
  for (int i = 1; i < threads; ++i) {
    try {
      workers_.emplace_back([this, i] { worker_loop(i); });
    } catch (const std::system_error& e) {
      // The workers already started must be joined here: the destructor does not run for a
      // constructor that throws, and a joinable std::thread destroyed is std::terminate.
      stop_workers();
      LOCKSTEP_FAIL_HINT(
          "ask for fewer threads, or raise the limit on processes/threads "
          "(ulimit -u) or memory (ulimit -v)",
          "cannot start thread ", i + 1, " of ", threads, ": ", e.what());
    }
  }
}

ThreadPool::~ThreadPool() {
  stop_workers();
}

void ThreadPool::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_)
    t.join();
  workers_.clear();
}

void ThreadPool::worker_loop(int index) {
  pthread_setname_np(pthread_self(), "lockstep-pool");  // for per-thread CPU time in top -H
  std::uint64_t seen = 0;
  for (;;) {
    const std::function<void(int, int)>* job;
    int parts;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      parts = active_parts_;
    }
    std::exception_ptr err;
    if (index < parts) {
      try {
        (*job)(index, parts);
      } catch (...) {
        err = std::current_exception();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (err && !error_) error_ = err;
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
  if (workers_.empty()) {
    fn(0, 1);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    active_parts_ = size();
    pending_ = static_cast<int>(workers_.size());
    error_ = nullptr;
    ++generation_;
  }
  start_cv_.notify_all();
  std::exception_ptr err;
  try {
    fn(0, size());
  } catch (...) {
    err = std::current_exception();
  }
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  if (!err) err = error_;
  job_ = nullptr;
  if (err) std::rethrow_exception(err);
}

void ThreadPool::parallel_for(std::int64_t n, std::int64_t grain,
                              const std::function<void(std::int64_t, std::int64_t)>& fn) {
  if (n <= 0) return;
  std::int64_t parts = std::min<std::int64_t>(
      size(), std::max<std::int64_t>(1, n / std::max<std::int64_t>(grain, 1)));
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  run([&](int part, int) {
    if (part >= parts) return;
    std::int64_t begin = n * part / parts, end = n * (part + 1) / parts;
    if (begin < end) fn(begin, end);
  });
}

}  // namespace lockstep
