// The timeline recorder (log.trace): nothing when off, spans and instants when on, and a window cut
// at its event limit.
#include "lockstep/core/trace.hpp"

#include <gtest/gtest.h>

namespace lockstep::trace {
namespace {

TEST(Trace, RecordsNothingWhileOff) {
  ASSERT_FALSE(on());
  { Span s("compute", "forward"); }
  instant("buckets", "bucket 0 ready");
  start(100);
  EXPECT_TRUE(stop().empty());  // what happened before start() is not in the window
}

TEST(Trace, SpansAndInstantsCarryTheirTrackNameAndStep) {
  start(100);
  set_step(7);
  {
    Span s("compute", "forward");
    s.end();
    s.end();  // ending twice records once
  }
  instant("buckets", "bucket 0 ready");
  const std::vector<Event> events = stop();
  EXPECT_FALSE(on());
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].track, "compute");
  EXPECT_EQ(events[0].name, "forward");
  EXPECT_EQ(events[0].step, 7);
  EXPECT_LE(events[0].begin_ns, events[0].end_ns);
  EXPECT_EQ(events[1].end_ns, -1);  // an instant
  EXPECT_FALSE(cut());
}

TEST(Trace, AWindowIsCutAtItsEventLimit) {
  start(3);
  for (int i = 0; i < 5; ++i)
    instant("data", "x");
  EXPECT_FALSE(on());  // recording stopped by itself
  EXPECT_TRUE(cut());
  EXPECT_EQ(stop().size(), 3u);
}

}  // namespace
}  // namespace lockstep::trace
