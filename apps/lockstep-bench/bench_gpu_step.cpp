// lockstep-bench gpu-step: the time of one training step (forward, backward, SGD update) of an
// MLP 784-1024-1024-10 and of a small CNN on one GPU, and of the same step on the CPU in the same
// run, written directly over ops (so it builds in the GPU-check configuration, which has no nn/).
// Step time is the median over --reps timed steps after --warmup steps, each ending in
// Context::synchronize(). Input batches are copied from the host every step, as in training.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "bench.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/core/rng.hpp"
#include "lockstep/ops/context.hpp"
#include "lockstep/ops/ops.hpp"
#ifdef LOCKSTEP_HAVE_CUDA
#include "lockstep/ops/cuda.hpp"
#endif

namespace lockstep::bench {
namespace {

Tensor uniform(const Shape& shape, std::uint64_t stream, float bound, Device device) {
  Tensor t = Tensor::empty(shape);
  Philox(1, stream).fill_uniform(t.data<float>(), t.numel(), -bound, bound);
  return t.to(device);
}

// A parameter with its gradient (accumulated into by backward ops) and SGD momentum buffer.
struct Param {
  Tensor value, grad, momentum;
  Param(const Shape& s, std::uint64_t stream, float bound, ops::Context& ctx)
      : value(uniform(s, stream, bound, ctx.device())),
        grad(Tensor::empty(s, DType::F32, ctx.device())),
        momentum(Tensor::empty(s, DType::F32, ctx.device())) {
    ops::fill(ctx, grad, 0.0f);
    ops::fill(ctx, momentum, 0.0f);
  }
};

class StepModel {
 public:
  virtual ~StepModel() = default;
  virtual void step(const Tensor& x_host, const Tensor& labels_host, bool first) = 0;
};

// Shared tail of both models: loss, its gradient, and the SGD update of every parameter.
class ModelBase : public StepModel {
 protected:
  explicit ModelBase(ops::Context& ctx) : ctx_(ctx), dev_(ctx.device()) {}
  Tensor empty(const Shape& s, DType t = DType::F32) { return Tensor::empty(s, t, dev_); }
  Param& param(const Shape& s, float bound) {
    params_.push_back(std::make_unique<Param>(s, params_.size() + 1, bound, ctx_));
    return *params_.back();
  }
  Tensor loss_grad(const Tensor& logits, const Tensor& labels) {
    Tensor probs = empty(logits.shape()), loss = empty({1}), dlogits = empty(logits.shape());
    ops::softmax_xent_forward(ctx_, logits, labels, probs, loss);
    ops::softmax_xent_backward(ctx_, probs, labels, 1.0f / static_cast<float>(logits.dim(0)),
                               dlogits);
    return dlogits;
  }
  void update(bool first) {
    ops::SgdParams p{0.01f, 0.9f, 0.0f, 5e-4f, false, first};
    for (auto& prm : params_) {
      ops::sgd_update(ctx_, prm->value, prm->grad, prm->momentum, p);
      ops::fill(ctx_, prm->grad, 0.0f);
    }
  }
  std::pair<Tensor, Tensor> upload(const Tensor& x_host, const Tensor& labels_host) {
    Tensor x = empty(x_host.shape()), labels = empty(labels_host.shape(), DType::I32);
    ops::copy(ctx_, x_host, x);
    ops::copy(ctx_, labels_host, labels);
    return {x, labels};
  }

  ops::Context& ctx_;
  Device dev_;
  std::vector<std::unique_ptr<Param>> params_;
};

// 784-1024-1024-10 with ReLU: three GEMMs forward, five backward (no input gradient).
class Mlp final : public ModelBase {
 public:
  Mlp(ops::Context& ctx, std::vector<std::int64_t> widths) : ModelBase(ctx) {
    for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
      float bound = 1.0f / std::sqrt(static_cast<float>(widths[i]));
      Param& w = param({widths[i + 1], widths[i]}, bound);
      Param& b = param({widths[i + 1]}, bound);
      layers_.push_back({&w, &b});
    }
  }
  void step(const Tensor& x_host, const Tensor& labels_host, bool first) override {
    auto [x, labels] = upload(x_host, labels_host);
    std::int64_t n = x.dim(0);
    std::vector<Tensor> inputs{x};
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      Tensor y = empty({n, layers_[i].w->value.dim(0)});
      ops::gemm(ctx_, false, true, 1.0f, inputs.back(), layers_[i].w->value, 0.0f, y);
      ops::add_row_bias(ctx_, y, layers_[i].b->value);
      if (i + 1 < layers_.size()) ops::relu_forward(ctx_, y, y);
      inputs.push_back(y);
    }
    Tensor dy = loss_grad(inputs.back(), labels);
    for (std::size_t i = layers_.size(); i-- > 0;) {
      if (i + 1 < layers_.size()) ops::relu_backward(ctx_, inputs[i + 1], dy, dy);
      ops::gemm(ctx_, true, false, 1.0f, dy, inputs[i], 1.0f, layers_[i].w->grad);
      ops::sum_rows(ctx_, dy, layers_[i].b->grad);
      if (i == 0) break;
      Tensor dx = empty(inputs[i].shape());
      ops::gemm(ctx_, false, false, 1.0f, dy, layers_[i].w->value, 0.0f, dx);
      dy = dx;
    }
    update(first);
  }

