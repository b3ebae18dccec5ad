#include "lockstep/train/trace_ledger.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "lockstep/core/error.hpp"
#include "lockstep/core/json.hpp"

namespace lockstep::train {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

Trace read_trace(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LOCKSTEP_CHECK_HINT(in.good(), "pass the file named by log.trace", "cannot read trace ", path);
  std::ostringstream text;
  text << in.rdbuf();
  const std::string body = text.str();
  const json::Value root =
      json::parse(body, {path, "not a trace", "pass a file written by lockstep-train's log.trace"});
  const json::Value* events = root.get("traceEvents");
  LOCKSTEP_CHECK_HINT(events && events->kind == json::Value::Array,
                      "pass a file written by lockstep-train's log.trace", path,
                      ": no traceEvents array");
  Trace trace;
  if (const json::Value* other = root.get("otherData")) {
    trace.ranks = static_cast<int>(other->num("ranks"));
    trace.clock_residual_us = other->num("clock_residual_us");
  }
  std::map<std::pair<int, int>, std::string> tracks;
  for (const json::Value& e : events->items)
    if (e.str("ph") == "M" && e.str("name") == "thread_name")
      if (const json::Value* args = e.get("args"))
        tracks[{static_cast<int>(e.num("pid")), static_cast<int>(e.num("tid"))}] =
            args->str("name");
  for (const json::Value& e : events->items) {
    const std::string ph = e.str("ph");
    const int pid = static_cast<int>(e.num("pid"));
    trace.ranks = std::max(trace.ranks, pid + 1);
    if (ph == "M") {
      if (e.str("name") == "process_name" && e.get("args")) {
        trace.rank_names.resize(static_cast<std::size_t>(trace.ranks));
        trace.rank_names[static_cast<std::size_t>(pid)] = e.get("args")->str("name");
      }
      continue;
    }
    if (ph != "X" && ph != "i") continue;
    TraceEvent ev;
    ev.rank = pid;
    ev.track = tracks[{pid, static_cast<int>(e.num("tid"))}];
    ev.name = e.str("name");
    ev.ts_us = e.num("ts");
    ev.dur_us = ph == "X" ? e.num("dur") : -1;
    if (const json::Value* args = e.get("args"))
      ev.step = static_cast<std::int64_t>(args->num("step"));
    trace.events.push_back(std::move(ev));
  }
  trace.rank_names.resize(static_cast<std::size_t>(trace.ranks));
  LOCKSTEP_CHECK_HINT(!trace.events.empty(), "trace a window of steps the run trains", path,
                      ": the trace holds no events");
  std::sort(trace.events.begin(), trace.events.end(),
            [](const TraceEvent& a, const TraceEvent& b) { return a.ts_us < b.ts_us; });
  return trace;
}

std::int64_t gradient_bytes(const std::string& name) {
  // Gradient buckets travel as tensors, by allreduce (DDP) or reduce-scatter (ZeRO-1):
  // "<op>(<dtype>[<elements>] on <device>, ...)". Broadcasts (buffers) and vectors of the
  // loop's control traffic ("allreduce(i64 x 2, max)") are not buckets.
  if (name.rfind("allreduce(", 0) != 0 && name.rfind("reduce_scatter(", 0) != 0) return 0;
  const std::size_t open = name.find('('), bracket = name.find('['), close = name.find(']');
  if (open == std::string::npos || bracket == std::string::npos || close == std::string::npos ||
      bracket < open || close < bracket)
    return 0;
  const std::string dtype = name.substr(open + 1, bracket - open - 1);
  const int size = dtype == "f32" ? 4 : (dtype == "bf16" || dtype == "f16") ? 2 : 0;
  if (size == 0) return 0;
  return std::stoll(name.substr(bracket + 1, close - bracket - 1)) * size;
}

Ledger make_ledger(const Trace& trace, std::optional<parallel::scaling::Link> link) {
  Ledger ledger;
  const int p = std::max(trace.ranks, 1);
  std::map<std::int64_t, StepLedger> steps;
  // Per rank and step: the bucket-ready instants and the gradient collectives, in time order.
  std::map<std::pair<std::int64_t, int>, std::vector<const TraceEvent*>> ready, collectives;
  // On a device the host only queues: the compute stream's spans ("device compute") replace the
  // host's forward, backward and wait for gradients.
  std::map<std::pair<std::int64_t, int>, RankStep> device;
  for (const TraceEvent& e : trace.events) {
    if (e.track == "device compute") {
      RankStep& d = device[{e.step, e.rank}];
      if (e.name == "forward") d.forward_us += e.dur_us;
      if (e.name == "backward") d.backward_us += e.dur_us;
      if (e.name == "wait for gradients") d.exposed_us += e.dur_us;
      continue;
    }
    StepLedger& s = steps[e.step];
    s.step = e.step;
    s.ranks.resize(static_cast<std::size_t>(p));
    RankStep& r = s.ranks[static_cast<std::size_t>(e.rank)];
    if (e.track == "step") {
      r.start_us = e.ts_us;
      r.end_us = e.end_us();
    } else if (e.track == "data") {
      r.data_us += e.dur_us;
    } else if (e.track == "optimizer") {
      r.optimizer_us += e.dur_us;
    } else if (e.track == "compute") {
      if (e.name == "forward") r.forward_us += e.dur_us;
      if (e.name == "backward") r.backward_us += e.dur_us;
      if (e.name == "wait for gradients") r.exposed_us += e.dur_us;
    } else if (e.track == "buckets") {
      ready[{e.step, e.rank}].push_back(&e);
    } else if (e.track == "comm" && gradient_bytes(e.name) > 0) {
      collectives[{e.step, e.rank}].push_back(&e);
    }
  }
  // The link: given, or fitted to every gradient collective of the trace (time = a + b bytes).
  if (link) {
    ledger.link = *link;
    ledger.link_source = "given";
  } else {
    std::vector<double> bytes, seconds;
    for (const auto& [key, list] : collectives)
      for (const TraceEvent* c : list) {
        bytes.push_back(static_cast<double>(gradient_bytes(c->name)));
        seconds.push_back(c->dur_us * 1e-6);
      }
    const bool sizes_vary =
        !bytes.empty() && *std::max_element(bytes.begin(), bytes.end()) >
                              *std::min_element(bytes.begin(), bytes.end()) * 1.5;
    if (p > 1 && sizes_vary) {
      ledger.link =
          parallel::scaling::link_from_ring_fit(parallel::scaling::fit_line(bytes, seconds), p);
      ledger.link_source = str("fitted to ", bytes.size(), " gradient collectives of the trace");
    } else if (p > 1 && !bytes.empty()) {
      // One bucket size: no latency can be told apart; all of the time is bandwidth.
      ledger.link.alpha_s = 0;
      ledger.link.bytes_per_s = 2.0 * (p - 1) / p * median(bytes) / median(seconds);
      ledger.link_source = str("from ", bytes.size(),
                               " gradient collectives of one size (latency not separable: 0)");
    } else {
      ledger.link_source = "none (one rank, or no gradient collectives)";
    }
  }
  for (const auto& [key, d] : device) {
    RankStep& r = steps[key.first].ranks[static_cast<std::size_t>(key.second)];
    r.forward_us = d.forward_us;
    r.backward_us = d.backward_us;
    r.exposed_us = d.exposed_us;
  }
  parallel::scaling::Topology topology;
  topology.ranks = p;
  topology.ranks_per_node = p;
  topology.intra = topology.inter = ledger.link;
  for (auto& [number, s] : steps) {
    for (int rank = 0; rank < p; ++rank) {
      RankStep& r = s.ranks[static_cast<std::size_t>(rank)];
      const auto& rs = ready[{number, rank}];
      const auto& cs = collectives[{number, rank}];
      // The backward whose buckets these are: the last one of the step (with accumulation the
      // earlier micro-steps do not communicate).
      double backward_begin = 0, backward_end = 0;
      for (const TraceEvent& e : trace.events)
        if (e.rank == rank && e.step == number && e.track == "compute" && e.name == "backward") {
          backward_begin = e.ts_us;
          backward_end = e.end_us();
        }
      double covered = backward_end;
      std::vector<parallel::scaling::Bucket> model_buckets;
      for (std::size_t k = 0; k < std::min(rs.size(), cs.size()); ++k) {
        BucketLedger b;
        b.bytes = gradient_bytes(cs[k]->name);
        b.ready_us = rs[k]->ts_us;
        b.start_us = cs[k]->ts_us;
        b.end_us = cs[k]->end_us();
        b.exposed_us = std::max(0.0, b.end_us - std::max(covered, b.start_us));
        covered = std::max(covered, b.end_us);
        r.buckets.push_back(b);
        const double span = backward_end - backward_begin;
        model_buckets.push_back(
            {static_cast<double>(b.bytes),
             span > 0 ? std::clamp((b.ready_us - backward_begin) / span, 0.0, 1.0) : 1.0});
      }
      if (p > 1 && ledger.link.bytes_per_s > 0 && !model_buckets.empty()) {
        parallel::scaling::StepCost cost;
        cost.forward_s = r.forward_us * 1e-6;
        cost.backward_s = (backward_end - backward_begin) * 1e-6;
        r.model_exposed_us = parallel::scaling::predict_step(cost, model_buckets, topology,
                                                             parallel::scaling::Algorithm::Ring)
                                 .exposed_s *
                             1e6;
      }
    }
    double latest = -1e300, earliest = 1e300, longest = -1;
    for (int rank = 0; rank < p; ++rank) {
      const RankStep& r = s.ranks[static_cast<std::size_t>(rank)];
      latest = std::max(latest, r.end_us);
      earliest = std::min(earliest, r.end_us);
      if (r.step_us() > longest) {
        longest = r.step_us();
        s.slowest = rank;
      }
    }
    s.skew_us = latest - earliest;
    ledger.steps.push_back(std::move(s));
  }
  return ledger;
}

std::string format_ledger(const Ledger& ledger, const Trace& trace) {
  std::ostringstream out;
  char line[512];
  out << "trace: " << trace.ranks << " rank(s), " << ledger.steps.size()
      << " step(s); clocks aligned to within " << trace.clock_residual_us << " us\n";
  out << "link: alpha " << ledger.link.alpha_s * 1e6 << " us, " << ledger.link.bytes_per_s / 1e9
      << " GB/s (" << ledger.link_source << ")\n";
  out << "times in ms, the mean over ranks; exposed = communication after backward (measured, and "
         "the model's);\nqueued = the longest a ready bucket waited for its collective to start "
         "(the model assumes none)\n";
  std::snprintf(line, sizeof line, "%6s %8s %8s %8s %8s %8s %9s %9s %8s %8s %8s  %s\n", "step",
                "step", "forward", "backward", "data", "optim", "exposed", "model", "queued",
                "slowest", "skew", "exposed per bucket (rank 0)");
  out << line;
  double sum_exposed = 0, sum_model = 0, sum_step = 0;
  for (const StepLedger& s : ledger.steps) {
    double step = 0, fwd = 0, bwd = 0, data = 0, opt = 0, exposed = 0, model = 0, queued = 0;
    for (const RankStep& r : s.ranks) {
      for (const BucketLedger& b : r.buckets)
        queued = std::max(queued, b.start_us - b.ready_us);
      step += r.step_us();
      fwd += r.forward_us;
      bwd += r.backward_us;
      data += r.data_us;
      opt += r.optimizer_us;
      exposed += r.exposed_us;
      model += r.model_exposed_us;
    }
    const double n = static_cast<double>(s.ranks.size()) * 1000.0;
    std::string per_bucket;
    for (const BucketLedger& b : s.ranks.front().buckets)
      per_bucket += str(per_bucket.empty() ? "" : " ", std::lround(b.exposed_us), "us");
    std::snprintf(
        line, sizeof line, "%6lld %8.3f %8.3f %8.3f %8.3f %8.3f %9.3f %9.3f %8.3f %8d %8.3f  %s\n",
        static_cast<long long>(s.step), step / n, fwd / n, bwd / n, data / n, opt / n, exposed / n,
        model / n, queued / 1000.0, s.slowest, s.skew_us / 1000.0, per_bucket.c_str());
    out << line;
    sum_exposed += exposed / n;
    sum_model += model / n;
    sum_step += step / n;
  }
  const double k = static_cast<double>(std::max<std::size_t>(ledger.steps.size(), 1));
  std::snprintf(
      line, sizeof line,
      "mean: step %.3f ms, exposed communication %.3f ms (%.1f%% of the step), model %.3f "
      "ms\n",
      sum_step / k, sum_exposed / k, sum_step > 0 ? 100 * sum_exposed / sum_step : 0,
      sum_model / k);
  out << line;
  return out.str();
}

std::string timeline_gnuplot(const Trace& trace, std::int64_t step, const std::string& png) {
  // Rows, top to bottom: for each rank its data, compute, comm and optimizer tracks.
  const std::vector<std::string> rows = {"data", "compute", "comm", "optimizer"};
  // Colours by what a span is: data wait, forward, backward, the wait for gradients, a
  // collective, the optimizer.
  const std::vector<std::string> colors = {"#7f7f7f", "#1f77b4", "#ff7f0e",
                                           "#f7b6d2", "#d62728", "#2ca02c"};
  auto color = [](const TraceEvent& e) {
    if (e.track == "data") return 0;
    if (e.track == "compute" || e.track == "device compute")
      return e.name.rfind("forward", 0) == 0 ? 1 : e.name.rfind("backward", 0) == 0 ? 2 : 3;
    return e.track == "comm" ? 4 : 5;
  };
  double origin = 1e300;
  for (const TraceEvent& e : trace.events)
    if (e.step == step) origin = std::min(origin, e.ts_us);
  LOCKSTEP_CHECK_HINT(origin < 1e300, "pick a step of the trace's window", "step ", step,
                      " is not in the trace");
  std::ostringstream data, tics;
  const int per_rank = static_cast<int>(rows.size());
  for (const TraceEvent& e : trace.events) {
    if (e.step != step || e.dur_us <= 0) continue;
    const auto row = std::find(rows.begin(), rows.end(), e.track);
    if (row == rows.end()) continue;
    const int index = static_cast<int>(row - rows.begin());
    const double y = -(e.rank * (per_rank + 1) + index);
    const double x0 = (e.ts_us - origin) / 1000.0, w = e.dur_us / 1000.0;
    data << x0 + w / 2 << ' ' << y << ' ' << w / 2 << " 0.4 " << color(e) << '\n';
  }
  for (int rank = 0; rank < trace.ranks; ++rank)
    for (int i = 0; i < per_rank; ++i)
      tics << (tics.tellp() > 0 ? ", " : "") << "\""
           << (trace.rank_names[static_cast<std::size_t>(rank)].empty()
                   ? str("rank ", rank)
                   : trace.rank_names[static_cast<std::size_t>(rank)])
           << " " << rows[i] << "\" " << -(rank * (per_rank + 1) + i);
  std::ostringstream gp;
  gp << "set terminal pngcairo size 1200," << 120 + 28 * trace.ranks * (per_rank + 1)
     << " font 'sans,10'\nset output '" << png << "'\n"
     << "set title 'step " << step << " of " << trace.ranks
     << " rank(s) on one clock: grey data wait, blue forward, orange backward, pink gradient "
        "wait, red collectives, green optimizer' font 'sans,9'\n"
     << "set xlabel 'ms from the step start'\nset ytics (" << tics.str() << ")\n"
     << "set yrange [" << -(trace.ranks * (per_rank + 1)) << ":1]\nunset key\nset grid x\n"
     << "set palette defined (";
  for (std::size_t i = 0; i < colors.size(); ++i)
    gp << (i ? ", " : "") << i << " '" << colors[i] << "'";
  gp << ")\nset cbrange [0:" << colors.size() - 1 << "]\nunset colorbox\n"
     << "$boxes << EOD\n"
     << data.str() << "EOD\n"
     << "plot $boxes using 1:2:3:4:5 with boxxyerror fs solid 0.8 noborder lc palette\n";
  return gp.str();
}

}  // namespace lockstep::train
