#include "lockstep/parallel/ddp.hpp"

#include <chrono>

#include "lockstep/core/clock.hpp"
#include "lockstep/core/trace.hpp"
#include "lockstep/ops/backend.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::parallel {

void prepare_input(ops::Context& ctx, const Tensor& x, const InputNormalization& norm,
                   Tensor& out) {
  if (x.dtype() == DType::I32) {
    // Token ids index an embedding: no normalisation, only the move to the device.
    out = x.device() == ctx.device() ? x : x.to(ctx.device());
    return;
  }
  if (!out.defined() || out.shape() != x.shape() || out.device() != ctx.device())
    out = Tensor::empty(x.shape(), DType::F32, ctx.device());
  if (ctx.device().is_cpu() || x.device() == ctx.device()) {
    ops::normalize_input(ctx, x, norm.mean, norm.stddev, out);
  } else {
    Tensor staged = x.to(ctx.device());
    ops::normalize_input(ctx, staged, norm.mean, norm.stddev, out);
  }
}

DdpEngine::DdpEngine(ops::Context& ctx, nn::Model& model, comm::Communicator& comm,
                     DdpOptions options, std::shared_ptr<optim::FlatParams> flat)
    : ctx_(ctx),
      model_(model),
      comm_(comm),
      options_(std::move(options)),
      loss_(nn::SoftmaxCrossEntropy::for_training(model, options_.label_smoothing)) {
  LOCKSTEP_CHECK_HINT(!options_.zero || options_.sync, "set dist.sync = true, or dist.zero = 0",
                      "dist.zero = 1 needs gradient communication, but dist.sync = false");
  const bool zero = options_.zero && comm_.size() > 1;
  if (!flat) {
    optim::BucketLimits limits = bucket_limits(options_.reducer);
    if (zero) limits.shards = comm_.size();
    flat = std::make_shared<optim::FlatParams>(model_.parameters(), limits);
  }
  LOCKSTEP_CHECK(flat->parameters() == model_.parameters(),
                 "DDP: the flat parameters given are not the model's");
  shard_ = flat->shard(zero ? comm_.rank() : 0, zero ? comm_.size() : 1);
  broadcast_state(comm_, *flat, model_.buffers());
  reducer_ =
      std::make_unique<Reducer>(ctx_, comm_, std::move(flat), shard_, options_.reducer.grad_dtype);
  // The average over ranks is taken by scaling the loss gradient by 1 / size before backward
  // (forward_backward), so the allreduce's sum is already the mean: no pass over the whole
  // gradient buffer after it, as Horovod's prescale. Gradients are linear in the loss gradient,
  // so this differs from dividing after the sum by rounding only (not at all for power-of-two
  // sizes).
  reducer_->set_prescaled(averaging_scale() != 1.0f);
  model_.set_grad_ready_hook([this](nn::Parameter& p) { reducer_->on_grad_ready(p); });
}

namespace {
// The sections of a step DdpEngine times with events on a device.
enum DeviceSection { kCompute, kCommWait, kDeviceSections };
}  // namespace

void DdpEngine::begin_step() {
  times_ = {};
  // The device times of the steps the device has finished since the last call (in the trainer
  // the previous step: its gradient check has already waited for it), so reading them never waits.
  if (timer_) {
    const std::vector<double> seconds = timer_->collect();
    times_.compute = seconds[kCompute];
    times_.comm_exposed = seconds[kCommWait];
  }
  reducer_->zero_grad();
  if (options_.sync && comm_.size() > 1 && !model_.buffers().empty()) {
    auto start = std::chrono::steady_clock::now();
    broadcast_state(comm_, {}, model_.buffers());
    times_.comm_exposed += seconds_since(start);
  }
}

Tensor DdpEngine::forward_backward(const Tensor& x, const Tensor& y, float loss_scale,
                                   bool last_micro) {
  auto start = std::chrono::steady_clock::now();
  Tensor x_in = x, y_in = y;
  const bool device = ctx_.backend().runtime() != nullptr;
  if (device) {
    if (!timer_) timer_ = std::make_unique<ops::SectionTimer>(ctx_, kDeviceSections);
    timer_->begin(kCompute);
  }
  // On a device the batch goes through the stager's pinned slots on its copy stream, overlapping
  // the previous micro-step's compute; the compute stream waits for the copy on the device.
  if (device && x.device().is_cpu() && y.device().is_cpu()) {
    if (!stager_) stager_ = std::make_unique<ops::InputStager>(ctx_);
    std::vector<Tensor> staged = stager_->stage({x, y});
    x_in = staged[0];
    y_in = staged[1];
  }
  prepare_input(ctx_, x_in, options_.input, input_);
  // Token labels [B, T] are one row per position, as the logits [B*T, V].
  Tensor labels = y_in.device() == ctx_.device() ? y_in : y_in.to(ctx_.device());
  if (labels.ndim() > 1) labels = labels.view({labels.numel()});
  reducer_->prepare_for_backward(last_micro && options_.sync && comm_.size() > 1);
  // log.trace: host spans; on a device also the compute stream's (the host only queues).
  trace::Span forward("compute", "forward");
  ops::StreamTraceSpan device_forward(ctx_, "device compute", "forward");
  // A GPT's loss is fused into its LM head (Logits::Fused): the head's gradients are made here,
  // in the forward span, which is why the loss's gradient scale is given to forward_loss.
  Tensor loss = model_.forward_loss(ctx_, input_, labels, loss_, loss_scale * averaging_scale());
  device_forward.end();
  forward.end();
  trace::Span backward("compute", "backward");
  ops::StreamTraceSpan device_backward(ctx_, "device compute", "backward");
  model_.backward_loss(ctx_);
  device_backward.end();
  backward.end();
  if (timer_) {
    timer_->end(kCompute);  // the host only queued the work: the events time it
    return loss;
  }
  times_.compute += seconds_since(start);
  return loss;  // not read: the trainer reads a log interval's losses at once
}

