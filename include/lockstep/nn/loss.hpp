// Softmax cross-entropy over logits [N, C] and i32 labels [N]. forward returns the mean loss over
// the N local rows (a [1] tensor); backward(scale) returns dlogits = (softmax - onehot) * scale,
// so the caller says what the mean is over: 1/N for this batch alone, 1/global_batch when
// several replicas' gradients are summed (DataParallel) -- DDP, which averages by the world
// size afterwards, passes 1/local_batch.
// Label smoothing eps (torch.nn.CrossEntropyLoss(label_smoothing=eps), Szegedy et al. 2016)
// trains against (1 - eps) onehot + eps / C; 0, the default, is the plain loss bit for bit.
#pragma once

#include "lockstep/core/tensor.hpp"
#include "lockstep/ops/context.hpp"

namespace lockstep::nn {

class Model;

class SoftmaxCrossEntropy {
 public:
  // What forward may do with the logits it is given. Keep: leave them (evaluation counts the
  // correct rows from them afterwards); the softmax and dlogits get buffers of their own.
  // Overwrite: write the softmax over the logits and then dlogits over the softmax, so one [N, C]
  // buffer serves all three (Model::logits_overwritable says when that is safe). The values are
  // the same bit for bit; only the storage differs. backward then hands its result on and keeps
  // no handle, so the layer that made the logits reuses its buffer on the next forward.
  enum class Logits { Keep, Overwrite };

  explicit SoftmaxCrossEntropy(float label_smoothing = 0.0f, Logits logits = Logits::Keep);
  // The loss of a training step of `model`, whose logits nobody reads after the loss: Overwrite
  // where the model allows it (Model::logits_overwritable), Keep otherwise.
  static SoftmaxCrossEntropy for_training(const Model& model, float label_smoothing = 0.0f);

  Tensor forward(ops::Context& ctx, const Tensor& logits, const Tensor& labels);
  Tensor backward(ops::Context& ctx, float scale);
  Logits logits_mode() const { return logits_; }
  // Softmax of the last forward's logits ([N, C]); under Overwrite, until backward.
  const Tensor& probabilities() const { return probs_; }

 private:
  float label_smoothing_;
  Logits logits_;
  Tensor labels_;
  Tensor probs_, loss_, dlogits_;
  bool have_forward_ = false;
};

}  // namespace lockstep::nn
