#include "lockstep/nn/sequential.hpp"

#include "batch_shape.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/nn/transformer.hpp"

namespace lockstep::nn {

std::string child_name(std::size_t k, const Module& m) {
  return str("module ", k, " '", m.describe(), "'");
}

Module& Sequential::add(std::unique_ptr<Module> module) {
  LOCKSTEP_CHECK(module != nullptr, "Sequential::add: module ", children_.size(), " is null");
  children_.push_back(std::move(module));
  return *children_.back();
}

std::string Sequential::describe() const {
  std::string s = "sequential(";
  for (std::size_t k = 0; k < children_.size(); ++k)
    s += str(k ? ", " : "", children_[k]->describe());
  return s + ")";
}

Shape Sequential::output_shape(const Shape& input) const {
  Shape shape = input;
  for (std::size_t k = 0; k < children_.size(); ++k) {
    try {
      shape = children_[k]->output_shape(shape);
    } catch (const Error& e) {
      const std::string from = k == 0 ? std::string("its input")
                                      : str("the output of ", child_name(k - 1, *children_[k - 1]));
      LOCKSTEP_FAIL_HINT(e.hint(), child_name(k, *children_[k]), " does not accept ", from, ", ",
                         batch_shape_str(shape), ": ", e.message());
    }
  }
  return shape;
}

Tensor Sequential::forward(ops::Context& ctx, const Tensor& x) {
  Tensor h = x;
  for (auto& child : children_)
    h = child->forward(ctx, h);
  return h;
}

Tensor Sequential::backward(ops::Context& ctx, const Tensor& dy) {
  Tensor d = dy;
  for (std::size_t k = children_.size(); k-- > 0;)
    d = children_[k]->backward(ctx, d);
  return d;
}

void Sequential::reset_parameters(std::uint64_t seed, const std::string& prefix) {
  for (std::size_t k = 0; k < children_.size(); ++k)
    children_[k]->reset_parameters(seed, str(prefix, k, "."));
}

void Sequential::collect_parameters(const std::string& prefix, std::vector<Parameter*>& out) {
  for (std::size_t k = 0; k < children_.size(); ++k)
    children_[k]->collect_parameters(str(prefix, k, "."), out);
}

void Sequential::collect_buffers(const std::string& prefix, std::vector<Buffer*>& out) {
  for (std::size_t k = 0; k < children_.size(); ++k)
    children_[k]->collect_buffers(str(prefix, k, "."), out);
}

void Sequential::set_training(bool training) {
  Module::set_training(training);
  for (auto& child : children_)
    child->set_training(training);
}

bool Sequential::supports_channels_last() const {
  for (const auto& child : children_)
    if (!child->supports_channels_last()) return false;
  return !children_.empty();
}

void Sequential::set_channels_last(bool on) {
  Module::set_channels_last(on);
  for (auto& child : children_)
    child->set_channels_last(on);
}

void Sequential::set_input_grad(bool needed) {
  Module::set_input_grad(needed);
  if (!children_.empty()) children_.front()->set_input_grad(needed);
}

double Sequential::forward_flops(const Shape& input) const {
  Shape shape = input;
  double flops = 0.0;
  for (const auto& child : children_) {
    flops += child->forward_flops(shape);
    shape = child->output_shape(shape);
  }
  return flops;
}

bool Sequential::output_overwritable() const {
  return !children_.empty() && children_.back()->output_overwritable();
}

std::unique_ptr<Module> Sequential::clone_structure(Device device) const {
  auto copy = std::make_unique<Sequential>();
  for (std::size_t k = 0; k < children_.size(); ++k) {
    const Module& child = *children_[k];
    if (const auto* head = dynamic_cast<const TiedLmHead*>(&child)) {
      // Tie the copy to the copy of the embedding whose table the original reads.
      Embedding* tied = nullptr;
      for (std::size_t j = 0; j < k; ++j) {
        auto* e = dynamic_cast<Embedding*>(children_[j].get());
        if (e && &e->token_weight() == &head->token_weight())
          tied = &dynamic_cast<Embedding&>(copy->at(j));
      }
      LOCKSTEP_CHECK_HINT(tied != nullptr,
                          "put the Embedding and its TiedLmHead in the same Sequential",
                          "cannot clone ", child_name(k, child),
                          ": the embedding it is tied to is not an earlier module of this "
                          "Sequential");
      copy->emplace<TiedLmHead>(*tied);
      continue;
    }
    try {
      copy->add(child.clone_structure(device));
    } catch (const Error& e) {
      LOCKSTEP_FAIL_HINT(e.hint(), "cannot clone ", child_name(k, child), ": ", e.message());
    }
  }
  copy->set_training(training_);
  copy->set_input_grad(input_grad_);
  if (channels_last_) copy->set_channels_last(true);
  return copy;
}

}  // namespace lockstep::nn
