// lockstep-bench ops: throughput of the CPU kernels that dominate training steps.
//   GEMM GFLOP/s for the MLP 784-1024-1024-10 at batch 256 (forward C = X W^T, dX = dY W,
//   dW += dY^T X) and a square 1024^3; convolution GFLOP/s (forward, backward data, backward
//   weights) for a LeNet-like pair of layers; and the per-step cost of the cheap kernels (bias,
//   relu, loss, optimizer) in microseconds and GB/s, plus a conv/batchnorm/relu mix that shows
//   the cost of OpenMP workers spinning next to the pool (compare OMP_WAIT_POLICY settings); and
//   ResNet-50's first-stage convolutions, BatchNorm and max pooling in both image layouts
//   (--only=layout: NCHW against the NHWC of a channels-last model).
// Each figure is the median of --reps repetitions; each repetition runs the op enough times to
// take about --min-ms milliseconds. --precision=bf16 (or tf32) runs the GEMMs and convolutions in
// that precision (ops/precision.hpp); in bf16 the GEMM group adds the same GEMMs on operands
// already in bf16 and the f32 -> bf16 cast, which together show what per-op casting costs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench.hpp"
#include "lockstep/core/rng.hpp"
#include "lockstep/core/tensor.hpp"
#include "lockstep/ops/ops.hpp"

// From OpenBLAS (linked through the lockstep library); declared here to avoid its header.
extern "C" void openblas_set_num_threads(int num_threads);
extern "C" char* openblas_get_corename(void);