 private:
  struct Layer {
    Param *w, *b;
  };
  std::vector<Layer> layers_;
};

// [N,1,28,28] -> conv3x3(32)+BN+ReLU -> maxpool2 -> conv3x3(64)+BN+ReLU -> maxpool2 -> linear(10).
class SmallCnn final : public ModelBase {
 public:
  explicit SmallCnn(ops::Context& ctx) : ModelBase(ctx) {
    for (auto [in, out] : {std::pair<std::int64_t, std::int64_t>{1, 32}, {32, 64}}) {
      Block b;
      b.w = &param({out, in, 3, 3}, 1.0f / std::sqrt(9.0f * static_cast<float>(in)));
      b.gamma = &param({out}, 0.0f);
      ops::fill(ctx, b.gamma->value, 1.0f);
      b.beta = &param({out}, 0.0f);
      b.running_mean = empty({out});
      b.running_var = empty({out});
      ops::fill(ctx, b.running_mean, 0.0f);
      ops::fill(ctx, b.running_var, 1.0f);
      blocks_.push_back(b);
    }
    fc_w_ = &param({10, 64 * 7 * 7}, 1.0f / std::sqrt(64.0f * 49.0f));
    fc_b_ = &param({10}, 0.0f);
  }

  void step(const Tensor& x_host, const Tensor& labels_host, bool first) override {
    auto [x, labels] = upload(x_host, labels_host);
    std::int64_t n = x.dim(0);
    const ops::Conv2dParams conv{1, 1, 1, 1};
    const ops::Pool2dParams pool{2, 2, 2, 2, 0, 0};
    struct Saved {
      Tensor in, conv_out, mean, invstd, bn_out, pooled;
    };
    std::vector<Saved> saved;
    Tensor h = x;
    for (Block& b : blocks_) {
      Saved s;
      s.in = h;
      std::int64_t c = b.w->value.dim(0), hh = h.dim(2), ww = h.dim(3);
      s.conv_out = empty({n, c, hh, ww});
      ops::conv2d_forward(ctx_, h, b.w->value, Tensor(), s.conv_out, conv);
      s.bn_out = empty(s.conv_out.shape());
      s.mean = empty({c});
      s.invstd = empty({c});
      ops::batchnorm_forward_train(ctx_, s.conv_out, b.gamma->value, b.beta->value, s.bn_out,
                                   s.mean, s.invstd, b.running_mean, b.running_var, 0.1f, 1e-5f);
      ops::relu_forward(ctx_, s.bn_out, s.bn_out);
      s.pooled = empty({n, c, hh / 2, ww / 2});
      ops::pool2d_forward(ctx_, ops::PoolKind::Max, s.bn_out, s.pooled, b.pool_ws, pool);
      h = s.pooled;
      saved.push_back(s);
    }
    Tensor flat = h.view({n, h.numel() / n});
    Tensor logits = empty({n, 10});
    ops::gemm(ctx_, false, true, 1.0f, flat, fc_w_->value, 0.0f, logits);
    ops::add_row_bias(ctx_, logits, fc_b_->value);

    Tensor dlogits = loss_grad(logits, labels);
    ops::gemm(ctx_, true, false, 1.0f, dlogits, flat, 1.0f, fc_w_->grad);
    ops::sum_rows(ctx_, dlogits, fc_b_->grad);
    Tensor dflat = empty(flat.shape());
    ops::gemm(ctx_, false, false, 1.0f, dlogits, fc_w_->value, 0.0f, dflat);
    Tensor dh = dflat.view(h.shape());
    for (std::size_t i = blocks_.size(); i-- > 0;) {
      Block& b = blocks_[i];
      Saved& s = saved[i];
      Tensor dbn = empty(s.bn_out.shape());
      ops::pool2d_backward(ctx_, ops::PoolKind::Max, dh, b.pool_ws, dbn, pool);
      ops::relu_backward(ctx_, s.bn_out, dbn, dbn);
      Tensor dconv = empty(s.conv_out.shape());
      ops::batchnorm_backward(ctx_, s.conv_out, dbn, b.gamma->value, s.mean, s.invstd, dconv,
                              b.gamma->grad, b.beta->grad);
      Tensor no_bias;
      ops::conv2d_backward_weights(ctx_, s.in, dconv, b.w->grad, no_bias, conv);
      if (i == 0) break;
      Tensor din = empty(s.in.shape());
      ops::conv2d_backward_data(ctx_, dconv, b.w->value, din, conv);
      dh = din;
    }
    update(first);
  }

 private:
  struct Block {
    Param *w = nullptr, *gamma = nullptr, *beta = nullptr;
    Tensor running_mean, running_var, pool_ws;
  };
  std::vector<Block> blocks_;
  Param *fc_w_ = nullptr, *fc_b_ = nullptr;
};

struct Timing {
  std::string model, device;
  std::int64_t batch;
  double median_ms, min_ms;
};

