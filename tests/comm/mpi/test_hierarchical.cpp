// The hierarchical allreduce against a float64 reference, the flat MPI allreduce and its own
// predicted summation order, for simulated node layouts (all ranks on one node, one per node,
// pairs, interleaved, uneven 3+1) and, under the namespace cluster, the real one.
//
// Tolerance, from the summation order: every result element is a sum of W float terms x_r. Any
// order of W-1 float additions returns the exact sum to within gamma_{W-1} * sum|x_r|, where
// gamma_k = k*u / (1 - k*u) and u = 2^-24 (Higham, Accuracy and Stability, 4.2). Flat and
// hierarchical each meet that bound against the float64 sum, so they differ by at most twice
// it. Bitwise equality is required where the order is fully known: within a node the terms are
// added in local-rank order; a 2-leader allreduce is one addition (commutative, so either order
// rounds the same); so with at most 2 nodes the result is predicted bit for bit. Integer sums
// (i32) and max/min are exact, hence bitwise equal to flat. Every rank gets the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "lockstep/comm/hierarchical.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/core/rng.hpp"
#include "lockstep/parallel/ddp.hpp"
#include "support/mpi_env.hpp"
#include "support/precision_reference.hpp"
#include "support/training.hpp"

namespace lockstep::test {
namespace {

using comm::AllreduceAlgorithm;
using comm::NodeLayout;
using comm::ReduceOp;

// Simulated layouts for the job's world size: node id per rank.
std::vector<std::vector<int>> layouts_for(int w) {
  std::vector<std::vector<int>> out;
  std::vector<int> one(w, 0), own(w);
  for (int r = 0; r < w; ++r)
    own[r] = r;
  out.push_back(one);
  out.push_back(own);
  if (w == 4) {
    out.push_back({0, 0, 1, 1});  // 2 nodes x 2 ranks
    out.push_back({0, 1, 0, 1});  // the same, ranks interleaved (srun --distribution=cyclic)
    out.push_back({0, 0, 0, 1});  // uneven: 3 + 1
    out.push_back({7, 3, 3, 3});  // uneven: 1 + 3, arbitrary ids
  } else if (w > 2) {
    std::vector<int> first_rest(w, 1);
    first_rest[0] = 0;
    out.push_back(first_rest);
  }
  return out;
}

// A simulated layout that never joins ranks of different real nodes (the namespace cluster runs
// these tests across 2 hosts, whose ranks share no memory): simulated node ids split each real
// node further. On one machine this is `ids` itself.
NodeLayout simulated(const std::vector<int>& ids) {
  static const NodeLayout real = NodeLayout::detect(world());
  std::vector<int> refined(ids.size());
  for (std::size_t r = 0; r < ids.size(); ++r)
    refined[r] = real.node_of(static_cast<int>(r)) * static_cast<int>(ids.size() + 1) + ids[r];
  return NodeLayout(refined);
}

// Rank r's input: uniform in [-1, 1) times 2^(i mod 7 - 3), so magnitudes differ and rounding
// matters. Every rank can compute every rank's input.
template <class T>
std::vector<T> input(int rank, std::int64_t n, std::uint64_t seed) {
  std::vector<float> u(static_cast<std::size_t>(n));
  Philox rng(seed, static_cast<std::uint64_t>(rank));
  rng.fill_uniform(u.data(), n, -1.0f, 1.0f);
  std::vector<T> v(u.size());
  for (std::size_t i = 0; i < u.size(); ++i) {
    if constexpr (std::is_integral_v<T>) {
      v[i] = static_cast<T>(std::lround(u[i] * 1000.0f));
    } else {
      v[i] = static_cast<T>(std::ldexp(u[i], static_cast<int>(i % 7) - 3));
    }
  }
  return v;
}

template <class T>
T combine(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::Sum:
      return a + b;
    case ReduceOp::Max:
      return std::max(a, b);
    case ReduceOp::Min:
      return std::min(a, b);
  }
  return a;
}

// The hierarchical result when at most 2 nodes: node values in local-rank order, then one
// combination of the two node values.
template <class T>
std::vector<T> predicted(const NodeLayout& layout, ReduceOp op, std::int64_t n,
                         std::uint64_t seed) {
  std::vector<std::vector<T>> node_value;
  for (int node = 0; node < layout.nodes(); ++node) {
    std::vector<T> acc;
    for (int r : layout.members(node)) {
      std::vector<T> x = input<T>(r, n, seed);
      if (acc.empty()) {
        acc = x;
      } else {
        for (std::size_t i = 0; i < acc.size(); ++i)
          acc[i] = combine(op, acc[i], x[i]);
      }
    }
    node_value.push_back(acc);
  }
  std::vector<T> out = node_value[0];
  if (layout.nodes() == 2) {
    for (std::size_t i = 0; i < out.size(); ++i)
      out[i] = combine(op, out[i], node_value[1][i]);
  }
  return out;
}

template <class T>
std::vector<T> run(comm::Communicator& c, ReduceOp op, std::int64_t n, std::uint64_t seed) {
  Tensor t = Tensor::from_vector(input<T>(c.rank(), n, seed), {n});
  c.allreduce(t, op);
  return t.to_vector<T>();
}

// True when every rank holds exactly these bits (max and min over ranks agree elementwise).
template <class T>
bool same_on_every_rank(const std::vector<T>& v) {
  Tensor hi = Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())});
  Tensor lo = Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())});
  world().allreduce(hi, ReduceOp::Max);
  world().allreduce(lo, ReduceOp::Min);
  if (v.empty()) return true;
  return std::memcmp(hi.raw_data(), lo.raw_data(), hi.nbytes()) == 0 &&
         std::memcmp(hi.raw_data(), v.data(), hi.nbytes()) == 0;
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  // memcmp of empty vectors would pass null pointers (undefined even for 0 bytes).
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// Floating-point sums: both algorithms within gamma_{W-1} sum|x| of the float64 sum, and the
// hierarchical one bit for bit as predicted when the layout has at most 2 nodes.
template <class T>
void check_float_sum(comm::Communicator& hier, const NodeLayout& layout, std::int64_t n,
                     std::uint64_t seed, const std::string& where) {
  const int w = world().size();
  std::vector<T> h = run<T>(hier, ReduceOp::Sum, n, seed);
  std::vector<T> f = run<T>(world(), ReduceOp::Sum, n, seed);
  std::vector<double> exact(static_cast<std::size_t>(n), 0.0), magnitude(exact.size(), 0.0);
  for (int r = 0; r < w; ++r) {
    std::vector<T> x = input<T>(r, n, seed);
    for (std::size_t i = 0; i < x.size(); ++i) {
      exact[i] += static_cast<double>(x[i]);
      magnitude[i] += std::abs(static_cast<double>(x[i]));
    }
  }
  const double u = std::numeric_limits<T>::epsilon() / 2;
  const double gamma = (w - 1) * u / (1 - (w - 1) * u);
  int bad = 0;
  for (std::size_t i = 0; i < exact.size() && bad < 5; ++i) {
    const double bound = gamma * magnitude[i];
    if (std::abs(h[i] - exact[i]) > bound || std::abs(f[i] - exact[i]) > bound ||
        std::abs(static_cast<double>(h[i]) - static_cast<double>(f[i])) > 2 * bound) {
      ADD_FAILURE() << where << " element " << i << ": hierarchical " << h[i] << ", flat " << f[i]
                    << ", float64 " << exact[i] << ", bound " << bound;
      ++bad;
    }
  }
  if (layout.nodes() <= 2) {
    EXPECT_TRUE(bitwise_equal(h, predicted<T>(layout, ReduceOp::Sum, n, seed)))
        << where << ": not the predicted summation order";
  }
  if (w == 2) {
    EXPECT_TRUE(bitwise_equal(h, f)) << where << ": two terms must round alike";
  }
  EXPECT_TRUE(same_on_every_rank(h)) << where << ": ranks got different bits";
}

