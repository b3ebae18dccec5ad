// Spec-built models pinned bit for bit: for each spec, the FNV-1a hash of its structure() text
// (checkpoints store it and resume compares it), its parameter and buffer names, shapes and
// initial bytes, and of the losses and parameters after three SGD steps on fixed
// data. The expected values were printed by this test built against main at 2c43517, before the
// spec language moved out of the model container (issue 32). They must never change: a change
// means the same spec builds different parameters, and checkpoints written before it no longer
// resume the same run.
#include <gtest/gtest.h>

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
  std::uint64_t init_hash, trained_hash;
};

std::uint64_t mix_bytes(std::uint64_t h, const void* data, std::size_t n) {
  return hash_combine(h, hash_string(std::string(static_cast<const char*>(data), n)));
}

std::uint64_t state_hash(Model& m) {
  // structure() is stored in checkpoints and compared on resume: it is pinned too.
  std::uint64_t h = hash_string(m.structure());
  for (const Parameter* p : m.parameters()) {
    h = hash_combine(h, hash_string(p->name + " " + shape_str(p->value.shape())));
    const std::vector<float> v = p->value.to_vector<float>();
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

// Three SGD steps (lr 0.1) on one fixed batch; the hash covers each step's loss bits and the final
// parameters and buffers.
std::uint64_t trained_hash(Model& m, const Pinned& c) {
  ops::Context ctx(Device::cpu(), 1);
  const std::int64_t batch = 4;
  Tensor x = pinned_input(c, batch);
  const std::int64_t rows = batch * m.outputs_per_sample();
  std::vector<std::int32_t> labels(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i)
    labels[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 7 + 3) % c.classes);
  Tensor y = Tensor::from_vector(labels, {rows});
  SoftmaxCrossEntropy loss;
  std::uint64_t h = hash_string("trained");
  for (int step = 0; step < 3; ++step) {
    m.zero_grad(ctx);
    const float value = loss.forward(ctx, m.forward(ctx, x), y).item();
    m.backward(ctx, loss.backward(ctx, 1.0f / static_cast<float>(rows)));
    for (Parameter* p : m.parameters())
      ops::axpy(ctx, -0.1f, p->grad, p->value);
    h = mix_bytes(h, &value, sizeof value);
  }
  return hash_combine(h, state_hash(m));
}

// From main at 2c43517 (see the file comment): never edit these to make the test pass.
const std::vector<Pinned> kPinned = {
    {"mlp:32,16", {1, 8, 8}, 10, 0xff4f2eca686e13f2, 0xe47248d383a8dcae},
    {"lenet", {1, 28, 28}, 10, 0xc86de418339bc73e, 0x35ea3a945b07d490},
    {"conv(4,3,pad=1)-bn-relu-maxpool(2)-dropout(0.25)-flatten-linear(16)-bn-gelu",
     {2, 8, 8},
     5,
     0x805142873915d9cd,
     0x3970e4ccd57aa777},
    {"conv(4,3)-relu-avgpool(2)-gap", {1, 8, 8}, 3, 0xe046220ea14f1c79, 0x41c8fa3ab96d9b47},
    {"resnet:1", {3, 16, 16}, 10, 0x2a7cc606e2cd2c05, 0x3f31f147b1c77d6c},
    {"gpt(layers=2,heads=2,dim=32,ctx=16)", {16}, 64, 0xaa772f4bf6ab23b6, 0x0394a23d8f29a492},
    {"gpt-tiny", {8}, 50, 0x2a7701dcb9467405, 0x54dbc64c8b347062},
};

}  // namespace

TEST(SpecPinned, SameSpecBuildsTheSameParametersAsBeforeTheSplit) {
  for (const Pinned& c : kPinned) {
    SCOPED_TRACE(c.spec);
    Model m = Model::build(c.spec, c.sample, c.classes, /*seed=*/5);
    const std::uint64_t init = state_hash(m);
    const std::uint64_t trained = trained_hash(m, c);
    if (init != c.init_hash || trained != c.trained_hash)  // the row as main printed it
      std::printf("    {\"%s\", ..., 0x%016" PRIx64 ", 0x%016" PRIx64 "},\n", c.spec, init,
                  trained);
    EXPECT_EQ(init, c.init_hash);
    EXPECT_EQ(trained, c.trained_hash);
  }
}
