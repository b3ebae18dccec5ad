// The scaling model's arithmetic (parallel/scaling_model.hpp) against cases computed by hand, its
// monotonicity, the buckets it derives against the Reducer's own layout, and the calibration fit
// against synthetic timings with a known alpha and bandwidth.
#include "lockstep/parallel/scaling_model.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "lockstep/core/error.hpp"
#include "lockstep/nn/model.hpp"
#include "lockstep/optim/flat.hpp"
#include "lockstep/parallel/reducer.hpp"

namespace lockstep::parallel::scaling {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

Topology one_link(int ranks, double alpha, double bytes_per_s) {
  Topology t;
  t.ranks = ranks;
  t.ranks_per_node = ranks;
  t.intra = {alpha, bytes_per_s};
  return t;
}

}  // namespace

TEST(ScalingModel, RingAllreduceOfTwoRanksIsTwoLatenciesAndOneBufferPerLinkRate) {
  // p = 2: 2(p-1) = 2 steps, 2(p-1)/p = 1 buffer's worth of bytes on the link.
  EXPECT_DOUBLE_EQ(ring_allreduce_s(8e6, 2, {10e-6, 1e9}), 2 * 10e-6 + 8e6 / 1e9);
  // p = 4: 6 steps of alpha, 1.5 buffers.
  EXPECT_DOUBLE_EQ(ring_allreduce_s(8e6, 4, {10e-6, 1e9}), 6 * 10e-6 + 1.5 * 8e6 / 1e9);
  EXPECT_EQ(ring_allreduce_s(8e6, 1, {10e-6, 1e9}), 0.0);
}

TEST(ScalingModel, OneBucketOnTwoRanksIsExposedWhole) {
  // One bucket of 4 MB, ready only when backward ends: all of its allreduce is exposed.
  const StepCost cost{.forward_s = 0.010, .backward_s = 0.020, .other_s = 0.003};
  const std::vector<Bucket> buckets = {{4e6, 1.0}};
  const StepPrediction p = predict_step(cost, buckets, one_link(2, 5e-6, 2e9), Algorithm::Ring);
  const double comm = 2 * 5e-6 + 4e6 / 2e9;  // 2.01 ms
  EXPECT_NEAR(p.comm_s, comm, 1e-15);
  EXPECT_NEAR(p.exposed_s, comm, 1e-12);
  EXPECT_NEAR(p.step_s, 0.033 + comm, 1e-12);
  EXPECT_NEAR(p.efficiency, 0.033 / (0.033 + comm), 1e-12);
  EXPECT_NEAR(p.start_s[0], 0.020, 1e-12);
}

TEST(ScalingModel, BucketsReadyEarlyEnoughAreHiddenByBackward) {
  // Three buckets ready at 20%, 40%, 60% of a 100 ms backward, 10 ms of allreduce each: each ends
  // before the next is ready, the last at 70 ms < 100 ms. Nothing is exposed.
  const StepCost cost{.forward_s = 0.05, .backward_s = 0.1};
  const double bytes = (0.010 - 2e-6) * 1e9;  // 2 ranks: 2 alpha + n / B = 10 ms
  const std::vector<Bucket> buckets = {{bytes, 0.2}, {bytes, 0.4}, {bytes, 0.6}};
  const StepPrediction p = predict_step(cost, buckets, one_link(2, 1e-6, 1e9), Algorithm::Ring);
  EXPECT_NEAR(p.comm_s, 0.030, 1e-12);
  EXPECT_EQ(p.exposed_s, 0.0);
  EXPECT_NEAR(p.step_s, 0.15, 1e-12);
  EXPECT_NEAR(p.efficiency, 1.0, 1e-12);
  EXPECT_NEAR(p.start_s[1], 0.040, 1e-12);
  EXPECT_NEAR(p.end_s[2], 0.070, 1e-12);
}

