// Module: a layer with explicit forward/backward over ops/. forward caches what backward needs;
// backward takes dL/dy, accumulates dL/dparam into each Parameter's grad (+=) and returns dL/dx.
// Parameters and buffers have stable dotted names ("3.weight", "5.bn1.running_mean") by which
// checkpoints, the reducer and the DataParallel baseline address them.
// Tensors a module returns (outputs, dL/dx) live in buffers that are reused once nobody holds
// them: the context's transients (ops::Context::transient, shared by all layers, so a step holds
// only what is live at once) or buffers of the module's own (src/nn/buffers.hpp). Holding on to
// one is safe but costs a fresh allocation. backward consumes the input cached by forward: one
// backward per forward, in training and evaluation mode alike. A layer of one's own is a subclass
// (see docs/ARCHITECTURE.md, "How to add a layer"); it trains under DDP and ZeRO-1 as it is, and
// under DataParallel once it implements clone_structure.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/core/tensor.hpp"
#include "lockstep/ops/context.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::nn {

struct Parameter {
  std::string name;
  Tensor value;
  Tensor grad;  // same shape; may be a view into a reducer bucket
  // Set by a layer whose backward writes this whole gradient and can overwrite it instead of
  // adding to it (a linear's weight, through its GEMM's beta, and bias). zero_grad then does not
  // fill such a gradient but marks it stale, and the layer's next backward overwrites it: one pass
  // over the gradients fewer, and no read of the old values by the weight-gradient GEMM (what
  // PyTorch's zero_grad(set_to_none=True) saves). Everything else reads gradients only after
  // backward, which leaves none stale (Model::backward, FlatParams::settle).
  bool overwrites_grad = false;
  // The gradient's contents stand for zero: the next contribution overwrites them.
  bool grad_stale = false;
  // Rows at the end of dimension 0 that are layout, not model: a padded vocabulary's token table
  // (nn::Embedding) has rows up to a multiple of 128 that no token reads and whose logits are
  // masked out of the loss. They stay zero (their gradient is zero), and what describes the
  // model leaves them out: checkpoints, exports, Model::structure and num_parameters (unpadded).
  std::int64_t padded_rows = 0;
};

// The model's part of `t`, a tensor shaped like p's value (its value, gradient or optimizer
// state): all rows but p's padded ones, as a view (t itself when p has none). Checkpoints store
// and load this part only, so a file does not depend on the padding of the model that wrote it.
Tensor unpadded(const Parameter& p, const Tensor& t);

struct Buffer {
  std::string name;
  Tensor value;  // e.g. BatchNorm running statistics: state, not trained
};

// Called during backward once a parameter's gradient for this backward pass is complete.
using GradReadyFn = std::function<void(Parameter&)>;

// How a layer that fuses the loss into its own forward computes it (Module::forward_loss): the
// gradient scale and label smoothing of nn::SoftmaxCrossEntropy, and how many rows of the
// output to make at a time.
struct FusedLoss {
  float grad_scale = 1.0f;  // dL/dy = (softmax - target) * grad_scale, as SoftmaxCrossEntropy's
  float label_smoothing = 0.0f;
  std::int64_t chunk_rows = 0;  // 0: all rows at once; -1: nn::loss_chunk_rows of the width
};

class Module {
 public:
  virtual ~Module() = default;

  virtual std::string type() const = 0;                    // "linear", "conv", ...
  virtual std::string describe() const { return type(); }  // "linear(784->128)"
  // The output shape for an input shape (batch dimension included); throws on a mismatch.
  virtual Shape output_shape(const Shape& input) const = 0;
  virtual Tensor forward(ops::Context& ctx, const Tensor& x) = 0;
  virtual Tensor backward(ops::Context& ctx, const Tensor& dy) = 0;

  // (Re)initialises parameters and per-layer random state from Philox(seed, hash of each full
  // parameter name), so values never depend on thread count or on other layers. `prefix` is the
  // name prefix collect_parameters is given ("3.", "5.conv1.").
  virtual void reset_parameters(std::uint64_t seed, const std::string& prefix) {
    (void)seed;
    (void)prefix;
  }

