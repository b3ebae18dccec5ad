// Process start-up for MPI jobs: MpiSession initialises MPI (the first thing an app's main
// constructs, destroyed last) and tells each rank who it is. Rank, size and local rank always
// come from MPI itself, never from the environment: under mpirun inside an sbatch job every
// rank sees SLURM_PROCID=0. LaunchInfo keeps the launcher's variables for diagnostics only.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace lockstep::comm {

// MPI thread-support levels, weakest first (MPI_THREAD_SINGLE ... MPI_THREAD_MULTIPLE).
enum class ThreadLevel { Single, Funneled, Serialized, Multiple };
const char* thread_level_name(ThreadLevel level);  // "MPI_THREAD_SERIALIZED", ...

// Why Serialized is the default: after MPI_Init_thread the MPI communicator makes every MPI
// call on its own communication thread, never concurrently with the main thread. Funneled is
// not enough (it allows MPI calls from the main thread only); Serialized allows any thread as
// long as calls never overlap. Multiple is only needed to run two MPI communicators (two comm
// threads) at once; make_mpi_communicator checks this.
inline constexpr ThreadLevel kDefaultThreadLevel = ThreadLevel::Serialized;

// The launcher's environment, recorded at start-up for logs and error messages.
struct LaunchInfo {
  std::string launcher;  // "srun", "mpirun", "mpirun inside Slurm job N", or "singleton"
  std::map<std::string, std::string> env;  // SLURM_*, OMPI_COMM_WORLD_*, PMIX_*, CUDA_VISIBLE_*

  // Reads the current process environment.
  static LaunchInfo from_environment();
  // Pure version for tests: classifies the launcher from a given variable map (only the
  // variables with the prefixes above are kept).
  static LaunchInfo from_variables(const std::map<std::string, std::string>& variables);

  std::optional<std::string> get(const std::string& key) const;
  std::optional<int> get_int(const std::string& key) const;  // nullopt if absent or not a number
  // One line for logs: "launcher=srun SLURM_JOB_ID=12 SLURM_PROCID=1 ...".
  std::string describe() const;
};

class MpiSession {
 public:
  // Calls MPI_Init_thread asking for `required` and throws lockstep::Error if MPI provides
  // less. Only one MpiSession may exist per process (MPI cannot be initialised twice).
  MpiSession(int* argc, char*** argv, ThreadLevel required = kDefaultThreadLevel);
  ~MpiSession();  // MPI_Finalize; destroy every Communicator before this
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }  // from MPI_Comm_split_type(SHARED)
  int local_size() const { return local_size_; }
  int nodes() const { return nodes_; }  // number of distinct shared-memory nodes
  ThreadLevel thread_level() const { return provided_; }
  const std::string& hostname() const { return hostname_; }
  const LaunchInfo& launch() const { return launch_; }
  // "rank 3/8 (local 1/4 on node17, 2 nodes, MPI_THREAD_SERIALIZED, launcher=srun ...)"
  std::string describe() const;

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, nodes_ = 1;
  ThreadLevel provided_ = ThreadLevel::Single;
  std::string hostname_;
  LaunchInfo launch_;
};

// Ends the whole job: prints "rank R: message" to stderr and calls MPI_Abort (or exits when MPI
// is not running). A rank that fails must take the job down, never leave the others blocked
// in a collective until the wall-clock limit. Safe to call from any thread.
[[noreturn]] void abort_job(const std::string& message, int code = 1);

// Runs body() and turns any escaping exception into abort_job(what()), so apps get "rank R:
// <error>" and a terminated job instead of a hang. Returns body()'s exit code.
int run_or_abort(const std::function<int()>& body);

// ---- which GPU a rank drives (train.gpu) ----
// Two launch layouts are common: every rank of a node sees all its GPUs (mpirun, srun without GPU
// binding), so rank k must take device k; or the launcher gives each rank its own GPU (srun
// --gpus-per-task=1 --gpu-bind=single:1: CUDA_VISIBLE_DEVICES differs per rank), so each rank
// takes its only device, 0. `auto` tells them apart by what the node's ranks actually see.
struct GpuChoice {
  enum class Kind {
    Auto,          // position among the local ranks that see exactly the same GPUs
    LocalRank,     // device = local rank (every rank sees every GPU of the node)
    FirstVisible,  // device 0 (the launcher bound one GPU to each rank)
    Index,         // device `index` on every rank
  };
  Kind kind = Kind::Auto;
  int index = 0;

  // "auto", "local_rank", "first_visible" or a device index; throws naming train.gpu.
  static GpuChoice parse(const std::string& text);
  std::string str() const;
};

// The GPUs one rank sees, in its device order, each by an identity that is the same whichever
// rank looks at it (the GPU's UUID), so ranks can tell a shared GPU from their own.
using VisibleGpus = std::vector<std::string>;

// The device index each local rank drives, indexed by local rank, from every local rank's
// visible GPUs. Throws naming the rank and the counts when a rank sees no GPU or too few for its
// index, and naming both ranks when two local ranks would drive the same physical GPU (NCCL
// cannot put two ranks of one communicator on one GPU).
std::vector<int> choose_gpus(const GpuChoice& choice, const std::vector<VisibleGpus>& local_views);

}  // namespace lockstep::comm
