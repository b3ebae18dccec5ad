// Model: the modules a replica trains, with what training needs around them: the sample shape
// and classes, parameters and buffers listed once in forward order, and the grad-ready hook the
// reducer buckets by. Two front ends make one: Model::build from a spec string (the language in
// lockstep/nn/spec.hpp), and the constructor from a Sequential composed in C++ (built-in layers
// and modules of one's own; docs/ARCHITECTURE.md, "Building a model without a spec"). Either way
// the same modules and seed give bitwise-identical parameters on any device or thread count, and
// clone() copies a model onto another device (DataParallel's replicas).
// Invariants: parameter names are unique ("k.<name>" for top-level module k); the modules' shapes
// chain from [N, sample_shape...] to logits [N * outputs_per_sample(), num_classes].
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/nn/module.hpp"
#include "lockstep/nn/sequential.hpp"
#include "lockstep/nn/spec.hpp"

namespace lockstep::nn {

class SoftmaxCrossEntropy;  // lockstep/nn/loss.hpp

class Model {
 public:
  // The spec front end (src/nn/spec.cpp). sample_shape: one sample without the batch dimension,
  // e.g. {1, 28, 28} or {784}.
  static Model build(const std::string& spec, const Shape& sample_shape, std::int64_t num_classes,
                     std::uint64_t seed, Device device = Device::cpu());

  // A model of modules composed in C++, living on `device`. Initialises every parameter through
  // the modules' reset_parameters(seed, "k."), as build does. Throws, naming the modules, when
  // one does not accept its predecessor's output, when the last does not output
  // [N * T, num_classes], or when two parameters share a name.
  Model(Sequential modules, const Shape& sample_shape, std::int64_t num_classes, std::uint64_t seed,
        Device device = Device::cpu());
  // A deep copy on `device`: same modules, parameter and buffer values, spec and dropout state;
  // its own gradients and no grad-ready hook. Throws, naming it, when a module cannot be cloned.
  Model clone(Device device) const;

  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  ~Model();

  // x: [N, sample_shape...] on the model's device (f32 images, i32 tokens) -> logits
  // [N * outputs_per_sample(), num_classes].
  Tensor forward(ops::Context& ctx, const Tensor& x);
  // Runs every layer's backward in reverse order, accumulating parameter gradients. Right after a
  // layer's backward, the hook (if set) is called for each of that layer's parameters, last
  // parameter first: over one backward the hook sees exactly parameters() in reverse order.
  void backward(ops::Context& ctx, const Tensor& dlogits);
  void set_grad_ready_hook(GradReadyFn fn);
  // Whether the logits forward returns may be overwritten before backward (the last layer's
  // Module::output_overwritable): a training step's loss then works in them
  // (SoftmaxCrossEntropy::Logits::Overwrite).
  bool logits_overwritable() const { return layers_.output_overwritable(); }
  // Whether the last layer computes the loss of its own output (Module::fuses_loss): a training
  // step's loss is then Logits::Fused, and the logits are never made whole.
  bool fuses_loss() const;

  // A training step through its loss (made for this model: SoftmaxCrossEntropy::for_training):
  // forward_loss returns the mean loss [1] of the logits forward(x) would give against labels
  // [N * outputs_per_sample()], and backward_loss then runs the backward, with dL/dlogits scaled
  // by grad_scale as loss.backward(grad_scale) scales it. Under Logits::Fused the last layer
  // computes the loss without making the logits and its own gradients with it
  // (Module::forward_loss), so they are complete before backward_loss; otherwise this is
  // forward, loss.forward, then backward(loss.backward(grad_scale)). `loss` must live until
  // backward_loss.
  Tensor forward_loss(ops::Context& ctx, const Tensor& x, const Tensor& labels,
                      SoftmaxCrossEntropy& loss, float grad_scale);
  void backward_loss(ops::Context& ctx);

  // In forward order; pointers stay valid for the Model's lifetime (also across moves).
  const std::vector<Parameter*>& parameters() const { return parameters_; }
  const std::vector<Buffer*>& buffers() const { return buffers_; }
  void set_training(bool training);
  bool training() const { return training_; }
  // Every gradient to zero: filled, or for a parameter whose layer overwrites it
  // (Parameter::overwrites_grad) marked stale for its next backward to overwrite.
  void zero_grad(ops::Context& ctx);

  // Channels-last activations (model.channels_last; docs/IMAGES.md, "Channels-last"): on, every
  // top-level layer that takes a 4-D input and supports_channels_last() runs in NHWC, and the model
  // converts where the layout changes: the NCHW input once before the first such layer, and back
  // to NCHW before a layer that needs it (a flatten, so the linear layer after it sees the same
  // feature order, and checkpoints mean the same), the gradients likewise in backward. Parameters
  // are unaffected. Returns the number of top-level layers that run channels-last (0: none can).
  std::int64_t set_channels_last(bool on);
  bool channels_last() const { return channels_last_; }

