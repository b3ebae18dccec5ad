// Models composed in C++ (issue 32): a Sequential of built-in layers is the same model its spec
// builds; a module written outside lockstep (examples/custom_model's GatedLinearUnit) has correct
// gradients; Model::clone makes independent deep copies (GPT's tied head included); and the
// mistakes one makes composing by hand are errors that name the modules involved.
#include <gtest/gtest.h>

#include "custom_model/custom_network.hpp"
#include "custom_model/gated_linear_unit.hpp"
#include "gradcheck.hpp"
#include "lockstep/nn/layers.hpp"
#include "lockstep/nn/model.hpp"

using namespace lockstep;
using namespace lockstep::nn;
using lockstep::testing::random_tensor;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Two Linear children under one name: the mistake a hand-written collect_parameters can make.
class Twin final : public Module {
 public:
  Twin() : a_(4, 4), b_(4, 4) {}
  std::string type() const override { return "twin"; }
  Shape output_shape(const Shape& input) const override { return a_.output_shape(input); }
  Tensor forward(ops::Context& ctx, const Tensor& x) override { return a_.forward(ctx, x); }
  Tensor backward(ops::Context& ctx, const Tensor& dy) override { return a_.backward(ctx, dy); }
  void collect_parameters(const std::string& prefix, std::vector<Parameter*>& out) override {
    a_.collect_parameters(prefix + "proj.", out);
    b_.collect_parameters(prefix + "proj.", out);
  }

 private:
  Linear a_, b_;
};

// A module that ignores the prefix it is given: two of them in a model clash.
class Unprefixed final : public Module {
 public:
  Unprefixed() : a_(4, 4) {}
  std::string type() const override { return "unprefixed"; }
  Shape output_shape(const Shape& input) const override { return a_.output_shape(input); }
  Tensor forward(ops::Context& ctx, const Tensor& x) override { return a_.forward(ctx, x); }
  Tensor backward(ops::Context& ctx, const Tensor& dy) override { return a_.backward(ctx, dy); }
  void collect_parameters(const std::string&, std::vector<Parameter*>& out) override {
    a_.collect_parameters("", out);
  }

 private:
  Linear a_;
};

// A module without clone_structure: fine for DDP, not for DataParallel.
class Scale final : public Module {
 public:
  std::string type() const override { return "scale"; }
  Shape output_shape(const Shape& input) const override { return input; }
  Tensor forward(ops::Context&, const Tensor& x) override { return x; }
  Tensor backward(ops::Context&, const Tensor& dy) override { return dy; }
};

Sequential mlp_by_hand() {
  Sequential net;
  net.emplace<Flatten>();
  net.emplace<Linear>(64, 32);
  net.emplace<ReLU>();
  net.emplace<Linear>(32, 10);
  return net;
}

}  // namespace

TEST(ComposedModel, SequentialOfBuiltInLayersIsTheModelItsSpecBuilds) {
  Model spec = Model::build("mlp:32", {1, 8, 8}, 10, /*seed=*/5);
  Model by_hand(mlp_by_hand(), {1, 8, 8}, 10, /*seed=*/5);
  ASSERT_EQ(by_hand.parameters().size(), spec.parameters().size());
  for (std::size_t i = 0; i < spec.parameters().size(); ++i) {
    EXPECT_EQ(by_hand.parameters()[i]->name, spec.parameters()[i]->name);
    EXPECT_EQ(by_hand.parameters()[i]->value.to_vector<float>(),
              spec.parameters()[i]->value.to_vector<float>());
  }
  EXPECT_EQ(by_hand.spec(), "");
  ops::Context ctx;
  Tensor x = random_tensor({3, 1, 8, 8}, 2);
  EXPECT_EQ(by_hand.forward(ctx, x).to_vector<float>(), spec.forward(ctx, x).to_vector<float>());
}

TEST(ComposedModel, GatedLinearUnitGradientsMatchFiniteDifferences) {
  ops::Context ctx;
  custom_model::GatedLinearUnit glu(6, 5);
  glu.reset_parameters(3, "0.");
  lockstep::testing::check_gradients(ctx, glu, random_tensor({4, 6}, 9));
}

TEST(ComposedModel, ExampleNetworkGradientsMatchFiniteDifferencesAfterItsFeatures) {
  // The GLU inside the model, with the classifier after it; the conv front end (ReLU and
  // max-pool kinks) is covered by the layer tests.
  ops::Context ctx;
  Sequential head;
  head.emplace<custom_model::GatedLinearUnit>(8, 6);
  head.emplace<Linear>(6, 4);
  head.reset_parameters(4, "");
  lockstep::testing::check_gradients(ctx, head, random_tensor({3, 8}, 10));
}

TEST(ComposedModel, ModuleOfOnesOwnNamesItsParametersUnderItsIndex) {
  Model m(custom_model::custom_network(8, 4, 6, 4), {1, 8, 8}, 4, /*seed=*/1);
  std::vector<std::string> names;
  for (const Parameter* p : m.parameters())
    names.push_back(p->name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"0.weight", "0.bias", "4.value.weight", "4.value.bias",
                                      "4.gate.weight", "4.gate.bias", "5.weight", "5.bias"}));
  EXPECT_EQ(m.layer(4).describe(), "glu(64->6)");
}

