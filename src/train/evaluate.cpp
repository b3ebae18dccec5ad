#include "lockstep/train/evaluate.hpp"

#include <vector>

#include "lockstep/nn/loss.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::train {

EvalResult evaluate(Run& run, const data::Dataset& set) {
  ops::Context& ctx = *run.ctx;
  nn::Model& model = *run.model;
  comm::Communicator& comm = run.comm;
  const std::int64_t batch = run.eval_batch();
  model.set_training(false);
  std::vector<std::int64_t> mine;
  for (std::int64_t i = comm.rank(); i < set.size(); i += comm.size())
    mine.push_back(i);
  nn::SoftmaxCrossEntropy loss_fn;
  double loss_sum = 0;
  std::int64_t correct = 0, rows = 0;
  Tensor x, y, input;
  for (std::size_t begin = 0; begin < mine.size(); begin += static_cast<std::size_t>(batch)) {
    std::size_t end = std::min(mine.size(), begin + static_cast<std::size_t>(batch));
    set.gather(std::span<const std::int64_t>(mine.data() + begin, end - begin), x, y);
    parallel::prepare_input(ctx, x, run.norm, input);
    Tensor labels = y.device() == ctx.device() ? y : y.to(ctx.device());
    if (labels.ndim() > 1) labels = labels.view({labels.numel()});  // token labels [B, T]
    Tensor logits = model.forward(ctx, input);
    Tensor loss = loss_fn.forward(ctx, logits, labels);
    // Weighted by label rows (one per sample, or one per position for token windows).
    loss_sum += static_cast<double>(loss.item()) * static_cast<double>(labels.numel());
    rows += labels.numel();
    correct += ops::count_correct(ctx, logits, labels);
  }
  model.set_training(true);
  std::vector<double> sums = {loss_sum, static_cast<double>(correct),
                              static_cast<double>(mine.size()), static_cast<double>(rows)};
  comm.allreduce(sums, comm::ReduceOp::Sum);
  EvalResult r;
  r.samples = static_cast<std::int64_t>(sums[2]);
  if (sums[3] > 0) {
    r.loss = sums[0] / sums[3];
    r.accuracy = sums[1] / sums[3];
  }
  return r;
}

}  // namespace lockstep::train
