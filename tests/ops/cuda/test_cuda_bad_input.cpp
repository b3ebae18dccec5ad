// A label or token id outside its range on a GPU: the kernels record the first one on the device
// and the backend raises it at the next read-back, with the CPU backend's words. The read-back
// that matters is the trainer's gradient check (a small device-to-host ops::copy): before, it
// returned the NaN gradient the bad label had caused, and the run stopped with "non-finite
// gradient, lower the learning rate". The reference is the CPU backend's error for the same input.
#include <string>

#include "lockstep/core/error.hpp"
#include "support/cuda_test_support.hpp"

namespace lockstep::testing {
namespace {

// The error `f` throws, or "" when it throws nothing.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message() + " | hint: " + e.hint();
  }
  return "";
}

// The CPU message with the device after the op's name, as the CUDA backend words it.
std::string on_gpu(std::string cpu_message, const std::string& op) {
  cpu_message.insert(cpu_message.find(op) + op.size(), " on cuda:0");
  return cpu_message;
}

using BadInput = CudaVsCpu;

TEST_F(BadInput, ABadLabelIsReportedAtTheNextReadBackWithTheCpuBackendsMessage) {
  const std::int64_t rows = 4, classes = 5;
  Tensor logits = random_tensor({rows, classes}, 1);
  Tensor labels = Tensor::from_vector<std::int32_t>({0, 7, 1, 2}, {rows});
  auto run = [&](ops::Context& ctx, const Tensor& x, const Tensor& y) {
    Tensor probs = Tensor::empty({rows, classes}, DType::F32, ctx.device());
    Tensor loss = Tensor::empty({1}, DType::F32, ctx.device());
    ops::softmax_xent_forward(ctx, x, y, probs, loss);
    ops::softmax_xent_backward(ctx, probs, y, 1.0f / rows, probs);
    // The trainer's gradient check reads one value back like this.
    Tensor back = Tensor::empty({rows, classes});
    ops::copy(ctx, probs, back);
  };
  const std::string want = error_of([&] { run(cpu(), logits, labels); });
  ASSERT_NE(want.find("label 7 in row 1 is outside [0, 5)"), std::string::npos) << want;
  const std::string got = error_of([&] { run(gpu(), dev(logits), dev(labels)); });
  EXPECT_EQ(got, on_gpu(want, "softmax_xent_forward"));
  // Reported once: the words are reset, so the context stays usable.
  EXPECT_EQ(error_of([&] { gpu().synchronize(); }), "");
}

TEST_F(BadInput, ABadTokenIsReportedAtTheNextReadBackWithTheCpuBackendsMessage) {
  const std::int64_t b = 2, t = 3, vocab = 10, c = 4;
  Tensor tokens = Tensor::from_vector<std::int32_t>({1, 2, 3, 4, 10, 5}, {b, t});
  Tensor wte = random_tensor({vocab, c}, 2), wpe = random_tensor({t, c}, 3);
  auto run = [&](ops::Context& ctx, const Tensor& tok, const Tensor& te, const Tensor& pe) {
    Tensor y = Tensor::empty({b, t, c}, DType::F32, ctx.device());
    ops::embedding_forward(ctx, tok, te, pe, y);
    Tensor back = Tensor::empty({b, t, c});
    ops::copy(ctx, y, back);
  };
  const std::string want = error_of([&] { run(cpu(), tokens, wte, wpe); });
  ASSERT_NE(want.find("token id 10 at [1, 1] is outside [0, 10)"), std::string::npos) << want;
  const std::string got = error_of([&] { run(gpu(), dev(tokens), dev(wte), dev(wpe)); });
  EXPECT_EQ(got, on_gpu(want, "embedding_forward"));
}

}  // namespace
}  // namespace lockstep::testing
