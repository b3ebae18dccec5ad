#include "lockstep/comm/mpi_communicator.hpp"

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>

#include "comm/comm_thread.hpp"
#include "comm/mpi_allreduce.hpp"
#include "comm/mpi_check.hpp"
#include "comm/mpi_job.hpp"
#include "comm/mpi_watch.hpp"
#include "lockstep/core/error.hpp"

namespace lockstep::comm {
namespace {

// MPI counts are ints; a larger tensor is an error rather than a silent truncation. (Buckets
// are ~25 MB and parameters far below 2 GiB, so chunking was not worth its code.)
int mpi_count(std::int64_t n, const std::string& what) {
  LOCKSTEP_CHECK_HINT(n <= INT_MAX, "split the tensor into parts below 2^31 elements", what, ": ",
                      n, " elements exceed MPI's int count");
  return static_cast<int>(n);
}

bool overlaps(const Tensor& a, const Tensor& b) {
  if (!a.shares_storage(b) || a.nbytes() == 0 || b.nbytes() == 0) return false;
  auto* pa = static_cast<const char*>(a.raw_data());
  auto* pb = static_cast<const char*>(b.raw_data());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(const MpiSession& session, const MpiOptions& options)
      : rank_(session.rank()),
        size_(session.size()),
        local_rank_(session.local_rank()),
        local_size_(session.local_size()) {
    LOCKSTEP_CHECK_HINT(session.thread_level() >= ThreadLevel::Serialized,
                        "construct MpiSession with ThreadLevel::Serialized or Multiple",
                        "the MPI communicator needs MPI_THREAD_SERIALIZED, the session has ",
                        thread_level_name(session.thread_level()));
    const int live = detail::live_mpi_communicators().load();
    LOCKSTEP_CHECK_HINT(live == 0 || session.thread_level() == ThreadLevel::Multiple,
                        "share one communicator, or construct MpiSession with "
                        "ThreadLevel::Multiple",
                        "a second MPI communicator (", live + 1,
                        " alive) would make MPI calls from two threads at once, which "
                        "MPI_THREAD_SERIALIZED forbids");
    // Our own communicator keeps our collectives apart from any other MPI traffic, and
    // ERRORS_RETURN turns failures into exceptions instead of an abort without context.
    LOCKSTEP_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    LOCKSTEP_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    watch_ = std::make_unique<detail::CollectiveWatch>(comm_, options.timeout_s,
                                                       [this] { return step(); });
    ++detail::live_mpi_communicators();
    // While idle, the thread answers peers whose collective timed out (they ask where we are).
    detail::IdleTask idle;
    idle.run = [this] {
      std::lock_guard<std::mutex> lock(caller_mpi_);
      watch_->serve();
    };
    thread_ = std::make_unique<detail::CommThread>(std::move(idle));
  }

  ~MpiCommunicator() override {
    thread_.reset();  // finishes queued work and joins: no MPI call is in flight after this
    watch_.reset();
    MPI_Comm_free(&comm_);
    --detail::live_mpi_communicators();
  }

  using Communicator::allreduce;  // the sync tensor overload, hidden by the host overrides

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string backend() const override { return "mpi"; }
  double timeout_s() const override { return watch_->timeout_s(); }

  WorkPtr allreduce_async(Tensor t, ReduceOp op) override {
    std::string what = str("allreduce(", describe(t), ", ", reduce_op_name(op), ")");
    check_host(t, what);
    MPI_Datatype type = detail::reduction_type(t.dtype(), what.c_str());
    int count = mpi_count(t.numel(), what);
    MPI_Comm comm = comm_;
    std::vector<std::byte>* scratch = &scratch_;
    MPI_Op mpi_op = detail::to_mpi_op(op, t.dtype());
    return submit(what, [t, type, count, mpi_op, comm, scratch](detail::CollectiveWatch& watch) {
      detail::allreduce_in_place(t.raw_data(), count, type, t.nbytes(), mpi_op, comm, watch,
                                 *scratch);
    });
  }

  WorkPtr broadcast_async(Tensor t, int root) override {
    std::string what = str("broadcast(", describe(t), ", root ", root, ")");
    check_host(t, what);
    check_root(root, what);
    int bytes = mpi_count(static_cast<std::int64_t>(t.nbytes()), what);
    MPI_Comm comm = comm_;
    return submit(what, [t, bytes, root, comm](detail::CollectiveWatch& watch) {
      MPI_Request request;
      LOCKSTEP_CHECK_MPI(MPI_Ibcast(t.raw_data(), bytes, MPI_BYTE, root, comm, &request));
      watch.wait(request);
    });
  }

  WorkPtr allgather_async(Tensor in, Tensor out) override {
    std::string what = str("allgather(", describe(in), " -> ", describe(out), ")");
    check_host(in, what);
    check_host(out, what);
    LOCKSTEP_CHECK(in.dtype() == out.dtype(), what, ": input and output dtypes differ");
    LOCKSTEP_CHECK_HINT(out.numel() == in.numel() * size_,
                        str("make the output ", size_, " x ", in.numel(), " elements"), what,
                        ": output must hold ", size_, " ranks x ", in.numel(), " elements");
    int bytes = mpi_count(static_cast<std::int64_t>(in.nbytes()), what);
    mpi_count(static_cast<std::int64_t>(out.nbytes()), what);
    // The MPI in-place form: input already sits in this rank's block of the output.
    const bool in_place =
        in.nbytes() > 0 && in.raw_data() == static_cast<char*>(out.raw_data()) +
                                                static_cast<std::size_t>(rank_) * in.nbytes();
    LOCKSTEP_CHECK(in_place || !overlaps(in, out), what,
                   ": input overlaps the output outside this rank's block");
    MPI_Comm comm = comm_;
    return submit(what, [in, out, bytes, in_place, comm](detail::CollectiveWatch& watch) {
      MPI_Request request;
      LOCKSTEP_CHECK_MPI(MPI_Iallgather(in_place ? MPI_IN_PLACE : in.raw_data(), bytes, MPI_BYTE,
                                        out.raw_data(), bytes, MPI_BYTE, comm, &request));
      watch.wait(request);
    });
  }

  WorkPtr reduce_scatter_async(Tensor in, Tensor out, ReduceOp op) override {
    std::string what =
        str("reduce_scatter(", describe(in), " -> ", describe(out), ", ", reduce_op_name(op), ")");
    check_host(in, what);
    check_host(out, what);
    LOCKSTEP_CHECK(in.dtype() == out.dtype(), what, ": input and output dtypes differ");
    LOCKSTEP_CHECK_HINT(in.numel() == out.numel() * size_,
                        str("make the input ", size_, " x ", out.numel(), " elements"), what,
                        ": input must hold ", size_, " ranks x ", out.numel(), " elements");
    LOCKSTEP_CHECK(!overlaps(in, out), what, ": input and output overlap");
    MPI_Datatype type = detail::reduction_type(in.dtype(), what.c_str());
    int count = mpi_count(out.numel(), what);
    mpi_count(in.numel(), what);
    MPI_Op mpi_op = detail::to_mpi_op(op, in.dtype());
    MPI_Comm comm = comm_;
    return submit(what, [in, out, count, type, mpi_op, comm](detail::CollectiveWatch& watch) {
      MPI_Request request;
      LOCKSTEP_CHECK_MPI(MPI_Ireduce_scatter_block(in.raw_data(), out.raw_data(), count, type,
                                                   mpi_op, comm, &request));
      watch.wait(request);
    });
  }

  WorkPtr barrier_async() override {
    MPI_Comm comm = comm_;
    return submit("barrier()", [comm](detail::CollectiveWatch& watch) {
      MPI_Request request;
      LOCKSTEP_CHECK_MPI(MPI_Ibarrier(comm, &request));
      watch.wait(request);
    });
  }

  void allreduce(std::vector<double>& values, ReduceOp op) override {
    allreduce_host(values.data(), values.size(), MPI_DOUBLE, op, "f64");
  }
  void allreduce(std::vector<std::int64_t>& values, ReduceOp op) override {
    allreduce_host(values.data(), values.size(), MPI_INT64_T, op, "i64");
  }

  std::string broadcast(const std::string& value, int root) override {
    std::string what = str("broadcast(string, root ", root, ")");
    check_root(root, what);
    std::string result = rank_ == root ? value : std::string();
    MPI_Comm comm = comm_;
    submit(what, [&result, root, comm, what](detail::CollectiveWatch& watch) {
      std::uint64_t length = result.size();
      MPI_Request request;
      LOCKSTEP_CHECK_MPI(MPI_Ibcast(&length, 1, MPI_UINT64_T, root, comm, &request));
      watch.wait(request);
      result.resize(length);
      LOCKSTEP_CHECK_MPI(MPI_Ibcast(result.data(),
                                    mpi_count(static_cast<std::int64_t>(length), what), MPI_CHAR,
                                    root, comm, &request));
      watch.wait(request);
    })->wait();
    return result;
  }

  std::vector<std::string> allgather(const std::string& value) override {
    std::vector<std::string> result(size_);
    MPI_Comm comm = comm_;
    const int size = size_;
    submit("allgather(string)", [&result, &value, comm, size](detail::CollectiveWatch& watch) {
      int mine = mpi_count(static_cast<std::int64_t>(value.size()), "allgather(string)");
      std::vector<int> lengths(size), offsets(size);
      MPI_Request request;
      LOCKSTEP_CHECK_MPI(
          MPI_Iallgather(&mine, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm, &request));
      watch.wait(request);
      std::int64_t total = 0;
      for (int r = 0; r < size; ++r) {
        offsets[r] = static_cast<int>(total);
        total += lengths[r];
      }
      std::string all(mpi_count(total, "allgather(string)"), '\0');
      LOCKSTEP_CHECK_MPI(MPI_Iallgatherv(value.data(), mine, MPI_CHAR, all.data(), lengths.data(),
                                         offsets.data(), MPI_CHAR, comm, &request));
      watch.wait(request);
      for (int r = 0; r < size; ++r)
        result[r] = all.substr(offsets[r], lengths[r]);
    })->wait();
    return result;
  }

  std::vector<std::string> gather(const std::string& value, int root) override {
    LOCKSTEP_CHECK(root >= 0 && root < size_, "gather: root ", root, " is not a rank of ", size_);
    std::vector<std::string> result;
    MPI_Comm comm = comm_;
    const int size = size_;
    const bool is_root = rank_ == root;
    submit("gather(string)", [&result, &value, comm, size, root,
                              is_root](detail::CollectiveWatch& watch) {
      int mine = mpi_count(static_cast<std::int64_t>(value.size()), "gather(string)");
      std::vector<int> lengths(is_root ? size : 0), offsets(is_root ? size : 0);
      MPI_Request request;
      LOCKSTEP_CHECK_MPI(
          MPI_Igather(&mine, 1, MPI_INT, lengths.data(), 1, MPI_INT, root, comm, &request));
      watch.wait(request);
      std::int64_t total = 0;
      for (int r = 0; is_root && r < size; ++r) {
        offsets[r] = static_cast<int>(total);
        total += lengths[r];
      }
      std::string all(is_root ? mpi_count(total, "gather(string)") : 0, '\0');
      LOCKSTEP_CHECK_MPI(MPI_Igatherv(value.data(), mine, MPI_CHAR, all.data(), lengths.data(),
                                      offsets.data(), MPI_CHAR, root, comm, &request));
      watch.wait(request);
      for (int r = 0; is_root && r < size; ++r)
        result.push_back(all.substr(offsets[r], lengths[r]));
    })->wait();
    return result;
  }

  // For comm/ algorithms made of several MPI calls (comm/mpi_job.hpp).
  WorkPtr submit_watched_job(std::string what,
                             std::function<void(MPI_Comm, detail::CollectiveWatch&)> job) {
    MPI_Comm comm = comm_;
    return submit(std::move(what), [job = std::move(job), comm](detail::CollectiveWatch& watch) {
      job(comm, watch);
    });
  }

  WorkPtr submit_job(std::string what, std::function<void(MPI_Comm)> job) {
    MPI_Comm comm = comm_;
    return thread_->submit(std::move(what), [job = std::move(job), comm] { job(comm); });
  }

  // Baseline for benchmarks: same MPI call, caller's thread, no queue.
  void allreduce_on_caller(Tensor& t, ReduceOp op) {
    std::string what = str("allreduce on caller(", describe(t), ", ", reduce_op_name(op), ")");
    check_host(t, what);
    std::lock_guard<std::mutex> lock(caller_mpi_);  // keeps the idle thread's polls out
    LOCKSTEP_CHECK(thread_->idle(), what,
                   ": the communicator has operations in flight; wait for them first");
    LOCKSTEP_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, t.raw_data(), mpi_count(t.numel(), what),
                                     detail::reduction_type(t.dtype(), what.c_str()),
                                     detail::to_mpi_op(op, t.dtype()), comm_));
  }

