// clang-format off
// Model: the sequence of layers a replica trains, built from a layer spec. One Model per replica;
// building twice with the same (spec, sample shape, classes, seed) gives bitwise-identical
// parameters on any device or thread count, so replicas can be built independently.
//
// Spec grammar (whitespace ignored; layers joined by '-'; arguments positional in the order shown,
// or key=value in any order; [..] optional with the default shown):
//   conv(out, k[, stride=1][, pad=0][, bias=1])   2-D convolution, k x k kernel
//   linear(out[, bias=1])                         fully connected; input must be [N, features]
//   bn                                            BatchNorm1d on [N, C], BatchNorm2d on [N, C, H, W]
//   relu | gelu                                   activations (GELU: exact erf form)
//   maxpool(k[, stride=k][, pad=0])               max pooling
//   avgpool(k[, stride=k][, pad=0])               average pooling
//   gap                                           global average pooling, [N, C, H, W] -> [N, C]
//   flatten                                       [N, ...] -> [N, features]
//   dropout(p)                                    inverted dropout, 0 <= p < 1
//   res(out[, stride=1])                          ResNet basic block (identity or 1x1 shortcut)
//   embed(vocab, ctx, dim)                        token + position embedding, i32 [N, T] ->
//                                                 [N, T, dim]; T > ctx is an error
//   block(heads[, depth=1])                       pre-LN transformer block (GPT-2); depth, the
//                                                 number of blocks, scales the residual init
//   ln                                            LayerNorm over the last dimension
//   lmhead                                        logits [N*T, vocab] tied to the last embed's
//                                                 token table (no parameter of its own)
// Presets (the whole spec):
//   mlp[:h1,h2,...]   flatten-linear(h1)-relu-...-linear(hk)-relu-linear(classes);
//                     default 1024,1024
//   lenet             conv(6,5,pad=2)-relu-maxpool(2)-conv(16,5)-relu-maxpool(2)-flatten-
//                     linear(120)-relu-linear(84)-relu-linear(classes)
//   resnet[:n]        CIFAR-style ResNet-(6n+2), n blocks per stage (default 2): conv(16,3,pad=1,
//                     bias=0)-bn-relu, stages res(16), res(32,2), res(64,2), then
//                     gap-linear(classes)
//   gpt(layers, heads, dim[, ctx][, vocab])
//                     GPT-2: embed(vocab,ctx,dim)-block(heads,depth=layers) x layers-ln-lmhead,
//                     GPT-2/llm.c initialisation. The data's sample shape is [T] (i32 tokens):
//                     ctx defaults to T and must be >= T; vocab defaults to num_classes and must
//                     equal it. The output is one row of logits per position, [N*T, vocab].
//   gpt2-124m | gpt2-350m | gpt-mini | gpt-tiny
//                     gpt(12,12,768,ctx=1024,vocab=50257), gpt(24,16,1024,ctx=1024,vocab=50257),
//                     gpt(4,4,256,ctx=256), gpt(2,2,128,ctx=128); key=value arguments in
//                     parentheses override the preset's (gpt-mini(ctx=64), gpt2-124m(vocab=256))
// Classifier head: a spec whose last layer is linear(out) (or lmhead) must have out == num_classes. A spec
// that ends in any other layer gets a head appended: `flatten` if the output is not yet
// [N, features], then `linear(num_classes)` (so `conv(8,3)-relu-gap` is a valid model).
// Errors (unknown layer, bad argument, shapes that do not fit the sample shape) throw
// lockstep::Error quoting the spec with a caret under the offending layer.
// clang-format on
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/nn/module.hpp"

namespace lockstep::nn {

// The context (ctx) a gpt(...) spec or preset states, or 0 when it leaves ctx to the data (or is
// not a gpt spec): what a trainer opening token data uses as the window length T.
std::int64_t spec_context(const std::string& spec);

class Model {
 public:
  // sample_shape: one sample without the batch dimension, e.g. {1, 28, 28} or {784}.
  static Model build(const std::string& spec, const Shape& sample_shape, std::int64_t num_classes,
                     std::uint64_t seed, Device device = Device::cpu());

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

  // In forward order; pointers stay valid for the Model's lifetime (also across moves).
  const std::vector<Parameter*>& parameters() const { return parameters_; }
  const std::vector<Buffer*>& buffers() const { return buffers_; }
  void set_training(bool training);
  bool training() const { return training_; }
  void zero_grad(ops::Context& ctx);

  const std::string& spec() const { return spec_; }              // as given to build
  const std::string& layer_spec() const { return layer_spec_; }  // presets expanded, head added
  // One line per layer (index, description, output shape) and per parameter/buffer (name,
  // shape): equal on two replicas exactly when they have the same architecture.
  std::string structure() const;
  // Forward FLOPs per sample (multiply-add = 2) at the build sample shape, or at another one.
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
  Module& layer(std::size_t i) { return *layers_.at(i); }

  // Dropout masks depend on (seed, layer name, number of training forwards so far). DDP gives
  // each rank its own seed; a trainer resuming from a checkpoint restores the call count.
  void set_dropout_seed(std::uint64_t seed);
  std::uint64_t dropout_calls() const;
  void set_dropout_calls(std::uint64_t calls);

 private:
  Model() = default;

  std::string spec_, layer_spec_;
  Shape sample_shape_;
  std::int64_t num_classes_ = 0;
  std::int64_t outputs_per_sample_ = 1;
  std::uint64_t seed_ = 0;
  Device device_;
  std::vector<std::unique_ptr<Module>> layers_;
  std::vector<Shape> out_shapes_;                      // per layer, for one sample
  std::vector<std::vector<Parameter*>> layer_params_;  // per layer, forward order
  std::vector<Parameter*> parameters_;
  std::vector<Buffer*> buffers_;
  GradReadyFn grad_ready_;
  bool training_ = true;
};

}  // namespace lockstep::nn