namespace lockstep::bench {
namespace {

using Clock = std::chrono::steady_clock;

Tensor random(const Shape& shape, std::uint64_t stream) {
  Tensor t = Tensor::empty(shape);
  Philox(7, stream).fill_uniform(t.data<float>(), t.numel(), -1.0f, 1.0f);
  return t;
}

struct Result {
  std::string name, kind;
  double flops = 0;             // per call; 0 for memory-bound kernels
  double bytes = 0;             // per call, moved to/from memory (for the cheap kernels)
  std::vector<double> seconds;  // per call, one per repetition
  double median() const {
    std::vector<double> s = seconds;
    std::sort(s.begin(), s.end());
    return s[s.size() / 2];
  }
};

// Runs fn about min_ms per repetition; returns seconds per call for each repetition.
std::vector<double> measure(const std::function<void()>& fn, int reps, double min_ms) {
  fn();  // warm-up: primitive creation, first touch of memory
  auto t0 = Clock::now();
  fn();
  double once = std::chrono::duration<double>(Clock::now() - t0).count();
  const long iters = std::max(1L, static_cast<long>(min_ms * 1e-3 / std::max(once, 1e-7)));
  std::vector<double> out;
  for (int r = 0; r < reps; ++r) {
    auto start = Clock::now();
    for (long i = 0; i < iters; ++i)
      fn();
    out.push_back(std::chrono::duration<double>(Clock::now() - start).count() / iters);
  }
  return out;
}

std::string json_escape_free(const std::string& s) {
  return "\"" + s + "\"";
}

int run_ops_bench(const Args& args) {
  const int threads = static_cast<int>(args.get_int("threads", 2));
  const int reps = static_cast<int>(args.get_int("reps", 7));
  const double min_ms = args.get_double("min-ms", 100.0);
  const std::string only = args.get("only", "");  // gemm, conv, cheap, mix, layout (empty: all)
  ops::Context ctx(Device::cpu(), threads);
  ctx.set_precision(ops::precision_from_name(args.get("precision", "fp32")));
  const bool bf16 = ctx.precision() == ops::Precision::BF16;
  auto bf16_copy = [&](const Tensor& t) {
    Tensor out = Tensor::empty(t.shape(), DType::BF16);
    ops::cast(ctx, t, out);
    return out;
  };
  std::vector<Result> results;
  auto want = [&](const char* group) { return only.empty() || only == group; };
  auto add = [&](const std::string& name, const std::string& kind, double flops, double bytes,
                 const std::function<void()>& fn) {
    Result r;
    r.name = name;
    r.kind = kind;
    r.flops = flops;
    r.bytes = bytes;
    r.seconds = measure(fn, reps, min_ms);
    std::fprintf(stderr, "  %-34s %10.1f us", r.name.c_str(), r.median() * 1e6);
    if (r.flops > 0) std::fprintf(stderr, "  %7.1f GFLOP/s", r.flops / r.median() * 1e-9);
    if (r.bytes > 0) std::fprintf(stderr, "  %7.1f GB/s", r.bytes / r.median() * 1e-9);
    std::fprintf(stderr, "\n");
    results.push_back(std::move(r));
  };
  std::fprintf(stderr, "lockstep-bench ops: threads=%d reps=%d precision %s (median per call)\n",
               threads, reps, ctx.precision_info().c_str());

  if (want("gemm")) {
    const std::int64_t batch = 256;
    const std::int64_t widths[] = {784, 1024, 1024, 10};
    for (int l = 0; l < 3; ++l) {
      const std::int64_t in = widths[l], out = widths[l + 1];
      Tensor x = random({batch, in}, 1), w = random({out, in}, 2), y = random({batch, out}, 3);
      Tensor dx = random({batch, in}, 4), dw = random({out, in}, 5);
      const double flops = 2.0 * batch * in * out;
      const std::string layer = std::to_string(in) + "x" + std::to_string(out);
      add("gemm fwd " + layer + " (X W^T)", "gemm", flops, 0,
          [&] { ops::gemm(ctx, false, true, 1.0f, x, w, 0.0f, y); });
      add("gemm bwd-data " + layer + " (dY W)", "gemm", flops, 0,
          [&] { ops::gemm(ctx, false, false, 1.0f, y, w, 0.0f, dx); });
      add("gemm bwd-weights " + layer + " (dY^T X)", "gemm", flops, 0,
          [&] { ops::gemm(ctx, true, false, 1.0f, y, x, 1.0f, dw); });
      if (bf16) {  // the same GEMMs without the per-op casts of their operands
        Tensor x16 = bf16_copy(x), w16 = bf16_copy(w), y16 = bf16_copy(y);
        add("gemm fwd " + layer + " [bf16 operands]", "gemm-bf16-operands", flops, 0,
            [&] { ops::gemm(ctx, false, true, 1.0f, x16, w16, 0.0f, y); });
        add("gemm bwd-data " + layer + " [bf16 operands]", "gemm-bf16-operands", flops, 0,
            [&] { ops::gemm(ctx, false, false, 1.0f, y16, w16, 0.0f, dx); });
        add("gemm bwd-weights " + layer + " [bf16 operands]", "gemm-bf16-operands", flops, 0,
            [&] { ops::gemm(ctx, true, false, 1.0f, y16, x16, 1.0f, dw); });
      }
    }
    Tensor a = random({1024, 1024}, 6), b = random({1024, 1024}, 7), c = random({1024, 1024}, 8);
    add("gemm square 1024^3", "gemm", 2.0 * 1024 * 1024 * 1024, 0,
        [&] { ops::gemm(ctx, false, false, 1.0f, a, b, 0.0f, c); });
    if (bf16) {
      Tensor a16 = bf16_copy(a), b16 = bf16_copy(b);
      add("gemm square 1024^3 [bf16 operands]", "gemm-bf16-operands", 2.0 * 1024 * 1024 * 1024, 0,
          [&] { ops::gemm(ctx, false, false, 1.0f, a16, b16, 0.0f, c); });
      add("cast f32->bf16 1024x1024", "cast", 0, 6.0 * 1024 * 1024,
          [&] { ops::cast(ctx, a, a16); });
    }
    if (threads > 1 && !bf16) {
      // The alternative threading: one context thread, OpenBLAS's own pthreads (process-global,
      // which is why the backend does not use them). Same shapes, same run, for the ratio.
      ops::Context single(Device::cpu(), 1);
      openblas_set_num_threads(threads);
      Tensor x = random({256, 1024}, 9), w = random({1024, 1024}, 10), y = random({256, 1024}, 11);
      add("gemm fwd 1024x1024 [openblas threads]", "gemm-openblas", 2.0 * 256 * 1024 * 1024, 0,
          [&] { ops::gemm(single, false, true, 1.0f, x, w, 0.0f, y); });
      add("gemm square 1024^3 [openblas threads]", "gemm-openblas", 2.0 * 1024 * 1024 * 1024, 0,
          [&] { ops::gemm(single, false, false, 1.0f, a, b, 0.0f, c); });
      openblas_set_num_threads(1);
    }
  }

  if (want("conv")) {
    struct ConvLayer {
      const char* name;
      std::int64_t n, c, h, o;
    };
    for (const ConvLayer& L : {ConvLayer{"conv1 256x1x28x28->32 k3p1", 256, 1, 28, 32},
                               ConvLayer{"conv2 256x32x14x14->64 k3p1", 256, 32, 14, 64}}) {
      const ops::Conv2dParams p{1, 1, 1, 1};
      Tensor x = random({L.n, L.c, L.h, L.h}, 10), w = random({L.o, L.c, 3, 3}, 11);
      Tensor b = random({L.o}, 12), y = random({L.n, L.o, L.h, L.h}, 13);
      Tensor dx = random({L.n, L.c, L.h, L.h}, 14), dw = random({L.o, L.c, 3, 3}, 15);
      Tensor db = random({L.o}, 16);
      const double flops = 2.0 * L.n * L.o * L.h * L.h * L.c * 9;
      const std::string n = L.name;
      add(n + " fwd", "conv", flops, 0, [&] { ops::conv2d_forward(ctx, x, w, b, y, p); });
      add(n + " bwd-data", "conv", flops, 0, [&] { ops::conv2d_backward_data(ctx, y, w, dx, p); });
      add(n + " bwd-weights", "conv", flops, 0,
          [&] { ops::conv2d_backward_weights(ctx, x, y, dw, db, p); });
      Tensor pooled = random({L.n, L.o, L.h / 2, L.h / 2}, 17), ws;
      add(n + " maxpool2 fwd", "pool", 0, 4.0 * (y.numel() + pooled.numel()),
          [&] { ops::pool2d_forward(ctx, ops::PoolKind::Max, y, pooled, ws, {}); });
      add(n + " maxpool2 bwd", "pool", 0, 4.0 * (y.numel() + pooled.numel()),
          [&] { ops::pool2d_backward(ctx, ops::PoolKind::Max, pooled, ws, y, {}); });
    }
  }

  if (want("cheap")) {
    const std::int64_t batch = 256, width = 1024;
    Tensor y = random({batch, width}, 20), bias = random({width}, 21),
           r = random({batch, width}, 22);
    Tensor db = random({width}, 23);
    const double act = 4.0 * batch * width;
    add("add_row_bias 256x1024", "cheap", 0, 2 * act, [&] { ops::add_row_bias(ctx, y, bias); });
    add("relu_forward 256x1024", "cheap", 0, 2 * act, [&] { ops::relu_forward(ctx, y, r); });
    add("relu_backward 256x1024", "cheap", 0, 3 * act, [&] { ops::relu_backward(ctx, r, y, y); });
    add("sum_rows 256x1024", "cheap", 0, act, [&] { ops::sum_rows(ctx, y, db); });
    Tensor logits = random({batch, 10}, 24), probs = Tensor::empty({batch, 10});
    Tensor loss = Tensor::empty({1}), dlogits = Tensor::empty({batch, 10});
    std::vector<std::int32_t> lab(batch);
    for (std::int64_t i = 0; i < batch; ++i)
      lab[i] = static_cast<std::int32_t>(i % 10);
    Tensor labels = Tensor::from_vector(lab, {batch});
    add("softmax_xent fwd+bwd 256x10", "cheap", 0, 4.0 * 4 * batch * 10, [&] {
      ops::softmax_xent_forward(ctx, logits, labels, probs, loss);
      ops::softmax_xent_backward(ctx, probs, labels, 1.0f / batch, dlogits);
    });
    // All parameters of the MLP 784-1024-1024-10 as one flat tensor.
    const std::int64_t params = 784 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10;
    Tensor w = random({params}, 25), g = random({params}, 26), buf = random({params}, 27);
    Tensor m = random({params}, 28), v = random({params}, 29);
    ops::scale(ctx, v, 0.0f);  // a second moment is never negative
    ops::SgdParams sp;
    sp.momentum = 0.9f;
    sp.weight_decay = 5e-4f;
    add("sgd_update momentum (1.86M params)", "cheap", 0, 4.0 * 5 * params,
        [&] { ops::sgd_update(ctx, w, g, buf, sp); });
    add("adamw_update (1.86M params)", "cheap", 0, 4.0 * 7 * params, [&] {
      ops::AdamWParams ap;
      ops::adamw_update(ctx, w, g, m, v, ap);
    });
    add("sum_squares (1.86M params)", "cheap", 0, 4.0 * params,
        [&] { (void)ops::sum_squares(ctx, g); });
  }

  if (want("layout")) {
    // ResNet-50's first stage at batch 16 in both image layouts (NCHW; NHWC, which a channels-last
    // model runs): its convolutions, the BatchNorm that follows each and the stem's max pooling.
    const std::int64_t n = 16;
    for (ops::ImageLayout layout : {ops::ImageLayout::NCHW, ops::ImageLayout::NHWC}) {
      const std::string tag = layout == ops::ImageLayout::NHWC ? " [NHWC]" : " [NCHW]";
      struct ConvLayer {
        const char* name;
        std::int64_t c, h, o;
        int k, stride, pad;
      };
      for (const ConvLayer& L : {ConvLayer{"conv 64x56x56->256 k1", 64, 56, 256, 1, 1, 0},
                                 ConvLayer{"conv 64x56x56->64 k3p1", 64, 56, 64, 3, 1, 1},
                                 ConvLayer{"conv 256x56x56->128 k1", 256, 56, 128, 1, 1, 0},
                                 ConvLayer{"conv 128x56x56->128 k3s2p1", 128, 56, 128, 3, 2, 1},
                                 ConvLayer{"conv 1024x14x14->256 k1", 1024, 14, 256, 1, 1, 0}}) {
        const ops::Conv2dParams p{L.stride, L.stride, L.pad, L.pad, layout};
        const std::int64_t oh = ops::window_output_size(L.h, L.k, L.stride, L.pad);
        Tensor x = random({n, L.c, L.h, L.h}, 40), w = random({L.o, L.c, L.k, L.k}, 41);
        Tensor y = random({n, L.o, oh, oh}, 42), dx = random({n, L.c, L.h, L.h}, 43);
        Tensor dw = random({L.o, L.c, L.k, L.k}, 44), no_bias;
        const double flops = 2.0 * n * L.o * oh * oh * L.c * L.k * L.k;
        const std::string name = L.name + tag;
        add(name + " fwd", "layout", flops, 0,
            [&] { ops::conv2d_forward(ctx, x, w, no_bias, y, p); });
        add(name + " bwd-data", "layout", flops, 0,
            [&] { ops::conv2d_backward_data(ctx, y, w, dx, p); });
        add(name + " bwd-weights", "layout", flops, 0,
            [&] { ops::conv2d_backward_weights(ctx, x, y, dw, no_bias, p); });
      }
      {
        const std::int64_t c = 256, hw = 56 * 56;
        Tensor x = random({n, c, 56, 56}, 45), dy = random({n, c, 56, 56}, 46);
        Tensor y = Tensor::empty(x.shape()), dx = Tensor::empty(x.shape());
        // NHWC is what BatchNorm2d hands the ops channels-last: [N*H*W, C] rows.
        const Shape ops_shape = layout == ops::ImageLayout::NHWC ? Shape{n * hw, c} : x.shape();
        Tensor xo = x.view(ops_shape), dyo = dy.view(ops_shape), yo = y.view(ops_shape),
               dxo = dx.view(ops_shape);
        Tensor gamma = random({c}, 47), beta = random({c}, 48), mean = Tensor::empty({c});
        Tensor invstd = Tensor::empty({c}), rm = Tensor::zeros({c}), rv = Tensor::zeros({c});
        Tensor dg = Tensor::zeros({c}), db = Tensor::zeros({c});
        const double act = 4.0 * static_cast<double>(x.numel());
        add("batchnorm fwd 256x56x56" + tag, "layout", 0, 3 * act, [&] {
          ops::batchnorm_forward_train(ctx, xo, gamma, beta, yo, mean, invstd, rm, rv, 0.1f, 1e-5f);
        });
        add("batchnorm bwd 256x56x56" + tag, "layout", 0, 5 * act,
            [&] { ops::batchnorm_backward(ctx, xo, dyo, gamma, mean, invstd, dxo, dg, db); });
      }
      {
        Tensor x = random({n, 64, 112, 112}, 49), y = Tensor::empty({n, 64, 56, 56}), ws;
        Tensor dx = Tensor::empty(x.shape());
        const ops::Pool2dParams p{3, 3, 2, 2, 1, 1, layout};
        const double bytes = 4.0 * static_cast<double>(x.numel() + y.numel());
        add("maxpool 3s2p1 64x112x112 fwd" + tag, "layout", 0, bytes,
            [&] { ops::pool2d_forward(ctx, ops::PoolKind::Max, x, y, ws, p); });
        add("maxpool 3s2p1 64x112x112 bwd" + tag, "layout", 0, bytes,
            [&] { ops::pool2d_backward(ctx, ops::PoolKind::Max, y, ws, dx, p); });
      }
    }
    Tensor x = random({16, 3, 224 * 224}, 50), y = Tensor::empty({16, 224 * 224, 3});
    add("batch_transpose 16x3x224x224 -> NHWC", "layout", 0, 8.0 * x.numel(),
        [&] { ops::batch_transpose(ctx, x, y); });
  }

  if (want("mix")) {
    // conv (OpenMP team) then batchnorm + relu (the pool), as in a conv-net forward pass:
    // spinning OpenMP workers compete with the pool's threads for the cores.
    const ops::Conv2dParams p{1, 1, 1, 1};
    Tensor x = random({64, 32, 14, 14}, 30), w = random({64, 32, 3, 3}, 31), b = random({64}, 32);
    Tensor y = Tensor::empty({64, 64, 14, 14}), z = Tensor::empty({64, 64, 14, 14});
    Tensor gamma = random({64}, 33), beta = random({64}, 34), mean = Tensor::empty({64});
    Tensor invstd = Tensor::empty({64}), rm = Tensor::zeros({64}), rv = Tensor::zeros({64});
    add("mix conv+bn+relu 64x32x14x14->64", "mix", 2.0 * 64 * 64 * 14 * 14 * 32 * 9, 0, [&] {
      ops::conv2d_forward(ctx, x, w, b, y, p);
      ops::batchnorm_forward_train(ctx, y, gamma, beta, z, mean, invstd, rm, rv, 0.1f, 1e-5f);
      ops::relu_forward(ctx, z, y);
    });
  }

  const char* wait_policy = std::getenv("OMP_WAIT_POLICY");
  std::string json =
      "{\"benchmark\": \"ops\", \"machine\": " + machine_json() +
      ", \"threads\": " + std::to_string(threads) + ", \"reps\": " + std::to_string(reps) +
      ", \"precision\": \"" + ops::precision_name(ctx.precision()) + "\", \"precision_info\": \"" +
      ctx.precision_info() + "\"" + ", \"openblas_core\": \"" + openblas_get_corename() +
      "\", \"omp_wait_policy\": " + json_escape_free(wait_policy ? wait_policy : "unset") +
      ", \"results\": [";
  for (std::size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::vector<double> s = r.seconds;
    std::sort(s.begin(), s.end());
    char buf[512];
    std::snprintf(
        buf, sizeof buf,
        "%s\n  {\"name\": \"%s\", \"kind\": \"%s\", \"median_us\": %.2f, \"min_us\": %.2f, "
        "\"max_us\": %.2f, \"gflops\": %.2f, \"gbytes_per_s\": %.2f}",
        i ? "," : "", r.name.c_str(), r.kind.c_str(), r.median() * 1e6, s.front() * 1e6,
        s.back() * 1e6, r.flops > 0 ? r.flops / r.median() * 1e-9 : 0.0,
        r.bytes > 0 ? r.bytes / r.median() * 1e-9 : 0.0);
    json += buf;
  }
  json += "\n]}\n";
  write_output(args, json);
  return 0;
}

LOCKSTEP_BENCH("ops",
               "CPU kernel throughput: GEMM/conv GFLOP/s, cheap kernels; --threads=2 --reps=7 "
               "--min-ms=100 --only=gemm|conv|cheap|mix|layout --precision=fp32|tf32|bf16",
               "min-ms only precision reps threads", run_ops_bench);

}  // namespace
}  // namespace lockstep::bench
