#include "lockstep/comm/hierarchical.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <map>

#include "comm/mpi_job.hpp"
#include "comm/mpi_watch.hpp"
#include "lockstep/core/bf16.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/core/simd_clones.hpp"

namespace lockstep::comm {
namespace {

// For every rank, the lowest world rank of its MPI shared-memory domain (one id per domain).
std::vector<int> shared_memory_domains(Communicator& mpi) {
  std::vector<int> domain(static_cast<std::size_t>(mpi.size()), -1);
  detail::submit_mpi_job(
      mpi, "shared-memory domains (MPI_Comm_split_type)",
      [&domain](MPI_Comm world) {
        int rank = 0;
        LOCKSTEP_CHECK_MPI(MPI_Comm_rank(world, &rank));
        MPI_Comm shm = MPI_COMM_NULL;
        LOCKSTEP_CHECK_MPI(
            MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shm));
        int lowest = rank;
        const int rc = MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, shm);
        MPI_Comm_free(&shm);
        LOCKSTEP_CHECK_MPI(rc);
        LOCKSTEP_CHECK_MPI(MPI_Allgather(&lowest, 1, MPI_INT, domain.data(), 1, MPI_INT, world));
      })
      ->wait();
  return domain;
}

// out[lo, hi) = s_0 op s_1 op ... op s_{L-1}, left to right: the same order on every node, in
// every run, whichever rank computes the slice.
template <class T>
void reduce_slots(ReduceOp op, T* out, const std::vector<const T*>& slots, std::int64_t lo,
                  std::int64_t hi) {
  std::copy(slots[0] + lo, slots[0] + hi, out + lo);
  for (std::size_t k = 1; k < slots.size(); ++k) {
    const T* s = slots[k];
    switch (op) {
      case ReduceOp::Sum:
        for (std::int64_t i = lo; i < hi; ++i)
          out[i] += s[i];
        break;
      case ReduceOp::Max:
        for (std::int64_t i = lo; i < hi; ++i)
          out[i] = std::max(out[i], s[i]);
        break;
      case ReduceOp::Min:
        for (std::int64_t i = lo; i < hi; ++i)
          out[i] = std::min(out[i], s[i]);
        break;
    }
  }
}

// out[lo, hi) = s_0 op ... op s_{L-1} over bf16 slots, combined left to right in f32 and rounded
// once. Blocks of f32 accumulators keep the loops free of branches, so the compiler vectorises
// them; every clone does the same f32 operations in the same order (same bits).
template <class Combine>
void combine_bf16_slots(std::uint16_t* out, const std::uint16_t* const* slots, int count,
                        std::int64_t lo, std::int64_t hi) {
  constexpr std::int64_t kBlock = 512;
  float acc[kBlock];
  for (std::int64_t b = lo; b < hi; b += kBlock) {
    const std::int64_t n = std::min(kBlock, hi - b);
    for (std::int64_t j = 0; j < n; ++j)
      acc[j] = bf16_to_float(slots[0][b + j]);
    for (int k = 1; k < count; ++k) {
      const std::uint16_t* s = slots[k] + b;
      for (std::int64_t j = 0; j < n; ++j)
        acc[j] = Combine{}(acc[j], bf16_to_float(s[j]));
    }
    for (std::int64_t j = 0; j < n; ++j)
      out[b + j] = float_to_bf16(acc[j]);
  }
}

// The sum is the hot one (every gradient element of every bucket).
LOCKSTEP_SIMD_CLONES void sum_bf16_slots(std::uint16_t* out, const std::uint16_t* const* slots,
                                         int count, std::int64_t lo, std::int64_t hi) {
  combine_bf16_slots<detail::F32Add>(out, slots, count, lo, hi);
}

