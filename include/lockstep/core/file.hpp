// Small POSIX file helpers shared by the writers of shards and checkpoints: an owned descriptor,
// errno as text, and publishing a finished file atomically and durably.
#pragma once

#include <string>

namespace lockstep {

// Owns a file descriptor (-1 = none) and closes it.
class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) : fd_(fd) {}
  ~UniqueFd();
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

 private:
  int fd_;
};

// strerror(errno): "Permission denied", "No such file or directory".
std::string errno_text();

// Makes the finished file `tmp` appear as `path`: fsync, rename, then fsync of the folder, so a
// crash leaves the old file or the new one, never a partial one under the final name.
void publish_file(const std::string& tmp, const std::string& path);

}  // namespace lockstep
