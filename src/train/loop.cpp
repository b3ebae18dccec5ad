// The loop reads top to bottom as one step does: batches -> engine (forward, backward, gradients
// averaged) -> NaN/Inf policy -> clip, LR, optimizer -> log record -> checkpoint or stop; after
// each epoch, evaluation. Two extensions are meant to plug in without reshaping it:
//  - a GPU step without host syncs: the loss forward_backward returns stays where it was
//    computed; IntervalLosses copies each micro-step's loss into a slot of one device buffer and
//    reads the whole log interval back at the log step (one read per interval, none per step).
//    Whether a step is finite is the gradient check's answer (one pass over the flat buckets,
//    one readback, optim/clip.hpp), which also covers the loss: softmax cross-entropy's loss is
//    non-finite only when the logits are, and then dL/dlogits and every gradient before it are
//    NaN. A non-finite loss with finite gradients (a finite loss too large for f32) would show at
//    the log step, and is an error there unless train.nan_policy = skip.
//  - sequence models: the loss scale comes from the rows of y (y.numel(): B for classification,
//    B*T for next-token labels [B, T]), not from the sample count, and evaluation is called from
//    one place (evaluate_now): after each epoch and every train.eval_every_steps.
#include "lockstep/train/loop.hpp"

#include <cmath>
#include <functional>
#include <optional>
#include <vector>

#include "lockstep/core/clock.hpp"
#include "lockstep/core/trace.hpp"
#include "lockstep/ops/backend.hpp"
#include "lockstep/ops/device_runtime.hpp"
#include "lockstep/ops/ops.hpp"
#include "lockstep/optim/clip.hpp"
#include "lockstep/train/evaluate.hpp"
#include "lockstep/train/signals.hpp"

namespace lockstep::train {
namespace {

// The device's counters (ops/device_runtime.hpp) less `base`, field by field.
ops::DeviceCounters counters_since(Device device, const ops::DeviceCounters& base) {
  const ops::DeviceCounters now = ops::device_counters(device);
  return {now.host_syncs - base.host_syncs, now.pageable_copies - base.pageable_copies,
          now.device_mallocs - base.device_mallocs};
}

// Sums over the steps of one log interval, averaged when the record is written.
struct Interval {
  explicit Interval(Device device) : counters(ops::device_counters(device)) {}

  double compute = 0, comm = 0, copy = 0, gather = 0;
  double grad_norm = 0;  // summed over the steps, when the gradient check computes it
  std::int64_t steps = 0;
  Clock::time_point start = Clock::now();
  // Counters at the interval's start: host reads of tensor values (each a wait on a device), and
  // the device's host syncs, allocations and copies from pageable host memory, logged per step
  // (0 in a device's steady state but for the syncs of the log's own reads).
  std::uint64_t host_reads = Tensor::host_reads();
  ops::DeviceCounters counters;

  void add(const parallel::StepTimes& t, TimeShares& total) {
    total.compute += t.compute + t.param_copy + t.grad_gather;
    total.comm_exposed += t.comm_exposed;
    compute += t.compute;
    comm += t.comm_exposed;
    copy += t.param_copy;
    gather += t.grad_gather;
    ++steps;
  }
};

// The step's input samples holding NaN or Inf, by shard and index, or "" when every input is
// finite (then the training itself diverged). Only run on a non-finite step: costs nothing else.
std::string bad_inputs(const data::ShardedDataset& set, const std::vector<data::Batch>& batches) {
  std::vector<std::int64_t> bad;
  for (const data::Batch& b : batches) {
    if (b.x.dtype() != DType::F32) continue;  // u8 images cannot hold NaN
    const std::int64_t rows = b.x.dim(0), row = rows > 0 ? b.x.numel() / rows : 0;
    const float* x = b.x.data<float>();
    // A batch that does not say where its rows came from is named by its place in the epoch.
    const bool traced = b.indices.size() == static_cast<std::size_t>(rows);
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t k = 0; k < row; ++k)
        if (!std::isfinite(x[i * row + k])) {
          if (!traced) return str("row ", i, " of batch ", b.index_in_epoch, " of epoch ", b.epoch);
          bad.push_back(b.indices[static_cast<std::size_t>(i)]);
          break;
        }
  }
  return bad.empty() ? "" : set.describe_samples(bad);
}

// Checkpoints and stop requests, decided identically on every rank: one small allreduce per step
// (only when checkpoint.dir is set) combines a signal seen by any rank with rank 0's clock.
class Checkpoints {
 public:
  explicit Checkpoints(Run& run) : run_(run) {
    if (!run.config.checkpoint_dir.empty()) stop_ = std::make_unique<StopRequest>();
  }
  bool enabled() const { return stop_ != nullptr; }

