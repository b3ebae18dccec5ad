// The fused optimizer over flat parameters against the per-parameter ops it replaces (kept in
// ops/ as the reference): bit for bit on the CPU, for every SGD and AdamW variant, both weight
// decay scopes and several thread counts; the layout's alignment and padding; the one-pass
// gradient check against the per-parameter all_finite / sum_squares loop.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "lockstep/nn/loss.hpp"
#include "lockstep/nn/model.hpp"
#include "lockstep/ops/ops.hpp"
#include "lockstep/optim/adamw.hpp"
#include "lockstep/optim/clip.hpp"
#include "lockstep/optim/flat.hpp"
#include "lockstep/optim/sgd.hpp"
#include "ops/ops_test_util.hpp"
#include "support/device_test_support.hpp"

using namespace lockstep;
using namespace lockstep::optim;
using lockstep::testing::bitwise_equal;

namespace {

// Conv and linear weights (4-D, 2-D), biases and BatchNorm scales/shifts (1-D); the linear
// weight (2048 x 100) spans several reduction chunks and is large enough for 3 threads to share.
const char* kSpec = "conv(8,3,pad=1)-bn-relu-maxpool(2)-flatten-linear(100)-relu-linear(5)";
const Shape kSample{1, 32, 32};
// A few buckets (limits in bytes), so buckets and their padding are exercised too.
const BucketLimits kLimits{64 << 10, 4 << 10};
constexpr std::int64_t kAlign = ops::kFlatAlignBytes / 4;

nn::Model build_model() {
  return nn::Model::build(kSpec, kSample, 5, /*seed=*/7);
}

// Gradients of step t, the same for every model built from kSpec.
void set_gradients(const std::vector<nn::Parameter*>& params, int t) {
  for (std::size_t k = 0; k < params.size(); ++k) {
    Tensor g = lockstep::testing::random_tensor(params[k]->value.shape(), 100 * t + k);
    params[k]->grad.copy_from(g.to_vector<float>());
  }
}

bool decays(const nn::Parameter& p, DecayScope scope) {
  return scope == DecayScope::All || p.value.ndim() >= 2;
}

// Indices of the layout that belong to no parameter.
std::vector<std::int64_t> padding_of(const FlatLayout& layout) {
  std::vector<bool> used(static_cast<std::size_t>(layout.numel()), false);
  for (const ops::FlatSegment& s : layout.segments())
    for (std::int64_t i = s.offset; i < s.offset + s.numel; ++i)
      used[static_cast<std::size_t>(i)] = true;
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < used.size(); ++i)
    if (!used[i]) out.push_back(static_cast<std::int64_t>(i));
  return out;
}

std::uintptr_t address(const Tensor& t) {
  return reinterpret_cast<std::uintptr_t>(t.raw_data());
}

struct SgdCase {
  SgdOptions options;
  const char* name;
};

const SgdCase kSgdCases[] = {
    {{.lr = 0.05f, .weight_decay = 1e-3f}, "plain with weight decay"},
    {{.lr = 0.05f, .momentum = 0.9f}, "momentum"},
    {{.lr = 0.05f, .momentum = 0.9f, .dampening = 0.1f, .weight_decay = 1e-2f},
     "momentum, dampening, weight decay"},
    {{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = true}, "nesterov"},
};

}  // namespace

TEST(FlatLayout, ParametersInReverseOrderOnAlignedBoundariesAndBucketsPartitionIt) {
  // Sizes in elements; bucket limits 4000 B and, for bucket 0, 400 B.
  std::vector<nn::Parameter> params;
  for (std::int64_t n : {300, 50, 700, 20, 80, 60})
    params.push_back({"p", Tensor::zeros({n}), Tensor()});
  std::vector<nn::Parameter*> ptrs;
  for (auto& p : params)
    ptrs.push_back(&p);
  FlatLayout layout = FlatLayout::build(ptrs, {4000, 400});
  const auto& s = layout.segments();
  // Bucket 0 holds parameters 5 and 4 (60 + 80 >= 100 floats), bucket 1 the rest.
  ASSERT_EQ(layout.buckets().size(), 2u);
  EXPECT_EQ(layout.buckets()[0].params, (std::vector<std::size_t>{5, 4}));
  EXPECT_EQ(layout.buckets()[1].params, (std::vector<std::size_t>{3, 2, 1, 0}));
  // Each parameter on the next 64-float (256-byte) boundary after the previous one.
  EXPECT_EQ(s[5].offset, 0);
  EXPECT_EQ(s[4].offset, 64);
  EXPECT_EQ(s[3].offset, 192);
  EXPECT_EQ(s[2].offset, 256);
  EXPECT_EQ(s[1].offset, 960);
  EXPECT_EQ(s[0].offset, 1024);
  EXPECT_EQ(layout.numel(), 1344);
  EXPECT_EQ(layout.buckets()[0].begin, 0);
  EXPECT_EQ(layout.buckets()[0].end, 192);
  EXPECT_EQ(layout.buckets()[1].begin, 192);
  EXPECT_EQ(layout.buckets()[1].end, layout.numel());
  for (std::size_t k = 0; k < s.size(); ++k) {
    EXPECT_EQ(s[k].offset % kAlign, 0) << k;
    EXPECT_EQ(s[k].numel, params[k].value.numel());
    EXPECT_EQ(s[k].slot, static_cast<std::int32_t>(k));
  }
}

