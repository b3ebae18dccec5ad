// The model container: modules, their parameters in forward order, and the grad-ready hook. The
// spec language that is one way to fill it lives in spec.cpp.
#include "lockstep/nn/model.hpp"

#include <map>
#include <sstream>
#include <utility>

#include "batch_shape.hpp"
#include "lockstep/core/trace.hpp"
#include "lockstep/nn/conv.hpp"
#include "lockstep/nn/dropout.hpp"
#include "lockstep/nn/loss.hpp"
#include "lockstep/nn/residual.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::nn {

Model::Model(Sequential modules, const Shape& sample_shape, std::int64_t num_classes,
             std::uint64_t seed, Device device)
    : Model(std::move(modules), sample_shape, num_classes, seed, device, KeepValues{}) {
  // After the delegated constructor's checks, so a bad composition fails before any work.
  for (std::size_t k = 0; k < layers_.size(); ++k)
    layers_.at(k).reset_parameters(seed, str(k, "."));
}

Model::Model(Sequential modules, const Shape& sample_shape, std::int64_t num_classes,
             std::uint64_t seed, Device device, KeepValues)
    : sample_shape_(sample_shape),
      num_classes_(num_classes),
      seed_(seed),
      device_(device),
      layers_(std::move(modules)) {
  LOCKSTEP_CHECK(num_classes >= 1, "model: num_classes must be positive, got ", num_classes);
  LOCKSTEP_CHECK(!sample_shape.empty() && shape_numel(sample_shape) > 0,
                 "model: sample shape must be non-empty, got ", shape_str(sample_shape));
  LOCKSTEP_CHECK(layers_.size() > 0, "model: no modules");
  Shape shape{1};
  shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
  for (std::size_t k = 0; k < layers_.size(); ++k) {
    Module& layer = layers_.at(k);
    try {
      shape = layer.output_shape(shape);
    } catch (const Error& e) {
      const std::string from = k == 0 ? str("the sample shape ", shape_str(sample_shape))
                                      : str("the output of ", child_name(k - 1, layers_.at(k - 1)));
      LOCKSTEP_FAIL_HINT(e.hint(), "model: ", child_name(k, layer), " does not accept ", from, ", ",
                         batch_shape_str(shape), ": ", e.message());
    }
    out_shapes_.push_back(shape);
  }
  LOCKSTEP_CHECK_HINT(shape.size() == 2 && shape[1] == num_classes,
                      str("end the model with a module that outputs [N, ", num_classes,
                          "] (e.g. Linear(features, ", num_classes, "))"),
                      "model: the last module, ",
                      child_name(layers_.size() - 1, layers_.at(layers_.size() - 1)), ", outputs ",
                      batch_shape_str(shape), " per sample but the data has ", num_classes,
                      " classes: logits must be [N * T, ", num_classes, "]");
  outputs_per_sample_ = shape[0];

  // Names are how checkpoints, the reducer and export address parameters: one name, one tensor.
  std::map<std::string, std::size_t> owner;  // parameter or buffer name -> module index
  auto claim = [&](const std::string& name, std::size_t k) {
    auto [it, fresh] = owner.emplace(name, k);
    if (fresh) return;
    const std::string owners = it->second == k
                                   ? str("both of ", child_name(k, layers_.at(k)))
                                   : str("one of ", child_name(it->second, layers_.at(it->second)),
                                         ", one of ", child_name(k, layers_.at(k)));
    LOCKSTEP_FAIL_HINT(
        "give each parameter and buffer of a module its own name (its "
        "collect_parameters / collect_buffers lists them)",
        "model: two parameters or buffers are named '", name, "': ", owners);
  };
  for (std::size_t k = 0; k < layers_.size(); ++k) {
    const std::string prefix = str(k, ".");
    Module& layer = layers_.at(k);
    layer_params_.emplace_back();
    layer.collect_parameters(prefix, layer_params_.back());
    const std::size_t first_buffer = buffers_.size();
    layer.collect_buffers(prefix, buffers_);
    for (const Parameter* p : layer_params_.back())
      claim(p->name, k);
    for (std::size_t b = first_buffer; b < buffers_.size(); ++b)
      claim(buffers_[b]->name, k);
    parameters_.insert(parameters_.end(), layer_params_.back().begin(), layer_params_.back().end());
  }
  nhwc_input_.assign(layers_.size(), 0);
  link_bf16_outputs();
  // Nothing upstream of the first layer with parameters needs a gradient.
  for (std::size_t k = 0; k < layers_.size(); ++k) {
    layers_.at(k).set_input_grad(false);
    if (!layer_params_[k].empty()) break;
  }
}

