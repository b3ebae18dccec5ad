#include "lockstep/train/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <numeric>
#include <sstream>
#include <thread>

#include <sched.h>

#include "lockstep/comm/bootstrap.hpp"
#include "lockstep/comm/gpu_select.hpp"
#include "lockstep/comm/hierarchical.hpp"
#include "lockstep/comm/nccl_communicator.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/core/rng.hpp"
#include "lockstep/data/dataset.hpp"
#include "lockstep/data/loader.hpp"
#include "lockstep/data/sampler.hpp"
#include "lockstep/dist/data_parallel.hpp"
#include "lockstep/dist/ddp.hpp"
#include "lockstep/nn/loss.hpp"
#include "lockstep/nn/model.hpp"
#include "lockstep/ops/ops.hpp"
#include "lockstep/optim/adamw.hpp"
#include "lockstep/optim/clip.hpp"
#include "lockstep/optim/optimizer.hpp"
#include "lockstep/optim/schedule.hpp"
#include "lockstep/optim/sgd.hpp"
#include "lockstep/train/checkpoint.hpp"
#include "lockstep/train/metrics.hpp"
#include "lockstep/train/signals.hpp"

namespace lockstep::train {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::unique_ptr<optim::Optimizer> make_optimizer(const Config& c,
                                                 std::shared_ptr<optim::FlatParams> params) {
  if (c.optim_name == "adamw") {
    optim::AdamWOptions o;
    o.lr = static_cast<float>(c.optim_lr);
    o.beta1 = static_cast<float>(c.optim_beta1);
    o.beta2 = static_cast<float>(c.optim_beta2);
    o.eps = static_cast<float>(c.optim_eps);
    o.weight_decay = static_cast<float>(c.optim_weight_decay);
    o.decay = optim::parse_decay_scope(c.optim_decay);
    return std::make_unique<optim::AdamW>(std::move(params), o);
  }
  optim::SgdOptions o;
  o.lr = static_cast<float>(c.optim_lr);
  o.momentum = static_cast<float>(c.optim_momentum);
  o.nesterov = c.optim_nesterov;
  o.weight_decay = static_cast<float>(c.optim_weight_decay);
  o.decay = optim::parse_decay_scope(c.optim_decay);
  return std::make_unique<optim::Sgd>(std::move(params), o);
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

struct EvalResult {
  double loss = 0;
  double accuracy = 0;
  std::int64_t samples = 0;
};

// Every rank evaluates test samples r, r+W, r+2W, ... (no padding: each sample counted exactly
// once), then the sums are reduced.
EvalResult evaluate(ops::Context& ctx, nn::Model& model, const data::ShardedDataset& test,
                    comm::Communicator& comm, const dist::InputNormalization& norm,
                    std::int64_t batch) {
  model.set_training(false);
  std::vector<std::int64_t> mine;
  for (std::int64_t i = comm.rank(); i < test.size(); i += comm.size())
    mine.push_back(i);
  nn::SoftmaxCrossEntropy loss_fn;
  double loss_sum = 0;
  std::int64_t correct = 0;
  Tensor x, y, input;
  for (std::size_t begin = 0; begin < mine.size(); begin += static_cast<std::size_t>(batch)) {
    std::size_t end = std::min(mine.size(), begin + static_cast<std::size_t>(batch));
    test.gather(std::span<const std::int64_t>(mine.data() + begin, end - begin), x, y);
    dist::prepare_input(ctx, x, norm, input);
    Tensor labels = y.device() == ctx.device() ? y : y.to(ctx.device());
    Tensor logits = model.forward(ctx, input);
    Tensor loss = loss_fn.forward(ctx, logits, labels);
    loss_sum += static_cast<double>(loss.item()) * static_cast<double>(end - begin);
    correct += ops::count_correct(ctx, logits, labels);
  }
  model.set_training(true);
  std::vector<double> sums = {loss_sum, static_cast<double>(correct),
                              static_cast<double>(mine.size())};
  comm.allreduce(sums, comm::ReduceOp::Sum);
  EvalResult r;
  r.samples = static_cast<std::int64_t>(sums[2]);
  if (r.samples > 0) {
    r.loss = sums[0] / sums[2];
    r.accuracy = sums[1] / sums[2];
  }
  return r;
}

// Peak resident set size of this process (VmHWM), in bytes; 0 where /proc is unavailable.
std::int64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return 0;
}

std::int64_t optimizer_state_bytes(optim::Optimizer& optimizer) {
  std::int64_t bytes = 0;
  for (const optim::StateTensor& t : optimizer.state())
    bytes += static_cast<std::int64_t>(t.value.nbytes());
  return bytes;
}

}  // namespace

