// The GPT ops and a small GPT on the GPU against the CPU backend (itself checked against float64
// references in tests/ops and tests/nn). Bounds are on scaled_error (largest difference over the
// largest reference value), as in test_cuda_ops.cpp:
//  - gathers and elementwise formulas: exact, or 1e-6 where expf/logf may differ by an ulp;
//  - row reductions over C or T terms summed in another order (LayerNorm, attention): ~sqrt(K)
//    * 6e-8, bounded by 1e-5 forward and 1e-4 for backward chains; any indexing or masking bug
//    is O(1);
//  - the whole model: 1e-4 after two blocks, forward and backward.
// Both attention paths (flash and the naive reference) are checked, at head widths the flash
// kernels cover (16, 32, 64, 128) and one they do not (24: the naive fallback), and at sequence
// lengths around the 64-row tiles.
#include <cmath>

#include "lockstep/core/error.hpp"
#include "lockstep/nn/loss.hpp"
#include "lockstep/nn/model.hpp"
#include "lockstep/nn/transformer.hpp"
#include "lockstep/ops/cuda.hpp"
#include "support/cuda_test_support.hpp"

namespace lockstep::testing {
namespace {

const Device kGpu = Device::cuda(0);

Tensor gpu_empty(const Shape& s, DType t = DType::F32) {
  return Tensor::empty(s, t, kGpu);
}

Tensor tokens(std::int64_t b, std::int64_t t, std::int64_t vocab, std::uint64_t stream) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(b * t));
  Philox rng(31, stream);
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<std::int32_t>(rng.u32(i) % static_cast<std::uint32_t>(vocab));
  return Tensor::from_vector(v, {b, t});
}

using Gpt = CudaVsCpu;

TEST_F(Gpt, EmbeddingMatchesCpuAndItsBackwardIsDeterministic) {
  // 2048 positions over 37 ids: long runs of equal tokens for the sorted scatter-add.
  const std::int64_t b = 8, t = 256, v = 37, p = 300, c = 96;
  Tensor tok = tokens(b, t, v, 1);
  Tensor wte = random_tensor({v, c}, 2), wpe = random_tensor({p, c}, 3);
  Tensor y = Tensor::empty({b, t, c}), yg = gpu_empty({b, t, c});
  ops::embedding_forward(cpu(), tok, wte, wpe, y);
  ops::embedding_forward(gpu(), dev(tok), dev(wte), dev(wpe), yg);
  EXPECT_CLOSE(yg, y, 0.0);

  Tensor dy = random_tensor({b, t, c}, 4);
  Tensor dwte = random_tensor({v, c}, 5), dwpe = random_tensor({p, c}, 6);  // accumulated into
  std::vector<float> first_te, first_pe;
  for (int run = 0; run < 2; ++run) {
    Tensor dwte_g = dev(dwte), dwpe_g = dev(dwpe);
    ops::embedding_backward(gpu(), dev(tok), dev(dy), dwte_g, dwpe_g);
    if (run == 0) {
      first_te = host(dwte_g).to_vector<float>();
      first_pe = host(dwpe_g).to_vector<float>();
    } else {
      EXPECT_EQ(host(dwte_g).to_vector<float>(), first_te) << "token gradient not repeatable";
      EXPECT_EQ(host(dwpe_g).to_vector<float>(), first_pe);
    }
  }
  ops::embedding_backward(cpu(), tok, dy, dwte, dwpe);
  EXPECT_CLOSE(Tensor::from_vector(first_te, {v, c}), dwte, 1e-6);
  EXPECT_CLOSE(Tensor::from_vector(first_pe, {p, c}), dwpe, 1e-6);
}

