// Collectives of the MPI communicator, checked against values each rank computes on its own by
// formula (naive loops in double over all ranks' inputs), for 2 and 4 ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/comm/communicator.hpp"
#include "lockstep/comm/mpi_communicator.hpp"
#include "lockstep/core/rng.hpp"
#include "support/mpi_env.hpp"
#include "support/precision_reference.hpp"

namespace lockstep::comm {
namespace {

using test::world;

// Inputs are small multiples of 1/2, so every partial sum is exact in f32 and the result does
// not depend on the order MPI adds in.
float sum_input(int rank, std::int64_t i) {
  return 0.5f * static_cast<float>((i % 13) - 6) * static_cast<float>(rank + 1);
}
float minmax_input(int rank, std::int64_t i) {
  return static_cast<float>((rank * 7 + i * 3) % 11) - 5.0f;
}

Tensor filled(std::int64_t n, int rank, float (*f)(int, std::int64_t)) {
  std::vector<float> v(n);
  for (std::int64_t i = 0; i < n; ++i)
    v[i] = f(rank, i);
  return Tensor::from_vector(v, {n});
}

std::vector<std::int64_t> test_sizes(int world_size) {
  // 0, 1, a few odd sizes that do not divide by the world size, and one of 64K+3 elements.
  return {0, 1, 3, world_size * 5 + 1, 1000, 65536 + 3};
}

// Reports the first mismatch and how many there are, without returning early: every rank must
// go on to the test's next collective, whatever it found here.
template <class T>
void expect_equal(const std::vector<T>& got, const std::vector<T>& expected,
                  const std::string& label) {
  EXPECT_EQ(got.size(), expected.size()) << label;
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < std::min(got.size(), expected.size()); ++i) {
    if (!(got[i] == expected[i]) && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << label << ": " << bad << " mismatches, first at " << first << ": got "
                     << got[first] << ", expected " << expected[first];
}

// Elementwise sum / max / min over all ranks of f(rank, i), computed here, in double for sums.
std::vector<float> expected_sum(std::int64_t n, int world_size, float (*f)(int, std::int64_t),
                                std::int64_t first = 0) {
  std::vector<float> out(n);
  for (std::int64_t i = 0; i < n; ++i) {
    double acc = 0;
    for (int q = 0; q < world_size; ++q)
      acc += f(q, first + i);
    out[i] = static_cast<float>(acc);
  }
  return out;
}
std::vector<float> expected_extreme(std::int64_t n, int world_size, bool max,
                                    float (*f)(int, std::int64_t), std::int64_t first = 0) {
  std::vector<float> out(n);
  for (std::int64_t i = 0; i < n; ++i) {
    float acc = f(0, first + i);
    for (int q = 1; q < world_size; ++q) {
      acc = max ? std::max(acc, f(q, first + i)) : std::min(acc, f(q, first + i));
    }
    out[i] = acc;
  }
  return out;
}
std::vector<float> values_of(std::int64_t n, int rank, float (*f)(int, std::int64_t)) {
  return filled(n, rank, f).to_vector<float>();
}

TEST(MpiCollectives, AllreduceSumOfF32MatchesFormulaForAllSizes) {
  const int W = world().size(), r = world().rank();
  for (std::int64_t n : test_sizes(W)) {
    Tensor t = filled(n, r, sum_input);
    world().allreduce(t, ReduceOp::Sum);
    expect_equal(t.to_vector<float>(), expected_sum(n, W, sum_input), str("n=", n));
  }
}

// With inexact sums the order of additions shows in the last bits: every rank must still hold the
// same bits (the trainer's NaN check and optimizer step rely on identical gradients everywhere),
// on both sides of the short-allreduce threshold (point-to-point below, MPI_Iallreduce above).
TEST(MpiCollectives, AllreduceOfInexactSumsGivesEveryRankTheSameBits) {
  const int W = world().size(), r = world().rank();
  for (std::int64_t n : {std::int64_t{7}, std::int64_t{1000}, std::int64_t{2048},
                         std::int64_t{2049}, std::int64_t{100000}}) {
    std::vector<float> v(static_cast<std::size_t>(n));
    Philox(42, static_cast<std::uint64_t>(r)).fill_uniform(v.data(), n, -1.0f, 1.0f);
    Tensor t = Tensor::from_vector(v, {n});
    world().allreduce(t, ReduceOp::Sum);
    std::vector<float> got = t.to_vector<float>();
    std::vector<std::string> all =
        world().allgather(std::string(reinterpret_cast<const char*>(got.data()), n * 4));
    for (int q = 1; q < W; ++q)
      EXPECT_TRUE(all[q] == all[0]) << "n=" << n << ": rank " << q << " differs from rank 0";
    // And the sum is right: against a float64 sum of every rank's inputs, regenerated here.
    std::vector<double> want(static_cast<std::size_t>(n), 0.0);
    for (int q = 0; q < W; ++q) {
      std::vector<float> theirs(static_cast<std::size_t>(n));
      Philox(42, static_cast<std::uint64_t>(q)).fill_uniform(theirs.data(), n, -1.0f, 1.0f);
      for (std::int64_t i = 0; i < n; ++i)
        want[i] += theirs[i];
    }
    double worst = 0;
    for (std::int64_t i = 0; i < n; ++i)
      worst = std::max(worst, std::fabs(got[i] - want[i]));
    EXPECT_LE(worst, 1e-6 * W) << "n=" << n;  // W - 1 roundings of values below W
  }
}

TEST(MpiCollectives, AllreduceMaxAndMinOfF32MatchFormula) {
  const int W = world().size(), r = world().rank();
  for (std::int64_t n : test_sizes(W)) {
    Tensor hi = filled(n, r, minmax_input), lo = filled(n, r, minmax_input);
    world().allreduce(hi, ReduceOp::Max);
    world().allreduce(lo, ReduceOp::Min);
    expect_equal(hi.to_vector<float>(), expected_extreme(n, W, true, minmax_input),
                 str("max n=", n));
    expect_equal(lo.to_vector<float>(), expected_extreme(n, W, false, minmax_input),
                 str("min n=", n));
  }
}

TEST(MpiCollectives, AllreduceSumsI32AndF64Tensors) {
  const int W = world().size(), r = world().rank();
  const std::int64_t n = 257;
  std::vector<std::int32_t> vi(n);
  std::vector<double> vd(n);
  for (std::int64_t i = 0; i < n; ++i) {
    vi[i] = static_cast<std::int32_t>(i * 1000 + r);
    vd[i] = 1.0 / (i + 1) + r;
  }
  Tensor ti = Tensor::from_vector(vi, {n}), td = Tensor::from_vector(vd, {n});
  world().allreduce(ti, ReduceOp::Sum);
  world().allreduce(td, ReduceOp::Sum);
  auto gi = ti.to_vector<std::int32_t>();
  auto gd = td.to_vector<double>();
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t expected_i = 0;
    double expected_d = 0;
    for (int q = 0; q < W; ++q) {
      expected_i += i * 1000 + q;
      expected_d += 1.0 / (i + 1) + q;
    }
    EXPECT_EQ(gi[i], expected_i) << i;
    EXPECT_NEAR(gd[i], expected_d, 1e-12 * std::abs(expected_d)) << i;
  }
}

TEST(MpiCollectives, AllreduceOnAViewChangesOnlyTheView) {
  // The Reducer allreduces gradient views into a larger bucket; bytes around the view must stay.
  const int W = world().size(), r = world().rank();
  const std::int64_t total = 100, begin = 17, n = 41;
  Tensor bucket = filled(total, r, sum_input);
  Tensor view = bucket.sub(begin, {n});
  world().allreduce(view, ReduceOp::Sum);
  std::vector<float> expected = values_of(total, r, sum_input);
  std::vector<float> reduced = expected_sum(total, W, sum_input);
  std::copy(reduced.begin() + begin, reduced.begin() + begin + n, expected.begin() + begin);
  expect_equal(bucket.to_vector<float>(), expected, "bucket");
}

TEST(MpiCollectives, AsyncAllreducesIssuedBackToBackCompleteInOrderWhileCallerComputes) {
  const int W = world().size(), r = world().rank();
  // Different sizes per operation: were two ranks to run them in different orders, MPI would
  // pair mismatched sizes and the results below (or MPI itself) would fail.
  std::vector<std::int64_t> sizes = {5, 70000, 1, 3000, 0, 12345, 64, 250000};
  std::vector<Tensor> tensors;
  std::vector<WorkPtr> works;
  for (std::int64_t n : sizes) {
    tensors.push_back(filled(n, r, sum_input));
    works.push_back(world().allreduce_async(tensors.back(), ReduceOp::Sum));
  }
  // The caller keeps computing while the communication thread works through the queue.
  double harmonic = 0;
  for (int k = 1; k <= 2000000; ++k)
    harmonic += 1.0 / k;
  EXPECT_NEAR(harmonic, std::log(2000000.0) + 0.5772156649, 1e-6);

  works.back()->wait();
  // FIFO: once the last operation is done, every earlier one is done too.
  for (std::size_t k = 0; k + 1 < works.size(); ++k)
    EXPECT_TRUE(works[k]->test()) << "op " << k;
  for (std::size_t k = 0; k < works.size(); ++k) {
    works[k]->wait();
    expect_equal(tensors[k].to_vector<float>(), expected_sum(sizes[k], W, sum_input),
                 str("op ", k));
  }
}

// DDP's overlap: a bucket's allreduce must progress on the communication thread while the caller
// computes, without the caller ever entering MPI or waiting (Open MPI progresses non-blocking
// collectives only inside MPI calls; the communication thread's polls are those calls).
TEST(MpiCollectives, AsyncAllreduceCompletesWhileTheCallerOnlyComputes) {
  const int W = world().size(), r = world().rank();
  const std::int64_t n = 1 << 20;  // 4 MiB: the ring algorithm, several rounds per rank
  Tensor t = filled(n, r, sum_input);
  WorkPtr work = world().allreduce_async(t, ReduceOp::Sum);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  double busy = 0;
  bool done = false;
  while (!done && std::chrono::steady_clock::now() < deadline) {
    for (int k = 1; k <= 100000; ++k)
      busy += 1.0 / k;  // the "backward pass"
    done = work->test();
  }
  EXPECT_TRUE(done) << "the allreduce did not finish while the caller computed (" << busy << ")";
  work->wait();
  expect_equal(t.to_vector<float>(), expected_sum(n, W, sum_input), "overlapped");
}

TEST(MpiCollectives, SyncCallsQueueBehindOutstandingAsyncOnes) {
  const int W = world().size(), r = world().rank();
  Tensor a = filled(50000, r, sum_input);
  WorkPtr pending = world().allreduce_async(a, ReduceOp::Sum);
  std::vector<double> host{static_cast<double>(r)};
  world().allreduce(host, ReduceOp::Sum);  // must not overtake `pending`
  EXPECT_TRUE(pending->test());
  EXPECT_EQ(host[0], W * (W - 1) / 2.0);
  double expected0 = 0;
  for (int q = 0; q < W; ++q)
    expected0 += sum_input(q, 0);
  EXPECT_EQ(a.to_vector<float>()[0], static_cast<float>(expected0));
}

TEST(MpiCollectives, WorkTestBecomesTrueWithoutWait) {
  Tensor t = filled(10, world().rank(), sum_input);
  WorkPtr work = world().allreduce_async(t, ReduceOp::Max);
  while (!work->test())
    std::this_thread::yield();
  EXPECT_NO_THROW(work->wait());
}

TEST(MpiCollectives, BroadcastFromEveryRootOverwritesOtherRanks) {
  const int W = world().size(), r = world().rank();
  for (int root = 0; root < W; ++root) {
    for (std::int64_t n : {std::int64_t{0}, std::int64_t{7}, std::int64_t{4099}}) {
      Tensor t = filled(n, r, minmax_input);
      world().broadcast(t, root);
      expect_equal(t.to_vector<float>(), values_of(n, root, minmax_input),
                   str("root ", root, " n=", n));
    }
  }
}

TEST(MpiCollectives, AllgatherConcatenatesEveryRanksInputInRankOrder) {
  const int W = world().size(), r = world().rank();
  for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{333}}) {
    Tensor in = filled(n, r, minmax_input);
    Tensor out = Tensor::zeros({W * n});
    world().allgather(in, out);
    std::vector<float> expected;
    for (int q = 0; q < W; ++q) {
      auto block = values_of(n, q, minmax_input);
      expected.insert(expected.end(), block.begin(), block.end());
    }
    expect_equal(out.to_vector<float>(), expected, str("n=", n));
  }
}

