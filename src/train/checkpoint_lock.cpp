// flock, not fcntl (POSIX) locks: an flock belongs to the open file, so a second run in the same
// process (tests, a notebook) is refused as another process is, and closing some other descriptor
// of the file does not drop it. On NFS, Linux implements flock with the server's byte-range locks;
// a file system that has no locks at all (ENOLCK, EOPNOTSUPP) gets a warning, not a refusal.
// The file is never deleted: unlinking a lock file races with a run that has just opened it.
#include "lockstep/train/checkpoint_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <thread>

#include "lockstep/core/error.hpp"
#include "lockstep/train/config.hpp"

namespace fs = std::filesystem;

namespace lockstep::train {
namespace {

std::string read_all(int fd) {
  std::string text;
  char buf[512];
  for (off_t at = 0;;) {
    const ssize_t n = ::pread(fd, buf, sizeof buf, at);
    if (n <= 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    at += n;
  }
  return text;
}

// "host H, pid P, Slurm job J, since T" from the file's key=value lines; "" when it is empty.
std::string describe_holder(const std::string& text) {
  std::map<std::string, std::string> fields = parse_key_value_lines(text);
  if (fields.empty()) return "";
  auto field = [&](const char* key) {
    auto it = fields.find(key);
    return it == fields.end() || it->second.empty() ? std::string("?") : it->second;
  };
  std::string out = str("host ", field("host"), ", pid ", field("pid"));
  if (fields.count("slurm_job_id") && !fields["slurm_job_id"].empty())
    out += ", Slurm job " + fields["slurm_job_id"];
  return out + ", since " + field("since");
}

std::string holder_record() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  const char* job = std::getenv("SLURM_JOB_ID");
  const std::time_t now = std::time(nullptr);
  char since[32];
  std::strftime(since, sizeof since, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return key_value_lines({{"host", host},
                          {"pid", std::to_string(::getpid())},
                          {"slurm_job_id", job ? job : ""},
                          {"since", since}});
}

int open_lock_file(const std::string& dir, const std::string& path) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  LOCKSTEP_CHECK_HINT(!ec, "set checkpoint.dir to a place this user can write",
                      "checkpoint.dir = ", dir, ": cannot create the folder ", dir, ": ",
                      ec.message());
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  LOCKSTEP_CHECK_HINT(fd >= 0, "set checkpoint.dir to a place this user can write",
                      "checkpoint.dir = ", dir, ": cannot open its lock file ", path, ": ",
                      errno_text());
  return fd;
}

}  // namespace

CheckpointLock::CheckpointLock(const std::string& dir,
                               const std::function<void(const std::string&)>& note)
    : path_((fs::path(dir) / kCheckpointLockFile).string()), fd_(open_lock_file(dir, path_)) {
  if (::flock(fd_.get(), LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      // The holder writes its name right after taking the lock: give it a moment.
      std::string holder;
      for (int i = 0; i < 20 && holder.empty(); ++i) {
        holder = describe_holder(read_all(fd_.get()));
        if (holder.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      LOCKSTEP_FAIL_HINT(
          "two runs writing one folder remove each other's temporary files and overwrite each "
          "other's checkpoints: wait for that run to end (or stop it), or give this one another "
          "checkpoint.dir",
          "checkpoint.dir = ", dir, " is in use by another run (",
          holder.empty() ? "which has not written its name yet" : holder, "; lock file ", path_,
          ")");
    }
    if (note)
      note(str("warning: cannot lock ", path_, " (", std::strerror(err),
               "): this file system has no ",
               "flock, so nothing stops a second run from writing checkpoint.dir = ", dir,
               " at the same time"));
  } else {
    const std::string stale = describe_holder(read_all(fd_.get()));
    if (!stale.empty() && note)
      note(str("took over the lock of checkpoint.dir = ", dir, " left by ", stale,
               ", which no longer holds it (that process ended without releasing it)"));
  }
  const std::string record = holder_record();
  LOCKSTEP_CHECK(
      ::ftruncate(fd_.get(), 0) == 0 && ::pwrite(fd_.get(), record.data(), record.size(), 0) ==
                                            static_cast<ssize_t>(record.size()),
      path_, ": cannot write the lock file: ", errno_text());
}

CheckpointLock::~CheckpointLock() {
  // Should it fail, the holder's name stays: the next run calls the lock stale and takes it over.
  [[maybe_unused]] const int rc = ::ftruncate(fd_.get(), 0);
}

}  // namespace lockstep::train
