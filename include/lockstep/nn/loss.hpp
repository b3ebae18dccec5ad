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

class SoftmaxCrossEntropy {
 public:
  explicit SoftmaxCrossEntropy(float label_smoothing = 0.0f);

  Tensor forward(ops::Context& ctx, const Tensor& logits, const Tensor& labels);
  Tensor backward(ops::Context& ctx, float scale);
  // Softmax of the last forward's logits ([N, C]).
  const Tensor& probabilities() const { return probs_; }

 private:
  float label_smoothing_;
  Tensor labels_;
  Tensor probs_, loss_, dlogits_;
  bool have_forward_ = false;
};

}  // namespace lockstep::nn
