// cuDNN's fused attention (AttentionKernel::Cudnn, bf16) against lockstep's reference kernel on
// the same GPU, both fed the same bf16-rounded qkv and dout, so what differs is cuDNN's own
// arithmetic: it rounds the probabilities P (and, backward, dS) to bf16 for its tensor-core
// products and rounds its outputs to bf16; scores, statistics and accumulations are f32 in both.
// With u = 2^-8, bf16's unit roundoff (ops/precision.hpp), the bounds are:
//  - out: |dO_i| <= u |O_i| + u sum_j p_ij |v_j| <= 2u max|v| (rounding of O, and of each p_ij,
//    a convex combination of v's): a worst case, checked relative to max|v|;
//  - lse: each exp term may enter the row sum rounded (relative error <= u), so the log moves by
//    at most u: an absolute bound of u + 1e-5. Natural log against log2, a wrong scale or a mask
//    one key off moves lse by 0.1 to 1 and more;
//  - dqkv (dq, dk, dv each, relative to the largest reference entry of that part, scaled_error):
//    every entry is a sum of products with one bf16-rounded factor (P or dS, <= u) and a rounded
//    result (<= u); with random signs the error grows with the square root of the terms' squares,
//    as the entry itself does, so entries carry ~2u and the largest of millions a few u: 8u
//    leaves a margin of 2-4 while a layout, scale or masking bug moves entries by O(1).
// Each case prints its measured errors, so the first GPU run records them beside the bounds.
// The cases: GPT-2's (B 4, T 1024, 12 heads of 64) and small odd sequence lengths, head widths
// 64 and 128.
#include <chrono>
#include <cmath>
#include <cstdio>

#include "lockstep/core/error.hpp"
#include "lockstep/nn/loss.hpp"
#include "lockstep/nn/model.hpp"
#include "lockstep/nn/transformer.hpp"
#include "lockstep/ops/precision.hpp"
#include "support/cuda_test_support.hpp"

