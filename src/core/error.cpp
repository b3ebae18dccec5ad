#include "lockstep/core/error.hpp"

#include <cstdio>
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

void rethrow_with_context(const std::string& context) {
  try {
    throw;
  } catch (const OutOfMemory& e) {
    throw OutOfMemory(context + ": " + e.message(), e.hint(), e.file(), e.line());
  } catch (const Error& e) {
    throw Error(context + ": " + e.message(), e.hint(), e.file(), e.line());
  }
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

}  // namespace lockstep
