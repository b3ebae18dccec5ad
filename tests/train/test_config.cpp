#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include "lockstep/core/error.hpp"
#include "lockstep/parallel/reducer.hpp"
#include "lockstep/train/config.hpp"

using namespace lockstep;
using namespace lockstep::train;

namespace {
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Config, FileValuesThenCommandLineOverrides) {
  Config c = parse_config_text("[train]\nepochs = 3\nglobal_batch=64\n[optim]\nlr = 0.05\n",
                               {"train.epochs=5", "optim.nesterov=true"});
  EXPECT_EQ(c.train_epochs, 5);
  EXPECT_EQ(c.train_global_batch, 64);
  EXPECT_DOUBLE_EQ(c.optim_lr, 0.05);
  EXPECT_TRUE(c.optim_nesterov);
  EXPECT_EQ(c.optim_name, "sgd");  // default untouched
}

TEST(Config, UnknownKeyIsAnErrorNamingKeyFileAndSuggestion) {
  std::string e = error_of([] { parse_config_text("[train]\nepoch = 3\n", {}, "x.ini"); });
  EXPECT_NE(e.find("train.epoch"), std::string::npos) << e;
  EXPECT_NE(e.find("x.ini"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean train.epochs"), std::string::npos) << e;
  e = error_of([] { parse_config_text("", {"optim.lrr=1"}); });
  EXPECT_NE(e.find("optim.lrr"), std::string::npos) << e;
}

TEST(Config, BadValuesNameTheKey) {
  std::string e = error_of([] { parse_config_text("[train]\nepochs = three\n", {}, "y.ini"); });
  EXPECT_NE(e.find("train.epochs"), std::string::npos) << e;
  EXPECT_NE(e.find("'three' is not an integer"), std::string::npos) << e;
  e = error_of([] { parse_config_text("[train]\nparallel = mpi\n"); });
  EXPECT_NE(e.find("not one of auto, ddp, dp, none"), std::string::npos) << e;
  e = error_of([] { parse_config_text("[train]\nglobal_batch = 0\n"); });
  EXPECT_NE(e.find("train.global_batch"), std::string::npos) << e;
  e = error_of([] { parse_config_text("[optim]\nlr = nan\n"); });
  EXPECT_NE(e.find("optim.lr"), std::string::npos) << e;
  e = error_of([] { parse_config_text("[log]\nrank_prefix = maybe\n"); });
  EXPECT_NE(e.find("log.rank_prefix"), std::string::npos) << e;
}

TEST(Config, PrintedConfigParsesBackToTheSameConfig) {
  Config c =
      parse_config_text("[model]\nspec = conv(8,3)-relu-flatten-linear(10)\n[optim]\nlr=0.0123\n",
                        {"dist.bucket_mb=0.5"});
  std::string ini = to_ini(c);
  Config back = parse_config_text(ini);
  EXPECT_EQ(rank_invariant_settings(back), rank_invariant_settings(c));
  EXPECT_EQ(to_ini(back), ini);
}

TEST(Config, ParseArgsReadsFileAndRejectsMissingFile) {
  auto path = std::filesystem::temp_directory_path() / "lockstep_cfg_test.ini";
  { std::ofstream(path) << "[train]\nepochs = 7\n"; }
  std::string p = path.string();
  const char* argv[] = {"lockstep-train", "--config", p.c_str(), "--train.seed=9"};
  ParsedArgs a = parse_args(4, argv);
  EXPECT_EQ(a.config.train_epochs, 7);
  EXPECT_EQ(a.config.train_seed, 9);
  std::filesystem::remove(path);
  std::string e = error_of([&] { parse_args(4, argv); });
  EXPECT_NE(e.find(p), std::string::npos) << e;
  const char* bad[] = {"lockstep-train", "--train.epoch=3"};
  e = error_of([&] { parse_args(2, bad); });
  EXPECT_NE(e.find("train.epoch"), std::string::npos) << e;
}

TEST(Config, HelpListsEveryKeyWithDefault) {
  std::string h = help_text();
  for (const auto& [key, value] : rank_invariant_settings(Config{}))
    EXPECT_NE(h.find(key), std::string::npos) << key;
  EXPECT_NE(h.find("log.metrics"), std::string::npos);
}

namespace {
// parse_args over a list of arguments (argv[0] added).
ParsedArgs parse(std::vector<std::string> args) {
  args.insert(args.begin(), "lockstep-train");
  std::vector<const char*> argv;
  for (const auto& a : args)
    argv.push_back(a.c_str());
  return parse_args(static_cast<int>(argv.size()), argv.data());
}
std::string args_error(const std::vector<std::string>& args) {
  return error_of([&] { parse(args); });
}
struct IniFile {
  std::string path;
  explicit IniFile(const std::string& text, const std::string& name = "cli.ini") {
    path = (std::filesystem::temp_directory_path() / (std::to_string(::getpid()) + name)).string();
    std::ofstream(path) << text;
  }
  ~IniFile() { std::remove(path.c_str()); }
};
}  // namespace

TEST(CommandLine, AnEmptyValueAfterTheEqualsSignSetsTheEmptyValue) {
  IniFile ini("[data]\ntest = data/x/test\n");
  ParsedArgs a = parse({"--config", ini.path, "--data.test="});
  EXPECT_EQ(a.config.data_test, "");
  a = parse({"--config=" + ini.path, "--checkpoint.dir", "", "--log.metrics=m.jsonl"});
  EXPECT_EQ(a.config.data_test, "data/x/test");
  EXPECT_EQ(a.config.checkpoint_dir, "");
  EXPECT_EQ(a.config.log_metrics, "m.jsonl");
  // An empty value where a number is needed is a bad value, named.
  EXPECT_NE(args_error({"--train.epochs="}).find("key train.epochs"), std::string::npos);
}

TEST(CommandLine, AKeyGivenTwiceInOneIniFileIsAnErrorNamingBothLines) {
  std::string e = error_of([] {
    parse_config_text("[train]\nepochs = 3\nseed = 1\n\n[train]\nepochs=5 # again\n", {}, "d.ini");
  });
  EXPECT_NE(e.find("key train.epochs is given twice in d.ini: on line 2 and on line 6"),
            std::string::npos)
      << e;
  // The same name in two sections is two keys.
  EXPECT_EQ(error_of([] { parse_config_text("[train]\nseed = 1\n[optim]\nname = sgd\n"); }), "");
}

TEST(CommandLine, TwoConfigFlagsAreAnErrorAndALaterOverrideWins) {
  IniFile a("[train]\nepochs = 2\n", "a.ini"), b("[train]\nepochs = 3\n", "b.ini");
  std::string e = args_error({"--config", a.path, "--config=" + b.path});
  EXPECT_NE(e.find("two --config flags (" + a.path + " and " + b.path + ")"), std::string::npos)
      << e;
  // Documented (--help): on the command line a later --key wins, so wrappers can set defaults.
  ParsedArgs p =
      parse({"--config", a.path, "--optim.lr=0.1", "--train.epochs=4", "--optim.lr", "0.2"});
  EXPECT_DOUBLE_EQ(p.config.optim_lr, 0.2);
  EXPECT_EQ(p.config.train_epochs, 4);
  EXPECT_NE(help_text().find("a later --key over an earlier one"), std::string::npos);
}

TEST(CommandLine, MalformedArgumentsAreErrorsThatSayWhatToWrite) {
  EXPECT_NE(args_error({"configs/x.ini"}).find("pass the file as --config configs/x.ini"),
            std::string::npos);
  EXPECT_NE(args_error({"--optim.lr"}).find("option --optim.lr needs a value"), std::string::npos);
  // The next option is not taken as the value of one that lacks it.
  EXPECT_NE(args_error({"--data.test", "--optim.lr=1"}).find("option --data.test needs a value"),
            std::string::npos);
  EXPECT_NE(args_error({"--help=yes"}).find("--help takes no value"), std::string::npos);
  EXPECT_NE(args_error({"--optim.lrr=1"}).find("did you mean optim.lr?"), std::string::npos);
  EXPECT_NE(args_error({"--config="}).find("--config needs a file name"), std::string::npos);
  const std::string folder = std::filesystem::temp_directory_path().string();
  EXPECT_NE(args_error({"--config", folder}).find("config file '" + folder + "' is a folder"),
            std::string::npos);
  EXPECT_TRUE(parse({"-h"}).help);
  EXPECT_TRUE(parse({"--eval-only", "--print-config"}).eval_only);
}

TEST(CommandLine, IntegersOutOfRangeSaySo) {
  std::string e = args_error({"--train.epochs=9223372036854775808"});
  EXPECT_NE(e.find("key train.epochs in the command line: 9223372036854775808 is out of range"),
            std::string::npos)
      << e;
  EXPECT_NE(args_error({"--optim.lr=1e999"}).find("out of range"), std::string::npos);
  // Values later cast to int or float or scaled to bytes have upper bounds that name the key.
  e = args_error({"--train.threads=4294967297"});
  EXPECT_NE(e.find("key train.threads in the command line: 4294967297 is above the maximum"),
            std::string::npos)
      << e;
  EXPECT_NE(args_error({"--data.memory_budget_mb=9223372036854775807"}).find("above the maximum"),
            std::string::npos);
  EXPECT_NE(args_error({"--dist.bucket_mb=1e300"}).find("above the maximum"), std::string::npos);
  EXPECT_NE(args_error({"--optim.lr=1e39"}).find("above the maximum"), std::string::npos);
}

TEST(Config, DefaultsOwnedByALayerComeFromThatLayer) {
  const Config c;
  EXPECT_EQ(c.data_memory_budget_mb << 20, data::kDefaultMemoryBudgetBytes);
  EXPECT_EQ(c.data_prefetch, data::kDefaultPrefetchDepth);
  EXPECT_EQ(static_cast<std::size_t>(c.dist_bucket_mb * (1 << 20)), parallel::kDefaultBucketBytes);
  EXPECT_EQ(static_cast<std::size_t>(c.dist_first_bucket_mb * (1 << 20)),
            parallel::kDefaultFirstBucketBytes);
  // --help prints the same default the data layer uses.
  EXPECT_NE(help_text().find("data.memory_budget_mb"), std::string::npos);
  EXPECT_NE(help_text().find("default: " + std::to_string(data::kDefaultMemoryBudgetBytes >> 20)),
            std::string::npos);
}

TEST(Config, CheckpointCadenceWithoutAFolderIsAnError) {
  std::string e = error_of([] { parse_config_text("[checkpoint]\nevery_steps = 100\n"); });
  EXPECT_NE(e.find("key checkpoint.every_steps = 100 asks for checkpoints, but checkpoint.dir is "
                   "empty"),
            std::string::npos)
      << e;
  e = error_of([] { parse_config_text("", {"checkpoint.every_minutes=30"}); });
  EXPECT_NE(e.find("checkpoint.every_minutes = 30"), std::string::npos) << e;
  EXPECT_EQ(error_of([] {
              parse_config_text("", {"checkpoint.every_steps=5", "checkpoint.dir=d"});
            }),
            "");
}

TEST(CommandLine, DistGradDtypeIsFp32OrBf16ForRanksThatCommunicate) {
  EXPECT_EQ(parse({"--data.train=d/x"}).config.dist_grad_dtype, "fp32");
  EXPECT_EQ(parse({"--data.train=d/x", "--dist.grad_dtype=bf16"}).config.dist_grad_dtype, "bf16");
  std::string e = args_error({"--data.train=d/x", "--dist.grad_dtype=fp16"});
  EXPECT_NE(e.find("dist.grad_dtype"), std::string::npos) << e;
  EXPECT_NE(e.find("bf16"), std::string::npos) << e;  // the choices are listed
  e = args_error({"--data.train=d/x", "--dist.grad_dtype=bf16", "--train.parallel=dp"});
  EXPECT_NE(e.find("key dist.grad_dtype = bf16"), std::string::npos) << e;
  EXPECT_NE(e.find("train.parallel = dp"), std::string::npos) << e;
  // Accepted with dist.sync = false (nothing is sent), so a benchmark can switch sync alone.
  EXPECT_EQ(args_error({"--data.train=d/x", "--dist.grad_dtype=bf16", "--dist.sync=false"}), "");
  EXPECT_EQ(parallel::parse_grad_dtype("bf16", "k"), DType::BF16);
  EXPECT_EQ(parallel::parse_grad_dtype("fp32", "k"), DType::F32);
  EXPECT_THROW(parallel::parse_grad_dtype("f32", "k"), Error);
  // Ranks that send different dtypes would mismatch in every collective: checked at start-up.
  EXPECT_EQ(rank_invariant_settings(parse({"--data.train=d/x", "--dist.grad_dtype=bf16"}).config)
                .at("dist.grad_dtype"),
            "bf16");
}

TEST(CommandLine, DistZeroIsZeroOrOneAndNeedsRanksAndGradientCommunication) {
  EXPECT_EQ(parse({"--data.train=d/x"}).config.dist_zero, 0);
  EXPECT_EQ(parse({"--data.train=d/x", "--dist.zero=1"}).config.dist_zero, 1);
  std::string e = args_error({"--data.train=d/x", "--dist.zero=2"});
  EXPECT_NE(e.find("key dist.zero must be 0 or 1"), std::string::npos) << e;
  e = args_error({"--data.train=d/x", "--dist.zero=1", "--train.parallel=dp"});
  EXPECT_NE(e.find("key dist.zero = 1"), std::string::npos) << e;
  EXPECT_NE(e.find("train.parallel = dp"), std::string::npos) << e;
  e = args_error({"--data.train=d/x", "--dist.zero=1", "--dist.sync=false"});
  EXPECT_NE(e.find("dist.sync = false"), std::string::npos) << e;
  // Every rank must agree on it (checked at start-up with the other rank-invariant keys).
  EXPECT_EQ(
      rank_invariant_settings(parse({"--data.train=d/x", "--dist.zero=1"}).config).at("dist.zero"),
      "1");
}

namespace {
// Values a careless or hostile user may give a free-text key, each of which a bare INI value
// would read back as something else: a comment sign, blanks at the ends, quotes, backslashes,
// other INI readers' comment sign, '=', line breaks, control characters, a section header.
const std::vector<std::string> kNastyValues = {
    "a#b",         "#start",         "end#",       " lead",      "trail ",
    "  both  ",    "\ttab",          "semi;colon", ";",          "eq=ual",
    "=",           "a = b",          "\"quoted\"", "\"",         "'single'",
    "back\\slash", "\\\"",           "\\x41",      "new\nline",  "\n",
    "cr\r",        "\r\n",           "[section]",  "x\x01y\x7f", "caf\xc3\xa9",
    "k = v # c",   "\"unterminated", "a\"#\"b",    "\\",         "\"\"",
};

// Every key of the table, read from to_ini's output ("name = " lines under [section]).
std::vector<std::string> every_key() {
  std::vector<std::string> keys;
  std::istringstream in(to_ini(Config{}));
  std::string section;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      section = line.substr(1, line.size() - 2);
      continue;
    }
    keys.push_back(section + "." + line.substr(0, line.find(" = ")));
  }
  return keys;
}
}  // namespace