TEST(MpiCollectives, AllgatherInPlaceFromOwnBlockOfTheOutput) {
  const int W = world().size(), r = world().rank();
  const std::int64_t n = 21;
  Tensor out = Tensor::zeros({W * n});
  Tensor mine = out.sub(r * n, {n});
  mine.copy_from(filled(n, r, minmax_input).to_vector<float>());
  world().allgather(mine, out);
  std::vector<float> expected;
  for (int q = 0; q < W; ++q) {
    auto block = values_of(n, q, minmax_input);
    expected.insert(expected.end(), block.begin(), block.end());
  }
  expect_equal(out.to_vector<float>(), expected, "in place");
}

TEST(MpiCollectives, ReduceScatterGivesEachRankItsBlockOfTheSum) {
  const int W = world().size(), r = world().rank();
  for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{513}}) {
    Tensor in = filled(W * n, r, sum_input);
    Tensor out = Tensor::zeros({n});
    world().reduce_scatter(in, out, ReduceOp::Sum);
    expect_equal(out.to_vector<float>(), expected_sum(n, W, sum_input, r * n), str("n=", n));
  }
}

TEST(MpiCollectives, ReduceScatterMaxMatchesFormula) {
  const int W = world().size(), r = world().rank();
  const std::int64_t n = 37;
  Tensor in = filled(W * n, r, minmax_input);
  Tensor out = Tensor::zeros({n});
  world().reduce_scatter(in, out, ReduceOp::Max);
  expect_equal(out.to_vector<float>(), expected_extreme(n, W, true, minmax_input, r * n), "max");
}

