#include "lockstep/nn/module.hpp"

#include "lockstep/core/error.hpp"

namespace lockstep::nn {
namespace {

// Copies a value into the clone's own tensor (not a new handle): a module may keep references to
// its parameters (TiedLmHead does), and the clone's tensors are already on the right device.
void copy_value(const Tensor& from, Tensor& to) {
  if (!from.defined()) return;
  if (from.dtype() == DType::F32 && to.defined() && to.dtype() == DType::F32) {
    to.copy_from(from.to_vector<float>());
  } else {
    to = from.to(to.defined() ? to.device() : from.device());
  }
}

}  // namespace

Tensor unpadded(const Parameter& p, const Tensor& t) {
  if (p.padded_rows == 0) return t;
  Shape shape = t.shape();
  shape[0] -= p.padded_rows;
  return t.sub(0, shape);
}

Tensor Module::forward_loss(ops::Context& ctx, const Tensor& x, const Tensor& labels,
                            const FusedLoss& loss) {
  (void)ctx, (void)x, (void)labels, (void)loss;
  LOCKSTEP_FAIL("module '", describe(), "' cannot fuse the loss into its forward (fuses_loss())");
}

Tensor Module::backward_loss(ops::Context& ctx) {
  (void)ctx;
  LOCKSTEP_FAIL("module '", describe(), "' cannot fuse the loss into its forward (fuses_loss())");
}

void Module::set_channels_last(bool on) {
  LOCKSTEP_CHECK_HINT(!on || supports_channels_last(),
                      "leave model.channels_last at off, or drop the module", "module '",
                      describe(), "' cannot run channels-last (NHWC)");
  channels_last_ = on;
}

std::unique_ptr<Module> Module::clone_structure(Device device) const {
  (void)device;
  LOCKSTEP_FAIL_HINT(str("give ", type(),
                         " a `std::unique_ptr<Module> clone_structure(Device) const` override that "
                         "constructs it again from its configuration on the device"),
                     "module '", describe(),
                     "' cannot be cloned (DataParallel replicates a model "
                     "by cloning its modules)");
}

std::unique_ptr<Module> Module::clone(Device device) const {
  std::unique_ptr<Module> copy = clone_structure(device);
  // collect_* only list pointers; the source is not modified.
  auto& self = const_cast<Module&>(*this);
  std::vector<Parameter*> from, to;
  self.collect_parameters("", from);
  copy->collect_parameters("", to);
  std::vector<Buffer*> from_buffers, to_buffers;
  self.collect_buffers("", from_buffers);
  copy->collect_buffers("", to_buffers);
  LOCKSTEP_CHECK(from.size() == to.size() && from_buffers.size() == to_buffers.size(),
                 "clone of module '", describe(), "': the copy has ", to.size(), " parameters and ",
                 to_buffers.size(), " buffers, the original ", from.size(), " and ",
                 from_buffers.size(), " (its clone_structure builds a different module)");
  for (std::size_t i = 0; i < from.size(); ++i) {
    LOCKSTEP_CHECK(from[i]->name == to[i]->name && from[i]->value.shape() == to[i]->value.shape(),
                   "clone of module '", describe(), "': parameter ", i, " is ", from[i]->name, " ",
                   shape_str(from[i]->value.shape()), " in the original but ", to[i]->name, " ",
                   shape_str(to[i]->value.shape()), " in the copy");
    copy_value(from[i]->value, to[i]->value);
  }
  for (std::size_t i = 0; i < from_buffers.size(); ++i) {
    LOCKSTEP_CHECK(from_buffers[i]->name == to_buffers[i]->name &&
                       from_buffers[i]->value.shape() == to_buffers[i]->value.shape(),
                   "clone of module '", describe(), "': buffer ", i, " is ", from_buffers[i]->name,
                   " in the original but ", to_buffers[i]->name, " in the copy");
    copy_value(from_buffers[i]->value, to_buffers[i]->value);
  }
  copy->set_training(training_);
  copy->set_input_grad(input_grad_);
  return copy;
}

}  // namespace lockstep::nn
