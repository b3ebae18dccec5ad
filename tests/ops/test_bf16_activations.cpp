// bf16 activations (ops.hpp, "Activations in bf16"): on a bf16 context every op that takes or gives
// a bf16 activation is, on the CPU, bit for bit the f32 op on the widened inputs with its bf16
// outputs rounded once by ops::cast. The f32 ops are held to float64 references elsewhere
// (test_transformer_ops.cpp, test_gemm.cpp, test_precision.cpp), and the rounding to an
// independent one (test_precision.cpp), so this pins the bf16 variants to both. Shapes are not
// multiples of the SIMD width or of the kernels' blocks, and run on 1 and 3 threads. The emulated
// GPU and CUDA are compared with the CPU by tests/ops/cuda/test_backend_ops.cpp. Also: bf16 where
// the context is not bf16, mismatched dtypes and a bf16 GEMM output that would be accumulated into
// are errors naming the op and the tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/core/error.hpp"
#include "lockstep/ops/ops.hpp"
#include "ops_test_util.hpp"
#include "support/precision_reference.hpp"

using namespace lockstep;
using lockstep::testing::bitwise_equal;
using lockstep::testing::expect_error_containing;
using lockstep::testing::random_tensor;

namespace {

// A bf16 context of `threads` threads, or nullptr (the test skips) where the CPU has no bf16.
class Bf16Activations : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    LOCKSTEP_SKIP_WITHOUT_BF16();
    ctx_ = std::make_unique<ops::Context>(Device::cpu(), GetParam());
    ctx_->set_precision(ops::Precision::BF16);
  }
  ops::Context& ctx() { return *ctx_; }

  Tensor to_bf16(const Tensor& t) {
    Tensor h = Tensor::empty(t.shape(), DType::BF16);
    ops::cast(ctx(), t, h);
    return h;
  }
  Tensor widen(const Tensor& h) {
    Tensor t = Tensor::empty(h.shape());
    ops::cast(ctx(), h, t);
    return t;
  }
  // A random bf16 activation.
  Tensor random_bf16(const Shape& s, std::uint64_t stream, float lo = -1.0f, float hi = 1.0f) {
    return to_bf16(random_tensor(s, stream, lo, hi));
  }
  // Bits of a bf16 tensor against the rounding of an f32 one: widened, both are f32.
  ::testing::AssertionResult rounds_from(const Tensor& got16, const Tensor& want32) {
    return bitwise_equal(widen(got16), widen(to_bf16(want32)));
  }

 private:
  std::unique_ptr<ops::Context> ctx_;
};

TEST_P(Bf16Activations, GemmWritesTheRoundedF32Product) {
  const std::int64_t m = 37, n = 29, k = 45;
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    SCOPED_TRACE(::testing::Message() << "trans_a " << ta << ", trans_b " << tb);
    Tensor a = random_bf16(ta ? Shape{k, m} : Shape{m, k}, 1 + t);
    Tensor b = random_tensor(tb ? Shape{n, k} : Shape{k, n}, 5 + t);  // f32: rounded by the GEMM
    Tensor c16 = Tensor::empty({m, n}, DType::BF16), c = Tensor::empty({m, n});
    ops::gemm(ctx(), ta, tb, 0.75f, a, b, 0.0f, c16);
    ops::gemm(ctx(), ta, tb, 0.75f, a, b, 0.0f, c);
    EXPECT_TRUE(rounds_from(c16, c));
  }
  // k = 0: zeros, as for f32.
  Tensor c16 = random_bf16({3, 4}, 9), none = Tensor::empty({3, 0}, DType::BF16);
  ops::gemm(ctx(), false, false, 1.0f, none, Tensor::empty({0, 4}, DType::BF16), 0.0f, c16);
  EXPECT_TRUE(bitwise_equal(widen(c16), Tensor::from_vector(std::vector<float>(12, 0.0f), {3, 4})));
}

