// The fused flat-buffer ops on their own: plan validation, ranges (a ZeRO-1 shard update with a
// shard-sized state is the same call), thread-count independence, and per-slot sums of squares.
// The optimizer-level equivalence with the per-parameter ops is in tests/optim/test_flat.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "lockstep/core/error.hpp"
#include "lockstep/ops/ops.hpp"
#include "ops_test_util.hpp"

using namespace lockstep;
using lockstep::testing::bitwise_equal;
using lockstep::testing::random_tensor;

namespace {

// Three segments with padding between them (offsets in floats; 64 floats = 256 bytes), the
// middle one long enough for several reduction chunks and several threads.
std::vector<ops::FlatSegment> segments() {
  return {{0, 100, 2, true}, {128, 150001, 0, false}, {150144, 7, 1, true}};
}
constexpr std::int64_t kNumel = 150208;

ops::AdamWParams adamw_params() {
  ops::AdamWParams a;
  a.lr = 1e-2f;
  a.weight_decay = 0.1f;
  a.step = 4;
  return a;
}

ops::SgdParams sgd_params() {
  ops::SgdParams s;
  s.lr = 0.1f;
  s.momentum = 0.9f;
  s.weight_decay = 1e-3f;
  s.nesterov = true;
  return s;
}

}  // namespace

TEST(FlatPlan, RejectsMisalignedOverlappingOrOutOfRangeSegments) {
  ops::Context ctx;
  EXPECT_NO_THROW(ops::make_flat_plan(ctx, segments(), kNumel));
  EXPECT_THROW(ops::make_flat_plan(ctx, {{0, 10, 0}, {32, 10, 1}}, 64), Error) << "misaligned";
  EXPECT_THROW(ops::make_flat_plan(ctx, {{0, 100, 0}, {64, 10, 1}}, 128), Error) << "overlap";
  EXPECT_THROW(ops::make_flat_plan(ctx, {{0, 100, 0}}, 99), Error) << "beyond numel";
  EXPECT_THROW(ops::make_flat_plan(ctx, {{0, 10, 0}, {64, 10, 0}}, 128), Error) << "slot twice";
  EXPECT_THROW(ops::make_flat_plan(ctx, {{0, 0, 0}}, 64), Error) << "empty segment";
  // Segments may come in any order; the plan sorts them by offset.
  auto plan = ops::make_flat_plan(ctx, {{64, 10, 0}, {0, 10, 1}}, 128);
  EXPECT_EQ(plan->segments()[0].offset, 0);
  EXPECT_EQ(plan->slots(), 2);
}

TEST(FlatUpdate, BadRangesAndBuffersAreErrorsNamingTheOp) {
  ops::Context ctx;
  auto plan = ops::make_flat_plan(ctx, segments(), kNumel);
  Tensor w = random_tensor({kNumel}, 1), g = random_tensor({kNumel}, 2);
  Tensor m = Tensor::zeros({kNumel}), v = Tensor::zeros({kNumel});
  auto a = adamw_params();
  auto expect_error = [](auto&& call, const char* what) {
    try {
      call();
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("flat_adamw_update"), std::string::npos) << e.what();
    }
  };
  expect_error(
      [&] {
        ops::flat_adamw_update(ctx, *plan, {0, kNumel + 1}, w, g, m, v, 0, a);
      },
      "a range past the end");
  expect_error(
      [&] {
        ops::flat_adamw_update(ctx, *plan, {10, 5}, w, g, m, v, 0, a);
      },
      "a reversed range");
  Tensor short_w = random_tensor({kNumel - 1}, 3);
  expect_error(
      [&] {
        ops::flat_adamw_update(ctx, *plan, {0, 10}, short_w, g, m, v, 0, a);
      },
      "a parameter buffer of the wrong size");
  Tensor shard = Tensor::zeros({1000});
  expect_error(
      [&] {
        ops::flat_adamw_update(ctx, *plan, {500, 2000}, w, g, shard, shard, 500, a);
      },
      "state that does not cover the range");
}

