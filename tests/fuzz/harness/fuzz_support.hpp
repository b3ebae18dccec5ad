// What every fuzz target shares: the rule that only lockstep::Error may escape a reader (anything
// else -- a crash, a sanitizer report, std::bad_alloc, std::out_of_range -- is a finding), a
// per-process scratch file for readers that take a path, splitting one input into parts, and a
// check that no HDF5 object was left open. Used by the libFuzzer build and the replay build alike.
#pragma once

#include <hdf5.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/core/error.hpp"

namespace lockstep::fuzz {

// Separates the parts of one input (idx images | labels, INI text | overrides). A dictionary entry
// in each target's .dict lets the fuzzer insert it.
inline constexpr std::string_view kSeparator = "\n--8<--\n";

inline std::vector<std::string> split_input(const std::uint8_t* data, std::size_t size) {
  std::string_view all(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts;
  for (;;) {
    std::size_t at = all.find(kSeparator);
    parts.emplace_back(all.substr(0, at));
    if (at == std::string_view::npos) break;
    all.remove_prefix(at + kSeparator.size());
  }
  return parts;
}

// Runs fn; a lockstep::Error is the expected answer to bad input and is swallowed (printed when
// LOCKSTEP_FUZZ_VERBOSE is set, to see why an input is refused). Anything else propagates and
// ends the process, which both libFuzzer and the replay test report as a failure.
template <class Fn>
bool accepts(Fn&& fn) {
  static const bool verbose = std::getenv("LOCKSTEP_FUZZ_VERBOSE") != nullptr;
  try {
    fn();
    if (verbose) std::fprintf(stderr, "  accepted\n");
    return true;
  } catch (const Error& e) {
    if (verbose) std::fprintf(stderr, "  refused: %s\n", e.what());
    return false;
  }
}

// A property of accepted input that failed: print and abort, so the fuzzer saves the input.
[[noreturn]] inline void violated(const std::string& what) {
  std::fprintf(stderr, "fuzz property violated: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}
#define LOCKSTEP_FUZZ_ASSERT(cond, ...)                                                \
  do {                                                                                 \
    if (!(cond)) ::lockstep::fuzz::violated(::lockstep::str(#cond ": ", __VA_ARGS__)); \
  } while (0)

// One scratch file per process and name, in /dev/shm when it exists (each input is written to
// it, so a tmpfs keeps that at memory speed), removed at exit.
class ScratchFile {
 public:
  explicit ScratchFile(const std::string& name) {
    std::error_code ec;
    const std::filesystem::path dir = std::filesystem::is_directory("/dev/shm", ec)
                                          ? std::filesystem::path("/dev/shm")
                                          : std::filesystem::temp_directory_path();
    path_ = (dir / ("lockstep-fuzz-" + std::to_string(::getpid()) + "-" + name)).string();
  }
  ~ScratchFile() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  const std::string& write(std::string_view bytes) {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) violated("cannot write the scratch file " + path_);
    return path_;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Every HDF5 id a reader opened must be closed again, on success and on every error path: a
// leaked file id keeps the file open (and, for the next open of the same path, stale).
inline void expect_no_open_hdf5_objects(const char* after) {
  const ssize_t open = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
  if (open != 0) violated(str(open, " HDF5 object(s) still open after ", after));
}

}  // namespace lockstep::fuzz
