// StagingRing: the bookkeeping of double-buffered input staging (ops::cuda::InputStager), kept
// free of CUDA so that its ordering rules are testable on any machine. Batch k goes to slot
// k % 2. Its pinned buffer may be refilled once the copy of batch k - 2 has read it, and its
// device buffer overwritten once the compute of batch k - 2 (its last reader) has finished:
// that is marked by an event on the compute stream recorded when batch k - 1 was staged, i.e.
// before any of batch k - 1's compute was queued. Waiting instead for an event recorded at batch
// k's own start would make every copy wait for the whole previous step: no overlap at all.
#pragma once

#include <cstdint>

namespace lockstep::ops {

class StagingRing {
 public:
  static constexpr int kSlots = 2;

  // What staging one batch must do, in this order.
  struct Turn {
    int slot;            // the slot this batch is copied through
    bool wait_copy;      // host: wait for the slot's previous copy before refilling it
    int record_release;  // compute stream: record this slot's release event now (-1: none)
    bool wait_release;   // copy stream: wait for the slot's release event before copying
  };

  // The next batch's turn.
  Turn next() {
    const std::int64_t k = staged_++;
    Turn t{};
    t.slot = static_cast<int>(k % kSlots);
    t.wait_copy = k >= kSlots;
    // Everything queued on the compute stream so far belongs to batches < k: the slot of batch
    // k - 1 is released once it has run.
    t.record_release = k >= 1 ? static_cast<int>((k - 1) % kSlots) : -1;
    // Recorded when batch k - 1 was staged, after batch k - 2's compute was queued.
    t.wait_release = k >= kSlots;
    return t;
  }

  std::int64_t staged() const { return staged_; }

 private:
  std::int64_t staged_ = 0;
};

}  // namespace lockstep::ops
