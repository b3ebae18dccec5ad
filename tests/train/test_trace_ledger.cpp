// lockstep-trace's ledger on a hand-made trace whose every figure is worked out by hand.
#include "lockstep/train/trace_ledger.hpp"

#include <gtest/gtest.h>

#include <fstream>

#include "lockstep/core/error.hpp"
#include "support/temp_dir.hpp"

namespace lockstep::train {
namespace {

TEST(TraceLedger, GradientBytesCountOnlyBucketCollectives) {
  EXPECT_EQ(gradient_bytes("allreduce(f32[1000] on cpu, sum)"), 4000);
  EXPECT_EQ(gradient_bytes("allreduce(bf16[1000] on cpu, sum)"), 2000);
  EXPECT_EQ(gradient_bytes("reduce_scatter(f32[64] on cpu, sum)"), 256);
  EXPECT_EQ(gradient_bytes("broadcast(f32[32] on cpu, root 0)"), 0);  // buffers, not gradients
  EXPECT_EQ(gradient_bytes("allreduce(i64 x 2, max)"), 0);            // the loop's control flags
}

// One step, two ranks. Rank 0: forward 5-35, backward 35-75; bucket 0 (1000 floats) ready at 50,
// its allreduce 52-70; bucket 1 (500 floats) ready at 75, allreduce 76-90; the wait for gradients
// 75-90; optimizer 90-95; the step 0-100. Rank 1 the same, its step ending 3 us later.
std::string two_rank_trace() {
  std::string events;
  auto add = [&](int pid, int tid, const std::string& name, double ts, double dur) {
    events += "{\"name\": \"" + name + "\", \"pid\": " + std::to_string(pid) +
              ", \"tid\": " + std::to_string(tid) + ", \"ts\": " + std::to_string(ts) +
              (dur >= 0 ? ", \"ph\": \"X\", \"dur\": " + std::to_string(dur)
                        : std::string(", \"ph\": \"i\", \"s\": \"t\"")) +
              ", \"args\": {\"step\": 7}},\n";
  };
  const char* tracks[] = {"step", "data", "compute", "buckets", "comm", "optimizer"};
  for (int pid = 0; pid < 2; ++pid) {
    for (int t = 0; t < 6; ++t)
      events += "{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": " + std::to_string(pid) +
                ", \"tid\": " + std::to_string(t + 1) + ", \"args\": {\"name\": \"" + tracks[t] +
                "\"}},\n";
    add(pid, 1, "step 7", 0, 100 + 3 * pid);
    add(pid, 2, "data wait", 0, 5);
    add(pid, 3, "forward", 5, 30);
    add(pid, 3, "backward", 35, 40);
    add(pid, 4, "bucket 0 ready, 4000 B", 50, -1);
    add(pid, 5, "allreduce(f32[1000] on cpu, sum)", 52, 18);
    add(pid, 4, "bucket 1 ready, 2000 B", 75, -1);
    add(pid, 5, "allreduce(f32[500] on cpu, sum)", 76, 14);
    add(pid, 5, "allreduce(i64 x 2, max)", 96, 1);
    add(pid, 3, "wait for gradients", 75, 15);
    add(pid, 6, "gradient check + update", 90, 5);
  }
  events.resize(events.size() - 2);  // the last ",\n"
  return "{\"traceEvents\": [\n" + events +
         "\n], \"otherData\": {\"ranks\": 2, \"clock_residual_us\": 1.5}}\n";
}

TEST(TraceLedger, AStepsTimesAndEachBucketsExposureAreReadOffTheTrace) {
  test::TempDir dir;
  std::ofstream(dir / "t.json") << two_rank_trace();
  const Trace trace = read_trace(dir / "t.json");
  EXPECT_EQ(trace.ranks, 2);
  EXPECT_DOUBLE_EQ(trace.clock_residual_us, 1.5);
  // A link of 0 latency and 4e8 B/s: a 2-rank ring moves n bytes in n / B, so bucket 0 takes
  // 10 us from its readiness (15 us into backward) and bucket 1 5 us from backward's end: the
  // model exposes 5 us.
  parallel::scaling::Link link;
  link.bytes_per_s = 4e8;
  const Ledger ledger = make_ledger(trace, link);
  ASSERT_EQ(ledger.steps.size(), 1u);
  const StepLedger& s = ledger.steps[0];
  EXPECT_EQ(s.step, 7);
  ASSERT_EQ(s.ranks.size(), 2u);
  const RankStep& r = s.ranks[0];
  EXPECT_DOUBLE_EQ(r.step_us(), 100);
  EXPECT_DOUBLE_EQ(r.forward_us, 30);
  EXPECT_DOUBLE_EQ(r.backward_us, 40);
  EXPECT_DOUBLE_EQ(r.data_us, 5);
  EXPECT_DOUBLE_EQ(r.optimizer_us, 5);
  EXPECT_DOUBLE_EQ(r.exposed_us, 15);
  ASSERT_EQ(r.buckets.size(), 2u);  // the control allreduce is not a bucket
  EXPECT_EQ(r.buckets[0].bytes, 4000);
  EXPECT_DOUBLE_EQ(r.buckets[0].exposed_us, 0);   // ended (70) before backward did (75)
  EXPECT_DOUBLE_EQ(r.buckets[1].exposed_us, 14);  // 90 - 76
  EXPECT_NEAR(r.model_exposed_us, 5, 1e-9);
  EXPECT_EQ(s.slowest, 1);
  EXPECT_DOUBLE_EQ(s.skew_us, 3);
  const std::string table = format_ledger(ledger, trace);
  EXPECT_NE(table.find("0us 14us"), std::string::npos) << table;
}

TEST(TraceLedger, AFileThatIsNotATraceIsAnErrorNamingItAndTheOffset) {
  test::TempDir dir;
  std::ofstream(dir / "bad.json") << "{\"traceEvents\": [ {\"ph\": }";
  try {
    read_trace(dir / "bad.json");
    FAIL() << "expected an error";
  } catch (const lockstep::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("bad.json"), std::string::npos) << what;
    EXPECT_NE(what.find("expected a value at byte 25"), std::string::npos) << what;  // the "}"
  }
}

}  // namespace
}  // namespace lockstep::train
