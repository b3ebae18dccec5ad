// The spec front end: spec text (lockstep/nn/spec.hpp) to modules, then Model's constructor.
#include "lockstep/nn/model.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "batch_shape.hpp"
#include "lockstep/nn/layers.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::nn {
namespace {

constexpr const char* kLayerHint =
    "layers are conv(out,k[,stride=][,pad=][,bias=]), linear(out[,bias=]), bn, relu, gelu, "
    "maxpool(k[,stride][,pad]), avgpool(k[,stride][,pad]), gap, flatten, dropout(p), "
    "res(out[,stride]), bottleneck(width[,stride]), embed(vocab,ctx,dim[,pad_vocab]), "
    "block(heads[,depth]), "
    "ln, lmhead joined by '-'; presets are mlp[:h1,h2,...], lenet, resnet[:n], resnet18, "
    "resnet34, resnet50, gpt(layers,heads,dim[,ctx][,vocab][,pad_vocab]), gpt2-124m, gpt2-350m, "
    "gpt-mini, "
    "gpt-tiny";

struct Arg {
  std::string key;  // empty for a positional argument
  std::string value;
  std::size_t pos = 0, len = 0;
};

struct LayerToken {
  std::string name;
  std::vector<Arg> args;
  std::size_t pos = 0, len = 0;
};

// The spec being built, for error messages that quote it with a caret under the culprit.
struct SpecText {
  std::string text;
  std::string origin;  // "" or the preset it was expanded from

  [[noreturn]] void fail(std::size_t pos, std::size_t len, const std::string& message,
                         const std::string& hint) const {
    std::string where = origin.empty() ? "model spec" : "model spec (preset '" + origin + "')";
    LOCKSTEP_FAIL_HINT(hint, where, ", column ", pos + 1, ": ", message, "\n    ", text, "\n    ",
                       std::string(pos, ' '), "^", std::string(len > 1 ? len - 1 : 0, '~'));
  }
};

bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}

std::string trim(const std::string& s, std::size_t& offset) {
  std::size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b])))
    ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1])))
    --e;
  offset += b;
  return s.substr(b, e - b);
}

std::vector<LayerToken> tokenize(const SpecText& spec) {
  const std::string& text = spec.text;
  std::size_t i = 0, n = text.size();
  auto skip_space = [&] {
    while (i < n && std::isspace(static_cast<unsigned char>(text[i])))
      ++i;
  };
  std::vector<LayerToken> tokens;
  skip_space();
  if (i == n) spec.fail(0, 1, "the spec is empty", kLayerHint);
  while (true) {
    skip_space();
    LayerToken t;
    t.pos = i;
    while (i < n && is_name_char(text[i]))
      ++i;
    if (i == t.pos) {
      spec.fail(i, 1,
                i < n ? str("expected a layer name, found '", text[i], "'")
                      : std::string("expected a layer name after '-'"),
                kLayerHint);
    }
    t.name = text.substr(t.pos, i - t.pos);
    for (char& c : t.name)
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    skip_space();
    if (i < n && text[i] == '(') {
      std::size_t open = i++;
      skip_space();
      if (i < n && text[i] == ')') {
        ++i;
      } else {
        while (true) {
          std::size_t begin = i;
          while (i < n && text[i] != ',' && text[i] != ')' && text[i] != '(')
            ++i;
          if (i == n || text[i] == '(') {
            spec.fail(open, i - open, str("missing ')' after the arguments of '", t.name, "'"),
                      kLayerHint);
          }
          Arg a;
          a.pos = begin;
          std::string raw = trim(text.substr(begin, i - begin), a.pos);
          a.len = std::max<std::size_t>(raw.size(), 1);
          if (raw.empty()) spec.fail(a.pos, 1, "empty argument", kLayerHint);
          auto eq = raw.find('=');
          if (eq == std::string::npos) {
            a.value = raw;
          } else {
            std::size_t unused = 0;
            a.key = trim(raw.substr(0, eq), unused);
            a.value = trim(raw.substr(eq + 1), unused);
            if (a.key.empty() || a.value.empty()) {
              spec.fail(a.pos, a.len, str("malformed argument '", raw, "'"), "write key=value");
            }
          }
          t.args.push_back(a);
          if (text[i++] == ')') break;
        }
      }
    }
    t.len = i - t.pos;
    tokens.push_back(t);
    skip_space();
    if (i == n) break;
    if (text[i] != '-') {
      spec.fail(i, 1, str("expected '-' between layers, found '", text[i], "'"), kLayerHint);
    }
    ++i;
  }
  return tokens;
}