// Exact reductions (i32 sums, max, min of anything): bitwise equal to flat.
template <class T>
void check_exact(comm::Communicator& hier, ReduceOp op, std::int64_t n, std::uint64_t seed,
                 const std::string& where) {
  std::vector<T> h = run<T>(hier, op, n, seed);
  std::vector<T> f = run<T>(world(), op, n, seed);
  EXPECT_TRUE(bitwise_equal(h, f))
      << where << " " << comm::reduce_op_name(op) << ": differs from flat";
}

}  // namespace

TEST(HierarchicalAllreduce, MatchesFlatWithinTheSummationOrderBoundForEveryLayout) {
  const int w = world().size();
  for (const std::vector<int>& ids : layouts_for(w)) {
    NodeLayout layout = simulated(ids);
    // A 256-byte segment cuts even small tensors into several segments of uneven slices.
    comm::HierarchicalOptions small;
    small.segment_bytes = 256;
    auto hier = comm::make_hierarchical_communicator(world(), layout, small);
    EXPECT_EQ(hier->local_rank(), layout.local_rank(world().rank()));
    EXPECT_EQ(hier->local_size(),
              static_cast<int>(layout.members(layout.node_of(world().rank())).size()));
    for (std::int64_t n : {0, 1, 5, 63, 64, 65, 1000, 4099}) {
      const std::string where = str(layout.describe(), ", ", n, " elements");
      check_float_sum<float>(*hier, layout, n, 11 + static_cast<std::uint64_t>(n), where);
      check_float_sum<double>(*hier, layout, n, 12, where);
      check_exact<std::int32_t>(*hier, ReduceOp::Sum, n, 13, where);
      check_exact<float>(*hier, ReduceOp::Max, n, 14, where);
      check_exact<float>(*hier, ReduceOp::Min, n, 15, where);
      check_exact<double>(*hier, ReduceOp::Max, n, 16, where);
    }
  }
}

