// StreamCommunicator (include/lockstep/comm/stream_communicator.hpp): the NCCL communicator's
// contract — collectives on a communication stream after the compute stream's work, Work::wait()
// as a stream wait, a watchdog — built from a host communicator and the device runtime.
//
// One collective, issued on the host in the caller's order (the same on every rank):
//   1. compute stream: record `ready` (everything queued so far, the tensors' producers);
//   2. the MPI thread: a job that waits for `ready`, queued ahead of the collective, so the
//      host communicator reads the tensors only once they are written; the MPI thread's FIFO
//      keeps one order of collectives on every rank whatever the device's timing;
//   3. the host communicator's collective, over host views of the tensors;
//   4. communication stream: wait for `ready`, then a host function that waits for the
//      collective, then record `done`; Work::wait() makes the compute stream wait for `done`.
// A group (group_start .. group_end, NCCL's ncclGroupStart/End) is one such launch for all its
// collectives: one `ready`, one MPI-thread job, one host function that waits for them all.
// abort() makes those host functions stop waiting (they poll the host collective and the abort
// flag), so the streams drain although a peer never joins; the collectives' tensors are kept, since
// MPI may still write into them.
#include "lockstep/comm/stream_communicator.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "comm/hang_report.hpp"
#include "comm/mpi_job.hpp"
#include "comm/teardown.hpp"
#include "lockstep/comm/bootstrap.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/ops/backend.hpp"
#include "lockstep/ops/device_runtime.hpp"

