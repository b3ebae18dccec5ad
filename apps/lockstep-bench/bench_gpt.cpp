// lockstep-bench gpt: training throughput of a GPT (forward, cross-entropy, backward) in tokens/s,
// the figure bench/gpt_torch.py measures for the same model in PyTorch. One step is zero_grad,
// forward of a [batch, seq] token batch, the loss over all batch * seq positions and backward,
// ending in Context::synchronize(); with --optimizer=adamw also an AdamW update of every parameter
// (weight decay 0.1 on matrices only, as configs/gpt_tiny.ini; the peer script's --optimizer=adamw
// does the same), so a whole training step is timed. --precision=fp32|tf32|bf16 sets the
// Context's GEMM/attention precision (ops/precision.hpp). --recompute=none|gelu|block sets the
// blocks' activation recompute (train.recompute). --attention=auto|reference|cudnn|naive sets the
// attention kernel (train.attention; naive: the CUDA reference of the flash kernels); what it
// resolved to is recorded (attention_kernel, attention_detail) and printed. --loss=fused (the
// trainer's: the LM head's classifier and loss chunk by chunk, --loss-chunk rows at a time, 0 =
// all) or --loss=logits (the loss over the whole [batch * seq, vocab] logits, written in their
// buffer: the path before the fused loss, for comparison in one binary).
// Memory, from the device allocator over the warm-up and timed steps: peak_bytes is its peak
// (every tensor: the figure PyTorch's max_memory_allocated gives); activation_peak_bytes is that
// less what it held before the first step (parameters, gradients, inputs, optimizer state), so it
// counts every activation, the loss's buffers and the reused buffers; held_between_steps_bytes is
// what stays allocated after the steps (the reused buffers).
// Reported: the median over --reps repetitions of the mean step time over --steps steps, after
// one warm-up step, and a per-layer split from a separately timed, synchronised run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>

#include "bench.hpp"
#include "lockstep/core/allocator.hpp"
#include "lockstep/core/rng.hpp"
#include "lockstep/nn/loss.hpp"
#include "lockstep/nn/model.hpp"
#include "lockstep/nn/transformer.hpp"
#include "lockstep/ops/ops.hpp"
#include "lockstep/optim/adamw.hpp"

// OpenBLAS (the CPU GEMM) picks its kernels by CPU model at load time; on CPUs newer than the
// library it falls back to an SSE3 kernel ("Prescott") about 3x slower than its AVX-512 one
// (OPENBLAS_CORETYPE=SkylakeX overrides it). Every record says which kernel ran.
extern "C" char* openblas_get_corename(void);

namespace lockstep::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return one.empty() ? "unknown" : one + " " + five + " " + fifteen;
}

// Text inside a JSON string: quotes and backslashes escaped, control characters as spaces (a
// library's message may hold either).
std::string json_text(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += static_cast<unsigned char>(ch) < 0x20 ? ' ' : ch;
  }
  return out;
}

Tensor random_tokens(const Shape& shape, std::int64_t vocab, std::uint64_t stream) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(shape_numel(shape)));
  Philox rng(7, stream);
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<std::int32_t>(rng.u32(i) % static_cast<std::uint32_t>(vocab));
  return Tensor::from_vector(v, shape);
}

