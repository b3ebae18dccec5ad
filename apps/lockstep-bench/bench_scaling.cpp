// lockstep-bench scaling: the latency-bandwidth scaling model of parallel/scaling_model.hpp, its
// calibration from measured allreduces and its check against measured DDP runs.
//
//   scaling predict   step time, exposed communication and efficiency at 8..1024 ranks for a
//                     model (--config, --spec or --reference), a compute time (--step-ms,
//                     --tflops with --mfu, or --measure on this CPU) and links (presets or
//                     --intra-alpha-us/--intra-gbs, --inter-alpha-us/--inter-gbs)
//   scaling fit       alpha and bandwidth from `lockstep-bench allreduce` JSON files
//                     (--runs=a.json,b.json; least squares over sizes, residuals per size)
//   scaling check     predicted against measured DDP step times from a runs.jsonl as
//                     bench/scaling-calibrate.sh writes it, with compute measured in-process
//   scaling allreduce predicted against measured times of one allreduce (flat and
//                     hierarchical columns of a `lockstep-bench allreduce` file)
//   scaling profile   per-bucket bytes and readiness of a model (FLOPs, or --measure)
// JSON to --out (or stdout), tables to stderr. docs/SCALING.md shows every mode in use.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <unordered_map>

#include "bench.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/core/rng.hpp"
#include "lockstep/nn/loss.hpp"
#include "lockstep/nn/model.hpp"
#include "lockstep/ops/context.hpp"
#include "lockstep/parallel/reducer.hpp"
#include "lockstep/parallel/scaling_model.hpp"
#include "lockstep/train/config.hpp"
#include "lockstep/train/metrics.hpp"

namespace lockstep::bench {
namespace {

namespace sm = parallel::scaling;
using Clock = std::chrono::steady_clock;
constexpr double kMiB = 1024.0 * 1024.0;

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, sep);)
    if (!item.empty()) out.push_back(item);
  return out;
}

std::vector<long long> int_list(const Args& args, const std::string& key,
                                const std::string& fallback) {
  std::vector<long long> out;
  for (const std::string& item : split(args.get(key, fallback), ',')) {
    try {
      out.push_back(std::stoll(item));
    } catch (const std::exception&) {
      LOCKSTEP_FAIL("--", key, ": '", item, "' is not an integer");
    }
  }
  LOCKSTEP_CHECK(!out.empty(), "--", key, " is empty");
  return out;
}

// ---- reading flat JSON records (one object per line, as the benchmarks and trainer write them)

bool has_field(const std::string& line, const std::string& key) {
  return line.find("\"" + key + "\":") != std::string::npos;
}
double number_field(const std::string& line, const std::string& key, const std::string& where) {
  const std::string tag = "\"" + key + "\":";
  const auto at = line.find(tag);
  LOCKSTEP_CHECK(at != std::string::npos, where, ": no \"", key, "\" in: ", line.substr(0, 200));
  const char* begin = line.c_str() + at + tag.size();
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  LOCKSTEP_CHECK(end != begin, where, ": \"", key, "\" is not a number in: ", line.substr(0, 200));
  return v;
}
std::string text_field(const std::string& line, const std::string& key) {
  const std::string tag = "\"" + key + "\": \"";
  const auto at = line.find(tag);
  if (at == std::string::npos) return "";
  const auto begin = at + tag.size();
  return line.substr(begin, line.find('"', begin) - begin);
}
std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  LOCKSTEP_CHECK(in.good(), "cannot read ", path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  return lines;
}

// ---- the model under study: its gradients and FLOPs

struct Subject {
  std::string name;
  std::vector<sm::LayerCost> layers;
  double forward_flops = 0.0;  // per sample
  std::int64_t parameters = 0;
  std::unique_ptr<nn::Model> model;  // lockstep models only (--measure needs it)
};

Shape parse_shape(const std::string& text) {
  Shape shape;
  for (const std::string& d : split(text, ',')) {
    char* end = nullptr;
    const long long v = std::strtoll(d.c_str(), &end, 10);
    LOCKSTEP_CHECK(*end == '\0' && v > 0, "--sample-shape=", text, ": '", d,
                   "' is not a positive integer");
    shape.push_back(v);
  }
  LOCKSTEP_CHECK(!shape.empty(), "--sample-shape is empty");
  return shape;
}

