// lockstep-bench: one binary, one subcommand per benchmark (ops, mlp, loader, allreduce, ...).
// Each subcommand lives in its own bench_*.cpp and registers itself with LOCKSTEP_BENCH; all
// write JSON (to --out=PATH or stdout) and a short human-readable table to stderr.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace lockstep::bench {

struct Args {
  std::vector<std::string> positional;         // after the subcommand name
  std::map<std::string, std::string> options;  // --key=value (or --flag -> "1")

  std::string get(const std::string& key, const std::string& fallback) const;
  long long get_int(const std::string& key, long long fallback) const;
  double get_double(const std::string& key, double fallback) const;
};

using BenchFn = std::function<int(const Args&)>;
struct Registration {
  // flags: the --key names the benchmark reads, space-separated ("reps warmup"); main refuses
  // any other (and --out, which every benchmark takes) before running it. A token "<a|b>" says
  // the benchmark takes positional arguments (its subcommands); without one they are refused.
  Registration(const std::string& name, const std::string& help, const std::string& flags,
               BenchFn fn);
};

// The median (the mean of the middle two for an even count; 0 for none): what every benchmark
// reports, since timings on a shared machine have a long upper tail.
double median(std::vector<double> values);

// CPU time of every thread of this process (pools' and OpenMP's workers included), so that a
// step's or an epoch's cost can be compared on a machine whose other load varies.
double process_cpu_seconds();

// Writes text to the --out path when given, else to stdout.
void write_output(const Args& args, const std::string& text);
// A small description of this machine for every JSON record: host, cores, CPU model, date.
std::string machine_json();

}  // namespace lockstep::bench

#define LOCKSTEP_BENCH_CAT2(a, b) a##b
#define LOCKSTEP_BENCH_CAT(a, b) LOCKSTEP_BENCH_CAT2(a, b)
// LOCKSTEP_BENCH("name", "one-line help", "flag1 flag2", [](const Args& a) { ...; return 0; });
#define LOCKSTEP_BENCH(name, help, flags, fn)                                               \
  static ::lockstep::bench::Registration LOCKSTEP_BENCH_CAT(lockstep_bench_reg_, __LINE__)( \
      name, help, flags, fn)