// ---- bf16 (gradients sent as dist.grad_dtype = bf16). MPI has no bf16 type: the communicator
// reduces the bits with ops of its own, combining in f32 and rounding to bf16.

Tensor as_bf16(const std::vector<float>& v) {
  ops::Context ctx(Device::cpu(), 1);
  Tensor t = Tensor::empty({static_cast<std::int64_t>(v.size())}, DType::BF16);
  ops::cast(ctx, Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}), t);
  return t;
}
std::vector<float> from_bf16(const Tensor& t) {
  ops::Context ctx(Device::cpu(), 1);
  Tensor f = Tensor::empty({t.numel()}, DType::F32);
  ops::cast(ctx, t, f);
  return f.to_vector<float>();
}

// sum_input's values and their partial sums are small multiples of 1/2, exact in bf16 too, so
// any order of combination gives the formula's value: this checks the op adds values, not bits
// (adding the bit patterns as integers, or MPI_SUM on MPI_UINT16_T, gives other numbers).
TEST(MpiCollectives, AllreduceOfBf16SumsMaxesAndMinsValuesOnBothSidesOfTheShortPath) {
  const int W = world().size(), r = world().rank();
  for (std::int64_t n : test_sizes(W)) {
    Tensor t = as_bf16(values_of(n, r, sum_input));
    world().allreduce(t, ReduceOp::Sum);
    expect_equal(from_bf16(t), expected_sum(n, W, sum_input), str("sum n=", n));
    for (bool max : {true, false}) {
      Tensor m = as_bf16(values_of(n, r, minmax_input));
      world().allreduce(m, max ? ReduceOp::Max : ReduceOp::Min);
      expect_equal(from_bf16(m), expected_extreme(n, W, max, minmax_input),
                   str(max ? "max" : "min", " n=", n));
    }
  }
}