  // As given to build, presets expanded and head added; both empty for a model composed in C++.
  const std::string& spec() const { return spec_; }
  const std::string& layer_spec() const { return layer_spec_; }
  // One line per layer (index, description, output shape) and per parameter/buffer (name,
  // shape, padding left out: Parameter::padded_rows): equal on two replicas exactly when they
  // have the same architecture, whatever their vocabulary padding.
  std::string structure() const;
  // Forward FLOPs per sample (multiply-add = 2) at the build sample shape, or at another one
  // (a padded vocabulary's padding not counted: the model's FLOPs, not the kernels').
  double forward_flops() const { return forward_flops(sample_shape_); }
  double forward_flops(const Shape& sample_shape) const;
  std::int64_t num_parameters() const;

  const Shape& sample_shape() const { return sample_shape_; }
  std::int64_t num_classes() const { return num_classes_; }
  // Rows of logits per sample: 1 for a classifier, T (one per position, each predicting the next
  // token) for a language model. Labels are [N * outputs_per_sample()].
  std::int64_t outputs_per_sample() const { return outputs_per_sample_; }
  std::uint64_t seed() const { return seed_; }
  Device device() const { return device_; }
  std::size_t num_layers() const { return layers_.size(); }
  Module& layer(std::size_t i) { return layers_.at(i); }
  const Module& layer(std::size_t i) const { return layers_.at(i); }

  // Dropout masks depend on (seed, layer name, number of training forwards so far). DDP gives
  // each rank its own seed; a trainer resuming from a checkpoint restores the call count.
  void set_dropout_seed(std::uint64_t seed);
  std::uint64_t dropout_calls() const;
  void set_dropout_calls(std::uint64_t calls);

 private:
  // Checks and lists the modules but leaves their values as they are (a clone's are copies).
  struct KeepValues {};
  Model(Sequential modules, const Shape& sample_shape, std::int64_t num_classes, std::uint64_t seed,
        Device device, KeepValues);

  std::string spec_, layer_spec_;
  Shape sample_shape_;
  std::int64_t num_classes_ = 0;
  std::int64_t outputs_per_sample_ = 1;
  std::uint64_t seed_ = 0;
  Device device_;
  Sequential layers_;
  // Layers [0, end) forward from x, inside the step's parameter reuse window; and layers
  // [0, end) backward from d, with the grad-ready hook, closing the window.
  Tensor forward_layers(ops::Context& ctx, const Tensor& x, std::size_t end);
  void backward_layers(ops::Context& ctx, Tensor d, std::size_t end);
  void layer_grads_ready(ops::Context& ctx, std::size_t k);
  // The step forward_loss began, for backward_loss.
  struct LossStep {
    SoftmaxCrossEntropy* loss = nullptr;  // null: none pending
    float grad_scale = 1.0f;
    bool fused = false;
  };
  LossStep loss_step_;
  void link_bf16_outputs();        // tells each layer whether its output may be bf16 (Module)
  std::vector<Shape> out_shapes_;  // per layer, for one sample
  std::vector<std::vector<Parameter*>> layer_params_;  // per layer, forward order
  std::vector<Parameter*> parameters_;
  std::vector<Buffer*> buffers_;
  GradReadyFn grad_ready_;
  bool training_ = true;
  // Channels-last (set_channels_last): per top-level layer, whether its input is NHWC.
  bool channels_last_ = false;
  std::vector<char> nhwc_input_;
};

// Calls fn on every module of the model, depth first: each layer, and the modules inside a
// Sequential (a composed model nests them). The whole-model settings use it
// (zero_init_residual, set_recompute).
void for_each_module(Model& model, const std::function<void(Module&)>& fn);

// model.channels_last: on, off, or auto (Model::set_channels_last where measured faster).
enum class ChannelsLast { Auto, On, Off };
// "auto", "on" or "off"; anything else is an error naming the value.
ChannelsLast channels_last_from_name(const std::string& name);
// Whether `setting` runs `model` channels-last on ctx's device and precision. Auto: on for image
// models with convolutions, on every device. Measured faster on the CPU (docs/PERFORMANCE.md,
// "ResNet-50 on the CPU"); on CUDA it is cuDNN's tensor-core layout, and bench/gpu-check.sh
// measures both (resnet, resnet-nchw) for the GPU's rule, not yet measured.
bool resolve_channels_last(ChannelsLast setting, const Model& model, const ops::Context& ctx);

// Fills every gradient of `params` still marked stale (Parameter::grad_stale) with zeros and
// clears the mark: what reads gradients outside backward calls it first.
void settle_stale_grads(ops::Context& ctx, const std::vector<Parameter*>& params);

}  // namespace lockstep::nn