  void run_on_thread(const std::function<void()>& fn) {
    std::exception_ptr error;
    thread_
        ->submit("run_on_mpi_thread",
                 [&fn, &error] {
                   try {
                     fn();
                   } catch (...) {
                     error = std::current_exception();
                   }
                 })
        ->wait();
    if (error) std::rethrow_exception(error);
  }

 private:
  static std::string describe(const Tensor& t) {
    return t.defined() ? t.describe() : std::string("undefined tensor");
  }

  void check_host(const Tensor& t, const std::string& what) const {
    LOCKSTEP_CHECK(t.defined(), what, ": tensor is undefined");
    LOCKSTEP_CHECK_HINT(t.device().is_cpu(), "GPU tensors go through the NCCL communicator", what,
                        ": the MPI communicator takes host tensors, got one on ", t.device().str());
  }

  void check_root(int root, const std::string& what) const {
    LOCKSTEP_CHECK(root >= 0 && root < size_, what, ": root ", root, " is outside [0, ", size_,
                   ")");
  }

  // Host vectors of 8-byte elements (f64, i64).
  void allreduce_host(void* data, std::size_t n, MPI_Datatype type, ReduceOp op,
                      const char* dtype) {
    std::string what = str("allreduce(", dtype, " x ", n, ", ", reduce_op_name(op), ")");
    int count = mpi_count(static_cast<std::int64_t>(n), what);
    MPI_Comm comm = comm_;
    std::vector<std::byte>* scratch = &scratch_;
    submit(what, [data, n, count, type, op, comm, scratch](detail::CollectiveWatch& watch) {
      detail::allreduce_in_place(data, count, type, n * 8, detail::to_mpi_op(op), comm, watch,
                                 *scratch);
    })->wait();
  }