void check_config_agrees(comm::Communicator& comm, const Config& config) {
  std::ostringstream text;
  for (const auto& [key, value] : rank_invariant_settings(config))
    text << key << '=' << value << '\n';
  std::vector<std::string> all = comm.allgather(text.str());
  auto parse = [](const std::string& s) {
    std::map<std::string, std::string> m;
    std::istringstream in(s);
    for (std::string line; std::getline(in, line);) {
      auto eq = line.find('=');
      if (eq != std::string::npos) m[line.substr(0, eq)] = line.substr(eq + 1);
    }
    return m;
  };
  auto reference = parse(all[0]);
  for (std::size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    auto other = parse(all[r]);
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

TrainResult run_training(const Config& config, comm::Communicator& comm, bool eval_only) {
  const int rank = comm.rank(), world = comm.size();
  const std::string parallel = resolve_parallel(config, world);
  LOCKSTEP_CHECK_HINT(parallel != "dp" || world == 1,
                      "launch parallel = dp as one process (it uses threads), or use ddp",
                      "train.parallel = dp runs in one process, but this job has ", world,
                      " ranks");
  LOCKSTEP_CHECK_HINT(parallel != "none" || world == 1, "set train.parallel = ddp (or auto)",
                      "train.parallel = none with ", world, " ranks would train ", world,
                      " unrelated models");
  check_config_agrees(comm, config);

  const bool logs = rank == 0 || config.log_rank_prefix;
  const std::string prefix = config.log_rank_prefix ? "[rank " + std::to_string(rank) + "] " : "";
  const int replicas = parallel == "dp" ? static_cast<int>(config.train_replicas) : 1;
  const int threads = resolve_threads(config, comm.local_size(), replicas);
  Device device = Device::cpu();
  if (config.train_device == "cuda" || (config.train_device == "auto" && cuda_available())) {
    LOCKSTEP_CHECK_HINT(cuda_available(), "set train.device = cpu, or run where a GPU is visible",
                        "train.device = cuda but no GPU is available to rank ", rank, " on host ",
                        comm::this_host());
    // One GPU per rank (DDP; train.gpu says which); DataParallel's master takes GPU 0 and its
    // replicas the next.
    device = parallel == "dp" ? Device::cuda(0) : comm::select_gpu(comm, config.train_gpu);
  }
  ops::Context ctx(device, threads);
  ctx.set_precision(ops::precision_from_name(config.train_precision));

  auto train_set =
      data::ShardedDataset::open(config.data_train, config.data_memory_budget_mb << 20);
  std::shared_ptr<data::ShardedDataset> test_set;
  if (!config.data_test.empty() && (config.train_eval || eval_only))
    test_set = data::ShardedDataset::open(config.data_test, config.data_memory_budget_mb << 20);
  if (test_set) {
    LOCKSTEP_CHECK_HINT(test_set->sample_shape() == train_set->sample_shape() &&
                            test_set->num_classes() == train_set->num_classes(),
                        "make train and test shards from the same source with lockstep-shard",
                        "test set ", config.data_test, " has samples ",
                        shape_str(test_set->sample_shape()), " and ", test_set->num_classes(),
                        " classes, but the training set ", config.data_train, " has ",
                        shape_str(train_set->sample_shape()), " and ", train_set->num_classes());
  }
  Shape input_shape = train_set->sample_shape();
  auto model = std::make_unique<nn::Model>(
      nn::Model::build(config.model_spec, input_shape, train_set->num_classes(),
                       static_cast<std::uint64_t>(config.train_seed), device));
  comm::check_same_on_all_ranks(comm, "model structure", model->structure());
  comm::check_same_on_all_ranks(comm, "training data",
                                str(train_set->size(), " samples of ", shape_str(input_shape), ", ",
                                    train_set->num_classes(), " classes"));

  // Global batch = world x accumulation x local batch, exactly.
  const std::int64_t per_step = config.train_global_batch;
  const std::int64_t split = static_cast<std::int64_t>(world) * config.train_accumulation;
  LOCKSTEP_CHECK_HINT(per_step % split == 0,
                      "choose train.global_batch as a multiple of ranks x train.accumulation",
                      "train.global_batch = ", per_step, " does not divide into ", world,
                      " ranks x ", config.train_accumulation, " micro-steps");
  const std::int64_t local_batch = per_step / split;

  dist::InputNormalization norm{train_set->mean(), train_set->stddev()};
  data::DistributedSampler sampler(train_set->size(), world, rank, /*shuffle=*/true,
                                   static_cast<std::uint64_t>(config.train_seed),
                                   /*drop_last=*/false);
  // Loader batches of the epoch: equal micro-batches keep the gradient average exact.
  const std::int64_t loader_batches = sampler.num_samples() / local_batch;
  const std::int64_t steps_per_epoch = loader_batches / config.train_accumulation;
  LOCKSTEP_CHECK_HINT(steps_per_epoch > 0, "lower train.global_batch or add data",
                      "the training set (", train_set->size(),
                      " samples) is smaller than one step of ", per_step, " samples");
  std::int64_t total_steps = steps_per_epoch * config.train_epochs;
  if (config.train_max_steps > 0) total_steps = std::min(total_steps, config.train_max_steps);

  // Values, gradients and optimizer state in one flat layout, bucketed as DDP communicates it.
  auto flat = std::make_shared<optim::FlatParams>(
      model->parameters(),
      optim::BucketLimits{static_cast<std::size_t>(config.dist_bucket_mb * (1 << 20)),
                          static_cast<std::size_t>(config.dist_first_bucket_mb * (1 << 20))});
  auto optimizer = make_optimizer(config, flat);
  // Dropout masks differ between ranks (as with one RNG per process in PyTorch).
  model->set_dropout_seed(hash_combine(static_cast<std::uint64_t>(config.train_seed),
                                       static_cast<std::uint64_t>(rank)));

  MetricsFile metrics;
  if (rank == 0 && !config.log_metrics.empty()) metrics = MetricsFile(config.log_metrics);
  Progress progress(logs ? parse_progress_mode(config.log_progress) : ProgressMode::None,
                    total_steps, prefix);

  // ---- resume: every rank reads the checkpoint rank 0 chose (a shared file system is assumed,
  // as for the shards); the DDP engine's broadcast then makes the replicas identical anyway.
  std::int64_t step = 0, start_epoch = 0, start_batch = 0, optimizer_steps = 0;
  std::string resume_path = config.train_resume;
  if (resume_path == "auto") {
    LOCKSTEP_CHECK_HINT(!config.checkpoint_dir.empty(), "set checkpoint.dir",
                        "train.resume = auto needs checkpoint.dir to look in");
    std::string found;
    if (rank == 0) {
      auto latest = find_latest_checkpoint(config.checkpoint_dir, [&](const std::string& warning) {
        progress.line("warning: " + warning);
      });
      found = latest.value_or("");
    }
    resume_path = comm.broadcast(found, 0);
    if (resume_path.empty() && logs)
      progress.line(str("no checkpoint in ", config.checkpoint_dir, ": starting fresh"));
  }
  if (!resume_path.empty()) {
    CheckpointState state = read_checkpoint(resume_path);
    LOCKSTEP_CHECK_HINT(state.model_structure == model->structure(),
                        "resume with the model.spec and data the checkpoint was made with",
                        "checkpoint ", resume_path,
                        " holds a different model than model.spec = ", config.model_spec);
    for (nn::Parameter* p : model->parameters())
      ops::copy(ctx, state.tensor("param/" + p->name), p->value);
    for (nn::Buffer* b : model->buffers())
      ops::copy(ctx, state.tensor("buffer/" + b->name), b->value);
    for (optim::StateTensor& t : optimizer->state())
      ops::copy(ctx, state.tensor("optim/" + t.name), t.value);
    auto attr = [&](const std::string& key) -> std::int64_t {
      auto it = state.attrs.find(key);
      LOCKSTEP_CHECK(it != state.attrs.end(), "checkpoint ", resume_path, " has no attribute '",
                     key, "'");
      return std::stoll(it->second);
    };
    optimizer_steps = attr("optimizer_steps");
    optimizer->set_steps(optimizer_steps);
    model->set_dropout_calls(static_cast<std::uint64_t>(attr("dropout_calls")));
    step = state.step;
    start_epoch = state.epoch;
    start_batch = rescale_batch_in_epoch(state.batch_in_epoch, attr("samples_per_loader_batch"),
                                         local_batch * world);
    // Whole optimizer steps only: a partial accumulation is replayed.
    start_batch = start_batch / config.train_accumulation * config.train_accumulation;
    if (logs)
      progress.line(str("resumed from ", resume_path, " at step ", step, " (epoch ", start_epoch,
                        ", batch ", start_batch, ", written by ", state.world_size, " rank(s))"));
  }
  LOCKSTEP_CHECK(!eval_only || !resume_path.empty() || config.train_resume.empty(),
                 "--eval-only found no checkpoint to evaluate");

  // Gradients and parameters on a GPU travel over NCCL (bootstrapped over MPI: rank 0's unique
  // id is broadcast); the MPI communicator keeps the host-side metrics and control traffic.
  comm::Communicator* gradient_comm = &comm;
#ifdef LOCKSTEP_HAVE_CUDA
  std::unique_ptr<comm::Communicator> nccl;
  if (device.is_cuda() && parallel != "dp") {
    nccl = comm::make_nccl_communicator(comm, ctx);
    gradient_comm = nccl.get();
  }
#endif
  // Mixed CPU/GPU nodes would pick different gradient transports and hang: refuse them by host.
  // On CPUs, dist.algorithm picks flat or hierarchical allreduce (comm/hierarchical.hpp).
  const comm::NodeLayout layout = comm::NodeLayout::detect(comm);
  comm::check_same_on_all_hosts(comm, layout, "the training device (train.device)",
                                device.is_cuda() ? "cuda" : "cpu",
                                "give every node a GPU, or set train.device = cpu");
  const auto algorithm = comm::parse_allreduce_algorithm(config.dist_algorithm, "dist.algorithm");
  std::unique_ptr<comm::Communicator> hierarchical;
  if (!device.is_cuda() && parallel == "ddp") {
    hierarchical = comm::make_gradient_communicator(comm, algorithm, layout);
    if (hierarchical) gradient_comm = hierarchical.get();
  } else if (device.is_cuda()) {
    LOCKSTEP_CHECK_HINT(algorithm != comm::AllreduceAlgorithm::Hierarchical,
                        "set dist.algorithm = auto (NCCL already routes within and between nodes)",
                        "dist.algorithm = hierarchical applies to the MPI allreduce of CPU ranks");
  }
  if (logs && world > 1)
    progress.line(str("lockstep: gradient allreduce ", hierarchical ? "hierarchical" : "flat",
                      " over ", layout.describe()));
  std::unique_ptr<dist::Engine> engine;
  dist::DdpOptions ddp_options;
  ddp_options.reducer.bucket_bytes = static_cast<std::size_t>(config.dist_bucket_mb * (1 << 20));
  ddp_options.reducer.first_bucket_bytes =
      static_cast<std::size_t>(config.dist_first_bucket_mb * (1 << 20));
  ddp_options.sync = config.dist_sync;
  ddp_options.input = norm;
  if (parallel == "dp") {
    dist::DataParallelOptions dp;
    dp.replicas = replicas;
    dp.threads_per_replica = threads;
    dp.input = norm;
    if (device.is_cuda()) {
      LOCKSTEP_CHECK(cuda_device_count() >= replicas, "train.replicas = ", replicas, " but only ",
                     cuda_device_count(), " GPUs are visible");
      for (int r = 0; r < replicas; ++r)
        dp.devices.push_back(Device::cuda(r));
    }
    engine = std::make_unique<dist::DataParallelEngine>(ctx, *model, config.model_spec, input_shape,
                                                        train_set->num_classes(), dp, flat);
  } else {
    engine = std::make_unique<dist::DdpEngine>(ctx, *model, *gradient_comm, ddp_options, flat);
  }

  data::LoaderOptions loader_options;
  loader_options.prefetch_depth = static_cast<int>(config.data_prefetch);
  loader_options.drop_last_batch = true;
  loader_options.start_batch = start_batch;
  data::Loader loader(train_set, sampler, local_batch, loader_options);
  std::unique_ptr<optim::LrSchedule> schedule = make_schedule(config, total_steps);

  if (logs) {
    progress.line(str("lockstep: ", parallel, " with ", world, " rank(s) x ", replicas,
                      " replica(s) x ", threads, " thread(s) on ", device.str(), "; model ",
                      model->num_parameters(), " parameters; ", train_set->size(),
                      " training samples; global batch ", per_step, " = ", world, " x ",
                      config.train_accumulation, " x ", local_batch, "; ", total_steps, " steps"));
    if (ctx.precision() != ops::Precision::FP32) progress.line("precision " + ctx.precision_info());
  }
  metrics.write(JsonRecord()
                    .add("event", "start")
                    .add("world_size", world)
                    .add("threads", threads)
                    .add("parallel", parallel)
                    .add("device", device.str())
                    .add("parameters", model->num_parameters())
                    .add("global_batch", per_step)
                    .add("steps", total_steps)
                    .add("start_step", step));

  TrainResult result;
  auto export_if_asked = [&] {
    if (rank != 0 || config.checkpoint_export.empty()) return;
    std::vector<std::pair<std::string, Tensor>> params, buffers;
    for (nn::Parameter* p : model->parameters())
      params.emplace_back(p->name, p->value);
    for (nn::Buffer* b : model->buffers())
      buffers.emplace_back(b->name, b->value);
    export_parameters(config.checkpoint_export, params, buffers,
                      {{"model_spec", config.model_spec}, {"structure", model->structure()}});
    if (logs) progress.line("parameters exported to " + config.checkpoint_export);
  };
  auto run_start = Clock::now();
  if (eval_only) {
    LOCKSTEP_CHECK(test_set != nullptr, "--eval-only needs data.test");
    EvalResult ev =
        evaluate(ctx, *model, *test_set, comm, norm, std::max<std::int64_t>(local_batch, 256));
    result.test_accuracy = ev.accuracy;
    result.test_loss = ev.loss;
    result.steps = step;
    if (logs)
      progress.line(str("eval: test_loss ", ev.loss, " test_accuracy ", ev.accuracy, " (",
                        ev.samples, " samples)"));
    metrics.write(JsonRecord()
                      .add("event", "final")
                      .add("test_accuracy", ev.accuracy)
                      .add("test_loss", ev.loss)
                      .add("steps", step));
    export_if_asked();
    return result;
  }

  // ---- checkpoints and stop requests
  const bool checkpointing = !config.checkpoint_dir.empty();
  std::unique_ptr<StopRequest> stop;
  if (checkpointing)
    stop = std::make_unique<StopRequest>();  // without a folder, signals kill as usual
  auto last_save = Clock::now();
  auto save = [&](std::int64_t epoch, std::int64_t batch_in_epoch) {
    if (rank == 0) {
      CheckpointState state;
      state.step = step;
      state.epoch = epoch;
      state.batch_in_epoch = batch_in_epoch;
      state.world_size = world;
      state.config_ini = to_ini(config);
      state.model_structure = model->structure();
      state.attrs["optimizer_steps"] = std::to_string(optimizer->steps());
      state.attrs["dropout_calls"] = std::to_string(model->dropout_calls());
      state.attrs["samples_per_loader_batch"] = std::to_string(local_batch * world);
      state.attrs["parallel"] = parallel;
      for (nn::Parameter* p : model->parameters())
        state.tensors.emplace_back("param/" + p->name, p->value);
      for (nn::Buffer* b : model->buffers())
        state.tensors.emplace_back("buffer/" + b->name, b->value);
      for (optim::StateTensor& t : optimizer->state())
        state.tensors.emplace_back("optim/" + t.name, t.value);
      std::string path = checkpoint_path(config.checkpoint_dir, step);
      write_checkpoint(path, state);
      prune_checkpoints(config.checkpoint_dir, static_cast<int>(config.checkpoint_keep));
      result.checkpoint = path;
      if (logs) progress.line("checkpoint " + path);
    }
    last_save = Clock::now();
  };

  const float loss_scale = 1.0f / static_cast<float>(local_batch * config.train_accumulation);
  // Interval accumulators for logging.
  double interval_loss = 0, interval_compute = 0, interval_comm = 0, interval_copy = 0,
         interval_gather = 0;
  std::int64_t interval_steps = 0;
  auto interval_start = Clock::now();
  loader.reset_data_wait();
  std::int64_t skipped_steps = 0;
  bool stopping = false;
  std::int64_t epoch = start_epoch;
  // Where the next step would start: the position a checkpoint records.
  std::int64_t position_epoch = start_epoch, position_batch = start_batch;

  for (; epoch < config.train_epochs && step < total_steps && !stopping; ++epoch) {
    loader.start_epoch(epoch);
    const std::int64_t first_step =
        epoch == start_epoch ? start_batch / config.train_accumulation : 0;
    for (std::int64_t s = first_step; s < steps_per_epoch && step < total_steps; ++s) {
      comm.set_step(step + 1);  // named in hung-collective reports (dist.timeout_s)
      engine->begin_step();
      double step_loss = 0;
      for (std::int64_t micro = 0; micro < config.train_accumulation; ++micro) {
        std::optional<data::Batch> batch = loader.next();
        LOCKSTEP_CHECK(batch.has_value(), "loader ended epoch ", epoch, " early at step ", s);
        step_loss += engine->forward_backward(batch->x, batch->y, loss_scale,
                                              micro + 1 == config.train_accumulation);
      }
      engine->finish_gradients();
      step_loss /= static_cast<double>(config.train_accumulation);
      ++step;
      position_epoch = epoch;
      position_batch = (s + 1) * config.train_accumulation;

      // After the allreduce every rank holds the same gradients, so this check gives the same
      // answer everywhere without another collective. One pass, one readback (optim/clip.hpp).
      const optim::GradientCheck grads =
          optim::check_gradients(ctx, *flat, /*with_norm=*/config.optim_clip_norm > 0);
      bool finite = std::isfinite(step_loss) && grads.finite();
      const double lr = schedule->lr_at(step - 1);
      if (!finite) {
        LOCKSTEP_CHECK_HINT(config.train_nan_policy == "skip",
                            "lower optim.lr, set optim.clip_norm, or train.nan_policy = skip",
                            "non-finite loss or gradient at step ", step, " (epoch ", epoch,
                            ", loss on rank ", rank, ": ", step_loss, ")");
        ++skipped_steps;
        if (logs)
          progress.line(str("warning: step ", step, " skipped: non-finite loss or gradient"));
      } else {
        if (config.optim_clip_norm > 0)
          optim::clip_grad_norm(ctx, *flat, static_cast<float>(config.optim_clip_norm),
                                grads.norm());
        optimizer->set_lr(static_cast<float>(lr));
        optimizer->step(ctx);
        dist::StepTimes t = engine->times();
        interval_loss += step_loss;
        interval_compute += t.compute;
        interval_comm += t.comm_exposed;
        interval_copy += t.param_copy;
        interval_gather += t.grad_gather;
        ++interval_steps;
      }

      if ((step % config.log_every == 0 || step == total_steps) && interval_steps > 0) {
        // Collective at the same steps on every rank: the mean loss over ranks.
        std::vector<double> v = {interval_loss / static_cast<double>(interval_steps)};
        comm.allreduce(v, comm::ReduceOp::Sum);
        double loss = v[0] / world;
        double elapsed = seconds_since(interval_start);
        double sps = static_cast<double>(interval_steps * per_step) / elapsed;
        double wait = loader.data_wait_seconds();
        result.final_train_loss = loss;
        if (logs) progress.step(step, epoch, loss, lr, sps);
        metrics.write(
            JsonRecord()
                .add("step", step)
                .add("epoch", epoch)
                .add("loss", loss)
                .add("lr", lr)
                .add("samples_per_s", sps)
                .add("step_time_s", elapsed / static_cast<double>(interval_steps))
                .add("compute_s", interval_compute / static_cast<double>(interval_steps))
                .add("comm_exposed_s", interval_comm / static_cast<double>(interval_steps))
                .add("param_copy_s", interval_copy / static_cast<double>(interval_steps))
                .add("grad_gather_s", interval_gather / static_cast<double>(interval_steps))
                .add("data_wait_s", wait / static_cast<double>(interval_steps)));
        interval_loss = interval_compute = interval_comm = interval_copy = interval_gather = 0;
        interval_steps = 0;
        loader.reset_data_wait();
        interval_start = Clock::now();
      }

      if (checkpointing) {
        // One small collective per step so that every rank takes the same decision: a signal
        // seen by any rank, or rank 0's clock saying a time-based checkpoint is due.
        std::int64_t due_by_time =
            config.checkpoint_every_minutes > 0 &&
            seconds_since(last_save) >= config.checkpoint_every_minutes * 60.0;
        std::vector<std::int64_t> flags = {stop->requested(), rank == 0 ? due_by_time : 0};
        comm.allreduce(flags, comm::ReduceOp::Max);
        const bool due = flags[1] != 0 || (config.checkpoint_every_steps > 0 &&
                                           step % config.checkpoint_every_steps == 0);
        if (flags[0] != 0) {
          save(position_epoch, position_batch);
          if (logs)
            progress.line(str("stopping at step ", step, " on ",
                              StopRequest::signal_name(static_cast<int>(flags[0])),
                              "; resume with --train.resume=auto"));
          stopping = true;
          result.stopped_by_signal = true;
          break;
        }
        if (due && step < total_steps) save(position_epoch, position_batch);
      }
    }
    if (stopping) break;
    result.epochs = epoch + 1;
    if (test_set && config.train_eval) {
      auto eval_start = Clock::now();
      EvalResult ev =
          evaluate(ctx, *model, *test_set, comm, norm, std::max<std::int64_t>(local_batch, 256));
      result.test_accuracy = ev.accuracy;
      result.test_loss = ev.loss;
      if (logs)
        progress.line(str("epoch ", epoch, ": test_loss ", ev.loss, " test_accuracy ", ev.accuracy,
                          " (", ev.samples, " samples)"));
      metrics.write(JsonRecord()
                        .add("event", "eval")
                        .add("epoch", epoch)
                        .add("step", step)
                        .add("test_loss", ev.loss)
                        .add("test_accuracy", ev.accuracy));
      // Evaluation time is not training time: shift the interval's start past it.
      interval_start += Clock::now() - eval_start;
    }
  }
  progress.finish();
  result.steps = step;
  if (checkpointing && !stopping &&
      result.checkpoint != checkpoint_path(config.checkpoint_dir, step))
    save(position_epoch, position_batch);
  result.wall_seconds = seconds_since(run_start);
  result.samples_per_second = static_cast<double>(step * per_step) / result.wall_seconds;
  JsonRecord final_record;
  final_record.add("event", result.stopped_by_signal ? "stopped" : "final")
      .add("steps", step)
      .add("epochs", result.epochs)
      .add("wall_s", result.wall_seconds)
      .add("samples_per_s", result.samples_per_second)
      .add("train_loss", result.final_train_loss)
      .add("skipped_steps", skipped_steps);
  if (result.test_accuracy >= 0)
    final_record.add("test_accuracy", result.test_accuracy).add("test_loss", result.test_loss);
  // Memory balance: every rank's peak resident set, and for DataParallel the tensor bytes each
  // replica holds (replicas share one process, so RSS cannot tell them apart).
  {
    std::vector<std::string> rss = comm.allgather(std::to_string(peak_rss_bytes()));
    std::string list = "[";
    for (std::size_t r = 0; r < rss.size(); ++r)
      list += (r ? ", " : "") + rss[r];
    final_record.add_raw("rank_peak_rss_bytes", list + "]");
    final_record.add("optimizer_state_bytes", optimizer_state_bytes(*optimizer));
    if (auto* dp = dynamic_cast<dist::DataParallelEngine*>(engine.get())) {
      std::string bytes = "[";
      auto v = dp->replica_tensor_bytes();
      for (std::size_t r = 0; r < v.size(); ++r)
        bytes += (r ? ", " : "") + std::to_string(v[r]);
      final_record.add_raw("replica_tensor_bytes", bytes + "]");
    }
  }
  metrics.write(final_record);
  if (!stopping) export_if_asked();
  if (logs) {
    std::string acc = result.test_accuracy >= 0 ? str(" test_accuracy ", result.test_accuracy) : "";
    progress.line(str(stopping ? "stopped: " : "done: ", step, " steps in ",
                      format_duration(result.wall_seconds), " (",
                      static_cast<long long>(result.samples_per_second), " samples/s)", acc));
  }
  // No rank may exit while rank 0 still writes (mpirun ends the job on the first exit).
  comm.barrier();
  return result;
}

}  // namespace lockstep::train