Model Model::clone(Device device) const {
  std::unique_ptr<Module> copy;
  try {
    copy = layers_.clone(device);
  } catch (const Error& e) {
    LOCKSTEP_FAIL_HINT(e.hint(), "model: ", e.message());
  }
  Model m(std::move(dynamic_cast<Sequential&>(*copy)), sample_shape_, num_classes_, seed_, device,
          KeepValues{});
  m.spec_ = spec_;
  m.layer_spec_ = layer_spec_;
  m.set_training(training_);
  m.set_channels_last(channels_last_);
  return m;
}

Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;
Model::~Model() = default;

namespace {

// x [N, C, H, W] in one layout, into the other: NCHW is [N, C, H*W], NHWC [N, H*W, C].
Tensor convert_layout(ops::Context& ctx, const Tensor& x, bool to_nhwc) {
  const std::int64_t n = x.dim(0), c = x.dim(1), hw = x.dim(2) * x.dim(3);
  Tensor y = ctx.transient(x.shape());
  Tensor yv = to_nhwc ? y.view({n, hw, c}) : y.view({n, c, hw});
  ops::batch_transpose(ctx, to_nhwc ? x.view({n, c, hw}) : x.view({n, hw, c}), yv);
  return y;
}

}  // namespace

// bf16 outputs (Module::set_output_bf16) only into a layer of the same layout: the layout
// conversion between two layers reads f32.
void Model::link_bf16_outputs() {
  for (std::size_t k = 0; k < layers_.size(); ++k) {
    const bool next = k + 1 < layers_.size() && layers_.at(k + 1).reads_bf16_input() &&
                      nhwc_input_[k + 1] == nhwc_input_[k];
    layers_.at(k).set_output_bf16(next);
  }
}

std::int64_t Model::set_channels_last(bool on) {
  channels_last_ = on;
  std::int64_t layers = 0;
  Shape shape{1};
  shape.insert(shape.end(), sample_shape_.begin(), sample_shape_.end());
  for (std::size_t k = 0; k < layers_.size(); ++k) {
    Module& layer = layers_.at(k);
    const bool nhwc = on && shape.size() == 4 && layer.supports_channels_last();
    nhwc_input_[k] = nhwc;
    layer.set_channels_last(nhwc);
    layers += nhwc;
    shape = out_shapes_[k];
  }
  link_bf16_outputs();
  return layers;
}

Tensor Model::forward(ops::Context& ctx, const Tensor& x) {
  Tensor h = forward_layers(ctx, x, layers_.size());
  if (!training_) ctx.end_reuse();
  return h;
}

Tensor Model::forward_layers(ops::Context& ctx, const Tensor& x, std::size_t end) {
  bool fits = x.ndim() == static_cast<int>(sample_shape_.size()) + 1;
  for (std::size_t i = 0; fits && i < sample_shape_.size(); ++i) {
    fits = x.dim(static_cast<int>(i) + 1) == sample_shape_[i];
  }
  LOCKSTEP_CHECK(fits, "model input must be [N, ", shape_str(sample_shape_).substr(1),
                 " (the sample shape it was built for), got ", x.describe());
  // The parameters stay as they are until this forward's backward has run, so a context that
  // computes in bf16 may convert each one once for both (ops::Context::begin_reuse). An
  // evaluation forward has no backward: its window closes at once. A padded table is read both
  // whole (the fused loss) and as its vocabulary's rows (the other GEMMs): both are listed.
  std::vector<Tensor> unchanged;
  unchanged.reserve(parameters_.size());
  for (const Parameter* p : parameters_) {
    unchanged.push_back(p->value);
    if (p->padded_rows > 0) unchanged.push_back(unpadded(*p, p->value));
  }
  ctx.begin_reuse(unchanged);
  Tensor h = x;
  bool nhwc = false;  // the layout of h when it is 4-D
  for (std::size_t k = 0; k < end; ++k) {
    // log.trace: a span per layer (per block of a GPT), inside the engine's forward span.
    trace::Span span("compute",
                     trace::on() ? str("forward ", k, ": ", layers_.at(k).describe()) : "");
    if (h.ndim() == 4 && nhwc != static_cast<bool>(nhwc_input_[k]))
      h = convert_layout(ctx, h, nhwc_input_[k]);
    nhwc = nhwc_input_[k];
    try {
      h = layers_.at(k).forward(ctx, h);
    } catch (const OutOfMemory&) {
      rethrow_with_context(
          str("forward of layer ", k, " (", layers_.at(k).describe(), ") on ", h.describe()));
    }
  }
  return h;
}