TEST_P(Bf16Activations, SumRowsAndAddReadTheWidenedValues) {
  Tensor dy = random_bf16({133, 301}, 10);  // 301 columns: two blocks of 256, the second partial
  Tensor db = random_tensor({301}, 11), db_ref = db.clone();
  ops::sum_rows(ctx(), dy, db);
  ops::sum_rows(ctx(), widen(dy), db_ref);
  EXPECT_TRUE(bitwise_equal(db, db_ref));

  Tensor x = random_tensor({70001}, 12), m = random_bf16({70001}, 13);  // above the parallel grain
  Tensor out = Tensor::empty({70001}), out_ref = Tensor::empty({70001});
  ops::add(ctx(), x, m, out);
  ops::add(ctx(), x, widen(m), out_ref);
  EXPECT_TRUE(bitwise_equal(out, out_ref));
}

TEST_P(Bf16Activations, GeluIsTheF32GeluRoundedAndRunsInPlace) {
  const std::int64_t n = 70001;
  Tensor x = random_bf16({n}, 20, -6, 6), dy = random_bf16({n}, 21);
  Tensor y = Tensor::empty({n}, DType::BF16), y_ref = Tensor::empty({n});
  ops::gelu_tanh_forward(ctx(), x, y);
  ops::gelu_tanh_forward(ctx(), widen(x), y_ref);
  EXPECT_TRUE(rounds_from(y, y_ref));

  Tensor dx = Tensor::empty({n}, DType::BF16), dx_ref = Tensor::empty({n});
  ops::gelu_tanh_backward(ctx(), x, dy, dx);
  ops::gelu_tanh_backward(ctx(), widen(x), widen(dy), dx_ref);
  EXPECT_TRUE(rounds_from(dx, dx_ref));
  // In place, as c_proj's input gradient passes through the GELU of c_fc.
  ops::gelu_tanh_backward(ctx(), x, dy, dy);
  EXPECT_TRUE(bitwise_equal(widen(dy), widen(dx)));
}

TEST_P(Bf16Activations, LayerNormReadsAnF32StreamAndWritesBf16) {
  const std::int64_t c = 67;
  const Shape shape{3, 13, c};  // 39 rows: more than one backward block of 32
  Tensor x = random_tensor(shape, 30, -3, 3), a = random_bf16(shape, 31);
  Tensor w = random_tensor({c}, 32, 0.5f, 1.5f), b = random_tensor({c}, 33);
  Tensor mean = Tensor::empty({39}), rstd = Tensor::empty({39});
  Tensor mean_ref = Tensor::empty({39}), rstd_ref = Tensor::empty({39});

  Tensor y = Tensor::empty(shape, DType::BF16), y_ref = Tensor::empty(shape);
  ops::layernorm_forward(ctx(), x, w, b, 1e-5f, y, mean, rstd);
  ops::layernorm_forward(ctx(), x, w, b, 1e-5f, y_ref, mean_ref, rstd_ref);
  EXPECT_TRUE(rounds_from(y, y_ref));
  EXPECT_TRUE(bitwise_equal(mean, mean_ref));
  EXPECT_TRUE(bitwise_equal(rstd, rstd_ref));

  // The residual sum with a bf16 branch, normalised into bf16 (and into f32: ln_f's case).
  Tensor s = Tensor::empty(shape), s_ref = Tensor::empty(shape);
  ops::residual_layernorm_forward(ctx(), x, a, w, b, 1e-5f, s, y, mean, rstd);
  ops::residual_layernorm_forward(ctx(), x, widen(a), w, b, 1e-5f, s_ref, y_ref, mean_ref,
                                  rstd_ref);
  EXPECT_TRUE(bitwise_equal(s, s_ref));
  EXPECT_TRUE(rounds_from(y, y_ref));
  EXPECT_TRUE(bitwise_equal(mean, mean_ref));
  Tensor y32 = Tensor::empty(shape);
  ops::residual_layernorm_forward(ctx(), x, a, w, b, 1e-5f, s, y32, mean, rstd);
  EXPECT_TRUE(bitwise_equal(y32, y_ref));

  // The backward of a bf16 dy: dx (f32, with the residual gradient) and the parameter gradients.
  Tensor dy = random_bf16(shape, 34), dres = random_tensor(shape, 35);
  Tensor dx = Tensor::empty(shape), dx_ref = Tensor::empty(shape);
  Tensor dw = random_tensor({c}, 36), db = random_tensor({c}, 37);
  Tensor dw_ref = dw.clone(), db_ref = db.clone();
  ops::layernorm_backward(ctx(), x, dy, w, mean_ref, rstd_ref, dres, dx, dw, db);
  ops::layernorm_backward(ctx(), x, widen(dy), w, mean_ref, rstd_ref, dres, dx_ref, dw_ref, db_ref);
  EXPECT_TRUE(bitwise_equal(dx, dx_ref));
  EXPECT_TRUE(bitwise_equal(dw, dw_ref));
  EXPECT_TRUE(bitwise_equal(db, db_ref));
}