TEST(Config, PrintedConfigRoundTripsNastyValuesOfEveryStringKeyExactly) {
  int accepted = 0;
  for (const std::string& key : every_key()) {
    for (const std::string& value : kNastyValues) {
      Config c;
      try {
        c = parse_config_text("", {key + "=" + value});
      } catch (const Error&) {
        continue;  // a number, a boolean or a key with a fixed set of values: refused, fine
      }
      ++accepted;
      const std::string ini = to_ini(c);
      Config back;
      ASSERT_EQ(error_of([&] { back = parse_config_text(ini, {}, "printed.ini"); }), "")
          << key << " = [" << value << "] printed as\n"
          << ini;
      EXPECT_EQ(ini_value(ini, key), value) << key << " printed as\n" << ini;
      EXPECT_EQ(to_ini(back), ini) << key << " = [" << value << "]";
      EXPECT_EQ(rank_invariant_settings(back), rank_invariant_settings(c)) << key;
    }
  }
  // data.train, data.test, model.spec, train.resume, log.metrics, checkpoint.dir and
  // checkpoint.export take any text.
  EXPECT_GE(accepted, 7 * static_cast<int>(kNastyValues.size()));
  // Through the command line and a file, as a user does it: the same data set and outputs.
  IniFile printed(
      to_ini(parse({"--data.train=runs/a#b", "--checkpoint.dir= ck ", "--log.metrics=m;x.jsonl"})
                 .config),
      "printed.ini");
  const Config back = parse({"--config", printed.path}).config;
  EXPECT_EQ(back.data_train, "runs/a#b");
  EXPECT_EQ(back.checkpoint_dir, " ck ");
  EXPECT_EQ(back.log_metrics, "m;x.jsonl");
}