TEST(FlatParams, ValuesAndGradientsBecomeAlignedViewsKeepingTheirValues) {
  nn::Model model = build_model();
  std::vector<std::vector<float>> before;
  for (nn::Parameter* p : model.parameters())
    before.push_back(p->value.to_vector<float>());
  FlatParams flat(model.parameters(), kLimits);
  ASSERT_GT(flat.layout().buckets().size(), 1u);
  for (std::size_t k = 0; k < before.size(); ++k) {
    const nn::Parameter& p = *model.parameters()[k];
    EXPECT_EQ(p.value.to_vector<float>(), before[k]) << p.name;
    EXPECT_TRUE(p.value.shares_storage(flat.values())) << p.name;
    EXPECT_TRUE(p.grad.shares_storage(flat.grads())) << p.name;
    EXPECT_EQ(address(p.value) % ops::kFlatAlignBytes, 0u) << p.name;
    EXPECT_EQ(address(p.grad) % ops::kFlatAlignBytes, 0u) << p.name;
  }
  for (std::size_t b = 0; b < flat.layout().buckets().size(); ++b)
    EXPECT_EQ(address(flat.grad_bucket(b)) % ops::kFlatAlignBytes, 0u) << "bucket " << b;
  auto values = flat.values().to_vector<float>(), grads = flat.grads().to_vector<float>();
  for (std::int64_t i : padding_of(flat.layout())) {
    ASSERT_EQ(values[static_cast<std::size_t>(i)], 0.0f) << i;
    ASSERT_EQ(grads[static_cast<std::size_t>(i)], 0.0f) << i;
  }
}

TEST(FlatParams, LayingOutTheSameParametersTwiceIsAnError) {
  nn::Model model = build_model();
  auto flat = std::make_shared<FlatParams>(model.parameters());
  try {
    Sgd sgd(model.parameters(), {});  // would make a second layout behind the first one's back
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already lives"), std::string::npos) << e.what();
  }
  Sgd shared(flat, {});  // the way to do it
  EXPECT_EQ(shared.parameters(), model.parameters());
}

TEST(FusedSgd, EqualsThePerParameterUpdateBitForBit) {
  for (int threads : {1, 2, 3}) {
    for (const SgdCase& c : kSgdCases) {
      for (DecayScope scope : {DecayScope::All, DecayScope::Matrices}) {
        SCOPED_TRACE(str(c.name, ", ", threads, " threads, decay ", decay_scope_name(scope)));
        ops::Context ctx(Device::cpu(), threads);
        nn::Model fused = build_model(), reference = build_model();
        SgdOptions options = c.options;
        options.decay = scope;
        Sgd sgd(std::make_shared<FlatParams>(fused.parameters(), kLimits), options);
        const auto& ref = reference.parameters();
        std::vector<Tensor> buffers;
        for (nn::Parameter* p : ref)
          buffers.push_back(Tensor::zeros(p->value.shape()));
        for (int t = 0; t < 3; ++t) {
          set_gradients(fused.parameters(), t);
          set_gradients(ref, t);
          sgd.step(ctx);
          for (std::size_t k = 0; k < ref.size(); ++k) {
            ops::SgdParams sp{
                options.lr,        options.momentum,
                options.dampening, decays(*ref[k], scope) ? options.weight_decay : 0.0f,
                options.nesterov,  t == 0,
                Tensor(),          1};
            ops::sgd_update(ctx, ref[k]->value, ref[k]->grad, buffers[k], sp);
          }
        }
        auto state = sgd.state();
        ASSERT_EQ(state.size(), options.momentum != 0.0f ? ref.size() : 0u);
        for (std::size_t k = 0; k < ref.size(); ++k) {
          EXPECT_TRUE(bitwise_equal(fused.parameters()[k]->value, ref[k]->value)) << ref[k]->name;
          if (!state.empty()) {
            EXPECT_EQ(state[k].name, ref[k]->name + ".momentum_buffer");
            EXPECT_TRUE(bitwise_equal(state[k].value, buffers[k])) << state[k].name;
          }
        }
      }
    }
  }
}