// T = 70 crosses the 64-row query blocks; head widths 16 and 24 (not a SIMD multiple).
TEST_P(Bf16Activations, AttentionIsTheF32KernelOnTheWidenedHeads) {
  for (std::int64_t d : {16, 24}) {
    SCOPED_TRACE(::testing::Message() << "head width " << d);
    const std::int64_t b = 2, t = 70, heads = 3, c = heads * d;
    Tensor qkv = random_bf16({b, t, 3 * c}, 40, -2, 2), dout = random_bf16({b, t, c}, 41);
    Tensor out = Tensor::empty({b, t, c}, DType::BF16), out_ref = Tensor::empty({b, t, c});
    Tensor lse = Tensor::empty({b, heads, t}), lse_ref = Tensor::empty({b, heads, t});
    ops::attention_forward(ctx(), qkv, heads, out, lse);
    ops::attention_forward(ctx(), widen(qkv), heads, out_ref, lse_ref);
    EXPECT_TRUE(rounds_from(out, out_ref));
    EXPECT_TRUE(bitwise_equal(lse, lse_ref));

    // The backward of the bf16 forward's own output, against the f32 kernel on its widening.
    Tensor dqkv = Tensor::empty({b, t, 3 * c}, DType::BF16),
           dqkv_ref = Tensor::empty({b, t, 3 * c});
    ops::attention_backward(ctx(), qkv, out, dout, lse, heads, dqkv);
    ops::attention_backward(ctx(), widen(qkv), widen(out), widen(dout), lse, heads, dqkv_ref);
    EXPECT_TRUE(rounds_from(dqkv, dqkv_ref));
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, Bf16Activations, ::testing::Values(1, 3),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::to_string(i.param) + "_threads";
                         });

TEST(Bf16ActivationErrors, NameTheOpTheTensorAndWhy) {
  ops::Context fp32;
  Tensor x16 = Tensor::empty({4, 8}, DType::BF16), y16 = Tensor::empty({4, 8}, DType::BF16);
  expect_error_containing([&] { ops::gelu_tanh_forward(fp32, x16, y16); },
                          "gelu_tanh_forward: x must be f32, got bf16[4, 8] on cpu on a fp32 "
                          "context");
  Tensor a = random_tensor({4, 8}, 1), b = random_tensor({8, 8}, 2);
  expect_error_containing([&] { ops::gemm(fp32, false, false, 1.0f, a, b, 0.0f, y16); },
                          "gemm: c must be f32");
  if (!lockstep::testing::bf16_unavailable().empty()) return;
  ops::Context bf16;
  bf16.set_precision(ops::Precision::BF16);
  expect_error_containing([&] { ops::gemm(bf16, false, false, 1.0f, a, b, 1.0f, y16); },
                          "gemm: a bf16 c is overwritten by the product (beta = 0), got beta = 1");
  Tensor y = Tensor::empty({4, 8});
  expect_error_containing([&] { ops::gelu_tanh_forward(bf16, x16, y); },
                          "gelu_tanh_forward: x is bf16[4, 8] on cpu but y is f32[4, 8] on cpu "
                          "(dtypes must match)");
  Tensor qkv16 = Tensor::empty({1, 4, 6}, DType::BF16), out = Tensor::empty({1, 4, 2});
  Tensor lse = Tensor::empty({1, 1, 4});
  expect_error_containing([&] { ops::attention_forward(bf16, qkv16, 1, out, lse); },
                          "attention_forward: qkv is bf16[1, 4, 6] on cpu but out is f32");
}

}  // namespace
