// The GPUs this process sees, by UUID: the identity select_local_gpu compares across ranks, since
// device numbers differ between ranks whose CUDA_VISIBLE_DEVICES differ.
#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "lockstep/comm/bootstrap.hpp"
#include "lockstep/core/device.hpp"
#include "lockstep/core/error.hpp"

namespace lockstep::comm::detail {

VisibleGpus cuda_visible_gpus() {
  VisibleGpus out;
  const int count = cuda_device_count();  // 0 without a driver or a GPU
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    cudaError_t rc = cudaGetDeviceProperties(&prop, d);
    LOCKSTEP_CHECK(rc == cudaSuccess, "cudaGetDeviceProperties(", d,
                   ") failed: ", cudaGetErrorString(rc));
    // The format nvidia-smi -L prints: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
    const auto* b = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
    char text[64];
    std::snprintf(text, sizeof text,
                  "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                  b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                  b[14], b[15]);
    out.emplace_back(text);
  }
  return out;
}

}  // namespace lockstep::comm::detail