TEST_F(Gpt, LayerNormMatchesCpu) {
  for (std::int64_t c : {45, 768}) {
    SCOPED_TRACE(::testing::Message() << "C = " << c);
    const std::int64_t rows = 300;  // not a multiple of the 128-row reduction chunk
    Tensor x = random_tensor({rows, c}, 10, -2, 3), w = random_tensor({c}, 11);
    Tensor bias = random_tensor({c}, 12), dy = random_tensor({rows, c}, 13);
    Tensor dres = random_tensor({rows, c}, 14);
    Tensor y = Tensor::empty({rows, c}), m = Tensor::empty({rows}), r = Tensor::empty({rows});
    Tensor yg = gpu_empty({rows, c}), mg = gpu_empty({rows}), rg = gpu_empty({rows});
    ops::layernorm_forward(cpu(), x, w, bias, 1e-5f, y, m, r);
    ops::layernorm_forward(gpu(), dev(x), dev(w), dev(bias), 1e-5f, yg, mg, rg);
    EXPECT_CLOSE(yg, y, 1e-5);
    EXPECT_CLOSE(mg, m, 1e-5);
    EXPECT_CLOSE(rg, r, 1e-5);
    Tensor dw = random_tensor({c}, 15), db = random_tensor({c}, 16);
    Tensor dwg = dev(dw), dbg = dev(db);
    Tensor dx = dres.clone(), dxg = dev(dres);  // residual added in place
    ops::layernorm_backward(cpu(), x, dy, w, m, r, dx, dx, dw, db);
    ops::layernorm_backward(gpu(), dev(x), dev(dy), dev(w), mg, rg, dxg, dxg, dwg, dbg);
    EXPECT_CLOSE(dxg, dx, 1e-5);
    EXPECT_CLOSE(dwg, dw, 1e-5);
    EXPECT_CLOSE(dbg, db, 1e-5);
  }
}

TEST_F(Gpt, GeluTanhMatchesCpu) {
  const Shape s{4001};
  Tensor x = random_tensor(s, 20, -10, 10), dy = random_tensor(s, 21);
  Tensor y = Tensor::empty(s), yg = gpu_empty(s), dx = Tensor::empty(s), dxg = gpu_empty(s);
  ops::gelu_tanh_forward(cpu(), x, y);
  ops::gelu_tanh_forward(gpu(), dev(x), yg);
  EXPECT_CLOSE(yg, y, 1e-6);
  ops::gelu_tanh_backward(cpu(), x, dy, dx);
  ops::gelu_tanh_backward(gpu(), dev(x), dev(dy), dxg);
  EXPECT_CLOSE(dxg, dx, 1e-6);
}

struct AttnCase {
  std::int64_t b, t, c;
  int heads;
};

TEST_F(Gpt, AttentionFlashAndNaiveMatchCpu) {
  const AttnCase cases[] = {
      {2, 1, 32, 2},     // one token
      {2, 63, 64, 4},    // head width 16, just under a tile
      {1, 65, 64, 2},    // 32, just over
      {2, 200, 128, 2},  // 64 (GPT-2's), four tiles
      {1, 130, 256, 2},  // 128
      {2, 70, 48, 2},    // 24: not a flash width, the naive path serves both
  };
  for (const AttnCase& k : cases) {
    for (auto kernel : {ops::AttentionKernel::Reference, ops::AttentionKernel::Naive}) {
      SCOPED_TRACE(::testing::Message()
                   << "B " << k.b << " T " << k.t << " C " << k.c << " heads " << k.heads
                   << (kernel == ops::AttentionKernel::Naive ? " naive" : " flash"));
      Tensor qkv = random_tensor({k.b, k.t, 3 * k.c}, 30, -2, 2);
      Tensor dout = random_tensor({k.b, k.t, k.c}, 31);
      Tensor out = Tensor::empty({k.b, k.t, k.c}), lse = Tensor::empty({k.b, k.heads, k.t});
      Tensor outg = gpu_empty({k.b, k.t, k.c}), lseg = gpu_empty({k.b, k.heads, k.t});
      ops::attention_forward(cpu(), qkv, k.heads, out, lse);
      ops::attention_forward(gpu(), dev(qkv), k.heads, outg, lseg, kernel);
      EXPECT_CLOSE(outg, out, 1e-5);
      EXPECT_CLOSE(lseg, lse, 1e-5);
      Tensor dqkv = Tensor::empty({k.b, k.t, 3 * k.c});
      Tensor dqkvg = dev(random_tensor({k.b, k.t, 3 * k.c}, 32));  // overwritten
      ops::attention_backward(cpu(), qkv, out, dout, lse, k.heads, dqkv);
      ops::attention_backward(gpu(), dev(qkv), outg, dev(dout), lseg, k.heads, dqkvg, kernel);
      EXPECT_CLOSE(dqkvg, dqkv, 1e-4);
    }
  }
}

TEST_F(Gpt, FlashAttentionIsBitwiseRepeatable) {
  Tensor qkv = dev(random_tensor({2, 150, 3 * 128}, 40)),
         dout = dev(random_tensor({2, 150, 128}, 41));
  std::vector<float> first_out, first_grad;
  for (int run = 0; run < 2; ++run) {
    Tensor out = gpu_empty({2, 150, 128}), lse = gpu_empty({2, 2, 150});
    Tensor dqkv = gpu_empty({2, 150, 3 * 128});
    ops::attention_forward(gpu(), qkv, 2, out, lse);
    ops::attention_backward(gpu(), qkv, out, dout, lse, 2, dqkv);
    if (run == 0) {
      first_out = host(out).to_vector<float>();
      first_grad = host(dqkv).to_vector<float>();
    } else {
      EXPECT_EQ(host(out).to_vector<float>(), first_out);
      EXPECT_EQ(host(dqkv).to_vector<float>(), first_grad);
    }
  }
}

