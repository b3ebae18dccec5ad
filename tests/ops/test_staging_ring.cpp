// The ordering rules of double-buffered input staging (ops/staging_ring.hpp), replayed on the
// host: a model of the two streams checks that no batch overwrites a slot still in use and that
// a copy never waits for the compute of the batch just before it (which would serialise them).
#include <gtest/gtest.h>

#include <vector>

#include "lockstep/ops/staging_ring.hpp"

namespace lockstep::ops {
namespace {

TEST(StagingRing, AlternatesSlotsAndWaitsOnlyOnceASlotHasBeenUsed) {
  StagingRing ring;
  StagingRing::Turn t0 = ring.next(), t1 = ring.next(), t2 = ring.next(), t3 = ring.next();
  EXPECT_EQ(t0.slot, 0);
  EXPECT_EQ(t1.slot, 1);
  EXPECT_EQ(t2.slot, 0);
  EXPECT_EQ(t3.slot, 1);
  // The first two batches find their slots untouched: nothing to wait for, no event to wait on
  // that was never recorded.
  EXPECT_FALSE(t0.wait_copy || t0.wait_release || t1.wait_copy || t1.wait_release);
  EXPECT_TRUE(t2.wait_copy && t2.wait_release && t3.wait_copy && t3.wait_release);
  // Nothing has read a slot before the first batch; from then on, the previous batch's slot.
  EXPECT_EQ(t0.record_release, -1);
  EXPECT_EQ(t1.record_release, 0);
  EXPECT_EQ(t2.record_release, 1);
  EXPECT_EQ(t3.record_release, 0);
  EXPECT_EQ(ring.staged(), 4);
}

// Replays the turns on a model of the compute stream: batch k's compute is queued after its
// turn. A slot's release event, when recorded, covers the compute of every batch queued so far.
// The copy of batch k must then wait for the compute of batch k - 2 (the slot's last reader)
// and for no later batch's.
TEST(StagingRing, CopyWaitsForTheSlotsLastReaderAndNotForThePreviousBatch) {
  StagingRing ring;
  std::vector<long> released_after(StagingRing::kSlots, -1);  // computes covered by the event
  std::vector<bool> recorded(StagingRing::kSlots, false);
  long queued = -1;  // the last batch whose compute is queued on the compute stream
  for (long k = 0; k < 12; ++k) {
    StagingRing::Turn t = ring.next();
    ASSERT_EQ(t.slot, k % StagingRing::kSlots);
    if (t.record_release >= 0) {
      released_after[t.record_release] = queued;
      recorded[t.record_release] = true;
    }
    if (t.wait_release) {
      ASSERT_TRUE(recorded[t.slot]) << "batch " << k << " waits on an event never recorded";
      EXPECT_EQ(released_after[t.slot], k - 2)
          << "batch " << k << "'s copy must wait for batch " << k - 2 << "'s compute only";
    } else {
      EXPECT_LT(k, StagingRing::kSlots) << "batch " << k << " would overwrite a slot in use";
    }
    EXPECT_EQ(t.wait_copy, k >= StagingRing::kSlots)
        << "batch " << k << ": the pinned buffer was last read by batch " << k - 2 << "'s copy";
    queued = k;  // batch k's compute is queued after the turn
  }
}

}  // namespace
}  // namespace lockstep::ops