// --reference=NAME, or a lockstep model from --config=FILE ([model] spec) or --spec=SPEC with
// --sample-shape and --classes (defaults: Fashion-MNIST images; GPT presets: 1024 tokens of
// GPT-2's 50257-token vocabulary).
Subject make_subject(const Args& args) {
  Subject s;
  if (const std::string ref = args.get("reference", ""); !ref.empty()) {
    sm::ReferenceModel r = sm::reference_model(ref);
    s.name = r.name;
    s.parameters = r.parameters();
    s.forward_flops = r.forward_flops;
    s.layers = std::move(r.layers);
    return s;
  }
  std::string spec = args.get("spec", "");
  s.name = spec;
  if (const std::string config = args.get("config", ""); !config.empty()) {
    std::ifstream in(config);
    LOCKSTEP_CHECK(in.good(), "cannot read --config=", config);
    std::stringstream text;
    text << in.rdbuf();
    spec = train::parse_config_text(text.str(), {}, config).model_spec;
    s.name = config.substr(config.find_last_of('/') + 1);
    s.name = s.name.substr(0, s.name.find(".ini"));
  }
  LOCKSTEP_CHECK_HINT(
      !spec.empty(), "e.g. --config=configs/fashion_mlp.ini, --spec=gpt2-124m",
      "scaling: no model: give --config, --spec or --reference (",
      [] {
        std::string names;
        for (const std::string& n : sm::reference_model_names())
          names += (names.empty() ? "" : ", ") + n;
        return names;
      }(),
      ")");
  const bool gpt = spec.rfind("gpt", 0) == 0;
  const Shape sample = parse_shape(args.get("sample-shape", gpt ? "1024" : "1,28,28"));
  const std::int64_t classes = args.get_int("classes", gpt ? 50257 : 10);
  s.model = std::make_unique<nn::Model>(nn::Model::build(spec, sample, classes, 1));
  s.layers = sm::layer_costs(*s.model);
  s.forward_flops = s.model->forward_flops();
  s.parameters = s.model->num_parameters();
  return s;
}

// ---- measuring a step's compute on this CPU: forward, backward, and when each gradient is ready

struct Measured {
  double forward_s = 0.0, backward_s = 0.0;
  std::vector<sm::GradientReady> gradients;
};

Measured measure(nn::Model& model, std::int64_t batch, int threads, int reps) {
  ops::Context ctx(Device::cpu(), threads);
  const auto& params = model.parameters();
  std::unordered_map<const nn::Parameter*, std::size_t> index;
  for (std::size_t k = 0; k < params.size(); ++k)
    index[params[k]] = k;
  Shape shape{batch};
  shape.insert(shape.end(), model.sample_shape().begin(), model.sample_shape().end());
  const std::int64_t rows = batch * model.outputs_per_sample();
  const bool tokens = model.outputs_per_sample() > 1;  // language models take i32 tokens
  Tensor x;
  if (tokens) {
    std::vector<std::int32_t> t(static_cast<std::size_t>(shape_numel(shape)));
    for (std::size_t i = 0; i < t.size(); ++i)
      t[i] = static_cast<std::int32_t>((i * 7919) % static_cast<std::size_t>(model.num_classes()));
    x = Tensor::from_vector(t, shape);
  } else {
    std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
    Philox(1, 1).fill_uniform(v.data(), static_cast<std::int64_t>(v.size()), -1.0f, 1.0f);
    x = Tensor::from_vector(v, shape);
  }
  std::vector<std::int32_t> labels(static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < labels.size(); ++i)
    labels[i] = static_cast<std::int32_t>(i % static_cast<std::size_t>(model.num_classes()));
  const Tensor y = Tensor::from_vector(labels, {rows});
  nn::SoftmaxCrossEntropy loss;

  std::vector<Clock::time_point> ready(params.size());
  model.set_grad_ready_hook([&](nn::Parameter& p) { ready[index.at(&p)] = Clock::now(); });
  std::vector<double> fwd, bwd;
  std::vector<std::vector<double>> fraction(params.size());
  for (int r = -2; r < reps; ++r) {  // two warm-up steps (allocation, oneDNN primitives)
    model.zero_grad(ctx);
    const auto t0 = Clock::now();
    Tensor logits = model.forward(ctx, x);
    loss.forward(ctx, logits, y);
    Tensor d = loss.backward(ctx, 1.0f / static_cast<float>(rows));
    const auto t1 = Clock::now();
    model.backward(ctx, d);
    const auto t2 = Clock::now();
    if (r < 0) continue;
    const double b = std::chrono::duration<double>(t2 - t1).count();
    fwd.push_back(std::chrono::duration<double>(t1 - t0).count());
    bwd.push_back(b);
    for (std::size_t k = 0; k < params.size(); ++k)
      fraction[k].push_back(std::chrono::duration<double>(ready[k] - t1).count() / b);
  }
  model.set_grad_ready_hook(nullptr);
  Measured m;
  m.forward_s = median(fwd);
  m.backward_s = median(bwd);
  for (std::size_t k = 0; k < params.size(); ++k)
    m.gradients.push_back({params[k]->value.numel(), std::clamp(median(fraction[k]), 0.0, 1.0)});
  return m;
}

