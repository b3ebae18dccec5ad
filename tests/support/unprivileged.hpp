// Runs a check as a user without special rights. Tests run as root on the development machines,
// and root reads and writes files whatever their permissions, so a permission error can only be
// seen from a process that gave root up: fn runs in a forked child that switches to nobody
// (uid/gid 65534) first when running as root, and its result comes back over a pipe.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <string>

namespace lockstep::test {

inline std::string run_unprivileged(const std::function<std::string()>& fn) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    std::string out;
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) {
      out = "cannot drop root";
    } else {
      try {
        out = fn();
      } catch (const std::exception& e) {
        out = e.what();
      }
    }
    (void)!::write(fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;)
    out.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return out;
}

}  // namespace lockstep::test
