// cuBLAS, cuBLASLt, cuDNN and NCCL are opened on first GPU use (include/lockstep/ops/dynload.hpp),
// never linked: a CPU run of a CUDA-enabled build must not map them (libcublasLt alone made 150 MiB
// of every rank resident). These run without a GPU: dlopen needs the library files, not a device.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "lockstep/core/error.hpp"
#include "lockstep/core/tensor.hpp"
#include "lockstep/ops/context.hpp"
#include "lockstep/ops/ops.hpp"
#ifdef LOCKSTEP_HAVE_CUDA
#include "lockstep/ops/dynload.hpp"
#endif

using namespace lockstep;

namespace {

std::string self_maps() {
  std::ifstream in("/proc/self/maps");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool any_open() {
#ifndef LOCKSTEP_HAVE_CUDA
  return false;  // a CPU-only build has no dynload: nothing can have been opened
#else
  for (auto lib :
       {dyn::Library::Cublas, dyn::Library::CublasLt, dyn::Library::Cudnn, dyn::Library::Nccl})
    if (dyn::is_open(lib)) return true;
  return false;
#endif
}

}  // namespace

TEST(CudaDynload, CpuWorkMapsNoCudaMathOrCommLibrary) {
  if (any_open())
    GTEST_SKIP() << "another test in this process opened the CUDA libraries already; ctest runs "
                    "this test alone";
  ops::Context ctx(Device::cpu(), 1);
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2});
  Tensor b = Tensor::from_vector<float>({5, 6, 7, 8}, {2, 2});
  Tensor c = Tensor::zeros({2, 2});
  ops::gemm(ctx, false, false, 1.0f, a, b, 0.0f, c);
  EXPECT_EQ(c.data<float>()[0], 19.0f);  // [1 2] . [5 7]
  const std::string maps = self_maps();
  for (const char* lib : {"libcublas", "libcudnn", "libnccl"})
    EXPECT_EQ(maps.find(lib), std::string::npos)
        << lib << " is mapped by a process that only did CPU work: it must be opened lazily "
        << "(dyn::), not linked";
}

TEST(CudaDynload, OpensALibraryOnceAndSaysWhereFrom) {
#ifndef LOCKSTEP_HAVE_CUDA
  GTEST_SKIP() << "CPU-only build: no CUDA libraries to open";
#else
  void* h = nullptr;
  try {
    h = dyn::open(dyn::Library::CublasLt);
  } catch (const Error& e) {
    GTEST_SKIP() << "cuBLASLt cannot be loaded on this machine: " << e.what();
  }
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(dyn::open(dyn::Library::CublasLt), h) << "a second open must reuse the handle";
  EXPECT_TRUE(dyn::is_open(dyn::Library::CublasLt));
  EXPECT_NE(dyn::symbol(dyn::Library::CublasLt, "cublasLtGetVersion"), nullptr);
  const std::string path = dyn::opened_path(dyn::Library::CublasLt);
  EXPECT_NE(path.find("libcublasLt"), std::string::npos) << path;
  EXPECT_NE(self_maps().find("libcublasLt"), std::string::npos);
#endif
}

TEST(CudaDynload, AMissingFunctionIsAnErrorNamingLibraryAndFunction) {
#ifndef LOCKSTEP_HAVE_CUDA
  GTEST_SKIP() << "CPU-only build: no CUDA libraries to open";
#else
  try {
    dyn::open(dyn::Library::Nccl);
  } catch (const Error& e) {
    GTEST_SKIP() << "NCCL cannot be loaded on this machine: " << e.what();
  }
  try {
    dyn::symbol(dyn::Library::Nccl, "ncclLockstepNoSuchFunction");
    FAIL() << "resolving a function NCCL does not have must throw";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("NCCL"), std::string::npos) << what;
    EXPECT_NE(what.find("ncclLockstepNoSuchFunction"), std::string::npos) << what;
    EXPECT_FALSE(e.hint().empty()) << what;
  }
#endif
}