TEST(ScalingModel, WhenCommunicationDominatesBucketsQueueBehindEachOther) {
  // Buckets ready at 10%, 20%, 30% of a 10 ms backward, 50 ms of allreduce each: bucket 0
  // starts at 1 ms, the others wait in the FIFO, the last ends at 1 + 150 = 151 ms, so 141 ms
  // are exposed after backward's 10 ms.
  const StepCost cost{.forward_s = 0.005, .backward_s = 0.010, .other_s = 0.001};
  const double bytes = (0.050 - 2e-6) * 1e9;
  const std::vector<Bucket> buckets = {{bytes, 0.1}, {bytes, 0.2}, {bytes, 0.3}};
  const StepPrediction p = predict_step(cost, buckets, one_link(2, 1e-6, 1e9), Algorithm::Ring);
  EXPECT_NEAR(p.start_s[0], 0.001, 1e-12);
  EXPECT_NEAR(p.start_s[1], 0.051, 1e-12);  // ready at 2 ms, waited for bucket 0
  EXPECT_NEAR(p.end_s[2], 0.151, 1e-12);
  EXPECT_NEAR(p.exposed_s, 0.141, 1e-12);
  EXPECT_NEAR(p.step_s, 0.005 + 0.151 + 0.001, 1e-12);
  EXPECT_NEAR(p.efficiency, 0.016 / 0.157, 1e-12);
}

TEST(ScalingModel, ComputeSlowdownStretchesBackwardWhileACollectiveIsInFlight) {
  // Backward 1 s; one bucket ready at 50%, 200 ms of allreduce; backward at half speed meanwhile
  // (s = 1): 0.5 s + 0.2 s (0.1 s of work done) + the remaining 0.4 s = 1.1 s, nothing exposed.
  const StepCost cost{.forward_s = 0.0, .backward_s = 1.0, .compute_slowdown = 1.0};
  const std::vector<Bucket> buckets = {{(0.2 - 2e-6) * 1e9, 0.5}};
  const StepPrediction p = predict_step(cost, buckets, one_link(2, 1e-6, 1e9), Algorithm::Ring);
  EXPECT_NEAR(p.compute_s, 1.1, 1e-12);
  EXPECT_EQ(p.exposed_s, 0.0);
  EXPECT_NEAR(p.step_s, 1.1, 1e-12);
  // Without the slowdown the same bucket is free.
  StepCost perfect = cost;
  perfect.compute_slowdown = 0;
  EXPECT_NEAR(predict_step(perfect, buckets, one_link(2, 1e-6, 1e9), Algorithm::Ring).step_s, 1.0,
              1e-12);
}

TEST(ScalingModel, OneRankHasNoCommunication) {
  const StepCost cost{.forward_s = 0.01, .backward_s = 0.02, .other_s = 0.001};
  const StepPrediction p =
      predict_step(cost, {{1e9, 1.0}}, one_link(1, 1e-3, 1e6), Algorithm::Ring);
  EXPECT_EQ(p.comm_s, 0.0);
  EXPECT_NEAR(p.step_s, 0.031, 1e-15);
  EXPECT_NEAR(p.efficiency, 1.0, 1e-15);
}

TEST(ScalingModel, RingAcrossNodesRunsAtTheSlowestHop) {
  // 2 nodes x 4 ranks: every step waits for the network's alpha, and the node's network carries
  // as much as each rank's NVLink, so the slower of the two sets the bandwidth term.
  Topology t;
  t.ranks = 8;
  t.ranks_per_node = 4;
  t.intra = {1e-6, 400e9};
  t.inter = {5e-6, 50e9};
  const double n = 64 * kMiB;
  EXPECT_NEAR(allreduce_s(n, t, Algorithm::Ring), 14 * 5e-6 + 14.0 / 8 * n / 50e9, 1e-15);
  // One node: the network plays no part.
  t.ranks = 4;
  EXPECT_NEAR(allreduce_s(n, t, Algorithm::Ring), 6 * 1e-6 + 1.5 * n / 400e9, 1e-15);
}

