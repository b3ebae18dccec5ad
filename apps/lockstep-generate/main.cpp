// lockstep-generate: prints a continuation of a prompt from a language model trained by
// lockstep-train on token shards. The model spec, tokenizer and context come from the checkpoint.
//   lockstep-generate --checkpoint=FILE --prompt="..." [--tokens=200] [--temperature=1]
//                     [--top-k=0] [--seed=1] [--threads=N] [--gpt2-dir=DIR] [--ids]
// The same checkpoint, prompt and options print the same text on every run (see generate.hpp).
// Exit status: 0 done, 2 a bad command line, 1 any other error (always a message, never an abort).
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>

#include "lockstep/core/error.hpp"
#include "lockstep/data/tokenizer.hpp"
#include "lockstep/ops/context.hpp"
#include "lockstep/train/generate.hpp"

using namespace lockstep;

namespace {

std::string usage() {
  return str(
      "usage: lockstep-generate --checkpoint=FILE --prompt=TEXT [--tokens=200] [--temperature=1]\n"
      "                         [--top-k=0] [--seed=1] [--threads=1] [--gpt2-dir=DIR] [--ids]\n"
      "  --temperature=0 is greedy (the most likely token each step); --top-k=K samples among "
      "the\n  K most likely; --ids also prints the generated token ids (one line, after the "
      "text).\n  --tokens, --top-k and --seed are whole numbers (--seed: 0 to 2^64 - 1); "
      "--threads is 1 to ",
      ops::kMaxCpuThreads, ",\n  as for lockstep-train's train.threads.\n");
}

int error(const char* what, int status) {
  std::fprintf(stderr, "lockstep-generate: error: %s\n", what);
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  train::GenerateArgs args;
  try {
    args = train::parse_generate_args(argc, argv);
  } catch (const std::exception& e) {
    return error(e.what(), 2);
  }
  if (args.help) {
    std::cout << usage();
    return 0;
  }
  // Anything thrown below (lockstep::Error, or std::bad_alloc, std::system_error from a library)
  // is a message and status 1: an uncaught exception would abort with a core dump instead.
  try {
    ops::Context ctx(Device::cpu(), args.threads);
    train::LanguageModel lm = train::load_language_model(ctx, args.checkpoint);
    auto tokenizer = data::make_tokenizer(lm.tokenizer, args.gpt2_dir);
    std::vector<std::int32_t> tokens = tokenizer->encode(args.prompt);
    LOCKSTEP_CHECK(!tokens.empty(), "--prompt encodes to no tokens");
    const std::vector<std::int32_t> made =
        train::generate_tokens(ctx, *lm.model, tokens, args.tokens, args.sample);
    std::cout << args.prompt << tokenizer->decode(made) << '\n';
    if (args.ids) {
      for (std::size_t i = 0; i < made.size(); ++i)
        std::cout << (i ? " " : "") << made[i];
      std::cout << '\n';
    }
    return 0;
  } catch (const std::exception& e) {
    return error(e.what(), 1);
  } catch (...) {
    return error("an unknown exception", 1);
  }
}