// Inexact sums: each combination rounds to bf16. With two ranks there is one combination per
// element, so the result is predicted bit for bit by the test's own rounding; with more, the
// order is MPI's, and the result must be within (W - 1) roundings of the exact sum, and the same
// bits on every rank.
TEST(MpiCollectives, AllreduceOfBf16RoundsEachCombinationAndGivesEveryRankTheSameBits) {
  const int W = world().size(), r = world().rank();
  auto input = [](int rank, std::int64_t i) {
    return testing::reference_bf16(std::sin(0.37f * static_cast<float>(i) + 1.3f * rank) *
                                   (1.0f + 0.1f * static_cast<float>(rank)));
  };
  for (std::int64_t n : {std::int64_t{1000}, std::int64_t{65536 + 3}}) {
    std::vector<float> mine(n);
    for (std::int64_t i = 0; i < n; ++i)
      mine[i] = input(r, i);
    Tensor t = as_bf16(mine);
    world().allreduce(t, ReduceOp::Sum);
    const std::vector<float> got = from_bf16(t);
    std::int64_t off = 0, first = -1, inexact = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      double exact = 0, abs_sum = 0;
      for (int q = 0; q < W; ++q) {
        exact += input(q, i);
        abs_sum += std::fabs(input(q, i));
      }
      bool ok;
      if (W == 2) {
        ok = got[i] == testing::reference_bf16(input(0, i) + input(1, i));
      } else {
        ok = std::fabs(got[i] - exact) <= (W - 1) * ops::kBf16UnitRoundoff * abs_sum;
      }
      if (got[i] != static_cast<float>(exact)) ++inexact;
      if (!ok && off++ == 0) first = i;
    }
    EXPECT_EQ(off, 0) << "n=" << n << ": " << off << " elements off, first " << first;
    EXPECT_GT(inexact, n / 4) << "the inputs were meant to need rounding";
    // Every rank holds the same bits: gather them and compare with rank 0's.
    std::string bits(static_cast<const char*>(t.raw_data()), t.nbytes());
    std::vector<std::string> all = world().allgather(bits);
    for (int q = 1; q < W; ++q)
      EXPECT_EQ(all[q] == all[0], true) << "rank " << q << " differs from rank 0, n=" << n;
  }
}