// One formal argument of a layer: name, default (NaN = required), integer-valued, range.
struct Formal {
  const char* name;
  double fallback;
  bool integer;
  double min, max;
};
constexpr double kRequired = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kIntMax = std::numeric_limits<int>::max();
// The deepest CIFAR ResNet of He et al. has 200 blocks per stage; more is a typo, and expanding
// it would build a spec of billions of layers.
constexpr std::int64_t kMaxResNetBlocks = 1000;

// The presets expand_preset knows (the gpt presets have their own expansion).
bool is_preset_name(const std::string& name) {
  for (const char* preset : {"mlp", "lenet", "resnet", "resnet18", "resnet34", "resnet50"}) {
    if (name == preset) return true;
  }
  return false;
}

std::vector<double> bind_args(const SpecText& spec, const LayerToken& t,
                              const std::vector<Formal>& formals) {
  std::vector<double> values(formals.size(), kRequired);
  std::vector<bool> set(formals.size(), false);
  std::string signature = t.name + "(";
  for (std::size_t k = 0; k < formals.size(); ++k) {
    signature += str(k ? ", " : "", formals[k].name);
  }
  signature += ")";
  if (formals.empty()) signature = t.name;
  std::size_t next_positional = 0;
  for (const Arg& a : t.args) {
    std::size_t k = formals.size();
    if (a.key.empty()) {
      k = next_positional++;
      if (k >= formals.size()) {
        spec.fail(a.pos, a.len, str("too many arguments for '", t.name, "'"),
                  str("usage: ", signature));
      }
    } else {
      for (std::size_t j = 0; j < formals.size(); ++j) {
        if (a.key == formals[j].name) k = j;
      }
      if (k == formals.size()) {
        spec.fail(a.pos, a.len, str("'", t.name, "' has no argument '", a.key, "'"),
                  str("usage: ", signature));
      }
    }
    if (set[k]) {
      spec.fail(a.pos, a.len, str("argument '", formals[k].name, "' given twice"),
                str("usage: ", signature));
    }
    const Formal& f = formals[k];
    char* end = nullptr;
    double v = std::strtod(a.value.c_str(), &end);
    // The whole value must be the number: a NUL inside it ends c_str() but not the text.
    bool ok = end == a.value.c_str() + a.value.size() && std::isfinite(v) &&
              (!f.integer || v == std::floor(v));
    if (!ok) {
      spec.fail(a.pos, a.len,
                str("argument '", f.name, "' of '", t.name, "' must be ",
                    f.integer ? "an integer" : "a number", ", got '", a.value, "'"),
                str("usage: ", signature));
    }
    // Integer arguments become ints (kernel, stride, padding; widths reach BLAS as int): a larger
    // value must be this error, not an overflowing conversion.
    const double max = f.integer ? std::min(f.max, kIntMax) : f.max;
    if (v < f.min || v > max) {
      spec.fail(
          a.pos, a.len,
          str("argument '", f.name, "' of '", t.name, "' is ", a.value, ", outside [", f.min, ", ",
              max == kInf ? std::string("inf") : str(static_cast<std::int64_t>(max)), "]"),
          str("usage: ", signature));
    }
    values[k] = v;
    set[k] = true;
  }
  for (std::size_t k = 0; k < formals.size(); ++k) {
    if (!set[k]) {
      if (std::isnan(formals[k].fallback)) {
        spec.fail(t.pos, t.len, str("'", t.name, "' needs argument '", formals[k].name, "'"),
                  str("usage: ", signature));
      }
      values[k] = formals[k].fallback;
    }
  }
  return values;
}

int as_int(double v) {
  return static_cast<int>(v);
}