// Tensor allreduces run hierarchically as jobs on the MPI communicator's thread; every other
// call is forwarded to it. The node's shared window holds (local size) input slots of one
// segment each, then two result segments (see run()), allocated by the node's leader and
// mapped by every local rank.
class HierarchicalCommunicator final : public Communicator {
 public:
  HierarchicalCommunicator(Communicator& mpi, const NodeLayout& layout,
                           const HierarchicalOptions& options)
      : mpi_(mpi), layout_(layout) {
    LOCKSTEP_CHECK(layout.ranks() == mpi.size(), "hierarchical allreduce: the node layout has ",
                   layout.ranks(), " ranks but the job has ", mpi.size());
    rank_ = mpi.rank();
    node_ = layout.node_of(rank_);
    local_rank_ = layout.local_rank(rank_);
    local_size_ = static_cast<int>(layout.members(node_).size());
    // Whole elements of every reducible dtype (at most 8 bytes) per segment.
    segment_bytes_ = options.segment_bytes / 8 * 8;
    LOCKSTEP_CHECK(segment_bytes_ >= 8 && segment_bytes_ <= (std::size_t{1} << 30),
                   "hierarchical allreduce: segment of ", options.segment_bytes,
                   " bytes is outside [8 B, 1 GiB]");
    // A node's ranks share a window, so they must share memory; checked here, on the caller's
    // thread, so a bad layout throws without failing the MPI communicator's queue.
    const std::vector<int> domain = shared_memory_domains(mpi);
    for (int node = 0; node < layout.nodes(); ++node) {
      const std::vector<int>& m = layout.members(node);
      for (int r : m) {
        LOCKSTEP_CHECK_HINT(
            domain[r] == domain[m[0]], "group only ranks that MPI places on one node",
            "hierarchical allreduce: node ", layout.host(node), " (", describe_ranks(m),
            ") holds ranks ", m[0], " and ", r, ", which do not share memory");
      }
    }
    detail::submit_mpi_job(mpi, str("hierarchical allreduce setup (", layout.describe(), ")"),
                           [this](MPI_Comm world) { setup(world); })
        ->wait();
  }

  ~HierarchicalCommunicator() override {
    // Unwinding towards abort_job: the other ranks may sit in another collective, and a
    // collective free would hang this one instead of ending the job.
    if (std::uncaught_exceptions() > 0) return;
    try {
      detail::submit_mpi_job(mpi_, "hierarchical allreduce teardown", [this](MPI_Comm) {
        teardown();
      })->wait();
    } catch (...) {
      // The MPI communicator already failed (its queue refuses jobs after an error); the job
      // is ending, and freeing MPI objects collectively could only hang.
    }
  }

  using Communicator::allreduce;

  int rank() const override { return rank_; }
  int size() const override { return mpi_.size(); }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string backend() const override { return "mpi-hierarchical"; }

  WorkPtr allreduce_async(Tensor t, ReduceOp op) override {
    std::string what =
        str("hierarchical allreduce(", t.defined() ? t.describe() : std::string("undefined tensor"),
            ", ", reduce_op_name(op), ")");
    LOCKSTEP_CHECK(t.defined(), what, ": tensor is undefined");
    LOCKSTEP_CHECK_HINT(t.device().is_cpu(), "GPU tensors go through the NCCL communicator", what,
                        ": takes host tensors, got one on ", t.device().str());
    MPI_Datatype type = detail::reduction_type(t.dtype(), what.c_str());
    // Under dist.timeout_s like every collective: its node barriers and the leaders' allreduce
    // are waited for through the watch, so a rank that stops is reported and ends the job.
    return detail::submit_watched_mpi_job(
        mpi_, what,
        [this, t, op, type](MPI_Comm, detail::CollectiveWatch& watch) { run(t, op, type, watch); });
  }
  WorkPtr broadcast_async(Tensor t, int root) override { return mpi_.broadcast_async(t, root); }
  WorkPtr allgather_async(Tensor in, Tensor out) override { return mpi_.allgather_async(in, out); }
  WorkPtr reduce_scatter_async(Tensor in, Tensor out, ReduceOp op) override {
    return mpi_.reduce_scatter_async(in, out, op);
  }
  WorkPtr barrier_async() override { return mpi_.barrier_async(); }
  void allreduce(std::vector<double>& values, ReduceOp op) override { mpi_.allreduce(values, op); }
  void allreduce(std::vector<std::int64_t>& values, ReduceOp op) override {
    mpi_.allreduce(values, op);
  }
  std::string broadcast(const std::string& value, int root) override {
    return mpi_.broadcast(value, root);
  }
  std::vector<std::string> allgather(const std::string& value) override {
    return mpi_.allgather(value);
  }
  std::vector<std::string> gather(const std::string& value, int root) override {
    return mpi_.gather(value, root);
  }

