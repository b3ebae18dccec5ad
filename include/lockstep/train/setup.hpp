// Setup: everything a run is made of, built from a Config in one place and in a fixed order
// (context, data, model, optimizer, the state resumed from a checkpoint, gradient transport,
// engine, loader, outputs), so the training loop and evaluation only use it. Every rank builds
// its own Run; the collective checks (config, model and data agree across ranks) happen here.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "lockstep/comm/communicator.hpp"
#include "lockstep/data/dataset.hpp"
#include "lockstep/data/loader.hpp"
#include "lockstep/data/token_dataset.hpp"
#include "lockstep/nn/model.hpp"
#include "lockstep/ops/context.hpp"
#include "lockstep/optim/flat.hpp"
#include "lockstep/optim/optimizer.hpp"
#include "lockstep/optim/schedule.hpp"
#include "lockstep/parallel/ddp.hpp"
#include "lockstep/parallel/engine.hpp"
#include "lockstep/train/checkpoint_lock.hpp"
#include "lockstep/train/config.hpp"
#include "lockstep/train/metrics.hpp"
#include "lockstep/train/state.hpp"
#include "lockstep/train/tensorboard.hpp"
#include "lockstep/train/trace_file.hpp"

namespace lockstep::train {

// How the global batch divides and how long the run is. Global batch = world x accumulation x
// local batch, exactly; loader batches of an epoch are whole micro-batches (drop_last), and a
// step is `accumulation` of them.
struct StepPlan {
  std::int64_t global_batch = 0;
  std::int64_t accumulation = 1;
  std::int64_t local_batch = 0;  // samples per rank and micro-step
  std::int64_t steps_per_epoch = 0;
  std::int64_t total_steps = 0;  // min(epochs x steps_per_epoch, max_steps when set)
};
// samples_per_rank: what the sampler gives each rank per epoch. Errors name the keys (a global
// batch that does not divide, a set smaller than one step, epochs x steps beyond int64).
StepPlan plan_steps(const Config& config, int world, std::int64_t samples_per_rank,
                    std::int64_t dataset_size);

struct SetupOptions {
  bool eval_only = false;  // --eval-only: needs a checkpoint and data.test
};

struct Run {
  Config config;
  comm::Communicator& comm;  // control traffic (metrics, flags); gradients may use another
  int rank = 0, world = 1;
  std::string parallel;  // ddp, dp or none (resolved)
  int replicas = 1, threads = 1;
  bool logs = false;   // this rank prints progress
  std::string prefix;  // "[rank R] " with log.rank_prefix
  std::unique_ptr<ops::Context> ctx;
  std::shared_ptr<data::ShardedDataset> train_set, test_set;  // test_set null without evaluation
  // Token shards (a language model; token_data.hpp): then these are set and the two above null.
  std::shared_ptr<data::TokenDataset> train_tokens, test_tokens;
  double unigram_nats = 0;  // token data: the evaluation set's unigram entropy (ranks that log)
  parallel::InputNormalization norm;
  StepPlan plan;
  std::unique_ptr<nn::Model> model;
  std::shared_ptr<optim::FlatParams> flat;  // parameters, gradients, optimizer state; one layout
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<optim::LrSchedule> schedule;
  std::unique_ptr<TrainState> state;
  std::string resumed_from;  // the checkpoint the state came from ("" = fresh)
  // What train.attention resolved to for the training micro-batch, as the trainer prints it
  // ("cudnn (cuDNN 9.19.0 fused flash attention ...)"); kernel name alone in attention_kernel.
  // Both empty when the model has no attention layer.
  std::string attention, attention_kernel;
  std::shared_ptr<comm::Communicator> gradient_comm;
  std::unique_ptr<parallel::Engine> engine;
  std::unique_ptr<data::Loader> loader;             // starts at state->position
  MetricsFile metrics;                              // rank 0, when log.metrics is set
  TensorBoardFile tensorboard;                      // rank 0, when log.tensorboard is set
  TraceWindow trace;                                // log.trace (collective at its window)
  std::unique_ptr<CheckpointLock> checkpoint_lock;  // rank 0, while it may write checkpoint.dir
  std::unique_ptr<Progress> progress;

  Run(const Config& c, comm::Communicator& control) : config(c), comm(control) {}
  // Evaluation batch. Images: at least 256 samples (no gradients are kept, so larger is cheap).
  // Token windows: the training micro-batch, whose activations training already holds: a
  // window's activations and logits grow with context x width and context x vocabulary, so 256
  // windows took gpt-tiny's evaluation to a 1.17 GB peak against training's 0.24 GB, and would
  // need 52 GB of logits alone for gpt2-124m.
  std::int64_t eval_batch() const {
    if (train_tokens) return plan.local_batch;
    return std::max<std::int64_t>(plan.local_batch, 256);
  }
  void line(const std::string& text) const;  // a progress line, on the ranks that log
  // A metrics record, to every sink rank 0 keeps: log.metrics and log.tensorboard.
  void record(const JsonRecord& r) {
    metrics.write(r);
    tensorboard.write(r);
  }
  // The training and evaluation sets, whichever kind they are (test_data() null without one).
  std::shared_ptr<const data::Dataset> train_data() const;
  const data::Dataset* test_data() const;
};

// Builds the run. Collective over `control`: every rank must call it.
std::unique_ptr<Run> setup_run(const Config& config, comm::Communicator& control,
                               const SetupOptions& options = {});

// Threads per rank or DataParallel replica: train.threads, else the cores this rank may use (the
// launcher's binding if it set one, else the node's cores divided by its local ranks) divided by
// the replicas in this process; at least 1.
int resolve_threads(const Config& config, int local_ranks, int replicas);

// Resolves train.parallel = auto: ddp when the job has several ranks, else none.
std::string resolve_parallel(const Config& config, int world_size);

// Stops every rank (lockstep::Error on each) when the rank-invariant settings differ, naming each
// differing key with rank 0's value and the first disagreeing rank's. Collective.
void check_config_agrees(comm::Communicator& comm, const Config& config);

}  // namespace lockstep::train
