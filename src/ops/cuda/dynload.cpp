#include "lockstep/ops/dynload.hpp"

#include <cublas_api.h>
#include <cudnn_version.h>
#include <dlfcn.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <sstream>
#include <vector>

#if __has_include(<nccl.h>)
#include <nccl.h>
#endif

#include "lockstep/core/error.hpp"

#ifndef LOCKSTEP_CUDA_LIB_DIRS
#define LOCKSTEP_CUDA_LIB_DIRS ""
#endif

namespace lockstep::dyn {
namespace {

#define LOCKSTEP_DYN_SONAME(base, major) base LOCKSTEP_DYN_NAME(major)

struct Entry {
  const char* name;    // for messages
  const char* soname;  // the major version this build was compiled against
  void* handle = nullptr;
  std::string path;
};

std::mutex& mutex() {
  static std::mutex m;
  return m;
}

std::array<Entry, 4>& entries() {
  static std::array<Entry, 4> e{{
      {"cuBLAS", LOCKSTEP_DYN_SONAME("libcublas.so.", CUBLAS_VER_MAJOR)},
      {"cuBLASLt", LOCKSTEP_DYN_SONAME("libcublasLt.so.", CUBLAS_VER_MAJOR)},
      {"cuDNN", LOCKSTEP_DYN_SONAME("libcudnn.so.", CUDNN_MAJOR)},
#ifdef NCCL_MAJOR
      {"NCCL", LOCKSTEP_DYN_SONAME("libnccl.so.", NCCL_MAJOR)},
#else
      {"NCCL", "libnccl.so.2"},
#endif
  }};
  return e;
}

Entry& entry(Library lib) {
  return entries()[static_cast<std::size_t>(lib)];
}

// The folders of the CUDA libraries CMake found (':'-separated), tried after the soname alone.
std::vector<std::string> build_dirs() {
  std::vector<std::string> dirs;
  std::stringstream s(LOCKSTEP_CUDA_LIB_DIRS);
  for (std::string d; std::getline(s, d, ':');)
    if (!d.empty()) dirs.push_back(d);
  return dirs;
}

std::string loaded_from(void* handle, void* any_symbol) {
  Dl_info info{};
  if (any_symbol != nullptr && dladdr(any_symbol, &info) != 0 && info.dli_fname != nullptr)
    return info.dli_fname;
  (void)handle;
  return "";
}

}  // namespace

void* open(Library lib) {
  std::lock_guard lock(mutex());
  Entry& e = entry(lib);
  if (e.handle != nullptr) return e.handle;
  std::vector<std::string> tried{e.soname};
  std::string errors;
  void* h = dlopen(e.soname, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) errors += str("\n    ", dlerror());
  for (const std::string& dir : build_dirs()) {
    if (h != nullptr) break;
    const std::string file = (std::filesystem::path(dir) / e.soname).string();
    tried.push_back(file);
    h = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) errors += str("\n    ", dlerror());
  }
  if (h == nullptr) {
    const char* ld = std::getenv("LD_LIBRARY_PATH");
    LOCKSTEP_FAIL_HINT(
        str("put the folder holding ", e.soname,
            " on LD_LIBRARY_PATH (e.g. `module load cuda`), or set train.device = cpu"),
        "cannot load ", e.name, " (", e.soname, "), needed by train.device = cuda; ",
        "LD_LIBRARY_PATH=", ld != nullptr ? ld : "(unset)", "; tried:", errors);
  }
  e.handle = h;
  return h;
}

void* symbol(Library lib, const char* name) {
  void* h = open(lib);
  std::lock_guard lock(mutex());
  Entry& e = entry(lib);
  dlerror();
  void* f = dlsym(h, name);
  LOCKSTEP_CHECK_HINT(f != nullptr, "use the library version lockstep was built against", e.name,
                      " (", e.soname, ") has no function ", name, ": ", [] {
                        const char* err = dlerror();
                        return std::string(err != nullptr ? err : "symbol is null");
                      }());
  if (e.path.empty()) e.path = loaded_from(h, f);
  return f;
}

std::string opened_path(Library lib) {
  std::lock_guard lock(mutex());
  const Entry& e = entry(lib);
  return e.handle != nullptr ? (e.path.empty() ? e.soname : e.path) : "";
}

bool is_open(Library lib) {
  std::lock_guard lock(mutex());
  return entry(lib).handle != nullptr;
}

}  // namespace lockstep::dyn
