// NCCL communicator: MPI bootstrap of the unique id, collectives on a communication stream
// ordered after the compute stream by events, and a watchdog that turns a stuck or failed
// collective into a job abort with a message (see include/lockstep/comm/nccl_communicator.hpp).
#include "lockstep/comm/nccl_communicator.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "comm/cuda/dyn_nccl.hpp"
#include "comm/hang_report.hpp"
#include "comm/teardown.hpp"
#include "lockstep/comm/bootstrap.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/ops/backend.hpp"
#include "lockstep/ops/cuda_check.hpp"
#include "lockstep/ops/device_runtime.hpp"

#define LOCKSTEP_CHECK_NCCL(call)                                                    \
  do {                                                                               \
    ncclResult_t lockstep_nccl_rc_ = (call);                                         \
    if (lockstep_nccl_rc_ != ncclSuccess) [[unlikely]]                               \
      LOCKSTEP_FAIL(#call, " failed: ", dyn::ncclGetErrorString(lockstep_nccl_rc_)); \
  } while (0)

namespace lockstep::comm {
namespace {

static_assert(sizeof(ncclUniqueId) == std::tuple_size_v<NcclUniqueIdBytes>,
              "NcclUniqueIdBytes must hold exactly one ncclUniqueId");

// How often the watchdog looks at unfinished collectives: often enough that a failure is
// reported within a second, rarely enough to cost nothing next to the training step.
constexpr auto kWatchdogPoll = std::chrono::milliseconds(200);
// How long an abort during unwinding may take before the error is let through without it.
constexpr auto kAbortBound = std::chrono::seconds(10);

using Clock = std::chrono::steady_clock;

std::string describe(const Tensor& t) {
  return t.defined() ? t.describe() : "undefined tensor";
}

ncclRedOp_t to_nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Min:
      return ncclMin;
  }
  LOCKSTEP_FAIL("unknown reduce op ", static_cast<int>(op));
}

ncclDataType_t reduction_type(DType dtype, const std::string& what) {
  switch (dtype) {
    case DType::F32:
      return ncclFloat32;
    case DType::I32:
      return ncclInt32;
    case DType::F64:
      return ncclFloat64;
    case DType::BF16:
      return ncclBfloat16;
    case DType::U8:
      break;
  }
  LOCKSTEP_FAIL(what, ": NCCL reductions take f32, i32, f64 or bf16, not ", dtype_name(dtype));
}

// One collective in flight. The tensors stay referenced until the watchdog has seen the
// collective finish: the caching allocator may hand a freed block to the compute stream at
// once, so memory NCCL still writes must not be freed early, whatever the caller does.
struct Pending {
  std::string what;
  std::int64_t seq = 0;   // collectives of this communicator, from 1, in issue order
  std::int64_t step = 0;  // the training step it was issued in
  cudaEvent_t done = nullptr;
  std::atomic<bool> launched{false};  // `done` recorded (false while its group is open)
  std::vector<Tensor> keep_alive;
  Clock::time_point start = Clock::now();
  ~Pending() {
    if (done) (void)cudaEventDestroy(done);
  }
};

class NcclCommunicator;

// The CUDA stream every op of ctx runs on, through the device interface (ops/device_runtime.hpp):
// comm reads no private header of ops.
cudaStream_t compute_stream_of(ops::Context& ctx) {
  ops::DeviceRuntime* rt = ctx.backend().runtime();
  LOCKSTEP_CHECK(rt != nullptr && ctx.device().is_cuda(),
                 "a CUDA stream was asked of a context on ", ctx.device().str(),
                 ", which has no CUDA backend");
  return reinterpret_cast<cudaStream_t>(rt->compute_stream());
}

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<Pending> pending, NcclCommunicator& owner, bool host_blocking)
      : pending_(std::move(pending)), owner_(owner), host_blocking_(host_blocking) {}
  void wait() override;
  bool test() override;

 private:
  // Inside its open group there is no `done` to wait on yet; after abort() there never will be.
  void check_usable() const;

  std::shared_ptr<Pending> pending_;
  NcclCommunicator& owner_;
  bool host_blocking_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& bootstrap, ops::Context& ctx, const NcclUniqueIdBytes& id_bytes,
                   double timeout_s)
      : bootstrap_(bootstrap),
        device_(ctx.device()),
        compute_stream_(compute_stream_of(ctx)),
        timeout_s_(timeout_s) {
    LOCKSTEP_CHECK_CUDA(cudaSetDevice(device_.index));
    ncclUniqueId id;
    std::memcpy(id.internal, id_bytes.data(), sizeof id.internal);
    // The watchdog first: ncclCommInitRank returns only once every rank has called it, so a rank
    // that failed or stopped before it would otherwise hang the others here, unwatched.
    watchdog_ = std::thread([this] { watch(); });
    try {
      guarded("ncclCommInitRank", [&] {
        LOCKSTEP_CHECK_NCCL(dyn::ncclCommInitRank(&comm_, bootstrap.size(), id, bootstrap.rank()));
      });
      // Below the compute stream's priority would be better for overlap, but priorities need a
      // device query per stream; NCCL kernels are few and long, so default priority is fine.
      LOCKSTEP_CHECK_CUDA(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
      LOCKSTEP_CHECK_CUDA(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming));
      barrier_buffer_ = Tensor::empty({1}, DType::I32, device_);
    } catch (...) {
      stop_watchdog();
      if (comm_) (void)dyn::ncclCommAbort(comm_);
      if (compute_ready_) (void)cudaEventDestroy(compute_ready_);
      if (comm_stream_) (void)cudaStreamDestroy(comm_stream_);
      throw;
    }
  }

  ~NcclCommunicator() override {
    (void)cudaSetDevice(device_.index);
    if (aborted()) return;  // abort() has released NCCL, the stream and the events
    if (detail::teardown_for(std::uncaught_exceptions()) == detail::Teardown::Abort) {
      abort_now();
      return;
    }
    try {
      // Collectives still queued finish first, watched: one that a peer never joins ends the
      // job after the timeout instead of blocking this destructor forever.
      guarded("finishing the queued collectives",
              [&] { LOCKSTEP_CHECK_CUDA(cudaStreamSynchronize(comm_stream_)); });
      {
        std::lock_guard<std::mutex> lock(mutex_);
        pending_.clear();  // all finished; the watchdog must not query comm_ while it goes
      }
      guarded("ncclCommDestroy", [&] { LOCKSTEP_CHECK_NCCL(dyn::ncclCommDestroy(comm_)); });
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: warning: NCCL communicator on %s: %s\n", rank(),
                   device_.str().c_str(), e.what());
    }
    stop_watchdog();
    (void)cudaEventDestroy(compute_ready_);
    (void)cudaStreamDestroy(comm_stream_);
  }

  // The sync tensor overloads, hidden by the host-value overrides below.
  using Communicator::allgather;
  using Communicator::allreduce;
  using Communicator::broadcast;

  int rank() const override { return bootstrap_.rank(); }
  int size() const override { return bootstrap_.size(); }
  int local_rank() const override { return bootstrap_.local_rank(); }
  int local_size() const override { return bootstrap_.local_size(); }
  std::string backend() const override { return "nccl"; }
  double timeout_s() const override { return timeout_s_; }
  // One step counter for the job: the bootstrap's, which its own timeout reports name too.
  void set_step(std::int64_t step) override { bootstrap_.set_step(step); }
  std::int64_t step() const override { return bootstrap_.step(); }

  WorkPtr allreduce_async(Tensor t, ReduceOp op) override {
    std::string what = str("allreduce(", describe(t), ", ", reduce_op_name(op), ")");
    check_device(t, what);
    ncclDataType_t type = reduction_type(t.dtype(), what);
    return enqueue(what, {t}, false, [&](cudaStream_t s) {
      return dyn::ncclAllReduce(t.raw_data(), t.raw_data(), static_cast<std::size_t>(t.numel()),
                                type, to_nccl_op(op), comm_, s);
    });
  }

  WorkPtr broadcast_async(Tensor t, int root) override {
    std::string what = str("broadcast(", describe(t), ", root ", root, ")");
    check_device(t, what);
    check_root(root, what);
    return enqueue(what, {t}, false, [&](cudaStream_t s) {
      return dyn::ncclBroadcast(t.raw_data(), t.raw_data(), t.nbytes(), ncclUint8, root, comm_, s);
    });
  }

  WorkPtr allgather_async(Tensor in, Tensor out) override {
    std::string what = str("allgather(", describe(in), " -> ", describe(out), ")");
    check_device(in, what);
    check_device(out, what);
    LOCKSTEP_CHECK(in.dtype() == out.dtype(), what, ": input and output dtypes differ");
    LOCKSTEP_CHECK_HINT(out.numel() == in.numel() * size(),
                        str("make the output ", size(), " x ", in.numel(), " elements"), what,
                        ": output must hold ", size(), " ranks x ", in.numel(), " elements");
    return enqueue(what, {in, out}, false, [&](cudaStream_t s) {
      // In place when `in` is this rank's block of `out`, which NCCL supports directly.
      return dyn::ncclAllGather(in.raw_data(), out.raw_data(), in.nbytes(), ncclUint8, comm_, s);
    });
  }

  WorkPtr reduce_scatter_async(Tensor in, Tensor out, ReduceOp op) override {
    std::string what =
        str("reduce_scatter(", describe(in), " -> ", describe(out), ", ", reduce_op_name(op), ")");
    check_device(in, what);
    check_device(out, what);
    LOCKSTEP_CHECK(in.dtype() == out.dtype(), what, ": input and output dtypes differ");
    LOCKSTEP_CHECK_HINT(in.numel() == out.numel() * size(),
                        str("make the input ", size(), " x ", out.numel(), " elements"), what,
                        ": input must hold ", size(), " ranks x ", out.numel(), " elements");
    ncclDataType_t type = reduction_type(in.dtype(), what);
    return enqueue(what, {in, out}, false, [&](cudaStream_t s) {
      return dyn::ncclReduceScatter(in.raw_data(), out.raw_data(),
                                    static_cast<std::size_t>(out.numel()), type, to_nccl_op(op),
                                    comm_, s);
    });
  }

  // NCCL has no barrier: a one-element allreduce, whose wait() blocks the host, which is what
  // a caller of barrier() means.
  WorkPtr barrier_async() override {
    return enqueue("barrier()", {barrier_buffer_}, true, [&](cudaStream_t s) {
      return dyn::ncclAllReduce(barrier_buffer_.raw_data(), barrier_buffer_.raw_data(), 1,
                                ncclInt32, ncclSum, comm_, s);
    });
  }

  // ncclGroupStart/End. The opening thread holds the issue lock until the outermost group_end():
  // the communication stream waits for the compute stream once, at the start, and every
  // collective's `done` is recorded after ncclGroupEnd has launched them all.
  void group_start() override {
    issue_mutex_.lock();
    if (group_depth_++ > 0) return;
    try {
      check_not_aborted("group_start()");
      LOCKSTEP_CHECK_CUDA(cudaSetDevice(device_.index));
      LOCKSTEP_CHECK_CUDA(cudaEventRecord(compute_ready_, compute_stream_));
      LOCKSTEP_CHECK_CUDA(cudaStreamWaitEvent(comm_stream_, compute_ready_, 0));
      LOCKSTEP_CHECK_NCCL(dyn::ncclGroupStart());
    } catch (...) {
      --group_depth_;
      issue_mutex_.unlock();
      throw;
    }
  }
  void group_end() override {
    std::unique_lock<std::recursive_mutex> lock(issue_mutex_);
    LOCKSTEP_CHECK(group_depth_ > 0, "rank ", rank(), ": group_end() without group_start()");
    issue_mutex_.unlock();  // group_start's lock; `lock` holds the mutex until the end here
    if (--group_depth_ > 0) return;
    std::vector<std::shared_ptr<Pending>> group = std::move(group_);
    group_.clear();
    const ncclResult_t rc = dyn::ncclGroupEnd();
    LOCKSTEP_CHECK(rc == ncclSuccess, "rank ", rank(), ": NCCL group of ", group.size(),
                   " collectives could not be issued: ", dyn::ncclGetErrorString(rc), " (",
                   dyn::ncclGetLastError(comm_), ")");
    for (const auto& pending : group)
      record_done(pending);
  }

  // ncclCommAbort, bounded (abort_now): the kernels of this rank's collectives stop, their Work
  // throws, later collectives are refused.
  void abort(const std::string& why) override {
    {
      std::lock_guard<std::mutex> lock(abort_mutex_);
      if (aborted_.load()) return;
      abort_why_ = why;
      aborted_.store(true);  // later collectives are refused from here on
    }
    (void)cudaSetDevice(device_.index);
    abort_now();
  }
  bool aborted() const override { return aborted_.load(); }
  void check_not_aborted(const std::string& what) {
    if (!aborted_.load()) return;
    std::lock_guard<std::mutex> lock(abort_mutex_);
    LOCKSTEP_FAIL_HINT("a communicator is not used after abort(): make a new one", "rank ", rank(),
                       ": NCCL ", what, " refused: the communicator was aborted (", abort_why_,
                       ")");
  }

  // Host values never touch the GPU: the bootstrap (MPI) communicator handles them.
  void allreduce(std::vector<double>& values, ReduceOp op) override {
    bootstrap_.allreduce(values, op);
  }
  void allreduce(std::vector<std::int64_t>& values, ReduceOp op) override {
    bootstrap_.allreduce(values, op);
  }
  std::string broadcast(const std::string& value, int root) override {
    return bootstrap_.broadcast(value, root);
  }
  std::vector<std::string> allgather(const std::string& value) override {
    return bootstrap_.allgather(value);
  }
  std::vector<std::string> gather(const std::string& value, int root) override {
    return bootstrap_.gather(value, root);
  }

  cudaStream_t compute_stream() const { return compute_stream_; }

  // Throws when NCCL has reported an asynchronous error (a peer died, a network failure).
  void check_async_error(const std::string& what) {
    ncclResult_t async = ncclSuccess;
    LOCKSTEP_CHECK_NCCL(dyn::ncclCommGetAsyncError(comm_, &async));
    LOCKSTEP_CHECK(async == ncclSuccess || async == ncclInProgress, "rank ", rank(), ": NCCL ",
                   what, " failed: ", dyn::ncclGetErrorString(async), " (",
                   dyn::ncclGetLastError(comm_), ")");
  }

 private:
  void check_device(const Tensor& t, const std::string& what) const {
    LOCKSTEP_CHECK(t.defined(), what, ": tensor is undefined");
    LOCKSTEP_CHECK_HINT(t.device() == device_,
                        "host tensors go through the MPI communicator; GPU tensors must live on "
                        "the communicator's device",
                        what, ": the NCCL communicator of rank ", rank(), " works on ",
                        device_.str(), ", not on ", t.device().str());
  }
  void check_root(int root, const std::string& what) const {
    LOCKSTEP_CHECK(root >= 0 && root < size(), what, ": root ", root, " is outside [0, ", size(),
                   ")");
  }

  // Issues one collective: the communication stream waits for everything queued on the compute
  // stream so far (the gradients being reduced), then runs `call`, then records `done`.
  WorkPtr enqueue(const std::string& what, std::vector<Tensor> keep_alive, bool host_blocking,
                  const std::function<ncclResult_t(cudaStream_t)>& call) {
    auto pending = std::make_shared<Pending>();
    pending->what = what;
    pending->step = step();
    pending->keep_alive = std::move(keep_alive);
    std::lock_guard<std::recursive_mutex> lock(issue_mutex_);  // one issue order for every caller
    check_not_aborted(what);
    pending->seq = ++issued_;
    LOCKSTEP_CHECK_CUDA(cudaSetDevice(device_.index));
    if (group_depth_ == 0) {  // in a group, group_start ordered the streams once
      LOCKSTEP_CHECK_CUDA(cudaEventRecord(compute_ready_, compute_stream_));
      LOCKSTEP_CHECK_CUDA(cudaStreamWaitEvent(comm_stream_, compute_ready_, 0));
    }
    ncclResult_t rc = call(comm_stream_);
    LOCKSTEP_CHECK(rc == ncclSuccess, "rank ", rank(), ": NCCL ", what,
                   " could not be issued: ", dyn::ncclGetErrorString(rc), " (",
                   dyn::ncclGetLastError(comm_), ")");
    if (group_depth_ > 0)
      group_.push_back(pending);  // launched, and `done` recorded, by the outermost group_end
    else
      record_done(pending);
    return std::make_shared<NcclWork>(pending, *this, host_blocking);
  }

  // After the collective's launch: its `done` event, and the watchdog's care.
  void record_done(const std::shared_ptr<Pending>& pending) {
    LOCKSTEP_CHECK_CUDA(cudaEventCreateWithFlags(&pending->done, cudaEventDisableTiming));
    LOCKSTEP_CHECK_CUDA(cudaEventRecord(pending->done, comm_stream_));
    pending->launched.store(true);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending_.push_back(pending);
    }
    cv_.notify_all();
  }

  // Runs `call`, a host call that waits for every rank (creating or destroying the communicator,
  // draining its stream), under the watchdog's timeout.
  template <class F>
  void guarded(const char* what, F&& call) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      host_call_ = HostCall{what, Clock::now()};
    }
    struct Clear {
      NcclCommunicator* self;
      ~Clear() {
        std::lock_guard<std::mutex> lock(self->mutex_);
        self->host_call_.reset();
      }
    } clear{this};
    call();
  }

  void stop_watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
  }

  // Destroyed while an exception unwinds (this rank failed): its peers may wait in collectives
  // this rank will never join, so flushing them (cudaStreamSynchronize, ncclCommDestroy) could
  // block forever before the error is printed. ncclCommAbort is local and stops NCCL's kernels;
  // it runs on a helper thread, bounded, so that even a stuck abort cannot hold the error back.
  void abort_now() {
    stop_watchdog();  // it must not touch comm_ from here on
    auto done = std::make_shared<std::promise<void>>();
    std::future<void> finished = done->get_future();
    std::thread([comm = comm_, device = device_.index, done] {
      (void)cudaSetDevice(device);
      (void)dyn::ncclCommAbort(comm);
      done->set_value();
    }).detach();
    if (finished.wait_for(kAbortBound) != std::future_status::ready) {
      std::fprintf(stderr,
                   "rank %d: warning: ncclCommAbort on %s did not return within %d s; going on "
                   "without it\n",
                   rank(), device_.str().c_str(), static_cast<int>(kAbortBound.count()));
    }
    pending_.clear();
    (void)cudaEventDestroy(compute_ready_);
    (void)cudaStreamDestroy(comm_stream_);  // returns at once; released when the stream drains
  }

  // The watchdog: drops finished collectives (releasing their tensors) and ends the job when one
  // has run past the timeout or NCCL reports an error, or when a guarded host call (creation,
  // destruction) has. Ending the job is the only safe reaction: the other ranks are inside the
  // same collective and would otherwise wait forever.
  void watch() {
    (void)cudaSetDevice(device_.index);
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      cv_.wait_for(lock, kWatchdogPoll, [&] { return stop_; });
      if (stop_) break;
      if (host_call_) {
        double waited = std::chrono::duration<double>(Clock::now() - host_call_->start).count();
        if (waited > timeout_s_)
          abort_job(str("NCCL ", host_call_->what, " on ", device_.str(), ", ",
                        detail::step_phrase(step()), ": not finished after ", waited,
                        " s (dist.timeout_s = ", timeout_s_,
                        " s): a rank probably failed or stopped before reaching it; aborting "
                        "the job"));
      }
      while (!pending_.empty()) {
        cudaError_t q = cudaEventQuery(pending_.front()->done);
        if (q == cudaErrorNotReady) break;
        if (q != cudaSuccess) fatal(*pending_.front(), cudaGetErrorString(q));
        pending_.pop_front();
      }
      if (pending_.empty()) continue;
      ncclResult_t async = ncclSuccess;
      ncclResult_t rc = dyn::ncclCommGetAsyncError(comm_, &async);
      if (rc != ncclSuccess) async = rc;
      if (async != ncclSuccess && async != ncclInProgress)
        fatal(*pending_.front(),
              str(dyn::ncclGetErrorString(async), ": ", dyn::ncclGetLastError(comm_)));
      double waited = std::chrono::duration<double>(Clock::now() - pending_.front()->start).count();
      if (waited > timeout_s_)
        fatal(*pending_.front(),
              str("not finished after ", waited, " s (dist.timeout_s = ", timeout_s_,
                  " s): a rank is probably missing from this collective, or stuck before it"));
    }
  }

  [[noreturn]] void fatal(const Pending& p, const std::string& reason) {
    (void)dyn::ncclCommAbort(comm_);  // frees the NCCL kernels spinning on the GPU
    abort_job(str("NCCL collective #", p.seq, " ", p.what, " ", detail::step_phrase(p.step), " on ",
                  device_.str(), ": ", reason,
                  "; aborting the job (rerun with NCCL_DEBUG=INFO for NCCL's view)"));
  }

  struct HostCall {
    const char* what;
    Clock::time_point start;
  };

  Communicator& bootstrap_;
  Device device_;
  cudaStream_t compute_stream_;
  double timeout_s_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t comm_stream_ = nullptr;
  cudaEvent_t compute_ready_ = nullptr;
  Tensor barrier_buffer_;

  // Guards issued_, the group and the order of issue; recursive, since an open group holds it.
  std::recursive_mutex issue_mutex_;
  std::int64_t issued_ = 0;
  int group_depth_ = 0;
  std::vector<std::shared_ptr<Pending>> group_;  // issued inside the open group, in order
  std::atomic<bool> aborted_{false};
  std::mutex abort_mutex_;  // guards abort_why_
  std::string abort_why_;
  std::mutex mutex_;  // guards pending_, host_call_ and stop_
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Pending>> pending_;
  std::optional<HostCall> host_call_;
  bool stop_ = false;
  std::thread watchdog_;
};