// ---- links and topology from presets or explicit values

sm::Link link_arg(const Args& args, const std::string& which, const std::string& fallback) {
  const std::string preset = args.get(which, fallback);
  sm::Link link;
  int nics = 1;
  if (!preset.empty() && preset != "none") {
    const sm::LinkPreset& p = sm::link_preset(preset);
    link = p.link;
    if (p.inter) nics = static_cast<int>(args.get_int("nics", 1));
  }
  link.alpha_s = args.get_double(which + "-alpha-us", link.alpha_s * 1e6) * 1e-6;
  link.bytes_per_s = args.get_double(which + "-gbs", link.bytes_per_s * nics / 1e9) * 1e9;
  return link;
}

std::string link_str(const sm::Link& l) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "alpha %.2f us, %.3f GB/s", l.alpha_s * 1e6, l.bytes_per_s / 1e9);
  return buf;
}

std::string json_link(const sm::Link& l) {
  return str("{\"alpha_us\": ", l.alpha_s * 1e6, ", \"gbs\": ", l.bytes_per_s / 1e9, "}");
}

std::vector<sm::Bucket> buckets_of(const Args& args, const std::vector<sm::GradientReady>& g) {
  const auto mib = [&](const std::string& key, double fallback) {
    return static_cast<std::size_t>(args.get_double(key, fallback) * kMiB);
  };
  const DType wire = parallel::parse_grad_dtype(args.get("grad-dtype", "fp32"), "--grad-dtype");
  return sm::make_buckets(g, mib("bucket-mb", parallel::kDefaultBucketBytes / kMiB),
                          mib("first-bucket-mb", parallel::kDefaultFirstBucketBytes / kMiB),
                          static_cast<int>(dtype_size(wire)));
}

// ---- predict