TEST(FusedAdamW, EqualsThePerParameterUpdateBitForBit) {
  for (int threads : {1, 2, 3}) {
    for (DecayScope scope : {DecayScope::All, DecayScope::Matrices}) {
      SCOPED_TRACE(str(threads, " threads, decay ", decay_scope_name(scope)));
      ops::Context ctx(Device::cpu(), threads);
      nn::Model fused = build_model(), reference = build_model();
      AdamWOptions options{.lr = 1e-2f, .weight_decay = 0.1f, .decay = scope};
      AdamW adam(std::make_shared<FlatParams>(fused.parameters(), kLimits), options);
      const auto& ref = reference.parameters();
      std::vector<Tensor> m, v;
      for (nn::Parameter* p : ref) {
        m.push_back(Tensor::zeros(p->value.shape()));
        v.push_back(Tensor::zeros(p->value.shape()));
      }
      for (int t = 0; t < 3; ++t) {
        set_gradients(fused.parameters(), t);
        set_gradients(ref, t);
        adam.step(ctx);
        for (std::size_t k = 0; k < ref.size(); ++k) {
          ops::AdamWParams ap{options.lr,
                              options.beta1,
                              options.beta2,
                              options.eps,
                              decays(*ref[k], scope) ? options.weight_decay : 0.0f,
                              t + 1,
                              Tensor()};
          ops::adamw_update(ctx, ref[k]->value, ref[k]->grad, m[k], v[k], ap);
        }
      }
      auto state = adam.state();
      ASSERT_EQ(state.size(), 2 * ref.size());
      for (std::size_t k = 0; k < ref.size(); ++k) {
        EXPECT_TRUE(bitwise_equal(fused.parameters()[k]->value, ref[k]->value)) << ref[k]->name;
        EXPECT_EQ(state[2 * k].name, ref[k]->name + ".exp_avg");
        EXPECT_EQ(state[2 * k + 1].name, ref[k]->name + ".exp_avg_sq");
        EXPECT_TRUE(bitwise_equal(state[2 * k].value, m[k])) << ref[k]->name;
        EXPECT_TRUE(bitwise_equal(state[2 * k + 1].value, v[k])) << ref[k]->name;
      }
    }
  }
}

TEST(FusedAdamW, MatricesScopeLeavesOneDimensionalParametersUndecayed) {
  // With zero gradients AdamW moves nothing but the decay: matrices shrink by 1 - lr * wd,
  // biases and BatchNorm scales/shifts keep their values exactly.
  ops::Context ctx;
  nn::Model model = build_model();
  std::vector<std::vector<float>> before;
  for (nn::Parameter* p : model.parameters())
    before.push_back(p->value.to_vector<float>());
  AdamW adam(model.parameters(), {.lr = 0.1f, .weight_decay = 0.5f, .decay = DecayScope::Matrices});
  adam.step(ctx);
  int matrices = 0, vectors = 0;
  for (std::size_t k = 0; k < before.size(); ++k) {
    const nn::Parameter& p = *model.parameters()[k];
    auto after = p.value.to_vector<float>();
    if (p.value.ndim() >= 2) {
      ++matrices;
      EXPECT_EQ(after[0], before[k][0] * (1.0f - 0.1f * 0.5f)) << p.name;
    } else {
      ++vectors;
      EXPECT_EQ(after, before[k]) << p.name;
    }
  }
  EXPECT_EQ(matrices, 3);  // conv, two linear weights
  EXPECT_EQ(vectors, 5);   // conv bias, bn weight and bias, two linear biases
}

