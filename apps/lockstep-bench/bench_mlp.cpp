// lockstep-bench mlp: one training step (forward, loss, backward, SGD step) of a model, by default
// 784-1024-1024-10 at batch 256, against the time its GEMMs alone take on the same Context.
//
// The bound is the sum, over the GEMMs the step really runs, of each GEMM's median time when run
// alone with the same shape, transposes and beta (forward x W^T, weight gradient dy^T x, and input
// gradient dy W for every layer but the first, whose input needs no gradient). fraction_of_bound
// = bound / step time (the median over repetitions of that ratio): 1.0 would mean everything that
// is not a GEMM (bias, ReLU, loss, optimizer, memory traffic) costs nothing. The figure
// fraction_of_3x_bound charges 3 x forward FLOPs at the measured GEMM rate instead, i.e. also
// counts the first layer's skipped input gradient. A per-phase split from a separately timed,
// instrumented run shows where the rest goes.
//
// --precision=fp32|tf32|bf16 sets the Context's precision (ops/precision.hpp). In bf16 the bound's
// GEMMs take f32 operands as the step does: activations are cast per call, the weight operand
// once (it sits in a reuse window, as the Model's parameters do). --reuse=0 runs the step's
// layers without the Model's reuse window, so every GEMM casts its weight again: the difference
// is what the weight-cast cache saves.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <sstream>

#include "bench.hpp"
#include "lockstep/core/clock.hpp"
#include "lockstep/core/rng.hpp"
#include "lockstep/nn/linear.hpp"
#include "lockstep/nn/loss.hpp"
#include "lockstep/nn/model.hpp"
#include "lockstep/ops/ops.hpp"
#include "lockstep/optim/sgd.hpp"

namespace lockstep::bench {
namespace {

Tensor random_f32(const Shape& shape, std::uint64_t stream) {
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  Philox(1, stream).fill_uniform(v.data(), static_cast<std::int64_t>(v.size()), -1.0f, 1.0f);
  return Tensor::from_vector(v, shape);
}

// "C,H,W" (or "F", "C,H,W" with 'x' as separator too): one sample's shape.
Shape parse_sample_shape(const std::string& text) {
  Shape shape;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t end = text.find_first_of(",x", pos);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(pos, end - pos);
    char* stop = nullptr;
    const long long v = std::strtoll(item.c_str(), &stop, 10);
    LOCKSTEP_CHECK(!item.empty() && stop == item.c_str() + item.size() && v > 0,
                   "--input must be a sample shape such as 1,28,28 or 3,32,32, got '", text, "'");
    shape.push_back(v);
    pos = end + 1;
  }
  return shape;
}

std::string join_ms(const std::vector<double>& seconds) {
  std::string out;
  for (std::size_t i = 0; i < seconds.size(); ++i)
    out += str(i ? ", " : "", seconds[i] * 1e3);
  return out;
}

struct Gemm {
  std::string name;
  bool trans_a, trans_b;
  std::int64_t m, n, k;  // C[m, n] = op(A)[m, k] op(B)[k, n]
  float beta;
  double seconds = 0.0;
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * k; }
};

