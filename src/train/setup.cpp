#include "lockstep/train/setup.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>

#include <sched.h>

#include <map>
#include <thread>

#include "lockstep/comm/bootstrap.hpp"
#include "lockstep/comm/gpu_select.hpp"
#include "lockstep/comm/node_shared.hpp"
#include "lockstep/comm/transport.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/core/rng.hpp"
#include "lockstep/data/sampler.hpp"
#include "lockstep/nn/residual.hpp"
#include "lockstep/nn/transformer.hpp"
#include "lockstep/optim/adamw.hpp"
#include "lockstep/optim/sgd.hpp"
#include "lockstep/parallel/data_parallel.hpp"
#include "lockstep/train/checkpoint_lock.hpp"
#include "lockstep/train/run_files.hpp"
#include "lockstep/train/token_data.hpp"

namespace lockstep::train {
namespace {

std::unique_ptr<optim::Optimizer> make_optimizer(const Config& c,
                                                 std::shared_ptr<optim::FlatParams> params,
                                                 optim::FlatShard shard) {
  if (c.optim_name == "adamw") {
    optim::AdamWOptions o;
    o.lr = static_cast<float>(c.optim_lr);
    o.beta1 = static_cast<float>(c.optim_beta1);
    o.beta2 = static_cast<float>(c.optim_beta2);
    o.eps = static_cast<float>(c.optim_eps);
    o.weight_decay = static_cast<float>(c.optim_weight_decay);
    o.decay = optim::parse_decay_scope(c.optim_decay);
    return std::make_unique<optim::AdamW>(std::move(params), o, std::move(shard));
  }
  optim::SgdOptions o;
  o.lr = static_cast<float>(c.optim_lr);
  o.momentum = static_cast<float>(c.optim_momentum);
  o.nesterov = c.optim_nesterov;
  o.weight_decay = static_cast<float>(c.optim_weight_decay);
  o.decay = optim::parse_decay_scope(c.optim_decay);
  return std::make_unique<optim::Sgd>(std::move(params), o, std::move(shard));
}

std::unique_ptr<optim::LrSchedule> make_schedule(const Config& c, std::int64_t total_steps) {
  LOCKSTEP_CHECK_HINT(c.optim_schedule != "cosine" || c.optim_warmup_steps < total_steps,
                      "lower optim.warmup_steps or train more steps",
                      "optim.warmup_steps = ", c.optim_warmup_steps, " but the run has only ",
                      total_steps, " steps for its cosine schedule");
  optim::ScheduleOptions o;
  o.kind = c.optim_schedule;
  o.base_lr = c.optim_lr;
  o.warmup_steps = c.optim_warmup_steps;
  o.step_size = c.optim_step_size;
  o.gamma = c.optim_gamma;
  o.min_lr = c.optim_min_lr;
  o.total_steps = total_steps;
  return optim::make_schedule(o);
}

Device choose_device(const Config& config, comm::Communicator& comm, const std::string& parallel) {
  if (config.train_device == "cpu" || (config.train_device == "auto" && !cuda_available()))
    return Device::cpu();
  if (config.train_device == "emu") {
    LOCKSTEP_CHECK_HINT(emu_available(),
                        "set train.device = cpu, or rebuild with -DLOCKSTEP_EMU=ON (the default)",
                        "train.device = emu but this build has no emulated device");
    // As GPUs: DataParallel's master takes emu:0 and its replicas the next; under DDP each rank
    // of a node takes its own (the local rank), as train.gpu = local_rank would.
    if (parallel == "dp") return Device::emu(0);
    const int n = emu_device_count();
    LOCKSTEP_CHECK_HINT(comm.local_rank() < n, "set LOCKSTEP_EMU_DEVICES to the ranks per node",
                        "train.device = emu: rank ", comm.rank(), " is local rank ",
                        comm.local_rank(), " but this process has ", n, " emulated devices");
    return Device::emu(comm.local_rank());
  }
  LOCKSTEP_CHECK_HINT(cuda_available(), "set train.device = cpu, or run where a GPU is visible",
                      "train.device = cuda but no GPU is available to rank ", comm.rank(),
                      " on host ", comm::this_host());
  // One GPU per rank (DDP; train.gpu says which); DataParallel's master takes GPU 0 and its
  // replicas the next.
  if (parallel == "dp") return Device::cuda(0);
  return comm::select_gpu(comm, config.train_gpu);
}

// data.node_shared: auto shares when several ranks of this job run on this node. Sharing needs
// the MPI communicator (an in-process run has no node to share with).
bool node_shared(const Config& config, comm::Communicator& control) {
  if (config.data_node_shared == "off") return false;
  const bool mpi = control.backend() == "mpi";
  if (config.data_node_shared == "auto") return mpi && control.local_size() > 1;
  LOCKSTEP_CHECK_HINT(mpi, "set data.node_shared = auto or off", "data.node_shared = on needs an ",
                      "MPI launch, but this run's communicator is ", control.backend());
  return true;
}

// The in-memory samples of a set, once per node: local rank 0 reads them into shared memory,
// the other local ranks map it read-only (comm/node_shared.hpp).
data::ResidentAllocator node_shared_allocator(comm::Communicator& control, const std::string& key) {
  return [&control, key](std::int64_t bytes, const std::string& what) {
    comm::NodeSharedBlock b = comm::allocate_node_shared(
        control, bytes, str(key, " (", what, ")"),
        "set data.node_shared = off (each rank holds its own copy) or lower "
        "data.memory_budget_mb (read on demand)");
    return data::ResidentBlock{b.data, b.writer, b.published, b.mapping};
  };
}

std::shared_ptr<data::ShardedDataset> open_set(const std::string& key, const std::string& spec,
                                               std::int64_t budget_mb,
                                               const data::ResidentAllocator& allocator = {}) {
  try {
    return data::ShardedDataset::open(spec, budget_mb << 20, allocator);
  } catch (const Error& e) {
    // The data layer names the files; say which key pointed there.
    rethrow_with_context(e.message().rfind(spec, 0) == 0 ? key : key + " = " + spec);
  }
}

std::unique_ptr<parallel::Engine> make_engine(Run& run, const Config& config) {
  if (run.parallel == "dp") {
    parallel::DataParallelOptions dp;
    dp.replicas = run.replicas;
    dp.threads_per_replica = run.threads;
    dp.input = run.norm;
    dp.label_smoothing = static_cast<float>(config.train_label_smoothing);
    if (run.ctx->device().is_cuda()) {
      LOCKSTEP_CHECK(cuda_device_count() >= run.replicas, "train.replicas = ", run.replicas,
                     " but only ", cuda_device_count(), " GPUs are visible");
      for (int r = 0; r < run.replicas; ++r)
        dp.devices.push_back(Device::cuda(r));
    }
    if (run.ctx->device().is_emu()) {
      LOCKSTEP_CHECK_HINT(emu_device_count() >= run.replicas,
                          "set LOCKSTEP_EMU_DEVICES to at least train.replicas",
                          "train.replicas = ", run.replicas, " with train.device = emu but this ",
                          "process has ", emu_device_count(), " emulated devices");
      for (int r = 0; r < run.replicas; ++r)
        dp.devices.push_back(Device::emu(r));
    }
    return std::make_unique<parallel::DataParallelEngine>(*run.ctx, *run.model, dp, run.flat);
  }
  parallel::DdpOptions ddp;
  ddp.reducer.bucket_bytes = static_cast<std::size_t>(config.dist_bucket_mb * (1 << 20));
  ddp.reducer.first_bucket_bytes =
      static_cast<std::size_t>(config.dist_first_bucket_mb * (1 << 20));
  ddp.sync = config.dist_sync;
  ddp.input = run.norm;
  ddp.label_smoothing = static_cast<float>(config.train_label_smoothing);
  ddp.zero = config.dist_zero == 1;
  ddp.reducer.grad_dtype = parallel::parse_grad_dtype(config.dist_grad_dtype, "dist.grad_dtype");
  return std::make_unique<parallel::DdpEngine>(*run.ctx, *run.model, *run.gradient_comm, ddp,
                                               run.flat);
}

// train.attention: every attention layer gets the kernel asked for, and what that resolves to on
// this device and precision for the training micro-batch [batch, t] is decided here, before any
// work: cudnn where cuDNN cannot run is an error naming the key and the reason. Auto stays Auto
// in the layers (the ops resolve it per shape, so an evaluation batch of another size is served
// too); the choice for the training shape is what the trainer prints.
void set_attention(Run& r, const Config& config, std::int64_t batch, std::int64_t t) {
  const std::vector<nn::CausalSelfAttention*> layers = nn::attention_layers(*r.model);
  LOCKSTEP_CHECK_HINT(!layers.empty() || config.train_attention != "cudnn",
                      "set train.attention = auto (or reference), or use a GPT spec",
                      "train.attention = cudnn but model.spec = ", config.model_spec,
                      " has no attention layer");
  if (layers.empty()) return;
  const ops::AttentionKernel requested = ops::attention_kernel_from_name(config.train_attention);
  for (nn::CausalSelfAttention* layer : layers)
    layer->set_kernel(requested);
  const nn::CausalSelfAttention& a = *layers.front();
  const ops::AttentionChoice choice = [&] {
    try {
      return ops::choose_attention(*r.ctx, requested, batch, t, a.heads(), a.dim() / a.heads());
    } catch (const Error& e) {
      LOCKSTEP_FAIL_HINT(
          "set train.attention = auto (cuDNN where it can run, else lockstep's kernels) or "
          "reference",
          "train.attention = ", config.train_attention, ": ", e.message());
    }
  }();
  r.attention_kernel = ops::attention_kernel_name(choice.kernel);
  r.attention = str(r.attention_kernel, " (",
                    requested == ops::AttentionKernel::Auto ? "auto: " : "", choice.detail, ")");
}

}  // namespace

StepPlan plan_steps(const Config& c, int world, std::int64_t samples_per_rank,
                    std::int64_t dataset_size) {
  StepPlan p;
  p.global_batch = c.train_global_batch;
  p.accumulation = c.train_accumulation;
  std::int64_t split = 0;
  LOCKSTEP_CHECK_HINT(!__builtin_mul_overflow(std::int64_t{world}, p.accumulation, &split) &&
                          p.global_batch % split == 0,
                      "choose train.global_batch as a multiple of ranks x train.accumulation",
                      "train.global_batch = ", p.global_batch, " does not divide into ", world,
                      " ranks x ", p.accumulation, " micro-steps");
  p.local_batch = p.global_batch / split;
  const std::int64_t loader_batches = samples_per_rank / p.local_batch;
  p.steps_per_epoch = loader_batches / p.accumulation;
  LOCKSTEP_CHECK_HINT(p.steps_per_epoch > 0, "lower train.global_batch or add data",
                      "the training set (", dataset_size, " samples) is smaller than one step of ",
                      p.global_batch, " samples");
  std::int64_t total = 0;
  if (__builtin_mul_overflow(p.steps_per_epoch, c.train_epochs, &total)) {
    // Huge epoch counts are fine as long as max_steps ends the run.
    LOCKSTEP_CHECK_HINT(c.train_max_steps > 0, "set train.max_steps, or fewer train.epochs",
                        "train.epochs = ", c.train_epochs, " x ", p.steps_per_epoch,
                        " steps per epoch is more steps than a 64-bit counter holds");
    total = c.train_max_steps;
  }
  p.total_steps = c.train_max_steps > 0 ? std::min(total, c.train_max_steps) : total;
  return p;
}

void Run::line(const std::string& text) const {
  if (logs && progress) progress->line(text);
}

std::shared_ptr<const data::Dataset> Run::train_data() const {
  if (train_tokens) return train_tokens;
  return train_set;
}

const data::Dataset* Run::test_data() const {
  if (test_tokens) return test_tokens.get();
  return test_set.get();
}

void check_config_agrees(comm::Communicator& comm, const Config& config) {
  std::vector<std::string> all = comm.allgather(key_value_lines(rank_invariant_settings(config)));
  auto reference = parse_key_value_lines(all[0]);
  for (std::size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    auto other = parse_key_value_lines(all[r]);
    std::string diff;
    for (const auto& [key, value] : reference) {
      if (other[key] == value) continue;
      if (!diff.empty()) diff += "; ";
      diff += key + ": rank 0 has '" + value + "', rank " + std::to_string(r) + " has '" +
              other[key] + "'";
    }
    LOCKSTEP_FAIL_HINT("every rank must read the same config file and overrides",
                       "config differs between ranks: ", diff);
  }
}

int resolve_threads(const Config& config, int local_ranks, int replicas) {
  if (config.train_threads > 0) return static_cast<int>(config.train_threads);
  int node_cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int cores = node_cores / std::max(1, local_ranks);
  // A launcher that bound this rank to some cores (srun --cpus-per-task, mpirun --bind-to,
  // taskset) already did the division between ranks: use exactly the cores it gave us.
  cpu_set_t mask;
  if (sched_getaffinity(0, sizeof mask, &mask) == 0) {
    int allowed = CPU_COUNT(&mask);
    if (allowed > 0 && allowed < node_cores) cores = allowed;
  }
  return std::max(1, cores / std::max(1, replicas));
}

std::string resolve_parallel(const Config& config, int world_size) {
  if (config.train_parallel != "auto") return config.train_parallel;
  return world_size > 1 ? "ddp" : "none";
}

std::unique_ptr<Run> setup_run(const Config& config, comm::Communicator& control,
                               const SetupOptions& options) {
  auto run = std::make_unique<Run>(config, control);
  Run& r = *run;
  r.rank = control.rank();
  r.world = control.size();
  r.parallel = resolve_parallel(config, r.world);
  LOCKSTEP_CHECK_HINT(r.parallel != "dp" || r.world == 1,
                      "launch parallel = dp as one process (it uses threads), or use ddp",
                      "train.parallel = dp runs in one process, but this job has ", r.world,
                      " ranks");
  LOCKSTEP_CHECK_HINT(r.parallel != "none" || r.world == 1, "set train.parallel = ddp (or auto)",
                      "train.parallel = none with ", r.world, " ranks would train ", r.world,
                      " unrelated models");
  LOCKSTEP_CHECK_HINT(!options.eval_only || !config.train_resume.empty(),
                      "name the model to evaluate: --train.resume=FILE (or auto with "
                      "checkpoint.dir)",
                      "--eval-only needs a checkpoint, but train.resume is empty: it would "
                      "evaluate an untrained model");
  LOCKSTEP_CHECK_HINT(!options.eval_only || config.train_resume != "fresh",
                      "name the model to evaluate: --train.resume=FILE or auto",
                      "--eval-only with train.resume = fresh has no model to evaluate");
  LOCKSTEP_CHECK_HINT(!options.eval_only || !config.data_test.empty(), "set data.test",
                      "--eval-only needs data.test");
  check_config_agrees(control, config);

  r.logs = r.rank == 0 || config.log_rank_prefix;
  r.prefix = config.log_rank_prefix ? "[rank " + std::to_string(r.rank) + "] " : "";
  r.replicas = r.parallel == "dp" ? static_cast<int>(config.train_replicas) : 1;
  r.threads = resolve_threads(config, control.local_size(), r.replicas);
  // Outputs first, so that a bad one fails before any work: none may name an input (checked
  // before anything is opened), each must be writable (the metrics file is opened without
  // truncating it: whether it is continued is known after the resume), and checkpoint.dir is
  // locked before any file in it is touched. Lock messages wait for the progress display.
  check_outputs_are_not_inputs(config, control, options.eval_only);
  auto open_metrics = [&](MetricsFile::Mode mode) {
    if (r.rank != 0 || config.log_metrics.empty()) return;
    try {
      r.metrics = MetricsFile(config.log_metrics, mode);
    } catch (const Error&) {
      rethrow_with_context("log.metrics = " + config.log_metrics);
    }
  };
  open_metrics(MetricsFile::Mode::Append);
  std::vector<std::string> lock_notes;
  if (!options.eval_only && !config.checkpoint_dir.empty()) {
    on_rank0(control, [&]() -> std::string {
      r.checkpoint_lock = std::make_unique<CheckpointLock>(
          config.checkpoint_dir, [&](const std::string& note) { lock_notes.push_back(note); });
      return "";
    });
  }
  check_outputs_writable(config, control, /*writes_checkpoints=*/!options.eval_only);
  r.ctx = std::make_unique<ops::Context>(choose_device(config, control, r.parallel), r.threads);
  r.ctx->set_precision(ops::precision_from_name(config.train_precision));
  const Device device = r.ctx->device();

  const bool tokens = uses_token_data(config);  // token shards: a language model
  if (tokens) open_token_sets(r, config, options);
  const bool shared = !tokens && node_shared(config, control);
  if (!tokens)
    r.train_set =
        open_set("data.train", config.data_train, config.data_memory_budget_mb,
                 shared ? node_shared_allocator(control, "data.train") : data::ResidentAllocator{});
  if (!tokens && !config.data_test.empty() && (config.train_eval || options.eval_only))
    r.test_set =
        open_set("data.test", config.data_test, config.data_memory_budget_mb,
                 shared ? node_shared_allocator(control, "data.test") : data::ResidentAllocator{});
  if (r.test_set) {
    LOCKSTEP_CHECK_HINT(
        r.test_set->sample_shape() == r.train_set->sample_shape() &&
            r.test_set->num_classes() == r.train_set->num_classes(),
        "make train and test shards from the same source with lockstep-shard", "test set ",
        config.data_test, " has samples ", shape_str(r.test_set->sample_shape()), " and ",
        r.test_set->num_classes(), " classes, but the training set ", config.data_train, " has ",
        shape_str(r.train_set->sample_shape()), " and ", r.train_set->num_classes());
  }
  // Token windows are [T] i32 samples whose classes are the vocabulary.
  const Shape input_shape = tokens ? Shape{r.train_tokens->context()} : r.train_set->sample_shape();
  const std::int64_t classes = tokens ? r.train_tokens->vocab_size() : r.train_set->num_classes();
  r.model = std::make_unique<nn::Model>(
      nn::Model::build(config.model_spec, input_shape, classes,
                       static_cast<std::uint64_t>(config.train_seed), device));
  if (config.model_zero_init_residual) {
    LOCKSTEP_CHECK_HINT(nn::zero_init_residual(*r.model) > 0,
                        "set model.zero_init_residual = false, or use a ResNet spec",
                        "model.zero_init_residual = true but model.spec = ", config.model_spec,
                        " has no residual blocks (res or bottleneck)");
  }
  const nn::ChannelsLast channels_last = nn::channels_last_from_name(config.model_channels_last);
  const std::int64_t nhwc_layers =
      r.model->set_channels_last(nn::resolve_channels_last(channels_last, *r.model, *r.ctx));
  LOCKSTEP_CHECK_HINT(channels_last != nn::ChannelsLast::On || nhwc_layers > 0,
                      "set model.channels_last = auto or off, or use a conv net on images",
                      "model.channels_last = on but model.spec = ", config.model_spec,
                      " has no layer that can run channels-last on its input ",
                      shape_str(input_shape));
  if (config.train_recompute != "none") {
    LOCKSTEP_CHECK_HINT(
        nn::set_recompute(*r.model, nn::recompute_from_name(config.train_recompute)) > 0,
        "set train.recompute = none, or use a GPT spec (gpt-tiny, gpt2-124m, ...)",
        "train.recompute = ", config.train_recompute, " but model.spec = ", config.model_spec,
        " has no transformer block to recompute");
  }
  if (tokens) check_token_model(r);
  comm::check_same_on_all_ranks(control, "model structure", r.model->structure());
  comm::check_same_on_all_ranks(control, "training data",
                                str(r.train_data()->size(), " samples of ", shape_str(input_shape),
                                    ", ", classes, " classes"));

  if (!tokens) r.norm = {r.train_set->mean(), r.train_set->stddev()};
  data::DistributedSampler sampler(r.train_data()->size(), r.world, r.rank, /*shuffle=*/true,
                                   static_cast<std::uint64_t>(config.train_seed),
                                   /*drop_last=*/false);
  r.plan = plan_steps(config, r.world, sampler.num_samples(), r.train_data()->size());
  // A model with attention is a GPT, whose samples are token windows [T].
  set_attention(r, config, r.plan.local_batch, input_shape.empty() ? 0 : input_shape[0]);
  if (!r.attention_kernel.empty())
    comm::check_same_on_all_ranks(control, "attention kernel (train.attention)",
                                  r.attention_kernel);
  // Values, gradients and optimizer state in one flat layout, bucketed as DDP communicates it
  // (ZeRO-1: in buckets that split into world-size shards, and state for this rank's only).
  const int shards = config.dist_zero == 1 ? r.world : 1;
  r.flat = std::make_shared<optim::FlatParams>(
      r.model->parameters(),
      optim::BucketLimits{static_cast<std::size_t>(config.dist_bucket_mb * (1 << 20)),
                          static_cast<std::size_t>(config.dist_first_bucket_mb * (1 << 20)),
                          shards});
  r.optimizer = make_optimizer(config, r.flat, r.flat->shard(shards > 1 ? r.rank : 0, shards));
  if (config.dist_zero == 1 && r.world == 1)
    r.line("warning: dist.zero = 1 with one rank has nothing to shard: it trains as dist.zero = 0");
  // Dropout masks differ between ranks (as with one RNG per process in PyTorch).
  r.model->set_dropout_seed(hash_combine(static_cast<std::uint64_t>(config.train_seed),
                                         static_cast<std::uint64_t>(r.rank)));
  r.progress = std::make_unique<Progress>(
      r.logs ? parse_progress_mode(config.log_progress) : ProgressMode::None, r.plan.total_steps,
      r.prefix);
  for (const std::string& note : lock_notes)
    r.line(note);

  // ---- the state: fresh, or from the checkpoint rank 0 chose (every rank reads it: a shared
  // file system is assumed, as for the shards; the DDP engine's broadcast then makes the replicas
  // identical anyway).
  RunLayout layout;
  layout.world_size = r.world;
  layout.rank = r.rank;
  layout.samples_per_loader_batch = r.plan.local_batch * r.world;
  layout.accumulation = r.plan.accumulation;
  layout.parallel = r.parallel;
  layout.config_ini = to_ini(config);
  layout.attrs = token_attributes(r);
  r.state = std::make_unique<TrainState>(*r.model, *r.optimizer, layout);
  r.resumed_from = choose_resume(
      config, control, [&](const std::string& w) { r.line("warning: " + w); }, !options.eval_only);
  if (!r.resumed_from.empty()) {
    const CheckpointState checkpoint = read_checkpoint(r.resumed_from);
    r.state->restore(*r.ctx, checkpoint, r.resumed_from);
    r.line(str("resumed from ", r.resumed_from, " at step ", r.state->step, " (epoch ",
               r.state->position.epoch, ", batch ", r.state->position.batch_in_epoch,
               ", written by ", checkpoint.world_size, " rank(s))"));
  } else if (config.train_resume == "auto") {
    r.line(str("no checkpoint in ", config.checkpoint_dir, ": starting fresh"));
  }
  LOCKSTEP_CHECK_HINT(
      !options.eval_only || !r.resumed_from.empty(),
      "train first, or name a checkpoint with --train.resume=FILE",
      "--eval-only found no checkpoint to evaluate in checkpoint.dir = ", config.checkpoint_dir);
  // Metrics: a run that continues (from a checkpoint, or any start under train.resume = auto, so
  // a requeued job that died before its first checkpoint keeps its records too) appends, and marks
  // the seam; a run started anew (train.resume empty or fresh) begins a new file.
  const bool continues = !r.resumed_from.empty() || config.train_resume == "auto";
  open_metrics(continues ? MetricsFile::Mode::Append : MetricsFile::Mode::Truncate);
  if (!config.log_tensorboard.empty() && !options.eval_only) {
    // A new event file per start: a continued run marks its first step, so TensorBoard shows
    // each step once (tensorboard.hpp). An unwritable folder stops every rank here.
    on_rank0(control, [&]() -> std::string {
      r.tensorboard = TensorBoardFile(config.log_tensorboard, continues ? r.state->step : 0);
      return "";
    });
  }
  if (!config.log_trace.empty() && !options.eval_only) {
    const TraceSteps steps = parse_trace_steps(config.log_trace_steps);
    LOCKSTEP_CHECK_HINT(steps.first > r.state->step && steps.first <= r.plan.total_steps,
                        str("name steps between ", r.state->step + 1, " and ", r.plan.total_steps),
                        "log.trace_steps = ", config.log_trace_steps, ": this run trains steps ",
                        r.state->step + 1, " to ", r.plan.total_steps,
                        ", so the window would record nothing");
    // Proved writable now, before any work: the file is written when the window ends.
    on_rank0(control, [&]() -> std::string {
      std::ofstream probe(config.log_trace, std::ios::trunc);
      LOCKSTEP_CHECK_HINT(probe.good(), "name a file that can be written, or leave log.trace empty",
                          "log.trace = ", config.log_trace,
                          ": cannot create the file: ", std::strerror(errno));
      return "";
    });
    r.trace = TraceWindow(control, config.log_trace, steps);
  }
  if (r.metrics.continues())
    r.metrics.write(JsonRecord()
                        .add("event", "restart")
                        .add("step", r.state->step)
                        .add("checkpoint", r.resumed_from)
                        .add("eval_only", options.eval_only));

  // ---- how gradients meet: the transport (comm/), then the engine over it; the engine's
  // construction broadcasts rank 0's state, so it comes after the restore.
  if (r.parallel != "dp") {
    std::string transport;
    r.gradient_comm = comm::gradient_communicator(
        control, *r.ctx, comm::parse_allreduce_algorithm(config.dist_algorithm, "dist.algorithm"),
        &transport);
    if (r.world > 1)
      r.line("lockstep: gradient allreduce " + transport +
             (config.dist_grad_dtype == "bf16" ? ", gradients sent as bf16" : ""));
  }
  r.engine = make_engine(r, config);
  if (r.gradient_comm) r.state->set_communicator(*r.gradient_comm);  // gathers ZeRO-1 state

  data::LoaderOptions loader_options;
  loader_options.prefetch_depth = static_cast<int>(config.data_prefetch);
  loader_options.decode_threads = static_cast<int>(config.data_decode_threads);
  loader_options.drop_last_batch = true;
  loader_options.start_batch = r.state->position.batch_in_epoch;
  auto& augment = loader_options.augment;
  augment.random_resized_crop = config.data_random_resized_crop;
  augment.scale_min = config.data_rrc_scale_min;
  augment.scale_max = config.data_rrc_scale_max;
  augment.ratio_min = config.data_rrc_ratio_min;
  augment.ratio_max = config.data_rrc_ratio_max;
  augment.pad_crop = config.data_pad_crop;
  augment.flip = config.data_flip;
  augment.seed = static_cast<std::uint64_t>(config.train_seed);
  r.loader =
      std::make_unique<data::Loader>(r.train_data(), sampler, r.plan.local_batch, loader_options);
  r.schedule = make_schedule(config, r.plan.total_steps);
  return run;
}

}  // namespace lockstep::train
