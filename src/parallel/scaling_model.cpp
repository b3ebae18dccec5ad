#include "lockstep/parallel/scaling_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "lockstep/core/error.hpp"
#include "lockstep/nn/model.hpp"
#include "lockstep/ops/ops.hpp"

namespace lockstep::parallel::scaling {

int Topology::nodes() const {
  return ranks <= ranks_per_node ? 1 : ranks / ranks_per_node;
}

void Topology::validate() const {
  LOCKSTEP_CHECK(ranks >= 1 && ranks_per_node >= 1, "scaling model: ranks (", ranks,
                 ") and ranks per node (", ranks_per_node, ") must be positive");
  LOCKSTEP_CHECK(ranks <= ranks_per_node || ranks % ranks_per_node == 0, "scaling model: ", ranks,
                 " ranks do not fill nodes of ", ranks_per_node,
                 " ranks (use a multiple of the ranks per node)");
  LOCKSTEP_CHECK(intra.alpha_s >= 0 && inter.alpha_s >= 0, "scaling model: negative latency");
  if (std::min(ranks, ranks_per_node) > 1)
    LOCKSTEP_CHECK(intra.bytes_per_s > 0, "scaling model: the intra-node link has no bandwidth");
  if (nodes() > 1)
    LOCKSTEP_CHECK(inter.bytes_per_s > 0, "scaling model: the inter-node link has no bandwidth");
}

Algorithm algorithm_from_name(const std::string& name) {
  if (name == "ring" || name == "flat") return Algorithm::Ring;
  if (name == "hierarchical") return Algorithm::Hierarchical;
  LOCKSTEP_FAIL_HINT("ring (also: flat) or hierarchical", "scaling model: unknown algorithm '",
                     name, "'");
}

const char* algorithm_name(Algorithm algorithm) {
  return algorithm == Algorithm::Ring ? "ring" : "hierarchical";
}

double ring_allreduce_s(double bytes, int p, const Link& link) {
  LOCKSTEP_CHECK(p >= 1, "ring allreduce over ", p, " ranks");
  if (p == 1) return 0.0;
  LOCKSTEP_CHECK(link.bytes_per_s > 0, "ring allreduce over a link without bandwidth");
  const double steps = 2.0 * (p - 1);
  return steps * link.alpha_s + steps / p * bytes / link.bytes_per_s;
}

double allreduce_s(double bytes, const Topology& topology, Algorithm algorithm) {
  topology.validate();
  const int p = topology.ranks;
  if (p == 1) return 0.0;
  const int nodes = topology.nodes();
  if (nodes == 1) return ring_allreduce_s(bytes, p, topology.intra);
  const int local = topology.ranks_per_node;
  if (algorithm == Algorithm::Ring) {
    // A ring ordered by node has one edge out of every node: the network carries what every
    // intra link carries, and each of the 2(p-1) steps lasts as long as its slowest hop.
    Link slowest = topology.inter;
    if (local > 1) {
      slowest.alpha_s = std::max(topology.intra.alpha_s, topology.inter.alpha_s);
      slowest.bytes_per_s = std::min(topology.intra.bytes_per_s, topology.inter.bytes_per_s);
    }
    return ring_allreduce_s(bytes, p, slowest);
  }
  const double in_node =
      local > 1 ? (local - 1) * topology.intra.alpha_s + bytes / topology.intra.bytes_per_s : 0.0;
  return in_node + ring_allreduce_s(bytes, nodes, topology.inter) + in_node;
}

std::vector<Bucket> make_buckets(const std::vector<GradientReady>& gradients,
                                 std::size_t bucket_bytes, std::size_t first_bucket_bytes,
                                 int wire_bytes) {
  LOCKSTEP_CHECK(!gradients.empty(), "scaling model: a model without parameters");
  LOCKSTEP_CHECK(wire_bytes == 4 || wire_bytes == 2,
                 "scaling model: gradients travel as 4-byte f32 or 2-byte bf16, not ", wire_bytes,
                 "-byte elements");
  constexpr std::int64_t kAlign = ops::kFlatAlignBytes / static_cast<std::int64_t>(sizeof(float));
  std::vector<Bucket> buckets;
  std::size_t data_bytes = 0;  // the limit counts parameter data, not padding (FlatLayout's rule)
  for (std::size_t k = gradients.size(); k-- > 0;) {
    const GradientReady& g = gradients[k];
    LOCKSTEP_CHECK(g.numel > 0 && g.ready >= 0.0 && g.ready <= 1.0 + 1e-12,
                   "scaling model: parameter ", k, " has ", g.numel, " elements, ready at ",
                   g.ready, " (need > 0 elements, ready in [0, 1])");
    const std::size_t limit = buckets.size() == 1 ? first_bucket_bytes : bucket_bytes;
    if (buckets.empty() || data_bytes >= limit) {
      buckets.emplace_back();
      data_bytes = 0;
    }
    data_bytes += static_cast<std::size_t>(g.numel) * sizeof(float);
    const std::int64_t padded = (g.numel + kAlign - 1) / kAlign * kAlign;
    buckets.back().bytes += static_cast<double>(padded) * wire_bytes;
    buckets.back().ready = std::max(buckets.back().ready, std::min(g.ready, 1.0));
  }
  return buckets;
}

std::vector<GradientReady> gradients_by_flops(const std::vector<LayerCost>& layers) {
  const double total = backward_flops(layers);
  LOCKSTEP_CHECK(total > 0, "scaling model: the layers have no backward FLOPs");
  std::vector<GradientReady> out;
  // Backward runs the layers last to first; layer k's parameters are reported after its own
  // backward, i.e. once the FLOPs of layers k..end are done.
  std::vector<double> done_after(layers.size(), 0.0);
  double done = 0.0;
  for (std::size_t k = layers.size(); k-- > 0;) {
    done += layers[k].backward_flops;
    done_after[k] = done / total;
  }
  for (std::size_t k = 0; k < layers.size(); ++k)
    for (std::int64_t numel : layers[k].param_numel)
      out.push_back({numel, done_after[k]});
  return out;
}

std::vector<LayerCost> layer_costs(nn::Model& model) {
  std::vector<LayerCost> layers;
  Shape shape{1};
  shape.insert(shape.end(), model.sample_shape().begin(), model.sample_shape().end());
  for (std::size_t i = 0; i < model.num_layers(); ++i) {
    nn::Module& layer = model.layer(i);
    LayerCost cost;
    std::vector<nn::Parameter*> params;
    layer.collect_parameters("", params);
    for (const nn::Parameter* p : params)
      cost.param_numel.push_back(p->value.numel());
    cost.backward_flops = layer.forward_flops(shape) * (layer.input_grad() ? 2.0 : 1.0);
    shape = layer.output_shape(shape);
    layers.push_back(std::move(cost));
  }
  return layers;
}

double backward_flops(const std::vector<LayerCost>& layers) {
  double total = 0.0;
  for (const LayerCost& layer : layers)
    total += layer.backward_flops;
  return total;
}

StepPrediction predict_step(const StepCost& cost, const std::vector<Bucket>& buckets,
                            const Topology& topology, Algorithm algorithm) {
  LOCKSTEP_CHECK(cost.forward_s >= 0 && cost.backward_s >= 0 && cost.other_s >= 0 &&
                     cost.compute_slowdown >= 0,
                 "scaling model: negative step cost");
  topology.validate();
  StepPrediction out;
  const std::size_t n = buckets.size();
  std::vector<double> comm(n);
  for (std::size_t b = 0; b < n; ++b) {
    comm[b] = allreduce_s(buckets[b].bytes, topology, algorithm);
    out.comm_s += comm[b];
  }
  out.start_s.assign(n, 0.0);
  out.end_s.assign(n, 0.0);

  // Event simulation from the start of backward: work w runs at rate 1 without a collective in
  // flight and 1 / (1 + s) with one; bucket b is ready once w >= ready_b * backward_s; the FIFO
  // starts bucket b once it is ready and bucket b-1 has ended.
  const double total_work = cost.backward_s;
  const double slow_rate = 1.0 / (1.0 + cost.compute_slowdown);
  const double inf = std::numeric_limits<double>::infinity();
  auto ready_work = [&](std::size_t b) { return std::min(buckets[b].ready, 1.0) * total_work; };
  double t = 0.0, work = 0.0, backward_end = total_work > 0 ? inf : 0.0;
  std::size_t next = 0;  // next bucket to start
  bool in_flight = false;
  double flight_end = 0.0;
  while (true) {
    if (!in_flight && next < n && work >= ready_work(next) - 1e-15 * total_work) {
      out.start_s[next] = t;
      flight_end = t + comm[next];
      out.end_s[next] = flight_end;
      in_flight = true;
      ++next;
      continue;
    }
    const double rate = in_flight ? slow_rate : 1.0;
    double dt = inf;
    if (in_flight) dt = std::min(dt, flight_end - t);
    if (work < total_work) {
      dt = std::min(dt, (total_work - work) / rate);
      if (!in_flight && next < n) dt = std::min(dt, (ready_work(next) - work) / rate);
    }
    if (dt == inf) break;  // backward done, FIFO empty
    dt = std::max(dt, 0.0);
    t += dt;
    work = std::min(total_work, work + dt * rate);
    if (work >= total_work && backward_end == inf) backward_end = t;
    if (in_flight && t >= flight_end) in_flight = false;
  }
  const double comm_end = n > 0 ? out.end_s[n - 1] : 0.0;
  out.exposed_s = std::max(0.0, comm_end - backward_end);
  out.compute_s = cost.forward_s + backward_end;
  out.step_s = cost.forward_s + std::max(backward_end, comm_end) + cost.other_s;
  const double alone = cost.forward_s + cost.backward_s + cost.other_s;
  out.efficiency = out.step_s > 0 ? alone / out.step_s : 1.0;
  return out;
}

LineFit fit_line(const std::vector<double>& x, const std::vector<double>& t, bool relative,
                 bool nonnegative) {
  LOCKSTEP_CHECK(x.size() == t.size() && x.size() >= 2, "line fit: need >= 2 points, got ",
                 x.size(), " sizes and ", t.size(), " times");
  std::vector<double> w(x.size(), 1.0);
  for (std::size_t i = 0; i < x.size(); ++i) {
    LOCKSTEP_CHECK(std::isfinite(x[i]) && std::isfinite(t[i]) && t[i] > 0, "line fit: point ", i,
                   " is (", x[i], ", ", t[i], "); times must be > 0");
    if (relative) w[i] = 1.0 / (t[i] * t[i]);
  }
  double s = 0, sx = 0, sxx = 0, st = 0, sxt = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    s += w[i];
    sx += w[i] * x[i];
    sxx += w[i] * x[i] * x[i];
    st += w[i] * t[i];
    sxt += w[i] * x[i] * t[i];
  }
  const double det = s * sxx - sx * sx;
  LOCKSTEP_CHECK(det > 1e-12 * s * sxx, "line fit: the sizes must not all be equal");
  LineFit fit;
  fit.slope = (s * sxt - sx * st) / det;
  fit.intercept = (st - fit.slope * sx) / s;
  if (nonnegative && fit.intercept < 0) {  // through the origin
    fit.intercept = 0;
    fit.slope = sxt / sxx;
    fit.clamped = "intercept";
  }
  if (nonnegative && fit.slope < 0) {  // a constant
    fit.slope = 0;
    fit.intercept = st / s;
    fit.clamped = "slope";
  }
  double sum_sq = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double r = (fit.intercept + fit.slope * x[i]) / t[i] - 1.0;
    fit.relative_residuals.push_back(r);
    sum_sq += r * r;
  }
  fit.rms_relative = std::sqrt(sum_sq / static_cast<double>(x.size()));
  return fit;
}

