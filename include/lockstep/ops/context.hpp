// Context: everything one replica needs to run ops on its device: the device, a thread pool (CPU)
// or a compute stream with cuBLAS/cuDNN handles (CUDA), and the backend that owns the kernels.
// One Context per replica and per thread; two Contexts may run ops concurrently from two threads
// (the DataParallel baseline does), so nothing here is process-global. The Context also carries
// the precision policy of its GEMMs and convolutions (ops/precision.hpp), set once from the
// config, so layer code never sees it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/core/device.hpp"
#include "lockstep/core/tensor.hpp"
#include "lockstep/core/thread_pool.hpp"
#include "lockstep/ops/precision.hpp"

namespace lockstep::ops {

class Backend;

// Threads per CPU replica when nothing else is said: 1, so that `ranks x threads <= cores`
// holds by default under mpirun -np <cores>. Single-rank runs set it from the config.
inline constexpr int kDefaultCpuThreads = 1;
// The most CPU threads one Context takes (train.threads, lockstep-generate --threads): far beyond
// any node's cores, and a bound that a mistyped count meets as an error naming the option instead
// of as std::system_error from the thread pool, or a silent truncation to int.
inline constexpr int kMaxCpuThreads = 4096;

class Context {
 public:
  explicit Context(Device device = Device::cpu(), int threads = kDefaultCpuThreads);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  Device device() const { return device_; }
  int threads() const { return threads_; }
  Backend& backend() { return *backend_; }
  ThreadPool& pool() { return *pool_; }
  // Waits until all work queued on this context has finished (no-op on the CPU).
  void synchronize();
  // Orders this context after `producer`: work queued here from now on starts only after all
  // work queued on `producer` so far has finished, without blocking the host when both are on
  // GPUs (an event on producer's stream that this stream waits for). Needed whenever one context
  // reads what another wrote, e.g. DataParallel replicas reading the master's fresh weights.
  // A no-op when producer is a CPU context (CPU ops are done when they return).
  void wait_for(Context& producer);

  // The compute precision of GEMMs and convolutions (fp32 until set). set_precision throws
  // lockstep::Error naming the device and what it lacks when the backend cannot compute in p
  // (bf16 on a CPU with neither AMX nor AVX512-BF16).
  Precision precision() const { return precision_; }
  void set_precision(Precision p);
  // One line on how this context computes in its precision, for logs and benchmark records,
  // e.g. "bf16 GEMMs and convolutions with f32 accumulation: oneDNN 2.6.3 on avx512_core_bf16
  // (AVX512-BF16, no AMX)".
  std::string precision_info();

  // Parameter reuse window. Between begin_reuse(tensors) and end_reuse() the caller promises
  // that `tensors` are not written: a Model opens a window at forward and closes it when its
  // backward ends (the weights a backward uses must be the forward's anyway). A backend that
  // computes in bf16 then converts each of them once per window and reuses the copy, as
  // PyTorch autocast's weight-cast cache does; outside a window every op converts its operands
  // afresh, which is always correct. Opening a window invalidates every earlier copy.
  void begin_reuse(const std::vector<Tensor>& unchanged);
  void end_reuse();
  // The open window's id when t is one of its tensors (same data pointer and size), else 0.
  // Ids are never reused within a Context.
  std::uint64_t reuse_id(const Tensor& t) const;

  // A tensor of `shape` on this context's device for a transient result (a layer's output that
  // only the next layer reads, a gradient on its way down the backward pass), in a buffer that
  // no other Tensor shares. Buffers are kept and handed out again once every Tensor sharing them
  // is gone (the smallest free one that fits, at most twice the size), so a steady-state step
  // allocates nothing (a fresh block costs page faults on the CPU) and holds only the transients
  // live at once: per-layer buffers held every layer's output and gradient, 2-3x the memory of a
  // conv net's step. A Tensor the caller keeps simply keeps its buffer out of reach. Device buffers
  // are reused in the order of this context's stream, as the caching allocator reuses blocks.
  Tensor transient(const Shape& shape, DType dtype = DType::F32);
  // Bytes of the buffers transient() holds, in use or free.
  std::size_t transient_bytes() const;

 private:
  Device device_;
  int threads_;
  Precision precision_ = Precision::FP32;
  std::uint64_t reuse_window_ = 0;  // id of the open window, 0 when none is open
  std::uint64_t reuse_windows_opened_ = 0;
  std::vector<std::pair<std::uintptr_t, std::int64_t>> reuse_;  // sorted (address, numel)
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<Backend> backend_;
  std::vector<Tensor> transients_;  // last: its device buffers go before the backend
};

}  // namespace lockstep::ops
