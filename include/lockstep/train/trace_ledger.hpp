// lockstep-trace's reading of a log.trace file: per step and rank, where the time went (compute,
// data wait, optimizer, exposed communication, each bucket's share of it), the slowest rank and
// the skew between ranks, and beside the measured exposure the scaling model's (parallel/
// scaling_model.hpp) for the same buckets, readiness and link. The link is fitted to the trace's
// own gradient collectives unless given: then the comparison checks the overlap model (when each
// bucket could start, the FIFO of collectives), not the link.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/parallel/scaling_model.hpp"

namespace lockstep::train {

struct TraceEvent {
  int rank = 0;
  std::string track, name;
  double ts_us = 0, dur_us = 0;  // dur_us < 0: an instant
  std::int64_t step = 0;
  double end_us() const { return ts_us + (dur_us > 0 ? dur_us : 0); }
};

struct Trace {
  int ranks = 0;
  std::vector<std::string> rank_names;  // "rank R on HOST"
  std::vector<TraceEvent> events;
  double clock_residual_us = 0;
};

// Reads a trace written by log.trace (Chrome JSON). Errors name the file and the byte offset.
Trace read_trace(const std::string& path);

// A gradient collective's bytes from its name ("allreduce(f32[101824] on cpu, sum)": 407296), 0
// when the name is not a gradient bucket's (control traffic: "allreduce(i64 x 2, max)").
std::int64_t gradient_bytes(const std::string& name);

struct BucketLedger {
  std::int64_t bytes = 0;
  double ready_us = 0, start_us = 0, end_us = 0;
  double exposed_us = 0;  // of its collective, after backward ended and earlier buckets' ends
};

struct RankStep {
  double start_us = 0, end_us = 0;
  double forward_us = 0, backward_us = 0, data_us = 0, optimizer_us = 0;
  double exposed_us = 0;        // measured: the wait for gradients after backward
  double model_exposed_us = 0;  // the scaling model's for this rank's buckets and compute
  std::vector<BucketLedger> buckets;
  double step_us() const { return end_us - start_us; }
};

struct StepLedger {
  std::int64_t step = 0;
  std::vector<RankStep> ranks;  // by rank
  int slowest = 0;              // the rank with the longest step
  double skew_us = 0;           // latest minus earliest step end over ranks
};

struct Ledger {
  std::vector<StepLedger> steps;
  parallel::scaling::Link link;
  std::string link_source;  // how the link was found, for the report
};

// `link`: the link to model with; none: fitted to the trace's gradient collectives.
Ledger make_ledger(const Trace& trace, std::optional<parallel::scaling::Link> link = std::nullopt);

// The console table.
std::string format_ledger(const Ledger& ledger, const Trace& trace);

// A gnuplot script drawing one step of every rank as a timeline (a row per rank and track) into
// `png`; the data is inline, so the script alone is the plot.
std::string timeline_gnuplot(const Trace& trace, std::int64_t step, const std::string& png);

}  // namespace lockstep::train