// Builds the layer of token t for input shape `in` (batch dimension included). Shape problems
// throw plain Errors, which the caller re-throws pointing at the token.
// `built` are the layers before this one (lmhead ties itself to the last embed among them).
std::unique_ptr<Module> make_layer(const SpecText& spec, const LayerToken& t, const Shape& in,
                                   Device device, Sequential& built) {
  auto need_rank = [&](std::size_t rank, const char* what) {
    LOCKSTEP_CHECK_HINT(
        in.size() == rank,
        rank == 2 ? "put `flatten` (or `gap`) before it" : "give an image sample shape {C, H, W}",
        t.name, " expects input ", what, ", got ", shape_str(in));
  };
  const std::string& n = t.name;
  if (n == "conv") {
    auto v = bind_args(spec, t,
                       {{"out", kRequired, true, 1, kInf},
                        {"k", kRequired, true, 1, kInf},
                        {"stride", 1, true, 1, kInf},
                        {"pad", 0, true, 0, kInf},
                        {"bias", 1, true, 0, 1}});
    need_rank(4, "[N, C, H, W]");
    return std::make_unique<Conv2d>(in[1], static_cast<std::int64_t>(v[0]), as_int(v[1]),
                                    as_int(v[2]), as_int(v[3]), v[4] != 0, device);
  }
  if (n == "linear") {
    auto v = bind_args(spec, t, {{"out", kRequired, true, 1, kInf}, {"bias", 1, true, 0, 1}});
    need_rank(2, "[N, features]");
    return std::make_unique<Linear>(in[1], static_cast<std::int64_t>(v[0]), v[1] != 0, device);
  }
  if (n == "bn") {
    bind_args(spec, t, {});
    LOCKSTEP_CHECK(in.size() == 2 || in.size() == 4,
                   "bn expects input [N, C] or [N, C, H, W], got ", shape_str(in));
    if (in.size() == 2)
      return std::make_unique<BatchNorm1d>(in[1], kBatchNormEps, kBatchNormMomentum, device);
    return std::make_unique<BatchNorm2d>(in[1], kBatchNormEps, kBatchNormMomentum, device);
  }
  if (n == "relu" || n == "gelu" || n == "flatten" || n == "gap") {
    bind_args(spec, t, {});
    if (n == "relu") return std::make_unique<ReLU>();
    if (n == "gelu") return std::make_unique<GELU>();
    if (n == "flatten") return std::make_unique<Flatten>();
    return std::make_unique<GlobalAvgPool>();
  }
  if (n == "maxpool" || n == "avgpool") {
    auto v = bind_args(
        spec, t,
        {{"k", kRequired, true, 1, kInf}, {"stride", 0, true, 0, kInf}, {"pad", 0, true, 0, kInf}});
    if (n == "maxpool")
      return std::make_unique<MaxPool2d>(as_int(v[0]), as_int(v[1]), as_int(v[2]));
    return std::make_unique<AvgPool2d>(as_int(v[0]), as_int(v[1]), as_int(v[2]));
  }
  if (n == "dropout") {
    auto v = bind_args(spec, t, {{"p", kRequired, false, 0, 0.999999}});
    return std::make_unique<Dropout>(static_cast<float>(v[0]));
  }
  if (n == "res") {
    auto v = bind_args(spec, t, {{"out", kRequired, true, 1, kInf}, {"stride", 1, true, 1, kInf}});
    need_rank(4, "[N, C, H, W]");
    return std::make_unique<BasicBlock>(in[1], static_cast<std::int64_t>(v[0]), as_int(v[1]),
                                        device);
  }
  if (n == "bottleneck") {
    auto v =
        bind_args(spec, t, {{"width", kRequired, true, 1, kInf}, {"stride", 1, true, 1, kInf}});
    need_rank(4, "[N, C, H, W]");
    return std::make_unique<Bottleneck>(in[1], static_cast<std::int64_t>(v[0]), as_int(v[1]),
                                        device);
  }
  // ---- GPT layers (the gpt(...) presets expand to these)
  if (n == "embed") {
    auto v = bind_args(spec, t,
                       {{"vocab", kRequired, true, 1, kInf},
                        {"ctx", kRequired, true, 1, kInf},
                        {"dim", kRequired, true, 1, kInf},
                        {"pad_vocab", static_cast<double>(kVocabPadding), true, 1, kInf}});
    const auto vocab = static_cast<std::int64_t>(v[0]), pad = static_cast<std::int64_t>(v[3]);
    try {
      padded_vocab(vocab, pad);  // before the table is allocated
    } catch (const Error& e) {
      spec.fail(t.pos, t.len, e.message(), e.hint());
    }
    return std::make_unique<Embedding>(vocab, static_cast<std::int64_t>(v[1]),
                                       static_cast<std::int64_t>(v[2]), device, pad);
  }
  if (n == "block") {
    auto v = bind_args(spec, t, {{"heads", kRequired, true, 1, kInf}, {"depth", 1, true, 1, kInf}});
    LOCKSTEP_CHECK(in.size() == 3, "block expects input [N, T, C], got ", shape_str(in));
    return std::make_unique<TransformerBlock>(in[2], as_int(v[0]), static_cast<std::int64_t>(v[1]),
                                              device);
  }
  if (n == "ln") {
    bind_args(spec, t, {});
    LOCKSTEP_CHECK(in.size() >= 2, "ln expects input [N, ..., C], got ", shape_str(in));
    return std::make_unique<LayerNorm>(in.back(), kLayerNormEps, device);
  }
  if (n == "lmhead") {
    bind_args(spec, t, {});
    for (std::size_t k = built.size(); k-- > 0;) {
      if (auto* e = dynamic_cast<Embedding*>(&built.at(k))) return std::make_unique<TiedLmHead>(*e);
    }
    spec.fail(t.pos, t.len, "lmhead needs an embed layer before it (it reuses its token table)",
              "start the spec with embed(vocab, ctx, dim)");
  }
  if (n == "gpt") {
    spec.fail(t.pos, t.len, "a gpt(...) model cannot be combined with other layers",
              "a gpt spec is the whole model, e.g. gpt(layers=2,heads=2,dim=128)");
  }
  if (is_preset_name(n)) {
    spec.fail(t.pos, t.len, str("preset '", n, "' cannot be combined with other layers"),
              "a preset is the whole spec, e.g. `mlp:512,256`");
  }
  spec.fail(t.pos, n.size(), str("unknown layer '", n, "'"), kLayerHint);
}