namespace lockstep::comm {
namespace {

using Clock = std::chrono::steady_clock;
using ops::DeviceRuntime;

// As the NCCL communicator's watchdog: a failure is reported within a second.
constexpr auto kWatchdogPoll = std::chrono::milliseconds(200);

std::string describe(const Tensor& t) {
  return t.defined() ? t.describe() : "undefined tensor";
}

// Set once by abort(), read by the communication stream's host functions and the Works.
struct AbortState {
  std::atomic<bool> flag{false};
  std::mutex mutex;
  std::string why;
  void set(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mutex);
    if (flag.load()) return;
    why = reason;
    flag.store(true);
  }
  std::string reason() {
    std::lock_guard<std::mutex> lock(mutex);
    return why;
  }
};

// Waits for a host collective, polling it, until it finishes or the communicator is aborted
// (then throws). Polling costs the communication stream a few microseconds per collective; a
// blocking wait could never be ended by abort().
void wait_unless_aborted(Work& work, AbortState& abort, const std::string& what, int rank) {
  for (int polls = 0; !work.test(); ++polls) {
    if (abort.flag.load())
      LOCKSTEP_FAIL("rank ", rank, ": ", what, " was aborted: ", abort.reason());
    if (polls < 256)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// One collective in flight. Its tensors stay referenced until it has finished: the caching
// allocator may hand a freed block to the compute stream at once.
struct Pending {
  explicit Pending(DeviceRuntime& rt)
      : rt(rt), ready(rt.create_event(false)), done(rt.create_event(false)) {}
  ~Pending() {
    rt.destroy_event(ready);
    rt.destroy_event(done);
  }
  void fail(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!error) error = e;
  }
  void rethrow() {
    std::lock_guard<std::mutex> lock(mutex);
    if (error) std::rethrow_exception(error);
  }

  DeviceRuntime& rt;
  DeviceRuntime::Event ready, done;
  std::string what;
  std::int64_t seq = 0, step = 0;
  std::vector<Tensor> keep_alive;
  std::function<WorkPtr()> issue;     // issues the host collective (until launched)
  WorkPtr host_work;                  // the host collective, once issued
  std::atomic<bool> launched{false};  // `done` recorded (false while its group is open)
  Clock::time_point start = Clock::now();
  std::mutex mutex;
  std::exception_ptr error;  // the host collective's, set on the communication stream
};

class StreamCommunicator;

class StreamWork final : public Work {
 public:
  StreamWork(std::shared_ptr<Pending> p, DeviceRuntime::Stream compute, bool host_blocking)
      : p_(std::move(p)), compute_(compute), host_blocking_(host_blocking) {}
  void wait() override {
    check_launched();
    p_->rethrow();
    if (!host_blocking_) {
      p_->rt.wait(compute_, p_->done);
      return;
    }
    p_->rt.host_wait(p_->done);
    p_->rethrow();
  }
  bool test() override {
    check_launched();
    p_->rethrow();
    if (!p_->rt.query(p_->done)) return false;
    p_->rethrow();
    return true;
  }

 private:
  // A stream waiting for an event never recorded would not wait at all: refuse instead.
  void check_launched() const {
    LOCKSTEP_CHECK_HINT(p_->launched.load(), "call group_end() first (comm::Group ends the scope)",
                        p_->what, ": waited on inside the group that issues it");
  }

  std::shared_ptr<Pending> p_;
  DeviceRuntime::Stream compute_;
  bool host_blocking_;
};

DeviceRuntime& runtime_of(ops::Context& ctx, int rank) {
  DeviceRuntime* rt = ctx.backend().runtime();
  LOCKSTEP_CHECK_HINT(rt != nullptr, "CPU tensors go through the MPI communicator", "rank ", rank,
                      ": a stream communicator needs a device context, got ", ctx.device().str());
  return *rt;
}

class StreamCommunicator final : public Communicator {
 public:
  StreamCommunicator(Communicator& control, std::shared_ptr<Communicator> host, ops::Context& ctx,
                     double timeout_s)
      : control_(control),
        host_(std::move(host)),
        device_(ctx.device()),
        rt_(runtime_of(ctx, control.rank())),
        compute_(rt_.compute_stream()),
        comm_stream_(rt_.create_stream()),
        timeout_s_(timeout_s) {
    watchdog_ = std::thread([this] { watch(); });
  }

  ~StreamCommunicator() override {
    // Unwinding (this rank failed): the peers may never join what is queued, so abort it and do
    // not wait; the job is about to end. Otherwise finish the queued collectives first, watched
    // (after abort() that returns once the streams have drained).
    const bool unwinding =
        detail::teardown_for(std::uncaught_exceptions()) == detail::Teardown::Abort;
    if (unwinding) abort_->set("this rank is ending with an error");
    if (!unwinding) rt_.host_wait(comm_stream_);
    stop_watchdog();
    if (unwinding) return;  // the stream and the pending collectives are left to the process's end
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending_.clear();
    }
    keep_unfinished(std::move(aborted_));
    rt_.destroy_stream(comm_stream_);
  }

  using Communicator::allgather;
  using Communicator::allreduce;
  using Communicator::broadcast;

  int rank() const override { return control_.rank(); }
  int size() const override { return control_.size(); }
  int local_rank() const override { return control_.local_rank(); }
  int local_size() const override { return control_.local_size(); }
  std::string backend() const override { return "stream(" + host_->backend() + ")"; }
  double timeout_s() const override { return timeout_s_; }
  void set_step(std::int64_t step) override { control_.set_step(step); }
  std::int64_t step() const override { return control_.step(); }

  // The opening thread holds the issue lock until the outermost group_end(): its collectives are
  // queued, and other threads' wait until the group is issued, which keeps one issue order.
  void group_start() override {
    issue_mutex_.lock();
    ++group_depth_;
  }
  void group_end() override {
    std::unique_lock<std::recursive_mutex> lock(issue_mutex_);
    LOCKSTEP_CHECK(group_depth_ > 0, "rank ", rank(), ": group_end() without group_start()");
    issue_mutex_.unlock();  // group_start's lock; `lock` holds the mutex until the end here
    if (--group_depth_ > 0) return;
    std::vector<std::shared_ptr<Pending>> group = std::move(group_);
    group_.clear();
    if (!group.empty()) launch(group);
  }

  void abort(const std::string& why) override {
    abort_->set(why);
    // What is in flight leaves the watchdog's care; its tensors stay referenced (MPI may still
    // write into them) until the communicator goes.
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& p : pending_)
      aborted_.push_back(std::move(p));
    pending_.clear();
  }
  bool aborted() const override { return abort_->flag.load(); }

