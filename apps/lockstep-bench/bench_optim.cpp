// lockstep-bench optim: the optimizer's share of a CPU training step, the per-parameter way
// lockstep did it before the fused optimizer, against the fused way over flat buffers:
//   per parameter   ops::all_finite per gradient, ops::sgd_update / adamw_update per parameter,
//                   ops::fill per gradient (Model::zero_grad): each a fork-join of the pool
//   fused           one gradient check pass (optim::check_gradients: finiteness and norm),
//                   one Optimizer::step, one FlatParams::zero_grad
// for the MLP 784-1024-1024-10 and the fashion CNN, at each --threads count. The two ways run on
// two copies of the model, alternating step by step (so a change in the load from other
// processes hits both alike); figures are medians over the reps x steps single steps, the
// speed-up the median of per-step ratios. The same update is computed either way
// (tests/optim/test_flat.cpp).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "bench.hpp"
#include "lockstep/core/rng.hpp"
#include "lockstep/nn/model.hpp"
#include "lockstep/ops/ops.hpp"
#include "lockstep/optim/adamw.hpp"
#include "lockstep/optim/clip.hpp"
#include "lockstep/optim/sgd.hpp"

namespace lockstep::bench {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<int> parse_ints(const std::string& list) {
  std::vector<int> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');)
    out.push_back(std::stoi(item));
  return out;
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

void fill_gradients(const std::vector<nn::Parameter*>& params) {
  for (std::size_t k = 0; k < params.size(); ++k) {
    std::vector<float> g(static_cast<std::size_t>(params[k]->grad.numel()));
    Philox(3, k).fill_uniform(g.data(), static_cast<std::int64_t>(g.size()), -1.0f, 1.0f);
    params[k]->grad.copy_from(g);
  }
}

// Milliseconds per step of each phase, one repetition.
struct Phases {
  double check = 0, update = 0, zero = 0;
  double total() const { return check + update + zero; }
};

struct Case {
  std::string model, spec, optimizer;
  int threads;
  std::vector<Phases> per_parameter, fused;
};

void run_case(Case& c, const Shape& sample, int reps, int steps, bool norm) {
  ops::Context ctx(Device::cpu(), c.threads);
  nn::Model legacy = nn::Model::build(c.spec, sample, 10, 1);
  nn::Model flat_model = nn::Model::build(c.spec, sample, 10, 1);
  fill_gradients(legacy.parameters());
  fill_gradients(flat_model.parameters());
  auto flat = std::make_shared<optim::FlatParams>(flat_model.parameters());
  std::unique_ptr<optim::Optimizer> fused;
  ops::SgdParams sp{0.05f, 0.9f, 0.0f, 1e-4f, false, false, Tensor(), 1};
  ops::AdamWParams ap{1e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f, 1, Tensor()};
  if (c.optimizer == "sgd")
    fused = std::make_unique<optim::Sgd>(
        flat,
        optim::SgdOptions{.lr = sp.lr, .momentum = sp.momentum, .weight_decay = sp.weight_decay});
  else
    fused = std::make_unique<optim::AdamW>(flat, optim::AdamWOptions{.lr = ap.lr});
  std::vector<Tensor> state1, state2;  // per-parameter momentum, or Adam's m and v
  for (nn::Parameter* p : legacy.parameters()) {
    state1.push_back(Tensor::zeros(p->value.shape()));
    state2.push_back(Tensor::zeros(p->value.shape()));
  }
  auto ms_since = [](Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  };
  auto per_parameter_step = [&](Phases& ph) {
    auto t = Clock::now();
    bool finite = true;
    for (nn::Parameter* p : legacy.parameters())
      finite = finite && ops::all_finite(ctx, p->grad);
    ph.check += ms_since(t);
    LOCKSTEP_CHECK(finite, "bench optim: non-finite gradient");
    t = Clock::now();
    const auto& params = legacy.parameters();
    for (std::size_t k = 0; k < params.size(); ++k) {
      if (c.optimizer == "sgd")
        ops::sgd_update(ctx, params[k]->value, params[k]->grad, state1[k], sp);
      else
        ops::adamw_update(ctx, params[k]->value, params[k]->grad, state1[k], state2[k], ap);
    }
    ph.update += ms_since(t);
    t = Clock::now();
    legacy.zero_grad(ctx);
    ph.zero += ms_since(t);
  };
  auto fused_step = [&](Phases& ph) {
    auto t = Clock::now();
    bool finite = optim::check_gradients(ctx, *flat, norm).finite();
    ph.check += ms_since(t);
    LOCKSTEP_CHECK(finite, "bench optim: non-finite gradient");
    t = Clock::now();
    fused->step(ctx);
    ph.update += ms_since(t);
    t = Clock::now();
    flat->zero_grad(ctx);
    ph.zero += ms_since(t);
  };
  Phases warm;
  per_parameter_step(warm);
  fused_step(warm);
  // Step by step, alternating: a burst of load from other processes lands on both ways alike,
  // and the medians over single steps ignore the steps it hit.
  for (int i = 0; i < reps * steps; ++i) {
    Phases a, b;
    per_parameter_step(a);
    fused_step(b);
    c.per_parameter.push_back(a);
    c.fused.push_back(b);
  }
}

std::string phases_json(const std::vector<Phases>& v) {
  std::vector<double> check, update, zero, total;
  for (const Phases& p : v) {
    check.push_back(p.check);
    update.push_back(p.update);
    zero.push_back(p.zero);
    total.push_back(p.total());
  }
  return str("{\"check_ms\": ", median(check), ", \"update_ms\": ", median(update),
             ", \"zero_grad_ms\": ", median(zero), ", \"total_ms\": ", median(total), "}");
}

int run(const Args& args) {
  const std::vector<int> threads = parse_ints(args.get("threads", "1,2"));
  const int reps = static_cast<int>(args.get_int("reps", 9));
  const int steps = static_cast<int>(args.get_int("steps", 20));
  const std::string which = args.get("optim", "sgd,adamw");
  // --norm=1: the fused check also computes the gradient norm (as with optim.clip_norm > 0);
  // the per-parameter check is all_finite either way.
  const bool norm = args.get_int("norm", 0) != 0;
  LOCKSTEP_CHECK(reps >= 5, "--reps must be at least 5 (medians of >= 5 repetitions), got ", reps);
  LOCKSTEP_CHECK(steps >= 1, "--steps must be positive");
  struct Model {
    std::string name, spec;
    Shape sample;
  };
  const Model models[] = {
      {"mlp", args.get("mlp", "mlp:1024,1024"), {1, 28, 28}},
      {"cnn",
       args.get("cnn",
                "conv(32,3,pad=1)-bn-relu-maxpool(2)-conv(64,3,pad=1)-bn-relu-maxpool(2)-"
                "flatten-dropout(0.25)-linear(128)-relu-linear(10)"),
       {1, 28, 28}},
  };
  const std::string load_before = load_average();
  std::vector<Case> cases;
  for (const Model& m : models) {
    for (const std::string& opt : {std::string("sgd"), std::string("adamw")}) {
      if (which.find(opt) == std::string::npos) continue;
      for (int t : threads) {
        Case c{m.name, m.spec, opt, t, {}, {}};
        run_case(c, m.sample, reps, steps, norm);
        cases.push_back(std::move(c));
      }
    }
  }
  std::ostringstream json;
  json << "{\"benchmark\": \"optim\", \"machine\": " << machine_json() << ",\n"
       << " \"load_average_before\": \"" << load_before << "\", \"load_average_after\": \""
       << load_average() << "\", \"steps_timed\": " << reps * steps
       << ", \"fused_check_with_norm\": " << norm << ",\n \"cases\": [";
  std::fprintf(stderr, "%-5s %-6s %7s | %28s | %28s | %7s\n", "model", "optim", "threads",
               "per parameter ms (chk/upd/zero)", "fused ms (chk/upd/zero)", "speedup");
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    std::vector<double> ratios;
    for (std::size_t r = 0; r < c.fused.size(); ++r)
      ratios.push_back(c.per_parameter[r].total() / c.fused[r].total());
    auto med = [](const std::vector<Phases>& v, double Phases::*field) {
      std::vector<double> x;
      for (const Phases& p : v)
        x.push_back(p.*field);
      return median(x);
    };
    auto total = [](const std::vector<Phases>& v) {
      std::vector<double> x;
      for (const Phases& p : v)
        x.push_back(p.total());
      return median(x);
    };
    json << (i ? ",\n  " : "\n  ") << "{\"model\": \"" << c.model << "\", \"spec\": \"" << c.spec
         << "\", \"optimizer\": \"" << c.optimizer << "\", \"threads\": " << c.threads
         << ", \"per_parameter\": " << phases_json(c.per_parameter)
         << ", \"fused\": " << phases_json(c.fused) << ", \"speedup\": " << median(ratios) << "}";
    std::fprintf(
        stderr, "%-5s %-6s %7d | %7.3f %6.3f %6.3f = %6.3f | %7.3f %6.3f %6.3f = %6.3f | %6.2fx\n",
        c.model.c_str(), c.optimizer.c_str(), c.threads, med(c.per_parameter, &Phases::check),
        med(c.per_parameter, &Phases::update), med(c.per_parameter, &Phases::zero),
        total(c.per_parameter), med(c.fused, &Phases::check), med(c.fused, &Phases::update),
        med(c.fused, &Phases::zero), total(c.fused), median(ratios));
  }
  json << "]}\n";
  write_output(args, json.str());
  std::fprintf(stderr, "load average before %s, after %s\n", load_before.c_str(),
               load_average().c_str());
  return 0;
}

}  // namespace

LOCKSTEP_BENCH("optim",
               "optimizer step per parameter vs fused over flat buffers, MLP and CNN "
               "(--threads=1,2 --reps=9 --steps=20 --optim=sgd,adamw --norm=0)",
               "cnn mlp norm optim reps steps threads", run);

}  // namespace lockstep::bench