float DdpEngine::averaging_scale() const {
  // Every micro-step of a step that synchronises contributes to the averaged sum.
  return options_.sync && comm_.size() > 1 ? 1.0f / static_cast<float>(comm_.size()) : 1.0f;
}

void DdpEngine::finish_gradients() {
  if (timer_) {
    // How long the compute stream stands still after backward until the gradients are complete.
    timer_->begin(kCommWait);
    ops::StreamTraceSpan device_wait(ctx_, "device compute", "wait for gradients");
    reducer_->finish();
    device_wait.end();
    timer_->end(kCommWait);
    return;
  }
  trace::Span wait("compute", "wait for gradients");
  times_.comm_exposed += reducer_->finish();
}

optim::GradientCheck DdpEngine::check_gradients(optim::FlatParams& flat, bool with_norm) {
  if (!shard_.sharded()) return optim::check_gradients(ctx_, flat, with_norm);
  // The shard's partial sums (one pass and readback per bucket), then one small allreduce: the
  // squares add up to the global sum of squares, and a NaN or Inf anywhere makes every rank's
  // total non-finite (NaN + x = NaN, Inf - Inf = NaN), so all ranks skip or clip alike.
  const ops::FlatSums what = with_norm ? ops::FlatSums::Squares : ops::FlatSums::FinitenessOnly;
  std::vector<double> total = {0.0};
  for (const ops::FlatRange& range : shard_.ranges) {
    flat.grad_sum_squares(ctx_, what, range);
    total[0] += flat.read_grad_sum_squares(ctx_);
  }
  auto start = std::chrono::steady_clock::now();
  comm_.allreduce(total, comm::ReduceOp::Sum);
  times_.comm_exposed += seconds_since(start);
  return optim::GradientCheck{total[0], with_norm};
}

void DdpEngine::queue_gradient_check(optim::FlatParams& flat, bool with_norm, Tensor& verdict,
                                     std::int64_t taken) {
  if (!shard_.sharded()) return optim::queue_gradient_check(ctx_, flat, with_norm, verdict, taken);
  // As check_gradients above, on the device: the shard's partial sums added in range order into
  // verdict[0] (from 0, as the host adds them), then one small allreduce of it, which the compute
  // stream waits for without the host.
  const ops::FlatSums what = with_norm ? ops::FlatSums::Squares : ops::FlatSums::FinitenessOnly;
  bool first = true;
  for (const ops::FlatRange& range : shard_.ranges) {
    flat.grad_sum_squares(ctx_, what, range);
    ops::verdict_add(ctx_, flat.grad_sum_squares_total(), verdict, first);
    first = false;
  }
  auto start = std::chrono::steady_clock::now();
  comm_.allreduce_async(verdict.sub(0, {1}), comm::ReduceOp::Sum)->wait();
  times_.comm_exposed += seconds_since(start);
  ops::verdict_close(ctx_, verdict, taken);
}

void DdpEngine::step(optim::Optimizer& optimizer) {
  if (!shard_.sharded()) return optimizer.step(ctx_);
  const optim::FlatShard& own = optimizer.shard();
  LOCKSTEP_CHECK_HINT(own.count == shard_.count && own.rank == shard_.rank,
                      "make the optimizer with the engine's shard() (ZeRO-1)",
                      "DDP: the optimizer holds shard ", own.rank, " of ", own.count,
                      " but the engine's is ", shard_.rank, " of ", shard_.count);
  optimizer.step(ctx_);
  // Every rank's updated block of each bucket to every rank, in place (the input is this rank's
  // block of the output). Before the next forward, and before a checkpoint or evaluation reads
  // the parameters.
  auto start = std::chrono::steady_clock::now();
  optim::FlatParams& flat = *reducer_->flat_params();
  // One group (ncclGroupStart/End on a GPU): the buckets' allgathers launch and complete together.
  std::vector<comm::WorkPtr> work;
  {
    comm::Group group(comm_);
    for (std::size_t b = 0; b < shard_.ranges.size(); ++b) {
      const ops::FlatRange& r = shard_.ranges[b];
      work.push_back(comm_.allgather_async(flat.values().sub(r.begin, {r.end - r.begin}),
                                           flat.value_bucket(b)));
    }
  }
  for (auto& w : work)
    w->wait();
  times_.comm_exposed += seconds_since(start);
}

}  // namespace lockstep::parallel
