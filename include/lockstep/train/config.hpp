// The experiment configuration: one INI file plus `--section.key=value` overrides. Every key, its
// default and its meaning live in one table (src/train/config.cpp), which drives parsing, --help
// and --print-config, so the three can never disagree. Unknown keys, bad values and missing files
// are errors that name the key (and the file).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lockstep/data/defaults.hpp"
#include "lockstep/parallel/reducer.hpp"

namespace lockstep::train {

// Field defaults are the documented defaults (the table in config.cpp reads them from here); where
// a layer owns a default (data/defaults.hpp, parallel/reducer.hpp), the field takes it from there.
struct Config {
  // [data]
  std::string data_train = "data/fashion-mnist/train";
  std::string data_test = "data/fashion-mnist/test";
  std::int64_t data_memory_budget_mb = data::kDefaultMemoryBudgetBytes >> 20;
  std::int64_t data_prefetch = data::kDefaultPrefetchDepth;
  std::int64_t data_decode_threads = data::kDefaultDecodeThreads;  // encoded image shards
  std::string data_node_shared = "auto";
  std::int64_t data_context = 0;  // token shards: window length T; 0 = the model's ctx
  // Training augmentation of u8 image samples (data/augment.hpp; torchvision's defaults).
  bool data_random_resized_crop = false;
  double data_rrc_scale_min = 0.08, data_rrc_scale_max = 1.0;
  double data_rrc_ratio_min = 3.0 / 4.0, data_rrc_ratio_max = 4.0 / 3.0;
  std::int64_t data_pad_crop = 0;
  bool data_flip = false;
  // [model]
  std::string model_spec = "mlp:256,256";
  bool model_zero_init_residual = false;
  std::string model_channels_last = "auto";
  // [train]
  std::int64_t train_epochs = 1;
  std::int64_t train_global_batch = 256;
  std::int64_t train_accumulation = 1;
  std::int64_t train_max_steps = 0;
  std::int64_t train_seed = 1;
  std::string train_parallel = "auto";
  std::int64_t train_replicas = 2;
  std::int64_t train_threads = 0;
  std::string train_device = "cpu";
  std::string train_gpu = "auto";
  std::string train_precision = "fp32";
  std::string train_recompute = "none";
  std::string train_attention = "auto";
  std::string train_resume = "";
  std::string train_nan_policy = "stop";
  bool train_eval = true;
  std::int64_t train_eval_every_steps = 0;
  double train_label_smoothing = 0.0;
  // [optim]
  std::string optim_name = "sgd";
  double optim_lr = 0.1;
  double optim_momentum = 0.9;
  bool optim_nesterov = false;
  double optim_weight_decay = 0.0;
  double optim_beta1 = 0.9;
  double optim_beta2 = 0.999;
  double optim_eps = 1e-8;
  std::string optim_schedule = "constant";
  std::int64_t optim_warmup_steps = 0;
  std::int64_t optim_step_size = 1000;
  double optim_gamma = 0.1;
  double optim_min_lr = 0.0;
  double optim_clip_norm = 0.0;
  std::string optim_decay = "all";
  // [dist]
  double dist_bucket_mb = static_cast<double>(parallel::kDefaultBucketBytes >> 20);
  double dist_first_bucket_mb = static_cast<double>(parallel::kDefaultFirstBucketBytes >> 20);
  bool dist_sync = true;
  double dist_timeout_s = 300.0;  // comm::kDefaultTimeoutSeconds (tests/comm checks they agree)
  std::string dist_algorithm = "auto";
  std::int64_t dist_zero = 0;  // ZeRO stage: 0 or 1
  std::string dist_grad_dtype = "fp32";
  // [log]
  std::int64_t log_every = 50;
  std::string log_metrics = "";
  std::string log_tensorboard = "";
  std::string log_trace = "";
  std::string log_trace_steps = "6:10";
  bool log_rank_prefix = false;
  std::string log_progress = "auto";
  // [checkpoint]
  std::string checkpoint_dir = "";
  std::int64_t checkpoint_every_steps = 0;
  double checkpoint_every_minutes = 0.0;
  std::int64_t checkpoint_keep = 3;
  bool checkpoint_async = false;
  std::string checkpoint_export = "";

  std::string config_file;  // where it came from ("" = defaults only)
};

struct ParsedArgs {
  Config config;
  bool help = false;
  bool print_config = false;
  bool eval_only = false;
};

// Parses argv: `--config FILE`, `--section.key=value` or `--section.key value` overrides
// (applied over the file, in order: a later one wins), `--print-config`, `--help` (-h),
// `--eval-only`. `--key=` sets the empty value. Throws lockstep::Error naming the key or file on
// an unknown or malformed argument, two --config flags, or a key given twice in the file.
ParsedArgs parse_args(int argc, const char* const* argv);
// Parses INI text (as if read from `origin`) plus "section.key=value" overrides; for tests.
Config parse_config_text(const std::string& ini, const std::vector<std::string>& overrides = {},
                         const std::string& origin = "<text>");

// The resolved config as an INI file that parse_args accepts back, every value exactly: a value
// that a bare INI value cannot hold (one with '#', ';', '"', a control character, or leading or
// trailing blanks) is written "quoted", with \" \\ \n \r \t and \xHH escapes (Note [INI values]).
std::string to_ini(const Config& config);
// The value of "section.key" in INI text (e.g. a checkpoint's recorded config), read without
// checking the other keys, so text from another lockstep version reads too; "" when absent.
std::string ini_value(const std::string& ini, const std::string& key);
// Whole numbers as lockstep's command lines and config files take them: decimal digits after an
// optional sign, read exactly (never through a double, where 2^53 + 1 becomes 2^53 and "1e30" or
// "inf" would pass for an integer) and checked against [min, max]. Errors name `what` (an option
// or a key and where it came from) and the text: "... is not an integer", "... is above the
// maximum 4096", "... is out of range (a 64-bit integer is at most ...)".
std::int64_t parse_integer(const std::string& text, std::int64_t min, std::int64_t max,
                           const std::string& what, const std::string& hint = "");
// The same over the whole unsigned 64-bit range (seeds): 0 to 18446744073709551615.
std::uint64_t parse_unsigned(const std::string& text, std::uint64_t max, const std::string& what,
                             const std::string& hint = "");

// A finite real number ("0.1", "3e-4", "-2"), checked against [min, max]; errors as above ("'nan'
// is not a finite number", "1e999 is out of range for a double", "... is below the minimum 0").
double parse_real(const std::string& text, double min, double max, const std::string& what,
                  const std::string& hint = "");

// Every key with its default and meaning.
std::string help_text();

// A map as "key=value" lines and back: the text form of what ranks compare or gather
// (check_config_agrees, the doctor) and of the checkpoint folder's lock file. A value keeps a line
// break or backslash exactly (written \n and \\); reading skips lines without '='.
std::string key_value_lines(const std::map<std::string, std::string>& values);
std::map<std::string, std::string> parse_key_value_lines(const std::string& text);
// "section.key" -> value for the settings that must agree across ranks (all but purely local
// ones such as log.rank_prefix), for the cross-rank consistency check.
std::map<std::string, std::string> rank_invariant_settings(const Config& config);

}  // namespace lockstep::train
