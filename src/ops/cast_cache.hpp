// CastCache: the bf16 copies of f32 operands that one backend makes for its GEMMs and
// convolutions under the bf16 policy. A tensor in the Context's reuse window (a parameter
// between a Model's forward and the end of its backward) is converted once per window and the
// copy reused; any other operand is converted into scratch for its operand slot, which grows to
// the largest request and is then reused, so a steady-state step allocates nothing. Used from
// the Context's thread only, like the backend that owns it. On a GPU the copies are written and
// read on the one compute stream, so reuse needs no event.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "lockstep/core/tensor.hpp"
#include "lockstep/ops/context.hpp"

namespace lockstep::ops {

class CastCache {
 public:
  // The bf16 copy of `src` (f32, on ctx's device) for operand `slot` of the current op (the
  // operands of one op take different slots); `convert(src, dst)` fills a bf16 tensor of src's
  // shape. A bf16 `src` is returned as it is.
  template <class Convert>
  Tensor get(Context& ctx, const Tensor& src, int slot, const Convert& convert) {
    if (src.dtype() == DType::BF16) return src;
    const std::uint64_t window = ctx.reuse_id(src);
    if (window == 0) {
      Tensor dst = scratch(ctx, slot, src.shape());
      convert(src, dst);
      return dst;
    }
    if (window != window_) forget_unused(window);
    Entry& e = reused_[{reinterpret_cast<std::uintptr_t>(src.raw_data()), src.numel()}];
    if (e.window != window) {
      if (!e.copy.defined()) e.copy = Tensor::empty(src.shape(), DType::BF16, ctx.device());
      convert(src, e.copy);
    }
    e.window = window;
    return e.copy.shape() == src.shape() ? e.copy : e.copy.view(src.shape());
  }

  // A bf16 tensor of `shape` in slot `slot`'s scratch (an op's bf16 output before widening);
  // valid until the slot is used again.
  Tensor scratch(Context& ctx, int slot, const Shape& shape) {
    if (scratch_.size() <= static_cast<std::size_t>(slot)) scratch_.resize(slot + 1);
    Tensor& s = scratch_[static_cast<std::size_t>(slot)];
    const std::int64_t n = shape_numel(shape);
    if (!s.defined() || s.numel() < n) s = Tensor::empty({n}, DType::BF16, ctx.device());
    return s.sub(0, shape);
  }

 private:
  struct Entry {
    Tensor copy;
    std::uint64_t window = 0;  // the window in which `copy` was made
  };

  // A new window: drop the copies nobody used in the previous one (tensors that no longer exist
  // or are no longer parameters), so the cache holds at most one model's parameters.
  void forget_unused(std::uint64_t window) {
    for (auto it = reused_.begin(); it != reused_.end();)
      it = it->second.window < window_ ? reused_.erase(it) : std::next(it);
    window_ = window;
  }

  std::map<std::pair<std::uintptr_t, std::int64_t>, Entry> reused_;
  std::vector<Tensor> scratch_;
  std::uint64_t window_ = 0;  // the latest window seen
};

}  // namespace lockstep::ops