Timing time_steps(const std::string& model_name, const std::string& device_name, ops::Context& ctx,
                  StepModel& model, const Shape& x_shape, int warmup, int reps) {
  Tensor x = Tensor::empty(x_shape);
  Philox(9, 9).fill_uniform(x.data<float>(), x.numel(), 0.0f, 1.0f);
  Tensor labels = Tensor::empty({x_shape[0]}, DType::I32);
  for (std::int64_t i = 0; i < x_shape[0]; ++i)
    labels.data<std::int32_t>()[i] = i % 10;
  for (int i = 0; i < warmup; ++i)
    model.step(x, labels, i == 0);
  ctx.synchronize();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    model.step(x, labels, false);
    ctx.synchronize();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return {model_name, device_name, x_shape[0], ms[ms.size() / 2], ms.front()};
}

int run(const Args& args) {
  const std::int64_t mlp_batch = args.get_int("mlp-batch", 256);
  const std::int64_t cnn_batch = args.get_int("cnn-batch", 128);
  const int warmup = static_cast<int>(args.get_int("warmup", 5));
  const int reps = static_cast<int>(args.get_int("reps", 30));
  const int cpu_threads = static_cast<int>(args.get_int("cpu-threads", 0));
  const bool with_cpu = args.get_int("cpu", 1) != 0;
  // --precision=fp32|tf32|bf16 for the GPU context (--tf32=1 is the older spelling of tf32).
  const ops::Precision precision = ops::precision_from_name(
      args.get("precision", args.get_int("tf32", 0) != 0 ? "tf32" : "fp32"));
  const bool tf32 = precision == ops::Precision::TF32;
  LOCKSTEP_CHECK_HINT(cuda_available(), "run on a machine with a GPU",
                      "gpu-step needs a GPU, and none answers here");
#ifdef LOCKSTEP_HAVE_CUDA
  const std::string gpu_name = ops::cuda::device_description(0);
#else
  const std::string gpu_name = "none";  // unreachable: cuda_available() is false
#endif

  std::vector<Timing> rows;
  auto measure = [&](ops::Context& ctx, const std::string& dev, int reps_here) {
    Mlp mlp(ctx, {784, 1024, 1024, 10});
    rows.push_back(
        time_steps("mlp-784-1024-1024-10", dev, ctx, mlp, {mlp_batch, 784}, warmup, reps_here));
    SmallCnn cnn(ctx);
    rows.push_back(
        time_steps("cnn-2conv-28x28", dev, ctx, cnn, {cnn_batch, 1, 28, 28}, warmup, reps_here));
  };
  {
    ops::Context gpu(Device::cuda(0));
    gpu.set_precision(precision);
    measure(gpu,
            precision == ops::Precision::FP32 ? "cuda:0"
                                              : str("cuda:0 ", ops::precision_name(precision)),
            reps);
  }
  if (with_cpu) {
    int threads = cpu_threads > 0
                      ? cpu_threads
                      : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    ops::Context cpu(Device::cpu(), threads);
    measure(cpu, "cpu x" + std::to_string(threads), std::max(3, reps / 10));
  }

  std::string json =
      str("{\"bench\": \"gpu-step\", \"machine\": ", machine_json(), ", \"gpu\": \"", gpu_name,
          "\", \"tf32\": ", tf32 ? "true" : "false", ", \"precision\": \"",
          ops::precision_name(precision), "\", \"warmup\": ", warmup, ", \"results\": [");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Timing& t = rows[i];
    json += str(i ? ", " : "", "{\"model\": \"", t.model, "\", \"device\": \"", t.device,
                "\", \"batch\": ", t.batch, ", \"median_ms\": ", t.median_ms,
                ", \"min_ms\": ", t.min_ms,
                ", \"samples_per_s\": ", 1000.0 * static_cast<double>(t.batch) / t.median_ms, "}");
  }
  json += "]}\n";
  write_output(args, json);

  std::fprintf(stderr, "\n%-22s %-14s %6s %10s %12s %9s\n", "model", "device", "batch", "median ms",
               "samples/s", "vs cpu");
  for (const Timing& t : rows) {
    double cpu_ms = 0.0;
    for (const Timing& c : rows)
      if (c.model == t.model && c.device.rfind("cpu", 0) == 0) cpu_ms = c.median_ms;
    std::fprintf(stderr, "%-22s %-14s %6lld %10.3f %12.0f %8.1fx\n", t.model.c_str(),
                 t.device.c_str(), static_cast<long long>(t.batch), t.median_ms,
                 1000.0 * static_cast<double>(t.batch) / t.median_ms,
                 cpu_ms > 0 ? cpu_ms / t.median_ms : 0.0);
  }
  return 0;
}

LOCKSTEP_BENCH("gpu-step",
               "training-step time of an MLP 784-1024-1024-10 and a small CNN, GPU vs CPU "
               "(--precision=fp32|tf32|bf16 for the GPU)",
               "cnn-batch cpu cpu-threads mlp-batch precision reps tf32 warmup", run);

}  // namespace
}  // namespace lockstep::bench