int run(const Args& args) {
  const std::string spec = args.get("model", "gpt-mini");
  const std::int64_t batch = args.get_int("batch", 8);
  const std::int64_t seq = args.get_int("seq", 256);
  const std::int64_t vocab = args.get_int("vocab", 256);
  const int threads = static_cast<int>(args.get_int("threads", 2));
  const int steps = static_cast<int>(args.get_int("steps", 5));
  const int reps = static_cast<int>(args.get_int("reps", 5));
  const Device device = parse_device(args.get("device", "cpu"));
  const std::string attention = args.get("attention", "auto");
  const std::string optimizer = args.get("optimizer", "none");
  const std::string recompute = args.get("recompute", "none");
  const std::string loss_path = args.get("loss", "fused");
  std::int64_t loss_chunk = args.get_int("loss-chunk", nn::kLossChunkAuto);
  LOCKSTEP_CHECK(reps >= 3 && steps >= 1 && batch >= 1 && seq >= 1 && threads >= 1,
                 "--reps must be >= 3 and --steps, --batch, --seq, --threads positive");
  const ops::AttentionKernel attention_kernel = ops::attention_kernel_from_name(attention);
  LOCKSTEP_CHECK(optimizer == "none" || optimizer == "adamw", "--optimizer must be none or adamw");
  LOCKSTEP_CHECK(loss_path == "fused" || loss_path == "logits", "--loss must be fused or logits");
  LOCKSTEP_CHECK(loss_chunk >= 0 || loss_chunk == nn::kLossChunkAuto,
                 "--loss-chunk must be >= 0 (0: all rows at once), or -1 (the default rows)");

  ops::Context ctx(device, threads);
  ctx.set_precision(ops::precision_from_name(args.get("precision", "fp32")));
  nn::Model model = nn::Model::build(spec, {seq}, vocab, 1, device);
  std::unique_ptr<optim::AdamW> adamw;
  if (optimizer == "adamw")
    adamw = std::make_unique<optim::AdamW>(
        model.parameters(),
        optim::AdamWOptions{
            .lr = 3e-4f, .weight_decay = 0.1f, .decay = optim::DecayScope::Matrices});
  const std::int64_t blocks = nn::set_recompute(model, nn::recompute_from_name(recompute));
  LOCKSTEP_CHECK(recompute == "none" || blocks > 0, "--recompute=", recompute, ": model ", spec,
                 " has no transformer block");
  const std::vector<nn::CausalSelfAttention*> attention_layers = nn::attention_layers(model);
  LOCKSTEP_CHECK(!attention_layers.empty(), "model ", spec, " has no attention layer");
  for (nn::CausalSelfAttention* layer : attention_layers)
    layer->set_kernel(attention_kernel);
  const nn::CausalSelfAttention& first = *attention_layers.front();
  const ops::AttentionChoice attention_choice = ops::choose_attention(
      ctx, attention_kernel, batch, seq, first.heads(), first.dim() / first.heads());
  // As the trainer's engines: the loss fused into the LM head (or, --loss=logits, in the logits'
  // buffer).
  using Logits = nn::SoftmaxCrossEntropy::Logits;
  nn::SoftmaxCrossEntropy loss =
      loss_path == "fused" && model.fuses_loss()
          ? nn::SoftmaxCrossEntropy(0.0f, Logits::Fused, loss_chunk)
          : nn::SoftmaxCrossEntropy(0.0f,
                                    model.logits_overwritable() ? Logits::Overwrite : Logits::Keep);
  const bool fused = loss.logits_mode() == Logits::Fused;
  if (fused && loss_chunk == nn::kLossChunkAuto)  // what the head takes: its table's padded rows
    loss_chunk = nn::loss_chunk_rows(model.parameters().front()->value.dim(0));
  // Inputs live on the device for the whole run: the benchmark is the model, not the loader.
  Tensor x = random_tokens({batch, seq}, vocab, 1).to(device);
  Tensor y = random_tokens({batch * seq}, vocab, 2).to(device);
  const float scale = 1.0f / static_cast<float>(batch * seq);
  float last_loss = 0.0f;

  // With an optimizer the gradients are views of its flat buffer: one fill zeroes them all.
  auto zero_grad = [&] {
    if (adamw)
      adamw->flat_params()->zero_grad(ctx);
    else
      model.zero_grad(ctx);
  };
  auto step = [&] {
    zero_grad();
    model.forward_loss(ctx, x, y, loss, scale);
    model.backward_loss(ctx);
    if (adamw) adamw->step(ctx);
  };
  ctx.synchronize();
  Allocator& memory = allocator_for(device);
  const std::size_t before_steps = memory.bytes_in_use();
  memory.reset_peak_bytes();
  step();
  ctx.synchronize();
  std::vector<double> step_times;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    for (int i = 0; i < steps; ++i)
      step();
    ctx.synchronize();
    step_times.push_back(seconds_since(t0) / steps);
  }
  const std::size_t activation_peak = memory.peak_bytes_in_use() - before_steps;
  const std::size_t held_between_steps = memory.bytes_in_use() - before_steps;
  last_loss = model.forward_loss(ctx, x, y, loss, scale).item();
  model.backward_loss(ctx);  // consume the forward's cached inputs

  // Where the time goes: each layer's forward and backward, synchronised.
  std::vector<std::pair<std::string, std::vector<double>>> phases;
  auto timed = [&](const std::string& name, const std::function<void()>& fn, bool record) {
    auto t0 = Clock::now();
    fn();
    ctx.synchronize();
    double t = seconds_since(t0);
    auto it = std::find_if(phases.begin(), phases.end(), [&](auto& p) { return p.first == name; });
    if (it == phases.end()) {
      phases.push_back({name, {}});
      it = phases.end() - 1;
    }
    if (record) it->second.push_back(t);
  };
  for (int rep = -1; rep < reps; ++rep) {
    const bool record = rep >= 0;
    timed("zero_grad", zero_grad, record);
    Tensor h = x;
    // Fused, the last layer's forward is its forward_loss (the head's GEMMs, loss and gradients).
    const std::size_t unfused = fused ? model.num_layers() - 1 : model.num_layers();
    for (std::size_t i = 0; i < unfused; ++i)
      timed(
          str(i, ".", model.layer(i).type(), ".forward"),
          [&] { h = model.layer(i).forward(ctx, h); }, record);
    Tensor d;
    if (fused) {
      nn::Module& head = model.layer(unfused);
      timed(
          str(unfused, ".", head.type(), ".forward_loss"),
          [&] {
            head.forward_loss(ctx, h, y, {scale, 0.0f, loss_chunk});
            d = head.backward_loss(ctx);
          },
          record);
    } else {
      timed(
          "loss.forward+backward",
          [&] {
            loss.forward(ctx, h, y);
            d = loss.backward(ctx, scale);
          },
          record);
    }
    for (std::size_t i = unfused; i-- > 0;)
      timed(
          str(i, ".", model.layer(i).type(), ".backward"),
          [&] { d = model.layer(i).backward(ctx, d); }, record);
    if (adamw)
      timed(
          "adamw.step", [&] { adamw->step(ctx); }, record);
  }

  const double step_s = median(step_times);
  const double tokens = static_cast<double>(batch * seq);
  // Training FLOPs: 3x the forward's multiply-adds (backward = 2x forward), attention over the
  // causal prefix only, as Module::forward_flops counts it.
  const double train_flops = 3.0 * model.forward_flops() * static_cast<double>(batch);
  std::ostringstream json;
  json << "{\"benchmark\": \"gpt\", \"machine\": " << machine_json() << ",\n"
       << " \"load_average\": \"" << load_average() << "\", \"openblas_core\": \""
       << openblas_get_corename() << "\", \"precision_info\": \"" << ctx.precision_info() << "\",\n"
       << " \"attention_kernel\": \"" << ops::attention_kernel_name(attention_choice.kernel)
       << "\", \"attention_detail\": \"" << json_text(attention_choice.detail) << "\",\n"
       << " \"config\": {\"model\": \"" << spec << "\", \"device\": \"" << device.str()
       << "\", \"batch\": " << batch << ", \"seq\": " << seq << ", \"vocab\": " << vocab
       << ", \"threads\": " << threads << ", \"steps_per_rep\": " << steps << ", \"reps\": " << reps
       << ", \"attention\": \"" << attention << "\", \"optimizer\": \"" << optimizer
       << "\", \"recompute\": \"" << recompute << "\", \"loss\": \"" << loss_path
       << "\", \"loss_chunk\": " << (fused ? loss_chunk : -1) << ", \"precision\": \""
       << ops::precision_name(ctx.precision()) << "\", \"parameters\": " << model.num_parameters()
       << "},\n \"step_ms_per_rep\": [";
  for (std::size_t i = 0; i < step_times.size(); ++i)
    json << (i ? ", " : "") << step_times[i] * 1e3;
  json << "],\n \"step_ms\": " << step_s * 1e3 << ", \"tokens_per_s\": " << tokens / step_s
       << ", \"train_gflop_per_step\": " << train_flops * 1e-9
       << ", \"gflops\": " << train_flops / step_s * 1e-9 << ", \"loss\": " << last_loss
       << ",\n \"peak_bytes\": " << before_steps + activation_peak
       << ", \"activation_peak_bytes\": " << activation_peak
       << ", \"held_between_steps_bytes\": " << held_between_steps << ",\n \"phases_ms\": {";
  double phase_total = 0.0;
  for (std::size_t i = 0; i < phases.size(); ++i) {
    const double ms = median(phases[i].second) * 1e3;
    phase_total += ms;
    json << (i ? ",\n   " : "\n   ") << "\"" << phases[i].first << "\": " << ms;
  }
  json << "},\n \"phases_total_ms\": " << phase_total << "}\n";
  write_output(args, json.str());

  std::fprintf(stderr,
               "gpt %s (%lld parameters) batch %lld x seq %lld, vocab %lld, %s, %d thread(s): "
               "%.2f ms/step, %.0f tokens/s, %.1f GFLOP/s, recompute %s: activation peak %s "
               "(load %s; %s; attention %s: %s)\n",
               spec.c_str(), static_cast<long long>(model.num_parameters()),
               static_cast<long long>(batch), static_cast<long long>(seq),
               static_cast<long long>(vocab), device.str().c_str(), threads, step_s * 1e3,
               tokens / step_s, train_flops / step_s * 1e-9, recompute.c_str(),
               format_bytes(static_cast<double>(activation_peak)).c_str(), load_average().c_str(),
               ctx.precision_info().c_str(), ops::attention_kernel_name(attention_choice.kernel),
               attention_choice.detail.c_str());
  for (auto& [name, t] : phases)
    std::fprintf(stderr, "  %-28s %8.3f ms\n", name.c_str(), median(t) * 1e3);
  return 0;
}

}  // namespace

LOCKSTEP_BENCH(
    "gpt",
    "GPT forward+backward tokens/s (--model=gpt-mini --batch=8 --seq=256 --vocab=256 "
    "--threads=2 [--device=cuda:0 --attention=auto|reference|cudnn|naive --optimizer=adamw "
    "--precision=fp32|tf32|bf16 --recompute=none|gelu|block --loss=fused|logits "
    "--loss-chunk=ROWS])",
    "attention batch device loss loss-chunk model optimizer precision recompute reps seq "
    "steps threads vocab",
    run);

}  // namespace lockstep::bench
