// The precision policy on the GPU (ops/precision.hpp): tf32 and bf16 GEMMs (cublasGemmEx,
// cuBLASLt) and bf16 convolutions (cuDNN) against float64 references, the bf16 cast bit for bit,
// and a short bf16 training run that tracks the fp32 one. The references are computed on the
// host (tests/support/precision_reference.hpp), not by the CPU backend, so these tests do not
// need a bf16-capable CPU on the GPU machine.
//
// Bounds, derived as in precision_reference.hpp with two GPU facts:
//  - tensor cores accumulate f32 sums with truncation rather than round-to-nearest (Fasi, Higham,
//    Mikaitis, Pranesh, "Numerical behavior of NVIDIA tensor cores", PeerJ CS 2021), which
//    doubles the unit roundoff of the accumulation: 2 gamma(K + 3);
//  - cuDNN's bf16 convolutions write bf16 (PSEUDO_BFLOAT16: no f32-output configuration), so
//    their results carry one more rounding of u_b = 2^-8 relative to the value; the weight
//    gradient is rounded so before it is added to dw in f32.
//    (cuDNN offers no FFT or Winograd algorithms for bf16, so the per-element bound of a direct
//    sum applies.)
#include "ops_mlp.hpp"
#include "support/cuda_test_support.hpp"
#include "support/precision_reference.hpp"

namespace lockstep::testing {
namespace {

const Device kGpu = Device::cuda(0);

double accumulation_bound(std::int64_t terms) {
  return 2 * gamma_f32(terms + 3);
}

class Precision : public ::testing::Test {
 protected:
  void SetUp() override { LOCKSTEP_SKIP_WITHOUT_GPU(); }
  static std::unique_ptr<ops::Context> gpu(ops::Precision p) {
    auto ctx = std::make_unique<ops::Context>(kGpu);
    ctx->set_precision(p);
    return ctx;
  }
  static Tensor dev(const Tensor& t) { return t.to(kGpu); }
  static Tensor host(const Tensor& t) { return t.to(Device::cpu()); }
};

TEST_F(Precision, Bf16CastMatchesTheReferenceRoundingBitForBit) {
  auto ctx = gpu(ops::Precision::BF16);
  const std::int64_t n = 100003;
  std::vector<float> v(static_cast<std::size_t>(n));
  Philox rng(5, 1);
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t bits = rng.u32(static_cast<std::uint64_t>(i));
    if (i % 3 == 0) bits = (bits & 0xffff0000u) | 0x8000u;  // exact ties
    float x = std::bit_cast<float>(bits);
    v[static_cast<std::size_t>(i)] = std::isfinite(x) ? x : 1.0f;
  }
  Tensor src = dev(Tensor::from_vector(v, {n}));
  Tensor down = Tensor::empty({n}, DType::BF16, kGpu), up = Tensor::empty({n}, DType::F32, kGpu);
  ops::cast(*ctx, src, down);
  ops::cast(*ctx, down, up);
  std::vector<float> back = host(up).to_vector<float>();
  int bad = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float want = reference_bf16(v[static_cast<std::size_t>(i)]);
    bad += std::bit_cast<std::uint32_t>(back[static_cast<std::size_t>(i)]) !=
           std::bit_cast<std::uint32_t>(want);
  }
  EXPECT_EQ(bad, 0);
}

