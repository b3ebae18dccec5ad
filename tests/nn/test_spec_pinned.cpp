// Spec-built models pinned: for each spec, the FNV-1a hash of its structure() text (checkpoints
// store it and resume compares it) and of its parameter and buffer names, shapes and initial
// bytes, which must match bit for bit, and the losses of three SGD steps on fixed data. The
// expected values come from main at 2c43517, before the spec language moved out of the model
// container (issue 32). They must never change: a change means the same spec builds different
// parameters, and checkpoints written before it no longer resume the same run.
#include <gtest/gtest.h>

#include <array>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "gradcheck.hpp"
#include "lockstep/core/rng.hpp"
#include "lockstep/nn/loss.hpp"
#include "lockstep/nn/model.hpp"
#include "lockstep/ops/ops.hpp"

using namespace lockstep;
using namespace lockstep::nn;

namespace {

struct Pinned {
  const char* spec;
  Shape sample;
  std::int64_t classes;
  std::uint64_t init_hash;
  std::array<float, 3> losses;  // of three SGD steps
};

std::uint64_t mix_bytes(std::uint64_t h, const void* data, std::size_t n) {
  return hash_combine(h, hash_string(std::string(static_cast<const char*>(data), n)));
}

std::uint64_t state_hash(Model& m) {
  // structure() is stored in checkpoints and compared on resume: it is pinned too.
  std::uint64_t h = hash_string(m.structure());
  // The parameters as checkpoints store them: a padded token table's vocabulary rows (its
  // padding, zero, is no part of the model: nn::Parameter::padded_rows).
  for (const Parameter* p : m.parameters()) {
    const Tensor value = unpadded(*p, p->value);
    h = hash_combine(h, hash_string(p->name + " " + shape_str(value.shape())));
    const std::vector<float> v = value.to_vector<float>();
    h = mix_bytes(h, v.data(), v.size() * sizeof(float));
  }
  for (const Buffer* b : m.buffers()) {
    h = hash_combine(h, hash_string(b->name + " " + shape_str(b->value.shape())));
    const std::vector<float> v = b->value.to_vector<float>();
    h = mix_bytes(h, v.data(), v.size() * sizeof(float));
  }
  return h;
}

Tensor pinned_input(const Pinned& c, std::int64_t batch) {
  Shape shape{batch};
  shape.insert(shape.end(), c.sample.begin(), c.sample.end());
  if (c.sample.size() == 1 && std::string(c.spec).rfind("gpt", 0) == 0) {
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(shape_numel(shape)));
    const Philox rng(11, 0);
    for (std::size_t i = 0; i < tokens.size(); ++i)
      tokens[i] = static_cast<std::int32_t>(rng.u32(i) % static_cast<std::uint32_t>(c.classes));
    return Tensor::from_vector(tokens, shape);
  }
  return lockstep::testing::random_tensor(shape, 11);
}

// The losses of three SGD steps (lr 0.1) on one fixed batch: the third depends on both updates,
// so the forward and backward of the model are pinned with its parameters.
std::array<float, 3> train(Model& m, const Pinned& c) {
  ops::Context ctx(Device::cpu(), 1);
  const std::int64_t batch = 4;
  Tensor x = pinned_input(c, batch);
  const std::int64_t rows = batch * m.outputs_per_sample();
  std::vector<std::int32_t> labels(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i)
    labels[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 7 + 3) % c.classes);
  Tensor y = Tensor::from_vector(labels, {rows});
  SoftmaxCrossEntropy loss;
  std::array<float, 3> losses{};
  for (float& value : losses) {
    m.zero_grad(ctx);
    value = loss.forward(ctx, m.forward(ctx, x), y).item();
    m.backward(ctx, loss.backward(ctx, 1.0f / static_cast<float>(rows)));
    for (Parameter* p : m.parameters())
      ops::axpy(ctx, -0.1f, p->grad, p->value);
  }
  return losses;
}

// From main at 2c43517 (see the file comment): never edit these to make the test pass.
// The losses are main's bit for bit in a Release build (when this table was made, the branch's
// Release build hashed the losses' bits and the trained parameters to exactly main's values);
// other build types (the sanitizer build's -O2) round a few float sums differently, hence the
// tolerance, some orders of magnitude below what a different model or gradient changes.
constexpr double kLossTolerance = 1e-5;
const std::vector<Pinned> kPinned = {
    {"mlp:32,16", {1, 8, 8}, 10, 0xff4f2eca686e13f2, {2.43206739f, 2.38747001f, 2.34763098f}},
    {"lenet", {1, 28, 28}, 10, 0xc86de418339bc73e, {2.33582902f, 2.29639006f, 2.26179528f}},
    {"conv(4,3,pad=1)-bn-relu-maxpool(2)-dropout(0.25)-flatten-linear(16)-bn-gelu",
     {2, 8, 8},
     5,
     0x805142873915d9cd,
     {1.67277074f, 1.39888048f, 1.01126504f}},
    {"conv(4,3)-relu-avgpool(2)-gap",
     {1, 8, 8},
     3,
     0xe046220ea14f1c79,
     {1.10207701f, 1.09714246f, 1.09255815f}},
    {"resnet:1", {3, 16, 16}, 10, 0x2a7cc606e2cd2c05, {2.38464594f, 1.22001886f, 0.648958027f}},
    {"gpt(layers=2,heads=2,dim=32,ctx=16)",
     {16},
     64,
     0xaa772f4bf6ab23b6,
     {4.15460443f, 4.00798845f, 4.00325251f}},
    {"gpt-tiny", {8}, 50, 0x2a7701dcb9467405, {3.92016888f, 3.15490222f, 2.57020259f}},
};

}  // namespace

TEST(SpecPinned, SameSpecBuildsTheSameParametersAsBeforeTheSplit) {
  for (const Pinned& c : kPinned) {
    SCOPED_TRACE(c.spec);
    Model m = Model::build(c.spec, c.sample, c.classes, /*seed=*/5);
    const std::uint64_t init = state_hash(m);
    const std::array<float, 3> losses = train(m, c);
    if (init != c.init_hash)  // the row as main printed it
      std::printf("    {\"%s\", ..., 0x%016" PRIx64 ", {%.9gf, %.9gf, %.9gf}},\n", c.spec, init,
                  losses[0], losses[1], losses[2]);
    EXPECT_EQ(init, c.init_hash);
    for (std::size_t step = 0; step < losses.size(); ++step)
      EXPECT_NEAR(losses[step], c.losses[step], kLossTolerance * c.losses[step]) << "step " << step;
  }
}