namespace lockstep::testing {
namespace {

const Device kGpu = Device::cuda(0);
constexpr double kU = ops::kBf16UnitRoundoff;

// The GPU context in bf16, where cuDNN's attention runs. A build without the cuDNN frontend
// skips, saying so; anything else that keeps cuDNN from running on a GPU is a failure.
class CudnnAttention : public CudaVsCpu {
 protected:
  void SetUp() override {
    CudaVsCpu::SetUp();
    if (IsSkipped()) return;
    gpu().set_precision(ops::Precision::BF16);
    // GPT-2's shape, which the first test runs first: its graphs are built here, and timed.
    const auto t0 = std::chrono::steady_clock::now();
    const ops::AttentionChoice c =
        ops::choose_attention(gpu(), ops::AttentionKernel::Auto, 4, 1024, 12, 64);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (c.detail.find("no cuDNN frontend") != std::string::npos) GTEST_SKIP() << c.detail;
    ASSERT_EQ(c.kernel, ops::AttentionKernel::Cudnn) << c.detail;
    std::printf("[ cuDNN    ] %s (cuDNN loaded and both graphs built in %.2f s)\n",
                c.detail.c_str(), s);
  }
};

// x rounded to bf16 (the CPU backend's rounding, which the CUDA casts share bit for bit).
Tensor bf16_rounded(ops::Context& cpu, const Tensor& x) {
  Tensor h = Tensor::empty(x.shape(), DType::BF16), back = Tensor::empty(x.shape());
  ops::cast(cpu, x, h);
  ops::cast(cpu, h, back);
  return back;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  std::vector<float> x = a.to(Device::cpu()).to_vector<float>();
  std::vector<float> y = b.to(Device::cpu()).to_vector<float>();
  double d = x.size() == y.size() ? 0.0 : INFINITY;
  for (std::size_t i = 0; i < std::min(x.size(), y.size()); ++i)
    d = std::max(d,
                 std::isnan(x[i]) || std::isnan(y[i]) ? INFINITY : std::fabs(double(x[i]) - y[i]));
  return d;
}

// The features [from, from + width) of every row of a [rows, 3c] tensor (q, k or v of qkv).
Tensor part(const Tensor& t, std::int64_t from, std::int64_t width) {
  Tensor h = t.to(Device::cpu());
  const std::int64_t cols = h.dim(-1), rows = h.numel() / cols;
  Tensor out = Tensor::empty({rows, width});
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < width; ++j)
      out.data<float>()[r * width + j] = h.data<float>()[r * cols + from + j];
  return out;
}

double max_abs(const Tensor& t) {
  double m = 0.0;
  for (float v : t.to(Device::cpu()).to_vector<float>())
    m = std::max(m, double(std::fabs(v)));
  return m;
}

struct Shape4 {
  std::int64_t b, t;
  int heads;
  std::int64_t d;
};

TEST_F(CudnnAttention, MatchesTheReferenceKernelWithinBf16Rounding) {
  const Shape4 cases[] = {{4, 1024, 12, 64}, {3, 77, 4, 64}, {2, 129, 2, 128}};
  for (const Shape4& k : cases) {
    const std::int64_t c = k.heads * k.d;
    SCOPED_TRACE(::testing::Message()
                 << "B " << k.b << " T " << k.t << " heads " << k.heads << " D " << k.d);
    Tensor qkv = bf16_rounded(cpu(), random_tensor({k.b, k.t, 3 * c}, 70, -2, 2));
    Tensor dout = bf16_rounded(cpu(), random_tensor({k.b, k.t, c}, 71));
    Tensor qkvg = dev(qkv), doutg = dev(dout);
    Tensor out[2], lse[2], dqkv[2];
    int i = 0;
    for (auto kernel : {ops::AttentionKernel::Reference, ops::AttentionKernel::Cudnn}) {
      out[i] = Tensor::empty({k.b, k.t, c}, DType::F32, kGpu);
      lse[i] = Tensor::empty({k.b, k.heads, k.t}, DType::F32, kGpu);
      dqkv[i] = dev(random_tensor({k.b, k.t, 3 * c}, 72));  // overwritten
      ops::attention_forward(gpu(), qkvg, k.heads, out[i], lse[i], kernel);
      ops::attention_backward(gpu(), qkvg, out[i], doutg, lse[i], k.heads, dqkv[i], kernel);
      ++i;
    }
    const double out_err = max_abs_diff(out[1], out[0]) / max_abs(part(qkv, 2 * c, c));
    const double lse_err = max_abs_diff(lse[1], lse[0]);
    double grad_err[3];
    for (int p = 0; p < 3; ++p)
      grad_err[p] = scaled_error(part(dqkv[1], p * c, c), part(dqkv[0], p * c, c));
    std::printf(
        "[ cuDNN    ] B %lld T %lld heads %d D %lld: out %.2e (bound %.2e), lse %.2e "
        "(%.2e), dq %.2e dk %.2e dv %.2e (%.2e)\n",
        static_cast<long long>(k.b), static_cast<long long>(k.t), k.heads,
        static_cast<long long>(k.d), out_err, 2 * kU + 1e-5, lse_err, kU + 1e-5, grad_err[0],
        grad_err[1], grad_err[2], 8 * kU);
    EXPECT_LE(out_err, 2 * kU + 1e-5) << "out, relative to max |v|";
    EXPECT_LE(lse_err, kU + 1e-5) << "lse, absolute";
    EXPECT_LE(grad_err[0], 8 * kU) << "dq";
    EXPECT_LE(grad_err[1], 8 * kU) << "dk";
    EXPECT_LE(grad_err[2], 8 * kU) << "dv";
  }
}

// lockstep's runs are bitwise repeatable, so the backward runs cuDNN's deterministic algorithm
// (no atomically accumulated dQ): two runs give the same bits.
TEST_F(CudnnAttention, ForwardAndBackwardAreBitwiseRepeatable) {
  const std::int64_t b = 2, t = 512, c = 256;
  const int heads = 4;
  Tensor qkv = dev(random_tensor({b, t, 3 * c}, 73)), dout = dev(random_tensor({b, t, c}, 74));
  std::vector<float> first[3];
  for (int run = 0; run < 2; ++run) {
    Tensor out = Tensor::empty({b, t, c}, DType::F32, kGpu);
    Tensor lse = Tensor::empty({b, heads, t}, DType::F32, kGpu);
    Tensor dqkv = Tensor::empty({b, t, 3 * c}, DType::F32, kGpu);
    ops::attention_forward(gpu(), qkv, heads, out, lse, ops::AttentionKernel::Cudnn);
    ops::attention_backward(gpu(), qkv, out, dout, lse, heads, dqkv, ops::AttentionKernel::Cudnn);
    const std::vector<float> now[3] = {host(out).to_vector<float>(), host(lse).to_vector<float>(),
                                       host(dqkv).to_vector<float>()};
    for (int i = 0; i < 3; ++i) {
      if (run == 0)
        first[i] = now[i];
      else
        EXPECT_EQ(now[i], first[i]) << "output " << i << " (out, lse, dqkv)";
    }
  }
}

// train.attention = auto: cuDNN's under bf16, the reference under fp32 (saying why); cudnn
// under fp32 is an error naming the precision.
TEST_F(CudnnAttention, AutoIsCudnnUnderBf16AndTheReferenceUnderFp32) {
  EXPECT_EQ(ops::choose_attention(gpu(), ops::AttentionKernel::Auto, 4, 1024, 12, 64).kernel,
            ops::AttentionKernel::Cudnn);
  gpu().set_precision(ops::Precision::FP32);
  const ops::AttentionChoice c =
      ops::choose_attention(gpu(), ops::AttentionKernel::Auto, 4, 1024, 12, 64);
  EXPECT_EQ(c.kernel, ops::AttentionKernel::Reference);
  EXPECT_NE(c.detail.find("train.precision = bf16"), std::string::npos) << c.detail;
  try {
    (void)ops::choose_attention(gpu(), ops::AttentionKernel::Cudnn, 4, 1024, 12, 64);
    ADD_FAILURE() << "cudnn under fp32 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("computes in bf16"), std::string::npos) << e.what();
  }
}

// The layer's plumbing (bf16 copies, lse carried from forward to backward, the strided gradients):
// a small GPT under bf16 with cuDNN's attention against the same model with the reference
// attention, from the same parameters. Only attention differs, by the bounds above; through two
// blocks and the LM head that stays well inside 2^-4 of each gradient's scale and u of the loss,
// and a plumbing bug is O(1).
TEST_F(CudnnAttention, ASmallGptUnderBf16MatchesItsReferenceAttention) {
  const std::int64_t t = 70, vocab = 300;
  Tensor x = Tensor::empty({3, t}, DType::I32), y = Tensor::empty({3 * t}, DType::I32);
  for (std::int64_t i = 0; i < 3 * t; ++i) {
    x.data<std::int32_t>()[i] = static_cast<std::int32_t>((i * 37 + 11) % vocab);
    y.data<std::int32_t>()[i] = static_cast<std::int32_t>((i * 53 + 5) % vocab);
  }
  float loss[2];
  std::vector<Tensor> grads[2];
  int i = 0;
  for (auto kernel : {ops::AttentionKernel::Reference, ops::AttentionKernel::Cudnn}) {
    nn::Model m = nn::Model::build("gpt(layers=2,heads=2,dim=128)", {t}, vocab, 3, kGpu);
    for (nn::CausalSelfAttention* a : nn::attention_layers(m))
      a->set_kernel(kernel);
    nn::SoftmaxCrossEntropy l;
    m.zero_grad(gpu());
    Tensor logits = m.forward(gpu(), x.to(kGpu));
    loss[i] = host(l.forward(gpu(), logits, y.to(kGpu))).to_vector<float>()[0];
    m.backward(gpu(), l.backward(gpu(), 1.0f / static_cast<float>(y.numel())));
    for (nn::Parameter* p : m.parameters())
      grads[i].push_back(host(p->grad));
    ++i;
  }
  EXPECT_NEAR(loss[1], loss[0], kU * std::fabs(loss[0]));
  for (std::size_t k = 0; k < grads[0].size(); ++k)
    EXPECT_LE(scaled_error(grads[1][k], grads[0][k]), 1.0 / 16) << "parameter " << k;
}

}  // namespace
}  // namespace lockstep::testing