TEST(FusedUpdate, PaddingIsNeverReadAndStaysZero) {
  // Poison the gradient padding with NaN: the update, the state and the gradient check must not
  // see it, and the padding of values and state must stay exactly zero.
  ops::Context ctx(Device::cpu(), 2);
  nn::Model fused = build_model(), reference = build_model();
  auto flat = std::make_shared<FlatParams>(fused.parameters(), kLimits);
  AdamW adam(flat, {.lr = 1e-2f});
  AdamW ref_adam(reference.parameters(), {.lr = 1e-2f});
  const auto padding = padding_of(flat->layout());
  ASSERT_FALSE(padding.empty());
  for (int t = 0; t < 2; ++t) {
    set_gradients(fused.parameters(), t);
    set_gradients(reference.parameters(), t);
    auto g = flat->grads().to_vector<float>();
    for (std::int64_t i : padding)
      g[static_cast<std::size_t>(i)] = std::numeric_limits<float>::quiet_NaN();
    flat->grads().copy_from(g);
    GradientCheck check = check_gradients(ctx, *flat);
    EXPECT_TRUE(check.finite());
    EXPECT_EQ(check.sum_squares, check_gradients(ctx, *ref_adam.flat_params()).sum_squares);
    adam.step(ctx);
    ref_adam.step(ctx);
  }
  for (std::size_t k = 0; k < fused.parameters().size(); ++k)
    EXPECT_TRUE(bitwise_equal(fused.parameters()[k]->value, reference.parameters()[k]->value));
  auto values = flat->values().to_vector<float>();
  for (std::int64_t i : padding)
    ASSERT_EQ(values[static_cast<std::size_t>(i)], 0.0f) << "value padding at " << i;
}

TEST(FusedUpdate, TrainingThroughTheLayersKeepsThePaddingZero) {
  // Layers write gradients into bucket views and the optimizer updates the buffers: nothing may
  // spill into the gaps between parameters.
  ops::Context ctx(Device::cpu(), 2);
  nn::Model model = build_model();
  auto flat = std::make_shared<FlatParams>(model.parameters(), kLimits);
  Sgd sgd(flat, {.lr = 0.01f, .momentum = 0.9f, .weight_decay = 1e-4f});
  nn::SoftmaxCrossEntropy loss;
  Tensor x = lockstep::testing::random_tensor({4, 1, 32, 32}, 9);
  Tensor y = Tensor::from_vector<std::int32_t>({0, 1, 2, 3}, {4});
  for (int t = 0; t < 2; ++t) {
    flat->zero_grad(ctx);
    loss.forward(ctx, model.forward(ctx, x), y);
    model.backward(ctx, loss.backward(ctx, 0.25f));
    sgd.step(ctx);
  }
  auto grads = flat->grads().to_vector<float>(), values = flat->values().to_vector<float>();
  auto momentum = sgd.state();
  double grad_sum = 0.0;
  for (float g : grads)
    grad_sum += std::abs(g);
  EXPECT_GT(grad_sum, 0.0) << "the step produced gradients";
  for (std::int64_t i : padding_of(flat->layout())) {
    ASSERT_EQ(grads[static_cast<std::size_t>(i)], 0.0f) << i;
    ASSERT_EQ(values[static_cast<std::size_t>(i)], 0.0f) << i;
  }
}

TEST(GradientCheck, SumOfSquaresIsThePerParameterLoopsBitForBit) {
  for (int threads : {1, 2}) {
    ops::Context ctx(Device::cpu(), threads);
    nn::Model model = build_model();
    FlatParams flat(model.parameters(), kLimits);
    set_gradients(model.parameters(), 5);
    double per_parameter = 0.0;  // the loop clip_grad_norm runs over parameters
    for (nn::Parameter* p : model.parameters())
      per_parameter += ops::sum_squares(ctx, p->grad);
    GradientCheck check = check_gradients(ctx, flat);
    EXPECT_EQ(check.sum_squares, per_parameter) << threads << " threads";
    EXPECT_TRUE(check.finite());
    // Each parameter's own sum sits at its index, the total after them.
    auto sums = flat.grad_sum_squares(ctx).to_vector<double>();
    ASSERT_EQ(sums.size(), model.parameters().size() + 1);
    for (std::size_t k = 0; k < model.parameters().size(); ++k)
      EXPECT_EQ(sums[k], ops::sum_squares(ctx, model.parameters()[k]->grad));
    EXPECT_EQ(sums.back(), per_parameter);
  }
}