Link link_from_ring_fit(const LineFit& fit, int p) {
  LOCKSTEP_CHECK(p >= 2, "a ring fit needs >= 2 ranks, got ", p);
  LOCKSTEP_CHECK(fit.slope > 0, "line fit has no per-byte cost (slope ", fit.slope,
                 "): the sizes did not reach the bandwidth-bound range");
  const double steps = 2.0 * (p - 1);
  return Link{fit.intercept / steps, steps / p / fit.slope};
}

const std::vector<LinkPreset>& link_presets() {
  // Bandwidths are line rates per direction; the latencies are assumed per-hop costs of a
  // collective library (not wire latencies), stated in docs/SCALING.md.
  static const std::vector<LinkPreset> presets = {
      {"nvlink4", false, {1e-6, 450e9}, "H100/H200 SXM NVLink 4: 900 GB/s bidirectional per GPU"},
      {"nvlink-v100", false, {2e-6, 150e9}, "V100 SXM2 NVLink 2: 6 links x 25 GB/s per direction"},
      {"pcie3", false, {5e-6, 12e9}, "PCIe 3.0 x16, about 12 GB/s achievable per direction"},
      {"ib-ndr", true, {5e-6, 50e9}, "InfiniBand NDR, 400 Gb/s per NIC"},
      {"ib-edr", true, {5e-6, 12.5e9}, "InfiniBand EDR, 100 Gb/s per NIC"},
      {"100gbe", true, {25e-6, 12.5e9}, "100 Gb Ethernet, TCP"},
      {"25gbe-roce", true, {10e-6, 3.125e9}, "25 Gb Ethernet with RDMA (RoCE)"},
  };
  return presets;
}

const LinkPreset& link_preset(const std::string& name) {
  std::string names;
  for (const LinkPreset& p : link_presets()) {
    if (p.name == name) return p;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  LOCKSTEP_FAIL_HINT("one of " + names + ", or give --*-alpha-us and --*-gbs",
                     "scaling model: unknown link preset '", name, "'");
}

}  // namespace lockstep::parallel::scaling