TEST(FlatUpdate, ShardsWithShardSizedStateEqualOneWholeUpdate) {
  // ZeRO-1: each rank updates [begin, end) of the layout and holds the state of that range only.
  // Cut points fall inside segments and padding, on no particular alignment.
  ops::Context ctx(Device::cpu(), 2);
  auto plan = ops::make_flat_plan(ctx, segments(), kNumel);
  Tensor g = random_tensor({kNumel}, 2);
  const std::int64_t cuts[] = {0, 77, 131, 60001, 150150, kNumel};
  {
    Tensor w_all = random_tensor({kNumel}, 1), w_shards = w_all.clone();
    Tensor m_all = random_tensor({kNumel}, 4, -0.1f, 0.1f),
           v_all = random_tensor({kNumel}, 5, 0, 1);
    Tensor m_start = m_all.clone(), v_start = v_all.clone();
    ops::flat_adamw_update(ctx, *plan, {0, kNumel}, w_all, g, m_all, v_all, 0, adamw_params());
    for (std::size_t s = 0; s + 1 < std::size(cuts); ++s) {
      const std::int64_t b = cuts[s], e = cuts[s + 1];
      Tensor m = m_start.slice(b, e).clone(), v = v_start.slice(b, e).clone();
      ops::flat_adamw_update(ctx, *plan, {b, e}, w_shards, g, m, v, b, adamw_params());
      EXPECT_TRUE(bitwise_equal(m, m_all.slice(b, e))) << "shard " << s;
      EXPECT_TRUE(bitwise_equal(v, v_all.slice(b, e))) << "shard " << s;
    }
    EXPECT_TRUE(bitwise_equal(w_shards, w_all));
  }
  {
    Tensor w_all = random_tensor({kNumel}, 1), w_shards = w_all.clone();
    Tensor buf_all = random_tensor({kNumel}, 6), buf_start = buf_all.clone();
    ops::flat_sgd_update(ctx, *plan, {0, kNumel}, w_all, g, buf_all, 0, sgd_params());
    for (std::size_t s = 0; s + 1 < std::size(cuts); ++s) {
      const std::int64_t b = cuts[s], e = cuts[s + 1];
      Tensor buf = buf_start.slice(b, e).clone();
      ops::flat_sgd_update(ctx, *plan, {b, e}, w_shards, g, buf, b, sgd_params());
      EXPECT_TRUE(bitwise_equal(buf, buf_all.slice(b, e))) << "shard " << s;
    }
    EXPECT_TRUE(bitwise_equal(w_shards, w_all));
  }
}

TEST(FlatUpdate, TouchesSegmentsOnlyAndAppliesDecayPerSegment) {
  // Elements outside the segments are never written (NaN there stays the same NaN), and the
  // segment with decay = false gets the update of weight_decay 0.
  ops::Context ctx;
  auto plan = ops::make_flat_plan(ctx, segments(), kNumel);
  Tensor w = random_tensor({kNumel}, 1), g = random_tensor({kNumel}, 2);
  auto wv = w.to_vector<float>();
  for (std::int64_t i = 100; i < 128; ++i)
    wv[static_cast<std::size_t>(i)] = std::nanf("");
  w.copy_from(wv);
  Tensor m = Tensor::zeros({kNumel}), v = Tensor::zeros({kNumel});
  Tensor segment_w = w.slice(128, 128 + 150001).clone();
  Tensor segment_g = g.slice(128, 128 + 150001).clone();
  Tensor segment_m = Tensor::zeros({150001}), segment_v = Tensor::zeros({150001});
  auto a = adamw_params();
  ops::flat_adamw_update(ctx, *plan, {0, kNumel}, w, g, m, v, 0, a);
  a.weight_decay = 0.0f;
  ops::adamw_update(ctx, segment_w, segment_g, segment_m, segment_v, a);
  EXPECT_TRUE(bitwise_equal(w.slice(128, 128 + 150001), segment_w));
  auto after = w.to_vector<float>();
  for (std::int64_t i = 100; i < 128; ++i)
    ASSERT_TRUE(std::isnan(after[static_cast<std::size_t>(i)])) << i;
  auto mv = m.to_vector<float>();
  for (std::int64_t i = 100; i < 128; ++i)
    ASSERT_EQ(mv[static_cast<std::size_t>(i)], 0.0f) << "state padding written at " << i;
}

TEST(FlatUpdate, ResultsDoNotDependOnTheThreadCount) {
  Tensor g = random_tensor({kNumel}, 2);
  std::vector<Tensor> results, sums;
  for (int threads : {1, 2, 3, 4}) {
    ops::Context ctx(Device::cpu(), threads);
    auto plan = ops::make_flat_plan(ctx, segments(), kNumel);
    Tensor w = random_tensor({kNumel}, 1), buf = random_tensor({kNumel}, 6);
    Tensor m = random_tensor({kNumel}, 4), v = random_tensor({kNumel}, 5, 0.0f, 1.0f);
    ops::flat_sgd_update(ctx, *plan, {0, kNumel}, w, g, buf, 0, sgd_params());
    ops::flat_adamw_update(ctx, *plan, {0, kNumel}, w, g, m, v, 0, adamw_params());
    Tensor s = Tensor::empty({plan->slots() + 1}, DType::F64);
    ops::flat_sum_squares(ctx, *plan, {0, kNumel}, w, s);
    results.push_back(w);
    sums.push_back(s);
  }
  for (std::size_t i = 1; i < results.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(results[i], results[0])) << i + 1 << " threads";
    EXPECT_EQ(sums[i].to_vector<double>(), sums[0].to_vector<double>()) << i + 1 << " threads";
  }
}

