#include "lockstep/train/generate.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

#include "lockstep/core/error.hpp"
#include "lockstep/core/rng.hpp"
#include "lockstep/ops/ops.hpp"
#include "lockstep/train/checkpoint.hpp"
#include "lockstep/train/config.hpp"

namespace lockstep::train {
namespace {

// Picks a token from logits: argmax at temperature 0 (the lowest id on ties), else a draw from
// softmax(logits / temperature), restricted to the top_k largest when top_k > 0.
std::int32_t pick(const std::vector<float>& logits, const SampleOptions& o, float uniform) {
  const auto vocab = static_cast<std::int64_t>(logits.size());
  if (o.temperature <= 0)
    return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) -
                                     logits.begin());
  std::vector<std::int32_t> ids(static_cast<std::size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  // Largest first, ties by id, so the order (and the draw) never depends on the sort.
  std::stable_sort(ids.begin(), ids.end(),
                   [&](std::int32_t a, std::int32_t b) { return logits[a] > logits[b]; });
  if (o.top_k > 0 && o.top_k < vocab) ids.resize(static_cast<std::size_t>(o.top_k));
  std::vector<double> p(ids.size());
  const double top = logits[static_cast<std::size_t>(ids[0])];
  double sum = 0;
  for (std::size_t i = 0; i < ids.size(); ++i)
    sum += p[i] = std::exp((logits[static_cast<std::size_t>(ids[i])] - top) / o.temperature);
  double target = static_cast<double>(uniform) * sum;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    target -= p[i];
    if (target < 0) return ids[i];
  }
  return ids.back();
}

}  // namespace

std::vector<float> next_token_logits(ops::Context& ctx, nn::Model& model,
                                     const std::vector<std::int32_t>& tokens) {
  LOCKSTEP_CHECK(model.sample_shape().size() == 1 && model.outputs_per_sample() > 1,
                 "generation needs a language model (token windows in, one row of logits per "
                 "position out); model ",
                 model.spec(), " is not one");
  LOCKSTEP_CHECK(!tokens.empty(), "generation needs at least one token to start from");
  const std::int64_t window = model.sample_shape()[0];
  // The last `window` tokens; a shorter sequence is padded after its end, which the causal mask
  // keeps from influencing the positions before it.
  const std::size_t n = std::min(tokens.size(), static_cast<std::size_t>(window));
  std::vector<std::int32_t> x(static_cast<std::size_t>(window), 0);
  std::copy(tokens.end() - static_cast<std::ptrdiff_t>(n), tokens.end(), x.begin());
  const bool was_training = model.training();
  model.set_training(false);
  Tensor input = Tensor::from_vector(x, {1, window}).to(ctx.device());
  Tensor logits = model.forward(ctx, input).to(Device::cpu());  // [window, vocab]
  model.set_training(was_training);
  const std::int64_t vocab = logits.dim(1);
  const float* row = logits.data<float>() + (static_cast<std::int64_t>(n) - 1) * vocab;
  return std::vector<float>(row, row + vocab);
}

std::vector<std::int32_t> generate_tokens(ops::Context& ctx, nn::Model& model,
                                          std::vector<std::int32_t>& tokens, std::int64_t count,
                                          const SampleOptions& options) {
  const Philox rng(options.seed, hash_string("lockstep-generate"));
  std::vector<std::int32_t> out;
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int32_t next = pick(next_token_logits(ctx, model, tokens), options,
                                   rng.uniform(static_cast<std::uint64_t>(i)));
    tokens.push_back(next);
    out.push_back(next);
  }
  return out;
}