  WorkPtr allreduce_async(Tensor t, ReduceOp op) override {
    const std::string what = str("allreduce(", describe(t), ", ", reduce_op_name(op), ")");
    check_device(t, what);
    return enqueue(what, {t}, false,
                   [=, this] { return host_->allreduce_async(rt_.host_view(t), op); });
  }
  WorkPtr broadcast_async(Tensor t, int root) override {
    const std::string what = str("broadcast(", describe(t), ", root ", root, ")");
    check_device(t, what);
    return enqueue(what, {t}, false,
                   [=, this] { return host_->broadcast_async(rt_.host_view(t), root); });
  }
  WorkPtr allgather_async(Tensor in, Tensor out) override {
    const std::string what = str("allgather(", describe(in), " -> ", describe(out), ")");
    check_device(in, what);
    check_device(out, what);
    return enqueue(what, {in, out}, false, [=, this] {
      return host_->allgather_async(rt_.host_view(in), rt_.host_view(out));
    });
  }
  WorkPtr reduce_scatter_async(Tensor in, Tensor out, ReduceOp op) override {
    const std::string what =
        str("reduce_scatter(", describe(in), " -> ", describe(out), ", ", reduce_op_name(op), ")");
    check_device(in, what);
    check_device(out, what);
    return enqueue(what, {in, out}, false, [=, this] {
      return host_->reduce_scatter_async(rt_.host_view(in), rt_.host_view(out), op);
    });
  }
  // As NCCL's: the caller of barrier() means the host to wait.
  WorkPtr barrier_async() override {
    return enqueue("barrier()", {}, true, [this] { return host_->barrier_async(); });
  }

  // Host values never touch the device: the control communicator handles them.
  void allreduce(std::vector<double>& values, ReduceOp op) override {
    control_.allreduce(values, op);
  }
  void allreduce(std::vector<std::int64_t>& values, ReduceOp op) override {
    control_.allreduce(values, op);
  }
  std::string broadcast(const std::string& value, int root) override {
    return control_.broadcast(value, root);
  }
  std::vector<std::string> allgather(const std::string& value) override {
    return control_.allgather(value);
  }
  std::vector<std::string> gather(const std::string& value, int root) override {
    return control_.gather(value, root);
  }

 private:
  void check_device(const Tensor& t, const std::string& what) const {
    LOCKSTEP_CHECK(t.defined(), what, ": tensor is undefined");
    LOCKSTEP_CHECK_HINT(t.device() == device_,
                        "host tensors go through the MPI communicator; device tensors must live "
                        "on the communicator's device",
                        what, ": the stream communicator of rank ", rank(), " works on ",
                        device_.str(), ", not on ", t.device().str());
  }

  WorkPtr enqueue(const std::string& what, std::vector<Tensor> keep_alive, bool host_blocking,
                  std::function<WorkPtr()> issue) {
    auto p = std::make_shared<Pending>(rt_);
    p->what = what;
    p->step = step();
    p->keep_alive = std::move(keep_alive);
    std::lock_guard<std::recursive_mutex> lock(issue_mutex_);  // one issue order for every caller
    LOCKSTEP_CHECK_HINT(!aborted(), "a communicator is not used after abort(): make a new one",
                        "rank ", rank(), ": ", what, " refused: the communicator was aborted (",
                        abort_->reason(), ")");
    p->seq = ++issued_;
    p->issue = std::move(issue);
    if (group_depth_ > 0) {
      group_.push_back(p);
    } else {
      launch({p});
    }
    return std::make_shared<StreamWork>(p, compute_, host_blocking);
  }