  // The signal that stops the run after this step (0 = none); saves when a save is due.
  int after_step(TrainResult& result) {
    if (!enabled()) return 0;
    const Config& c = run_.config;
    const std::int64_t step = run_.state->step;
    std::int64_t due_by_time = c.checkpoint_every_minutes > 0 &&
                               seconds_since(last_save_) >= c.checkpoint_every_minutes * 60.0;
    std::vector<std::int64_t> flags = {stop_->requested(), run_.rank == 0 ? due_by_time : 0};
    run_.comm.allreduce(flags, comm::ReduceOp::Max);
    const bool due =
        flags[1] != 0 || (c.checkpoint_every_steps > 0 && step % c.checkpoint_every_steps == 0);
    // A rank that stops on another rank's signal may receive its own copy only later.
    if (flags[0] != 0) stop_->record(static_cast<int>(flags[0]));
    if (flags[0] != 0 || (due && step < run_.plan.total_steps))
      save(result, /*last=*/flags[0] != 0);
    return static_cast<int>(flags[0]);
  }
  // Every rank takes part (ZeRO-1 gathers the optimizer state); rank 0 writes; every rank
  // restarts the clock.
  // With checkpoint.async the file is written in the background: `last` (the run's final save or
  // its stop) waits for it, so the run never ends before its checkpoint is on disk. Rank 0 records
  // how long training stood still for each save.
  // Runs before every save: what the saved state must already account for (the deferred checks).
  void before_save(std::function<void()> f) { before_save_ = std::move(f); }

  void save(TrainResult& result, bool last = false) {
    if (before_save_) before_save_();
    const Config& c = run_.config;
    const auto start = Clock::now();
    trace::Span span("checkpoint", c.checkpoint_async ? "checkpoint (async)" : "checkpoint");
    // The path on every rank: the final save below is skipped on all ranks or none.
    if (c.checkpoint_async) {
      result.checkpoint =
          background_.save(*run_.state, c.checkpoint_dir, static_cast<int>(c.checkpoint_keep));
      if (last) background_.wait();
    } else {
      result.checkpoint = run_.state->save(c.checkpoint_dir, static_cast<int>(c.checkpoint_keep));
    }
    const double stall = seconds_since(start);
    result.time.checkpoint += stall;
    if (run_.rank == 0) {
      run_.line("checkpoint " + result.checkpoint +
                (c.checkpoint_async && !last ? " (writing in the background)" : ""));
      run_.record(JsonRecord()
                      .add("event", "checkpoint")
                      .add("step", run_.state->step)
                      .add("path", result.checkpoint)
                      .add("async", c.checkpoint_async)
                      .add("stall_s", stall));
    }
    last_save_ = Clock::now();
  }
  // Waits for a background write (its error is thrown here).
  void finish() { background_.wait(); }

 private:
  Run& run_;
  std::unique_ptr<StopRequest> stop_;  // without a folder, signals kill as usual
  Clock::time_point last_save_ = Clock::now();
  BackgroundCheckpoints background_;  // checkpoint.async
  std::function<void()> before_save_;
};

// The micro-step losses of one log interval, in one buffer on the engine's device: a copy per
// micro-step, one read when the interval is logged. Sums as the trainer always has: each step's
// mean over its micro-steps in double, then the interval's sum of those in double. An interval
// holds at most log_every steps (the record is due at every multiple of log_every).
// With a deferred gradient check (Note [Deferred gradient check]) every step is committed, its
// check's sum of squares copied beside its losses; settle() reads the checks once and marks the
// steps the device skipped, whose losses then count nowhere.
class IntervalLosses {
 public:
  // On a device the buffer is filled by an op: Tensor::zeros writes host memory only.
  IntervalLosses(ops::Context& ctx, std::int64_t accumulation, std::int64_t log_every,
                 bool deferred)
      : accumulation_(accumulation),
        capacity_(log_every),
        slots_(Tensor::empty({capacity_ * accumulation}, DType::F32, ctx.device())),
        skipped_(static_cast<std::size_t>(capacity_), false) {
    ops::fill(ctx, slots_, 0.0f);
    if (deferred) checks_ = Tensor::empty({capacity_}, DType::F64, ctx.device());
  }