// bf16 (dist.grad_dtype = bf16): a node adds its slots in f32 in local-rank order and rounds
// once; leaders then combine node sums with MPI (one rounding per combination). Values that are
// small multiples of 1/2 sum exactly in any order, so every layout must give the formula; inexact
// ones must stay within one rounding per node plus one per leader combination (at most W, of
// u = 2^-8 times sum |x_r|), give every rank the same bits, and on one node equal the test's own
// prediction (f32 sum in rank order, rounded once).
TEST(HierarchicalAllreduce, Bf16SumsInF32WithinEachNodeAndRoundOncePerNode) {
  const int w = world().size(), rank = world().rank();
  auto exact_input = [](int r, std::int64_t i) {
    return 0.5f * static_cast<float>((i * 7 + r * 3) % 13 - 6);
  };
  auto inexact_input = [](int r, std::int64_t i) {
    return testing::reference_bf16(std::cos(0.29f * static_cast<float>(i) + 0.8f * r) *
                                   (1.0f + 0.07f * static_cast<float>(r)));
  };
  ops::Context ctx(Device::cpu(), 1);
  auto bf16_of = [&](std::int64_t n, const auto& f) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i)
      v[static_cast<std::size_t>(i)] = f(rank, i);
    Tensor t = Tensor::empty({n}, DType::BF16);
    ops::cast(ctx, Tensor::from_vector(v, {n}), t);
    return t;
  };
  auto floats_of = [&](const Tensor& t) {
    Tensor f = Tensor::empty({t.numel()}, DType::F32);
    ops::cast(ctx, t, f);
    return f.to_vector<float>();
  };
  comm::HierarchicalOptions small;
  small.segment_bytes = 256;  // several segments, uneven slices
  for (const std::vector<int>& ids : layouts_for(w))
    for (const comm::HierarchicalOptions& options : {small, comm::HierarchicalOptions{}}) {
      NodeLayout layout = simulated(ids);
      auto hier = comm::make_hierarchical_communicator(world(), layout, options);
      const bool one_node = layout.nodes() == 1;
      // 5000 in default segments: slices of 1250-5000 elements, several blocks of the node's
      // f32 accumulators and a partial one.
      for (std::int64_t n : {1, 63, 1000, 5000}) {
        const std::string where = str(layout.describe(), ", ", n, " bf16 elements, segments of ",
                                      options.segment_bytes, " bytes");
        Tensor exact = bf16_of(n, exact_input);
        hier->allreduce(exact, ReduceOp::Sum);
        Tensor inexact = bf16_of(n, inexact_input);
        hier->allreduce(inexact, ReduceOp::Sum);
        Tensor largest = bf16_of(n, inexact_input), smallest = bf16_of(n, inexact_input);
        hier->allreduce(largest, ReduceOp::Max);
        hier->allreduce(smallest, ReduceOp::Min);
        const std::vector<float> got_exact = floats_of(exact), got = floats_of(inexact);
        const std::vector<float> got_max = floats_of(largest), got_min = floats_of(smallest);
        std::int64_t bad_exact = 0, bad = 0, bad_max = 0, bad_min = 0;
        for (std::int64_t i = 0; i < n; ++i) {
          float formula = 0, in_order = 0;
          float max = inexact_input(0, i), min = max;
          double sum = 0, abs_sum = 0;
          for (int r = 0; r < w; ++r) {
            max = std::max(max, inexact_input(r, i));
            min = std::min(min, inexact_input(r, i));
            formula += exact_input(r, i);
            in_order = r == 0 ? inexact_input(0, i) : in_order + inexact_input(r, i);
            sum += inexact_input(r, i);
            abs_sum += std::fabs(inexact_input(r, i));
          }
          const auto k = static_cast<std::size_t>(i);
          bad_exact += got_exact[k] == formula ? 0 : 1;
          const bool ok = one_node
                              ? got[k] == testing::reference_bf16(in_order)
                              : std::fabs(got[k] - sum) <= w * ops::kBf16UnitRoundoff * abs_sum;
          bad += ok ? 0 : 1;
          bad_max += got_max[k] == max ? 0 : 1;  // bf16 inputs: max and min are exact
          bad_min += got_min[k] == min ? 0 : 1;
        }
        EXPECT_EQ(bad_exact, 0) << where << ": exact sums";
        EXPECT_EQ(bad, 0) << where << ": rounded sums";
        EXPECT_EQ(bad_max, 0) << where << ": max";
        EXPECT_EQ(bad_min, 0) << where << ": min";
        std::string bits(static_cast<const char*>(inexact.raw_data()), inexact.nbytes());
        std::vector<std::string> all = world().allgather(bits);
        for (int r = 1; r < w; ++r)
          EXPECT_TRUE(all[r] == all[0]) << where << ": rank " << r << " differs from rank 0";
      }
    }
}

