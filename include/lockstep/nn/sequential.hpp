// Sequential: modules applied one after another, the container models are composed of in C++
// (as torch.nn.Sequential). Child k's parameters and buffers are named "k." plus the child's own
// names ("3.weight", "5.bn1.running_mean"), so a Sequential nested as child 2 of another names
// them "2.k.weight". A Sequential owns its children; their addresses never change, so pointers
// to their parameters stay valid while it lives (also across moves).
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "lockstep/nn/module.hpp"

namespace lockstep::nn {

class Sequential final : public Module {
 public:
  Sequential() = default;
  Sequential(Sequential&&) noexcept = default;
  Sequential& operator=(Sequential&&) noexcept = default;

  // Appends a module and returns it (for a TiedLmHead that must name its Embedding, say).
  Module& add(std::unique_ptr<Module> module);
  template <class M, class... Args>
  M& emplace(Args&&... args) {
    auto module = std::make_unique<M>(std::forward<Args>(args)...);
    M& ref = *module;
    add(std::move(module));
    return ref;
  }
  std::size_t size() const { return children_.size(); }
  Module& at(std::size_t k) { return *children_.at(k); }
  const Module& at(std::size_t k) const { return *children_.at(k); }

  std::string type() const override { return "sequential"; }
  std::string describe() const override;  // "sequential(linear(4->8), relu)"
  // Chains the children's shapes; a child that does not accept its predecessor's output is an
  // error naming both.
  Shape output_shape(const Shape& input) const override;
  Tensor forward(ops::Context& ctx, const Tensor& x) override;
  Tensor backward(ops::Context& ctx, const Tensor& dy) override;
  void reset_parameters(std::uint64_t seed, const std::string& prefix) override;
  void collect_parameters(const std::string& prefix, std::vector<Parameter*>& out) override;
  void collect_buffers(const std::string& prefix, std::vector<Buffer*>& out) override;
  void set_training(bool training) override;
  // Only the first child's input is this module's input; the others always pass dL/dx on.
  void set_input_grad(bool needed) override;
  // When every child can run channels-last (Module::supports_channels_last); each is told.
  bool supports_channels_last() const override;
  void set_channels_last(bool on) override;
  double forward_flops(const Shape& input) const override;
  // The last child's (the output is its output); false when empty.
  bool output_overwritable() const override;
  // Clones every child; a TiedLmHead is tied to the clone of its Embedding, which must be a
  // child of this Sequential too.
  std::unique_ptr<Module> clone_structure(Device device) const override;

 private:
  std::vector<std::unique_ptr<Module>> children_;
};

// "module 3 'linear(16->10)'": how errors name a child.
std::string child_name(std::size_t k, const Module& m);

}  // namespace lockstep::nn
