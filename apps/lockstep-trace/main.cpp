// lockstep-trace: reads a trace written by lockstep-train's log.trace and prints the ledger of
// the window: per step, forward, backward, data wait, optimizer, exposed communication (measured,
// and the scaling model's for the same buckets, readiness and link), the slowest rank, the skew
// between ranks' step ends and each bucket's exposed share; optionally a PNG timeline of a step.
//   lockstep-trace FILE [--png=OUT.png] [--step=N] [--link=ALPHA_US,GBPS]
// --link models with that link instead of one fitted to the trace's own gradient collectives.
// The PNG needs gnuplot (Debian's gnuplot-nox); --gnuplot=OUT.gp writes the script instead.
// Exit status: 0 done, 2 a bad command line, 1 any other error.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <string>

#include "lockstep/core/error.hpp"
#include "lockstep/train/config.hpp"
#include "lockstep/train/trace_ledger.hpp"

using namespace lockstep;

namespace {

const char* kUsage =
    "usage: lockstep-trace FILE [--png=OUT.png] [--gnuplot=OUT.gp] [--step=N] "
    "[--link=ALPHA_US,GBPS]\n"
    "  FILE is a trace written by lockstep-train --log.trace=FILE; --step picks the step drawn "
    "(default:\n  the window's middle one); --link models communication with that latency (us) "
    "and bandwidth (GB/s)\n  instead of fitting them to the trace's gradient collectives.\n";

int error(const std::string& what, int status) {
  std::fprintf(stderr, "lockstep-trace: error: %s\n", what.c_str());
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  std::string file, png, script, step_text, link_text;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const std::string& key, std::string& out) {
      if (a.rfind(key + "=", 0) != 0) return false;
      out = a.substr(key.size() + 1);
      return true;
    };
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      return 0;
    }
    if (value("--png", png) || value("--gnuplot", script) || value("--step", step_text) ||
        value("--link", link_text))
      continue;
    if (a.rfind("--", 0) == 0 || !file.empty())
      return error("unknown argument " + a + "\n" + kUsage, 2);
    file = a;
  }
  if (file.empty()) return error(std::string("no trace file\n") + kUsage, 2);
  try {
    std::optional<parallel::scaling::Link> link;
    if (!link_text.empty()) {
      const std::size_t comma = link_text.find(',');
      LOCKSTEP_CHECK_HINT(comma != std::string::npos, "e.g. --link=5,10 (5 us, 10 GB/s)",
                          "--link=", link_text, ": expected ALPHA_US,GBPS");
      parallel::scaling::Link l;
      l.alpha_s = train::parse_real(link_text.substr(0, comma), 0, 1e9, "--link latency") * 1e-6;
      l.bytes_per_s =
          train::parse_real(link_text.substr(comma + 1), 1e-9, 1e9, "--link bandwidth") * 1e9;
      link = l;
    }
    const train::Trace trace = train::read_trace(file);
    const train::Ledger ledger = train::make_ledger(trace, link);
    std::cout << train::format_ledger(ledger, trace);
    if (!png.empty() || !script.empty()) {
      std::int64_t step = ledger.steps[ledger.steps.size() / 2].step;
      if (!step_text.empty())
        step =
            train::parse_integer(step_text, 0, std::numeric_limits<std::int64_t>::max(), "--step");
      const std::string out_png = png.empty() ? script + ".png" : png;
      const std::string gp = train::timeline_gnuplot(trace, step, out_png);
      const std::string gp_path = script.empty() ? png + ".gp" : script;
      {
        std::ofstream f(gp_path);
        f << gp;
        LOCKSTEP_CHECK(f.good(), "cannot write ", gp_path);
      }
      if (!png.empty()) {
        const std::string command = "gnuplot '" + gp_path + "'";
        LOCKSTEP_CHECK_HINT(std::system(command.c_str()) == 0,
                            "install gnuplot (apt-get install gnuplot-nox), or write the script "
                            "with --gnuplot=OUT.gp",
                            "gnuplot failed on ", gp_path);
        if (script.empty()) std::remove(gp_path.c_str());
        std::cout << "timeline of step " << step << " written to " << png << "\n";
      } else {
        std::cout << "gnuplot script for step " << step << " written to " << gp_path << "\n";
      }
    }
  } catch (const std::exception& e) {
    return error(e.what(), 1);
  }
  return 0;
}
