// Model builder: presets, the spec grammar and its errors, initialisation, parameter order and
// the grad-ready hook, FLOP counts, and an end-to-end gradient check of a small model.
#include <gtest/gtest.h>

#include <cmath>

#include "gradcheck.hpp"
#include "lockstep/core/rng.hpp"
#include "lockstep/nn/layers.hpp"
#include "lockstep/nn/model.hpp"

using namespace lockstep;
using namespace lockstep::nn;
using lockstep::testing::random_tensor;

namespace {

std::string build_error(const std::string& spec, const Shape& sample, std::int64_t classes = 10) {
  try {
    Model::build(spec, sample, classes, 1);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The two lines under the message: the quoted spec, then the caret under the culprit.
std::string caret_line(const std::string& message) {
  auto caret = message.find('^');
  if (caret == std::string::npos) return "";
  auto begin = message.rfind('\n', caret);
  auto end = message.find_first_of(" \n", caret);
  return message.substr(begin + 1, end - begin - 1);
}

}  // namespace

TEST(ModelPresets, BuildAndProduceLogitsForTheirSampleShapes) {
  ops::Context ctx;
  struct Case {
    std::string spec;
    Shape sample;
  };
  for (const Case& c : std::vector<Case>{{"mlp", {1, 28, 28}},
                                         {"mlp:64,32", {784}},
                                         {"lenet", {1, 28, 28}},
                                         {"lenet", {3, 32, 32}},
                                         {"resnet:1", {3, 32, 32}},
                                         {"resnet", {1, 28, 28}}}) {
    SCOPED_TRACE(c.spec + " on " + shape_str(c.sample));
    Model m = Model::build(c.spec, c.sample, 10, 3);
    Shape batch{2};
    batch.insert(batch.end(), c.sample.begin(), c.sample.end());
    Tensor logits = m.forward(ctx, random_tensor(batch, 4));
    EXPECT_EQ(logits.shape(), (Shape{2, 10}));
  }
}

TEST(ModelPresets, ExpandToTheDocumentedLayers) {
  EXPECT_EQ(Model::build("mlp:64,32", {784}, 10, 1).layer_spec(),
            "flatten-linear(64)-relu-linear(32)-relu-linear(10)");
  EXPECT_EQ(Model::build("mlp", {1, 28, 28}, 10, 1).layer_spec(),
            "flatten-linear(1024)-relu-linear(1024)-relu-linear(10)");
  EXPECT_EQ(Model::build("resnet:1", {3, 32, 32}, 5, 1).layer_spec(),
            "conv(16,3,pad=1,bias=0)-bn-relu-res(16)-res(32,2)-res(64,2)-gap-linear(5)");
  Model mlp = Model::build("mlp:64,32", {784}, 10, 1);
  EXPECT_EQ(mlp.num_parameters(), (784 * 64 + 64) + (64 * 32 + 32) + (32 * 10 + 10));
}

TEST(ModelSpec, AcceptsKeywordsPositionalArgumentsAndSpaces) {
  Model m = Model::build(
      " conv(8, 3, stride=2, pad=1) - bn - relu - maxpool(2, 1) - "
      "avgpool(k=2) - flatten - dropout(0.25) - gelu - linear(10)",
      {3, 16, 16}, 10, 1);
  EXPECT_EQ(m.num_layers(), 9u);
  EXPECT_EQ(m.layer(0).describe(), "conv(3->8, k=3, stride=2, pad=1)");
  EXPECT_EQ(m.layer(3).describe(), "maxpool(k=2, stride=1, pad=0)");
  EXPECT_EQ(m.layer(4).describe(), "avgpool(k=2, stride=2, pad=0)");
}

TEST(ModelSpec, UnknownLayerErrorQuotesTheSpecWithACaretUnderIt) {
  std::string e = build_error("conv(8,3)-relu-cnv(4,3)-flatten-linear(10)", {1, 8, 8});
  EXPECT_NE(e.find("unknown layer 'cnv'"), std::string::npos) << e;
  EXPECT_NE(e.find("column 16"), std::string::npos) << e;
  EXPECT_NE(e.find("\n    conv(8,3)-relu-cnv(4,3)-flatten-linear(10)\n"), std::string::npos) << e;
  EXPECT_EQ(caret_line(e), std::string(4 + 15, ' ') + "^~~") << e;
}

TEST(ModelSpec, BadArgumentsPointAtTheArgument) {
  std::string e = build_error("conv(8,x)-relu", {1, 8, 8});
  EXPECT_NE(e.find("argument 'k' of 'conv' must be an integer, got 'x'"), std::string::npos) << e;
  EXPECT_EQ(caret_line(e), std::string(4 + 7, ' ') + "^") << e;

  e = build_error("flatten-dropout(1.5)-linear(10)", {4});
  EXPECT_NE(e.find("argument 'p' of 'dropout' is 1.5"), std::string::npos) << e;

  e = build_error("conv(8,3,foo=2)", {1, 8, 8});
  EXPECT_NE(e.find("'conv' has no argument 'foo'"), std::string::npos) << e;
  EXPECT_NE(e.find("usage: conv(out, k, stride, pad, bias)"), std::string::npos) << e;

  e = build_error("conv(8)", {1, 8, 8});
  EXPECT_NE(e.find("'conv' needs argument 'k'"), std::string::npos) << e;

  e = build_error("conv(8,3-relu", {1, 8, 8});
  EXPECT_NE(e.find("missing ')'"), std::string::npos) << e;

  e = build_error("conv(8,3)--relu", {1, 8, 8});
  EXPECT_NE(e.find("expected a layer name, found '-'"), std::string::npos) << e;

  e = build_error("mlp:64,abc", {784});
  EXPECT_NE(e.find("needs positive integers after ':', got 'abc'"), std::string::npos) << e;
  EXPECT_EQ(caret_line(e), std::string(4 + 7, ' ') + "^~~") << e;

  e = build_error("lenet-relu", {1, 28, 28});
  EXPECT_NE(e.find("preset 'lenet' cannot be combined"), std::string::npos) << e;
}

TEST(ModelSpec, IntegersBeyondIntAreErrorsNotOverflows) {
  // Found by fuzzing: 1e10 as a kernel size or 5e23 as a width passed the range check (max was
  // inf) and overflowed the conversion to int / int64 (undefined behaviour); resnet:21474836471
  // expanded to a spec of 64 billion blocks (a hang).
  std::string e = build_error("conv(8,1e10)", {1, 8, 8});
  EXPECT_NE(e.find("argument 'k' of 'conv' is 1e10, outside [1, 2147483647]"), std::string::npos)
      << e;
  e = build_error("conv(5e23,3)", {1, 8, 8});
  EXPECT_NE(e.find("argument 'out' of 'conv' is 5e23, outside [1, 2147483647]"), std::string::npos)
      << e;
  e = build_error("maxpool(2,pad=3e9)", {1, 8, 8});
  EXPECT_NE(e.find("argument 'pad' of 'maxpool' is 3e9, outside [0, 2147483647]"),
            std::string::npos)
      << e;
  e = build_error("resnet:21474836471", {3, 8, 8});
  EXPECT_NE(e.find("preset 'resnet' takes integers up to 2147483647"), std::string::npos) << e;
  e = build_error("resnet:2000", {3, 8, 8});
  EXPECT_NE(e.find("resnet takes at most 1000 blocks per stage, got 2000"), std::string::npos) << e;
  e = build_error("mlp:64,99999999999999999999", {784});
  EXPECT_NE(e.find("preset 'mlp' takes integers up to 2147483647 after ':', got "
                   "'99999999999999999999'"),
            std::string::npos)
      << e;
  // Doubling such a padding overflowed int: the pool's "at most half the kernel" check passed,
  // and a conv's output size came out small, so both models built.
  e = build_error("maxpool(2,pad=2147483647)", {1, 8, 8});
  EXPECT_NE(e.find("padding may be at most half the kernel"), std::string::npos) << e;
  e = build_error("conv(1,1,pad=2147483647)", {1, 8, 8});
  EXPECT_NE(e.find("has more than 2^63 elements"), std::string::npos) << e;
  // Found by fuzzing: strtod/strtoll stopped at an embedded NUL, so "resnet:922\0...387978"
  // built a ResNet-5534 and "conv(8,3\0x)" ignored the rest of its argument.
  e = build_error(std::string("resnet:922\0\0387978", 17), {3, 8, 8});
  EXPECT_NE(e.find("needs positive integers after ':'"), std::string::npos) << e;
  e = build_error(std::string("conv(8,3\0x)", 11), {1, 8, 8});
  EXPECT_NE(e.find("argument 'k' of 'conv' must be an integer"), std::string::npos) << e;
  // The largest int is still a valid argument (it fails later, on the shapes).
  e = build_error("maxpool(2147483647)", {1, 8, 8});
  EXPECT_EQ(e.find("outside"), std::string::npos) << e;
}

TEST(ModelSpec, SampleShapeThatDoesNotFitNamesTheLayerAndShapes) {
  // lenet on 8x8: conv(6,5,pad=2) keeps 8x8, maxpool -> 4x4, and conv(16,5) no longer fits.
  std::string e = build_error("lenet", {1, 8, 8});
  EXPECT_NE(e.find("preset 'lenet'"), std::string::npos) << e;
  EXPECT_NE(e.find("layer 3 'conv(16,5)' does not fit its input [N, 6, 4, 4]"), std::string::npos)
      << e;
  EXPECT_NE(e.find("sample shape [1, 8, 8]"), std::string::npos) << e;

  e = build_error("linear(10)", {1, 28, 28});
  EXPECT_NE(e.find("layer 0 'linear(10)' does not fit its input [N, 1, 28, 28]"), std::string::npos)
      << e;
  EXPECT_NE(e.find("put `flatten`"), std::string::npos) << e;

  e = build_error("conv(4,3)-flatten-linear(10)", {784});
  EXPECT_NE(e.find("layer 0 'conv(4,3)'"), std::string::npos) << e;
}

TEST(ModelSpec, AnExplicitHeadMustMatchTheClassCount) {
  std::string e = build_error("flatten-linear(7)", {4});
  EXPECT_NE(e.find("outputs [N, 7] but the data has 10 classes"), std::string::npos) << e;
  EXPECT_EQ(caret_line(e), std::string(4 + 8, ' ') + "^" + std::string(8, '~')) << e;
}

TEST(ModelSpec, ASpecWithoutAHeadGetsOne) {
  EXPECT_EQ(Model::build("conv(4,3)-relu-gap", {1, 8, 8}, 10, 1).layer_spec(),
            "conv(4,3)-relu-gap-linear(10)");
  EXPECT_EQ(Model::build("conv(4,3)-relu", {1, 8, 8}, 3, 1).layer_spec(),
            "conv(4,3)-relu-flatten-linear(3)");
}

TEST(ModelInit, SameSeedGivesIdenticalParametersAndAnotherSeedDoesNot) {
  Model a = Model::build("lenet", {1, 28, 28}, 10, 42);
  Model b = Model::build("lenet", {1, 28, 28}, 10, 42);
  Model c = Model::build("lenet", {1, 28, 28}, 10, 43);
  ASSERT_EQ(a.structure(), b.structure());
  for (std::size_t i = 0; i < a.parameters().size(); ++i) {
    EXPECT_EQ(a.parameters()[i]->value.to_vector<float>(),
              b.parameters()[i]->value.to_vector<float>());
    EXPECT_NE(a.parameters()[i]->value.to_vector<float>(),
              c.parameters()[i]->value.to_vector<float>());
  }
}

TEST(ModelInit, IsPyTorchsDefaultDrawnFromTheParameterNamesStream) {
  Model m = Model::build("conv(4,3)-bn-relu-flatten-linear(10)", {2, 5, 5}, 10, 9);
  for (Parameter* p : m.parameters()) {
    auto v = p->value.to_vector<float>();
    if (p->name == "1.weight") {
      EXPECT_EQ(v, std::vector<float>(4, 1.0f));
      continue;
    }
    if (p->name == "1.bias") {
      EXPECT_EQ(v, std::vector<float>(4, 0.0f));
      continue;
    }
    double fan_in = p->name[0] == '0' ? 2 * 3 * 3 : 4 * 3 * 3;
    double bound = 1.0 / std::sqrt(fan_in);
    Philox rng(9, hash_string(p->name));
    for (std::size_t i = 0; i < v.size(); ++i) {
      // Float rounding of lo + (hi - lo) * u: a few ulp of the bound.
      EXPECT_NEAR(v[i], -bound + 2 * bound * rng.uniform(i), 1e-6 * bound)
          << p->name << "[" << i << "]";
    }
  }
  for (Buffer* b : m.buffers()) {
    EXPECT_EQ(b->value.to_vector<float>(),
              std::vector<float>(4, b->name == "1.running_var" ? 1.0f : 0.0f));
  }
}

TEST(ModelInit, AppendingLayersKeepsTheEarlierLayersValues) {
  Model small = Model::build("flatten-linear(16)-relu-linear(10)", {8}, 10, 5);
  Model large = Model::build("flatten-linear(16)-relu-linear(16)-relu-linear(10)", {8}, 10, 5);
  EXPECT_EQ(small.parameters()[0]->name, "1.weight");
  EXPECT_EQ(small.parameters()[0]->value.to_vector<float>(),
            large.parameters()[0]->value.to_vector<float>());
}

TEST(ModelStructure, ListsLayersParametersAndBuffers) {
  Model m = Model::build("conv(4,3)-bn-relu-gap", {1, 6, 6}, 3, 1);
  EXPECT_EQ(m.structure(),
            "spec conv(4,3)-bn-relu-gap-linear(3)\n"
            "input [N, 1, 6, 6]\n"
            "0 conv(1->4, k=3, stride=1, pad=0) -> [N, 4, 4, 4]\n"
            "  param 0.weight [4, 1, 3, 3]\n"
            "  param 0.bias [4]\n"
            "1 bn2d(4) -> [N, 4, 4, 4]\n"
            "  param 1.weight [4]\n"
            "  param 1.bias [4]\n"
            "  buffer 1.running_mean [4]\n"
            "  buffer 1.running_var [4]\n"
            "2 relu -> [N, 4, 4, 4]\n"
            "3 gap -> [N, 4]\n"
            "4 linear(4->3) -> [N, 3]\n"
            "  param 4.weight [3, 4]\n"
            "  param 4.bias [3]\n");
}

TEST(ModelFlops, CountMultiplyAddsTwice) {
  Model mlp = Model::build("mlp:1024,1024", {1, 28, 28}, 10, 1);
  EXPECT_DOUBLE_EQ(mlp.forward_flops(), 2.0 * (784 * 1024 + 1024 * 1024 + 1024 * 10));
  Model conv = Model::build("conv(8,3,pad=1)-relu-gap", {3, 10, 10}, 10, 1);
  EXPECT_DOUBLE_EQ(conv.forward_flops(), 2.0 * (3 * 9 * 8 * 100) + 2.0 * 8 * 10);
}

TEST(ModelBackward, HookSeesEveryParameterOnceInReverseOrder) {
  ops::Context ctx;
  Model m = Model::build("conv(4,3)-bn-relu-res(6,2)-gap-linear(3)", {2, 8, 8}, 3, 1);
  std::vector<std::string> seen;
  m.set_grad_ready_hook([&](Parameter& p) { seen.push_back(p.name); });
  Tensor logits = m.forward(ctx, random_tensor({2, 2, 8, 8}, 3));
  m.backward(ctx, random_tensor(logits.shape(), 4));
  std::vector<std::string> expected;
  for (auto it = m.parameters().rbegin(); it != m.parameters().rend(); ++it) {
    expected.push_back((*it)->name);
  }
  EXPECT_EQ(seen, expected);
  EXPECT_EQ(seen.front(), "5.bias");
  EXPECT_EQ(seen.back(), "0.weight");
}

TEST(ModelBackward, MatchesFiniteDifferencesThroughTheLoss) {
  // A smooth model (GELU, average pooling) so that every parameter can be checked through the
  // whole chain: conv -> bn -> gelu -> avgpool -> flatten -> linear -> softmax cross-entropy.
  ops::Context ctx;
  Model m = Model::build("conv(3,3,pad=1)-bn-gelu-avgpool(2)-flatten-linear(4)", {2, 4, 4}, 4, 11);
  Tensor x = random_tensor({3, 2, 4, 4}, 12);
  Tensor labels = Tensor::from_vector<std::int32_t>({1, 3, 0}, {3});
  SoftmaxCrossEntropy loss;
  m.zero_grad(ctx);
  loss.forward(ctx, m.forward(ctx, x), labels);
  m.backward(ctx, loss.backward(ctx, 1.0f / 3));
  const double h = 1e-2;
  for (Parameter* p : m.parameters()) {
    auto analytic = p->grad.to_vector<float>();
    float* v = p->value.data<float>();
    for (std::int64_t i = 0; i < p->value.numel(); ++i) {
      float saved = v[i];
      v[i] = static_cast<float>(saved + h);
      double plus = loss.forward(ctx, m.forward(ctx, x), labels).item();
      v[i] = static_cast<float>(saved - h);
      double minus = loss.forward(ctx, m.forward(ctx, x), labels).item();
      v[i] = saved;
      double numeric = (plus - minus) / (2 * h);
      EXPECT_NEAR(numeric, analytic[static_cast<std::size_t>(i)],
                  1e-3 + 1e-2 * std::abs(analytic[static_cast<std::size_t>(i)]))
          << p->name << "[" << i << "]";
    }
  }
}

TEST(ModelForward, RejectsInputOfTheWrongSampleShape) {
  ops::Context ctx;
  Model m = Model::build("mlp:8", {1, 4, 4}, 3, 1);
  try {
    m.forward(ctx, random_tensor({2, 16}, 1));
    FAIL() << "expected a shape error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[N, 1, 4, 4]"), std::string::npos) << e.what();
  }
}