TEST(GradientCheck, ClippingTheFlatBufferEqualsPerParameterClipping) {
  ops::Context ctx(Device::cpu(), 2);
  nn::Model fused = build_model(), reference = build_model();
  FlatParams flat(fused.parameters(), kLimits);
  set_gradients(fused.parameters(), 1);
  set_gradients(reference.parameters(), 1);
  const double norm = check_gradients(ctx, flat).norm();
  const double max_norm = norm / 3;  // clips
  double coef = clip_grad_norm(ctx, flat, max_norm, norm);
  EXPECT_EQ(clip_grad_norm(ctx, reference.parameters(), max_norm), norm);
  EXPECT_NEAR(coef, 1.0 / 3, 1e-6);
  for (std::size_t k = 0; k < fused.parameters().size(); ++k)
    EXPECT_TRUE(bitwise_equal(fused.parameters()[k]->grad, reference.parameters()[k]->grad));
  EXPECT_EQ(clip_grad_norm(ctx, flat, 1e9, check_gradients(ctx, flat).norm()), 1.0)
      << "under the limit nothing is scaled";
}

TEST(GradientCheck, FindsANaNOrInfInAnyParameter) {
  ops::Context ctx(Device::cpu(), 2);
  nn::Model model = build_model();
  FlatParams flat(model.parameters(), kLimits);
  const float bad_values[] = {std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()};
  for (std::size_t k = 0; k < model.parameters().size(); ++k) {
    for (float bad : bad_values) {
      set_gradients(model.parameters(), 0);
      nn::Parameter& p = *model.parameters()[k];
      auto g = p.grad.to_vector<float>();
      g[g.size() / 2] = bad;
      p.grad.copy_from(g);
      EXPECT_FALSE(check_gradients(ctx, flat).finite()) << p.name << " holds " << bad;
      EXPECT_FALSE(check_gradients(ctx, flat, /*with_norm=*/false).finite()) << p.name;
      EXPECT_FALSE(ops::all_finite(ctx, p.grad)) << "the per-parameter check agrees";
    }
  }
  // The largest finite values still give a finite sum: no false alarm from overflow.
  auto g = flat.grads().to_vector<float>();
  for (float& x : g)
    x = x == 0.0f ? 0.0f : std::numeric_limits<float>::max();
  flat.grads().copy_from(g);
  EXPECT_TRUE(check_gradients(ctx, flat).finite());
  GradientCheck quick = check_gradients(ctx, flat, /*with_norm=*/false);
  EXPECT_TRUE(quick.finite());
  EXPECT_THROW(quick.norm(), Error) << "no norm was computed";
}

TEST(FusedUpdate, StepOverRangesUpdatesOnlyThoseRanges) {
  // A ZeRO-1 rank updates its shards only: a step over two ranges equals the whole step there and
  // leaves everything else untouched.
  ops::Context ctx(Device::cpu(), 2);
  nn::Model whole = build_model(), part = build_model();
  Sgd all(std::make_shared<FlatParams>(whole.parameters(), kLimits),
          {.lr = 0.1f, .momentum = 0.9f});
  auto flat = std::make_shared<FlatParams>(part.parameters(), kLimits);
  Sgd some(flat, {.lr = 0.1f, .momentum = 0.9f});
  set_gradients(whole.parameters(), 0);
  set_gradients(part.parameters(), 0);
  const auto before = flat->values().to_vector<float>();
  const std::int64_t n = flat->layout().numel();
  const ops::FlatRange ranges[] = {{n / 7 + 3, n / 3 + 1}, {n / 2 + 5, n - 11}};
  all.step(ctx);
  some.step(ctx, ranges);
  EXPECT_EQ(some.steps(), 1);
  auto want = all.flat_params()->values().to_vector<float>();
  auto got = flat->values().to_vector<float>();
  for (std::int64_t i = 0; i < n; ++i) {
    bool inside = false;
    for (const auto& r : ranges)
      inside = inside || (r.begin <= i && i < r.end);
    const auto u = static_cast<std::size_t>(i);
    ASSERT_EQ(got[u], inside ? want[u] : before[u]) << "element " << i << (inside ? " in" : " out");
  }
}

TEST(DecayScope, ParsesAllAndMatricesAndNamesTheKeyOtherwise) {
  EXPECT_EQ(parse_decay_scope("all"), DecayScope::All);
  EXPECT_EQ(parse_decay_scope("matrices"), DecayScope::Matrices);
  try {
    parse_decay_scope("biases");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("optim.decay"), std::string::npos) << e.what();
  }
}