int run_predict(const Args& args) {
  Subject subject = make_subject(args);
  const double bwd_flops = sm::backward_flops(subject.layers);
  const double fwd_share = subject.forward_flops / (subject.forward_flops + bwd_flops);
  sm::StepCost cost;
  std::vector<sm::GradientReady> gradients = sm::gradients_by_flops(subject.layers);
  std::string compute_source;
  const std::int64_t batch = args.get_int("batch", 0);
  if (args.get_int("measure", 0)) {
    LOCKSTEP_CHECK(subject.model != nullptr, "--measure needs a lockstep model (--config/--spec)");
    LOCKSTEP_CHECK(batch > 0, "--measure needs --batch (per rank)");
    const int threads = static_cast<int>(args.get_int("threads", 1));
    const Measured m =
        measure(*subject.model, batch, threads, static_cast<int>(args.get_int("reps", 7)));
    cost.forward_s = m.forward_s;
    cost.backward_s = m.backward_s;
    gradients = m.gradients;
    compute_source =
        str("measured here, batch ", batch, ", ", threads, " thread(s), load ", load_average());
  } else if (args.options.count("step-ms")) {
    const double step = args.get_double("step-ms", 0) * 1e-3;
    cost.forward_s = fwd_share * step;
    cost.backward_s = step - cost.forward_s;
    compute_source = str("given: ", step * 1e3, " ms forward+backward, split by FLOPs");
  } else {
    const double tflops = args.get_double("tflops", 0), mfu = args.get_double("mfu", 0);
    LOCKSTEP_CHECK_HINT(tflops > 0 && mfu > 0 && batch > 0,
                        "--step-ms=MS, or --tflops=T --mfu=F --batch=B, or --measure --batch=B",
                        "scaling predict: no compute time");
    const double step =
        (subject.forward_flops + bwd_flops) * static_cast<double>(batch) / (tflops * 1e12 * mfu);
    cost.forward_s = fwd_share * step;
    cost.backward_s = step - cost.forward_s;
    compute_source = str("FLOPs: ", (subject.forward_flops + bwd_flops) * batch / 1e12,
                         " TFLOP per step at ", tflops, " TFLOP/s x MFU ", mfu);
  }
  cost.other_s = args.get_double("other-ms", 0) * 1e-3;
  cost.compute_slowdown = args.get_double("slowdown", 0);
  const std::vector<sm::Bucket> buckets = buckets_of(args, gradients);

  sm::Topology topo;
  topo.ranks_per_node = static_cast<int>(args.get_int("ranks-per-node", 8));
  topo.intra = link_arg(args, "intra", "nvlink4");
  topo.inter = link_arg(args, "inter", "ib-ndr");
  std::vector<sm::Algorithm> algorithms;
  for (const std::string& a : split(args.get("algorithm", "ring,hierarchical"), ','))
    algorithms.push_back(sm::algorithm_from_name(a));
  const std::vector<long long> ranks_list = int_list(args, "ranks", "8,16,32,64,128,256,512,1024");

  double bucket_bytes = 0;
  for (const sm::Bucket& b : buckets)
    bucket_bytes += b.bytes;
  std::fprintf(
      stderr,
      "# scaling predict: %s, %.2f M parameters, %zu buckets (%.1f MB of %s gradients "
      "sent per allreduce round)\n# compute: %s: forward %.3f ms, backward %.3f ms, other %.3f ms\n"
      "# links: intra %s; inter (per node) %s; %d ranks per node; slowdown %.2f\n",
      subject.name.c_str(), subject.parameters / 1e6, buckets.size(), bucket_bytes / 1e6,
      args.get("grad-dtype", "fp32").c_str(), compute_source.c_str(), cost.forward_s * 1e3,
      cost.backward_s * 1e3, cost.other_s * 1e3, link_str(topo.intra).c_str(),
      link_str(topo.inter).c_str(), topo.ranks_per_node, cost.compute_slowdown);
  std::fprintf(stderr, "#%6s %6s %-13s %10s %10s %10s %10s %8s %9s\n", "ranks", "nodes",
               "algorithm", "step(ms)", "comm(ms)", "exposed", "compute", "effic.", "speedup");
  std::ostringstream json;
  json.precision(10);  // sizes up to GB and times in seconds, without rounding
  json << "{\"benchmark\": \"scaling-predict\", \"model\": \"" << subject.name
       << "\", \"parameters\": " << subject.parameters << ", \"buckets\": " << buckets.size()
       << ", \"bucket_bytes\": " << bucket_bytes << ", \"grad_dtype\": \""
       << args.get("grad-dtype", "fp32") << "\", \"compute\": \""
       << train::json_escape(compute_source) << "\", \"forward_s\": " << cost.forward_s
       << ", \"backward_s\": " << cost.backward_s << ", \"other_s\": " << cost.other_s
       << ", \"slowdown\": " << cost.compute_slowdown
       << ", \"ranks_per_node\": " << topo.ranks_per_node
       << ", \"intra\": " << json_link(topo.intra) << ", \"inter\": " << json_link(topo.inter)
       << ", \"machine\": " << machine_json() << ", \"results\": [";
  bool first = true;
  for (sm::Algorithm algo : algorithms) {
    for (long long p : ranks_list) {
      topo.ranks = static_cast<int>(p);
      const sm::StepPrediction r = sm::predict_step(cost, buckets, topo, algo);
      std::fprintf(stderr, " %6lld %6d %-13s %10.3f %10.3f %10.3f %10.3f %8.3f %9.1f\n", p,
                   topo.nodes(), sm::algorithm_name(algo), r.step_s * 1e3, r.comm_s * 1e3,
                   r.exposed_s * 1e3, r.compute_s * 1e3, r.efficiency,
                   r.efficiency * static_cast<double>(p));
      json << (first ? "" : ",") << "\n  {\"ranks\": " << p << ", \"nodes\": " << topo.nodes()
           << ", \"algorithm\": \"" << sm::algorithm_name(algo) << "\", \"step_s\": " << r.step_s
           << ", \"comm_s\": " << r.comm_s << ", \"exposed_s\": " << r.exposed_s
           << ", \"compute_s\": " << r.compute_s << ", \"efficiency\": " << r.efficiency
           << ", \"speedup\": " << r.efficiency * static_cast<double>(p) << "}";
      first = false;
    }
  }
  json << "\n]}\n";
  write_output(args, json.str());
  return 0;
}

// ---- profile

