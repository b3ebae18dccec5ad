// lockstep-bench gpu-step: the time of one training step (forward, backward, SGD update) of an
// MLP 784-1024-1024-10 and of a small CNN on one GPU, and of the same step on the CPU in the same
// run, with the models nn builds from a spec and optim's fused SGD (the GPU-check configuration
// builds core, ops, nn and optim). --gpu=0 runs the CPU half alone (a dry run without a GPU).
// --models=resnet50-224 (or a list, mlp,cnn,resnet50-224) adds ResNet-50 on 3x224x224 with 1000
// classes at --resnet50-batch (64), the model bench/gpu_torch.py times in PyTorch.
// Step time is the median over --reps timed steps after --warmup steps, each ending in
// Context::synchronize(). Input batches are copied from the host every step, as in training.
// --channels-last=auto|on|off is model.channels_last (auto: the convolutional models in NHWC).
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
#include "lockstep/nn/loss.hpp"
#include "lockstep/nn/model.hpp"
#include "lockstep/ops/context.hpp"
#include "lockstep/ops/ops.hpp"
#include "lockstep/optim/sgd.hpp"
#ifdef LOCKSTEP_HAVE_CUDA
#include "lockstep/ops/cuda.hpp"
#endif

namespace lockstep::bench {
namespace {

// One training step of a model built by nn from a spec, as the trainer runs it: input copied to
// the device, forward, softmax cross-entropy, backward, and the fused SGD update (momentum,
// weight decay) over the flat parameter buffers of optim.
class StepModel {
 public:
  StepModel(ops::Context& ctx, const std::string& spec, const Shape& sample, std::int64_t classes,
            nn::ChannelsLast layout)
      : ctx_(ctx),
        model_(nn::Model::build(spec, sample, classes, /*seed=*/1, ctx.device())),
        sgd_(model_.parameters(), {.lr = 0.01f, .momentum = 0.9f, .weight_decay = 5e-4f}) {
    model_.set_channels_last(nn::resolve_channels_last(layout, model_, ctx));
  }
  bool channels_last() const { return model_.channels_last(); }

  void step(const Tensor& x_host, const Tensor& labels_host) {
    Tensor x = Tensor::empty(x_host.shape(), DType::F32, ctx_.device());
    Tensor labels = Tensor::empty(labels_host.shape(), DType::I32, ctx_.device());
    ops::copy(ctx_, x_host, x);
    ops::copy(ctx_, labels_host, labels);
    sgd_.flat_params()->zero_grad(ctx_);
    Tensor logits = model_.forward(ctx_, x);
    loss_.forward(ctx_, logits, labels);
    model_.backward(ctx_, loss_.backward(ctx_, 1.0f / static_cast<float>(x.dim(0))));
    sgd_.step(ctx_);
  }

