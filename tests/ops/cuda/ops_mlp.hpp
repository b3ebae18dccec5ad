// OpsMlp: a two-layer MLP written directly over ops, for the GPU tests (the GPU-check build has
// no nn layer, and the backend is what these tests are about). Shared by test_cuda_training.cpp
// and test_cuda_precision.cpp.
#pragma once

#include <cmath>
#include <utility>

#include "support/cuda_test_support.hpp"

namespace lockstep::testing {

// A two-layer MLP written directly over ops (the nn layer is not needed to test the backend):
// x[b, in] -> linear -> relu -> dropout -> linear -> softmax cross-entropy, SGD with momentum.
struct OpsMlp {
  ops::Context& ctx;
  Device device;
  Tensor w1, b1, w2, b2, gw1, gb1, gw2, gb2, bw1, bb1, bw2, bb2;

  OpsMlp(ops::Context& c, std::int64_t in, std::int64_t hidden, std::int64_t out)
      : ctx(c), device(c.device()) {
    float s1 = 1.0f / std::sqrt(static_cast<float>(in)),
          s2 = 1.0f / std::sqrt(static_cast<float>(hidden));
    w1 = random_tensor({hidden, in}, 1, -s1, s1).to(device);
    b1 = random_tensor({hidden}, 2, -s1, s1).to(device);
    w2 = random_tensor({out, hidden}, 3, -s2, s2).to(device);
    b2 = random_tensor({out}, 4, -s2, s2).to(device);
    for (auto [g, p] : {std::pair{&gw1, &w1},
                        {&gb1, &b1},
                        {&gw2, &w2},
                        {&gb2, &b2},
                        {&bw1, &w1},
                        {&bb1, &b1},
                        {&bw2, &w2},
                        {&bb2, &b2}})
      *g = Tensor::empty(p->shape(), DType::F32, device);
  }

  // One step; returns the loss (reading it synchronises, like a trainer's log line).
  float step(const Tensor& x_host, const Tensor& labels_host, int step_index) {
    std::int64_t b = x_host.dim(0);
    Tensor x = Tensor::empty(x_host.shape(), DType::F32, device);
    Tensor labels = Tensor::empty(labels_host.shape(), DType::I32, device);
    ops::copy(ctx, x_host, x);
    ops::copy(ctx, labels_host, labels);
    Tensor h = Tensor::empty({b, w1.dim(0)}, DType::F32, device);
    ops::gemm(ctx, false, true, 1.0f, x, w1, 0.0f, h);
    ops::add_row_bias(ctx, h, b1);
    Tensor a = Tensor::empty(h.shape(), DType::F32, device);
    ops::relu_forward(ctx, h, a);
    Tensor d = Tensor::empty(h.shape(), DType::F32, device);
    Tensor mask = Tensor::empty(h.shape(), DType::U8, device);
    ops::dropout_forward(ctx, a, d, mask, 0.2f, 7, static_cast<std::uint64_t>(step_index));
    Tensor logits = Tensor::empty({b, w2.dim(0)}, DType::F32, device);
    ops::gemm(ctx, false, true, 1.0f, d, w2, 0.0f, logits);
    ops::add_row_bias(ctx, logits, b2);
    Tensor probs = Tensor::empty(logits.shape(), DType::F32, device);
    Tensor loss = Tensor::empty({1}, DType::F32, device);
    ops::softmax_xent_forward(ctx, logits, labels, probs, loss);

    for (Tensor* g : {&gw1, &gb1, &gw2, &gb2})
      ops::fill(ctx, *g, 0.0f);
    Tensor dlogits = Tensor::empty(logits.shape(), DType::F32, device);
    ops::softmax_xent_backward(ctx, probs, labels, 1.0f / static_cast<float>(b), dlogits);
    ops::gemm(ctx, true, false, 1.0f, dlogits, d, 1.0f, gw2);  // accumulate, as layers do
    ops::sum_rows(ctx, dlogits, gb2);
    Tensor dd = Tensor::empty(d.shape(), DType::F32, device);
    ops::gemm(ctx, false, false, 1.0f, dlogits, w2, 0.0f, dd);
    Tensor da = Tensor::empty(d.shape(), DType::F32, device);
    ops::dropout_backward(ctx, dd, mask, 0.2f, da);
    Tensor dh = Tensor::empty(d.shape(), DType::F32, device);
    ops::relu_backward(ctx, a, da, dh);
    ops::gemm(ctx, true, false, 1.0f, dh, x, 1.0f, gw1);
    ops::sum_rows(ctx, dh, gb1);

    ops::SgdParams p{0.2f, 0.9f, 0.0f, 1e-4f, false, step_index == 0, Tensor(), 1};
    ops::sgd_update(ctx, w1, gw1, bw1, p);
    ops::sgd_update(ctx, b1, gb1, bb1, p);
    ops::sgd_update(ctx, w2, gw2, bw2, p);
    ops::sgd_update(ctx, b2, gb2, bb2, p);
    return loss.item();
  }
};

}  // namespace lockstep::testing