// torchvision.models.resnet18/34/50: the ImageNet stem (7x7/2 conv, 3x3/2 max pool), four stages
// of widths 64..512, the first block of stages 2-4 strided, then global pooling and the head.
std::string imagenet_resnet(const std::string& name, std::int64_t classes) {
  const bool bottleneck = name == "resnet50";
  const std::int64_t blocks[4] = {name == "resnet18" ? 2 : 3, name == "resnet18" ? 2 : 4,
                                  name == "resnet18" ? 2 : 6, name == "resnet18" ? 2 : 3};
  std::string out = "conv(64,7,stride=2,pad=3,bias=0)-bn-relu-maxpool(3,stride=2,pad=1)";
  for (int stage = 0; stage < 4; ++stage) {
    const std::int64_t width = std::int64_t{64} << stage;
    for (std::int64_t b = 0; b < blocks[stage]; ++b) {
      const int stride = stage > 0 && b == 0 ? 2 : 1;
      out += str(bottleneck ? "-bottleneck(" : "-res(", width, stride == 2 ? ",2)" : ")");
    }
  }
  return out + str("-gap-linear(", classes, ")");
}

// Expands a preset ("mlp:512,256", "lenet", "resnet:3", "resnet50") into a layer spec; returns ""
// when spec is not a preset.
std::string expand_preset(const std::string& spec, std::int64_t classes, std::string& preset) {
  std::size_t offset = 0;
  std::string s = trim(spec, offset);
  std::size_t colon = s.find(':');
  std::string name = s.substr(0, colon);
  if (!is_preset_name(name)) return "";
  preset = name;
  SpecText text{spec, ""};
  std::vector<std::int64_t> values;
  if (colon != std::string::npos) {
    std::size_t pos = colon + 1;
    while (true) {
      std::size_t end = s.find(',', pos);
      std::string item = s.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
      std::size_t item_pos = offset + pos;
      std::string value = trim(item, item_pos);
      char* stop = nullptr;
      long long v = std::strtoll(value.c_str(), &stop, 10);
      if (value.empty() || stop != value.c_str() + value.size() || v <= 0) {
        text.fail(item_pos, std::max<std::size_t>(value.size(), 1),
                  str("preset '", name, "' needs positive integers after ':', got '", value, "'"),
                  "e.g. mlp:1024,1024 or resnet:3");
      }
      if (v > static_cast<long long>(kIntMax)) {  // strtoll saturates: this covers ERANGE too
        text.fail(item_pos, value.size(),
                  str("preset '", name, "' takes integers up to ", static_cast<int>(kIntMax),
                      " after ':', got '", value, "'"),
                  "e.g. mlp:1024,1024 or resnet:3");
      }
      values.push_back(v);
      if (end == std::string::npos) break;
      pos = end + 1;
    }
  }
  if (name == "mlp") {
    if (values.empty()) values = {1024, 1024};
    std::string out = "flatten";
    for (std::int64_t h : values)
      out += str("-linear(", h, ")-relu");
    return out + str("-linear(", classes, ")");
  }
  if (name != "mlp" && name != "resnet" && !values.empty()) {
    text.fail(offset + colon, s.size() - colon, str(name, " takes no arguments"), "");
  }
  if (name == "resnet18" || name == "resnet34" || name == "resnet50") {
    return imagenet_resnet(name, classes);
  }
  if (name == "lenet") {
    return str(
        "conv(6,5,pad=2)-relu-maxpool(2)-conv(16,5)-relu-maxpool(2)-flatten-linear(120)-"
        "relu-linear(84)-relu-linear(",
        classes, ")");
  }
  if (values.size() > 1) {
    text.fail(offset + colon, s.size() - colon, "resnet takes one argument, blocks per stage", "");
  }
  std::int64_t blocks = values.empty() ? 2 : values[0];
  if (blocks > kMaxResNetBlocks) {
    text.fail(offset + colon + 1, s.size() - colon - 1,
              str("resnet takes at most ", kMaxResNetBlocks, " blocks per stage, got ", blocks),
              "e.g. resnet:3 (ResNet-20) or resnet:18 (ResNet-110)");
  }
  std::string out = "conv(16,3,pad=1,bias=0)-bn-relu";
  const std::int64_t widths[] = {16, 32, 64};
  for (int stage = 0; stage < 3; ++stage) {
    for (std::int64_t b = 0; b < blocks; ++b) {
      out += (stage > 0 && b == 0) ? str("-res(", widths[stage], ",2)")
                                   : str("-res(", widths[stage], ")");
    }
  }
  return out + str("-gap-linear(", classes, ")");
}

