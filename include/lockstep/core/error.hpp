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

// A failed allocation: the message says how much was asked, on which device, and what was free;
// callers up the stack add what the memory was for (a tensor's shape, a layer, a data set) with
// rethrow_with_context, so the report names what to shrink.
class OutOfMemory final : public Error {
 public:
  using Error::Error;
};

// Inside a catch block: rethrows the current lockstep::Error (an OutOfMemory stays one) with
// "context: " in front of its message; hint and origin are kept.
[[noreturn]] void rethrow_with_context(const std::string& context);

// "3.2 GiB", "512 B": a byte count for messages.
std::string format_bytes(double bytes);

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
// The same with another type derived from Error (OutOfMemory).
#define LOCKSTEP_FAIL_HINT_TYPE(type, hint, ...) \
  throw ::lockstep::type(::lockstep::str(__VA_ARGS__), (hint), __FILE__, __LINE__)
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