TEST(HierarchicalAllreduce, LargeBucketWithDefaultSegmentsIsPredictedBitForBit) {
  const int w = world().size();
  // 4 MiB + 3 floats: one full default segment and a short one.
  const std::int64_t n = static_cast<std::int64_t>(comm::kHierarchicalSegmentBytes / 4) + 3;
  std::vector<int> ids(w);
  for (int r = 0; r < w; ++r)
    ids[r] = r / 2;  // pairs of ranks: at most 2 nodes at 4 ranks
  NodeLayout layout = simulated(ids);
  auto hier = comm::make_hierarchical_communicator(world(), layout);
  check_float_sum<float>(*hier, layout, n, 21, layout.describe());
}

TEST(HierarchicalAllreduce, RepeatedCallsGiveIdenticalBits) {
  std::vector<int> ids(world().size(), 0);
  ids.back() = 1;
  NodeLayout layout = simulated(ids);
  auto hier = comm::make_hierarchical_communicator(world(), layout);
  EXPECT_TRUE(bitwise_equal(run<float>(*hier, ReduceOp::Sum, 3001, 5),
                            run<float>(*hier, ReduceOp::Sum, 3001, 5)));
}

TEST(HierarchicalAllreduce, AsyncCallsCompleteInOrderWithTheOtherCollectives) {
  const int w = world().size();
  std::vector<int> ids(w);
  for (int r = 0; r < w; ++r)
    ids[r] = r % 2;
  NodeLayout layout = simulated(ids);
  auto hier = comm::make_hierarchical_communicator(world(), layout);
  std::vector<Tensor> buckets;
  std::vector<comm::WorkPtr> works;
  for (int k = 0; k < 6; ++k) {
    // Rank r contributes (r + 1) * (k + 1): small integers, so every order sums exactly.
    buckets.push_back(Tensor::from_vector(
        std::vector<float>(static_cast<std::size_t>(100 + k), (world().rank() + 1.0f) * (k + 1)),
        {100 + k}));
    works.push_back(hier->allreduce_async(buckets.back()));
  }
  Tensor b = Tensor::from_vector(std::vector<float>(3, static_cast<float>(world().rank())), {3});
  works.push_back(hier->broadcast_async(b, w - 1));
  for (auto& work : works)
    work->wait();
  for (int k = 0; k < 6; ++k) {
    const float expected = w * (w + 1) / 2.0f * (k + 1);
    for (float v : buckets[k].to_vector<float>())
      ASSERT_EQ(v, expected) << "bucket " << k;
  }
  for (float v : b.to_vector<float>())
    EXPECT_EQ(v, static_cast<float>(w - 1));
}

TEST(HierarchicalAllreduce, DdpOverSimulatedNodesMatchesSingleProcessLargeBatch) {
  // As Ddp.MatchesSingleProcessLargeBatch (test_ddp.cpp, whose tolerance argument applies: only
  // the order of the per-rank partial sums changes), over 2 simulated nodes.
  const int w = world().size(), rank = world().rank();
  std::vector<int> ids(w);
  for (int r = 0; r < w; ++r)
    ids[r] = r * 2 / w;
  NodeLayout layout = simulated(ids);
  auto hier = comm::make_hierarchical_communicator(world(), layout);
  ProblemSpec p;
  p.global_batch = 4 * w;  // whole local batches at any world size (3 ranks on 2+1 hosts)
  auto reference = train_single_process(p);
  ops::Context ctx(Device::cpu(), 1);
  nn::Model model = nn::Model::build(p.model, p.sample, p.classes, p.seed + rank);
  parallel::DdpEngine engine(ctx, model, *hier, {});
  optim::SgdOptions so;
  so.lr = p.lr;
  so.momentum = p.momentum;
  optim::Sgd sgd(engine.flat_params(), so);
  const std::int64_t local = p.global_batch / w;
  for (int step = 0; step < p.steps; ++step) {
    SyntheticBatch b = synthetic_batch(p.global_batch, p.sample, p.classes, step);
    engine.begin_step();
    engine.forward_backward(b.x.slice(rank * local, (rank + 1) * local),
                            b.y.slice(rank * local, (rank + 1) * local),
                            1.0f / static_cast<float>(local), true);
    engine.finish_gradients();
    sgd.step(ctx);
  }
  EXPECT_LE(max_abs_difference(reference, parameter_values(model)), 2e-5) << layout.describe();
}

