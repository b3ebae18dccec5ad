#include "lockstep/train/config.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <limits>
#include <map>
#include <sstream>
#include <variant>

#include "lockstep/comm/bootstrap.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/ops/context.hpp"

namespace lockstep::train {
namespace {

using Field =
    std::variant<std::string Config::*, std::int64_t Config::*, double Config::*, bool Config::*>;

struct Key {
  const char* name;  // "section.key"
  Field field;
  const char* help;
  std::vector<std::string> choices = {};  // allowed values of a string key (empty: any)
  double min = -std::numeric_limits<double>::infinity();  // inclusive lower bound of a number
  bool local = false;                                     // may differ between ranks
  // Inclusive upper bound: where the value is later cast to int or float or scaled to bytes,
  // so a huge value is refused here instead of overflowing there.
  double max = std::numeric_limits<double>::infinity();
};

const double kInf = std::numeric_limits<double>::infinity();

// Upper bounds of the keys whose value is later cast to int or float or scaled to bytes: far beyond
// any real use, and refused here with the key named instead of overflowing there.
std::vector<Key> with_limits(std::vector<Key> table) {
  const double kFloat = std::numeric_limits<float>::max();
  const std::map<std::string, double> limits = {
      {"data.memory_budget_mb", double(std::int64_t{1} << 30)},  // 1 PiB; << 20 stays in int64
      {"data.prefetch", 4096},
      {"data.decode_threads", 1024},
      {"data.pad_crop", 4096},
      {"data.rrc_scale_max", 1},
      {"train.replicas", 4096},
      {"train.threads", ops::kMaxCpuThreads},
      {"checkpoint.keep", 1 << 20},
      {"dist.bucket_mb", double(1 << 20)},  // 1 TiB; bytes fit size_t
      {"dist.first_bucket_mb", double(1 << 20)},
      {"optim.lr", kFloat},
      {"optim.momentum", kFloat},
      {"optim.weight_decay", kFloat},
      {"optim.beta1", kFloat},
      {"optim.beta2", kFloat},
      {"optim.eps", kFloat},
      {"optim.clip_norm", kFloat},
  };
  for (Key& k : table) {
    auto it = limits.find(k.name);
    if (it != limits.end()) k.max = it->second;
  }
  return table;
}

// The one table of every key. Defaults come from the Config struct's initialisers.
const std::vector<Key>& keys() {
  static const std::vector<Key> table = with_limits({
      {"data.train", &Config::data_train,
       "training shards: a folder/prefix (DIR/train -> DIR/train-*-of-*.h5), a glob, or a file"},
      {"data.test", &Config::data_test, "test shards (same forms); empty = no evaluation"},
      {"data.memory_budget_mb",
       &Config::data_memory_budget_mb,
       "load a shard set into memory when it fits this many MiB, else read chunks on demand",
       {},
       0},
      {"data.prefetch", &Config::data_prefetch, "batches the loader thread prepares ahead", {}, 1},
      {"data.decode_threads",
       &Config::data_decode_threads,
       "threads per rank that decode image shards stored as JPEG/PNG (lockstep-shard images "
       "--store=encoded); raw shards need none",
       {},
       1},
      {"data.node_shared",
       &Config::data_node_shared,
       "hold an in-memory set once per node, in shared memory that local rank 0 fills and the "
       "other local ranks map read-only: on, off, or auto (on when several ranks share a node)",
       {"auto", "on", "off"}},
      {"data.context",
       &Config::data_context,
       "token shards: tokens per training window (T); 0 = the model spec's ctx",
       {},
       0},
      {"data.random_resized_crop", &Config::data_random_resized_crop,
       "training images: crop a random area fraction (data.rrc_scale_*) and aspect ratio "
       "(data.rrc_ratio_*) and scale it back to the sample size, as torchvision's "
       "RandomResizedCrop; the same for a (seed, epoch, sample) on any rank"},
      {"data.rrc_scale_min",
       &Config::data_rrc_scale_min,
       "random-resized-crop: smallest area fraction",
       {},
       0},
      {"data.rrc_scale_max",
       &Config::data_rrc_scale_max,
       "random-resized-crop: largest area fraction",
       {},
       0},
      {"data.rrc_ratio_min",
       &Config::data_rrc_ratio_min,
       "random-resized-crop: smallest width/height",
       {},
       0},
      {"data.rrc_ratio_max",
       &Config::data_rrc_ratio_max,
       "random-resized-crop: largest width/height",
       {},
       0},
      {"data.pad_crop",
       &Config::data_pad_crop,
       "training images: pad this many black pixels on each side and cut a random window of the "
       "sample's size (CIFAR: 4); 0 = off",
       {},
       0},
      {"data.flip", &Config::data_flip, "training images: mirror left-right with probability 1/2"},
      {"model.spec", &Config::model_spec,
       "a preset (mlp:H1,H2,... | lenet | resnet[:n] | resnet18 | resnet34 | resnet50) or a layer "
       "spec such as "
       "conv(32,3)-relu-maxpool(2)-flatten-linear(10)"},
      {"model.zero_init_residual", &Config::model_zero_init_residual,
       "start every residual block (res, bottleneck) with its last BatchNorm scale 0, so it "
       "begins as relu(shortcut(x)) (torchvision's zero_init_residual; Goyal et al. 2017, helps "
       "large batches)"},
      {"model.channels_last",
       &Config::model_channels_last,
       "keep a convolutional net's activations channels-last (NHWC) between its convolution, "
       "BatchNorm, pooling, ReLU and residual layers, converting once at the input and back to "
       "NCHW before a flatten (checkpoints are the same either way): on, off, or auto (on for "
       "models with convolutions, where it measured faster; docs/IMAGES.md)",
       {"auto", "on", "off"}},
      {"train.epochs", &Config::train_epochs, "passes over the training set", {}, 1},
      {"train.global_batch",
       &Config::train_global_batch,
       "samples per optimizer step over all ranks/replicas and micro-steps; divided evenly "
       "between them",
       {},
       1},
      {"train.accumulation",
       &Config::train_accumulation,
       "micro-steps per optimizer step (gradient accumulation; only the last communicates)",
       {},
       1},
      {"train.max_steps",
       &Config::train_max_steps,
       "stop after this many optimizer steps (0 = no limit)",
       {},
       0},
      {"train.seed", &Config::train_seed, "seed of initialisation, shuffling and dropout", {}, 0},
      {"train.parallel",
       &Config::train_parallel,
       "ddp (one MPI rank per replica), dp (threads in one process), none, or auto (ddp when "
       "launched with several ranks, else none)",
       {"auto", "ddp", "dp", "none"}},
      {"train.replicas", &Config::train_replicas, "replicas (threads) of parallel = dp", {}, 1},
      {"train.threads",
       &Config::train_threads,
       "CPU threads per rank or replica (0 = the cores on this node divided by the local ranks "
       "or dp replicas)",
       {},
       0},
      {"train.device",
       &Config::train_device,
       "cpu, cuda (one GPU per local rank), auto (cuda when a GPU is visible, else cpu), or emu: "
       "the emulated GPU (asynchronous streams, device memory the host cannot read, the CPU's "
       "kernels), which runs every GPU code path on machines without one",
       {"auto", "cpu", "cuda", "emu"}},
      {"train.gpu", &Config::train_gpu,
       "which GPU a rank drives: auto (local rank among the ranks that see the same GPUs, so both "
       "mpirun and srun --gpus-per-task work), local_rank, first_visible, or a device index"},
      {"train.precision",
       &Config::train_precision,
       "GEMM and convolution arithmetic: fp32; tf32 (CUDA tensor cores; on a CPU exactly fp32); "
       "or bf16 (bf16 inputs, f32 accumulation and outputs; a CPU needs AMX or AVX512-BF16). "
       "Weights, gradients, optimizer state, loss and softmax stay f32",
       {"fp32", "tf32", "bf16"}},
      {"train.recompute",
       &Config::train_recompute,
       "activation recompute in a GPT's transformer blocks, trading compute for memory: none; "
       "gelu (the MLP's GELU output is computed again in backward); or block (only each block's "
       "input is kept, and backward runs the block's forward again first). The gradients are "
       "bitwise those of none",
       {"none", "gelu", "block"}},
      {"train.attention",
       &Config::train_attention,
       "a GPT's attention kernels: auto (cuDNN's fused flash attention where it can run: a CUDA "
       "GPU, train.precision = bf16 and a cuDNN that builds the graphs; else reference); cudnn "
       "(cuDNN's, in bf16 with f32 statistics and a deterministic backward; anywhere it cannot "
       "run, an error saying why); or reference (lockstep's own f32 kernels on every device). "
       "The choice is printed at start-up",
       {"auto", "cudnn", "reference"}},
      {"train.resume", &Config::train_resume,
       "empty (start fresh; refused when checkpoint.dir already holds checkpoints), auto (the "
       "newest checkpoint in checkpoint.dir; fresh when there is none; an error when it does not "
       "read back), fresh (start over: old checkpoints are moved to a new "
       "checkpoint.dir/replaced-<time>/), or a checkpoint file"},
      {"train.nan_policy",
       &Config::train_nan_policy,
       "on a NaN/Inf loss or gradient: stop (error naming the step) or skip the step",
       {"stop", "skip"}},
      {"train.eval", &Config::train_eval, "evaluate on data.test after every epoch"},
      {"train.eval_every_steps",
       &Config::train_eval_every_steps,
       "also evaluate on data.test every this many steps (0 = after each epoch only)",
       {},
       0},
      {"train.label_smoothing",
       &Config::train_label_smoothing,
       "label smoothing eps of the training loss, as torch.nn.CrossEntropyLoss(label_smoothing): "
       "targets (1 - eps) onehot + eps / classes; evaluation reports the plain loss",
       {},
       0,
       false,
       0.999},
      {"optim.name", &Config::optim_name, "sgd or adamw", {"sgd", "adamw"}},
      {"optim.lr", &Config::optim_lr, "peak learning rate", {}, 0},
      {"optim.momentum", &Config::optim_momentum, "SGD momentum", {}, 0},
      {"optim.nesterov", &Config::optim_nesterov, "SGD Nesterov momentum"},
      {"optim.weight_decay",
       &Config::optim_weight_decay,
       "L2 penalty (sgd) or decoupled weight decay (adamw)",
       {},
       0},
      {"optim.beta1", &Config::optim_beta1, "AdamW beta1", {}, 0},
      {"optim.beta2", &Config::optim_beta2, "AdamW beta2", {}, 0},
      {"optim.eps", &Config::optim_eps, "AdamW epsilon", {}, 0},
      {"optim.schedule",
       &Config::optim_schedule,
       "constant, step or cosine (over all steps)",
       {"constant", "step", "cosine"}},
      {"optim.warmup_steps",
       &Config::optim_warmup_steps,
       "linear warm-up from 0 over this many steps",
       {},
       0},
      {"optim.step_size",
       &Config::optim_step_size,
       "step schedule: multiply by gamma every N steps",
       {},
       1},
      {"optim.gamma", &Config::optim_gamma, "step schedule factor", {}, 0},
      {"optim.min_lr", &Config::optim_min_lr, "cosine schedule floor", {}, 0},
      {"optim.clip_norm",
       &Config::optim_clip_norm,
       "clip gradients to this global L2 norm (0 = off)",
       {},
       0},
      {"optim.decay",
       &Config::optim_decay,
       "which parameters optim.weight_decay applies to: all, or matrices (ndim >= 2: not biases "
       "or norm scales/shifts, the GPT-2/nanoGPT rule)",
       {"all", "matrices"}},
      {"dist.bucket_mb",
       &Config::dist_bucket_mb,
       "gradient bucket size in MiB (PyTorch DDP's default 25: large enough to amortise "
       "latency, small enough to overlap)",
       {},
       0},
      {"dist.first_bucket_mb",
       &Config::dist_first_bucket_mb,
       "size of the first bucket (the last layers' gradients), small so communication starts "
       "early",
       {},
       0},
      {"dist.sync", &Config::dist_sync,
       "average gradients across ranks (false only to measure the cost of communication)"},
      {"dist.timeout_s",
       &Config::dist_timeout_s,
       "seconds one collective (MPI or NCCL) may wait for its peers; then every rank prints which "
       "ranks did not arrive, at which collective and step, and the job ends (MPI_Abort)",
       {},
       0.1},
      {"dist.algorithm",
       &Config::dist_algorithm,
       "CPU gradient allreduce: flat (one MPI allreduce), hierarchical (reduce in each node's "
       "shared memory, allreduce between node leaders, copy back) or auto (flat: faster in "
       "every setting measured so far, docs/MULTINODE.md)",
       {"auto", "flat", "hierarchical"}},
      {"dist.zero",
       &Config::dist_zero,
       "ZeRO stage: 0 (every rank holds all optimizer state) or 1 (gradients reduce-scattered, "
       "each rank updates its 1/world shard and holds only its shard's optimizer state, "
       "parameters allgathered; same result as 0, docs/DISTRIBUTED.md)",
       {},
       0},
      {"dist.grad_dtype",
       &Config::dist_grad_dtype,
       "dtype gradients are averaged in across ranks: fp32, or bf16 (half the bytes; each "
       "bucket rounded to bf16, summed with f32 arithmetic rounded to bf16, widened back; "
       "parameters and optimizer state stay f32; docs/DISTRIBUTED.md)",
       {"fp32", "bf16"}},
      {"log.every",
       &Config::log_every,
       "log a progress line and a metrics record every N steps",
       {},
       1},
      {"log.metrics",
       &Config::log_metrics,
       "JSON-lines metrics file written by rank 0 (empty = none); a run that continues "
       "(train.resume = auto or a file) appends after a restart record",
       {},
       -kInf,
       true},
      {"log.tensorboard",
       &Config::log_tensorboard,
       "folder for TensorBoard event files written by rank 0 (empty = none): the metrics "
       "records' numbers as scalars (train/loss, train/lr, eval/val_loss, ...); a continued run "
       "adds a file (docs/METRICS.md)",
       {},
       -kInf,
       true},
      {"log.trace", &Config::log_trace,
       "Chrome trace (Perfetto, chrome://tracing) of the steps in log.trace_steps, every rank "
       "merged by rank 0 onto one clock: data wait, forward, backward, each bucket's readiness "
       "and allreduce, optimizer, evaluation, checkpoints (empty = none; docs/METRICS.md)"},
      {"log.trace_steps", &Config::log_trace_steps,
       "FIRST:LAST optimizer steps that log.trace records (1-based, inclusive; the default "
       "skips the first steps' warm-up)"},
      {"log.rank_prefix",
       &Config::log_rank_prefix,
       "every rank logs, lines prefixed with [rank R]",
       {},
       -kInf,
       true},
      {"log.progress",
       &Config::log_progress,
       "bar (live line with ETA), lines (plain, for Slurm logs), none, or auto (bar on a terminal)",
       {"auto", "bar", "lines", "none"},
       -kInf,
       true},
      {"checkpoint.dir", &Config::checkpoint_dir, "checkpoint folder (empty = no checkpoints)"},
      {"checkpoint.every_steps",
       &Config::checkpoint_every_steps,
       "checkpoint every N steps (0 = off)",
       {},
       0},
      {"checkpoint.every_minutes",
       &Config::checkpoint_every_minutes,
       "checkpoint every M minutes of training (0 = off)",
       {},
       0},
      {"checkpoint.keep", &Config::checkpoint_keep, "keep the newest K checkpoints", {}, 1},
      {"checkpoint.async", &Config::checkpoint_async,
       "copy the state to host memory at the step and write the file in the background while "
       "training goes on (at most one write in flight; costs one host copy of the state)"},
      {"checkpoint.export",
       &Config::checkpoint_export,
       "at the end (and with --eval-only) write the parameters to this plain HDF5 file (empty = "
       "none)",
       {},
       -kInf,
       true},
  });
  return table;
}

std::string format_value(const Config& c, const Field& field) {
  return std::visit(
      [&](auto member) -> std::string {
        const auto& v = c.*member;
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>) {
          return v ? "true" : "false";
        } else if constexpr (std::is_same_v<T, double>) {
          // Whole numbers as integers ("30", not the shortest round trip "3e+01").
          if (v == std::floor(v) && std::fabs(v) < 1e15)
            return std::to_string(static_cast<std::int64_t>(v));
          std::ostringstream out;
          out << std::setprecision(17) << v;
          // Whole numbers as such ("300", not the shortest form "3e+02").
          if (v == std::floor(v) && std::fabs(v) < 1e15)
            return std::to_string(static_cast<long long>(v));
          // Shortest form that round-trips, for readability.
          for (int p = 1; p <= 17; ++p) {
            std::ostringstream s;
            s << std::setprecision(p) << v;
            if (std::stod(s.str()) == v) return s.str();
          }
          return out.str();
        } else if constexpr (std::is_same_v<T, std::int64_t>) {
          return std::to_string(v);
        } else {
          return v;
        }
      },
      field);
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return std::tolower(ch); });
  return s;
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j)
    prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j)
      cur[j] =
          std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string suggestion(const std::string& unknown) {
  std::string best;
  std::size_t best_d = 4;
  for (const Key& k : keys()) {
    std::size_t d = edit_distance(unknown, k.name);
    if (d < best_d) best_d = d, best = k.name;
  }
  return best.empty() ? "see lockstep-train --help for every key" : "did you mean " + best + "?";
}

