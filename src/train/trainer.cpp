#include "lockstep/train/trainer.hpp"

#include <cmath>
#include <fstream>

#include "lockstep/parallel/data_parallel.hpp"
#include "lockstep/train/evaluate.hpp"
#include "lockstep/train/setup.hpp"

namespace lockstep::train {
namespace {

// Peak resident set size of this process (VmHWM), in bytes; 0 where /proc is unavailable.
std::int64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return 0;
}

// Proportional set size now (smaps_rollup "Pss:"), in bytes: resident pages, each shared page
// divided by the processes that map it, so a node-shared data set counts once per node, not once
// per rank as in VmHWM. 0 where the kernel has no smaps_rollup.
std::int64_t pss_bytes() {
  std::ifstream rollup("/proc/self/smaps_rollup");
  for (std::string line; std::getline(rollup, line);)
    if (line.rfind("Pss:", 0) == 0) return std::stoll(line.substr(4)) * 1024;
  return 0;
}

std::string json_list(const std::vector<std::string>& items) {
  std::string list = "[";
  for (std::size_t i = 0; i < items.size(); ++i)
    list += (i ? ", " : "") + items[i];
  return list + "]";
}

// Where the wall time went, as shares of it: (name, fraction), in the order the summary prints.
std::vector<std::pair<std::string, double>> time_shares(const TrainResult& r) {
  const double wall = r.wall_seconds > 0 ? r.wall_seconds : 1;
  const TimeShares& t = r.time;
  return {{"compute", t.compute / wall},
          {"comm_exposed", t.comm_exposed / wall},
          {"data_wait", t.data_wait / wall},
          {"optimizer", t.optimizer / wall},
          {"checkpoint", t.checkpoint / wall},
          {"eval", t.evaluation / wall},
          {"other", t.other(r.wall_seconds) / wall}};
}

// checkpoint.export: the parameters as a plain HDF5 file, written by rank 0.
void export_if_asked(Run& run) {
  if (run.rank != 0 || run.config.checkpoint_export.empty()) return;
  std::vector<std::pair<std::string, Tensor>> params, buffers;
  for (nn::Parameter* p : run.model->parameters())
    params.emplace_back(p->name, nn::unpadded(*p, p->value));  // as checkpoints store them
  for (nn::Buffer* b : run.model->buffers())
    buffers.emplace_back(b->name, b->value);
  export_parameters(run.config.checkpoint_export, params, buffers,
                    {{"model_spec", run.config.model_spec}, {"structure", run.model->structure()}});
  run.line("parameters exported to " + run.config.checkpoint_export);
}

TrainResult evaluate_only(Run& run) {
  TrainResult result;
  EvalResult ev = evaluate(run, *run.test_data());
  result.test_accuracy = ev.accuracy;
  result.test_loss = ev.loss;
  result.steps = run.state->step;
  run.line(str("eval: test_loss ", ev.loss, " test_accuracy ", ev.accuracy, " (", ev.samples,
               " samples)"));
  JsonRecord record;
  record.add("event", "final")
      .add("test_accuracy", ev.accuracy)
      .add("test_loss", ev.loss)
      .add("steps", result.steps);
  if (run.test_tokens) record.add("val_perplexity", std::exp(ev.loss));
  run.record(record);
  export_if_asked(run);
  return result;
}

// The final metrics record, with every rank's peak memory (a collective).
void write_final_record(Run& run, const TrainResult& result) {
  JsonRecord record;
  record.add("event", result.stopped_by_signal ? "stopped" : "final")
      .add("steps", result.steps)
      .add("epochs", result.epochs)
      .add("wall_s", result.wall_seconds)
      .add("samples_per_s", result.samples_per_second)
      .add("train_loss", result.final_train_loss)
      .add("skipped_steps", result.skipped_steps);
  for (const auto& [name, share] : time_shares(result))
    record.add(name + "_share", share);
  if (result.test_accuracy >= 0)
    record.add("test_accuracy", result.test_accuracy).add("test_loss", result.test_loss);
  // Memory balance: every rank's peak resident set, and for DataParallel the tensor bytes each
  // replica holds (replicas share one process, so RSS cannot tell them apart).
  record.add_raw("rank_peak_rss_bytes",
                 json_list(run.comm.allgather(std::to_string(peak_rss_bytes()))));
  record.add_raw("rank_pss_bytes", json_list(run.comm.allgather(std::to_string(pss_bytes()))));
  // Allocated optimizer state (padding included), per rank: ZeRO-1 divides it by the world size.
  record.add("optimizer_state_bytes", run.optimizer->state_bytes());
  record.add_raw("rank_optimizer_state_bytes",
                 json_list(run.comm.allgather(std::to_string(run.optimizer->state_bytes()))));
  if (auto* dp = dynamic_cast<parallel::DataParallelEngine*>(run.engine.get())) {
    std::vector<std::string> bytes;
    for (std::int64_t b : dp->replica_tensor_bytes())
      bytes.push_back(std::to_string(b));
    record.add_raw("replica_tensor_bytes", json_list(bytes));
  }
  run.record(record);
}

}  // namespace

TrainResult run_training(const Config& config, comm::Communicator& comm, bool eval_only) {
  SetupOptions options;
  options.eval_only = eval_only;
  std::unique_ptr<Run> run = setup_run(config, comm, options);
  if (eval_only) return evaluate_only(*run);

  const StepPlan& plan = run->plan;
  run->line(str("lockstep: ", run->parallel, " with ", run->world, " rank(s) x ", run->replicas,
                " replica(s) x ", run->threads, " thread(s) on ", run->ctx->device().str(),
                "; model ", run->model->num_parameters(), " parameters; ",
                run->train_data()->size(), " training samples; global batch ", plan.global_batch,
                " = ", run->world, " x ", plan.accumulation, " x ", plan.local_batch, "; ",
                plan.total_steps, " steps"));
  if (run->ctx->precision() != ops::Precision::FP32)
    run->line("precision " + run->ctx->precision_info());
  if (!run->attention.empty()) run->line("attention " + run->attention);
  if (run->model->channels_last())
    run->line("activations channels-last (NHWC): model.channels_last = " +
              run->config.model_channels_last);
  JsonRecord start;
  start.add("event", "start")
      .add("world_size", run->world)
      .add("threads", run->threads)
      .add("parallel", run->parallel)
      .add("device", run->ctx->device().str())
      .add("parameters", run->model->num_parameters())
      .add("global_batch", plan.global_batch)
      .add("steps", plan.total_steps)
      .add("start_step", run->state->step);
  if (!run->attention_kernel.empty()) start.add("attention", run->attention_kernel);
  run->record(start);

  TrainResult result = train_loop(*run);
  write_final_record(*run, result);
  if (!result.stopped_by_signal) export_if_asked(*run);
  std::string acc = result.test_accuracy >= 0 ? str(" test_accuracy ", result.test_accuracy) : "";
  run->line(str(result.stopped_by_signal ? "stopped: " : "done: ", result.steps, " steps in ",
                format_duration(result.wall_seconds), " (",
                static_cast<long long>(result.samples_per_second), " samples/s)", acc));
  std::string shares = "time:";
  for (const auto& [name, share] : time_shares(result))
    shares += str(" ", name, " ", std::lround(share * 1000) / 10.0, "%");
  run->line(shares + " of " +
            (result.wall_seconds < 60 ? str(std::lround(result.wall_seconds * 100) / 100.0, "s")
                                      : format_duration(result.wall_seconds)));
  // No rank may exit while rank 0 still writes (mpirun ends the job on the first exit).
  comm.barrier();
  return result;
}

}  // namespace lockstep::train
