// cuBLAS, cuBLASLt, cuDNN and NCCL are opened with dlopen the first time a GPU run needs them,
// not linked: the dynamic loader alone makes about 150 MiB of libcublasLt resident (its static
// initialisers touch ~85 MiB of zeroed data), which every rank of a CPU run of a CUDA-enabled
// build used to pay (docs/PERFORMANCE.md, "Memory per rank"). Only the CUDA runtime stays linked.
//
// A call site writes dyn::cublasSgemm(...) where it wrote cublasSgemm(...): LOCKSTEP_DYN declares
// a forwarding function of that name in lockstep::dyn whose pointer is resolved once, from the
// library that the header's own version macros name (libcublas.so.13 for CUBLAS_VER_MAJOR 13, ...).
// The header macros that rename functions (cublasCreate -> cublasCreate_v2) expand in both the
// declaration and the call, so the versioned symbol is the one looked up.
#pragma once

#include <string>

namespace lockstep::dyn {

enum class Library { Cublas, CublasLt, Cudnn, Nccl };

// The library's handle, opened on first use (soname first, then the CUDA library folders found
// at build time). Throws lockstep::Error naming the library, what was tried and how to fix it.
void* open(Library lib);
// The symbol `name` of `lib`, or an error naming both.
void* symbol(Library lib, const char* name);
// The file the library was loaded from, or "" if this process has not opened it.
std::string opened_path(Library lib);
// Whether this process has opened `lib` (through dyn::open; does not open it).
bool is_open(Library lib);

}  // namespace lockstep::dyn

#define LOCKSTEP_DYN_STR2(x) #x
#define LOCKSTEP_DYN_NAME(fn) LOCKSTEP_DYN_STR2(fn)

// A forwarding function dyn::fn with the declared type FnType (a pointer to function), for names
// that a header overloads (cublasGemmEx has a C++ inline overload beside the C function).
#define LOCKSTEP_DYN_AS(lib, fn, FnType)                                                        \
  namespace lockstep::dyn {                                                                     \
  template <typename... Args>                                                                   \
  inline auto fn(Args... args) {                                                                \
    static const auto f =                                                                       \
        reinterpret_cast<FnType>(::lockstep::dyn::symbol(Library::lib, LOCKSTEP_DYN_NAME(fn))); \
    return f(args...);                                                                          \
  }                                                                                             \
  }

#define LOCKSTEP_DYN(lib, fn) LOCKSTEP_DYN_AS(lib, fn, decltype(&::fn))