// ---- GPT specs: gpt(layers, heads, dim[, ctx][, vocab][, pad_vocab]) and the named presets,
// which may take the same arguments in parentheses to override theirs (gpt-mini(ctx=64)). ctx and
// vocab default to the data's sequence length and vocabulary; given, they must agree with it.
// pad_vocab (default kVocabPadding = 128; 1 = none) pads the token table's rows (embedding.hpp);
// the expansion states it only when it is not the default, so the layer spec (and the structure
// a checkpoint is checked against) of a model with the default is what it was before padding.
struct GptPreset {
  const char* name;
  std::int64_t layers, heads, dim, ctx, vocab;  // vocab 0: the data's
};
// GPT-2 small and medium, and two shapes for CPU runs (head width 64, as GPT-2's, which is also
// one of the widths the CUDA flash kernels cover).
constexpr GptPreset kGptPresets[] = {
    {"gpt2-124m", 12, 12, 768, 1024, 50257},
    {"gpt2-350m", 24, 16, 1024, 1024, 50257},
    {"gpt-mini", 4, 4, 256, 256, 0},
    {"gpt-tiny", 2, 2, 128, 128, 0},
};

std::string expand_gpt(const std::string& spec, const Shape& sample_shape, std::int64_t classes,
                       std::string& preset) {
  std::size_t offset = 0;
  const std::string s = trim(spec, offset);
  std::size_t name_end = 0;
  while (name_end < s.size() && (is_name_char(s[name_end]) || s[name_end] == '-'))
    ++name_end;
  std::string name = s.substr(0, name_end);
  for (char& c : name)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const GptPreset* found = nullptr;
  for (const GptPreset& p : kGptPresets) {
    if (name == p.name) found = &p;
  }
  if (!found && name != "gpt") return "";
  std::string text = spec;
  if (found) {
    preset = found->name;
    // Rewrite as gpt(...) with the preset's values, the user's own arguments replacing them.
    std::vector<std::pair<std::string, std::string>> args = {{"layers", str(found->layers)},
                                                             {"heads", str(found->heads)},
                                                             {"dim", str(found->dim)},
                                                             {"ctx", str(found->ctx)}};
    if (found->vocab) args.emplace_back("vocab", str(found->vocab));
    std::string rest = s.substr(name_end);
    SpecText user{"gpt" + rest, preset};
    std::vector<LayerToken> tokens = tokenize(user);
    if (tokens.size() > 1) {
      SpecText{spec, ""}.fail(offset + name_end, s.size() - name_end,
                              str("preset '", preset, "' cannot be combined with other layers"),
                              "a preset is the whole spec; override its values in parentheses, "
                              "e.g. gpt-mini(ctx=64)");
    }
    for (const Arg& a : tokens[0].args) {
      if (a.key.empty()) {
        SpecText{spec, ""}.fail(offset + name_end, s.size() - name_end,
                                str("preset '", preset, "' takes key=value overrides only"),
                                "e.g. gpt-mini(ctx=64)");
      }
      auto it = std::find_if(args.begin(), args.end(), [&](auto& kv) { return kv.first == a.key; });
      if (it != args.end())
        it->second = a.value;
      else
        args.emplace_back(a.key, a.value);
    }
    text = "gpt(";
    for (std::size_t k = 0; k < args.size(); ++k)
      text += str(k ? "," : "", args[k].first, "=", args[k].second);
    text += ")";
  }
  SpecText gpt{text, preset};
  std::vector<LayerToken> tokens = tokenize(gpt);
  const LayerToken& t = tokens[0];
  if (tokens.size() > 1 || t.name != "gpt") {
    const LayerToken& extra = tokens.size() > 1 ? tokens[1] : t;
    gpt.fail(extra.pos, extra.len, "a gpt(...) model cannot be combined with other layers",
             "a gpt spec is the whole model, e.g. gpt(layers=2,heads=2,dim=128)");
  }
  const std::vector<Formal> formals = {
      {"layers", kRequired, true, 1, kInf},
      {"heads", kRequired, true, 1, kInf},
      {"dim", kRequired, true, 1, kInf},
      {"ctx", -1, true, 1, kInf},
      {"vocab", -1, true, 1, kInf},
      {"pad_vocab", static_cast<double>(kVocabPadding), true, 1, kInf}};
  auto v = bind_args(gpt, t, formals);
  // Where argument k was written, for the caret (the whole token if it was not).
  auto fail_at = [&](std::size_t k, const std::string& message, const std::string& hint) {
    std::size_t positional = 0;
    for (const Arg& a : t.args) {
      bool match = a.key.empty() ? positional++ == k : a.key == formals[k].name;
      if (match) gpt.fail(a.pos, a.len, message, hint);
    }
    gpt.fail(t.pos, t.len, message, hint);
  };
  const auto layers = static_cast<std::int64_t>(v[0]), heads = static_cast<std::int64_t>(v[1]);
  const auto dim = static_cast<std::int64_t>(v[2]);
  if (sample_shape.size() != 1) {
    gpt.fail(t.pos, t.len,
             str("gpt models read token sequences: the data's sample shape must be [T], got ",
                 shape_str(sample_shape)),
             "train on token shards (lockstep-shard text)");
  }
  const std::int64_t seq = sample_shape[0];
  if (dim % heads != 0) {
    fail_at(1, str("dim = ", dim, " is not a multiple of heads = ", heads),
            "each head gets dim / heads features");
  }
  std::int64_t ctx = static_cast<std::int64_t>(v[3]);
  if (ctx < 0) ctx = seq;
  if (seq > ctx) {
    fail_at(
        3,
        str("the data's sequences have T = ", seq, " tokens but the model's context is ctx = ", ctx,
            " positions"),
        str("raise ctx to at least ", seq, " or train on sequences of at most ", ctx, " tokens"));
  }
  std::int64_t vocab = static_cast<std::int64_t>(v[4]);
  if (vocab < 0) vocab = classes;
  if (classes >= 0 && vocab != classes) {  // classes < 0: unknown (spec_context)
    fail_at(4,
            str("vocab = ", vocab, " but the data has ", classes, " classes (its vocabulary size)"),
            "make vocab the data's vocabulary size, or leave it out to take it from the data");
  }
  const auto pad = static_cast<std::int64_t>(v[5]);
  if (vocab > 0) {
    try {
      padded_vocab(vocab, pad);
    } catch (const Error& e) {
      fail_at(5, e.message(), e.hint());
    }
  }
  std::string out = str("embed(vocab=", vocab, ",ctx=", ctx, ",dim=", dim,
                        pad == kVocabPadding ? std::string() : str(",pad_vocab=", pad), ")");
  for (std::int64_t k = 0; k < layers; ++k)
    out += str("-block(heads=", heads, ",depth=", layers, ")");
  return out + "-ln-lmhead";
}

}  // namespace

