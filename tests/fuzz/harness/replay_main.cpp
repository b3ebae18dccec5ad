// The replay build of a fuzz target: the same LLVMFuzzerTestOneInput, driven by this main over
// every file of the folders (or the files) on the command line, so CTest replays the saved corpus
// and the crash regressions with gcc, with or without sanitizers, and no fuzzer installed.
// A folder that does not exist is skipped (a target may have no regressions yet), but finding no
// input at all is a failure: a replay that runs nothing must not pass.
#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

#if defined(__SANITIZE_ADDRESS__)
#define LOCKSTEP_REPLAY_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LOCKSTEP_REPLAY_ASAN 1
#endif
#endif

int main(int argc, char** argv) {
#ifndef LOCKSTEP_REPLAY_ASAN
  // The fuzzer ran with ASan's max_allocation_size_mb (fuzz_options.cpp); without ASan an
  // address-space limit of 1 GiB over what the process maps at start plays that part, so a saved
  // input that asks for an absurd allocation fails here as it did there instead of paging the CI
  // machine.
  std::size_t mapped = 0;
  {
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);)
      if (line.rfind("VmSize:", 0) == 0) mapped = std::stoull(line.substr(7)) * 1024;  // kB
  }
  if (mapped > 0) {
    const rlim_t cap = mapped + (rlim_t{1} << 30);
    rlimit limit{cap, cap};
    setrlimit(RLIMIT_AS, &limit);
  }
#endif
  namespace fs = std::filesystem;
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    std::error_code ec;
    if (fs::is_directory(argv[i], ec)) {
      for (const auto& entry : fs::directory_iterator(argv[i]))
        if (entry.is_regular_file()) inputs.push_back(entry.path());
    } else if (fs::is_regular_file(argv[i], ec)) {
      inputs.emplace_back(argv[i]);
    } else {
      std::fprintf(stderr, "replay: %s does not exist, skipped\n", argv[i]);
    }
  }
  std::sort(inputs.begin(), inputs.end());
  if (inputs.empty()) {
    std::fprintf(stderr, "replay: no inputs found\n");
    return 1;
  }
  for (const fs::path& p : inputs) {
    std::ifstream in(p, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // Named before it runs: if it crashes, this is the last line of the log.
    std::fprintf(stderr, "replay: %s (%zu bytes)\n", p.c_str(), bytes.size());
    std::fflush(stderr);
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  }
  std::fprintf(stderr, "replay: %zu inputs, no finding\n", inputs.size());
  return 0;
}
