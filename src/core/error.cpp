#include "lockstep/core/error.hpp"

#include <cstring>

namespace lockstep {
namespace {
std::string compose(const std::string& message, const std::string& hint, const char* file,
                    int line) {
  const char* base = std::strrchr(file, '/');
  std::string out = message;
  if (!hint.empty()) out += " (hint: " + hint + ")";
  out += str(" [", base ? base + 1 : file, ":", line, "]");
  return out;
}
}  // namespace

Error::Error(const std::string& message, const std::string& hint, const char* file, int line)
    : std::runtime_error(compose(message, hint, file, line)),
      message_(message),
      hint_(hint),
      file_(file),
      line_(line) {}

}  // namespace lockstep