  // Parameters/buffers of this module and its children, in forward order, names prefixed.
  virtual void collect_parameters(const std::string& prefix, std::vector<Parameter*>& out) {
    (void)prefix;
    (void)out;
  }
  virtual void collect_buffers(const std::string& prefix, std::vector<Buffer*>& out) {
    (void)prefix;
    (void)out;
  }
  // Training mode (BatchNorm batch statistics, Dropout active) vs evaluation.
  virtual void set_training(bool training) { training_ = training; }
  bool training() const { return training_; }
  // Whether backward must produce dL/dx. A model turns it off for its first layer (the input
  // needs no gradient; for an MLP that skips the largest GEMM of the backward pass); backward
  // then returns an undefined Tensor.
  virtual void set_input_grad(bool needed) { input_grad_ = needed; }
  bool input_grad() const { return input_grad_; }
  // Channels-last activations (ops::ImageLayout::NHWC), decided once per model
  // (Model::set_channels_last): a module that can take its 4-D input and return its 4-D output
  // channels-last says so, and the model tells it when to. Shapes stay [N, C, H, W] either way;
  // only the memory order changes. A composite supports it when all of its children do.
  virtual bool supports_channels_last() const { return false; }
  virtual void set_channels_last(bool on);
  bool channels_last() const { return channels_last_; }
  // bf16 activations between layers (decided by the model, like channels-last): a layer whose
  // forward reads a bf16 input as it is (a convolution rounds its input to bf16 anyway) says so,
  // and the model tells the layer before it (in the same layout) that its output may be bf16. A
  // layer acts on that only on a bf16 context whose backend reads such activations in its own
  // kernels (ops::bf16_conv_bn_activations): ResNet's blocks keep the residual stream in bf16 as
  // PyTorch's autocast does.
  virtual bool reads_bf16_input() const { return false; }
  virtual void set_output_bf16(bool on) { (void)on; }
  // Forward FLOPs for one sample of the given input shape (multiply-add = 2); for benchmarks.
  virtual double forward_flops(const Shape& input) const {
    (void)input;
    return 0.0;
  }
  // Drops every input cached for backward and every reused buffer, so that their memory goes back
  // to the allocator; the next forward allocates afresh. Activation recompute
  // (TransformerBlock::set_recompute) calls it to keep one block's activations at a time.
  virtual void release_buffers() {}
  // Whether the caller may overwrite the tensor forward returned before calling backward: true
  // for a layer whose backward reads only its cached input and parameters (linear, the tied LM
  // head), false (the default) for one that reads its own output (a ReLU's mask, say). The loss
  // of a training step then writes the softmax and dlogits over the logits
  // (nn::SoftmaxCrossEntropy's Logits::Overwrite): one [N, C] buffer instead of three, 2 x 206 MB
  // less for GPT-2 at 1 x 1024 tokens.
  virtual bool output_overwritable() const { return false; }
  // Whether this layer, as a model's last, can compute softmax cross-entropy of its output itself
  // without ever holding the whole output (nn::SoftmaxCrossEntropy's Logits::Fused): the tied LM
  // head, whose logits [N*T, V] are the largest tensor of a GPT's step.
  virtual bool fuses_loss() const { return false; }
  // Where fuses_loss(): the mean loss [1] of the output forward(x) would give against i32 labels
  // [rows], and with it every gradient backward would compute from dL/dy = (softmax - target) *
  // loss.grad_scale: this layer's parameter gradients accumulated, and dL/dx kept for the next
  // backward_loss. The base class throws.
  virtual Tensor forward_loss(ops::Context& ctx, const Tensor& x, const Tensor& labels,
                              const FusedLoss& loss);
  // dL/dx of the last forward_loss (undefined when set_input_grad(false)).
  virtual Tensor backward_loss(ops::Context& ctx);

  // A new module of this one's configuration on `device`: its own parameters, buffers and
  // caches, whose values clone() then copies in (a subclass need not). DataParallel makes its
  // replicas this way. The default throws an error naming the module: a module that cannot be
  // rebuilt from its configuration (say, it shares a parameter with another) cannot be cloned.
  virtual std::unique_ptr<Module> clone_structure(Device device) const;
  // A deep copy on `device`: clone_structure, then every parameter's and buffer's value copied
  // (matched by name and shape; gradients are the new module's own). Throws when the copy lists
  // different parameters or buffers than this module.
  std::unique_ptr<Module> clone(Device device) const;

 protected:
  // The layout of this module's 4-D activations, for the ops that take one.
  ops::ImageLayout image_layout() const {
    return channels_last_ ? ops::ImageLayout::NHWC : ops::ImageLayout::NCHW;
  }

  bool training_ = true;
  bool input_grad_ = true;
  bool channels_last_ = false;
};

}  // namespace lockstep::nn