 private:
  // On the communication thread.
  void setup(MPI_Comm world) {
    LOCKSTEP_CHECK_MPI(MPI_Comm_split(world, node_, local_rank_, &node_comm_));
    LOCKSTEP_CHECK_MPI(
        MPI_Comm_split(world, local_rank_ == 0 ? 0 : MPI_UNDEFINED, node_, &leader_comm_));
    if (local_size_ == 1) return;  // nothing to share: the leader reduces the tensor in place
    const auto bytes = static_cast<MPI_Aint>(
        local_rank_ == 0 ? segment_bytes_ * static_cast<std::size_t>(local_size_ + 2) : 0);
    void* mine = nullptr;
    LOCKSTEP_CHECK_MPI(
        MPI_Win_allocate_shared(bytes, 1, MPI_INFO_NULL, node_comm_, &mine, &window_));
    LOCKSTEP_CHECK_MPI(MPI_Win_set_errhandler(window_, MPI_ERRORS_RETURN));
    MPI_Aint size = 0;
    int unit = 0;
    void* base = nullptr;
    LOCKSTEP_CHECK_MPI(MPI_Win_shared_query(window_, 0, &size, &unit, &base));
    base_ = static_cast<char*>(base);
    // One passive epoch for the window's life: loads and stores, ordered by node_sync().
    LOCKSTEP_CHECK_MPI(MPI_Win_lock_all(MPI_MODE_NOCHECK, window_));
  }

  void teardown() {
    if (window_ != MPI_WIN_NULL) {
      MPI_Win_unlock_all(window_);
      MPI_Win_free(&window_);
    }
    if (leader_comm_ != MPI_COMM_NULL) MPI_Comm_free(&leader_comm_);
    if (node_comm_ != MPI_COMM_NULL) MPI_Comm_free(&node_comm_);
  }

  // Every local rank's stores before it are visible to every local rank's loads after it (the
  // MPI-3 shared-memory idiom: sync, barrier, sync).
  void node_sync(detail::CollectiveWatch& watch) {
    LOCKSTEP_CHECK_MPI(MPI_Win_sync(window_));
    MPI_Request barrier = MPI_REQUEST_NULL;
    LOCKSTEP_CHECK_MPI(MPI_Ibarrier(node_comm_, &barrier));
    watch.wait(barrier);
    LOCKSTEP_CHECK_MPI(MPI_Win_sync(window_));
  }