TEST(FlatSumSquares, ReportsEachSlotAndTheTotalOverTheRange) {
  ops::Context ctx(Device::cpu(), 2);
  auto plan = ops::make_flat_plan(ctx, segments(), kNumel);
  Tensor x = random_tensor({kNumel}, 8);
  Tensor sums = Tensor::empty({4}, DType::F64);
  ops::flat_sum_squares(ctx, *plan, {0, kNumel}, x, sums);
  auto s = sums.to_vector<double>();
  // Slots are the segments' own (2, 0, 1 in buffer order); each equals sum_squares of its tensor.
  EXPECT_EQ(s[2], ops::sum_squares(ctx, x.slice(0, 100)));
  EXPECT_EQ(s[0], ops::sum_squares(ctx, x.slice(128, 128 + 150001)));
  EXPECT_EQ(s[1], ops::sum_squares(ctx, x.slice(150144, 150151)));
  EXPECT_EQ(s[3], (s[0] + s[1]) + s[2]) << "the total adds slots in slot order";
  // A range: only its elements count; slots without any report 0.
  ops::flat_sum_squares(ctx, *plan, {50, 1000}, x, sums);
  s = sums.to_vector<double>();
  double want = 0.0;
  auto xv = x.to_vector<float>();
  for (std::int64_t i = 50; i < 100; ++i)
    want += static_cast<double>(xv[static_cast<std::size_t>(i)]) * xv[static_cast<std::size_t>(i)];
  EXPECT_NEAR(s[2], want, 1e-12 * want);
  EXPECT_GT(s[0], 0.0);
  EXPECT_EQ(s[1], 0.0);
  // Finiteness only: 0 everywhere, NaN in the slot (and total) of a non-finite element.
  ops::flat_sum_squares(ctx, *plan, {0, kNumel}, x, sums, ops::FlatSums::FinitenessOnly);
  EXPECT_EQ(sums.to_vector<double>(), std::vector<double>(4, 0.0));
  xv[150150] = -INFINITY;
  x.copy_from(xv);
  ops::flat_sum_squares(ctx, *plan, {0, kNumel}, x, sums, ops::FlatSums::FinitenessOnly);
  s = sums.to_vector<double>();
  EXPECT_EQ(s[0], 0.0);
  EXPECT_TRUE(std::isnan(s[1]));
  EXPECT_TRUE(std::isnan(s[3]));
}

// ---- the step verdict (ops/step_verdict.hpp): a step's gradient check kept on the device. The
// reference for each guarded update is the unguarded update with the step count it should use.
namespace {

Tensor verdict_of(double sum_squares, double skipped) {
  return Tensor::from_vector<double>({sum_squares, skipped}, {2});
}

}  // namespace

TEST(StepVerdict, AFiniteVerdictUpdatesWithTheStepCountLessTheSkippedUpdates) {
  ops::Context ctx;
  auto plan = ops::make_flat_plan(ctx, segments(), kNumel);
  const Tensor w0 = random_tensor({kNumel}, 1), g = random_tensor({kNumel}, 2);
  const Tensor m0 = random_tensor({kNumel}, 3, 0.0f, 0.1f),
               v0 = random_tensor({kNumel}, 4, 0.0f, 0.1f);
  const ops::FlatRange all{0, kNumel};
  // SGD: step 3 with 2 skipped is the first update (buf = g), not a momentum step.
  {
    Tensor w = w0.clone(), buf = m0.clone(), w_ref = w0.clone(), buf_ref = m0.clone();
    ops::SgdParams p = sgd_params();
    p.first_step = true;
    ops::flat_sgd_update(ctx, *plan, all, w_ref, g, buf_ref, 0, p);
    p.first_step = false;
    p.step = 3;
    p.verdict = verdict_of(12.5, 2);
    ops::flat_sgd_update(ctx, *plan, all, w, g, buf, 0, p);
    EXPECT_TRUE(bitwise_equal(w, w_ref));
    EXPECT_TRUE(bitwise_equal(buf, buf_ref));
  }
  // AdamW: step 7 with 3 skipped bias-corrects as step 4.
  {
    Tensor w = w0.clone(), m = m0.clone(), v = v0.clone();
    Tensor w_ref = w0.clone(), m_ref = m0.clone(), v_ref = v0.clone();
    ops::AdamWParams p = adamw_params();  // step 4
    ops::flat_adamw_update(ctx, *plan, all, w_ref, g, m_ref, v_ref, 0, p);
    p.step = 7;
    p.verdict = verdict_of(0.5, 3);
    ops::flat_adamw_update(ctx, *plan, all, w, g, m, v, 0, p);
    EXPECT_TRUE(bitwise_equal(w, w_ref));
    EXPECT_TRUE(bitwise_equal(m, m_ref));
    EXPECT_TRUE(bitwise_equal(v, v_ref));
    // And a wrong count would show: step 7 as such gives other parameters.
    Tensor w7 = w0.clone(), m7 = m0.clone(), v7 = v0.clone();
    p.verdict = verdict_of(0.5, 0);
    ops::flat_adamw_update(ctx, *plan, all, w7, g, m7, v7, 0, p);
    EXPECT_FALSE(bitwise_equal(w7, w_ref));
  }
}