GenerateArgs parse_generate_args(int argc, const char* const* argv) {
  const std::string hint = "see lockstep-generate --help";
  GenerateArgs a;
  std::map<std::string, std::string> o;  // name -> value; a later option wins
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--help" || s == "-h") {
      a.help = true;
      return a;
    }
    LOCKSTEP_CHECK_HINT(s.rfind("--", 0) == 0 && s.size() > 2, hint, "unexpected argument '", s,
                        "'");
    const auto eq = s.find('=');
    const std::string name = s.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    if (name == "ids") {
      LOCKSTEP_CHECK_HINT(eq == std::string::npos, hint, "--ids takes no value");
      a.ids = true;
      continue;
    }
    static const char* const kValued[] = {"checkpoint", "prompt", "tokens",  "temperature",
                                          "top-k",      "seed",   "threads", "gpt2-dir"};
    LOCKSTEP_CHECK_HINT(
        std::find(std::begin(kValued), std::end(kValued), name) != std::end(kValued), hint,
        "unknown option --", name);
    LOCKSTEP_CHECK_HINT(eq != std::string::npos, str("write --", name, "=VALUE"), "option --", name,
                        " needs a value");
    o[name] = s.substr(eq + 1);
  }
  auto given = [&](const char* name) { return o.count(name) ? &o[name] : nullptr; };
  auto what = [](const char* name) { return str("option --", name); };
  constexpr auto kInt64Max = std::numeric_limits<std::int64_t>::max();
  if (auto* v = given("tokens")) a.tokens = parse_integer(*v, 0, kInt64Max, what("tokens"), hint);
  if (auto* v = given("top-k"))
    a.sample.top_k = parse_integer(*v, 0, kInt64Max, what("top-k"), hint);
  if (auto* v = given("seed"))
    a.sample.seed =
        parse_unsigned(*v, std::numeric_limits<std::uint64_t>::max(), what("seed"), hint);
  if (auto* v = given("threads"))
    a.threads = static_cast<int>(parse_integer(*v, 1, ops::kMaxCpuThreads, what("threads"), hint));
  if (auto* v = given("temperature"))
    a.sample.temperature =
        parse_real(*v, 0, std::numeric_limits<double>::max(), what("temperature"), hint);
  if (auto* v = given("gpt2-dir")) a.gpt2_dir = *v;
  if (auto* v = given("checkpoint")) a.checkpoint = *v;
  if (auto* v = given("prompt")) a.prompt = *v;
  LOCKSTEP_CHECK_HINT(!a.checkpoint.empty(),
                      "e.g. --checkpoint=runs/gpt_tiny/ckpt/ckpt-00000500.h5",
                      "missing --checkpoint=FILE");
  LOCKSTEP_CHECK_HINT(!a.prompt.empty(), "e.g. --prompt=\"And God said\"",
                      "missing --prompt=TEXT (at least one token to continue)");
  return a;
}

LanguageModel load_language_model(ops::Context& ctx, const std::string& path) {
  const CheckpointState c = read_checkpoint(path);
  auto attr = [&](const std::string& key) {
    auto it = c.attrs.find(key);
    LOCKSTEP_CHECK_HINT(it != c.attrs.end(),
                        "generate from a checkpoint of a run on token shards (lockstep-shard text)",
                        "checkpoint ", path, " has no '", key,
                        "' attribute: it was not written by a language-model run");
    return it->second;
  };
  LanguageModel lm;
  lm.tokenizer = attr("tokenizer");
  // A damaged attribute is an error naming the file, not std::invalid_argument.
  auto whole = [&](const char* key, std::int64_t min) {
    return parse_integer(attr(key), min, std::numeric_limits<std::int32_t>::max(),
                         str("checkpoint ", path, " attribute '", key, "'"));
  };
  lm.context = whole("context", 1);
  lm.eot_token =
      static_cast<std::int32_t>(whole("eot_token", std::numeric_limits<std::int32_t>::min()));
  const std::int64_t vocab = whole("vocab_size", 1);
  const std::string spec = ini_value(c.config_ini, "model.spec");
  LOCKSTEP_CHECK(!spec.empty(), "checkpoint ", path, " records no model.spec in its config");
  lm.model = std::make_unique<nn::Model>(
      nn::Model::build(spec, Shape{lm.context}, vocab, /*seed=*/0, ctx.device()));
  LOCKSTEP_CHECK(lm.model->structure() == c.model_structure, "checkpoint ", path,
                 ": model.spec = ", spec, " rebuilds another model than the one it holds");
  for (nn::Parameter* p : lm.model->parameters()) {
    Tensor value = nn::unpadded(*p, p->value);  // checkpoints store no padding
    ops::copy(ctx, c.tensor("param/" + p->name), value);
  }
  for (nn::Buffer* b : lm.model->buffers())
    ops::copy(ctx, c.tensor("buffer/" + b->name), b->value);
  lm.model->set_training(false);
  return lm;
}

}  // namespace lockstep::train