// ZeRO-1 in one process: the shards of a layout built for W shards partition every bucket into W
// aligned blocks, and W optimizers, each holding state for one shard only, stepping the same
// gradients give the whole-layout optimizer's parameters and state bit for bit, also when a
// parameter is cut between shards or a shard holds only padding (tiny per-parameter buckets).
TEST(FlatShard, ShardsPartitionEveryBucketIntoAlignedBlocks) {
  for (int w : {2, 3, 4}) {
    nn::Model m = build_model();
    FlatParams flat(m.parameters(), {0, 0, w});  // every parameter its own bucket
    for (const FlatBucket& b : flat.layout().buckets())
      EXPECT_EQ(b.numel() % (w * kAlign), 0);
    for (std::size_t b = 0; b < flat.layout().buckets().size(); ++b) {
      std::int64_t at = flat.layout().buckets()[b].begin;
      for (int r = 0; r < w; ++r) {
        FlatShard s = flat.shard(r, w);
        EXPECT_EQ(s.ranges[b].begin, at);
        EXPECT_EQ(s.ranges[b].begin % kAlign, 0);
        at = s.ranges[b].end;
        EXPECT_EQ(s.numel * w, flat.layout().numel());
      }
      EXPECT_EQ(at, flat.layout().buckets()[b].end);
    }
    // A layout padded for 2 shards cannot be cut in 3: the error says how to build it.
    FlatParams two(build_model().parameters(), {0, 0, 2});
    if (w == 3) {
      try {
        (void)two.shard(0, 3);
        ADD_FAILURE() << "no error";
      } catch (const lockstep::Error& e) {
        EXPECT_NE(std::string(e.what()).find("BucketLimits::shards = 3"), std::string::npos)
            << e.what();
      }
    }
  }
}

TEST(FlatShard, ShardedOptimizersTogetherEqualTheWholeOneBitwise) {
  constexpr int kWorld = 4;
  for (const bool adam : {false, true}) {
    nn::Model whole_model = build_model();
    auto whole_flat =
        std::make_shared<FlatParams>(whole_model.parameters(), BucketLimits{0, 0, kWorld});
    std::vector<nn::Model> models;
    std::vector<std::shared_ptr<FlatParams>> flats;
    std::vector<std::unique_ptr<Optimizer>> sharded;
    for (int r = 0; r < kWorld; ++r)
      models.push_back(build_model());
    auto make = [&](std::shared_ptr<FlatParams> f, FlatShard s) -> std::unique_ptr<Optimizer> {
      if (adam) {
        AdamWOptions o;
        o.lr = 0.01f;
        o.weight_decay = 0.1f;
        o.decay = DecayScope::Matrices;
        return std::make_unique<AdamW>(std::move(f), o, std::move(s));
      }
      SgdOptions o;
      o.lr = 0.1f;
      o.momentum = 0.9f;
      o.nesterov = true;
      return std::make_unique<Sgd>(std::move(f), o, std::move(s));
    };
    auto whole = make(whole_flat, {});
    for (int r = 0; r < kWorld; ++r) {
      flats.push_back(std::make_shared<FlatParams>(models[static_cast<std::size_t>(r)].parameters(),
                                                   BucketLimits{0, 0, kWorld}));
      sharded.push_back(make(flats.back(), flats.back()->shard(r, kWorld)));
      EXPECT_EQ(sharded.back()->state_bytes() * kWorld, whole->state_bytes());
    }
    ops::Context ctx(Device::cpu(), 2);
    for (int t = 1; t <= 3; ++t) {
      set_gradients(whole_model.parameters(), t);
      whole->step(ctx);
      for (int r = 0; r < kWorld; ++r) {
        set_gradients(models[static_cast<std::size_t>(r)].parameters(), t);
        sharded[static_cast<std::size_t>(r)]->step(ctx);
      }
      // The allgather: shard r of every bucket comes from rank r.
      for (int r = 0; r < kWorld; ++r)
        for (const ops::FlatRange& range :
             flats[static_cast<std::size_t>(r)]->shard(r, kWorld).ranges)
          for (int to = 0; to < kWorld; ++to) {
            Tensor dst = flats[static_cast<std::size_t>(to)]->values().sub(
                range.begin, {range.end - range.begin});
            dst.copy_from(flats[static_cast<std::size_t>(r)]
                              ->values()
                              .sub(range.begin, {range.end - range.begin})
                              .to_vector<float>());
          }
    }
    for (int r = 0; r < kWorld; ++r)
      EXPECT_TRUE(bitwise_equal(flats[static_cast<std::size_t>(r)]->values(), whole_flat->values()))
          << (adam ? "adamw" : "sgd") << " rank " << r;
    // Each shard's state is the whole optimizer's state over the shard's ranges.
    for (int r = 0; r < kWorld; ++r) {
      const FlatShard& s = sharded[static_cast<std::size_t>(r)]->shard();
      auto mine = sharded[static_cast<std::size_t>(r)]->state_buffers();
      auto all = whole->state_buffers();
      ASSERT_EQ(mine.size(), all.size());
      for (std::size_t i = 0; i < all.size(); ++i)
        for (std::size_t b = 0; b < s.ranges.size(); ++b) {
          const std::int64_t len = s.ranges[b].end - s.ranges[b].begin;
          EXPECT_TRUE(bitwise_equal(mine[i].second.sub(s.offsets[b], {len}),
                                    all[i].second.sub(s.ranges[b].begin, {len})))
              << all[i].first << " bucket " << b << " rank " << r;
        }
    }
    // Whole tensors are not what a shard holds: state() refuses, naming the way out.
    try {
      (void)sharded[1]->state();
      ADD_FAILURE() << "no error";
    } catch (const lockstep::Error& e) {
      EXPECT_NE(std::string(e.what()).find("gather_optimizer_state"), std::string::npos);
    }
  }
}