  // The current step's micro-step `micro` lost `loss` (a one-element tensor, any device).
  void record(ops::Context& ctx, std::int64_t micro, const Tensor& loss) {
    LOCKSTEP_CHECK(steps_ < capacity_,
                   "training loop: more than log_every steps in a log interval");
    const std::int64_t at = steps_ * accumulation_ + micro;
    Tensor slot = slots_.slice(at, at + 1);
    ops::copy(ctx, loss, slot);
  }
  // The current step's check (deferred): verdict[0], its gradients' sum of squares.
  void record_check(ops::Context& ctx, const Tensor& verdict) {
    Tensor slot = checks_.slice(steps_, steps_ + 1);
    ops::copy(ctx, verdict.sub(0, {1}), slot);
  }
  // The current step counts (it was applied, or with a deferred check: it was issued).
  void commit() { ++steps_; }
  std::int64_t steps() const { return steps_; }
  // The sums of squares of the committed steps from `first` on (deferred; one read).
  std::vector<double> checks_from(std::int64_t first) const {
    if (steps_ <= first) return {};
    return checks_.slice(first, steps_).to_vector<double>();
  }
  // Committed step `index` of the interval was skipped on the device after all.
  void mark_skipped(std::int64_t index) { skipped_[static_cast<std::size_t>(index)] = true; }
  // The mean loss of the current, uncommitted step, or of committed step `index` (a read: for the
  // message of a non-finite step).
  double current() const { return read(steps_, steps_ + 1); }
  double loss_of(std::int64_t index) const { return read(index, index + 1); }
  // The sum of the applied steps' mean losses and their count; starts a new interval.
  std::pair<double, std::int64_t> take() {
    double sum = 0;
    std::int64_t applied = 0;
    if (steps_ > 0) {
      const std::vector<float> v = slots_.slice(0, steps_ * accumulation_).to_vector<float>();
      for (std::int64_t s = 0; s < steps_; ++s) {
        if (skipped_[static_cast<std::size_t>(s)]) continue;
        sum += step_mean(v, s);
        ++applied;
      }
    }
    steps_ = 0;
    std::fill(skipped_.begin(), skipped_.end(), false);
    return {sum, applied};
  }

 private:
  double step_mean(const std::vector<float>& v, std::int64_t s) const {
    double step = 0;
    for (std::int64_t m = 0; m < accumulation_; ++m)
      step += v[static_cast<std::size_t>(s * accumulation_ + m)];
    return step / static_cast<double>(accumulation_);
  }
  double read(std::int64_t first_step, std::int64_t end_step) const {
    if (end_step <= first_step) return 0;
    const std::vector<float> v =
        slots_.slice(first_step * accumulation_, end_step * accumulation_).to_vector<float>();
    double sum = 0;
    for (std::int64_t s = 0; s < end_step - first_step; ++s)
      sum += step_mean(v, s);
    return sum;
  }

  std::int64_t accumulation_, capacity_;
  Tensor slots_;
  Tensor checks_;  // f64 [log_every] on the device: deferred checks only
  std::vector<bool> skipped_;
  std::int64_t steps_ = 0;
};

// A step whose deferred check has not been read yet: what naming it needs if it was not finite.
struct UnsettledStep {
  std::int64_t step = 0, epoch = 0;
  std::string bad_input;  // bad_inputs() of its batches, taken while they were at hand
};

}  // namespace

