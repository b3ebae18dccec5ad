#include "lockstep/core/file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "lockstep/core/error.hpp"

namespace lockstep {

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

std::string errno_text() {
  return std::strerror(errno);
}

void publish_file(const std::string& tmp, const std::string& path) {
  {
    UniqueFd f(::open(tmp.c_str(), O_RDONLY | O_CLOEXEC));
    LOCKSTEP_CHECK(f.valid(), tmp, ": cannot reopen: ", errno_text());
    LOCKSTEP_CHECK_HINT(::fsync(f.get()) == 0, "check free space and quota", tmp,
                        ": fsync failed: ", errno_text());
  }
  LOCKSTEP_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, path, ": rename from ", tmp,
                 " failed: ", errno_text());
  // Makes the rename itself durable; some file systems refuse fsync on folders, which is harmless.
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(path).has_parent_path() ? fs::path(path).parent_path() : ".";
  UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d.valid()) ::fsync(d.get());
}

}  // namespace lockstep