// ---- zero_grad leaves a linear's gradients for its backward to overwrite (Parameter::grad_stale)

namespace {

// One forward + backward of the model on batch `b` (4 samples), adding into its gradients.
void backward_on(ops::Context& ctx, nn::Model& model, std::uint64_t b) {
  nn::SoftmaxCrossEntropy loss;
  Tensor x = lockstep::testing::random_tensor({4, 1, 32, 32}, 20 + b).to(model.device());
  Tensor y = Tensor::from_vector<std::int32_t>({0, 1, 2, static_cast<std::int32_t>(b % 5)}, {4})
                 .to(model.device());
  loss.forward(ctx, model.forward(ctx, x), y);
  model.backward(ctx, loss.backward(ctx, 0.25f));
}

// The path without stale gradients: every gradient filled with zeros, every backward adding.
void fill_every_gradient(ops::Context& ctx, nn::Model& model) {
  for (nn::Parameter* p : model.parameters()) {
    ops::fill(ctx, p->grad, 0.0f);
    p->grad_stale = false;
  }
}

std::vector<std::vector<float>> gradients(const nn::Model& model) {
  std::vector<std::vector<float>> out;
  for (const nn::Parameter* p : model.parameters())
    out.push_back(p->grad.to_vector<float>());
  return out;
}

}  // namespace

TEST(ZeroGrad, ALinearsGradientsAreMarkedNotFilledAndItsBackwardOverwritesThem) {
  ops::Context ctx(Device::cpu(), 2);
  nn::Model model = build_model(), reference = build_model();
  FlatParams flat(model.parameters(), kLimits);
  Tensor& grads = flat.grads();
  ops::fill(ctx, grads, std::numeric_limits<float>::quiet_NaN());  // last step's, say
  flat.zero_grad(ctx);
  int linear = 0, filled = 0;
  for (nn::Parameter* p : model.parameters()) {
    const std::vector<float> g = p->grad.to_vector<float>();
    if (p->overwrites_grad) {
      ++linear;
      EXPECT_TRUE(p->grad_stale) << p->name;
      EXPECT_TRUE(std::isnan(g[0])) << p->name << ": filled although its backward overwrites it";
    } else {
      ++filled;
      EXPECT_FALSE(p->grad_stale) << p->name;
      EXPECT_EQ(g, std::vector<float>(g.size(), 0.0f)) << p->name;
    }
  }
  ASSERT_GT(linear, 0);
  ASSERT_GT(filled, 0);  // the spec has convolutions and batch norms too
  backward_on(ctx, model, 1);
  fill_every_gradient(ctx, reference);
  backward_on(ctx, reference, 1);
  const auto got = gradients(model), want = gradients(reference);
  for (std::size_t k = 0; k < got.size(); ++k) {
    EXPECT_FALSE(model.parameters()[k]->grad_stale);
    EXPECT_EQ(got[k], want[k]) << model.parameters()[k]->name;  // == on floats: no NaN survives
  }
}