TEST(Config, PrintedConfigOfAConfigFileWithALineBreakInItsNameReadsBack) {
  IniFile odd("[train]\nepochs = 2\n", "odd\nname#.ini");
  const std::string ini = to_ini(parse({"--config", odd.path}).config);
  EXPECT_EQ(error_of([&] { parse_config_text(ini); }), "") << ini;
}

TEST(Config, QuotedValuesAreReadAndMalformedOnesAreErrorsNamingTheLine) {
  Config c = parse_config_text(
      "[data]\ntrain = \"a#b \\\"c\\\" \\\\ \\x41\"   # a comment\ntest = plain # comment\n");
  EXPECT_EQ(c.data_train, "a#b \"c\" \\ A");
  EXPECT_EQ(c.data_test, "plain");
  EXPECT_EQ(parse_config_text("[data]\ntest = \"\"\n").data_test, "");
  // A backslash in a bare value is itself (Windows-style paths stay as written).
  EXPECT_EQ(parse_config_text("[data]\ntest = a\\b\n").data_test, "a\\b");
  for (const char* bad : {"[data]\ntrain = \"abc\n", "[data]\ntrain = \"a\" b\n",
                          "[data]\ntrain = \"a\\qb\"\n", "[data]\ntrain = \"a\\x4\"\n"}) {
    const std::string e = error_of([&] { parse_config_text(bad, {}, "q.ini"); });
    EXPECT_NE(e.find("cannot parse q.ini: line 2"), std::string::npos) << bad << ": " << e;
  }
  EXPECT_NE(error_of([] {
              parse_config_text("[train]\nepochs\n", {}, "n.ini");
            }).find("cannot parse n.ini: line 2 is not key = value: 'epochs'"),
            std::string::npos);
}