int run_profile(const Args& args) {
  Subject subject = make_subject(args);
  std::vector<sm::GradientReady> gradients = sm::gradients_by_flops(subject.layers);
  std::string source = "FLOPs";
  if (args.get_int("measure", 0)) {
    LOCKSTEP_CHECK(subject.model != nullptr, "--measure needs a lockstep model");
    const std::int64_t batch = args.get_int("batch", 64);
    const int threads = static_cast<int>(args.get_int("threads", 1));
    const Measured m =
        measure(*subject.model, batch, threads, static_cast<int>(args.get_int("reps", 7)));
    gradients = m.gradients;
    source =
        str("measured, batch ", batch, ", ", threads, " thread(s): forward ", m.forward_s * 1e3,
            " ms, backward ", m.backward_s * 1e3, " ms, load ", load_average());
  }
  const std::vector<sm::Bucket> buckets = buckets_of(args, gradients);
  std::fprintf(stderr, "# %s: %.3f M parameters, readiness from %s\n#%7s %14s %12s\n",
               subject.name.c_str(), subject.parameters / 1e6, source.c_str(), "bucket", "bytes",
               "ready");
  std::ostringstream json;
  json.precision(10);  // sizes up to GB and times in seconds, without rounding
  json << "{\"benchmark\": \"scaling-profile\", \"model\": \"" << subject.name
       << "\", \"source\": \"" << train::json_escape(source) << "\", \"buckets\": [";
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    std::fprintf(stderr, " %7zu %14.0f %12.4f\n", b, buckets[b].bytes, buckets[b].ready);
    json << (b ? ", " : "") << "{\"bytes\": " << buckets[b].bytes
         << ", \"ready\": " << buckets[b].ready << "}";
  }
  json << "]}\n";
  write_output(args, json.str());
  return 0;
}

// ---- fit

int run_fit(const Args& args) {
  const std::vector<std::string> files = split(args.get("runs", ""), ',');
  LOCKSTEP_CHECK_HINT(!files.empty(), "lockstep-bench allreduce --out=FILE writes one",
                      "scaling fit: give --runs=FILE[,FILE...]");
  const std::vector<std::string> columns = split(args.get("columns", "sync,async,mpi"), ',');
  const double min_bytes = args.get_double("min-bytes", 0);
  const double max_bytes = args.get_double("max-bytes", 1e18);
  std::ostringstream json;
  json.precision(10);  // sizes up to GB and times in seconds, without rounding
  json << "{\"benchmark\": \"scaling-fit\", \"min_bytes\": " << min_bytes
       << ", \"max_bytes\": " << max_bytes << ", \"fits\": [";
  bool first = true;
  for (const std::string& file : files) {
    const std::vector<std::string> lines = read_lines(file);
    LOCKSTEP_CHECK(!lines.empty() && has_field(lines[0], "ranks"), file,
                   ": not a lockstep-bench allreduce JSON file (no \"ranks\" on its first line)");
    const int ranks = static_cast<int>(number_field(lines[0], "ranks", file));
    const int nodes =
        has_field(lines[0], "nodes") ? static_cast<int>(number_field(lines[0], "nodes", file)) : 1;
    const std::string load = text_field(lines[0], "load_avg");
    for (const std::string& column : columns) {
      std::vector<double> bytes, seconds, all_bytes, all_seconds;
      for (const std::string& line : lines) {
        if (!has_field(line, "bytes") || !has_field(line, column + "_us")) continue;
        const double n = number_field(line, "bytes", file);
        const double t = number_field(line, column + "_us", file) * 1e-6;
        all_bytes.push_back(n);
        all_seconds.push_back(t);
        if (n >= min_bytes && n <= max_bytes) {
          bytes.push_back(n);
          seconds.push_back(t);
        }
      }
      LOCKSTEP_CHECK(bytes.size() >= 2, file, ": fewer than 2 sizes of column ", column,
                     " between --min-bytes and --max-bytes");
      const sm::LineFit fit = sm::fit_line(bytes, seconds);
      sm::Link link;  // stays zero, and says why, when the line has no per-byte cost
      std::string problem;
      try {
        link = sm::link_from_ring_fit(fit, ranks);
      } catch (const Error& e) {
        problem = e.message();
        std::fprintf(stderr, "# %s [%s]: %s\n", file.c_str(), column.c_str(), problem.c_str());
      }
      std::fprintf(stderr,
                   "# %s [%s]: %d ranks on %d node(s), load %s\n#   t = %.2f us + n / %.4f GB/s"
                   " -> ring alpha %.2f us, B %.4f GB/s; rms relative residual %.1f%%%s\n",
                   file.c_str(), column.c_str(), ranks, nodes, load.c_str(), fit.intercept * 1e6,
                   1e-9 / fit.slope, link.alpha_s * 1e6, link.bytes_per_s / 1e9,
                   100 * fit.rms_relative,
                   fit.clamped.empty() ? "" : (" (" + fit.clamped + " clamped to 0)").c_str());
      std::fprintf(stderr, "#   %12s %12s %12s %9s\n", "bytes", "measured us", "fit us", "resid.");
      std::ostringstream residuals;
      residuals.precision(10);
      for (std::size_t i = 0; i < all_bytes.size(); ++i) {
        const double predicted = fit.intercept + fit.slope * all_bytes[i];
        const bool used = all_bytes[i] >= min_bytes && all_bytes[i] <= max_bytes;
        std::fprintf(stderr, "    %12.0f %12.2f %12.2f %8.1f%%%s\n", all_bytes[i],
                     all_seconds[i] * 1e6, predicted * 1e6, 100 * (predicted / all_seconds[i] - 1),
                     used ? "" : "  (not fitted)");
        residuals << (i ? ", " : "") << "[" << all_bytes[i] << ", " << all_seconds[i] * 1e6 << ", "
                  << predicted * 1e6 << "]";
      }
      // One line per fit, so that scripts (and `scaling check`) can read it line by line.
      json << (first ? "" : ",") << "\n  {\"file\": \"" << file << "\", \"column\": \"" << column
           << "\", \"ranks\": " << ranks << ", \"nodes\": " << nodes << ", \"load_avg\": \"" << load
           << "\", \"intercept_us\": " << fit.intercept * 1e6
           << ", \"slope_us_per_mb\": " << fit.slope * 1e12
           << ", \"alpha_us\": " << link.alpha_s * 1e6 << ", \"gbs\": " << link.bytes_per_s / 1e9
           << ", \"rms_relative\": " << fit.rms_relative << ", \"clamped\": \"" << fit.clamped
           << "\", \"problem\": \"" << train::json_escape(problem)
           << "\", \"points\": " << bytes.size() << ", \"bytes_measured_fit_us\": ["
           << residuals.str() << "]}";
      first = false;
    }
  }
  json << "\n]}\n";
  write_output(args, json.str());
  return 0;
}