void set_value(Config& c, const Key& key, const std::string& raw, const std::string& origin) {
  auto bad = [&](const char* what) {
    LOCKSTEP_FAIL_HINT("see lockstep-train --help", "key ", key.name, " in ", origin, ": '", raw,
                       "' is not ", what);
  };
  std::visit(
      [&](auto member) {
        auto& v = c.*member;
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>) {
          std::string s = lower(raw);
          if (s == "true" || s == "1" || s == "yes" || s == "on")
            v = true;
          else if (s == "false" || s == "0" || s == "no" || s == "off")
            v = false;
          else
            bad("a boolean (true/false)");
        } else if constexpr (std::is_same_v<T, std::int64_t>) {
          // The table's bounds are doubles (shared with the real keys); these are whole numbers.
          constexpr auto lo = std::numeric_limits<std::int64_t>::min();
          constexpr auto hi = std::numeric_limits<std::int64_t>::max();
          v = parse_integer(raw, std::isinf(key.min) ? lo : static_cast<std::int64_t>(key.min),
                            std::isinf(key.max) ? hi : static_cast<std::int64_t>(key.max),
                            str("key ", key.name, " in ", origin), "see lockstep-train --help");
        } else if constexpr (std::is_same_v<T, double>) {
          v = parse_real(raw, key.min, key.max, str("key ", key.name, " in ", origin),
                         "see lockstep-train --help");
        } else {
          if (!key.choices.empty() &&
              std::find(key.choices.begin(), key.choices.end(), raw) == key.choices.end()) {
            std::string allowed;
            for (const auto& ch : key.choices)
              allowed += (allowed.empty() ? "" : ", ") + ch;
            LOCKSTEP_FAIL("key ", key.name, " in ", origin, ": '", raw, "' is not one of ",
                          allowed);
          }
          v = raw;
        }
      },
      key.field);
}

