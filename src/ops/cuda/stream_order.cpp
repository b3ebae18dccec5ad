#include "ops/cuda/stream_order.hpp"

#include <cuda_runtime.h>

#include "ops/cuda/check.hpp"
#include "ops/cuda/cuda_backend.hpp"

namespace lockstep::ops::cuda {

void order_after(Context& waiter, Context& producer) {
  cudaStream_t from = compute_stream(producer), to = compute_stream(waiter);
  // A fresh event per call: cheap next to the copies it orders, and no state shared between
  // threads (each DataParallel replica's thread may order itself after the master concurrently).
  // An event must be recorded on a stream of its own device; a stream may wait for an event of
  // another device. Destroying it at once is allowed: the wait already holds the recorded point.
  activate_device(producer.device().index);
  cudaEvent_t event = nullptr;
  LOCKSTEP_CHECK_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  cudaError_t rc = cudaEventRecord(event, from);
  if (rc == cudaSuccess) rc = cudaStreamWaitEvent(to, event, 0);
  (void)cudaEventDestroy(event);
  LOCKSTEP_CHECK_CUDA(rc);
}

}  // namespace lockstep::ops::cuda