TEST(HierarchicalAllreduce, RefusesALayoutOfAnotherWorldSize) {
  std::vector<int> ids(world().size() + 1, 0);
  try {
    comm::make_hierarchical_communicator(world(), NodeLayout(ids));
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the node layout has"), std::string::npos) << e.what();
  }
}

TEST(HierarchicalAllreduce, DetectedLayoutMatchesTheSessionsNodes) {
  NodeLayout layout = NodeLayout::detect(world());
  const int rank = world().rank();
  EXPECT_EQ(layout.nodes(), session().nodes());
  EXPECT_EQ(layout.local_rank(rank), session().local_rank());
  EXPECT_EQ(static_cast<int>(layout.members(layout.node_of(rank)).size()), session().local_size());
  EXPECT_EQ(layout.host(layout.node_of(rank)), comm::this_host());
  // Each node's members see local ranks 0..k-1 (the namespace cluster runs this across hosts).
  for (int node = 0; node < layout.nodes(); ++node) {
    const auto& m = layout.members(node);
    for (std::size_t i = 0; i < m.size(); ++i)
      EXPECT_EQ(layout.local_rank(m[i]), static_cast<int>(i));
  }
  auto hier = comm::make_hierarchical_communicator(world(), layout);
  check_float_sum<float>(*hier, layout, 70001, 31, "detected " + layout.describe());
  check_exact<std::int32_t>(*hier, ReduceOp::Sum, 70001, 32, "detected " + layout.describe());
}

TEST(HierarchicalAllreduce, RefusesANodeSpanningHostsThatShareNoMemory) {
  NodeLayout real = NodeLayout::detect(world());
  if (real.nodes() < 2) GTEST_SKIP() << "needs ranks on 2 hosts (the namespace cluster)";
  std::vector<int> one(world().size(), 0);  // pretends every rank shares one node
  try {
    comm::make_hierarchical_communicator(world(), NodeLayout(one));
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("do not share memory"), std::string::npos) << e.what();
  }
}

TEST(HierarchicalAllreduce, AutoIsFlatAsMeasuredAndExplicitChoicesAreKept) {
  using comm::resolve_allreduce_algorithm;
  for (const NodeLayout& layout :
       {NodeLayout({0, 0, 1, 1}), NodeLayout({0, 1, 2}), NodeLayout({0})}) {
    EXPECT_EQ(resolve_allreduce_algorithm(AllreduceAlgorithm::Auto, layout),
              AllreduceAlgorithm::Flat);
    EXPECT_EQ(resolve_allreduce_algorithm(AllreduceAlgorithm::Hierarchical, layout),
              AllreduceAlgorithm::Hierarchical);
    EXPECT_EQ(resolve_allreduce_algorithm(AllreduceAlgorithm::Flat, layout),
              AllreduceAlgorithm::Flat);
  }
}

TEST(HostChecks, AValueThatDiffersBetweenHostsNamesTheHostsAndRanks) {
  const int w = world().size();
  std::vector<int> ids(w);
  std::vector<std::string> hosts(w);
  for (int r = 0; r < w; ++r) {
    ids[r] = r * 2 / w;
    hosts[r] = ids[r] == 0 ? "gpuhost" : "cpuhost";
  }
  NodeLayout layout(ids, hosts);
  const std::string mine = layout.node_of(world().rank()) == 0 ? "cuda" : "cpu";
  try {
    comm::check_same_on_all_hosts(world(), layout, "the device kind", mine, "use one kind");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("the device kind differs between hosts"), std::string::npos) << m;
    EXPECT_NE(m.find("gpuhost (" + comm::describe_ranks(layout.members(0)) + ") has cuda"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("cpuhost (" + comm::describe_ranks(layout.members(1)) + ") has cpu"),
              std::string::npos)
        << m;
  }
  EXPECT_NO_THROW(comm::check_same_on_all_hosts(world(), layout, "x", "same", "-"));
}

}  // namespace lockstep::test
