#include "lockstep/train/trace_file.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include "lockstep/core/error.hpp"
#include "lockstep/core/trace.hpp"
#include "lockstep/train/config.hpp"
#include "lockstep/train/metrics.hpp"

namespace lockstep::train {
namespace {

// Rounds of the offset measurement: each costs a broadcast and an allgather of a few bytes.
constexpr int kOffsetRounds = 16;

std::string host_name() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return host;
}

// One rank's events as text lines: track \t name \t begin \t end \t step (names hold no tabs).
std::string serialize(const std::vector<trace::Event>& events) {
  std::string out;
  for (const trace::Event& e : events)
    out += str(e.track, '\t', e.name, '\t', e.begin_ns, '\t', e.end_ns, '\t', e.step, '\n');
  return out;
}

std::vector<trace::Event> deserialize(const std::string& text) {
  std::vector<trace::Event> events;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    trace::Event e;
    std::string begin, end, step;
    std::getline(fields, e.track, '\t');
    std::getline(fields, e.name, '\t');
    std::getline(fields, begin, '\t');
    std::getline(fields, end, '\t');
    std::getline(fields, step, '\t');
    e.begin_ns = std::stoll(begin);
    e.end_ns = std::stoll(end);
    e.step = std::stoll(step);
    events.push_back(std::move(e));
  }
  return events;
}

std::string micros(double ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", ns / 1000.0);
  return buf;
}

}  // namespace

TraceSteps parse_trace_steps(const std::string& text) {
  const std::size_t colon = text.find(':');
  const std::string hint = "e.g. log.trace_steps = 10:20 (optimizer steps, first and last)";
  LOCKSTEP_CHECK_HINT(colon != std::string::npos, hint, "log.trace_steps = ", text,
                      ": expected FIRST:LAST");
  TraceSteps s;
  const std::int64_t max = std::numeric_limits<std::int64_t>::max();
  s.first = parse_integer(text.substr(0, colon), 1, max, "log.trace_steps (FIRST)", hint);
  s.last = parse_integer(text.substr(colon + 1), 1, max, "log.trace_steps (LAST)", hint);
  LOCKSTEP_CHECK_HINT(s.first >= 1 && s.last >= s.first, hint, "log.trace_steps = ", text,
                      ": needs 1 <= FIRST <= LAST");
  return s;
}

TraceWindow::TraceWindow(comm::Communicator& comm, std::string path, TraceSteps steps)
    : comm_(&comm), path_(std::move(path)), steps_(steps) {}

std::vector<TraceWindow::Offset> TraceWindow::measure_offsets() {
  comm::Communicator& comm = *comm_;
  const int world = comm.size();
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<Offset> offsets(static_cast<std::size_t>(world), Offset{-inf, inf});
  std::vector<std::vector<Offset>> rounds;
  for (int k = 0; k < kOffsetRounds; ++k) {
    // Rank r reads its clock (t1) after rank 0's broadcast reached it and before its allgather
    // left: in rank 0's clock that moment lies in [t0, t2], so t1 - t2 <= offset <= t1 - t0.
    const std::int64_t t0 = trace::now_ns();
    comm.broadcast("t", 0);
    const std::int64_t t1 = trace::now_ns();
    const std::vector<std::string> all = comm.allgather(std::to_string(t1));
    const std::int64_t t2 = trace::now_ns();
    if (comm.rank() != 0) continue;
    std::vector<Offset> round(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r) {
      const double t1r = static_cast<double>(std::stoll(all[static_cast<std::size_t>(r)]));
      round[static_cast<std::size_t>(r)] = {t1r - static_cast<double>(t2),
                                            t1r - static_cast<double>(t0)};
    }
    rounds.push_back(std::move(round));
  }
  if (comm.rank() != 0) return {};
  for (int r = 0; r < world; ++r) {
    Offset& o = offsets[static_cast<std::size_t>(r)];
    if (r == 0) {
      o = {0, 0};
      continue;
    }
    for (const auto& round : rounds) {
      o.lo = std::max(o.lo, round[static_cast<std::size_t>(r)].lo);
      o.hi = std::min(o.hi, round[static_cast<std::size_t>(r)].hi);
    }
    if (o.lo > o.hi) {
      // The clocks drifted apart during the rounds: the narrowest single round.
      o = rounds.front()[static_cast<std::size_t>(r)];
      for (const auto& round : rounds)
        if (round[static_cast<std::size_t>(r)].hi - round[static_cast<std::size_t>(r)].lo <
            o.hi - o.lo)
          o = round[static_cast<std::size_t>(r)];
    }
  }
  return offsets;
}

void TraceWindow::before_step(std::int64_t step) {
  if (!enabled()) return;
  if (step == steps_.first && !open_) {
    start_offsets_ = measure_offsets();
    comm_->barrier();
    start_ns_ = trace::now_ns();
    trace::set_step(step);
    trace::start(static_cast<std::size_t>(kTraceMaxEventsPerRank));
    open_ = true;
  } else if (open_) {
    trace::set_step(step);
  }
}

bool TraceWindow::after_step(std::int64_t step) {
  if (!open_ || step < steps_.last) return false;
  write(step);
  return true;
}

