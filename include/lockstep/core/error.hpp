// lockstep's one exception type and the checks that raise it.
// Every error carries where it was raised (file:line) and, where we know one, a hint on how to
// fix it ("regenerate with lockstep-shard"), so a message in a 512-rank Slurm log is actionable.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace lockstep {

class Error : public std::runtime_error {
 public:
  Error(const std::string& message, const std::string& hint, const char* file, int line);

  const std::string& message() const { return message_; }
  const std::string& hint() const { return hint_; }
  const char* file() const { return file_; }
  int line() const { return line_; }

 private:
  std::string message_;
  std::string hint_;
  const char* file_;
  int line_;
};

// str(a, b, c) concatenates anything that has an operator<<.
template <class... Args>
std::string str(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

}  // namespace lockstep

#define LOCKSTEP_FAIL(...) \
  throw ::lockstep::Error(::lockstep::str(__VA_ARGS__), "", __FILE__, __LINE__)
#define LOCKSTEP_FAIL_HINT(hint, ...) \
  throw ::lockstep::Error(::lockstep::str(__VA_ARGS__), (hint), __FILE__, __LINE__)
// LOCKSTEP_CHECK(cond, "message parts", ...): throws lockstep::Error when cond is false.
#define LOCKSTEP_CHECK(cond, ...) \
  do {                            \
    if (!(cond)) [[unlikely]] {   \
      LOCKSTEP_FAIL(__VA_ARGS__); \
    }                             \
  } while (0)
#define LOCKSTEP_CHECK_HINT(cond, hint, ...) \
  do {                                       \
    if (!(cond)) [[unlikely]] {              \
      LOCKSTEP_FAIL_HINT(hint, __VA_ARGS__); \
    }                                        \
  } while (0)