TEST(StepVerdict, ANonFiniteVerdictLeavesParametersAndStateUntouched) {
  ops::Context ctx;
  auto plan = ops::make_flat_plan(ctx, segments(), kNumel);
  const Tensor w0 = random_tensor({kNumel}, 5), g = random_tensor({kNumel}, 6);
  const ops::FlatRange all{0, kNumel};
  const double inf = std::numeric_limits<double>::infinity();
  for (double bad : {std::nan(""), inf, -inf}) {
    Tensor w = w0.clone(), buf = w0.clone(), m = w0.clone(), v = w0.clone();
    ops::SgdParams sp = sgd_params();
    sp.verdict = verdict_of(bad, 0);
    ops::flat_sgd_update(ctx, *plan, all, w, g, buf, 0, sp);
    ops::AdamWParams ap = adamw_params();
    ap.verdict = verdict_of(bad, 1);
    ops::flat_adamw_update(ctx, *plan, all, w, g, m, v, 0, ap);
    EXPECT_TRUE(bitwise_equal(w, w0)) << bad;
    EXPECT_TRUE(bitwise_equal(buf, w0)) << bad;
    EXPECT_TRUE(bitwise_equal(m, w0)) << bad;
    EXPECT_TRUE(bitwise_equal(v, w0)) << bad;
  }
}

TEST(StepVerdict, AddAndCloseKeepTheSumAndCountTheSkippedSteps) {
  ops::Context ctx;
  Tensor v = verdict_of(99.0, 4);
  ops::verdict_add(ctx, Tensor::from_vector<double>({1.5}, {1}), v, /*first=*/true);
  ops::verdict_add(ctx, Tensor::from_vector<double>({2.25}, {1}), v, /*first=*/false);
  EXPECT_EQ(v.to_vector<double>(), (std::vector<double>{3.75, 4.0}));
  ops::verdict_close(ctx, v, /*taken=*/3);  // finite: the host took 3 of the 4
  EXPECT_EQ(v.to_vector<double>(), (std::vector<double>{3.75, 1.0}));
  ops::verdict_add(ctx, Tensor::from_vector<double>({std::numeric_limits<double>::infinity()}, {1}),
                   v, /*first=*/false);
  ops::verdict_close(ctx, v, 0);  // not finite: one more skipped
  EXPECT_EQ(v.to_vector<double>()[1], 2.0);
  EXPECT_THROW(ops::verdict_close(ctx, v, -1), Error);
  Tensor wrong = Tensor::from_vector<double>({0.0, 0.0, 0.0}, {3});
  EXPECT_THROW(ops::verdict_close(ctx, wrong, 0), Error) << "a verdict is f64 [2]";
  ops::SgdParams sp = sgd_params();
  sp.verdict = verdict_of(1.0, 0);
  Tensor w = random_tensor({8}, 7), g = random_tensor({8}, 8), buf = random_tensor({8}, 9);
  EXPECT_THROW(ops::sgd_update(ctx, w, g, buf, sp), Error) << "only the fused update reads it";
}

// Clipping from the verdict's sum of squares against the host's clipping from the norm read back
// (optim::clip_grad_norm's formula, max_norm / (norm + 1e-6)): the same bits.
TEST(StepVerdict, ClippingByTheVerdictScalesAsTheHostFormulaDoes) {
  ops::Context ctx;
  const Tensor g0 = random_tensor({1000}, 10);
  const double ss = ops::sum_squares(ctx, g0), norm = std::sqrt(ss);
  for (double max_norm : {0.1 * norm, 0.5 * norm, 2.0 * norm}) {
    Tensor g = g0.clone(), ref = g0.clone();
    ops::clip_by_verdict(ctx, g, verdict_of(ss, 0), max_norm);
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) ops::scale(ctx, ref, static_cast<float>(coef));
    EXPECT_TRUE(bitwise_equal(g, ref)) << max_norm;
    if (coef >= 1.0) {
      EXPECT_TRUE(bitwise_equal(g, g0)) << "a norm under max_norm is not clipped";
    }
  }
  Tensor g = g0.clone();
  ops::clip_by_verdict(ctx, g, verdict_of(std::nan(""), 0), 1.0);
  EXPECT_TRUE(bitwise_equal(g, g0)) << "a non-finite step is left alone";
}
