#include "lockstep/nn/loss.hpp"

#include <algorithm>

#include "buffers.hpp"
#include "lockstep/nn/model.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::nn {

SoftmaxCrossEntropy::SoftmaxCrossEntropy(float label_smoothing, Logits logits,
                                         std::int64_t chunk_rows)
    : label_smoothing_(label_smoothing), logits_(logits), chunk_rows_(chunk_rows) {
  LOCKSTEP_CHECK(label_smoothing >= 0.0f && label_smoothing < 1.0f,
                 "softmax cross-entropy: label_smoothing must be in [0, 1), got ", label_smoothing);
  LOCKSTEP_CHECK(chunk_rows >= 0 || chunk_rows == kLossChunkAuto,
                 "softmax cross-entropy: chunk_rows must be >= 0 (0: all rows) or kLossChunkAuto, "
                 "got ",
                 chunk_rows);
}

std::int64_t loss_chunk_rows(std::int64_t columns) {
  const std::int64_t fit = kLossChunkBytes / (std::max<std::int64_t>(columns, 1) * 4);
  return std::max<std::int64_t>(64, fit / 64 * 64);
}

SoftmaxCrossEntropy SoftmaxCrossEntropy::for_training(const Model& model, float label_smoothing) {
  if (model.fuses_loss()) return SoftmaxCrossEntropy(label_smoothing, Logits::Fused);
  return SoftmaxCrossEntropy(label_smoothing,
                             model.logits_overwritable() ? Logits::Overwrite : Logits::Keep);
}

namespace {
void refuse_fused(SoftmaxCrossEntropy::Logits mode, const char* what) {
  LOCKSTEP_CHECK_HINT(mode != SoftmaxCrossEntropy::Logits::Fused,
                      "run the step with Model::forward_loss and backward_loss",
                      "softmax cross-entropy: ", what,
                      " of a Fused loss, which the model's last layer computes");
}
}  // namespace

Tensor SoftmaxCrossEntropy::forward(ops::Context& ctx, const Tensor& logits, const Tensor& labels) {
  refuse_fused(logits_, "forward");
  LOCKSTEP_CHECK(logits.ndim() == 2, "softmax cross-entropy expects logits [N, C], got ",
                 logits.describe());
  if (logits_ == Logits::Overwrite) probs_ = logits;  // the op allows probs == logits (ops.hpp)
  Tensor& probs = logits_ == Logits::Overwrite
                      ? probs_
                      : detail::reuse_buffer(probs_, logits.shape(), logits.device());
  Tensor& loss = detail::reuse_buffer(loss_, {1}, logits.device());
  ops::softmax_xent_forward(ctx, logits, labels, probs, loss, label_smoothing_);
  labels_ = labels;
  have_forward_ = true;
  return loss;
}

Tensor SoftmaxCrossEntropy::backward(ops::Context& ctx, float scale) {
  refuse_fused(logits_, "backward");
  LOCKSTEP_CHECK_HINT(have_forward_, "call forward before each backward",
                      "softmax cross-entropy: backward without forward");
  have_forward_ = false;
  if (logits_ == Logits::Overwrite) {
    Tensor d = std::move(probs_);  // dlogits over the softmax (the op allows it), handed on
    probs_ = Tensor();
    ops::softmax_xent_backward(ctx, d, labels_, scale, d, label_smoothing_);
    labels_ = Tensor();
    return d;
  }
  Tensor& dlogits = detail::reuse_buffer(dlogits_, probs_.shape(), probs_.device());
  ops::softmax_xent_backward(ctx, probs_, labels_, scale, dlogits, label_smoothing_);
  labels_ = Tensor();
  return dlogits;
}

}  // namespace lockstep::nn
