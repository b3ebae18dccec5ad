#include "lockstep/comm/node_shared.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "comm/mpi_job.hpp"
#include "lockstep/core/error.hpp"

namespace lockstep::comm {
namespace {

// Owns one mapping; unmapping is local, so a block can be dropped on any path, also while the
// job unwinds towards abort_job.
struct Mapping {
  void* address = MAP_FAILED;
  std::size_t length = 0;
  ~Mapping() {
    if (address != MAP_FAILED) ::munmap(address, length);
  }
};

// The writer's attempt, as one message every local rank can repeat: empty on success.
constexpr std::size_t kMessageBytes = 1024;

std::string create(const std::string& name, std::size_t length, Mapping& map) {
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return str("shm_open(", name, "): ", std::strerror(errno));
  // posix_fallocate reserves the pages now: a tmpfs without room says ENOSPC here instead of
  // killing a rank with SIGBUS at its first touch of a page that was never there.
  int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(length));
  std::string error;
  if (rc != 0) {
    error = str("reserving it in /dev/shm: ", std::strerror(rc));
  } else {
    map.address = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map.address == MAP_FAILED) error = str("mmap: ", std::strerror(errno));
  }
  ::close(fd);
  if (!error.empty()) ::shm_unlink(name.c_str());
  return error;
}

std::string open_read_only(const std::string& name, std::size_t length, Mapping& map) {
  const int fd = ::shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return str("shm_open(", name, "): ", std::strerror(errno));
  map.address = ::mmap(nullptr, length, PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  return map.address == MAP_FAILED ? str("mmap(", name, "): ", std::strerror(err)) : "";
}

}  // namespace

NodeSharedBlock allocate_node_shared(Communicator& mpi, std::int64_t bytes, const std::string& what,
                                     const std::string& hint) {
  LOCKSTEP_CHECK(bytes >= 0, "node-shared copy of ", what, ": ", bytes, " bytes");
  // mmap refuses length 0; an empty set still takes part in the collective steps.
  const std::size_t length = static_cast<std::size_t>(std::max<std::int64_t>(bytes, 1));
  auto map = std::make_shared<Mapping>();
  map->length = length;
  auto node = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
  bool writer = false;
  std::string writer_error, own_error;
  int all_mapped = 0;

  detail::submit_mpi_job(mpi, str("node-shared allocation (", what, ")"), [&](MPI_Comm world) {
    int rank = 0;
    LOCKSTEP_CHECK_MPI(MPI_Comm_rank(world, &rank));
    LOCKSTEP_CHECK_MPI(
        MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, node.get()));
    int local = 0;
    LOCKSTEP_CHECK_MPI(MPI_Comm_rank(*node, &local));
    writer = local == 0;
    // The writer's pid makes the name unique on the node; the counter, within the process.
    static std::atomic<int> counter{0};
    char message[kMessageBytes] = {};
    char name[64] = {};
    if (writer) {
      std::snprintf(name, sizeof name, "/lockstep-%ld-%d", static_cast<long>(::getpid()),
                    counter.fetch_add(1));
      std::snprintf(message, sizeof message, "%s", create(name, length, *map).c_str());
    }
    LOCKSTEP_CHECK_MPI(MPI_Bcast(name, sizeof name, MPI_CHAR, 0, *node));
    LOCKSTEP_CHECK_MPI(MPI_Bcast(message, sizeof message, MPI_CHAR, 0, *node));
    writer_error = message;
    if (!writer && writer_error.empty()) own_error = open_read_only(name, length, *map);
    int mapped = own_error.empty() && writer_error.empty() ? 1 : 0;
    LOCKSTEP_CHECK_MPI(MPI_Allreduce(&mapped, &all_mapped, 1, MPI_INT, MPI_MIN, *node));
    // Every local rank has mapped it (or given up): the name is no longer needed.
    if (writer && writer_error.empty()) ::shm_unlink(name);
    if (!all_mapped) {
      MPI_Comm_free(node.get());
      *node = MPI_COMM_NULL;
    }
  })->wait();

  const std::string size = format_bytes(static_cast<double>(bytes));
  LOCKSTEP_CHECK_HINT(writer_error.empty(),
                      str("make /dev/shm larger (mount -o remount,size=...; in a container "
                          "--shm-size), or ",
                          hint),
                      "node-shared copy of ", what, " (", size,
                      ") could not be created in "
                      "/dev/shm on this node: ",
                      writer_error);
  LOCKSTEP_CHECK_HINT(own_error.empty(), hint, "node-shared copy of ", what, " (", size,
                      "): this rank could not map it: ", own_error);
  LOCKSTEP_CHECK_HINT(all_mapped, hint, "node-shared copy of ", what, " (", size,
                      "): another rank of this node could not map it (see its error)");

  NodeSharedBlock block;
  block.data = map->address;
  block.bytes = bytes;
  block.writer = writer;
  block.mapping = map;
  block.published = [&mpi, node, what, hint, size](bool ok) {
    int all_ok = 0;
    int mine = ok ? 1 : 0;
    detail::submit_mpi_job(mpi, str("node-shared publish (", what, ")"), [&](MPI_Comm) {
      // The writer's stores before the collective are visible to the readers' loads after it:
      // the collective synchronises the processes, the fences keep the compiler from moving
      // plain loads and stores across it.
      std::atomic_thread_fence(std::memory_order_seq_cst);
      const int rc = MPI_Allreduce(&mine, &all_ok, 1, MPI_INT, MPI_MIN, *node);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      MPI_Comm_free(node.get());
      *node = MPI_COMM_NULL;
      LOCKSTEP_CHECK_MPI(rc);
    })->wait();
    LOCKSTEP_CHECK_HINT(all_ok || !ok, hint, "node-shared copy of ", what, " (", size,
                        "): local rank 0, which fills it, failed (see its error)");
  };
  return block;
}

}  // namespace lockstep::comm