void NcclWork::check_usable() const {
  owner_.check_not_aborted(pending_->what);
  LOCKSTEP_CHECK_HINT(pending_->launched.load(),
                      "call group_end() first (comm::Group ends the scope)", pending_->what,
                      ": waited on inside the group that issues it");
}

void NcclWork::wait() {
  check_usable();
  owner_.check_async_error(pending_->what);
  if (host_blocking_) {
    LOCKSTEP_CHECK_CUDA(cudaEventSynchronize(pending_->done));
    owner_.check_async_error(pending_->what);
    return;
  }
  LOCKSTEP_CHECK_CUDA(cudaStreamWaitEvent(owner_.compute_stream(), pending_->done, 0));
}

bool NcclWork::test() {
  check_usable();
  owner_.check_async_error(pending_->what);
  cudaError_t q = cudaEventQuery(pending_->done);
  if (q == cudaErrorNotReady) {
    (void)cudaGetLastError();  // "not ready" is an answer, not an error to report later
    return false;
  }
  LOCKSTEP_CHECK_CUDA(q);
  return true;
}

}  // namespace

NcclUniqueIdBytes share_nccl_unique_id(Communicator& bootstrap) {
  std::string bytes;
  std::string failure;
  if (bootstrap.rank() == 0) {
    // A failure on rank 0 is still broadcast (as an empty id), so every rank raises an error
    // instead of the others waiting for an id that never comes.
    try {
      ncclUniqueId id;
      LOCKSTEP_CHECK_NCCL(dyn::ncclGetUniqueId(&id));
      bytes.assign(id.internal, sizeof id.internal);
    } catch (const Error& e) {
      failure = e.what();
    }
  }
  bytes = bootstrap.broadcast(bytes, 0);
  if (!failure.empty()) LOCKSTEP_FAIL("rank 0: creating the NCCL unique id failed: ", failure);
  LOCKSTEP_CHECK_HINT(bytes.size() == sizeof(ncclUniqueId),
                      "see rank 0's error; NCCL_DEBUG=INFO shows why ncclGetUniqueId failed",
                      "rank ", bootstrap.rank(), ": rank 0 sent a NCCL unique id of ", bytes.size(),
                      " bytes instead of ", sizeof(ncclUniqueId));
  NcclUniqueIdBytes out;
  std::memcpy(out.data(), bytes.data(), out.size());
  return out;
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, ops::Context& ctx,
                                                     const NcclOptions& options) {
  LOCKSTEP_CHECK_HINT(
      ctx.device().is_cuda(), "create the rank's ops::Context on comm::select_gpu(bootstrap, ...)",
      "rank ", bootstrap.rank(), ": NCCL communicator asked for a context on ", ctx.device().str());
  const double timeout_s = options.timeout_s > 0 ? options.timeout_s : bootstrap.timeout_s();
  LOCKSTEP_CHECK(timeout_s > 0, "NCCL timeout must be positive, got ", timeout_s, " s");
  NcclUniqueIdBytes id = share_nccl_unique_id(bootstrap);
  return std::make_unique<NcclCommunicator>(bootstrap, ctx, id, timeout_s);
}

}  // namespace lockstep::comm