TEST(ZeroGrad, MicroBatchesAddToWhatTheFirstBackwardWrote) {
  ops::Context ctx(Device::cpu(), 1);
  nn::Model model = build_model(), reference = build_model();
  for (nn::Parameter* p : model.parameters())
    ops::fill(ctx, p->grad, std::numeric_limits<float>::quiet_NaN());
  model.zero_grad(ctx);  // the per-parameter zero_grad, without a flat buffer
  fill_every_gradient(ctx, reference);
  for (std::uint64_t b : {1, 2, 3}) {
    backward_on(ctx, model, b);
    backward_on(ctx, reference, b);
  }
  EXPECT_EQ(gradients(model), gradients(reference));
}

TEST(ZeroGrad, TrainingIsTheFilledPathsAndAStepWithoutBackwardReadsZeros) {
  ops::Context ctx(Device::cpu(), 2);
  nn::Model model = build_model(), reference = build_model();
  auto flat = std::make_shared<FlatParams>(model.parameters(), kLimits);
  auto ref_flat = std::make_shared<FlatParams>(reference.parameters(), kLimits);
  Sgd sgd(flat, {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-4f});
  Sgd ref_sgd(ref_flat, {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-4f});
  for (std::uint64_t t = 0; t < 3; ++t) {
    flat->zero_grad(ctx);
    backward_on(ctx, model, t);
    sgd.step(ctx);
    fill_every_gradient(ctx, reference);
    backward_on(ctx, reference, t);
    ref_sgd.step(ctx);
  }
  for (std::size_t k = 0; k < model.parameters().size(); ++k)
    EXPECT_EQ(model.parameters()[k]->value.to_vector<float>(),
              reference.parameters()[k]->value.to_vector<float>())
        << model.parameters()[k]->name;
  // zero_grad and a step with no backward between: the stale gradients count as zero.
  ops::fill(ctx, flat->grads(), std::numeric_limits<float>::quiet_NaN());
  flat->zero_grad(ctx);
  fill_every_gradient(ctx, reference);
  sgd.step(ctx);
  ref_sgd.step(ctx);
  for (std::size_t k = 0; k < model.parameters().size(); ++k)
    EXPECT_EQ(model.parameters()[k]->value.to_vector<float>(),
              reference.parameters()[k]->value.to_vector<float>())
        << model.parameters()[k]->name << " after a step without backward";
  // And the gradient check reads zeros too.
  ops::fill(ctx, flat->grads(), std::numeric_limits<float>::quiet_NaN());
  flat->zero_grad(ctx);
  EXPECT_EQ(flat->grad_sum_squares(ctx).to_vector<double>().back(), 0.0);
}

// On a device the linear's beta = 0 GEMM and the runs zero_grad fills are the device's: stale NaN
// gradients come out as the filled path's there too.
using ZeroGradOnDevice = lockstep::testing::OnDevice;
LOCKSTEP_ON_DEVICES(ZeroGradOnDevice);

TEST_P(ZeroGradOnDevice, StaleGradientsComeOutAsTheFilledPaths) {
  nn::Model model = nn::Model::build(kSpec, kSample, 5, 7, device());
  nn::Model reference = nn::Model::build(kSpec, kSample, 5, 7, device());
  FlatParams flat(model.parameters(), kLimits);
  FlatParams ref_flat(reference.parameters(), kLimits);
  ops::fill(dev(), flat.grads(), std::numeric_limits<float>::quiet_NaN());
  flat.zero_grad(dev());
  fill_every_gradient(dev(), reference);
  for (std::uint64_t b : {1, 2}) {  // the second adds to what the first wrote
    backward_on(dev(), model, b);
    backward_on(dev(), reference, b);
  }
  // Compared as values: beta = 0 may give -0 where adding to a filled zero gives +0.
  for (std::size_t k = 0; k < model.parameters().size(); ++k)
    EXPECT_EQ(model.parameters()[k]->grad.to(Device::cpu()).to_vector<float>(),
              reference.parameters()[k]->grad.to(Device::cpu()).to_vector<float>())
        << model.parameters()[k]->name << " on " << device().str();
}
