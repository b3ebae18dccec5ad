// InputStager: input batches to the GPU through pinned memory on a copy stream of their own
// (include/lockstep/ops/cuda.hpp). One batch, in the order StagingRing gives:
//   1. host: wait for the slot's previous copy (batch k - 2), then memcpy the batch into the
//      slot's pinned buffers; the previous copy was enqueued a step ago, so this rarely waits;
//   2. compute stream: record the other slot's release event (all of batch k - 1's reads of it
//      are queued before whatever is queued next);
//   3. copy stream: wait for this slot's release event (recorded at batch k - 1's start, so
//      after batch k - 2's compute), cudaMemcpyAsync each lane, record the slot's copy event;
//   4. compute stream: wait for the copy event; the ops of batch k read the slot after it.
// Slot memory comes from the caching allocator, whose blocks are safe to reuse in compute-stream
// order only: a block handed out now may still be read by compute work already queued, so the
// copy stream waits for all of it (now_) before its first copy into new device memory.
#include <algorithm>
#include <cstring>

#include "lockstep/ops/cuda.hpp"
#include "ops/cuda/check.hpp"
#include "ops/cuda/cuda_backend.hpp"

namespace lockstep::ops::cuda {
namespace {

cudaEvent_t new_event() {
  cudaEvent_t event = nullptr;
  LOCKSTEP_CHECK_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return event;
}

}  // namespace

InputStager::InputStager(Context& ctx) : ctx_(ctx) {
  LOCKSTEP_CHECK(ctx.device().is_cuda(), "InputStager: context on ", ctx.device().str(),
                 " is not a GPU's");
  activate_device(ctx.device().index);
  LOCKSTEP_CHECK_CUDA(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  now_ = new_event();
  for (Slot& slot : slots_) {
    slot.copied = new_event();
    slot.released = new_event();
  }
}

InputStager::~InputStager() {
  // A copy may still be writing the slots' device memory or reading their pinned pages: let it
  // finish before both go back (the compute stream already waits for every copy it reads).
  (void)cudaSetDevice(ctx_.device().index);
  (void)cudaStreamSynchronize(copy_stream_);
  for (Slot& slot : slots_) {
    (void)cudaEventDestroy(slot.copied);
    (void)cudaEventDestroy(slot.released);
  }
  (void)cudaEventDestroy(now_);
  (void)cudaStreamDestroy(copy_stream_);
}

std::vector<Tensor> InputStager::stage(const std::vector<Tensor>& host) {
  LOCKSTEP_CHECK(host.size() <= kMaxLanes, "InputStager: ", host.size(),
                 " tensors in one batch, at most ", kMaxLanes);
  for (const Tensor& t : host)
    LOCKSTEP_CHECK(t.device().is_cpu(), "InputStager: ", t.describe(), " is not a host tensor");
  activate_device(ctx_.device().index);
  cudaStream_t compute = compute_stream(ctx_);
  const StagingRing::Turn turn = ring_.next();
  Slot& slot = slots_[turn.slot];

  if (turn.wait_copy) LOCKSTEP_CHECK_CUDA(cudaEventSynchronize(slot.copied));
  if (turn.record_release >= 0)
    LOCKSTEP_CHECK_CUDA(cudaEventRecord(slots_[turn.record_release].released, compute));
  if (turn.wait_release) LOCKSTEP_CHECK_CUDA(cudaStreamWaitEvent(copy_stream_, slot.released, 0));

  std::vector<Tensor> out;
  out.reserve(host.size());
  bool new_memory = false;
  for (std::size_t i = 0; i < host.size(); ++i) {
    const Tensor& src = host[i];
    Lane& lane = slot.lanes[i];
    if (lane.pinned.bytes() < src.nbytes()) lane.pinned = PinnedBuffer(src.nbytes());
    if (!lane.device.defined() || lane.device.dtype() != src.dtype() ||
        lane.device.numel() < src.numel()) {
      lane.device =
          Tensor::empty({std::max<std::int64_t>(src.numel(), 1)}, src.dtype(), ctx_.device());
      new_memory = true;
    }
    if (src.nbytes() > 0) std::memcpy(lane.pinned.data(), src.raw_data(), src.nbytes());
    out.push_back(lane.device.sub(0, src.shape()));
  }
  if (new_memory) {
    LOCKSTEP_CHECK_CUDA(cudaEventRecord(now_, compute));
    LOCKSTEP_CHECK_CUDA(cudaStreamWaitEvent(copy_stream_, now_, 0));
  }
  for (std::size_t i = 0; i < host.size(); ++i)
    if (out[i].nbytes() > 0)
      LOCKSTEP_CHECK_CUDA(cudaMemcpyAsync(out[i].raw_data(), slot.lanes[i].pinned.data(),
                                          out[i].nbytes(), cudaMemcpyHostToDevice, copy_stream_));
  LOCKSTEP_CHECK_CUDA(cudaEventRecord(slot.copied, copy_stream_));
  LOCKSTEP_CHECK_CUDA(cudaStreamWaitEvent(compute, slot.copied, 0));
  return out;
}

}  // namespace lockstep::ops::cuda