// ---- allreduce: predicted against measured times of one allreduce

int run_allreduce(const Args& args) {
  const std::string file = args.get("runs", "");
  LOCKSTEP_CHECK_HINT(!file.empty(), "lockstep-bench allreduce --out=FILE writes one",
                      "scaling allreduce: give --runs=FILE");
  const std::vector<std::string> lines = read_lines(file);
  LOCKSTEP_CHECK(!lines.empty() && has_field(lines[0], "ranks"), file,
                 ": not a lockstep-bench allreduce JSON file");
  sm::Topology topo;
  topo.ranks = static_cast<int>(number_field(lines[0], "ranks", file));
  topo.ranks_per_node = static_cast<int>(args.get_int("ranks-per-node", topo.ranks));
  topo.intra = link_arg(args, "intra", "none");
  topo.inter = link_arg(args, "inter", "none");
  std::fprintf(stderr,
               "# scaling allreduce: %s, %d ranks, %d per node (load then %s)\n# links: intra %s;"
               " inter %s\n#%12s %12s %12s %7s %12s %12s %7s\n",
               file.c_str(), topo.ranks, topo.ranks_per_node,
               text_field(lines[0], "load_avg").c_str(), link_str(topo.intra).c_str(),
               link_str(topo.inter).c_str(), "bytes", "flat us", "model ring", "ratio", "hier us",
               "model hier", "ratio");
  std::ostringstream json;
  json.precision(10);  // sizes up to GB and times in seconds, without rounding
  json << "{\"benchmark\": \"scaling-allreduce\", \"file\": \"" << file
       << "\", \"ranks\": " << topo.ranks << ", \"ranks_per_node\": " << topo.ranks_per_node
       << ", \"intra\": " << json_link(topo.intra) << ", \"inter\": " << json_link(topo.inter)
       << ", \"results\": [";
  bool first = true;
  for (const std::string& line : lines) {
    if (!has_field(line, "bytes") || !has_field(line, "sync_us")) continue;
    const double n = number_field(line, "bytes", file);
    const double flat = number_field(line, "sync_us", file) * 1e-6;
    const double hier = number_field(line, "hier_us", file) * 1e-6;
    const double ring_model = sm::allreduce_s(n, topo, sm::Algorithm::Ring);
    const double hier_model = sm::allreduce_s(n, topo, sm::Algorithm::Hierarchical);
    std::fprintf(stderr, " %12.0f %12.1f %12.1f %7.2f %12.1f %12.1f %7.2f\n", n, flat * 1e6,
                 ring_model * 1e6, ring_model / flat, hier * 1e6, hier_model * 1e6,
                 hier_model / hier);
    json << (first ? "" : ",") << "\n  {\"bytes\": " << n << ", \"flat_s\": " << flat
         << ", \"ring_model_s\": " << ring_model << ", \"hier_s\": " << hier
         << ", \"hier_model_s\": " << hier_model << "}";
    first = false;
  }
  json << "\n]}\n";
  write_output(args, json.str());
  return 0;
}

