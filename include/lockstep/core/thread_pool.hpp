// A small fork-join pool for one replica's ops. Workers sleep on a condition variable between
// jobs instead of spinning: on a shared node (several ranks, or DataParallel replicas on the same
// cores) spinning workers steal the cores the other replicas need (OpenMP's default busy-wait
// made 2-thread PyTorch runs up to 2.6x slower on our 2-core machines).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace lockstep {

class ThreadPool {
 public:
  // threads >= 1; the caller is one of them. A thread the system refuses is a lockstep::Error
  // (the threads already started are joined first).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(part, parts) for part in [0, parts) with parts = size(), the caller taking part 0;
  // returns when all are done. Exceptions in a worker are rethrown in the caller.
  void run(const std::function<void(int part, int parts)>& fn);

  // Splits [0, n) into size() contiguous ranges (at least `grain` long) and runs fn(begin, end).
  void parallel_for(std::int64_t n, std::int64_t grain,
                    const std::function<void(std::int64_t begin, std::int64_t end)>& fn);

 private:
  void worker_loop(int index);
  void stop_workers();

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::uint64_t generation_ = 0;
  int pending_ = 0;
  int active_parts_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace lockstep
