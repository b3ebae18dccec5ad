// lockstep-train --version. The version comes from CMake (project(lockstep VERSION ...)) as
// LOCKSTEP_VERSION_STRING; library versions are both the headers compiled against and, where the
// library can say, the one loaded at run time, since a site's module may swap the latter.
#include "lockstep/ops/build_info.hpp"

#include <oneapi/dnnl/dnnl.hpp>

#include "lockstep/core/device.hpp"
#include "lockstep/core/error.hpp"

#ifdef LOCKSTEP_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "ops/cuda/cuda_attention_cudnn.hpp"  // defines: cudnn_frontend_version
#include "ops/cuda/dyn_libs.hpp"
#if __has_include(<nccl.h>)
#include <nccl.h>  // only for NCCL_MAJOR..: comm/ links NCCL, ops/ never calls it
#endif
#endif

#ifndef LOCKSTEP_VERSION_STRING
#define LOCKSTEP_VERSION_STRING "unknown"
#endif

namespace lockstep::ops {
namespace {

bool has_isa(dnnl::cpu_isa have, dnnl::cpu_isa want) {
  const auto h = static_cast<unsigned>(have), w = static_cast<unsigned>(want);
  return (h & w) == w;
}

// Whether train.precision = bf16 runs natively on this CPU (ops/precision.hpp refuses it
// otherwise), and on which units.
std::string cpu_bf16() {
  using dnnl::cpu_isa;
  const cpu_isa isa = dnnl::get_effective_cpu_isa();
  if (has_isa(isa, cpu_isa::avx512_core_amx)) return "yes (AMX and AVX512-BF16)";
  if (has_isa(isa, cpu_isa::avx512_core_bf16)) return "yes (AVX512-BF16, no AMX)";
  if (has_isa(isa, cpu_isa::avx2)) return "no (neither AVX512-BF16 nor AMX on this CPU)";
  return "no (CPU below AVX2)";
}

#ifdef LOCKSTEP_HAVE_CUDA
std::string cuda_version(int v) {  // 13000 -> "13.0"
  return str(v / 1000, ".", (v % 1000) / 10);
}
#endif

}  // namespace

std::string build_info() {
  const dnnl_version_t* dnnl = dnnl_version();
  std::string out = str("lockstep ", LOCKSTEP_VERSION_STRING, "\n");
#ifdef LOCKSTEP_HAVE_CUDA
  int runtime = 0, driver = 0;
  (void)cudaRuntimeGetVersion(&runtime);
  if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
  out += str("  CUDA: yes (built with ", cuda_version(CUDART_VERSION), ", runtime ",
             cuda_version(runtime), ", driver ",
             driver > 0 ? cuda_version(driver) : std::string("none"), ")\n");
  // cuDNN is opened here as a GPU run would open it (lockstep/ops/dynload.hpp), so --version says
  // whether this node can load it, and which file it found.
  std::string loaded;
  try {
    const std::size_t dnn = dyn::cudnnGetVersion();  // 90300 for 9.3.0
    loaded = str("loaded ", dnn / 10000, ".", dnn % 10000 / 100, ".", dnn % 100, " from ",
                 dyn::opened_path(dyn::Library::Cudnn));
  } catch (const Error& e) {
    loaded = str("NOT loadable here: ", e.what());
  }
  out += str("  cuDNN: yes (built with ", CUDNN_MAJOR, ".", CUDNN_MINOR, ".", CUDNN_PATCHLEVEL,
             ", ", loaded, ")\n");
  const std::string frontend = cuda::cudnn_frontend_version();
  out += frontend.empty() ? std::string(
                                "  cuDNN fused attention: no (built without the cuDNN "
                                "frontend: scripts/install-deps.sh --cudnn-frontend)\n")
                          : str("  cuDNN fused attention: yes (cuDNN frontend ", frontend,
                                "; train.attention = auto under bf16)\n");
#ifdef NCCL_MAJOR
  out += str("  NCCL: yes (built with ", NCCL_MAJOR, ".", NCCL_MINOR, ".", NCCL_PATCH, ")\n");
#else
  out += "  NCCL: yes\n";
#endif
  const int gpus = cuda_device_count();
  out += str("  GPUs visible: ", gpus, gpus == 0 ? " (train.device = auto runs on the CPU)" : "",
             "\n");
#else
  out += "  CUDA: no (CPU-only build: no CUDA, cuDNN or NCCL)\n";
#endif
  out += str("  oneDNN: ", dnnl->major, ".", dnnl->minor, ".", dnnl->patch,
             " (CPU GEMMs, "
             "convolutions)\n");
  out += str("  bf16 on this CPU: ", cpu_bf16(), "\n");
  return out;
}

}  // namespace lockstep::ops