  // Segment after segment, pipelined: while the leaders' allreduce of segment k is in flight
  // (MPI_Iallreduce, progressed by the node barriers), the node already copies in and reduces
  // segment k+1; segment k is copied out after that. Two result buffers alternate, so segment
  // k+1's reduction never writes the buffer that segment k's allreduce still uses.
  //   k: copy in | sync | reduce -> result[k%2] | sync | leader: Iallreduce(result[k%2])
  //      | (segment k-1: leader waits | sync | copy out of result[(k-1)%2])
  // Buffer reuse is safe: result[k%2] was last read by segment k-2's copy-out, which every rank
  // finished before its copy-in of k and the sync after it; the input slots were last read by
  // the reduction of k-1, finished before the sync that follows it.
  void run(const Tensor& t, ReduceOp op, MPI_Datatype type, detail::CollectiveWatch& watch) {
    const std::size_t elem = dtype_size(t.dtype());
    const auto per_segment = static_cast<std::int64_t>(segment_bytes_ / elem);
    const std::int64_t n = t.numel();
    char* data = static_cast<char*>(t.raw_data());
    const bool between_nodes = layout_.nodes() > 1;
    const bool leader = local_rank_ == 0;
    struct InFlight {
      MPI_Request request = MPI_REQUEST_NULL;
      char* out = nullptr;     // the segment of the caller's tensor
      char* result = nullptr;  // its node sum in the window (nullptr: reduced in place)
      std::size_t bytes = 0;
    };
    InFlight previous;
    bool have_previous = false;
    auto finish = [&](InFlight& f) {
      if (leader && between_nodes) watch.wait(f.request);
      if (f.result == nullptr) return;  // a node of one rank reduced its tensor in place
      node_sync(watch);
      std::memcpy(f.out, f.result, f.bytes);
    };
    // Every leader cuts the tensor into the same segments, so the leaders' allreduces match.
    std::int64_t k = 0;
    for (std::int64_t offset = 0; offset < n; offset += per_segment, ++k) {
      const std::int64_t len = std::min(per_segment, n - offset);
      InFlight now;
      now.out = data + static_cast<std::size_t>(offset) * elem;
      now.bytes = static_cast<std::size_t>(len) * elem;
      char* target = now.out;
      if (local_size_ > 1) {
        now.result = base_ + segment_bytes_ * static_cast<std::size_t>(local_size_ + k % 2);
        target = now.result;
        std::memcpy(base_ + segment_bytes_ * static_cast<std::size_t>(local_rank_), now.out,
                    now.bytes);
        node_sync(watch);
        // Each local rank reduces its own slice, so the node's cores share the work.
        const std::int64_t lo = len * local_rank_ / local_size_;
        const std::int64_t hi = len * (local_rank_ + 1) / local_size_;
        switch (t.dtype()) {
          case DType::F32:
            reduce_typed<float>(op, now.result, lo, hi);
            break;
          case DType::F64:
            reduce_typed<double>(op, now.result, lo, hi);
            break;
          case DType::I32:
            reduce_typed<std::int32_t>(op, now.result, lo, hi);
            break;
          case DType::BF16:
            reduce_bf16(op, now.result, lo, hi);
            break;
          default:
            LOCKSTEP_FAIL("hierarchical allreduce: no reduction for ", dtype_name(t.dtype()));
        }
        node_sync(watch);
      }
      if (leader && between_nodes) {
        LOCKSTEP_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, target, static_cast<int>(len), type,
                                          detail::to_mpi_op(op, t.dtype()), leader_comm_,
                                          &now.request));
      }
      if (have_previous) finish(previous);
      previous = now;
      have_previous = true;
    }
    if (have_previous) finish(previous);
  }

  template <class T>
  void reduce_typed(ReduceOp op, char* result, std::int64_t lo, std::int64_t hi) {
    std::vector<const T*> slots(static_cast<std::size_t>(local_size_));
    for (int k = 0; k < local_size_; ++k)
      slots[k] = reinterpret_cast<const T*>(base_ + segment_bytes_ * static_cast<std::size_t>(k));
    reduce_slots(op, reinterpret_cast<T*>(result), slots, lo, hi);
  }

  // bf16 (gradients sent as dist.grad_dtype = bf16): each element combined over the node's slots
  // in f32 and rounded once, so a node's sum is rounded once rather than once per local rank.
  void reduce_bf16(ReduceOp op, char* result, std::int64_t lo, std::int64_t hi) {
    std::vector<const std::uint16_t*> slots(static_cast<std::size_t>(local_size_));
    for (int k = 0; k < local_size_; ++k)
      slots[k] = reinterpret_cast<const std::uint16_t*>(base_ + segment_bytes_ *
                                                                    static_cast<std::size_t>(k));
    auto* out = reinterpret_cast<std::uint16_t*>(result);
    switch (op) {
      case ReduceOp::Sum:
        sum_bf16_slots(out, slots.data(), local_size_, lo, hi);
        break;
      case ReduceOp::Max:
        combine_bf16_slots<detail::F32Max>(out, slots.data(), local_size_, lo, hi);
        break;
      case ReduceOp::Min:
        combine_bf16_slots<detail::F32Min>(out, slots.data(), local_size_, lo, hi);
        break;
    }
  }

  Communicator& mpi_;
  NodeLayout layout_;
  int rank_ = 0, node_ = 0, local_rank_ = 0, local_size_ = 1;
  std::size_t segment_bytes_ = 0;
  MPI_Comm node_comm_ = MPI_COMM_NULL, leader_comm_ = MPI_COMM_NULL;
  MPI_Win window_ = MPI_WIN_NULL;
  char* base_ = nullptr;
};

}  // namespace

const char* allreduce_algorithm_name(AllreduceAlgorithm a) {
  switch (a) {
    case AllreduceAlgorithm::Auto:
      return "auto";
    case AllreduceAlgorithm::Flat:
      return "flat";
    case AllreduceAlgorithm::Hierarchical:
      return "hierarchical";
  }
  return "?";
}

AllreduceAlgorithm parse_allreduce_algorithm(const std::string& value, const std::string& key) {
  for (auto a :
       {AllreduceAlgorithm::Auto, AllreduceAlgorithm::Flat, AllreduceAlgorithm::Hierarchical}) {
    if (value == allreduce_algorithm_name(a)) return a;
  }
  LOCKSTEP_FAIL_HINT("use auto, flat or hierarchical", key, " = '", value,
                     "' is not an allreduce algorithm");
}