  // Queues one collective; `body` starts it and waits through the watch, which numbers it and
  // bounds its wait by the timeout. The step is the caller's now, not when the thread gets to it.
  WorkPtr submit(std::string what, std::function<void(detail::CollectiveWatch&)> body) {
    const std::int64_t step_now = step();
    detail::CollectiveWatch* watch = watch_.get();
    return thread_->submit(what, [watch, step_now, what, body = std::move(body)] {
      watch->begin(what, step_now);
      struct End {
        detail::CollectiveWatch* watch;
        ~End() { watch->end(); }
      } end{watch};
      body(*watch);
    });
  }

  int rank_, size_, local_rank_, local_size_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::unique_ptr<detail::CollectiveWatch> watch_;
  std::vector<std::byte> scratch_;  // the short allreduce's receive buffer (comm thread only)
  std::mutex caller_mpi_;  // idle polls vs. allreduce_on_caller: MPI calls must not overlap
  std::unique_ptr<detail::CommThread> thread_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(const MpiSession& session,
                                                    const MpiOptions& options) {
  return std::make_unique<MpiCommunicator>(session, options);
}

void mpi_allreduce_on_caller(Communicator& comm, Tensor& t, ReduceOp op) {
  auto* mpi = dynamic_cast<MpiCommunicator*>(&comm);
  LOCKSTEP_CHECK(mpi != nullptr, "mpi_allreduce_on_caller needs an MPI communicator, got ",
                 comm.backend());
  mpi->allreduce_on_caller(t, op);
}

void run_on_mpi_thread(Communicator& comm, const std::function<void()>& fn) {
  auto* mpi = dynamic_cast<MpiCommunicator*>(&comm);
  LOCKSTEP_CHECK(mpi != nullptr, "run_on_mpi_thread needs an MPI communicator, got ",
                 comm.backend());
  mpi->run_on_thread(fn);
}
namespace detail {
WorkPtr submit_mpi_job(Communicator& mpi, std::string what, std::function<void(MPI_Comm)> job) {
  auto* m = dynamic_cast<MpiCommunicator*>(&mpi);
  LOCKSTEP_CHECK(m != nullptr, what, " needs an MPI communicator, got ", mpi.backend());
  return m->submit_job(std::move(what), std::move(job));
}
WorkPtr submit_watched_mpi_job(Communicator& mpi, std::string what,
                               std::function<void(MPI_Comm, CollectiveWatch&)> job) {
  auto* m = dynamic_cast<MpiCommunicator*>(&mpi);
  LOCKSTEP_CHECK(m != nullptr, what, " needs an MPI communicator, got ", mpi.backend());
  return m->submit_watched_job(std::move(what), std::move(job));
}
}  // namespace detail

}  // namespace lockstep::comm