void Model::backward(ops::Context& ctx, const Tensor& dlogits) {
  LOCKSTEP_CHECK(dlogits.ndim() == 2 && dlogits.dim(1) == num_classes_,
                 "model backward expects dlogits [N, ", num_classes_, "], got ",
                 dlogits.describe());
  backward_layers(ctx, dlogits, layers_.size());
}

void Model::backward_layers(ops::Context& ctx, Tensor d, std::size_t end) {
  for (std::size_t k = end; k-- > 0;) {
    trace::Span span("compute",
                     trace::on() ? str("backward ", k, ": ", layers_.at(k).describe()) : "");
    try {
      d = layers_.at(k).backward(ctx, d);
    } catch (const OutOfMemory&) {
      rethrow_with_context(
          str("backward of layer ", k, " (", layers_.at(k).describe(), ") on ", d.describe()));
    }
    // The gradient goes back in the layout of the forward's tensor in front of this layer.
    const bool before = k > 0 && nhwc_input_[k - 1];
    if (d.defined() && d.ndim() == 4 && before != static_cast<bool>(nhwc_input_[k]))
      d = convert_layout(ctx, d, before);
    layer_grads_ready(ctx, k);
  }
  ctx.end_reuse();  // the optimizer may change the parameters from here on
}

void Model::layer_grads_ready(ops::Context& ctx, std::size_t k) {
  // A layer's gradients are complete here: none may stay stale (a layer that overwrites a
  // stale gradient did so; anything else left one zero_grad did not fill), so fill those.
  settle_stale_grads(ctx, layer_params_[k]);
  if (grad_ready_) {
    auto& params = layer_params_[k];
    for (auto it = params.rbegin(); it != params.rend(); ++it)
      grad_ready_(**it);
  }
}

bool Model::fuses_loss() const {
  return layers_.at(layers_.size() - 1).fuses_loss();
}

Tensor Model::forward_loss(ops::Context& ctx, const Tensor& x, const Tensor& labels,
                           SoftmaxCrossEntropy& loss, float grad_scale) {
  const bool fused = loss.logits_mode() == SoftmaxCrossEntropy::Logits::Fused;
  const std::size_t head = layers_.size() - 1;
  Module& last = layers_.at(head);
  LOCKSTEP_CHECK_HINT(!fused || last.fuses_loss(),
                      "make the loss with SoftmaxCrossEntropy::for_training(model)",
                      "model: a Fused loss needs a last layer that computes it, but ",
                      child_name(head, last), " does not");
  loss_step_ = LossStep{&loss, grad_scale, fused};
  if (!fused) return loss.forward(ctx, forward(ctx, x), labels);
  Tensor h = forward_layers(ctx, x, head);
  trace::Span span("compute",
                   trace::on() ? str("forward and loss ", head, ": ", last.describe()) : "");
  try {
    return last.forward_loss(ctx, h, labels,
                             FusedLoss{grad_scale, loss.label_smoothing(), loss.chunk_rows()});
  } catch (const OutOfMemory&) {
    rethrow_with_context(
        str("forward and loss of layer ", head, " (", last.describe(), ") on ", h.describe()));
  }
}

void Model::backward_loss(ops::Context& ctx) {
  const LossStep step = std::exchange(loss_step_, LossStep{});
  LOCKSTEP_CHECK_HINT(step.loss != nullptr, "call forward_loss before each backward_loss",
                      "model: backward_loss without forward_loss");
  if (!step.fused) return backward(ctx, step.loss->backward(ctx, step.grad_scale));
  const std::size_t head = layers_.size() - 1;
  Tensor d = layers_.at(head).backward_loss(ctx);
  layer_grads_ready(ctx, head);
  backward_layers(ctx, d, head);
}

void Model::set_grad_ready_hook(GradReadyFn fn) {
  grad_ready_ = std::move(fn);
}

void Model::set_training(bool training) {
  training_ = training;
  layers_.set_training(training);
}

void Model::zero_grad(ops::Context& ctx) {
  for (Parameter* p : parameters_) {
    if (p->overwrites_grad)
      p->grad_stale = true;  // its layer's next backward overwrites it
    else
      ops::fill(ctx, p->grad, 0.0f);
  }
}

