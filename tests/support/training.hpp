// Shared helpers of the distributed-training tests: a deterministic synthetic classification
// problem and a plain single-process reference loop (no engine, no communicator), which the DDP
// and DataParallel results are compared against.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/core/rng.hpp"
#include "lockstep/core/tensor.hpp"
#include "lockstep/nn/loss.hpp"
#include "lockstep/nn/model.hpp"
#include "lockstep/ops/context.hpp"
#include "lockstep/optim/sgd.hpp"

namespace lockstep::test {

struct SyntheticBatch {
  Tensor x;  // f32 [n, ...sample]
  Tensor y;  // i32 [n]
};

// Batch `step` of a fixed problem: x ~ U(-1, 1), label = argmax of a fixed linear map of x, so
// the problem is learnable and every process generates the same global batch.
inline SyntheticBatch synthetic_batch(std::int64_t n, const Shape& sample, int classes,
                                      std::int64_t step) {
  std::int64_t features = shape_numel(sample);
  std::vector<float> x(static_cast<std::size_t>(n * features));
  Philox data(7, static_cast<std::uint64_t>(step));
  data.fill_uniform(x.data(), static_cast<std::int64_t>(x.size()), -1.0f, 1.0f);
  Philox map(11, 0);
  std::vector<std::int32_t> y(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    float best = -1e30f;
    for (int c = 0; c < classes; ++c) {
      float s = 0;
      for (std::int64_t f = 0; f < features; ++f)
        s += x[static_cast<std::size_t>(i * features + f)] *
             (map.uniform(static_cast<std::uint64_t>(c * features + f)) - 0.5f);
      if (s > best) best = s, y[static_cast<std::size_t>(i)] = c;
    }
  }
  Shape xs = sample;
  xs.insert(xs.begin(), n);
  return {Tensor::from_vector(x, xs), Tensor::from_vector(y, {n})};
}

inline std::vector<std::vector<float>> parameter_values(const nn::Model& model) {
  std::vector<std::vector<float>> out;
  for (const nn::Parameter* p : model.parameters())
    out.push_back(p->value.to_vector<float>());
  return out;
}

inline double max_abs_difference(const std::vector<std::vector<float>>& a,
                                 const std::vector<std::vector<float>>& b) {
  double worst = a.size() == b.size() ? 0.0 : 1e30;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (a[i].size() != b[i].size()) return 1e30;
    for (std::size_t j = 0; j < a[i].size(); ++j)
      worst = std::max(worst, static_cast<double>(std::abs(a[i][j] - b[i][j])));
  }
  return worst;
}

struct ProblemSpec {
  std::string model = "mlp:24,16";
  Shape sample = {1, 4, 4};
  int classes = 5;
  std::uint64_t seed = 100;
  std::int64_t global_batch = 16;
  int steps = 6;
  float lr = 0.1f;
  float momentum = 0.9f;
  // When set, the model is composed in C++ from this network rather than built from `model`.
  std::function<nn::Sequential()> network;
};

inline nn::Model make_model(const ProblemSpec& p, std::uint64_t seed) {
  if (p.network) return nn::Model(p.network(), p.sample, p.classes, seed);
  return nn::Model::build(p.model, p.sample, p.classes, seed);
}

// One process, one model, the whole global batch per step: the reference.
inline std::vector<std::vector<float>> train_single_process(const ProblemSpec& p) {
  ops::Context ctx(Device::cpu(), 1);
  nn::Model model = make_model(p, p.seed);
  optim::SgdOptions so;
  so.lr = p.lr;
  so.momentum = p.momentum;
  optim::Sgd sgd(model.parameters(), so);
  nn::SoftmaxCrossEntropy loss;
  for (int step = 0; step < p.steps; ++step) {
    SyntheticBatch b = synthetic_batch(p.global_batch, p.sample, p.classes, step);
    model.zero_grad(ctx);
    Tensor logits = model.forward(ctx, b.x);
    loss.forward(ctx, logits, b.y);
    model.backward(ctx, loss.backward(ctx, 1.0f / static_cast<float>(p.global_batch)));
    sgd.step(ctx);
  }
  return parameter_values(model);
}

}  // namespace lockstep::test