const Key* find_key(const std::string& name) {
  for (const Key& k : keys())
    if (name == k.name) return &k;
  return nullptr;
}

void validate(const Config& c) {
  LOCKSTEP_CHECK(!c.data_train.empty(), "key data.train is empty: name the training shards");
  LOCKSTEP_CHECK(c.data_rrc_scale_min > 0 && c.data_rrc_scale_min <= c.data_rrc_scale_max,
                 "keys data.rrc_scale_min/max must satisfy 0 < min <= max <= 1, got ",
                 c.data_rrc_scale_min, " and ", c.data_rrc_scale_max);
  LOCKSTEP_CHECK(c.data_rrc_ratio_min > 0 && c.data_rrc_ratio_min <= c.data_rrc_ratio_max,
                 "keys data.rrc_ratio_min/max must satisfy 0 < min <= max, got ",
                 c.data_rrc_ratio_min, " and ", c.data_rrc_ratio_max);
  comm::GpuChoice::parse(c.train_gpu);  // throws naming train.gpu
  if (c.optim_name == "adamw") {
    LOCKSTEP_CHECK(c.optim_beta1 < 1 && c.optim_beta2 < 1,
                   "keys optim.beta1/optim.beta2 must be < 1");
  }
  LOCKSTEP_CHECK(c.optim_momentum < 1, "key optim.momentum must be < 1, got ", c.optim_momentum);
  LOCKSTEP_CHECK(!c.optim_nesterov || c.optim_momentum > 0,
                 "key optim.nesterov = true needs optim.momentum > 0");
  // Asking for checkpoints without a place for them would train unprotected, silently.
  LOCKSTEP_CHECK_HINT(c.checkpoint_dir.empty() == false ||
                          (c.checkpoint_every_steps == 0 && c.checkpoint_every_minutes == 0),
                      "set checkpoint.dir", "key checkpoint.every_",
                      c.checkpoint_every_steps ? "steps = " : "minutes = ",
                      c.checkpoint_every_steps ? format_value(c, &Config::checkpoint_every_steps)
                                               : format_value(c, &Config::checkpoint_every_minutes),
                      " asks for checkpoints, but checkpoint.dir is empty");
  LOCKSTEP_CHECK(c.dist_zero == 0 || c.dist_zero == 1, "key dist.zero must be 0 or 1, got ",
                 c.dist_zero);
  LOCKSTEP_CHECK_HINT(c.dist_zero == 0 || c.train_parallel != "dp",
                      "use train.parallel = ddp (or auto) for ZeRO-1, or set dist.zero = 0",
                      "key dist.zero = 1 shards optimizer state across MPI ranks, but "
                      "train.parallel = dp runs one process");
  LOCKSTEP_CHECK_HINT(c.dist_zero == 0 || c.dist_sync, "set dist.sync = true, or dist.zero = 0",
                      "key dist.zero = 1 needs gradient communication, but dist.sync = false");
  LOCKSTEP_CHECK_HINT(c.dist_grad_dtype == "fp32" || c.train_parallel != "dp",
                      "use train.parallel = ddp (or auto), or set dist.grad_dtype = fp32",
                      "key dist.grad_dtype = ", c.dist_grad_dtype,
                      " sets how gradients travel between MPI ranks, but train.parallel = dp "
                      "averages its replicas' gradients in one process, in f32");
}