  // Launches `batch` (one collective, or a group's) as one, under the issue lock: the device's
  // work queued so far first, then the host collectives in order, then their completions.
  void launch(const std::vector<std::shared_ptr<Pending>>& batch) {
    const std::shared_ptr<Pending>& first = batch.front();
    const std::string what =
        batch.size() == 1
            ? first->what
            : str("a group of ", batch.size(), " collectives from #", first->seq, " ", first->what);
    rt_.record(first->ready, compute_);
    if (control_.backend() == "mpi") {
      detail::submit_mpi_job(control_, "waiting for the device before " + what,
                             [first](MPI_Comm) { first->rt.host_wait(first->ready); });
    } else {
      rt_.host_wait(first->ready);  // no MPI thread to wait on: the host waits
      rt_.note_host_sync();
    }
    for (const auto& p : batch) {
      p->host_work = p->issue();
      p->issue = nullptr;
    }
    rt_.wait(comm_stream_, first->ready);
    rt_.host_func(comm_stream_, [batch, abort = abort_, rank = rank()] {
      for (const auto& p : batch) {
        try {
          wait_unless_aborted(*p->host_work, *abort, p->what, rank);
        } catch (...) {
          p->fail(std::current_exception());
        }
      }
    });
    for (const auto& p : batch) {
      rt_.record(p->done, comm_stream_);
      p->launched.store(true);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& p : batch)
      (aborted() ? aborted_ : pending_).push_back(p);
  }

  // Collectives abort() took out of the watchdog's care that MPI has not finished: their tensors
  // must outlive what it may still write, so they are kept to the process's end, deliberately.
  static void keep_unfinished(std::deque<std::shared_ptr<Pending>> aborted) {
    auto* kept = new std::vector<std::shared_ptr<Pending>>;
    for (auto& p : aborted)
      if (p->host_work && !p->host_work->test()) kept->push_back(std::move(p));
    if (kept->empty()) delete kept;
  }

  void stop_watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
  }

  // Drops finished collectives (releasing their tensors) and ends the job when one has run past
  // the timeout: the other ranks are inside the same collective and would otherwise wait forever.
  void watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      cv_.wait_for(lock, kWatchdogPoll, [&] { return stop_; });
      if (stop_) break;
      while (!pending_.empty() && rt_.query(pending_.front()->done))
        pending_.pop_front();
      if (pending_.empty()) continue;
      const Pending& p = *pending_.front();
      const double waited = std::chrono::duration<double>(Clock::now() - p.start).count();
      if (waited > timeout_s_)
        abort_job(str("collective #", p.seq, " ", p.what, " ", detail::step_phrase(p.step), " on ",
                      device_.str(), ": not finished after ", waited,
                      " s (dist.timeout_s = ", timeout_s_,
                      " s): a rank is probably missing from this collective, or its device is "
                      "stuck before it; aborting the job"));
    }
  }

  Communicator& control_;
  std::shared_ptr<Communicator> host_;
  Device device_;
  DeviceRuntime& rt_;
  DeviceRuntime::Stream compute_;
  DeviceRuntime::Stream comm_stream_;
  double timeout_s_;

  // Guards issued_, the group and the order of issue; recursive, since an open group holds it.
  std::recursive_mutex issue_mutex_;
  std::int64_t issued_ = 0;
  int group_depth_ = 0;
  std::vector<std::shared_ptr<Pending>> group_;  // queued by the open group, in issue order
  std::shared_ptr<AbortState> abort_ = std::make_shared<AbortState>();
  std::mutex mutex_;  // guards pending_, aborted_ and stop_
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Pending>> pending_;
  std::deque<std::shared_ptr<Pending>> aborted_;
  bool stop_ = false;
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<Communicator> make_stream_communicator(Communicator& control,
                                                       std::shared_ptr<Communicator> host,
                                                       ops::Context& ctx, double timeout_s) {
  LOCKSTEP_CHECK(host != nullptr, "make_stream_communicator: no host communicator");
  const double timeout = timeout_s > 0 ? timeout_s : control.timeout_s();
  LOCKSTEP_CHECK(timeout > 0, "stream communicator timeout must be positive, got ", timeout, " s");
  return std::make_unique<StreamCommunicator>(control, std::move(host), ctx, timeout);
}

}  // namespace lockstep::comm
