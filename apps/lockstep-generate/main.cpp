// lockstep-generate: prints a continuation of a prompt from a language model trained by
// lockstep-train on token shards. The model spec, tokenizer and context come from the checkpoint.
//   lockstep-generate --checkpoint=FILE --prompt="..." [--tokens=200] [--temperature=1]
//                     [--top-k=0] [--seed=1] [--threads=N] [--gpt2-dir=DIR] [--ids]
// The same checkpoint, prompt and options print the same text on every run (see generate.hpp).
#include <cstdio>
#include <iostream>
#include <map>
#include <set>
#include <string>

#include "lockstep/core/error.hpp"
#include "lockstep/data/tokenizer.hpp"
#include "lockstep/ops/context.hpp"
#include "lockstep/train/generate.hpp"

using namespace lockstep;

namespace {

constexpr const char* kUsage =
    "usage: lockstep-generate --checkpoint=FILE --prompt=TEXT [--tokens=200] [--temperature=1]\n"
    "                         [--top-k=0] [--seed=1] [--threads=1] [--gpt2-dir=DIR] [--ids]\n"
    "  --temperature=0 is greedy (the most likely token each step); --top-k=K samples among the\n"
    "  K most likely; --ids also prints the generated token ids (one line, after the text).\n";

const std::set<std::string> kKeys = {"checkpoint", "prompt",  "tokens",   "temperature", "top-k",
                                     "seed",       "threads", "gpt2-dir", "ids"};

double number(const std::map<std::string, std::string>& o, const std::string& key, double fallback,
              double min) {
  auto it = o.find(key);
  if (it == o.end()) return fallback;
  double v = 0;
  try {
    std::size_t used = 0;
    v = std::stod(it->second, &used);
    LOCKSTEP_CHECK(used == it->second.size(), "");
  } catch (const std::exception&) {
    LOCKSTEP_FAIL("--", key, "=", it->second, " is not a number");
  }
  LOCKSTEP_CHECK(v >= min, "--", key, "=", it->second, " must be at least ", min);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> o;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--help" || s == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    const auto eq = s.find('=');
    if (s.rfind("--", 0) != 0) {
      std::fprintf(stderr, "lockstep-generate: unexpected argument '%s'\n%s", s.c_str(), kUsage);
      return 2;
    }
    o[s.substr(2, eq == std::string::npos ? std::string::npos : eq - 2)] =
        eq == std::string::npos ? "1" : s.substr(eq + 1);
  }
  try {
    for (const auto& [key, value] : o)
      LOCKSTEP_CHECK_HINT(kKeys.count(key), "see lockstep-generate --help", "unknown option --",
                          key);
    LOCKSTEP_CHECK_HINT(o.count("checkpoint") && !o["checkpoint"].empty(),
                        "e.g. --checkpoint=runs/gpt_tiny/ckpt/ckpt-00000500.h5",
                        "missing --checkpoint=FILE");
    LOCKSTEP_CHECK_HINT(o.count("prompt") && !o["prompt"].empty(), "e.g. --prompt=\"And God said\"",
                        "missing --prompt=TEXT (at least one token to continue)");
    train::SampleOptions so;
    so.temperature = number(o, "temperature", 1.0, 0.0);
    so.top_k = static_cast<std::int64_t>(number(o, "top-k", 0, 0));
    so.seed = static_cast<std::uint64_t>(number(o, "seed", 1, 0));
    const auto count = static_cast<std::int64_t>(number(o, "tokens", 200, 0));
    const int threads = static_cast<int>(number(o, "threads", 1, 1));

    ops::Context ctx(Device::cpu(), threads);
    train::LanguageModel lm = train::load_language_model(ctx, o["checkpoint"]);
    auto tokenizer = data::make_tokenizer(lm.tokenizer, o.count("gpt2-dir") ? o["gpt2-dir"] : "");
    std::vector<std::int32_t> tokens = tokenizer->encode(o["prompt"]);
    LOCKSTEP_CHECK(!tokens.empty(), "--prompt encodes to no tokens");
    const std::vector<std::int32_t> made =
        train::generate_tokens(ctx, *lm.model, tokens, count, so);
    std::cout << o["prompt"] << tokenizer->decode(made) << '\n';
    if (o.count("ids")) {
      for (std::size_t i = 0; i < made.size(); ++i)
        std::cout << (i ? " " : "") << made[i];
      std::cout << '\n';
    }
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "lockstep-generate: error: %s\n", e.what());
    return 1;
  }
}