TEST_F(Precision, Bf16GemmAccumulatesTheRoundedInputsInFloatForAllTransposes) {
  auto ctx = gpu(ops::Precision::BF16);
  const std::int64_t shapes[][3] = {{67, 45, 129}, {256, 1024, 784}, {1, 300, 40}, {130, 97, 8}};
  for (const auto& s : shapes) {
    const std::int64_t m = s[0], n = s[1], k = s[2];
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      SCOPED_TRACE(::testing::Message()
                   << "m=" << m << " n=" << n << " k=" << k << " ta=" << ta << " tb=" << tb);
      Tensor a = random_tensor(ta ? Shape{k, m} : Shape{m, k}, 10 + t);
      Tensor b = random_tensor(tb ? Shape{n, k} : Shape{k, n}, 20 + t);
      for (float beta : {0.0f, 1.0f}) {
        Tensor c = random_tensor({m, n}, 30 + t);
        auto want = gemm_reference(ta, tb, 0.7, rounded_to_bf16(a), rounded_to_bf16(b), beta, c);
        Tensor c_gpu = dev(c);
        ops::gemm(*ctx, ta, tb, 0.7f, dev(a), dev(b), beta, c_gpu);
        EXPECT_TRUE(within_bound(host(c_gpu), want, accumulation_bound(k))) << "beta " << beta;
      }
    }
  }
}

TEST_F(Precision, Bf16GemmWritesIntoAnUnalignedGradientView) {
  // A weight gradient may be a view at any float offset inside a reducer bucket: cuBLASLt is told
  // the real alignment, so it must pick a kernel that copes.
  auto ctx = gpu(ops::Precision::BF16);
  const std::int64_t m = 64, n = 96, k = 256;
  Tensor dy = random_tensor({k, m}, 41), x = random_tensor({k, n}, 42);
  Tensor bucket = dev(random_tensor({m * n + 1}, 43));
  Tensor dw = bucket.sub(1, {m, n});
  auto want =
      gemm_reference(true, false, 1.0, rounded_to_bf16(dy), rounded_to_bf16(x), 1.0, host(dw));
  ops::gemm(*ctx, true, false, 1.0f, dev(dy), dev(x), 1.0f, dw);
  EXPECT_TRUE(within_bound(host(dw), want, accumulation_bound(k)));
}

TEST_F(Precision, Tf32GemmIsWithinTheTf32BoundOfTheExactProduct) {
  auto ctx = gpu(ops::Precision::TF32);
  const std::int64_t m = 200, n = 150, k = 512;
  Tensor a = random_tensor({m, k}, 51), b = random_tensor({n, k}, 52), c = Tensor::zeros({m, n});
  auto want = gemm_reference(false, true, 1.0, a, b, 0.0, c);
  Tensor c_gpu = dev(c);
  ops::gemm(*ctx, false, true, 1.0f, dev(a), dev(b), 0.0f, c_gpu);
  const double u = ops::kTf32UnitRoundoff;
  EXPECT_TRUE(
      within_bound(host(c_gpu), want, 2 * u + u * u + accumulation_bound(k) * (1 + u) * (1 + u)));
}

// [N, C, H, W] values moved between NCHW and NHWC memory order on the host (nhwc = true: into
// NHWC), for the channels-last convolutions below.
Tensor relayout(const Tensor& t, bool nhwc) {
  const std::int64_t n = t.dim(0), c = t.dim(1), hw = t.dim(2) * t.dim(3);
  std::vector<float> v = t.to_vector<float>(), out(v.size());
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < c; ++j)
      for (std::int64_t p = 0; p < hw; ++p) {
        const std::size_t a = static_cast<std::size_t>((i * c + j) * hw + p);
        const std::size_t b = static_cast<std::size_t>((i * hw + p) * c + j);
        if (nhwc)
          out[b] = v[a];
        else
          out[a] = v[b];
      }
  return Tensor::from_vector(out, t.shape());
}