ChannelsLast channels_last_from_name(const std::string& name) {
  if (name == "auto") return ChannelsLast::Auto;
  if (name == "on") return ChannelsLast::On;
  if (name == "off") return ChannelsLast::Off;
  LOCKSTEP_FAIL_HINT("use auto, on or off", "model.channels_last = '", name,
                     "' is not a channels-last setting");
}

namespace {
bool has_convolution(const Module& m) {
  if (dynamic_cast<const Conv2d*>(&m) || dynamic_cast<const ResidualBlock*>(&m)) return true;
  if (const auto* seq = dynamic_cast<const Sequential*>(&m))
    for (std::size_t k = 0; k < seq->size(); ++k)
      if (has_convolution(seq->at(k))) return true;
  return false;
}
}  // namespace

bool resolve_channels_last(ChannelsLast setting, const Model& model, const ops::Context& ctx) {
  (void)ctx;  // the same rule on every device so far (see model.hpp)
  if (setting != ChannelsLast::Auto) return setting == ChannelsLast::On;
  if (model.sample_shape().size() != 3) return false;  // not images
  for (std::size_t k = 0; k < model.num_layers(); ++k)
    if (has_convolution(model.layer(k))) return true;
  return false;
}

void settle_stale_grads(ops::Context& ctx, const std::vector<Parameter*>& params) {
  for (Parameter* p : params) {
    if (!p->grad_stale) continue;
    ops::fill(ctx, p->grad, 0.0f);
    p->grad_stale = false;
  }
}

std::string Model::structure() const {
  std::ostringstream out;
  out << "spec " << (layer_spec_.empty() ? "(none: composed in C++)" : layer_spec_) << "\n";
  out << "input " << batch_shape_str([&] {
    Shape s{1};
    s.insert(s.end(), sample_shape_.begin(), sample_shape_.end());
    return s;
  }()) << "\n";
  std::vector<Parameter*> params;
  std::vector<Buffer*> buffers;
  for (std::size_t k = 0; k < layers_.size(); ++k) {
    out << k << " " << layers_.at(k).describe() << " -> " << batch_shape_str(out_shapes_[k])
        << "\n";
    for (Parameter* p : layer_params_[k]) {
      out << "  param " << p->name << " " << shape_str(unpadded(*p, p->value).shape()) << "\n";
    }
    buffers.clear();
    const_cast<Module&>(layers_.at(k)).collect_buffers(str(k, "."), buffers);  // only lists them
    for (Buffer* b : buffers) {
      out << "  buffer " << b->name << " " << shape_str(b->value.shape()) << "\n";
    }
  }
  return out.str();
}

double Model::forward_flops(const Shape& sample_shape) const {
  Shape shape{1};
  shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
  double flops = 0.0;
  for (std::size_t k = 0; k < layers_.size(); ++k) {
    flops += layers_.at(k).forward_flops(shape);
    shape = layers_.at(k).output_shape(shape);
  }
  return flops;
}

std::int64_t Model::num_parameters() const {
  std::int64_t n = 0;
  for (const Parameter* p : parameters_)
    n += unpadded(*p, p->value).numel();
  return n;
}

void Model::set_dropout_seed(std::uint64_t seed) {
  for (std::size_t k = 0; k < layers_.size(); ++k) {
    if (auto* d = dynamic_cast<Dropout*>(&layers_.at(k))) d->set_seed(seed);
  }
}

std::uint64_t Model::dropout_calls() const {
  for (std::size_t k = 0; k < layers_.size(); ++k) {
    if (auto* d = dynamic_cast<const Dropout*>(&layers_.at(k))) return d->calls();
  }
  return 0;
}

void Model::set_dropout_calls(std::uint64_t calls) {
  for (std::size_t k = 0; k < layers_.size(); ++k) {
    if (auto* d = dynamic_cast<Dropout*>(&layers_.at(k))) d->set_calls(calls);
  }
}

namespace {
void for_each_module_in(Module& m, const std::function<void(Module&)>& fn) {
  fn(m);
  if (auto* seq = dynamic_cast<Sequential*>(&m))
    for (std::size_t k = 0; k < seq->size(); ++k)
      for_each_module_in(seq->at(k), fn);
}
}  // namespace

void for_each_module(Model& model, const std::function<void(Module&)>& fn) {
  for (std::size_t k = 0; k < model.num_layers(); ++k)
    for_each_module_in(model.layer(k), fn);
}

}  // namespace lockstep::nn