TEST_F(Gpt, CrossEntropyOverGpt2sVocabularyMatchesCpuAlsoInPlace) {
  const std::int64_t n = 64, v = 50257;
  Tensor logits = random_tensor({n, v}, 50, -6, 6);
  Tensor labels = random_labels(n, static_cast<int>(v), 51);
  Tensor probs = Tensor::empty({n, v}), loss = Tensor::empty({1}), d = Tensor::empty({n, v});
  Tensor probsg = gpu_empty({n, v}), lossg = gpu_empty({1}), dg = gpu_empty({n, v});
  ops::softmax_xent_forward(cpu(), logits, labels, probs, loss);
  ops::softmax_xent_forward(gpu(), dev(logits), dev(labels), probsg, lossg);
  EXPECT_CLOSE(lossg, loss, 1e-6);
  EXPECT_CLOSE(probsg, probs, 1e-5);
  ops::softmax_xent_backward(cpu(), probs, labels, 1.0f / n, d);
  ops::softmax_xent_backward(gpu(), probsg, dev(labels), 1.0f / n, dg);
  EXPECT_CLOSE(dg, d, 1e-5);
  // In place: probabilities over the logits, then the gradient over them; the same bits.
  Tensor inplace = dev(logits), loss2 = gpu_empty({1});
  ops::softmax_xent_forward(gpu(), inplace, dev(labels), inplace, loss2);
  EXPECT_CLOSE(loss2, lossg, 0.0);
  EXPECT_CLOSE(inplace, probsg, 0.0);
  ops::softmax_xent_backward(gpu(), inplace, dev(labels), 1.0f / n, inplace);
  EXPECT_CLOSE(inplace, dg, 0.0);
}

// The same GPT (same seed: identical initial parameters on both devices) on both backends.
void expect_model_matches(ops::Context& cpu_ctx, ops::Context& gpu_ctx, const std::string& spec,
                          std::int64_t t, std::int64_t vocab, ops::AttentionKernel kernel) {
  nn::Model mc = nn::Model::build(spec, {t}, vocab, 3, Device::cpu());
  nn::Model mg = nn::Model::build(spec, {t}, vocab, 3, kGpu);
  for (std::size_t k = 0; k < mg.num_layers(); ++k)
    if (auto* block = dynamic_cast<nn::TransformerBlock*>(&mg.layer(k)))
      block->attention().set_kernel(kernel);
  Tensor x = tokens(3, t, vocab, 60);
  Tensor y = tokens(3 * t, 1, vocab, 61).view({3 * t});
  nn::SoftmaxCrossEntropy lc, lg;
  mc.zero_grad(cpu_ctx);
  mg.zero_grad(gpu_ctx);
  Tensor logits_c = mc.forward(cpu_ctx, x);
  Tensor logits_g = mg.forward(gpu_ctx, x.to(kGpu));
  EXPECT_CLOSE(logits_g, logits_c, 1e-4);
  Tensor loss_c = lc.forward(cpu_ctx, logits_c, y);
  Tensor loss_g = lg.forward(gpu_ctx, logits_g, y.to(kGpu));
  EXPECT_CLOSE(loss_g, loss_c, 1e-5);
  const float scale = 1.0f / static_cast<float>(y.numel());
  mc.backward(cpu_ctx, lc.backward(cpu_ctx, scale));
  mg.backward(gpu_ctx, lg.backward(gpu_ctx, scale));
  for (std::size_t k = 0; k < mc.parameters().size(); ++k) {
    SCOPED_TRACE(mc.parameters()[k]->name);
    EXPECT_CLOSE(mg.parameters()[k]->grad, mc.parameters()[k]->grad, 1e-4);
  }
}

TEST_F(Gpt, SmallGptForwardAndBackwardMatchCpu) {
  expect_model_matches(cpu(), gpu(), "gpt(layers=2,heads=2,dim=64)", 70, 300,
                       ops::AttentionKernel::Reference);
  expect_model_matches(cpu(), gpu(), "gpt(layers=2,heads=2,dim=64)", 70, 300,
                       ops::AttentionKernel::Naive);
}

}  // namespace
}  // namespace lockstep::testing