TEST(CommandLine, IntegersAreReadExactlyNeverThroughADouble) {
  EXPECT_EQ(parse({"--train.seed=9007199254740993"}).config.train_seed, 9007199254740993);
  EXPECT_EQ(parse({"--train.seed=9223372036854775807"}).config.train_seed,
            std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(parse_unsigned("18446744073709551615", UINT64_MAX, "--seed"), UINT64_MAX);
  EXPECT_EQ(parse_unsigned("9007199254740993", UINT64_MAX, "--seed"), 9007199254740993u);
  EXPECT_EQ(parse_integer("+7", 0, 10, "x"), 7);
  for (const char* text : {"1e30", "inf", "nan", "1.0", "0x10", " 5", "5 ", "", "-", "+", "1e3"}) {
    std::string e = args_error({std::string("--train.seed=") + text});
    EXPECT_NE(e.find(str("key train.seed in the command line: '", text, "' is not an integer")),
              std::string::npos)
        << text << ": " << e;
    e = error_of([&] { parse_unsigned(text, UINT64_MAX, "option --seed"); });
    EXPECT_NE(e.find(str("option --seed: '", text, "' is not an integer")), std::string::npos) << e;
  }
  EXPECT_NE(error_of([] { parse_unsigned("18446744073709551616", UINT64_MAX, "--seed"); })
                .find("18446744073709551616 is out of range (a 64-bit unsigned integer is at "
                      "most 18446744073709551615)"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_unsigned("-1", UINT64_MAX, "--seed");
            }).find("-1 is below the minimum 0"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_integer("99999999999999999999", 0, 4096, "--threads");
            }).find("is above the maximum 4096"),
            std::string::npos);
}

TEST(KeyValueLines, RoundTripValuesWithLineBreaksBackslashesAndEqualSigns) {
  const std::map<std::string, std::string> values = {
      {"a", ""}, {"b", "x=y"}, {"c", "two\nlines"}, {"d", "back\\slash\\n"}, {"e", " blanks "}};
  const std::string text = key_value_lines(values);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 5) << "one line per key:\n" << text;
  EXPECT_EQ(parse_key_value_lines(text), values);
  EXPECT_EQ(parse_key_value_lines("no equal sign\nk=v\n"),
            (std::map<std::string, std::string>{{"k", "v"}}));
}