TEST(ScalingModel, HierarchicalIsReduceLeaderRingBroadcast) {
  // 4 nodes x 8 ranks, 100 MB: in-node reduce 7 alpha + n/B, leader ring over 4 nodes
  // 6 alpha + 1.5 n/B, broadcast 7 alpha + n/B.
  Topology t;
  t.ranks = 32;
  t.ranks_per_node = 8;
  t.intra = {1e-6, 400e9};
  t.inter = {5e-6, 50e9};
  const double n = 1e8;
  const double in_node = 7 * 1e-6 + n / 400e9;
  const double leaders = 6 * 5e-6 + 1.5 * n / 50e9;
  EXPECT_NEAR(allreduce_s(n, t, Algorithm::Hierarchical), in_node + leaders + in_node, 1e-15);
  // The flat ring's network carries 2(p-1)/p n = 1.94 n, the leaders' only 2(N-1)/N n = 1.5 n,
  // which outweighs the two copies through the node here.
  EXPECT_LT(allreduce_s(n, t, Algorithm::Hierarchical), allreduce_s(n, t, Algorithm::Ring));
  // For a small bucket the hierarchy saves the flat ring's 2(p-1) network latencies.
  EXPECT_LT(allreduce_s(1e3, t, Algorithm::Hierarchical), allreduce_s(1e3, t, Algorithm::Ring));
  // With 64 nodes both put about 2n on the network (1.969 n vs 1.996 n); where the node's own
  // links are no faster than the network, the two copies through the node cost more than the
  // ring's latencies for a large bucket (1 GB: 80 ms against 45 ms).
  t.ranks = 512;
  t.intra = {1e-6, 50e9};
  EXPECT_GT(allreduce_s(1e9, t, Algorithm::Hierarchical), allreduce_s(1e9, t, Algorithm::Ring));
}

TEST(ScalingModel, EfficiencyNeverRisesWithMoreNodes) {
  const StepCost cost{.forward_s = 0.03, .backward_s = 0.06, .other_s = 0.002};
  std::vector<GradientReady> grads;
  for (int i = 0; i < 24; ++i)  // 24 tensors of 4 MB, ready evenly through backward
    grads.push_back({1 << 20, 1.0 - i / 24.0});
  const std::vector<Bucket> buckets = make_buckets(grads, 25u << 20, 1u << 20);
  for (Algorithm algo : {Algorithm::Ring, Algorithm::Hierarchical}) {
    double last = 1.0;
    for (int p = 8; p <= 1024; p *= 2) {
      Topology t;
      t.ranks = p;
      t.ranks_per_node = 8;
      t.intra = {1e-6, 450e9};
      t.inter = {25e-6, 12.5e9};
      const double e = predict_step(cost, buckets, t, algo).efficiency;
      EXPECT_LE(e, last + 1e-12) << algorithm_name(algo) << " at " << p << " ranks";
      EXPECT_GT(e, 0.0);
      last = e;
    }
  }
}

TEST(ScalingModel, SlowerLinksAndMoreBytesNeverShortenTheStep) {
  const StepCost cost{.forward_s = 0.01, .backward_s = 0.02};
  const Topology fast = one_link(8, 2e-6, 100e9);
  for (double bytes : {1e3, 1e6, 1e8}) {
    const std::vector<Bucket> b = {{bytes, 0.3}, {bytes, 0.7}, {bytes, 1.0}};
    const std::vector<Bucket> more = {{2 * bytes, 0.3}, {2 * bytes, 0.7}, {2 * bytes, 1.0}};
    const double base = predict_step(cost, b, fast, Algorithm::Ring).step_s;
    EXPECT_GE(predict_step(cost, more, fast, Algorithm::Ring).step_s, base);
    EXPECT_GE(predict_step(cost, b, one_link(8, 2e-6, 10e9), Algorithm::Ring).step_s, base);
    EXPECT_GE(predict_step(cost, b, one_link(8, 20e-6, 100e9), Algorithm::Ring).step_s, base);
  }
}

TEST(ScalingModel, BucketsFollowTheReducersRuleAndCountPadding) {
  // Elements 300, 50, 700, 20, 80, 60 with limits 400 B (first) and 4000 B, as in
  // test_buckets.cpp: bucket 0 = {60, 80}, bucket 1 = the rest. Each tensor is padded to 64
  // floats (256 B) in the flat layout, and the Reducer sends the padding.
  std::vector<GradientReady> g = {{300, 1.0}, {50, 0.9}, {700, 0.8},
                                  {20, 0.4},  {80, 0.3}, {60, 0.1}};
  const std::vector<Bucket> b = make_buckets(g, 4000, 400);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].bytes, (64 + 128) * 4.0);             // 60 -> 64, 80 -> 128
  EXPECT_EQ(b[1].bytes, (64 + 704 + 64 + 320) * 4.0);  // 20, 700, 50, 300 padded
  EXPECT_EQ(b[0].ready, 0.3);  // its last gradient (80 elements) is ready at 30%
  EXPECT_EQ(b[1].ready, 1.0);
}

