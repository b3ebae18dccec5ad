#include "lockstep/comm/bootstrap.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "comm/mpi_check.hpp"
#include "lockstep/core/error.hpp"

namespace lockstep::comm {
namespace {
std::atomic<int> g_world_rank{-1};  // for abort_job's prefix, set once MPI is up
}  // namespace

namespace detail {
std::atomic<int>& live_mpi_communicators() {
  static std::atomic<int> count{0};
  return count;
}
}  // namespace detail

MpiSession::MpiSession(int* argc, char*** argv, ThreadLevel required) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  LOCKSTEP_CHECK_HINT(!initialized, "construct exactly one MpiSession, first thing in main",
                      "MPI is already initialised");
  // Each rank runs a compute thread and a communication thread; while the comm thread waits
  // inside MPI for a peer, Open MPI's default busy polling takes the core the compute thread
  // needs (on a node with a core per rank, the backward pass then runs at half speed during
  // overlapped allreduces). Yielding while idle gives it back: on the shared 2-core development
  // machine under heavy load it cut the exposed allreduce of the MLP step from ~62 ms to ~20 ms
  // (two runs each); with less load the two settings were within noise. A user's setting wins.
  setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
  // The communicator starts every collective non-blocking (so a wait can be bounded by
  // dist.timeout_s and sleep instead of spin). For in-place allreduces Open MPI's libnbc then
  // always picks a binomial tree (reduce to rank 0, broadcast back: twice the data of a ring)
  // and allocates a full-size scratch buffer per call; its ring algorithm brings large
  // allreduces back to the speed of the blocking MPI_Allreduce (docs/DISTRIBUTED.md has the
  // measurements). Only Open MPI reads this; a user's setting wins.
  setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", /*overwrite=*/0);
  int provided = MPI_THREAD_SINGLE;
  LOCKSTEP_CHECK_MPI(MPI_Init_thread(argc, argv, detail::to_mpi_thread_level(required), &provided));
  provided_ = detail::from_mpi_thread_level(provided);
  if (provided_ < required) {
    MPI_Finalize();
    LOCKSTEP_FAIL_HINT(
        "use an MPI built with thread support (Open MPI: --enable-mpi-thread-multiple)",
        "MPI provides only ", thread_level_name(provided_), " but lockstep needs ",
        thread_level_name(required),
        " (its communication thread makes MPI calls outside the main thread)");
  }
  LOCKSTEP_CHECK_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  LOCKSTEP_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  LOCKSTEP_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  g_world_rank = rank_;

  // Local rank from shared-memory domains: correct under mpirun, srun and mpirun-in-sbatch,
  // unlike SLURM_LOCALID / OMPI_COMM_WORLD_LOCAL_RANK, which not every launcher sets.
  MPI_Comm node = MPI_COMM_NULL;
  LOCKSTEP_CHECK_MPI(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  LOCKSTEP_CHECK_MPI(MPI_Comm_rank(node, &local_rank_));
  LOCKSTEP_CHECK_MPI(MPI_Comm_size(node, &local_size_));
  LOCKSTEP_CHECK_MPI(MPI_Comm_free(&node));
  int leader = local_rank_ == 0 ? 1 : 0;
  LOCKSTEP_CHECK_MPI(MPI_Allreduce(&leader, &nodes_, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));

  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  hostname_ = host;
  launch_ = LaunchInfo::from_environment();
}

MpiSession::~MpiSession() {
  if (int live = detail::live_mpi_communicators().load(); live > 0) {
    std::fprintf(stderr,
                 "rank %d: warning: MpiSession destroyed while %d MPI communicator(s) are alive; "
                 "destroy communicators first\n",
                 rank_, live);
  }
  g_world_rank = -1;
  MPI_Finalize();
}

std::string MpiSession::describe() const {
  return str("rank ", rank_, "/", size_, " (local ", local_rank_, "/", local_size_, " on ",
             hostname_, ", ", nodes_, nodes_ == 1 ? " node, " : " nodes, ",
             thread_level_name(provided_), ", ", launch_.describe(), ")");
}

void abort_job(const std::string& message, int code) {
  int rank = g_world_rank.load();
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  const bool mpi_up = initialized && !finalized;
  if (rank < 0 && mpi_up) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank >= 0) {
    std::fprintf(stderr, "rank %d: %s\n", rank, message.c_str());
  } else {
    std::fprintf(stderr, "rank ?: %s\n", message.c_str());
  }
  std::fflush(stderr);
  int size = 0;
  if (mpi_up) MPI_Comm_size(MPI_COMM_WORLD, &size);
  // A job of one rank has nobody to take down: exit without MPI_Abort's launcher noise (a
  // singleton's MPI_Abort makes ORTE print an unrelated unpack error).
  if (mpi_up && size > 1) MPI_Abort(MPI_COMM_WORLD, code == 0 ? 1 : code);
  std::_Exit(code == 0 ? 1 : code);
}

int run_or_abort(const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    abort_job(str("error: ", e.what()));
  } catch (...) {
    abort_job("error: unknown exception");
  }
}

}  // namespace lockstep::comm
