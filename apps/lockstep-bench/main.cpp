#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <thread>

#include "bench.hpp"
#include "lockstep/core/error.hpp"

namespace lockstep::bench {
namespace {
struct Entry {
  std::string help;
  std::set<std::string> flags;
  BenchFn fn;
};
std::map<std::string, Entry>& registry() {
  static std::map<std::string, Entry> r;
  return r;
}
}  // namespace

Registration::Registration(const std::string& name, const std::string& help,
                           const std::string& flags, BenchFn fn) {
  std::set<std::string> names = {"out"};
  std::istringstream in(flags);
  for (std::string f; in >> f;)
    names.insert(f);
  registry()[name] = Entry{help, std::move(names), std::move(fn)};
}

std::string Args::get(const std::string& key, const std::string& fallback) const {
  auto it = options.find(key);
  return it == options.end() ? fallback : it->second;
}
long long Args::get_int(const std::string& key, long long fallback) const {
  auto it = options.find(key);
  if (it == options.end()) return fallback;
  try {
    return std::stoll(it->second);
  } catch (const std::exception&) {
    LOCKSTEP_FAIL("--", key, "=", it->second, " is not an integer");
  }
}
double Args::get_double(const std::string& key, double fallback) const {
  auto it = options.find(key);
  if (it == options.end()) return fallback;
  try {
    return std::stod(it->second);
  } catch (const std::exception&) {
    LOCKSTEP_FAIL("--", key, "=", it->second, " is not a number");
  }
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

void write_output(const Args& args, const std::string& text) {
  std::string path = args.get("out", "");
  if (path.empty()) {
    std::cout << text << std::flush;
    return;
  }
  std::ofstream out(path);
  LOCKSTEP_CHECK(out.good(), "cannot write benchmark output to ", path);
  out << text;
}

std::string machine_json() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  std::string model = "unknown";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return str("{\"host\": \"", host, "\", \"cores\": ", std::thread::hardware_concurrency(),
             ", \"cpu\": \"", model, "\", \"date\": \"", date, "\"}");
}

}  // namespace lockstep::bench

int main(int argc, char** argv) {
  using namespace lockstep::bench;
  auto usage = [] {
    std::fprintf(stderr, "usage: lockstep-bench <benchmark> [--key=value ...]\n\nbenchmarks:\n");
    for (auto& [name, e] : registry()) {
      std::string flags;
      for (const auto& f : e.flags)
        flags += (f[0] == '<' ? " " : " --") + f;
      std::fprintf(stderr, "  %-14s %s\n  %-14s flags:%s\n", name.c_str(), e.help.c_str(), "",
                   flags.c_str());
    }
  };
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    usage();
    return argc < 2 ? 2 : 0;
  }
  auto it = registry().find(argv[1]);
  if (it == registry().end()) {
    std::fprintf(stderr, "lockstep-bench: unknown benchmark '%s'\n", argv[1]);
    usage();
    return 2;
  }
  Args args;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) == 0) {
      auto eq = a.find('=');
      if (eq == std::string::npos)
        args.options[a.substr(2)] = "1";
      else
        args.options[a.substr(2, eq - 2)] = a.substr(eq + 1);
    } else {
      args.positional.push_back(a);
    }
  }
  // An unknown or misspelled flag would otherwise be ignored, and the benchmark would measure
  // something else than asked (--rep=9 running the default repetitions).
  for (const auto& [key, value] : args.options) {
    if (it->second.flags.count(key)) continue;
    std::string known;
    for (const auto& f : it->second.flags)
      if (f[0] != '<') known += " --" + f;
    std::fprintf(stderr, "lockstep-bench %s: unknown flag --%s (it takes:%s)\n", argv[1],
                 key.c_str(), known.c_str());
    return 2;
  }
  // A benchmark with subcommands declares them as one "<a|b|c>" token among its flags.
  const bool takes_positional = std::any_of(it->second.flags.begin(), it->second.flags.end(),
                                            [](const std::string& f) { return f[0] == '<'; });
  if (!args.positional.empty() && !takes_positional) {
    std::fprintf(stderr, "lockstep-bench %s: unexpected argument '%s' (flags are --key=value)\n",
                 argv[1], args.positional.front().c_str());
    return 2;
  }
  try {
    return it->second.fn(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockstep-bench %s: error: %s\n", argv[1], e.what());
    return 1;
  }
}