// dist.grad_dtype = bf16 sends 2 bytes per element: half of every bucket's bytes, with the same
// boundaries (the limits count the f32 gradients, as in the Reducer's layout).
TEST(ScalingModel, Bf16GradientsHalveWhatEachBucketSendsButNotWhereBucketsEnd) {
  std::vector<GradientReady> g = {{300, 1.0}, {50, 0.9}, {700, 0.8},
                                  {20, 0.4},  {80, 0.3}, {60, 0.1}};
  const std::vector<Bucket> f32 = make_buckets(g, 4000, 400);
  const std::vector<Bucket> bf16 = make_buckets(g, 4000, 400, 2);
  ASSERT_EQ(bf16.size(), f32.size());
  for (std::size_t b = 0; b < f32.size(); ++b) {
    EXPECT_EQ(bf16[b].bytes, f32[b].bytes / 2) << "bucket " << b;
    EXPECT_EQ(bf16[b].ready, f32[b].ready) << "bucket " << b;
  }
  EXPECT_THROW(make_buckets(g, 4000, 400, 8), Error);
}

TEST(ScalingModel, BucketsOfTheShippedModelsEqualTheFlatLayoutTheReducerUses) {
  struct Case {
    const char* spec;
    Shape sample;
    std::int64_t classes;
  };
  const Case cases[] = {
      {"mlp:1024,1024", {1, 28, 28}, 10},
      {"conv(32,3,pad=1)-bn-relu-maxpool(2)-conv(64,3,pad=1)-bn-relu-maxpool(2)-flatten-"
       "dropout(0.25)-linear(128)-relu-linear(10)",
       {1, 28, 28},
       10},
      {"gpt-tiny", {32}, 64},
  };
  const ReducerOptions options;  // 25 MiB, first 1 MiB
  for (const Case& c : cases) {
    nn::Model model = nn::Model::build(c.spec, c.sample, c.classes, 1);
    const std::vector<GradientReady> g = gradients_by_flops(layer_costs(model));
    ASSERT_EQ(g.size(), model.parameters().size()) << c.spec;
    const std::vector<Bucket> ours =
        make_buckets(g, options.bucket_bytes, options.first_bucket_bytes);
    const auto layout = optim::FlatLayout::build(model.parameters(), bucket_limits(options));
    ASSERT_EQ(ours.size(), layout.buckets().size()) << c.spec;
    for (std::size_t b = 0; b < ours.size(); ++b)
      EXPECT_EQ(ours[b].bytes, 4.0 * static_cast<double>(layout.buckets()[b].numel())) << c.spec;
  }
}

TEST(ScalingModel, ReadinessFromFlopsFollowsBackwardThroughTheMlp) {
  // mlp:1024,1024 on 784 inputs: backward FLOPs per sample are 2x forward for the two upper
  // linears and 1x for the first (no input gradient): 2*784*1024, 4*1024*1024, 4*1024*10.
  nn::Model model = nn::Model::build("mlp:1024,1024", {1, 28, 28}, 10, 1);
  const std::vector<LayerCost> layers = layer_costs(model);
  const double first = 2.0 * 784 * 1024, middle = 4.0 * 1024 * 1024, last = 4.0 * 1024 * 10;
  EXPECT_DOUBLE_EQ(backward_flops(layers), first + middle + last);
  const std::vector<GradientReady> g = gradients_by_flops(layers);
  ASSERT_EQ(g.size(), 6u);  // weight and bias of three layers, forward order
  const double total = first + middle + last;
  EXPECT_DOUBLE_EQ(g[5].ready, last / total);
  EXPECT_DOUBLE_EQ(g[3].ready, (last + middle) / total);
  EXPECT_DOUBLE_EQ(g[0].ready, 1.0);
  EXPECT_EQ(g[2].numel, 1024 * 1024);
}