TEST(ModelClone, CopiesValuesIntoStorageOfItsOwn) {
  Model original(custom_model::custom_network(8, 4, 6, 4), {1, 8, 8}, 4, /*seed=*/1);
  Model copy = original.clone(Device::cpu());
  ASSERT_EQ(copy.structure(), original.structure());
  ops::Context ctx;
  Tensor x = random_tensor({2, 1, 8, 8}, 5);
  const std::vector<float> before = original.forward(ctx, x).to_vector<float>();
  EXPECT_EQ(copy.forward(ctx, x).to_vector<float>(), before);
  for (std::size_t i = 0; i < copy.parameters().size(); ++i) {
    EXPECT_FALSE(copy.parameters()[i]->value.shares_storage(original.parameters()[i]->value));
    ops::fill(ctx, copy.parameters()[i]->value, 0.5f);
  }
  EXPECT_EQ(original.forward(ctx, x).to_vector<float>(), before);
}

TEST(ModelClone, ContinuesTheOriginalsDropoutMasks) {
  // DataParallel clones the master after a resume has restored its dropout position: the
  // replicas continue that stream (main's replicas restarted theirs at seed 0, call 0, so a
  // resumed DataParallel run with dropout was not the uninterrupted one).
  Model original = Model::build("flatten-linear(16)-relu-dropout(0.5)", {1, 4, 4}, 4, /*seed=*/3);
  original.set_dropout_seed(77);
  original.set_dropout_calls(5);
  Model copy = original.clone(Device::cpu());
  EXPECT_EQ(copy.dropout_calls(), 5u);
  ops::Context ctx;
  Tensor x = random_tensor({8, 1, 4, 4}, 6);
  EXPECT_EQ(copy.forward(ctx, x).to_vector<float>(), original.forward(ctx, x).to_vector<float>());
}

TEST(ModelClone, GptCloneTiesItsHeadToItsOwnEmbedding) {
  Model original = Model::build("gpt(layers=1,heads=2,dim=16,ctx=8)", {8}, 32, /*seed=*/2);
  Model copy = original.clone(Device::cpu());
  ASSERT_EQ(copy.parameters().size(), original.parameters().size());
  ops::Context ctx;
  std::vector<std::int32_t> tokens(16);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<std::int32_t>((i * 5) % 32);
  Tensor x = Tensor::from_vector(tokens, {2, 8});
  const std::vector<float> before = original.forward(ctx, x).to_vector<float>();
  ASSERT_EQ(copy.forward(ctx, x).to_vector<float>(), before);
  // Zeroing the copy's token table zeroes the copy's logits (the head reads that table) and
  // leaves the original's as they were.
  ops::fill(ctx, copy.parameters()[0]->value, 0.0f);
  for (float v : copy.forward(ctx, x).to_vector<float>())
    ASSERT_EQ(v, 0.0f);
  EXPECT_EQ(original.forward(ctx, x).to_vector<float>(), before);
}

TEST(ComposedModelErrors, TwoParametersOfOneNameNameTheirModules) {
  Sequential net;
  net.emplace<Linear>(4, 4);
  net.emplace<Twin>();
  const std::string message = error_of([&] { Model(std::move(net), {4}, 4, 1); });
  EXPECT_NE(message.find("two parameters or buffers are named '1.proj.weight'"), std::string::npos)
      << message;
  EXPECT_NE(message.find("both of module 1 'twin'"), std::string::npos) << message;
}

TEST(ComposedModelErrors, ParametersOfOneNameInTwoModulesNameBoth) {
  Sequential net;
  net.emplace<Unprefixed>();
  net.emplace<Unprefixed>();
  const std::string message = error_of([&] { Model(std::move(net), {4}, 4, 1); });
  EXPECT_NE(message.find("named 'weight': one of module 0 'unprefixed', one of module 1 "
                         "'unprefixed'"),
            std::string::npos)
      << message;
}

TEST(ComposedModelErrors, ShapeMismatchNamesBothModules) {
  Sequential net;
  net.emplace<Flatten>();
  net.emplace<Linear>(64, 32);
  net.emplace<Linear>(16, 10);
  const std::string message = error_of([&] { Model(std::move(net), {1, 8, 8}, 10, 1); });
  EXPECT_NE(message.find("module 2 'linear(16->10)' does not accept the output of module 1 "
                         "'linear(64->32)', [N, 32]"),
            std::string::npos)
      << message;
}

TEST(ComposedModelErrors, OutputThatIsNotTheClassesNamesTheLastModule) {
  Sequential net;
  net.emplace<Linear>(4, 3);
  const std::string message = error_of([&] { Model(std::move(net), {4}, 5, 1); });
  EXPECT_NE(message.find("the last module, module 0 'linear(4->3)', outputs [N, 3]"),
            std::string::npos)
      << message;
}

TEST(ComposedModelErrors, CloningAModuleWithoutCloneStructureNamesIt) {
  Sequential net;
  net.emplace<Linear>(4, 4);
  net.emplace<Scale>();
  Model m(std::move(net), {4}, 4, 1);
  const std::string message = error_of([&] { m.clone(Device::cpu()); });
  EXPECT_NE(message.find("cannot clone module 1 'scale'"), std::string::npos) << message;
  EXPECT_NE(message.find("clone_structure"), std::string::npos) << message;
}
