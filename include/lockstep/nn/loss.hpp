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

// Rows of logits the fused loss (Logits::Fused) makes at a time, unless told: as many as fit
// kLossChunkBytes of f32 logits, in multiples of 64 rows (at least 64). Each chunk costs a fixed
// pass over the whole table besides its rows' work (the logits GEMM and dh read wte, the table's
// gradient is read and written: 4 x Vp x C x 4 bytes, 616 MB for GPT-2), so fewer, larger chunks
// are faster and smaller ones hold less: measured on the CPU for gpt2-124m's head at 1 x 1024
// tokens, 512 rows cost 2% over one chunk, 320 rows 10%, 256 rows 22% (docs/GPT.md, "The chunked
// classifier and loss"). GPT-2's 50304 columns give 512 rows (98 MiB, where 8 x 1024 tokens'
// logits are 1.5 GiB); a small vocabulary's logits fit one chunk (gpt-mini's 2048 x 256: 2 MiB),
// so its step runs the GEMMs of the unchunked loss.
inline constexpr std::int64_t kLossChunkBytes = std::int64_t{100} << 20;
inline constexpr std::int64_t kLossChunkAuto = -1;  // chunk_rows: loss_chunk_rows(columns)
std::int64_t loss_chunk_rows(std::int64_t columns);

class SoftmaxCrossEntropy {
 public:
  // What the loss does with the logits. Keep: leave them (evaluation counts the correct rows
  // from them afterwards); the softmax and dlogits get buffers of their own. Overwrite: write the
  // softmax over the logits and then dlogits over the softmax, so one [N, C] buffer serves all
  // three (Model::logits_overwritable says when that is safe). The values are the same bit for
  // bit; only the storage differs. backward then hands its result on and keeps no handle, so the
  // layer that made the logits reuses its buffer on the next forward.
  // Fused: the logits are never made whole. The model's last layer computes the loss with its
  // own classifier, chunk_rows rows at a time, and the gradients with it (Module::forward_loss,
  // run by Model::forward_loss and backward_loss): the training loss of a GPT, whose [N*T, V]
  // logits are the largest tensor of its step. forward and backward here are then refused.
  enum class Logits { Keep, Overwrite, Fused };

  explicit SoftmaxCrossEntropy(float label_smoothing = 0.0f, Logits logits = Logits::Keep,
                               std::int64_t chunk_rows = kLossChunkAuto);
  // The loss of a training step of `model`, whose logits nobody reads after the loss: Fused
  // where its last layer fuses the loss (Model::fuses_loss), else Overwrite where the model
  // allows it (Model::logits_overwritable), Keep otherwise.
  static SoftmaxCrossEntropy for_training(const Model& model, float label_smoothing = 0.0f);

  Tensor forward(ops::Context& ctx, const Tensor& logits, const Tensor& labels);
  Tensor backward(ops::Context& ctx, float scale);
  Logits logits_mode() const { return logits_; }
  float label_smoothing() const { return label_smoothing_; }
  // Fused: rows at a time; 0: all at once; kLossChunkAuto: loss_chunk_rows of the vocabulary.
  std::int64_t chunk_rows() const { return chunk_rows_; }
  // Softmax of the last forward's logits ([N, C]); under Overwrite, until backward.
  const Tensor& probabilities() const { return probs_; }

 private:
  float label_smoothing_;
  Logits logits_;
  std::int64_t chunk_rows_;
  Tensor labels_;
  Tensor probs_, loss_, dlogits_;
  bool have_forward_ = false;
};

}  // namespace lockstep::nn