// Note [INI values]
// A bare value is the text after '=' up to a '#' (a comment, as in boost's INI reader, which
// lockstep used before, and in every config in this repository), blanks trimmed: right for paths
// and specs, but it cannot hold a '#', leading or trailing blanks, or a line break. So a value
// that starts with '"' is quoted: it ends at the next unescaped '"', only blanks and a comment
// may follow, and inside it \" \\ \n \r \t and \xHH (two hex digits) stand for that character;
// any other backslash, or a missing closing quote, is an error naming the line. to_ini quotes
// exactly the values a bare value would change (and those with ';', which other INI readers take
// for a comment), so --print-config reads back as the same config, whatever the values.

struct IniEntry {
  std::string name;  // "section.key"
  std::string value;
  int line;
};

std::string trim_blanks(std::string v) {
  v.erase(0, v.find_first_not_of(" \t\r"));
  v.erase(v.find_last_not_of(" \t\r") + 1);
  return v;
}

// The value of a quoted INI value starting at text[0] == '"'; on a malformed one, "" and `error`
// set to what is wrong.
std::string unquote(const std::string& text, std::string& error) {
  std::string out;
  std::size_t i = 1;
  for (; i < text.size() && text[i] != '"'; ++i) {
    if (text[i] != '\\') {
      out += text[i];
      continue;
    }
    const char e = ++i < text.size() ? text[i] : '\0';
    if (e == '"' || e == '\\') {
      out += e;
    } else if (e == 'n') {
      out += '\n';
    } else if (e == 'r') {
      out += '\r';
    } else if (e == 't') {
      out += '\t';
    } else if (e == 'x' && i + 2 < text.size() &&
               std::isxdigit(static_cast<unsigned char>(text[i + 1])) &&
               std::isxdigit(static_cast<unsigned char>(text[i + 2]))) {
      out += static_cast<char>(std::stoi(text.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      error = str("an unknown escape '\\", e == '\0' ? std::string() : std::string(1, e),
                  "' in a quoted value (known: \\\" \\\\ \\n \\r \\t \\xHH)");
      return "";
    }
  }
  if (i >= text.size()) {
    error = "a quoted value without its closing '\"'";
    return "";
  }
  const std::string rest = trim_blanks(text.substr(i + 1));
  if (!rest.empty() && rest.front() != '#') {
    error = str("text after the closing '\"' of a quoted value: '", rest, "'");
    return "";
  }
  return out;
}

// The "key = value" entries of INI text in order ([section] headers make "section.key"; blank and
// '#' lines are skipped; values per Note [INI values]). A line that is none of these, or a
// malformed quoted value, throws naming `origin` and the line when `strict`; else it is skipped
// (ini_value reads text from other lockstep versions).
std::vector<IniEntry> read_ini(const std::string& text, const std::string& origin, bool strict) {
  std::vector<IniEntry> out;
  std::istringstream in(text);
  std::string section;
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    const std::string shown = line.size() > 80 ? line.substr(0, 80) + "..." : line;
    auto malformed = [&](const std::string& what) {
      LOCKSTEP_CHECK_HINT(!strict,
                          "write key = value, [section] or # comment; a value that holds '#' or "
                          "blanks at its ends is written \"quoted\", with \\\" \\\\ \\n \\t "
                          "\\xHH escapes",
                          "cannot parse ", origin, ": line ", number, " ", what, ": '", shown, "'");
    };
    const std::string head = trim_blanks(line.substr(0, line.find('#')));
    if (head.empty()) continue;
    if (head.front() == '[') {
      if (head.back() == ']')
        section = trim_blanks(head.substr(1, head.size() - 2));
      else
        malformed("is not a [section] header");
      continue;
    }
    const auto eq = head.find('=');
    const std::string key = eq == std::string::npos ? "" : trim_blanks(head.substr(0, eq));
    if (key.empty()) {
      malformed("is not key = value");
      continue;
    }
    // The value from the full line: a quoted one may hold '#'.
    std::string value = trim_blanks(line.substr(line.find('=') + 1));
    if (!value.empty() && value.front() == '"') {
      std::string error;
      value = unquote(value, error);
      if (!error.empty()) {
        malformed("has " + error);
        continue;
      }
    } else {
      value = trim_blanks(value.substr(0, value.find('#')));
    }
    out.push_back({(section.empty() ? "" : section + ".") + key, value, number});
  }
  return out;
}

// Applies INI text to c. A key given twice in one file is an error naming both lines: which one
// should win is not obvious to a reader of the file, and taking either silently hides a mistake.
void apply_ini(Config& c, const std::string& text, const std::string& origin) {
  const std::vector<IniEntry> entries = read_ini(text, origin, /*strict=*/true);
  std::map<std::string, int> first_line;
  for (const IniEntry& e : entries) {
    auto [it, inserted] = first_line.emplace(e.name, e.line);
    LOCKSTEP_CHECK_HINT(inserted, "keep one of the two lines", "key ", e.name,
                        " is given twice in ", origin, ": on line ", it->second, " and on line ",
                        e.line);
  }
  for (const IniEntry& e : entries) {
    const Key* key = find_key(e.name);
    LOCKSTEP_CHECK_HINT(key != nullptr, suggestion(e.name), "unknown key '", e.name, "' in ",
                        origin);
    set_value(c, *key, e.value, origin);
  }
}

// A value as to_ini writes it: bare when a bare value reads back as itself, else quoted.
std::string ini_quote(const std::string& v) {
  auto special = [](unsigned char ch) {
    return ch == '#' || ch == ';' || ch == '"' || ch < 0x20 || ch == 0x7f;
  };
  const bool bare = std::none_of(v.begin(), v.end(), special) &&
                    (v.empty() || (v.front() != ' ' && v.back() != ' '));
  if (bare) return v;
  std::string out = "\"";
  for (unsigned char ch : v) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += static_cast<char>(ch);
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\r') {
      out += "\\r";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (ch < 0x20 || ch == 0x7f) {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", ch);
      out += hex;
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out + "\"";
}

// One reader for both signed and unsigned integers: from_chars reads exactly, never through a
// double, and takes no blanks, no "0x", no exponent and no fraction.
template <class T>
T parse_whole(const std::string& text, T min, T max, const std::string& what,
              const std::string& hint) {
  const char* first = text.data();
  const char* last = first + text.size();
  const bool negative = first != last && *first == '-';
  if (first != last && *first == '+' && last - first > 1 && *(first + 1) != '-') ++first;
  T v{};
  auto [end, ec] = std::from_chars(first, last, v);
  const bool digits_only =
      last - first > negative &&
      std::all_of(first + negative, last, [](char ch) { return ch >= '0' && ch <= '9'; });
  if (std::is_unsigned_v<T> && negative && digits_only)  // from_chars refuses "-5" for unsigned
    LOCKSTEP_FAIL_HINT(hint, what, ": ", text, " is below the minimum ", min);
  if (ec == std::errc::result_out_of_range) {
    if (negative && min != std::numeric_limits<T>::min())
      LOCKSTEP_FAIL_HINT(hint, what, ": ", text, " is below the minimum ", min);
    if (!negative && max != std::numeric_limits<T>::max())
      LOCKSTEP_FAIL_HINT(hint, what, ": ", text, " is above the maximum ", max);
    LOCKSTEP_FAIL_HINT(
        hint, what, ": ", text, " is out of range (a 64-bit ",
        std::is_unsigned_v<T> ? "unsigned " : "", "integer is at ", negative ? "least " : "most ",
        negative ? std::numeric_limits<T>::min() : std::numeric_limits<T>::max(), ")");
  }
  if (ec != std::errc() || end != last)
    LOCKSTEP_FAIL_HINT(hint, what, ": '", text, "' is not an integer");
  if (v < min) LOCKSTEP_FAIL_HINT(hint, what, ": ", text, " is below the minimum ", min);
  if (v > max) LOCKSTEP_FAIL_HINT(hint, what, ": ", text, " is above the maximum ", max);
  return v;
}

}  // namespace

std::int64_t parse_integer(const std::string& text, std::int64_t min, std::int64_t max,
                           const std::string& what, const std::string& hint) {
  return parse_whole<std::int64_t>(text, min, max, what, hint);
}

std::uint64_t parse_unsigned(const std::string& text, std::uint64_t max, const std::string& what,
                             const std::string& hint) {
  return parse_whole<std::uint64_t>(text, 0, max, what, hint);
}

double parse_real(const std::string& text, double min, double max, const std::string& what,
                  const std::string& hint) {
  const char* first = text.data();
  const char* last = first + text.size();
  if (first != last && *first == '+' && last - first > 1 && *(first + 1) != '-') ++first;
  double v = 0;
  auto [end, ec] = std::from_chars(first, last, v);
  if (ec == std::errc::result_out_of_range)
    LOCKSTEP_FAIL_HINT(hint, what, ": ", text, " is out of range for a double");
  if (ec != std::errc() || end != last)
    LOCKSTEP_FAIL_HINT(hint, what, ": '", text, "' is not a number");
  if (!std::isfinite(v)) LOCKSTEP_FAIL_HINT(hint, what, ": '", text, "' is not a finite number");
  if (v < min) LOCKSTEP_FAIL_HINT(hint, what, ": ", text, " is below the minimum ", min);
  if (v > max) LOCKSTEP_FAIL_HINT(hint, what, ": ", text, " is above the maximum ", max);
  return v;
}

Config parse_config_text(const std::string& ini, const std::vector<std::string>& overrides,
                         const std::string& origin) {
  Config c;
  apply_ini(c, ini, origin);
  for (const std::string& o : overrides) {
    auto eq = o.find('=');
    LOCKSTEP_CHECK(eq != std::string::npos, "override '", o, "' is not section.key=value");
    std::string name = o.substr(0, eq);
    const Key* key = find_key(name);
    LOCKSTEP_CHECK_HINT(key != nullptr, suggestion(name), "unknown key '", name,
                        "' on the command line");
    set_value(c, *key, o.substr(eq + 1), "the command line");
  }
  validate(c);
  return c;
}

ParsedArgs parse_args(int argc, const char* const* argv) {
  // Parsed by hand rather than with boost: "--data.test=" must set the empty value, and boost
  // refuses an empty value after '='. Forms: --flag, --name=value, --name value.
  const char* hint = "see lockstep-train --help";
  ParsedArgs out;
  std::string config_path;
  bool config_given = false;
  std::vector<std::pair<const Key*, std::string>> overrides;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h") {
      out.help = true;
      continue;
    }
    LOCKSTEP_CHECK_HINT(arg.rfind("--", 0) == 0 && arg.size() > 2,
                        arg.find(".ini") != std::string::npos ? "pass the file as --config " + arg
                                                              : std::string(hint),
                        "unexpected argument '", arg, "' on the command line");
    const auto eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    const bool is_flag = name == "help" || name == "print-config" || name == "eval-only";
    if (is_flag) {
      LOCKSTEP_CHECK_HINT(eq == std::string::npos, hint, "--", name, " takes no value");
      out.help = out.help || name == "help";
      out.print_config = out.print_config || name == "print-config";
      out.eval_only = out.eval_only || name == "eval-only";
      continue;
    }
    const Key* key = find_key(name);
    LOCKSTEP_CHECK_HINT(key != nullptr || name == "config", suggestion(name), "unknown option '--",
                        name, "' on the command line");
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else {
      // "--name value": the value may be empty but may not look like the next option.
      LOCKSTEP_CHECK_HINT(i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0,
                          str("write --", name, "=VALUE (--", name, "= for the empty value)"),
                          "option --", name, " needs a value");
      value = argv[++i];
    }
    if (name == "config") {
      LOCKSTEP_CHECK_HINT(!config_given,
                          "give one --config; put the differences of the second in overrides",
                          "two --config flags (", config_path, " and ", value,
                          "): lockstep-train reads one config file");
      config_given = true;
      config_path = value;
      continue;
    }
    overrides.emplace_back(key, value);
  }
  if (out.help) return out;
  if (config_given) {
    const char* example = "pass an existing INI file, e.g. --config configs/fashion_mlp.ini";
    std::error_code ec;
    LOCKSTEP_CHECK_HINT(!config_path.empty(), example, "--config needs a file name");
    LOCKSTEP_CHECK_HINT(!std::filesystem::is_directory(config_path, ec), example, "config file '",
                        config_path, "' is a folder");
    LOCKSTEP_CHECK_HINT(std::filesystem::is_regular_file(config_path, ec), example, "config file '",
                        config_path, "' does not exist");
    errno = 0;
    std::ifstream in(config_path);
    LOCKSTEP_CHECK(in.good(), "cannot read config file '", config_path, "'",
                   errno ? str(": ", std::strerror(errno)) : std::string());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    apply_ini(out.config, text, config_path);
    out.config.config_file = config_path;
  }
  for (const auto& [key, value] : overrides)  // overrides win over the file
    set_value(out.config, *key, value, "the command line");
  validate(out.config);
  return out;
}