 private:
  ops::Context& ctx_;
  nn::Model model_;
  optim::Sgd sgd_;
  nn::SoftmaxCrossEntropy loss_;
};

// The two models measured: three GEMMs forward and five backward (no input gradient), and two
// conv3x3+BN+ReLU+maxpool blocks with a linear head.
constexpr const char* kMlpSpec = "mlp:1024,1024";
constexpr const char* kCnnSpec =
    "conv(32,3,pad=1)-bn-relu-maxpool(2)-conv(64,3,pad=1)-bn-relu-maxpool(2)-flatten-linear(10)";

struct BenchModel {
  const char* name;  // as bench/gpu_torch.py names it
  const char* spec;
  Shape sample;
  std::int64_t classes;
  const char* batch_flag;
  std::int64_t default_batch;
};
const BenchModel kModels[] = {
    {"mlp-784-1024-1024-10", kMlpSpec, {784}, 10, "mlp-batch", 256},
    {"cnn-2conv-28x28", kCnnSpec, {1, 28, 28}, 10, "cnn-batch", 128},
    {"resnet50-224", "resnet50", {3, 224, 224}, 1000, "resnet50-batch", 64},
};

struct Timing {
  std::string model, device;
  std::int64_t batch;
  double median_ms, min_ms;
  bool channels_last = false;
};

Timing time_steps(const std::string& model_name, const std::string& device_name, ops::Context& ctx,
                  StepModel& model, const Shape& x_shape, int warmup, int reps) {
  Tensor x = Tensor::empty(x_shape);
  Philox(9, 9).fill_uniform(x.data<float>(), x.numel(), 0.0f, 1.0f);
  Tensor labels = Tensor::empty({x_shape[0]}, DType::I32);
  for (std::int64_t i = 0; i < x_shape[0]; ++i)
    labels.data<std::int32_t>()[i] = i % 10;
  for (int i = 0; i < warmup; ++i)
    model.step(x, labels);
  ctx.synchronize();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    model.step(x, labels);
    ctx.synchronize();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return {model_name, device_name, x_shape[0], ms[ms.size() / 2], ms.front()};
}

int run(const Args& args) {
  std::vector<const BenchModel*> models;
  {
    const std::string list = args.get("models", "mlp,cnn");
    std::size_t at = 0;
    while (at <= list.size()) {
      const std::size_t end = std::min(list.find(',', at), list.size());
      const std::string want = list.substr(at, end - at);
      const BenchModel* found = nullptr;
      for (const BenchModel& m : kModels)
        if (!want.empty() && std::string(m.name).rfind(want, 0) == 0) found = &m;
      LOCKSTEP_CHECK(found, "--models: unknown model '", want,
                     "' (mlp, cnn, resnet50-224, comma-separated)");
      models.push_back(found);
      at = end + 1;
    }
  }
  const int warmup = static_cast<int>(args.get_int("warmup", 5));
  const int reps = static_cast<int>(args.get_int("reps", 30));
  const int cpu_threads = static_cast<int>(args.get_int("cpu-threads", 0));
  const bool with_cpu = args.get_int("cpu", 1) != 0;
  // --precision=fp32|tf32|bf16 for the GPU context (--tf32=1 is the older spelling of tf32).
  const ops::Precision precision = ops::precision_from_name(
      args.get("precision", args.get_int("tf32", 0) != 0 ? "tf32" : "fp32"));
  const bool tf32 = precision == ops::Precision::TF32;
  const bool with_gpu = args.get_int("gpu", 1) != 0;
  const nn::ChannelsLast layout = nn::channels_last_from_name(args.get("channels-last", "auto"));
  LOCKSTEP_CHECK_HINT(!with_gpu || cuda_available(),
                      "run on a machine with a GPU, or --gpu=0 for the CPU half alone",
                      "gpu-step needs a GPU, and none answers here");
#ifdef LOCKSTEP_HAVE_CUDA
  const std::string gpu_name = with_gpu ? ops::cuda::device_description(0) : "none";
#else
  const std::string gpu_name = "none";
#endif

  std::vector<Timing> rows;
  auto measure = [&](ops::Context& ctx, const std::string& dev, int reps_here) {
    for (const BenchModel* m : models) {
      StepModel model(ctx, m->spec, m->sample, m->classes, layout);
      Shape x_shape{args.get_int(m->batch_flag, m->default_batch)};
      x_shape.insert(x_shape.end(), m->sample.begin(), m->sample.end());
      rows.push_back(time_steps(m->name, dev, ctx, model, x_shape, warmup, reps_here));
      rows.back().channels_last = model.channels_last();
    }
  };
  if (with_gpu) {
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
    json +=
        str(i ? ", " : "", "{\"model\": \"", t.model, "\", \"device\": \"", t.device,
            "\", \"batch\": ", t.batch, ", \"median_ms\": ", t.median_ms,
            ", \"min_ms\": ", t.min_ms, ", \"channels_last\": ", t.channels_last ? "true" : "false",
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
               "training-step time of an MLP 784-1024-1024-10 and a small CNN (--models=, also "
               "resnet50-224), GPU vs CPU (--precision=fp32|tf32|bf16 for the GPU, "
               "--channels-last=auto|on|off)",
               "channels-last cnn-batch cpu cpu-threads gpu mlp-batch models precision reps "
               "resnet50-batch tf32 warmup",
               run);

}  // namespace
}  // namespace lockstep::bench
