// Fuzz target `model_spec`: nn::Model::build on a layer spec or preset, then one forward and
// backward pass of a batch of two when the model is small, so a spec that builds but cannot run
// is found too.
//   byte 0: the sample shape (table below); byte 1: num_classes = 1 + byte % 10; the rest: spec.
// Properties of an accepted spec: logits are [2, num_classes] and the loss is finite.
// std::bad_alloc is accepted here: a spec may ask for more memory than there is, and saying
// that well is the allocator's job, not the parser's (fuzz_options.cpp caps one allocation).
#include <cmath>
#include <new>

#include "fuzz_support.hpp"
#include "lockstep/nn/loss.hpp"
#include "lockstep/nn/model.hpp"
#include "lockstep/ops/ops.hpp"

using namespace lockstep;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  static const Shape kShapes[] = {{1, 8, 8}, {3, 6, 6}, {12},       {2, 5, 7},
                                  {1, 1, 1}, {4},       {1, 28, 28}};
  const Shape& sample = kShapes[data[0] % (sizeof kShapes / sizeof kShapes[0])];
  const std::int64_t classes = 1 + data[1] % 10;
  const std::string spec(reinterpret_cast<const char*>(data) + 2, size - 2);
  static ops::Context ctx;

  try {
    fuzz::accepts([&] {
      nn::Model m = nn::Model::build(spec, sample, classes, /*seed=*/7);
      LOCKSTEP_FUZZ_ASSERT(!m.structure().empty(), "empty structure");
      // Bounds keep one input within milliseconds; bigger models only exercise more arithmetic.
      if (m.num_parameters() > 200'000 || m.forward_flops() > 2e6) return;
      Shape batch{2};
      batch.insert(batch.end(), sample.begin(), sample.end());
      Tensor x = Tensor::empty(batch, DType::F32);
      float* p = x.data<float>();
      for (std::int64_t i = 0; i < x.numel(); ++i)
        p[i] = static_cast<float>((i * 37) % 17) / 8.0f - 1.0f;
      Tensor y = Tensor::from_vector(
          std::vector<std::int32_t>{0, static_cast<std::int32_t>(classes - 1)}, {2});
      m.set_training(true);
      m.zero_grad(ctx);
      Tensor logits = m.forward(ctx, x);
      LOCKSTEP_FUZZ_ASSERT(logits.shape() == (Shape{2, classes}), logits.describe());
      nn::SoftmaxCrossEntropy loss;
      const float value = loss.forward(ctx, logits, y).to_vector<float>()[0];
      LOCKSTEP_FUZZ_ASSERT(std::isfinite(value), "loss ", value, " for ", m.layer_spec());
      m.backward(ctx, loss.backward(ctx, 0.5f));
    });
  } catch (const std::bad_alloc&) {
  }
  return 0;
}