std::int64_t spec_context(const std::string& spec) {
  std::string preset;
  // No data yet: T = 0 (so an unstated ctx comes out as 0) and an unknown vocabulary.
  const std::string expanded = expand_gpt(spec, Shape{0}, -1, preset);
  const std::size_t at = expanded.find("ctx=");
  if (expanded.empty() || at == std::string::npos) return 0;
  return std::stoll(expanded.substr(at + 4));
}

Model Model::build(const std::string& spec, const Shape& sample_shape, std::int64_t num_classes,
                   std::uint64_t seed, Device device) {
  LOCKSTEP_CHECK(num_classes >= 1, "model: num_classes must be positive, got ", num_classes);
  LOCKSTEP_CHECK(!sample_shape.empty() && shape_numel(sample_shape) > 0,
                 "model: sample shape must be non-empty, got ", shape_str(sample_shape));
  Sequential layers;

  SpecText text{spec, ""};
  std::string preset;
  std::string expanded = expand_gpt(spec, sample_shape, num_classes, preset);
  if (expanded.empty()) expanded = expand_preset(spec, num_classes, preset);
  if (!expanded.empty()) text = SpecText{expanded, preset};
  std::vector<LayerToken> tokens = tokenize(text);

  // The classifier head (see spec.hpp): validate an explicit final linear, else append one.
  const LayerToken& last = tokens.back();
  bool explicit_head = last.name == "linear" || last.name == "lmhead";
  Shape shape{1};
  shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
  for (std::size_t k = 0;; ++k) {
    if (k == tokens.size()) {
      if (explicit_head) break;
      // Append the head to the spec text so layer_spec() and later errors show it.
      std::string head = shape.size() > 2 ? "flatten-" : "";
      head += str("linear(", num_classes, ")");
      std::size_t pos = text.text.size() + 1;
      text.text += "-" + head;
      for (LayerToken t : tokenize(SpecText{head, ""})) {
        t.pos += pos;
        tokens.push_back(t);
      }
      explicit_head = true;
    }
    const LayerToken& t = tokens[k];
    std::unique_ptr<Module> layer;
    Shape out;
    try {
      layer = make_layer(text, t, shape, device, layers);
      out = layer->output_shape(shape);
    } catch (const OutOfMemory&) {
      rethrow_with_context(str("model.spec layer ", k, " '", text.text.substr(t.pos, t.len),
                               "' on input ", batch_shape_str(shape), ", its parameters"));
    } catch (const Error& e) {
      if (e.message().rfind("model spec", 0) == 0) throw;  // already points at the spec
      text.fail(t.pos, t.len,
                str("layer ", k, " '", text.text.substr(t.pos, t.len), "' does not fit its input ",
                    batch_shape_str(shape), " (sample shape ", shape_str(sample_shape),
                    "): ", e.message()),
                e.hint());
    }
    layers.add(std::move(layer));
    shape = out;
  }
  // A language model's head gives one row of logits per position: [T, classes] per sample.
  const bool per_position = tokens.back().name == "lmhead";
  if (per_position && shape.size() == 2 && shape[1] != num_classes) {
    const LayerToken& t = tokens.back();
    text.fail(t.pos, t.len,
              str("the LM head outputs ", shape[1],
                  " logits per position (the embedding's vocab) "
                  "but the data has ",
                  num_classes, " classes"),
              "make the embedding's vocab the data's vocabulary size");
  }
  if (!per_position && shape != Shape{1, num_classes}) {
    const LayerToken& t = tokens.back();
    text.fail(t.pos, t.len,
              str("the last layer outputs ", batch_shape_str(shape), " but the data has ",
                  num_classes, " classes"),
              str("end the spec with linear(", num_classes, ") or leave the head out"));
  }
  // The checks above quote the spec; the constructor's own (shapes, names) cannot fail here.
  Model m(std::move(layers), sample_shape, num_classes, seed, device);
  m.spec_ = spec;
  m.layer_spec_ = text.text;
  return m;
}

}  // namespace lockstep::nn
