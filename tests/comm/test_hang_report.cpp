// What a rank prints when a collective outlives dist.timeout_s, and how its wait backs off:
// the MPI-free halves of src/comm/mpi_watch (the job-level behaviour is in test_abort.cpp and
// tests/scripts/fault_hung_rank.sh).
#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "comm/hang_report.hpp"
#include "lockstep/comm/communicator.hpp"
#include "lockstep/train/config.hpp"

namespace lockstep::comm::detail {
namespace {

using std::chrono::microseconds;

RankStatus waiting_in(std::int64_t seq, const std::string& what, std::int64_t step,
                      double seconds) {
  RankStatus s;
  s.seq = seq;
  s.step = step;
  s.current_step = step;
  s.in_flight = 1;
  s.seconds = seconds;
  s.set_what(what);
  return s;
}

RankStatus idle_after(std::int64_t seq, const std::string& what, std::int64_t step,
                      double seconds) {
  RankStatus s = waiting_in(seq, what, step, seconds);
  s.in_flight = 0;
  return s;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(TimeoutReport, NamesTheCollectiveTheStepAndTheRankThatDidNotAnswer) {
  RankStatus mine = waiting_in(57, "allreduce(f32[2090] on cpu, sum)", 12, 5.0);
  std::vector<std::optional<RankStatus>> peers(2);
  std::string report = timeout_report(0, mine, peers, 5.0, 2.0);
  EXPECT_TRUE(has(report,
                  "rank 0: error: collective #57 allreduce(f32[2090] on cpu, sum) at "
                  "training step 12 did not complete within dist.timeout_s = 5 s"))
      << report;
  EXPECT_TRUE(has(report, "rank 1 did not arrive")) << report;
  EXPECT_TRUE(has(report, "rank 0:   rank 1: no answer within 2.0 s: stopped (SIGSTOP")) << report;
}

TEST(TimeoutReport, TellsRanksStuckOutsideCommunicationFromRanksInAnEarlierCollective) {
  RankStatus mine = waiting_in(57, "allreduce(a)", 12, 5.0);
  std::vector<std::optional<RankStatus>> peers(5);
  peers[1] = waiting_in(57, "allreduce(a)", 12, 4.0);   // arrived: waits with us
  peers[2] = waiting_in(55, "broadcast(b)", 11, 9.8);   // still in an earlier collective
  peers[3] = idle_after(56, "allreduce(c)", 11, 10.3);  // finished #56, never started #57
  peers[3]->current_step = 12;
  peers[4] = waiting_in(57, "allreduce(a)", 12, 1.0);  // arrived
  std::string report = timeout_report(0, mine, peers, 5.0, 2.0);
  EXPECT_TRUE(has(report, "ranks 2, 3 did not arrive")) << report;
  EXPECT_TRUE(has(report,
                  "rank 2: still in collective #55 broadcast(b) (at training step 11), "
                  "for 9.8 s"))
      << report;
  EXPECT_TRUE(has(report,
                  "rank 3: not in a collective: finished #56 allreduce(c) 10.3 s ago "
                  "and is at training step 12, stuck outside communication"))
      << report;
  EXPECT_TRUE(has(report, "waiting in it too: ranks 1, 4")) << report;
  EXPECT_FALSE(has(report, "rank 1:")) << "an arrived rank is not listed as missing\n" << report;
}

TEST(TimeoutReport, RanksPastTheCollectiveAreNotMissingAndRunsOfRanksAreCollapsed) {
  RankStatus mine = waiting_in(8, "broadcast(x, root 0)", 0, 5.0);
  std::vector<std::optional<RankStatus>> peers(8);
  peers[1] = idle_after(8, "broadcast(x, root 0)", 0, 4.0);  // the root finished its broadcast
  for (int r = 2; r < 8; ++r)
    peers[r] = waiting_in(7, "barrier()", 0, 6.0);
  std::string report = timeout_report(0, mine, peers, 5.0, 2.0);
  EXPECT_TRUE(has(report, "before the first training step")) << report;
  EXPECT_TRUE(has(report, "ranks 2-7 did not arrive")) << report;
  EXPECT_TRUE(has(report, "rank 1: already past it, finished #8")) << report;
}

TEST(TimeoutReport, EveryRankArrivedMeansTheTransportIsStuck) {
  RankStatus mine = waiting_in(3, "allreduce(a)", 2, 5.0);
  std::vector<std::optional<RankStatus>> peers(3);
  peers[1] = waiting_in(3, "allreduce(a)", 2, 5.0);
  peers[2] = waiting_in(3, "allreduce(a)", 2, 5.0);
  std::string report = timeout_report(0, mine, peers, 5.0, 2.0);
  EXPECT_TRUE(has(report, "every rank reached it")) << report;
  EXPECT_TRUE(has(report, "waiting in it too: ranks 1, 2")) << report;
}

TEST(TimeoutReport, ARankAskedByAPeerWhoseTimeoutExpiredFirstSaysSo) {
  RankStatus mine = waiting_in(4, "allreduce(a)", 7, 3.2);
  std::vector<std::optional<RankStatus>> peers(3);
  peers[0] = waiting_in(4, "allreduce(a)", 7, 5.0);
  std::string report = timeout_report(1, mine, peers, 5.0, 2.0, /*first=*/0);
  EXPECT_TRUE(has(report,
                  "did not complete within dist.timeout_s = 5 s (rank 0's expired first; "
                  "this rank waited 3.2 s); rank 2 did not arrive"))
      << report;
}

TEST(TimeoutReport, EveryLineCarriesTheReportingRank) {
  RankStatus mine = waiting_in(3, "allreduce(a)", 2, 5.0);
  std::vector<std::optional<RankStatus>> peers(4);
  peers[0] = waiting_in(2, "barrier()", 2, 5.0);
  std::string report = timeout_report(3, mine, peers, 5.0, 2.0);
  std::size_t lines = 0;
  for (std::size_t at = 0; at < report.size();) {
    std::size_t end = report.find('\n', at);
    ASSERT_NE(end, std::string::npos) << "the report ends with a newline";
    EXPECT_EQ(report.compare(at, 8, "rank 3: "), 0) << report.substr(at, end - at);
    at = end + 1;
    ++lines;
  }
  EXPECT_EQ(lines, 4u) << report;  // the summary, then ranks 0, 1 and 2
}

TEST(BehindReport, SaysWhoWaitsForThisRankAndWhereThisRankIs) {
  RankStatus asked = waiting_in(57, "allreduce(a)", 12, 5.0);
  RankStatus mine = idle_after(56, "allreduce(c)", 11, 10.3);
  mine.current_step = 12;
  std::string line = behind_report(1, mine, 0, asked);
  EXPECT_TRUE(has(line,
                  "rank 1: rank 0 timed out in collective #57 allreduce(a) (at training "
                  "step 12) waiting for this rank, which is not in a collective (finished "
                  "#56 allreduce(c) 10.3 s ago) and is at training step 12"))
      << line;
}

TEST(RankStatus, LongNamesAreTruncatedAndStayTerminated) {
  RankStatus s;
  s.set_what(std::string(500, 'x'));
  EXPECT_EQ(s.name(), std::string(sizeof s.what - 1, 'x'));
  s.set_what("short");
  EXPECT_EQ(s.name(), "short");
}

TEST(WaitPolicy, SpinsFirstThenSleepsAFractionOfTheWaitWithinBounds) {
  WaitPolicy p;
  p.spin = microseconds(200);
  p.min_sleep = microseconds(20);
  p.max_sleep = microseconds(2000);
  p.fraction = 0.125;
  EXPECT_EQ(p.pause_after(microseconds(0)), microseconds(0));
  EXPECT_EQ(p.pause_after(microseconds(199)), microseconds(0));
  EXPECT_EQ(p.pause_after(microseconds(200)), microseconds(25));
  EXPECT_EQ(p.pause_after(microseconds(100)), microseconds(0));
  EXPECT_EQ(p.pause_after(microseconds(8000)), microseconds(1000));
  EXPECT_EQ(p.pause_after(microseconds(60'000'000)), microseconds(2000));  // a minute: capped
  p.spin = microseconds(0);
  EXPECT_EQ(p.pause_after(microseconds(1)), microseconds(20));  // never below the floor
}

TEST(DistTimeout, ConfigDefaultIsTheCommunicatorDefault) {
  EXPECT_EQ(train::Config{}.dist_timeout_s, kDefaultTimeoutSeconds);
  EXPECT_GE(kDefaultTimeoutSeconds, 60.0) << "the first collective waits for start-up";
}

TEST(TimeoutReport, NamesTheHostAndPidOfEveryRankAndListsTheSuspectHosts) {
  RankStatus mine = waiting_in(9, "allreduce(a)", 4, 5.0);
  std::vector<std::optional<RankStatus>> peers(4);
  peers[1] = waiting_in(9, "allreduce(a)", 4, 4.0);  // arrived, on node1 with us
  // ranks 2 and 3 on node2: no answer (the host is gone)
  const std::vector<std::string> places = {"node1, pid 100", "node1, pid 101", "node2, pid 200",
                                           "node2, pid 201"};
  std::string report = timeout_report(0, mine, peers, 5.0, 2.0, -1, places);
  EXPECT_TRUE(has(report, "rank 0:   rank 2 (node2, pid 200): no answer within 2.0 s")) << report;
  EXPECT_TRUE(has(report, "rank 0:   rank 3 (node2, pid 201): no answer")) << report;
  EXPECT_TRUE(has(report, "rank 0:   suspect hosts: node2 (of ranks 2, 3)\n")) << report;
  EXPECT_FALSE(has(report, "suspect hosts: node1")) << report;
  // Without places (or with every rank arrived) there is no suspect line.
  EXPECT_FALSE(has(timeout_report(0, mine, peers, 5.0, 2.0), "suspect")) << report;
  peers[2] = peers[3] = waiting_in(9, "allreduce(a)", 4, 4.0);
  EXPECT_FALSE(has(timeout_report(0, mine, peers, 5.0, 2.0, -1, places), "suspect"));
}

}  // namespace
}  // namespace lockstep::comm::detail