int run(const Args& args) {
  const int threads = static_cast<int>(args.get_int("threads", 2));
  const std::int64_t batch = args.get_int("batch", 256);
  const std::string spec = args.get("model", "mlp:1024,1024");
  const int reps = static_cast<int>(args.get_int("reps", 7));
  const int steps = static_cast<int>(args.get_int("steps", 10));
  const bool reuse = args.get_int("reuse", 1) != 0;
  const bool split_phases = args.get_int("phases", 1) != 0;  // 0: skip the per-phase run
  LOCKSTEP_CHECK(reps >= 5, "--reps must be at least 5 (medians of >= 5 repetitions), got ", reps);
  LOCKSTEP_CHECK(threads >= 1 && batch >= 1 && steps >= 1,
                 "--threads, --batch, --steps must be positive");
  const std::int64_t classes = args.get_int("classes", 10);
  const Shape sample = parse_sample_shape(args.get("input", "1,28,28"));
  LOCKSTEP_CHECK(classes >= 2, "--classes must be at least 2, got ", classes);

  ops::Context ctx(Device::cpu(), threads);
  ctx.set_precision(ops::precision_from_name(args.get("precision", "fp32")));
  nn::Model model = nn::Model::build(spec, sample, classes, 1);
  const std::string layout = args.get("channels-last", "auto");
  const bool nhwc = nn::resolve_channels_last(nn::channels_last_from_name(layout), model, ctx);
  model.set_channels_last(nhwc);
  LOCKSTEP_CHECK(reuse || !nhwc,
                 "--reuse=0 runs the layers without the model's layout conversions: add "
                 "--channels-last=off");
  optim::Sgd sgd(model.parameters(), {.lr = 0.01f, .momentum = 0.9f});
  nn::SoftmaxCrossEntropy loss;
  Shape input_shape{batch};
  input_shape.insert(input_shape.end(), sample.begin(), sample.end());
  Tensor x = random_f32(input_shape, 1);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(batch));
  for (std::size_t i = 0; i < labels.size(); ++i)
    labels[i] = static_cast<std::int32_t>(i % classes);
  Tensor y = Tensor::from_vector(labels, {batch});
  const float scale = 1.0f / static_cast<float>(batch);

  std::vector<Tensor> weights;  // what the Model's reuse window holds
  for (const nn::Parameter* p : model.parameters())
    weights.push_back(p->value);
  auto step = [&] {
    sgd.flat_params()->zero_grad(ctx);
    if (reuse) {
      Tensor logits = model.forward(ctx, x);
      loss.forward(ctx, logits, y);
      model.backward(ctx, loss.backward(ctx, scale));
    } else {  // Model::forward/backward minus the reuse window
      Tensor h = x;
      for (std::size_t i = 0; i < model.num_layers(); ++i)
        h = model.layer(i).forward(ctx, h);
      loss.forward(ctx, h, y);
      Tensor d = loss.backward(ctx, scale);
      for (std::size_t i = model.num_layers(); i-- > 0;)
        d = model.layer(i).backward(ctx, d);
    }
    sgd.step(ctx);
  };

  // The GEMMs of one step, each to be timed alone on the same context.
  std::vector<Gemm> gemms;
  bool first_linear = true;
  for (std::size_t i = 0; i < model.num_layers(); ++i) {
    auto* lin = dynamic_cast<nn::Linear*>(&model.layer(i));
    if (!lin) continue;
    std::int64_t in = lin->in_features(), out = lin->out_features();
    gemms.push_back({str(i, ".forward"), false, true, batch, out, in, 0.0f});
    gemms.push_back({str(i, ".weight_grad"), true, false, out, in, batch, 1.0f});
    if (!first_linear) gemms.push_back({str(i, ".input_grad"), false, false, batch, in, out, 0.0f});
    first_linear = false;
  }
  struct Operands {
    Tensor a, b, c;
  };
  std::vector<Operands> operands;
  for (const Gemm& g : gemms) {
    operands.push_back({random_f32(g.trans_a ? Shape{g.k, g.m} : Shape{g.m, g.k}, 2),
                        random_f32(g.trans_b ? Shape{g.n, g.k} : Shape{g.k, g.n}, 3),
                        random_f32({g.m, g.n}, 4)});
  }
  auto run_gemm = [&](std::size_t i) {
    const Gemm& g = gemms[i];
    // The weight operand (b of forward and input-gradient GEMMs) in a reuse window, as in a step.
    if (!g.trans_a) ctx.begin_reuse({operands[i].b});
    ops::gemm(ctx, g.trans_a, g.trans_b, 1.0f, operands[i].a, operands[i].b, g.beta, operands[i].c);
    ctx.end_reuse();
  };

  // Repetitions interleave the step and its GEMMs, so that a change in the load from other
  // processes on a shared machine hits both sides of each repetition's ratio alike.
  auto mean_time = [&](const std::function<void()>& fn) {
    auto t0 = Clock::now();
    for (int i = 0; i < steps; ++i)
      fn();
    ctx.synchronize();
    return seconds_since(t0) / steps;
  };
  step();
  for (std::size_t i = 0; i < gemms.size(); ++i)
    run_gemm(i);
  std::vector<double> step_times, bound_times, ratios;
  std::vector<std::vector<double>> gemm_times(gemms.size());
  std::vector<double> step_cpu_times;  // CPU seconds of the whole process per step
  for (int r = 0; r < reps; ++r) {
    const double cpu0 = process_cpu_seconds();
    double step_r = mean_time(step);
    step_cpu_times.push_back((process_cpu_seconds() - cpu0) / steps);
    double bound_r = 0.0;
    for (std::size_t i = 0; i < gemms.size(); ++i) {
      double t = mean_time([&] { run_gemm(i); });
      gemm_times[i].push_back(t);
      bound_r += t;
    }
    step_times.push_back(step_r);
    bound_times.push_back(bound_r);
    ratios.push_back(bound_r / step_r);
  }
  double step_s = median(step_times), bound_s = median(bound_times);
  double fraction = median(ratios);
  double gemm_flops = 0.0;
  for (std::size_t i = 0; i < gemms.size(); ++i) {
    gemms[i].seconds = median(gemm_times[i]);
    gemm_flops += gemms[i].flops();
  }
  double gemm_rate = gemm_flops / bound_s;
  double fwd_flops = model.forward_flops() * static_cast<double>(batch);
  double bound_3x_s = 3.0 * fwd_flops / gemm_rate;

  // Where the time goes: the same step, layer by layer, with a synchronised timer per phase.
  std::vector<std::pair<std::string, std::vector<double>>> phases;
  auto timed = [&](const std::string& name, const std::function<void()>& fn, int rep) {
    auto t0 = Clock::now();
    fn();
    ctx.synchronize();
    double t = seconds_since(t0);
    auto it = std::find_if(phases.begin(), phases.end(), [&](auto& p) { return p.first == name; });
    if (it == phases.end()) {
      phases.push_back({name, {}});
      it = phases.end() - 1;
    }
    if (rep >= 0) it->second.push_back(t);
  };
  for (int rep = -1; split_phases && rep < reps * steps; ++rep) {  // rep -1: warm-up, unrecorded
    timed(
        "zero_grad", [&] { sgd.flat_params()->zero_grad(ctx); }, rep);
    if (reuse) ctx.begin_reuse(weights);  // as Model::forward does
    Tensor h = x;
    for (std::size_t i = 0; i < model.num_layers(); ++i) {
      timed(
          str(i, ".", model.layer(i).type(), ".forward"),
          [&] { h = model.layer(i).forward(ctx, h); }, rep);
    }
    Tensor d;
    timed(
        "loss.forward+backward",
        [&] {
          loss.forward(ctx, h, y);
          d = loss.backward(ctx, scale);
        },
        rep);
    for (std::size_t i = model.num_layers(); i-- > 0;) {
      timed(
          str(i, ".", model.layer(i).type(), ".backward"),
          [&] { d = model.layer(i).backward(ctx, d); }, rep);
    }
    ctx.end_reuse();
    timed(
        "sgd.step", [&] { sgd.step(ctx); }, rep);
  }

  std::ostringstream json;
  json << "{\"benchmark\": \"mlp\", \"machine\": " << machine_json() << ",\n"
       << " \"config\": {\"model\": \"" << spec << "\", \"layers\": \"" << model.layer_spec()
       << "\", \"input\": \"" << shape_str(sample) << "\", \"classes\": " << classes
       << ", \"batch\": " << batch << ", \"threads\": " << threads << ", \"reps\": " << reps
       << ", \"steps_per_rep\": " << steps << ", \"precision\": \""
       << ops::precision_name(ctx.precision()) << "\", \"precision_info\": \""
       << ctx.precision_info() << "\", \"reuse\": " << (reuse ? "true" : "false")
       << ", \"channels_last\": " << (nhwc ? "true" : "false") << "},\n"
       << " \"step_ms_per_rep\": [" << join_ms(step_times) << "],\n"
       << " \"gemm_bound_ms_per_rep\": [" << join_ms(bound_times) << "],\n"
       << " \"step_ms\": " << step_s * 1e3 << ", \"samples_per_s\": " << batch / step_s
       << ", \"step_cpu_ms\": " << median(step_cpu_times) * 1e3 << ",\n"
       << " \"gemm_bound_ms\": " << bound_s * 1e3 << ", \"gemm_gflops\": " << gemm_rate * 1e-9
       << ", \"fraction_of_bound\": " << fraction << ",\n"
       << " \"forward_gflop_per_step\": " << fwd_flops * 1e-9
       << ", \"bound_3x_ms\": " << bound_3x_s * 1e3
       << ", \"fraction_of_3x_bound\": " << bound_3x_s / step_s << ",\n"
       << " \"gemms\": [";
  for (std::size_t i = 0; i < gemms.size(); ++i) {
    const Gemm& g = gemms[i];
    json << (i ? ",\n   " : "\n   ") << "{\"name\": \"" << g.name << "\", \"m\": " << g.m
         << ", \"n\": " << g.n << ", \"k\": " << g.k << ", \"trans_a\": " << g.trans_a
         << ", \"trans_b\": " << g.trans_b << ", \"ms\": " << g.seconds * 1e3
         << ", \"gflops\": " << g.flops() / g.seconds * 1e-9 << "}";
  }
  json << "],\n \"phases_ms\": {";
  double phase_total = 0.0;
  for (std::size_t i = 0; i < phases.size(); ++i) {
    double ms = median(phases[i].second) * 1e3;
    phase_total += ms;
    json << (i ? ",\n   " : "\n   ") << "\"" << phases[i].first << "\": " << ms;
  }
  json << "},\n \"phases_total_ms\": " << phase_total << "}\n";
  write_output(args, json.str());

  std::fprintf(stderr,
               "mlp %s batch %lld threads %d %s: %.2f ms/step (CPU %.2f ms), %.0f samples/s; GEMMs "
               "alone %.2f ms (%.1f GFLOP/s) -> %.3f of bound (%.3f of the 3x-forward bound)\n",
               spec.c_str(), static_cast<long long>(batch), threads,
               ops::precision_name(ctx.precision()), step_s * 1e3, median(step_cpu_times) * 1e3,
               batch / step_s, bound_s * 1e3, gemm_rate * 1e-9, fraction, bound_3x_s / step_s);
  for (auto& [name, t] : phases) {
    std::fprintf(stderr, "  %-28s %8.3f ms\n", name.c_str(), median(t) * 1e3);
  }
  return 0;
}

}  // namespace

LOCKSTEP_BENCH("mlp",
               "MLP training step vs the GEMM bound (--threads=2 --batch=256 --model=mlp:1024,1024 "
               "--precision=fp32|tf32|bf16 --reuse=1); any model spec with --input=3,32,32 "
               "--classes=10 --channels-last=auto|on|off; --phases=0 skips the per-phase split",
               "batch channels-last classes input model phases precision reps reuse steps threads",
               run);

}  // namespace lockstep::bench