NodeLayout::NodeLayout(const std::vector<int>& node_of_rank, std::vector<std::string> hosts) {
  LOCKSTEP_CHECK(!node_of_rank.empty(), "NodeLayout: no ranks");
  LOCKSTEP_CHECK(hosts.empty() || hosts.size() == node_of_rank.size(), "NodeLayout: ", hosts.size(),
                 " host names for ", node_of_rank.size(), " ranks");
  std::map<int, int> dense;  // given id -> node number, in order of first rank
  for (std::size_t r = 0; r < node_of_rank.size(); ++r) {
    auto [it, added] = dense.emplace(node_of_rank[r], static_cast<int>(members_.size()));
    if (added) {
      members_.emplace_back();
      hosts_.push_back(hosts.empty() ? std::string() : hosts[r]);
    }
    node_of_rank_.push_back(it->second);
    members_[it->second].push_back(static_cast<int>(r));
  }
}

NodeLayout NodeLayout::detect(Communicator& mpi) {
  // One rank is one node, whatever the communicator (the in-process one of tests has no MPI).
  if (mpi.size() == 1) return NodeLayout({0}, {this_host()});
  std::vector<int> domain = shared_memory_domains(mpi);
  return NodeLayout(domain, mpi.allgather(this_host()));
}

int NodeLayout::local_rank(int rank) const {
  const std::vector<int>& m = members(node_of(rank));
  return static_cast<int>(std::find(m.begin(), m.end(), rank) - m.begin());
}

std::size_t NodeLayout::max_ranks_per_node() const {
  std::size_t most = 0;
  for (const auto& m : members_)
    most = std::max(most, m.size());
  return most;
}

std::string NodeLayout::host(int node) const {
  const std::string& h = hosts_.at(node);
  return h.empty() ? str("node ", node) : h;
}

std::string NodeLayout::describe() const {
  std::string s = str(nodes(), nodes() == 1 ? " node: " : " nodes: ");
  for (int n = 0; n < nodes(); ++n)
    s += str(n ? ", " : "", host(n), " (", describe_ranks(members(n)), ")");
  return s;
}

std::string describe_ranks(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1)
      ++j;
    s += str(i ? "," : "", ranks[i]);
    if (j > i) s += str("-", ranks[j]);
    i = j + 1;
  }
  return s;
}

AllreduceAlgorithm resolve_allreduce_algorithm(AllreduceAlgorithm requested,
                                               const NodeLayout& layout) {
  (void)layout;  // the measured policy has not needed the layout yet (see the header)
  return requested == AllreduceAlgorithm::Auto ? AllreduceAlgorithm::Flat : requested;
}

std::unique_ptr<Communicator> make_hierarchical_communicator(Communicator& mpi,
                                                             const NodeLayout& layout,
                                                             const HierarchicalOptions& options) {
  return std::make_unique<HierarchicalCommunicator>(mpi, layout, options);
}

std::unique_ptr<Communicator> make_gradient_communicator(Communicator& mpi,
                                                         AllreduceAlgorithm algorithm,
                                                         const NodeLayout& layout) {
  if (resolve_allreduce_algorithm(algorithm, layout) != AllreduceAlgorithm::Hierarchical)
    return nullptr;
  return make_hierarchical_communicator(mpi, layout);
}

void check_same_on_all_hosts(Communicator& comm, const NodeLayout& layout, const std::string& what,
                             const std::string& value, const std::string& hint) {
  const std::vector<std::string> all = comm.allgather(value);
  if (std::all_of(all.begin(), all.end(), [&](const std::string& v) { return v == all[0]; }))
    return;
  // "node1 (ranks 0-1) has cpu, node2 (ranks 2-3) has cuda", per node and value.
  std::string detail;
  for (int node = 0; node < layout.nodes(); ++node) {
    std::map<std::string, std::vector<int>> by_value;
    for (int r : layout.members(node))
      by_value[all[r]].push_back(r);
    for (const auto& [v, ranks] : by_value)
      detail += str(detail.empty() ? "" : ", ", layout.host(node), " (", describe_ranks(ranks),
                    ") has ", v);
  }
  LOCKSTEP_FAIL_HINT(hint, what, " differs between hosts: ", detail);
}

std::string this_host() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return host;
}

}  // namespace lockstep::comm