TEST(ScalingModel, FitRecoversKnownLatencyAndBandwidthFromSyntheticTimings) {
  for (int p : {2, 3, 4}) {
    const Link truth{25e-6, 3.2e9};
    std::vector<double> sizes, exact, noisy;
    for (double n = 4096; n <= 64 * kMiB; n *= 4) {
      sizes.push_back(n);
      exact.push_back(ring_allreduce_s(n, p, truth));
      // +-3% alternating: a fit over relative error must still land close.
      noisy.push_back(exact.back() * (sizes.size() % 2 ? 1.03 : 0.97));
    }
    const Link fitted = link_from_ring_fit(fit_line(sizes, exact), p);
    EXPECT_NEAR(fitted.alpha_s / truth.alpha_s, 1.0, 1e-9) << p << " ranks";
    EXPECT_NEAR(fitted.bytes_per_s / truth.bytes_per_s, 1.0, 1e-9) << p << " ranks";
    const LineFit fit = fit_line(sizes, noisy);
    const Link rough = link_from_ring_fit(fit, p);
    EXPECT_NEAR(rough.alpha_s / truth.alpha_s, 1.0, 0.1) << p << " ranks";
    EXPECT_NEAR(rough.bytes_per_s / truth.bytes_per_s, 1.0, 0.1) << p << " ranks";
    EXPECT_NEAR(fit.rms_relative, 0.03, 0.01);
    EXPECT_EQ(fit.relative_residuals.size(), sizes.size());
    EXPECT_EQ(fit.clamped, "");
  }
}

TEST(ScalingModel, UnweightedFitIsDrivenByTheLargestSizes) {
  // With absolute residuals the smallest sizes' latency is lost in the large sizes' error; the
  // relative fit keeps it. Same synthetic data, 10% off at the largest size only.
  std::vector<double> sizes = {1e3, 1e4, 1e5, 1e6, 1e7};
  std::vector<double> t;
  for (double n : sizes)
    t.push_back(20e-6 + n / 1e9);
  t.back() *= 1.10;
  const LineFit relative = fit_line(sizes, t, true);
  const LineFit absolute = fit_line(sizes, t, false);
  EXPECT_LT(std::abs(relative.intercept - 20e-6), std::abs(absolute.intercept - 20e-6));
}

TEST(ScalingModel, NegativeInterceptIsClampedToZeroAndSaidSo) {
  // t = n / B - 1 ms would need a negative latency: the fit goes through the origin instead.
  std::vector<double> sizes = {1e6, 2e6, 4e6, 8e6};
  std::vector<double> t;
  for (double n : sizes)
    t.push_back(n / 1e9 - 0.5e-3);
  const LineFit fit = fit_line(sizes, t);
  EXPECT_EQ(fit.clamped, "intercept");
  EXPECT_EQ(fit.intercept, 0.0);
  EXPECT_GT(fit.slope, 0.0);
}

TEST(ScalingModel, ReferenceModelsHaveTorchvisionsParameterCounts) {
  EXPECT_EQ(reference_model("resnet50").parameters(), 25557032);
  EXPECT_EQ(reference_model("resnet101").parameters(), 44549160);
  EXPECT_EQ(reference_model("vgg16").parameters(), 138357544);
  // Published forward costs (multiply-add = 2 FLOPs): ResNet-50 4.1 GMAC, ResNet-101 7.8,
  // VGG-16 15.5.
  EXPECT_NEAR(reference_model("resnet50").forward_flops / 8.2e9, 1.0, 0.03);
  EXPECT_NEAR(reference_model("resnet101").forward_flops / 15.6e9, 1.0, 0.03);
  EXPECT_NEAR(reference_model("vgg16").forward_flops / 31.0e9, 1.0, 0.02);
  EXPECT_NEAR(reference_model("inception3").parameters() / 23851784.0, 1.0, 1e-4);
  EXPECT_NEAR(reference_model("inception3").forward_flops / 11.4e9, 1.0, 1e-9);
}

TEST(ScalingModel, BadInputNamesWhatIsWrong) {
  Topology t = one_link(12, 1e-6, 1e9);
  t.ranks_per_node = 8;  // 12 ranks do not fill nodes of 8
  try {
    allreduce_s(1e6, t, Algorithm::Ring);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("12 ranks do not fill nodes of 8"), std::string::npos);
  }
  EXPECT_THROW(link_preset("infiniband"), Error);
  EXPECT_THROW(algorithm_from_name("tree"), Error);
  EXPECT_THROW(reference_model("resnet18"), Error);
  EXPECT_THROW(fit_line({1e6, 1e6}, {1e-3, 1e-3}), Error);
  EXPECT_THROW(make_buckets({{0, 1.0}}, 1 << 20, 1 << 20), Error);
}

}  // namespace lockstep::parallel::scaling
