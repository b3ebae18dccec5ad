// Fuzz target `config`: the INI parser and command-line overrides.
// Input: INI text, then optionally <separator> and one "section.key=value" override per line.
// The overrides also go through parse_args as --section.key=value (without --config, so the
// target never reads files named by the input).
// Property of an accepted config: to_ini() is accepted back and prints the same config, as
// --print-config promises ("reusable as a config file").
#include "fuzz_support.hpp"
#include "lockstep/train/config.hpp"

using namespace lockstep;

namespace {
std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::vector<std::string> parts = fuzz::split_input(data, size);
  std::vector<std::string> overrides;
  for (std::size_t p = 1; p < parts.size(); ++p)
    for (auto& line : lines_of(parts[p]))
      overrides.push_back(line);

  fuzz::accepts([&] {
    train::Config c = train::parse_config_text(parts[0], overrides, "fuzz.ini");
    const std::string ini = train::to_ini(c);
    train::Config back;
    if (!fuzz::accepts([&] { back = train::parse_config_text(ini, {}, "to_ini output"); }))
      fuzz::violated("to_ini output is rejected by the parser:\n" + ini);
    const std::string again = train::to_ini(back);
    LOCKSTEP_FUZZ_ASSERT(again == ini, "to_ini does not round-trip:\n", ini, "\nvs\n", again);
  });

  std::vector<std::string> args{"lockstep-train"};
  for (const auto& o : overrides) {
    if (o.find("config") != std::string::npos && o.find("print-config") == std::string::npos)
      continue;  // --config FILE would read a file the input names
    args.push_back("--" + o);
  }
  std::vector<const char*> argv;
  for (const auto& a : args)
    argv.push_back(a.c_str());
  fuzz::accepts([&] { train::parse_args(static_cast<int>(argv.size()), argv.data()); });
  return 0;
}