// ---- check: predicted vs measured DDP steps

struct RunMedians {
  double step = 0, compute = 0, exposed = 0, wait = 0;
  int n = 0;
};

int run_check(const Args& args) {
  Subject subject = make_subject(args);
  LOCKSTEP_CHECK(subject.model != nullptr, "scaling check needs a lockstep model (--config)");
  const std::string runs_path = args.get("runs", "");
  LOCKSTEP_CHECK_HINT(!runs_path.empty(), "bench/scaling-calibrate.sh writes one",
                      "scaling check: give --runs=runs.jsonl");
  const std::string setting = args.get("setting", "");
  const std::int64_t global_batch = args.get_int("global-batch", 256);
  const int threads = static_cast<int>(args.get_int("threads", 1));
  const int reps = static_cast<int>(args.get_int("reps", 7));

  // Medians per (run, ranks) over the interval records of the chosen setting.
  std::map<std::pair<std::string, int>, std::vector<std::vector<double>>> samples;
  for (const std::string& line : read_lines(runs_path)) {
    if (!has_field(line, "step_time_s")) continue;
    if (!setting.empty() && text_field(line, "setting") != setting) continue;
    auto& s = samples[{text_field(line, "run"),
                       static_cast<int>(number_field(line, "ranks", runs_path))}];
    s.resize(4);
    s[0].push_back(number_field(line, "step_time_s", runs_path));
    s[1].push_back(number_field(line, "compute_s", runs_path));
    s[2].push_back(number_field(line, "comm_exposed_s", runs_path));
    s[3].push_back(number_field(line, "data_wait_s", runs_path));
  }
  auto medians = [&](const std::string& run, int ranks) {
    auto it = samples.find({run, ranks});
    RunMedians m;
    if (it == samples.end()) return m;
    m.step = median(it->second[0]);
    m.compute = median(it->second[1]);
    m.exposed = median(it->second[2]);
    m.wait = median(it->second[3]);
    m.n = static_cast<int>(it->second[0].size());
    return m;
  };
  const RunMedians one = medians("one_rank", 1);
  LOCKSTEP_CHECK(one.n > 0, runs_path, ": no one_rank records",
                 setting.empty() ? "" : " for setting ", setting);

  sm::Topology topo;
  topo.ranks_per_node = static_cast<int>(args.get_int("ranks-per-node", 1 << 20));
  topo.intra = link_arg(args, "intra", "none");
  topo.inter = link_arg(args, "inter", "none");
  const sm::Algorithm algo = sm::algorithm_from_name(args.get("algorithm", "ring"));

  std::fprintf(stderr,
               "# scaling check: %s, global batch %lld, runs %s%s%s\n# links: intra %s; inter %s;"
               " algorithm %s; compute measured in-process now (load %s)\n",
               subject.name.c_str(), static_cast<long long>(global_batch), runs_path.c_str(),
               setting.empty() ? "" : ", setting ", setting.c_str(), link_str(topo.intra).c_str(),
               link_str(topo.inter).c_str(), sm::algorithm_name(algo), load_average().c_str());
  std::fprintf(stderr, "#%5s %-10s %10s %10s %10s %10s %8s\n", "ranks", "source", "step ms",
               "compute", "exposed", "other", "effic.");
  std::ostringstream json;
  json.precision(10);  // sizes up to GB and times in seconds, without rounding
  json << "{\"benchmark\": \"scaling-check\", \"model\": \"" << subject.name
       << "\", \"setting\": \"" << setting << "\", \"global_batch\": " << global_batch
       << ", \"intra\": " << json_link(topo.intra) << ", \"inter\": " << json_link(topo.inter)
       << ", \"algorithm\": \"" << sm::algorithm_name(algo) << "\", \"load_avg\": \""
       << load_average() << "\", \"rows\": [";
  bool first = true;
  auto row = [&](int ranks, const std::string& source, double step, double compute, double exposed,
                 double other, double efficiency) {
    std::fprintf(stderr, " %5d %-10s %10.2f %10.2f %10.2f %10.2f %8.3f\n", ranks, source.c_str(),
                 step * 1e3, compute * 1e3, exposed * 1e3, other * 1e3, efficiency);
    json << (first ? "" : ",") << "\n  {\"ranks\": " << ranks << ", \"source\": \"" << source
         << "\", \"step_s\": " << step << ", \"compute_s\": " << compute
         << ", \"exposed_s\": " << exposed << ", \"other_s\": " << other
         << ", \"efficiency\": " << efficiency << "}";
    first = false;
  };

  // Strong scaling, as the runs are: the global batch is split over the ranks.
  const double one_other = std::max(0.0, one.step - one.compute - one.exposed - one.wait);
  double one_alone = 0;  // the model's 1-rank step from the in-process measurement
  std::vector<int> rank_counts;
  for (const auto& [key, s] : samples)
    if (key.first == "ddp_sync" || key.first == "one_rank") rank_counts.push_back(key.second);
  if (args.options.count("only-ranks")) {
    const std::vector<long long> only = int_list(args, "only-ranks", "");
    std::erase_if(rank_counts,
                  [&](int r) { return std::find(only.begin(), only.end(), r) == only.end(); });
  }
  std::sort(rank_counts.begin(), rank_counts.end());
  rank_counts.erase(std::unique(rank_counts.begin(), rank_counts.end()), rank_counts.end());
  for (int ranks : rank_counts) {
    LOCKSTEP_CHECK(global_batch % ranks == 0, "global batch ", global_batch, " over ", ranks,
                   " ranks");
    const Measured m = measure(*subject.model, global_batch / ranks, threads, reps);
    const std::vector<sm::Bucket> buckets = buckets_of(args, m.gradients);
    topo.ranks = ranks;
    sm::StepCost alone{m.forward_s, m.backward_s, one_other, 0.0};
    const sm::StepPrediction a = sm::predict_step(alone, buckets, topo, algo);
    if (ranks == 1) one_alone = a.step_s;
    const RunMedians sync = ranks == 1 ? one : medians("ddp_sync", ranks);
    const RunMedians nosync = medians("ddp_nosync", ranks);
    const double measured_eff = one.step / (ranks * sync.step);
    row(ranks, "measured", sync.step, sync.compute, sync.exposed,
        sync.step - sync.compute - sync.exposed, measured_eff);
    row(ranks, "model", a.step_s, a.compute_s, a.exposed_s, one_other,
        one_alone > 0 ? one_alone / (ranks * a.step_s) : 0.0);
    if (nosync.n > 0) {
      // The same model with the compute the ranks really had (no sync run: contention included).
      const double scale = nosync.compute / (m.forward_s + m.backward_s);
      sm::StepCost contended{m.forward_s * scale, m.backward_s * scale,
                             std::max(0.0, nosync.step - nosync.compute - nosync.wait), 0.0};
      const sm::StepPrediction c = sm::predict_step(contended, buckets, topo, algo);
      row(ranks, "model+nosync", c.step_s, c.compute_s, c.exposed_s, contended.other_s,
          one.step / (ranks * c.step_s));
      row(ranks, "nosync", nosync.step, nosync.compute, nosync.exposed,
          nosync.step - nosync.compute - nosync.exposed, one.step / (ranks * nosync.step));
    }
  }
  json << "\n]}\n";
  write_output(args, json.str());
  return 0;
}

int run_scaling(const Args& args) {
  const std::string mode = args.positional.empty() ? "predict" : args.positional[0];
  if (mode == "predict") return run_predict(args);
  if (mode == "fit") return run_fit(args);
  if (mode == "check") return run_check(args);
  if (mode == "profile") return run_profile(args);
  if (mode == "allreduce") return run_allreduce(args);
  LOCKSTEP_FAIL_HINT("predict, fit, check, allreduce or profile", "scaling: unknown mode '", mode,
                     "'");
}

LOCKSTEP_BENCH("scaling",
               "alpha-beta model of bucketed, overlapped allreduce: predict | fit | check | "
               "allreduce | profile (see docs/SCALING.md)",
               "<predict|fit|check|allreduce|profile> algorithm batch bucket-mb classes columns "
               "config first-bucket-mb global-batch grad-dtype "
               "inter inter-alpha-us inter-gbs intra intra-alpha-us intra-gbs max-bytes measure "
               "mfu min-bytes nics only-ranks other-ms ranks ranks-per-node reference reps runs "
               "sample-shape setting slowdown spec step-ms tflops threads",
               run_scaling);

}  // namespace
}  // namespace lockstep::bench
