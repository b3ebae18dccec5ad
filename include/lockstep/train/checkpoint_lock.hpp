// The lock of a checkpoint folder: one run at a time writes checkpoint.dir. Two runs sharing one
// remove each other's temporary files and overwrite or prune each other's checkpoints, so rank 0
// holds an flock on DIR/.lock from start-up, before any checkpoint file is touched, to the end of
// the run. The file says who holds it (host, pid, Slurm job id, since when), which is what the
// next run's error shows. flock is released by the kernel when its holder dies, so a leftover file
// whose lock is free is stale: it is taken over, with a note naming the run that left it.
#pragma once

#include <functional>
#include <string>

#include "lockstep/core/file.hpp"

namespace lockstep::train {

inline constexpr const char* kCheckpointLockFile = ".lock";

class CheckpointLock {
 public:
  // Creates `dir` if needed and takes DIR/.lock, or throws lockstep::Error naming the holder.
  // `note` gets a line when a stale lock was taken over, or when the file system cannot lock (then
  // the run goes on unprotected, as a run did before the lock existed).
  CheckpointLock(const std::string& dir, const std::function<void(const std::string&)>& note);
  // Empties the file (a run that ended leaves no holder's name behind) and releases the lock.
  ~CheckpointLock();
  CheckpointLock(const CheckpointLock&) = delete;
  CheckpointLock& operator=(const CheckpointLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  UniqueFd fd_;
};

}  // namespace lockstep::train