TEST_F(Precision, Bf16ConvolutionsAreWithinTheBoundOfTheRoundedInputs) {
  auto ctx = gpu(ops::Precision::BF16);
  const ConvShape cases[] = {
      {2, 3, 7, 6, 4, 3, 3, 2, 1}, {8, 1, 28, 28, 8, 3, 3, 1, 1}, {4, 32, 14, 14, 16, 3, 3, 1, 1}};
  std::uint64_t stream = 60;
  // Both layouts: NHWC runs cuDNN's channels-last (tensor-core) path with transposed filters.
  for (int run = 0; run < 6; ++run) {
    const auto& k = cases[run % 3];
    const bool nhwc = run >= 3;
    SCOPED_TRACE(::testing::Message() << "n=" << k.n << " c=" << k.c << " h=" << k.h << " o=" << k.o
                                      << (nhwc ? " NHWC" : " NCHW"));
    const ops::Conv2dParams p{k.stride, k.stride, k.pad, k.pad,
                              nhwc ? ops::ImageLayout::NHWC : ops::ImageLayout::NCHW};
    auto in = [&](const Tensor& t) { return nhwc ? relayout(t, true) : t; };
    auto out = [&](const Tensor& t) { return nhwc ? relayout(host(t), false) : host(t); };
    Tensor x = random_tensor({k.n, k.c, k.h, k.w}, ++stream);
    Tensor w = random_tensor({k.o, k.c, k.kh, k.kw}, ++stream);
    Tensor b = random_tensor({k.o}, ++stream);
    Tensor dy = random_tensor({k.n, k.o, k.oh(), k.ow()}, ++stream);
    Tensor dw0 = random_tensor(w.shape(), ++stream);
    auto want =
        conv_reference(k, rounded_to_bf16(x), rounded_to_bf16(w), b, rounded_to_bf16(dy), dw0);
    Tensor y = Tensor::empty(dy.shape(), DType::F32, kGpu);
    Tensor dx = Tensor::empty(x.shape(), DType::F32, kGpu);
    Tensor dw = dev(dw0), db = Tensor::empty({k.o}, DType::F32, kGpu);
    ops::fill(*ctx, db, 0.0f);
    ops::conv2d_forward(*ctx, dev(in(x)), dev(w), dev(b), y, p);
    ops::conv2d_backward_data(*ctx, dev(in(dy)), dev(w), dx, p);
    ops::conv2d_backward_weights(*ctx, dev(in(x)), dev(in(dy)), dw, db, p);
    const double u = ops::kBf16UnitRoundoff;
    // The bias is added in f32 after the bf16 output: |b| is in abs_sum, so u_b |value| still
    // covers the output rounding of the convolution part (|conv| <= |value| + |b| <= abs_sum).
    EXPECT_TRUE(within_bound(out(y), want.y, accumulation_bound(want.y.terms) + u)) << "forward";
    EXPECT_TRUE(within_bound(out(dx), want.dx, accumulation_bound(want.dx.terms), u))
        << "backward data";
    EXPECT_TRUE(
        within_bound(host(dw), want.dw, accumulation_bound(want.dw.terms) + u + gamma_f32(1)))
        << "backward weights";
  }
}

TEST_F(Precision, Bf16MlpTrainingOnTheGpuTracksFp32OnTheCpu) {
  // The same tolerance as the CPU's Bf16Training test: every bf16 loss within 1% of the fp32 loss
  // of the same step (+0.005), here over 24 SGD steps of test_cuda_training's MLP from the same
  // initialisation, and the bf16 run learns as the fp32 one does.
  const std::int64_t batch = 32, in = 64, hidden = 48, classes = 10;
  const int steps = 24;
  ops::Context cpu_fp32;
  auto bf16 = gpu(ops::Precision::BF16);
  OpsMlp want(cpu_fp32, in, hidden, classes), got(*bf16, in, hidden, classes);
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    Tensor x = random_tensor({batch, in}, 1000 + s % 4);
    Tensor labels = random_labels(batch, static_cast<int>(classes), 2000 + s % 4);
    float l32 = want.step(x, labels, s), l16 = got.step(x, labels, s);
    EXPECT_LE(std::fabs(l16 - l32), 0.01f * l32 + 0.005f) << "step " << s;
    losses.push_back(l16);
  }
  float first = (losses[0] + losses[1] + losses[2] + losses[3]) / 4;
  float last = (losses[steps - 4] + losses[steps - 3] + losses[steps - 2] + losses[steps - 1]) / 4;
  EXPECT_LT(last, 0.75f * first);
}

}  // namespace
}  // namespace lockstep::testing