std::string to_ini(const Config& c) {
  std::ostringstream out;
  out << "# resolved lockstep config"
      << (c.config_file.empty() ? "" : " (from " + ini_quote(c.config_file) + ")") << "\n";
  std::string section;
  for (const Key& k : keys()) {
    std::string name = k.name;
    std::string sec = name.substr(0, name.find('.'));
    if (sec != section) {
      out << "\n[" << sec << "]\n";
      section = sec;
    }
    out << name.substr(name.find('.') + 1) << " = " << ini_quote(format_value(c, k.field)) << "\n";
  }
  return out.str();
}

std::string help_text() {
  std::ostringstream out;
  Config defaults;
  out << "usage: lockstep-train --config FILE.ini [--section.key=value ...] [--print-config] "
         "[--eval-only]\n\n"
         "Keys (INI [section] key = value, or --section.key=value). The command line wins over\n"
         "the file, and a later --key over an earlier one (so a wrapper script can set defaults\n"
         "that its caller's arguments override). A key given twice in one file, or two\n"
         "--config flags, is an error. --key= sets the empty value. In the file a value with\n"
         "'#', blanks at its ends or a line break goes in double quotes, with \\\" \\\\ \\n \\r "
         "\\t\n"
         "and \\xHH escapes (train = \"runs/take#2/train\"); --print-config writes them so.\n";
  for (const Key& k : keys()) {
    std::string def = format_value(defaults, k.field);
    out << "  " << std::left << std::setw(26) << k.name
        << " default: " << (def.empty() ? "\"\"" : def) << "\n      " << k.help << "\n";
  }
  return out.str();
}

std::string ini_value(const std::string& ini, const std::string& key) {
  std::string value;
  for (const IniEntry& e : read_ini(ini, "", /*strict=*/false))
    if (e.name == key) value = e.value;
  return value;
}

std::map<std::string, std::string> rank_invariant_settings(const Config& c) {
  std::map<std::string, std::string> out;
  for (const Key& k : keys())
    if (!k.local) out[k.name] = format_value(c, k.field);
  return out;
}

std::string key_value_lines(const std::map<std::string, std::string>& values) {
  std::string out;
  for (const auto& [key, value] : values) {
    out += key + '=';
    for (char ch : value)
      out += ch == '\n'   ? std::string("\\n")
             : ch == '\\' ? std::string("\\\\")
                          : std::string(1, ch);
    out += '\n';
  }
  return out;
}

std::map<std::string, std::string> parse_key_value_lines(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string value;
    for (std::size_t i = eq + 1; i < line.size(); ++i) {
      if (line[i] == '\\' && i + 1 < line.size()) {
        ++i;
        value += line[i] == 'n' ? '\n' : line[i];
      } else {
        value += line[i];
      }
    }
    out[line.substr(0, eq)] = std::move(value);
  }
  return out;
}

}  // namespace lockstep::train