TEST(MpiCollectives, ReduceScatterOfBf16GivesEachRankItsBlockOfTheSum) {
  const int W = world().size(), r = world().rank();
  for (std::int64_t n : {std::int64_t{1}, std::int64_t{513}}) {
    Tensor in = as_bf16(values_of(W * n, r, sum_input));
    Tensor out = Tensor::empty({n}, DType::BF16);
    world().reduce_scatter(in, out, ReduceOp::Sum);
    expect_equal(from_bf16(out), expected_sum(n, W, sum_input, r * n), str("n=", n));
  }
}

TEST(MpiCollectives, InvalidArgumentsThrowOnTheCallerAndLeaveTheCommunicatorUsable) {
  const int W = world().size();
  Tensor f = Tensor::zeros({4});
  Tensor wrong_out = Tensor::zeros({4 * W + 1});
  EXPECT_THROW(world().allgather(f, wrong_out), Error);
  EXPECT_THROW(world().reduce_scatter(Tensor::zeros({4 * W + 1}), f), Error);
  EXPECT_THROW(world().broadcast(f, W), Error);
  EXPECT_THROW(world().broadcast(f, -1), Error);
  Tensor bytes = Tensor::zeros({4}, DType::U8);
  EXPECT_THROW(world().allreduce(bytes), Error);
  Tensor undefined;
  EXPECT_THROW(world().allreduce(undefined), Error);
  Tensor i32 = Tensor::zeros({4 * W}, DType::I32);
  EXPECT_THROW(world().allgather(f, i32), Error);
  try {
    world().broadcast(f, W + 3);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("root " + std::to_string(W + 3)), std::string::npos)
        << e.what();
  }
  // None of the above reached MPI, so the ranks are still in step.
  std::vector<std::int64_t> one{1};
  world().allreduce(one, ReduceOp::Sum);
  EXPECT_EQ(one[0], W);
}

TEST(MpiCollectives, CallerThreadBaselineMatchesQueuedAllreduce) {
  const int r = world().rank();
  Tensor a = filled(999, r, sum_input), b = filled(999, r, sum_input);
  world().allreduce(a);
  mpi_allreduce_on_caller(world(), b);
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
}

}  // namespace
}  // namespace lockstep::comm
