// Communicator: the collectives data-parallel training needs (allreduce, broadcast, allgather,
// reduce-scatter, barrier) over a fixed group of ranks, independent of the transport (MPI on
// CPUs; NCCL on GPUs later). Every collective, sync or async, is issued in the order the caller
// calls it, and every rank must call the same collectives in the same order with matching
// shapes, as in MPI. Tensor collectives work in place on the caller's storage (views included);
// the caller must not touch a tensor passed to an *_async call until its Work has completed.
// Any thread may call; when several do, the order between them must be the same on every rank.
// A collective that waits longer than timeout_s() for its peers ends the whole job with a report
// of who did not arrive, instead of hanging until the wall-clock limit.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/core/tensor.hpp"

namespace lockstep::comm {

// How long one collective may wait for its peers before the job is ended with a report of the
// ranks that did not arrive (config key dist.timeout_s). A healthy collective takes
// milliseconds, but the first of a job also waits for the slowest rank's start-up (reading
// shards, cuDNN autotuning), so the default leaves minutes; PyTorch's NCCL default is 10.
inline constexpr double kDefaultTimeoutSeconds = 300.0;

enum class ReduceOp { Sum, Max, Min };
const char* reduce_op_name(ReduceOp op);  // "sum", "max", "min"

// Completion handle of an asynchronous collective. wait() blocks until the operation has
// finished and rethrows its error (a lockstep::Error naming the call); test() never blocks,
// returns true once it has finished and likewise rethrows its error.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;
};
using WorkPtr = std::shared_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;             // in [0, size())
  virtual int size() const = 0;             // world size
  virtual int local_rank() const = 0;       // rank among the ranks on this node
  virtual int local_size() const = 0;       // ranks on this node
  virtual std::string backend() const = 0;  // "mpi", "nccl", ...
  // The bound on one collective (see kDefaultTimeoutSeconds); on expiry the job ends.
  virtual double timeout_s() const { return kDefaultTimeoutSeconds; }

  // The training step the caller is in, named in timeout reports ("collective #812 at step
  // 96"). One relaxed atomic store: cheap enough to call once per step.
  virtual void set_step(std::int64_t step) { step_.store(step, std::memory_order_relaxed); }
  virtual std::int64_t step() const { return step_.load(std::memory_order_relaxed); }

  // ---- tensor collectives (dtypes: f32, i32, f64, bf16 for reductions; any dtype otherwise) ----
  // bf16 elements are combined in f32 and rounded back to bf16 at each combination (NCCL's way).
  // t <- op over all ranks of t, elementwise.
  virtual WorkPtr allreduce_async(Tensor t, ReduceOp op = ReduceOp::Sum) = 0;
  // t <- root's t on every rank.
  virtual WorkPtr broadcast_async(Tensor t, int root) = 0;
  // out (numel = size() * in.numel()) <- concatenation of every rank's `in`, in rank order.
  virtual WorkPtr allgather_async(Tensor in, Tensor out) = 0;
  // out (numel = in.numel() / size()) <- block rank() of (op over all ranks of in).
  virtual WorkPtr reduce_scatter_async(Tensor in, Tensor out, ReduceOp op = ReduceOp::Sum) = 0;
  virtual WorkPtr barrier_async() = 0;

  // ---- groups and abort: NCCL's ncclGroupStart/ncclGroupEnd and ncclCommAbort, which the
  // device communicators (NCCL, and the stream communicator that stands in for it) implement.
  // Collectives issued between group_start() and group_end() are issued as one: on a device they
  // start together, after the compute stream's work queued before the group, and complete
  // together, so their Work may be waited on only after group_end() (an error before). Groups
  // nest; the outermost group_end() issues. A host communicator (MPI) issues each collective at
  // once: there a group changes nothing. Use comm::Group for a scope.
  virtual void group_start() {}
  virtual void group_end() {}
  // Ends this rank's collectives in flight without waiting for its peers: their Work throws an
  // error naming `why`, later collectives are refused, and the device's streams no longer wait
  // for them, so a rank that has failed can report and exit instead of hanging in a collective a
  // dead peer never joins. Local: the peers' halves end by their own timeout (dist.timeout_s).
  // MPI cannot end a collective in flight, so a host communicator refuses (an error saying so).
  virtual void abort(const std::string& why);
  virtual bool aborted() const { return false; }

  void allreduce(Tensor& t, ReduceOp op = ReduceOp::Sum) { allreduce_async(t, op)->wait(); }
  void broadcast(Tensor& t, int root) { broadcast_async(t, root)->wait(); }
  void allgather(const Tensor& in, Tensor& out) { allgather_async(in, out)->wait(); }
  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op = ReduceOp::Sum) {
    reduce_scatter_async(in, out, op)->wait();
  }
  void barrier() { barrier_async()->wait(); }

  // ---- small host-side helpers for the trainer (metrics, config checks); blocking ----
  virtual void allreduce(std::vector<double>& values, ReduceOp op) = 0;
  virtual void allreduce(std::vector<std::int64_t>& values, ReduceOp op) = 0;
  // Returns root's `value` on every rank (other ranks' values are ignored; any length).
  virtual std::string broadcast(const std::string& value, int root) = 0;
  // Returns every rank's `value`, indexed by rank (lengths may differ).
  virtual std::vector<std::string> allgather(const std::string& value) = 0;
  // Returns every rank's `value`, indexed by rank, on root; an empty vector on the other ranks
  // (what only root writes, such as a merged trace, need not cross every rank).
  virtual std::vector<std::string> gather(const std::string& value, int root) = 0;

 private:
  std::atomic<std::int64_t> step_{0};
};

// A group of collectives for a scope (Communicator::group_start/group_end): ends the group when
// it goes, also while an exception unwinds (then swallowing a second error).
class Group {
 public:
  explicit Group(Communicator& comm) : comm_(comm), exceptions_(std::uncaught_exceptions()) {
    comm_.group_start();
  }
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  ~Group() noexcept(false) {
    if (std::uncaught_exceptions() == exceptions_) {
      comm_.group_end();
      return;
    }
    try {
      comm_.group_end();  // what was queued is issued (the peers issue it too, or time out)
    } catch (...) {
      // already unwinding: the first error is the one to report
    }
  }

 private:
  Communicator& comm_;
  int exceptions_;
};

// Throws lockstep::Error on every rank when `value` differs between ranks, naming `what`, the
// first rank that differs from rank 0 and both values (shortened): e.g. a config hash, so a
// job whose ranks read different configs stops at start-up instead of training divergent
// replicas. Collective: every rank must call it.
void check_same_on_all_ranks(Communicator& comm, const std::string& what, const std::string& value);

}  // namespace lockstep::comm