std::string TraceWindow::finish(std::int64_t step) {
  if (!open_) return "";
  write(step);
  return str("log.trace: the run ended at step ", step, " inside the window ", steps_.first, ":",
             steps_.last, "; ", note_);
}

void TraceWindow::write(std::int64_t last_step) {
  open_ = false;
  const bool cut_short = trace::cut();
  std::vector<trace::Event> mine = trace::stop();
  const std::int64_t end_local = trace::now_ns();
  const std::vector<Offset> end_offsets = measure_offsets();
  // Each rank: its host, its window's start and end on its own clock, whether it was cut, events.
  const std::string header =
      str(host_name(), '\t', start_ns_, '\t', end_local, '\t', cut_short ? 1 : 0, '\n');
  const std::vector<std::string> all = comm_->gather(header + serialize(mine), 0);
  if (comm_->rank() != 0) return;

  const int world = comm_->size();
  double residual = 0;
  std::vector<double> offsets_us;
  bool any_cut = false;
  std::ostringstream events;
  std::string sep;
  const double origin = static_cast<double>(start_ns_);  // rank 0's clock at the window start
  for (int r = 0; r < world; ++r) {
    const std::string& text = all[static_cast<std::size_t>(r)];
    const std::size_t eol = text.find('\n');
    std::istringstream head(text.substr(0, eol));
    std::string host, start_s, end_s, cut_s;
    std::getline(head, host, '\t');
    std::getline(head, start_s, '\t');
    std::getline(head, end_s, '\t');
    std::getline(head, cut_s, '\t');
    any_cut = any_cut || cut_s == "1";
    const double t_start = static_cast<double>(std::stoll(start_s));
    const double t_end = static_cast<double>(std::stoll(end_s));
    const Offset& s = start_offsets_[static_cast<std::size_t>(r)];
    const Offset& e = end_offsets[static_cast<std::size_t>(r)];
    const double o_start = (s.lo + s.hi) / 2, o_end = (e.lo + e.hi) / 2;
    residual = std::max({residual, (s.hi - s.lo) / 2, (e.hi - e.lo) / 2});
    offsets_us.push_back(o_start / 1000.0);
    // Linear in this rank's clock between the two measurements: drift corrected.
    auto to_rank0 = [&](double t) {
      const double f = t_end > t_start ? (t - t_start) / (t_end - t_start) : 0;
      return t - (o_start + (o_end - o_start) * f) - origin;
    };
    events << sep << "{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": " << r
           << ", \"args\": {\"name\": \"rank " << r << " on " << json_escape(host) << "\"}}";
    sep = ",\n";
    events << sep << "{\"ph\": \"M\", \"name\": \"process_sort_index\", \"pid\": " << r
           << ", \"args\": {\"sort_index\": " << r << "}}";
    std::map<std::string, int> tids;
    for (const trace::Event& ev : deserialize(text.substr(eol + 1))) {
      auto [it, added] = tids.emplace(ev.track, static_cast<int>(tids.size()) + 1);
      if (added)
        events << sep << "{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": " << r
               << ", \"tid\": " << it->second << ", \"args\": {\"name\": \""
               << json_escape(ev.track) << "\"}}";
      events << sep << "{\"name\": \"" << json_escape(ev.name) << "\", \"pid\": " << r
             << ", \"tid\": " << it->second
             << ", \"ts\": " << micros(to_rank0(static_cast<double>(ev.begin_ns)));
      if (ev.end_ns >= 0)
        events << ", \"ph\": \"X\", \"dur\": "
               << micros(static_cast<double>(ev.end_ns) - static_cast<double>(ev.begin_ns));
      else
        events << ", \"ph\": \"i\", \"s\": \"t\"";
      events << ", \"args\": {\"step\": " << ev.step << "}}";
    }
  }
  std::ofstream out(path_, std::ios::trunc);
  LOCKSTEP_CHECK(out.good(), "log.trace: cannot write ", path_, ": ", std::strerror(errno));
  out << "{\"traceEvents\": [\n"
      << events.str() << "\n],\n\"displayTimeUnit\": \"ms\",\n"
      << "\"otherData\": {\"producer\": \"lockstep\", \"steps\": \"" << steps_.first << ":"
      << last_step << "\", \"ranks\": " << world << ", \"clock_residual_us\": " << micros(residual)
      << ", \"clock_offsets_us\": [";
  for (std::size_t i = 0; i < offsets_us.size(); ++i)
    out << (i ? ", " : "") << offsets_us[i];
  out << "], \"cut\": " << (any_cut ? "true" : "false") << "}}\n";
  out.close();
  LOCKSTEP_CHECK(!out.fail(), "log.trace: error while writing ", path_);
  note_ =
      str("trace of steps ", steps_.first, "-", last_step, " of ", world, " rank(s) written to ",
          path_, " (clocks aligned to within ", micros(residual), " us)");
  if (any_cut)
    note_ += str("; warning: the window was cut at ", kTraceMaxEventsPerRank,
                 " events on a rank: name fewer steps in log.trace_steps");
}

}  // namespace lockstep::train
