// Scaling model: the step time of bucketed DDP, with its allreduces overlapped with backward, at
// any number of ranks, from a latency-bandwidth (alpha-beta) description of the links, the
// gradient buckets of a model (the Reducer's rule) and the compute time of one step. Each bucket's
// allreduce starts when its last gradient is ready and the previous bucket's allreduce has ended
// (one FIFO of collectives, as the Reducer and the communication thread or NCCL stream run them);
// what is still running when backward ends is exposed communication.
//
// Pure arithmetic: nothing here communicates or times anything. The equations, their calibration
// on measured runs and their check against published results are in docs/SCALING.md; the
// hand-computed cases are in tests/parallel/test_scaling_model.cpp. Times in seconds, sizes in
// bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::nn {
class Model;
}

namespace lockstep::parallel::scaling {

// One class of link: moving n bytes over one hop takes alpha + n / bytes_per_s.
struct Link {
  double alpha_s = 0.0;
  double bytes_per_s = 0.0;
};

// `ranks` ranks, `ranks_per_node` to a node (ranks must be a multiple of it, or fewer than it).
// intra: one rank's link to the next rank of its node (an NVLink port, memory for CPU ranks).
// inter: one node's share of the network, all its NICs together, and one hop's latency.
struct Topology {
  int ranks = 1;
  int ranks_per_node = 1;
  Link intra, inter;
  int nodes() const;
  void validate() const;  // throws lockstep::Error naming the bad field
};

// Ring: one ring over all ranks (NCCL's and Open MPI's ring, lockstep's `flat`).
// Hierarchical: reduce to a leader per node, ring over the leaders, broadcast in the node
// (lockstep's dist.algorithm = hierarchical).
enum class Algorithm { Ring, Hierarchical };
Algorithm algorithm_from_name(const std::string& name);  // "ring" | "flat" | "hierarchical"
const char* algorithm_name(Algorithm algorithm);

// Ring allreduce of n bytes over p ranks on one link: 2(p-1) alpha + 2(p-1)/p n / B.
double ring_allreduce_s(double bytes, int p, const Link& link);
// One allreduce of `bytes` on the topology.
//   Ring, one node:   ring_allreduce_s over the intra link.
//   Ring, N > 1 nodes: each of the 2(p-1) steps waits for the slowest hop (alpha = max of both),
//     and every rank's intra link and every node's network carry 2(p-1)/p n (B = min of both).
//   Hierarchical: reduce in the node, (L-1) alpha_intra + n / B_intra (pipelined), then a ring
//     of the N leaders over the network, then the broadcast, again (L-1) alpha_intra + n / B_intra.
double allreduce_s(double bytes, const Topology& topology, Algorithm algorithm);

// One parameter's gradient, in forward order: its elements, and the fraction of the backward
// pass (0..1) done when it is ready.
struct GradientReady {
  std::int64_t numel = 0;
  double ready = 0.0;
};

// A bucket as the model sees it: bytes sent (the Reducer sends padding too) and the fraction of
// backward after which its last gradient is ready.
struct Bucket {
  double bytes = 0.0;
  double ready = 0.0;
};

// The Reducer's buckets (optim::FlatLayout::build's rule: parameters in reverse order, a new
// bucket once the current one holds at least its limit, the first limited to first_bucket_bytes;
// each parameter padded to ops::kFlatAlignBytes). Bucket 0 first. `wire_bytes`: bytes each
// element travels as (4: f32; 2: dist.grad_dtype = bf16, which halves what a bucket sends but
// not where buckets end, since the limits count the f32 gradients).
std::vector<Bucket> make_buckets(const std::vector<GradientReady>& gradients,
                                 std::size_t bucket_bytes, std::size_t first_bucket_bytes,
                                 int wire_bytes = 4);

// A layer's share of the gradient side: its parameters' elements (forward order) and the FLOPs
// of its backward pass.
struct LayerCost {
  std::vector<std::int64_t> param_numel;
  double backward_flops = 0.0;
};
// Readiness from FLOPs: layer k's parameters are ready once the backward FLOPs of layers
// k..end are done (backward runs the layers in reverse and reports a layer's parameters after
// its backward). Layers without FLOPs (activations, norms, pooling) take no time in this model.
std::vector<GradientReady> gradients_by_flops(const std::vector<LayerCost>& layers);
// A built model's layers: backward FLOPs = 2 x forward FLOPs per sample (input and weight
// gradients), 1 x for a layer that computes no input gradient (the first layer with parameters).
std::vector<LayerCost> layer_costs(nn::Model& model);
double backward_flops(const std::vector<LayerCost>& layers);

// What one step costs on one rank without communication.
struct StepCost {
  double forward_s = 0.0;
  double backward_s = 0.0;
  double other_s = 0.0;  // after the gradients: optimizer, zero_grad, checks
  // While a collective is in flight, backward runs at 1 / (1 + s) of its speed (collective
  // kernels or a communication thread taking compute from it). 0 = perfect overlap.
  double compute_slowdown = 0.0;
};

struct StepPrediction {
  double step_s = 0.0;
  double compute_s = 0.0;              // forward + backward, stretched by compute_slowdown
  double comm_s = 0.0;                 // the buckets' allreduce times, summed
  double exposed_s = 0.0;              // communication after backward ended
  double efficiency = 1.0;             // (forward + backward + other) / step_s: weak scaling
  std::vector<double> start_s, end_s;  // per bucket, from the start of backward
};

StepPrediction predict_step(const StepCost& cost, const std::vector<Bucket>& buckets,
                            const Topology& topology, Algorithm algorithm);

// Least-squares line t = intercept + slope * x. relative = true weights each point by 1/t^2, so
// a fit over sizes from bytes to megabytes minimises relative, not absolute, error. Negative
// coefficients are not physical: with nonnegative = true, a negative one is set to 0 and the
// other refitted (clamped says which).
struct LineFit {
  double intercept = 0.0;
  double slope = 0.0;
  std::vector<double> relative_residuals;  // fit / measured - 1, per point
  double rms_relative = 0.0;
  std::string clamped;  // "", "intercept" or "slope"
};
LineFit fit_line(const std::vector<double>& x, const std::vector<double>& t, bool relative = true,
                 bool nonnegative = true);
// The link whose ring allreduce over p ranks gives that line: alpha = intercept / (2(p-1)),
// B = 2(p-1)/p / slope. A reduction cost per byte has the same (p-1)/p factor, so it cannot be
// told apart from the link's and is part of the fitted B.
Link link_from_ring_fit(const LineFit& fit, int p);

// Named link presets (line rates; the latencies are assumptions, see docs/SCALING.md). intra
// presets are per rank, inter presets per NIC (multiply by the NICs of a node).
struct LinkPreset {
  std::string name;
  bool inter = false;
  Link link;
  std::string note;
};
const std::vector<LinkPreset>& link_presets();
const LinkPreset& link_preset(const std::string& name);  // throws, listing the names

// Published architectures the model is checked against (docs/SCALING.md): resnet50, resnet101
// (torchvision's layer shapes, ImageNet 224x224), vgg16 (torchvision, without batch norm), and
// inception3, which is resnet50's profile scaled to Inception V3's 23.85 M parameters and 5.7
// GMAC (an approximation, not its layers).
struct ReferenceModel {
  std::string name;
  std::vector<LayerCost> layers;
  double forward_flops = 0.0;  // per sample
  std::int64_t parameters() const;
};
ReferenceModel reference_model(const std::string& name);
std::vector<std::string> reference_model_names();

}  // namespace lockstep::parallel::scaling