TrainResult train_loop(Run& run) {
  const Config& c = run.config;
  TrainState& state = *run.state;
  parallel::Engine& engine = *run.engine;
  data::Loader& loader = *run.loader;
  const StepPlan& plan = run.plan;
  TrainResult result;
  Checkpoints checkpoints(run);
  const Device device = engine.context().device();
  Interval interval(device);
  // Note [Deferred gradient check]: on a device that runs asynchronously (the emulated GPU,
  // CUDA) the step never waits for its gradient check. The check's answer stays on the device
  // in `verdict`: clipping scales by it there, and the fused optimizer update skips a
  // non-finite step there (optim::Optimizer::set_verdict). The host learns which steps were
  // skipped when it settles: at each log step (reading the interval's checks with its losses),
  // before each checkpoint and at the end. Only then does a non-finite step become the warning
  // (train.nan_policy = skip) or the error it is on the CPU, naming the same step and samples,
  // and the optimizer's step count is corrected. So a device step has no host sync, at the cost
  // of an error being raised up to log.every steps after the step it names; the parameters and
  // optimizer state are the CPU's, bit for bit, skipped steps included. The CPU waits for
  // nothing by reading the check, so it keeps the immediate answer.
  const bool deferred = engine.context().backend().runtime() != nullptr;
  IntervalLosses losses(*run.ctx, plan.accumulation, c.log_every, deferred);
  Tensor verdict;                  // deferred: the current step's, f64 [2] on the device
  std::int64_t verdict_taken = 0;  // skipped steps counted on the host since the last close
  std::int64_t settled = 0;        // the interval's steps whose checks have been read
  std::vector<UnsettledStep> unsettled;
  if (deferred) {
    verdict = optim::make_verdict(device);
    run.optimizer->set_verdict(verdict);
  }
  loader.reset_data_wait();
  const auto run_start = Clock::now();
  const std::int64_t start_epoch = state.position.epoch;
  const std::int64_t start_step_in_epoch = state.position.batch_in_epoch / plan.accumulation;
  bool stopping = false;
  // The global gradient norm costs a multiply-add per gradient over the finiteness check: taken
  // when clipping needs it, or for log.tensorboard's train/grad_norm.
  const bool with_norm = c.optim_clip_norm > 0 || !c.log_tensorboard.empty();
  std::vector<data::Batch> batches;  // the current step's micro-batches

  std::int64_t evaluated_at = -1;  // the step of the last evaluation (one per step at most)
  auto evaluate_now = [&](std::int64_t epoch) {
    if (evaluated_at == state.step) return;
    evaluated_at = state.step;
    auto eval_start = Clock::now();
    trace::Span span("eval", "evaluation");
    const std::uint64_t reads_before = Tensor::host_reads();
    const ops::DeviceCounters counters_before = ops::device_counters(device);
    EvalResult ev = evaluate(run, *run.test_data());
    // Nor are its reads, syncs, allocations and copies the steps': shift the interval's counters
    // past them.
    interval.host_reads += Tensor::host_reads() - reads_before;
    const ops::DeviceCounters spent = counters_since(device, counters_before);
    interval.counters.host_syncs += spent.host_syncs;
    interval.counters.pageable_copies += spent.pageable_copies;
    interval.counters.device_mallocs += spent.device_mallocs;
    result.test_accuracy = ev.accuracy;
    result.test_loss = ev.loss;
    JsonRecord record;
    record.add("event", "eval").add("epoch", epoch).add("step", state.step);
    if (run.test_tokens) {
      // A language model: loss per token, perplexity, and next-token accuracy.
      run.line(str("step ", state.step, ": val_loss ", ev.loss, " val_perplexity ",
                   std::exp(ev.loss), " next-token accuracy ", ev.accuracy, " (", ev.samples,
                   " windows)"));
      record.add("val_loss", ev.loss)
          .add("val_perplexity", std::exp(ev.loss))
          .add("val_token_accuracy", ev.accuracy);
    } else {
      run.line(str("epoch ", epoch, ": test_loss ", ev.loss, " test_accuracy ", ev.accuracy, " (",
                   ev.samples, " samples)"));
      record.add("test_loss", ev.loss).add("test_accuracy", ev.accuracy);
    }
    run.record(record);
    // Evaluation time is not training time: shift the interval's start past it.
    interval.start += Clock::now() - eval_start;
    result.time.evaluation += seconds_since(eval_start);
  };
  if (run.unigram_nats > 0) {
    run.line(str("unigram baseline: ", run.unigram_nats, " nats/token (perplexity ",
                 std::exp(run.unigram_nats),
                 "), the loss of predicting each token by its frequency"));
    run.record(JsonRecord().add("event", "baseline").add("unigram_loss", run.unigram_nats));
  }

  // A step whose gradients are not finite: an error naming its bad input, else an error or (with
  // train.nan_policy = skip) a warning. `found_at`: the step at which a deferred check was read
  // (0: at once). Every rank is here for the same steps (the averaged gradients, and so the
  // checks, are the same everywhere), so the ranks agree on whose data it was.
  auto non_finite_step = [&](std::int64_t step, std::int64_t epoch, std::string bad, double loss,
                             std::int64_t found_at) {
    // Bad data is not a learning-rate problem: name the samples. (Token ids are integers: only
    // image inputs can hold NaN.)
    if (c.dist_sync && run.world > 1) {
      std::vector<std::int64_t> holder = {bad.empty() ? -1 : run.rank};
      run.comm.allreduce(holder, comm::ReduceOp::Max);
      if (bad.empty() && holder[0] >= 0) bad = str("rank ", holder[0], "'s batch (named there)");
    }
    const std::string found =
        found_at > 0 ? str("; found at step ", found_at, ": on ", device.str(),
                           " the gradient check is read once per log interval (log.every)")
                     : "";
    LOCKSTEP_CHECK_HINT(c.train_nan_policy == "skip" || bad.empty(),
                        "clean the source data and regenerate the shards with lockstep-shard, "
                        "or set train.nan_policy = skip to skip such steps",
                        "bad data at step ", step, " (epoch ", epoch, ", rank ", run.rank,
                        "): non-finite input values in ", bad, found);
    LOCKSTEP_CHECK_HINT(c.train_nan_policy == "skip",
                        "lower optim.lr, set optim.clip_norm, or train.nan_policy = skip",
                        "non-finite loss or gradient at step ", step, " (epoch ", epoch,
                        ", loss on rank ", run.rank, ": ", loss, ")", found);
    ++result.skipped_steps;
    run.line(str("warning: step ", step, " skipped: ",
                 bad.empty() ? "non-finite loss or gradient" : "non-finite input in " + bad));
  };
  // Note [Deferred gradient check]: reads the checks of the steps since the last settle (one
  // read), reports the non-finite ones as the CPU would have at their step, and takes the
  // device's skips off the optimizer's step count.
  auto settle = [&] {
    if (!deferred || unsettled.empty()) return;
    const std::vector<double> checks = losses.checks_from(settled);
    std::int64_t skipped = 0;
    for (std::size_t i = 0; i < unsettled.size(); ++i) {
      const auto index = settled + static_cast<std::int64_t>(i);
      if (std::isfinite(checks[i])) {
        if (with_norm) interval.grad_norm += std::sqrt(checks[i]);
        continue;
      }
      losses.mark_skipped(index);
      ++skipped;
      non_finite_step(unsettled[i].step, unsettled[i].epoch, unsettled[i].bad_input,
                      losses.loss_of(index), state.step);
    }
    if (skipped > 0) {
      run.optimizer->set_steps(run.optimizer->steps() - skipped);
      verdict_taken += skipped;
    }
    settled = losses.steps();
    unsettled.clear();
  };
  checkpoints.before_save(settle);

  for (std::int64_t epoch = start_epoch;
       epoch < c.train_epochs && state.step < plan.total_steps && !stopping; ++epoch) {
    loader.start_epoch(epoch);
    const std::int64_t first_step = epoch == start_epoch ? start_step_in_epoch : 0;
    for (std::int64_t s = first_step; s < plan.steps_per_epoch && state.step < plan.total_steps;
         ++s) {
      // ---- gradients of one step: `accumulation` micro-batches, averaged over ranks
      run.comm.set_step(state.step + 1);      // named in hung-collective reports (dist.timeout_s)
      run.trace.before_step(state.step + 1);  // log.trace's window (collective at its edges)
      const std::int64_t step_begin = trace::on() ? trace::now_ns() : 0;
      engine.begin_step();
      batches.clear();  // kept until the step is known finite, to name bad input data
      for (std::int64_t micro = 0; micro < plan.accumulation; ++micro) {
        std::optional<data::Batch> batch;
        {
          trace::Span wait("data", "data wait");
          batch = loader.next();
        }
        LOCKSTEP_CHECK(batch.has_value(), "loader ended epoch ", epoch, " early at step ", s);
        // The mean over all of the step's label rows, on every rank and micro-step alike.
        const float loss_scale = 1.0f / static_cast<float>(batch->y.numel() * plan.accumulation);
        losses.record(engine.context(), micro,
                      engine.forward_backward(batch->x, batch->y, loss_scale,
                                              micro + 1 == plan.accumulation));
        batches.push_back(std::move(*batch));
      }
      engine.finish_gradients();
      ++state.step;
      state.position = {epoch, (s + 1) * plan.accumulation};

      // ---- the update, unless the step is not finite
      const double lr = run.schedule->lr_at(state.step - 1);
      // The same answer on every rank: after an allreduce every rank holds the same gradients
      // (one pass over the flat gradients, one readback); under ZeRO-1 the engine adds its
      // shard's partial sums over the ranks (the global norm when clipping needs it).
      const auto update_start = Clock::now();
      trace::Span update_span("optimizer", "gradient check + update");
      if (deferred) {
        // Note [Deferred gradient check]: queued, never read here.
        engine.queue_gradient_check(*run.flat, with_norm, verdict, verdict_taken);
        verdict_taken = 0;
        if (c.optim_clip_norm > 0)
          optim::clip_grad_norm(*run.ctx, *run.flat, static_cast<float>(c.optim_clip_norm),
                                verdict);  // the max norm rounded to f32, as the host path has it
        run.optimizer->set_lr(static_cast<float>(lr));
        engine.step(*run.optimizer);  // does nothing on the device if the step is not finite
        result.time.optimizer += seconds_since(update_start);
        update_span.end();
        losses.record_check(engine.context(), verdict);
        losses.commit();
        interval.add(engine.times(), result.time);
        // The step's bad input, if any, named while its batches are at hand (a scan of f32
        // inputs only: u8 images and token ids cannot be non-finite).
        unsettled.push_back(
            {state.step, epoch, run.train_set ? bad_inputs(*run.train_set, batches) : ""});
      } else if (const optim::GradientCheck grads = engine.check_gradients(*run.flat, with_norm);
                 !grads.finite()) {
        non_finite_step(state.step, epoch, run.train_set ? bad_inputs(*run.train_set, batches) : "",
                        losses.current(), 0);
      } else {
        if (c.optim_clip_norm > 0)
          optim::clip_grad_norm(*run.ctx, *run.flat, static_cast<float>(c.optim_clip_norm),
                                grads.norm());
        run.optimizer->set_lr(static_cast<float>(lr));
        engine.step(*run.optimizer);  // ZeRO-1: the shard's update, then parameters allgathered
        result.time.optimizer += seconds_since(update_start);
        update_span.end();
        losses.commit();
        interval.add(engine.times(), result.time);
        if (with_norm) interval.grad_norm += grads.norm();
      }

      // ---- the log record: collective at the same steps on every rank (mean loss over ranks)
      if ((state.step % c.log_every == 0 || state.step == plan.total_steps) && interval.steps > 0) {
        const double n = static_cast<double>(interval.steps);
        // Before the loss and the checks are read: those reads are the interval's, not a step's.
        const double reads = static_cast<double>(Tensor::host_reads() - interval.host_reads) / n;
        const ops::DeviceCounters spent = counters_since(device, interval.counters);
        const double syncs = static_cast<double>(spent.host_syncs) / n;
        const double mallocs = static_cast<double>(spent.device_mallocs) / n;
        const double copies = static_cast<double>(spent.pageable_copies) / n;
        settle();
        settled = 0;
        const auto [loss_sum, applied] = losses.take();
        // The mean over the steps applied (a deferred check counts skipped steps in the interval's
        // times, not in its loss); the same on every rank, since the checks are.
        const double steps_applied = static_cast<double>(applied);
        // Every step of the interval skipped on the device: no record, as on the CPU (and on
        // every rank alike).
        if (applied > 0) {
          std::vector<double> v = {loss_sum / steps_applied};
          run.comm.allreduce(v, comm::ReduceOp::Sum);
          const double loss = v[0] / run.world;  // the same on every rank, so is what follows
          if (!std::isfinite(loss)) {
            LOCKSTEP_CHECK_HINT(c.train_nan_policy == "skip",
                                "lower optim.lr, set optim.clip_norm, or train.nan_policy = skip",
                                "non-finite training loss in the steps up to ", state.step,
                                " (epoch ", epoch, ") while every gradient was finite");
            run.line(str("warning: non-finite training loss in the steps up to ", state.step,
                         " with finite gradients"));
          }
          const double elapsed = seconds_since(interval.start);
          const double sps = n * static_cast<double>(plan.global_batch) / elapsed;
          result.final_train_loss = loss;
          if (run.logs) run.progress->step(state.step, epoch, loss, lr, sps);
          JsonRecord record;
          record.add("step", state.step)
              .add("epoch", epoch)
              .add("loss", loss)
              .add("lr", lr)
              .add("samples_per_s", sps);
          if (with_norm) record.add("grad_norm", interval.grad_norm / steps_applied);
          run.record(record.add("step_time_s", elapsed / n)
                         .add("compute_s", interval.compute / n)
                         .add("comm_exposed_s", interval.comm / n)
                         .add("param_copy_s", interval.copy / n)
                         .add("grad_gather_s", interval.gather / n)
                         .add("data_wait_s", loader.data_wait_seconds() / n)
                         .add("host_reads_per_step", reads)
                         .add("host_syncs_per_step", syncs)
                         .add("device_mallocs_per_step", mallocs)
                         .add("pageable_copies_per_step", copies));
        }
        interval = Interval(device);
        result.time.data_wait += loader.data_wait_seconds();
        loader.reset_data_wait();
      }

      // ---- evaluation every train.eval_every_steps (as well as after each epoch)
      if (run.test_data() && c.train_eval && c.train_eval_every_steps > 0 &&
          state.step % c.train_eval_every_steps == 0)
        evaluate_now(epoch);

      // ---- checkpoint when due; stop (with a checkpoint) on a signal
      const int signal = checkpoints.after_step(result);
      if (step_begin != 0)
        trace::complete("step", str("step ", state.step), step_begin, trace::now_ns());
      // The device's spans of the window's last steps are host functions it has yet to reach
      // (Note [Deferred gradient check]: no step waits for it): drain it once, as the window ends.
      if (deferred && run.trace.closes_at(state.step)) engine.context().synchronize();
      if (run.trace.after_step(state.step)) run.line(run.trace.note());
      if (signal != 0) {
        run.line(str("stopping at step ", state.step, " on ", StopRequest::signal_name(signal),
                     "; resume with --train.resume=auto"));
        stopping = result.stopped_by_signal = true;
        break;
      }
    }
    if (stopping) break;
    result.epochs = epoch + 1;
    if (run.test_data() && c.train_eval) evaluate_now(epoch);
  }
  settle();  // the steps since the last log record, for the result's skipped_steps
  if (deferred && run.trace.open()) engine.context().synchronize();  // as at the window's end above
  if (const std::string note = run.trace.finish(state.step); !note.empty()) run.line(note);
  run.progress->finish();
  result.steps = state.step;
  if (checkpoints.enabled() && !stopping &&
      result.checkpoint != checkpoint_path(c.checkpoint_dir, state.step))
    checkpoints.save(result, /*last=*/true);
  checkpoints.finish();
  result.time.data_wait += loader.data_wait_seconds();  // since the last log record
  result.wall_seconds = seconds_since(run_start);
  result.samples_per_second =
      static_cast<double>(state.step * plan.global_batch) / result.wall_seconds;
  return result;
}

}  // namespace lockstep::train
