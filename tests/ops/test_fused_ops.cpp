// The fused layer ops (ops.hpp: residual_layernorm_forward, linear_forward, linear_backward,
// linear_recompute_activation, batchnorm_act_forward_train/_eval, batchnorm_relu_backward) are, on
// the CPU, the compositions their comments name, bit for bit: each test runs the fused op and the
// separate ops on the same inputs and compares every output's bits, in fp32 and (where the CPU has
// it) bf16, over shapes that are not multiples of the SIMD width; with bf16 outputs, the f32
// composition rounded once. The separate ops are themselves held to float64 references in
// test_transformer_ops.cpp, test_gemm.cpp and test_precision.cpp (their bf16 variants to the f32
// ones in test_bf16_activations.cpp). The emulated GPU and CUDA are compared with the CPU by
// tests/ops/cuda/test_backend_ops.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lockstep/core/error.hpp"
#include "lockstep/ops/backend.hpp"
#include "lockstep/ops/context.hpp"
#include "lockstep/ops/ops.hpp"
#include "ops/cpu/cpu_backend.hpp"
#include "ops_test_util.hpp"
#include "support/precision_reference.hpp"

using namespace lockstep;
using lockstep::testing::bitwise_equal;
using lockstep::testing::expect_error_containing;
using lockstep::testing::random_tensor;

namespace {

Tensor widen(ops::Context& ctx, const Tensor& h) {
  Tensor t = Tensor::empty(h.shape());
  ops::cast(ctx, h, t);
  return t;
}

// ---- residual sum + LayerNorm

TEST(ResidualLayerNorm, IsAddThenLayerNormBitForBit) {
  for (int threads : {1, 3}) {
    ops::Context ctx(Device::cpu(), threads);
    for (std::int64_t c : {67, 256}) {
      SCOPED_TRACE(::testing::Message() << "C = " << c << ", " << threads << " threads");
      const Shape shape{3, 13, c};  // 39 rows: uneven over the threads
      Tensor x = random_tensor(shape, 1, -3, 3), a = random_tensor(shape, 2);
      Tensor w = random_tensor({c}, 3, 0.5f, 1.5f), b = random_tensor({c}, 4);
      Tensor s = Tensor::empty(shape), y = Tensor::empty(shape);
      Tensor mean = Tensor::empty({39}), rstd = Tensor::empty({39});
      ops::residual_layernorm_forward(ctx, x, a, w, b, 1e-5f, s, y, mean, rstd);

      Tensor s_ref = Tensor::empty(shape), y_ref = Tensor::empty(shape);
      Tensor mean_ref = Tensor::empty({39}), rstd_ref = Tensor::empty({39});
      ops::add(ctx, x, a, s_ref);
      ops::layernorm_forward(ctx, s_ref, w, b, 1e-5f, y_ref, mean_ref, rstd_ref);
      EXPECT_TRUE(bitwise_equal(s, s_ref));
      EXPECT_TRUE(bitwise_equal(y, y_ref));
      EXPECT_TRUE(bitwise_equal(mean, mean_ref));
      EXPECT_TRUE(bitwise_equal(rstd, rstd_ref));
    }
  }
}

TEST(ResidualLayerNorm, RefusesMismatchedShapesAndAliasedOutputs) {
  ops::Context ctx;
  Tensor x = random_tensor({4, 8}, 1), a = random_tensor({4, 8}, 2);
  Tensor w = random_tensor({8}, 3), b = random_tensor({8}, 4);
  Tensor s = Tensor::empty({4, 8}), y = Tensor::empty({4, 8});
  Tensor mean = Tensor::empty({4}), rstd = Tensor::empty({4});
  Tensor short_a = random_tensor({3, 8}, 5);
  expect_error_containing(
      [&] { ops::residual_layernorm_forward(ctx, x, short_a, w, b, 1e-5f, s, y, mean, rstd); },
      "residual_layernorm_forward: x is");
  expect_error_containing(
      [&] { ops::residual_layernorm_forward(ctx, x, a, w, b, 1e-5f, x, y, mean, rstd); },
      "s and y must not share storage");
}

// ---- linear

struct LinearCase {
  ops::Precision precision;
  bool bias;
  ops::Activation act;
};

std::string describe(const LinearCase& k) {
  return str(ops::precision_name(k.precision), k.bias ? ", bias" : ", no bias",
             k.act == ops::Activation::GeluTanh ? ", gelu" : "");
}

std::vector<LinearCase> linear_cases() {
  std::vector<LinearCase> cases;
  std::vector<ops::Precision> precisions = {ops::Precision::FP32};
  if (lockstep::testing::bf16_unavailable().empty()) precisions.push_back(ops::Precision::BF16);
  for (ops::Precision p : precisions)
    for (bool bias : {true, false})
      for (ops::Activation act : {ops::Activation::None, ops::Activation::GeluTanh})
        cases.push_back({p, bias, act});
  return cases;
}

constexpr std::int64_t kRows = 37, kIn = 45, kOut = 29;

TEST(LinearForward, IsGemmThenBiasThenGeluBitForBit) {
  for (const LinearCase& k : linear_cases()) {
    SCOPED_TRACE(describe(k));
    ops::Context ctx(Device::cpu(), 2);
    ctx.set_precision(k.precision);
    Tensor x = random_tensor({kRows, kIn}, 10, -2, 2), w = random_tensor({kOut, kIn}, 11);
    Tensor b = k.bias ? random_tensor({kOut}, 12) : Tensor();
    const bool gelu = k.act == ops::Activation::GeluTanh;
    Tensor y = Tensor::empty({kRows, kOut});
    Tensor pre = gelu ? Tensor::empty({kRows, kOut}) : Tensor();
    ops::linear_forward(ctx, x, w, b, k.act, y, pre);

    Tensor z = Tensor::empty({kRows, kOut}), y_ref = Tensor::empty({kRows, kOut});
    ops::gemm(ctx, false, true, 1.0f, x, w, 0.0f, z);
    if (k.bias) ops::add_row_bias(ctx, z, b);
    if (gelu) {
      ops::gelu_tanh_forward(ctx, z, y_ref);
      EXPECT_TRUE(bitwise_equal(pre, z));
      // A GELU that was skipped would leave y = z.
      EXPECT_FALSE(bitwise_equal(y_ref, z));
    } else {
      y_ref = z;
    }
    EXPECT_TRUE(bitwise_equal(y, y_ref));

    // The recompute gives back what the forward wrote.
    if (gelu) {
      Tensor again = Tensor::empty({kRows, kOut});
      ops::linear_recompute_activation(ctx, x, w, b, k.act, pre, again);
      EXPECT_TRUE(bitwise_equal(again, y));
    }
    // On a bf16 context the layer passes its bf16 copy of x: the same bits as the f32 x.
    if (k.precision == ops::Precision::BF16) {
      Tensor x16 = Tensor::empty({kRows, kIn}, DType::BF16), y16 = Tensor::empty({kRows, kOut});
      ops::cast(ctx, x, x16);
      Tensor pre16 = gelu ? Tensor::empty({kRows, kOut}) : Tensor();
      ops::linear_forward(ctx, x16, w, b, k.act, y16, pre16);
      EXPECT_TRUE(bitwise_equal(y16, y));
    }
  }
}

TEST(LinearBackward, IsTheLayersGemmsBiasSumAndGeluBackwardBitForBit) {
  for (const LinearCase& k : linear_cases()) {
    if (!k.bias) continue;  // the bias gradient's cases below cover both
    for (bool overwrite : {true, false}) {
      SCOPED_TRACE(describe(k) + (overwrite ? ", stale gradients" : ", accumulating"));
      ops::Context ctx(Device::cpu(), 2);
      ctx.set_precision(k.precision);
      const bool bf16 = k.precision == ops::Precision::BF16;
      const bool gelu = k.act == ops::Activation::GeluTanh;
      Tensor x = random_tensor({kRows, kIn}, 20), w = random_tensor({kOut, kIn}, 21);
      Tensor dy = random_tensor({kRows, kOut}, 22), pre = random_tensor({kRows, kIn}, 23, -4, 4);
      Tensor dy16;
      if (bf16) {
        dy16 = Tensor::empty({kRows, kOut}, DType::BF16);
        ops::cast(ctx, dy, dy16);
      }
      // Gradients holding earlier values: overwritten when stale, added to otherwise.
      Tensor dw = random_tensor({kOut, kIn}, 24), db = random_tensor({kOut}, 25);
      Tensor dx = Tensor::empty({kRows, kIn});
      Tensor dw_ref = dw.clone(), db_ref = db.clone(), dx_ref = Tensor::empty({kRows, kIn});
      ops::LinearBackward p;
      p.overwrite_dw = p.overwrite_db = overwrite;
      p.input_act = k.act;
      p.input_pre_act = gelu ? pre : Tensor();
      ops::linear_backward(ctx, x, w, dy, dy16, dw, db, dx, p);

      // What nn::Linear and nn::Mlp ran before the op existed.
      const Tensor& dy_operand = bf16 ? dy16 : dy;
      ops::gemm(ctx, true, false, 1.0f, dy_operand, x, overwrite ? 0.0f : 1.0f, dw_ref);
      if (overwrite) ops::fill(ctx, db_ref, 0.0f);
      ops::sum_rows(ctx, dy, db_ref);
      if (gelu) {
        Tensor dg = Tensor::empty({kRows, kIn});
        ops::gemm(ctx, false, false, 1.0f, dy_operand, w, 0.0f, dg);
        ops::gelu_tanh_backward(ctx, pre, dg, dx_ref);
      } else {
        ops::gemm(ctx, false, false, 1.0f, dy_operand, w, 0.0f, dx_ref);
      }
      EXPECT_TRUE(bitwise_equal(dw, dw_ref));
      EXPECT_TRUE(bitwise_equal(db, db_ref));
      EXPECT_TRUE(bitwise_equal(dx, dx_ref));

      // Without dx or db: the rest is the same, and nothing else is written.
      Tensor dw2 = random_tensor({kOut, kIn}, 24), none;
      ops::linear_backward(ctx, x, w, dy, dy16, dw2, none, none, p);
      EXPECT_TRUE(bitwise_equal(dw2, dw_ref));
    }
  }
}

// A bf16 output (a GPT block's activations under bf16): pre_act is the f32 product plus the bias
// rounded once (the CPU's oneDNN matmul writes it with the bias in its epilogue), y the bf16 GELU
// of it; the input may be bf16 or f32.
TEST(LinearForward, WithABf16OutputIsTheF32ProductAndBiasRoundedOnce) {
  LOCKSTEP_SKIP_WITHOUT_BF16();
  for (int threads : {1, 2}) {
    for (bool bias : {true, false}) {
      for (ops::Activation act : {ops::Activation::None, ops::Activation::GeluTanh}) {
        SCOPED_TRACE(str(threads, " threads", bias ? ", bias" : ", no bias",
                         act == ops::Activation::GeluTanh ? ", gelu" : ""));
        ops::Context ctx(Device::cpu(), threads);
        ctx.set_precision(ops::Precision::BF16);
        const bool gelu = act == ops::Activation::GeluTanh;
        Tensor x = random_tensor({kRows, kIn}, 10, -2, 2), w = random_tensor({kOut, kIn}, 11);
        Tensor b = bias ? random_tensor({kOut}, 12) : Tensor();
        Tensor x16 = Tensor::empty({kRows, kIn}, DType::BF16);
        ops::cast(ctx, x, x16);
        for (const Tensor* input : {&x, &x16}) {
          Tensor y = Tensor::empty({kRows, kOut}, DType::BF16);
          Tensor pre = gelu ? Tensor::empty({kRows, kOut}, DType::BF16) : Tensor();
          ops::linear_forward(ctx, *input, w, b, act, y, pre);

          Tensor z = Tensor::empty({kRows, kOut}), z16 = Tensor::empty({kRows, kOut}, DType::BF16);
          ops::gemm(ctx, false, true, 1.0f, *input, w, 0.0f, z);
          if (bias) ops::add_row_bias(ctx, z, b);
          ops::cast(ctx, z, z16);
          Tensor y_ref = z16;
          if (gelu) {
            y_ref = Tensor::empty({kRows, kOut}, DType::BF16);
            ops::gelu_tanh_forward(ctx, z16, y_ref);
            EXPECT_TRUE(bitwise_equal(widen(ctx, pre), widen(ctx, z16)));
            Tensor again = Tensor::empty({kRows, kOut}, DType::BF16);
            ops::linear_recompute_activation(ctx, *input, w, b, act, pre, again);
            EXPECT_TRUE(bitwise_equal(widen(ctx, again), widen(ctx, y)));
          }
          EXPECT_TRUE(bitwise_equal(widen(ctx, y), widen(ctx, y_ref)));
        }
      }
    }
  }
}

// Gradients of bf16 activations: dy may come in bf16 (then its sum is the bias gradient) and dx
// goes out in bf16, through the GELU's bf16 backward for c_proj.
TEST(LinearBackward, OfBf16ActivationsIsTheGemmsBiasSumAndBf16GeluBackward) {
  LOCKSTEP_SKIP_WITHOUT_BF16();
  for (bool gelu : {false, true}) {
    for (bool overwrite : {true, false}) {
      SCOPED_TRACE(str(gelu ? "gelu" : "no gelu", overwrite ? ", stale" : ", accumulating"));
      ops::Context ctx(Device::cpu(), 2);
      ctx.set_precision(ops::Precision::BF16);
      auto bf16 = [&](const Tensor& t) {
        Tensor h = Tensor::empty(t.shape(), DType::BF16);
        ops::cast(ctx, t, h);
        return h;
      };
      Tensor x = bf16(random_tensor({kRows, kIn}, 20)), w = random_tensor({kOut, kIn}, 21);
      Tensor dy = bf16(random_tensor({kRows, kOut}, 22));
      Tensor pre = bf16(random_tensor({kRows, kIn}, 23, -4, 4));
      Tensor dw = random_tensor({kOut, kIn}, 24), db = random_tensor({kOut}, 25);
      Tensor dx = Tensor::empty({kRows, kIn}, DType::BF16);
      Tensor dw_ref = dw.clone(), db_ref = db.clone();
      ops::LinearBackward p;
      p.overwrite_dw = p.overwrite_db = overwrite;
      if (gelu) {
        p.input_act = ops::Activation::GeluTanh;
        p.input_pre_act = pre;
      }
      ops::linear_backward(ctx, x, w, dy, Tensor(), dw, db, dx, p);

      ops::gemm(ctx, true, false, 1.0f, dy, x, overwrite ? 0.0f : 1.0f, dw_ref);
      if (overwrite) ops::fill(ctx, db_ref, 0.0f);
      ops::sum_rows(ctx, widen(ctx, dy), db_ref);
      Tensor dg = Tensor::empty({kRows, kIn}), dg16 = Tensor::empty({kRows, kIn}, DType::BF16);
      ops::gemm(ctx, false, false, 1.0f, dy, w, 0.0f, dg);
      ops::cast(ctx, dg, dg16);
      Tensor dx_ref = dg16;
      if (gelu) {
        Tensor d32 = Tensor::empty({kRows, kIn});
        ops::gelu_tanh_backward(ctx, widen(ctx, pre), widen(ctx, dg16), d32);
        dx_ref = bf16(d32);
      }
      EXPECT_TRUE(bitwise_equal(dw, dw_ref));
      EXPECT_TRUE(bitwise_equal(db, db_ref));
      EXPECT_TRUE(bitwise_equal(widen(ctx, dx), widen(ctx, dx_ref)));
    }
  }
}

TEST(LinearOps, RefuseBadArgumentsNamingTheOpAndTensor) {
  ops::Context ctx;
  Tensor x = random_tensor({4, 6}, 1), w = random_tensor({5, 6}, 2), b = random_tensor({5}, 3);
  Tensor y = Tensor::empty({4, 5}), pre = Tensor::empty({4, 5}), none;
  Tensor wrong_w = random_tensor({5, 7}, 4);
  expect_error_containing([&] { ops::linear_forward(ctx, x, wrong_w, b, {}, y, none); },
                          "linear_forward: x is");
  expect_error_containing(
      [&] { ops::linear_forward(ctx, x, w, b, ops::Activation::GeluTanh, y, none); },
      "linear_forward: pre_act is an undefined tensor");
  expect_error_containing(
      [&] { ops::linear_recompute_activation(ctx, x, w, b, ops::Activation::None, pre, y); },
      "no activation to recompute");
  Tensor dy = random_tensor({4, 5}, 5), dw = Tensor::empty({5, 6}), dx = Tensor::empty({4, 6});
  Tensor dy16 = Tensor::empty({4, 5}, DType::BF16);
  expect_error_containing([&] { ops::linear_backward(ctx, x, w, dy, dy16, dw, b, dx); },
                          "dy16 is a bf16 copy of dy, for a bf16 context only");
  ops::LinearBackward p;
  p.input_act = ops::Activation::GeluTanh;
  expect_error_containing([&] { ops::linear_backward(ctx, x, w, dy, none, dw, b, dx, p); },
                          "linear_backward: input_pre_act is an undefined tensor");
}

// ---- BatchNorm epilogues (a ResNet block's BN -> [+ shortcut] -> ReLU)

struct BnCase {
  Shape shape;  // [N, C] rows (a channels-last BatchNorm2d's view) or [N, C, H, W]
  bool residual, relu;
  bool bf16_out;
};

std::string bn_case_name(const BnCase& c, int threads) {
  return str(shape_str(c.shape), c.residual ? " +residual" : "", c.relu ? " relu" : "",
             c.bf16_out ? " bf16 y" : " f32 y", ", ", threads, " threads");
}

std::vector<BnCase> bn_cases(bool bf16) {
  std::vector<BnCase> out;
  // Rows uneven over the threads and channel counts off the SIMD width; planes of NCHW, one larger
  // than the kernels' chunk of 2048 values.
  for (const Shape& s : {Shape{2500, 40}, Shape{37, 67}, Shape{6, 5, 7, 9}, Shape{2, 3, 50, 50}}) {
    for (auto [residual, relu] :
         {std::pair{false, true}, std::pair{true, true}, std::pair{true, false}}) {
      out.push_back({s, residual, relu, false});
      if (bf16) out.push_back({s, residual, relu, true});
    }
  }
  return out;
}

// The composition ops.hpp names for batchnorm_act_forward_*: the f32 BatchNorm output z, then
// add(z, residual, z), relu_forward(z, z), cast(z, y).
void compose_epilogue(ops::Context& ctx, Tensor& z, const BnCase& c, const Tensor& residual,
                      Tensor& y) {
  if (c.residual) ops::add(ctx, z, residual, z);
  if (c.relu) ops::relu_forward(ctx, z, z);
  if (c.bf16_out)
    ops::cast(ctx, z, y);
  else
    ops::copy(ctx, z, y);
}

Tensor f32_of(ops::Context& ctx, const Tensor& t) {
  return t.dtype() == DType::BF16 ? widen(ctx, t) : t;
}

void run_bn_epilogue_cases(ops::Precision precision) {
  const bool bf16 = precision == ops::Precision::BF16;
  for (int threads : {1, 3}) {
    ops::Context ctx(Device::cpu(), threads);
    ctx.set_precision(precision);
    for (const BnCase& c : bn_cases(bf16)) {
      SCOPED_TRACE(bn_case_name(c, threads));
      const std::int64_t ch = c.shape[1];
      const DType out = c.bf16_out ? DType::BF16 : DType::F32;
      Tensor x = random_tensor(c.shape, 30, -2, 3), residual = random_tensor(c.shape, 31, -2, 2);
      Tensor gamma = random_tensor({ch}, 32, 0.5f, 1.5f), beta = random_tensor({ch}, 33);
      ops::BatchNormEpilogue epi{c.residual ? residual : Tensor(), c.relu};
      // Training mode: the output, the saved statistics and the running averages.
      Tensor y = Tensor::empty(c.shape, out), mean = Tensor::empty({ch}),
             invstd = Tensor::empty({ch}), rm = random_tensor({ch}, 34),
             rv = random_tensor({ch}, 35, 0.5f, 2);
      Tensor z = Tensor::empty(c.shape), y_ref = Tensor::empty(c.shape, out),
             mean_ref = Tensor::empty({ch}), invstd_ref = Tensor::empty({ch}), rm_ref = rm.clone(),
             rv_ref = rv.clone();
      Tensor y_def = Tensor::empty(c.shape, out), mean_def = Tensor::empty({ch}),
             invstd_def = Tensor::empty({ch}), rm_def = rm.clone(), rv_def = rv.clone();
      ops::batchnorm_act_forward_train(ctx, x, gamma, beta, epi, y, mean, invstd, rm, rv, 0.1f,
                                       1e-5f);
      // The Backend's default, the composition a backend without the fused kernel (CUDA) runs,
      // here over the CPU's ops: the same bits.
      ctx.backend().ops::Backend::batchnorm_act_forward_train(
          x, gamma, beta, epi, y_def, mean_def, invstd_def, rm_def, rv_def, 0.1f, 1e-5f);
      EXPECT_TRUE(bitwise_equal(f32_of(ctx, y), f32_of(ctx, y_def)));
      EXPECT_TRUE(bitwise_equal(rv, rv_def));
      ops::batchnorm_forward_train(ctx, x, gamma, beta, z, mean_ref, invstd_ref, rm_ref, rv_ref,
                                   0.1f, 1e-5f);
      compose_epilogue(ctx, z, c, residual, y_ref);
      EXPECT_TRUE(bitwise_equal(f32_of(ctx, y), f32_of(ctx, y_ref)));
      for (auto [got, want] : {std::pair{&mean, &mean_ref}, std::pair{&invstd, &invstd_ref},
                               std::pair{&rm, &rm_ref}, std::pair{&rv, &rv_ref}})
        EXPECT_TRUE(bitwise_equal(*got, *want));
      // The ReLU's backward folded into the BatchNorm's (dgamma and dbeta accumulate).
      if (c.relu && !c.residual) {
        Tensor dy = random_tensor(c.shape, 36);
        Tensor dx = Tensor::empty(c.shape), dg = random_tensor({ch}, 37),
               db = random_tensor({ch}, 38);
        Tensor dx_ref = Tensor::empty(c.shape), dg_ref = dg.clone(), db_ref = db.clone();
        ops::batchnorm_relu_backward(ctx, x, y, dy, gamma, mean, invstd, dx, dg, db);
        Tensor y32 = c.bf16_out ? widen(ctx, y) : y, dz = Tensor::empty(c.shape);
        ops::relu_backward(ctx, y32, dy, dz);
        ops::batchnorm_backward(ctx, x, dz, gamma, mean, invstd, dx_ref, dg_ref, db_ref);
        EXPECT_TRUE(bitwise_equal(dx, dx_ref));
        EXPECT_TRUE(bitwise_equal(dg, dg_ref));
        EXPECT_TRUE(bitwise_equal(db, db_ref));
        Tensor dx_def = Tensor::empty(c.shape), dg_def = Tensor::zeros({ch}),
               db_def = Tensor::zeros({ch}), dg_once = Tensor::zeros({ch}),
               db_once = Tensor::zeros({ch});
        ctx.backend().ops::Backend::batchnorm_relu_backward(x, y, dy, gamma, mean, invstd, dx_def,
                                                            dg_def, db_def);
        ops::batchnorm_relu_backward(ctx, x, y, dy, gamma, mean, invstd, dx, dg_once, db_once);
        EXPECT_TRUE(bitwise_equal(dx_def, dx));
        EXPECT_TRUE(bitwise_equal(dg_def, dg_once));
        EXPECT_TRUE(bitwise_equal(db_def, db_once));
        if (bf16) {  // a bf16 dx (for a convolution's backward) is the f32 one rounded once
          Tensor dx16 = Tensor::empty(c.shape, DType::BF16),
                 dx16_ref = Tensor::empty(c.shape, DType::BF16);
          ops::cast(ctx, dx, dx16_ref);
          ops::batchnorm_relu_backward(ctx, x, y, dy, gamma, mean, invstd, dx16, dg, db);
          EXPECT_TRUE(bitwise_equal(widen(ctx, dx16), widen(ctx, dx16_ref)));
          ops::batchnorm_backward(ctx, x, dz, gamma, mean, invstd, dx16, dg, db);
          EXPECT_TRUE(bitwise_equal(widen(ctx, dx16), widen(ctx, dx16_ref)));
        }
      }
      // Evaluation mode: the running statistics' fixed map.
      Tensor ye = Tensor::empty(c.shape, out), ye_ref = Tensor::empty(c.shape, out);
      ops::batchnorm_act_forward_eval(ctx, x, gamma, beta, rm, rv, 1e-5f, epi, ye);
      Tensor ye_def = Tensor::empty(c.shape, out);
      ctx.backend().ops::Backend::batchnorm_act_forward_eval(x, gamma, beta, rm, rv, 1e-5f, epi,
                                                             ye_def);
      EXPECT_TRUE(bitwise_equal(f32_of(ctx, ye), f32_of(ctx, ye_def)));
      ops::batchnorm_forward_eval(ctx, x, gamma, beta, rm, rv, 1e-5f, z);
      compose_epilogue(ctx, z, c, residual, ye_ref);
      EXPECT_TRUE(bitwise_equal(f32_of(ctx, ye), f32_of(ctx, ye_ref)));
    }
  }
}

TEST(BatchNormEpilogue, IsBatchNormThenAddReluAndCastBitForBit) {
  run_bn_epilogue_cases(ops::Precision::FP32);
}

TEST(BatchNormEpilogue, WithABf16OutputIsTheF32ResultRoundedOnce) {
  LOCKSTEP_SKIP_WITHOUT_BF16();
  run_bn_epilogue_cases(ops::Precision::BF16);
}

// A bf16 x (a convolution's rounded output) gives every BatchNorm op the bits of the same op on x
// widened to f32: rows and NCHW planes, 1 and 3 threads, training, evaluation and both backwards.
TEST(BatchNormOps, OfABf16InputAreTheOpsOnTheWidenedInput) {
  LOCKSTEP_SKIP_WITHOUT_BF16();
  for (int threads : {1, 3}) {
    ops::Context ctx(Device::cpu(), threads);
    ctx.set_precision(ops::Precision::BF16);
    ASSERT_TRUE(ops::bf16_conv_bn_activations(ctx));  // the CPU reads it in its kernels
    for (const BnCase& c : bn_cases(true)) {
      if (c.residual) continue;  // the epilogues are held to the compositions above
      SCOPED_TRACE(bn_case_name(c, threads));
      const std::int64_t ch = c.shape[1];
      const DType out = c.bf16_out ? DType::BF16 : DType::F32;
      Tensor x16 = Tensor::empty(c.shape, DType::BF16);
      ops::cast(ctx, random_tensor(c.shape, 40, -2, 3), x16);
      const Tensor x = widen(ctx, x16);
      Tensor gamma = random_tensor({ch}, 41, 0.5f, 1.5f), beta = random_tensor({ch}, 42);
      Tensor dy = random_tensor(c.shape, 43);
      // [0]: from x16, [1]: from x.
      Tensor y[2], yp[2], ye[2], mean[2], invstd[2], rm[2], rv[2], dx[2], dxp[2], dg[2], db[2];
      for (int k = 0; k < 2; ++k) {
        const Tensor& in = k == 0 ? x16 : x;
        y[k] = Tensor::empty(c.shape, out);
        yp[k] = Tensor::empty(c.shape);
        ye[k] = Tensor::empty(c.shape, out);
        mean[k] = Tensor::empty({ch});
        invstd[k] = Tensor::empty({ch});
        rm[k] = random_tensor({ch}, 44);
        rv[k] = random_tensor({ch}, 45, 0.5f, 2);
        dx[k] = Tensor::empty(c.shape, out);
        dxp[k] = Tensor::empty(c.shape);
        dg[k] = random_tensor({ch}, 46);
        db[k] = random_tensor({ch}, 47);
        ops::batchnorm_forward_train(ctx, in, gamma, beta, yp[k], mean[k], invstd[k], rm[k], rv[k],
                                     0.1f, 1e-5f);
        ops::batchnorm_backward(ctx, in, dy, gamma, mean[k], invstd[k], dxp[k], dg[k], db[k]);
        ops::batchnorm_act_forward_train(ctx, in, gamma, beta, {Tensor(), c.relu}, y[k], mean[k],
                                         invstd[k], rm[k], rv[k], 0.1f, 1e-5f);
        if (c.relu)
          ops::batchnorm_relu_backward(ctx, in, y[k], dy, gamma, mean[k], invstd[k], dx[k], dg[k],
                                       db[k]);
        ops::batchnorm_act_forward_eval(ctx, in, gamma, beta, rm[k], rv[k], 1e-5f,
                                        {Tensor(), c.relu}, ye[k]);
      }
      for (Tensor* t : {y, yp, ye, mean, invstd, rm, rv, dxp, dg, db})
        EXPECT_TRUE(bitwise_equal(f32_of(ctx, t[0]), f32_of(ctx, t[1])));
      if (c.relu) {
        EXPECT_TRUE(bitwise_equal(f32_of(ctx, dx[0]), f32_of(ctx, dx[1])));
      }
    }
  }
  // Outside bf16 a bf16 x is refused, naming the op.
  ops::Context fp32;
  Tensor x16 = Tensor::empty({8, 4}, DType::BF16), y = Tensor::empty({8, 4});
  Tensor v = random_tensor({4}, 1, 0.5f, 1.5f), m = Tensor::empty({4}), is = Tensor::empty({4});
  Tensor rm = Tensor::zeros({4}), rv = random_tensor({4}, 2, 0.5f, 1.5f);
  expect_error_containing(
      [&] { ops::batchnorm_forward_train(fp32, x16, v, v, y, m, is, rm, rv, 0.1f, 1e-5f); },
      "batchnorm_forward_train: x must be f32");
}

// A residual stream kept in bf16 (a ResNet block's output, read by the next block): the epilogue's
// bf16 residual and relu_backward_add's bf16 y give the bits of the same ops on their widened
// values, through the CPU's kernels and, for the residual, in training and evaluation; both are
// refused outside bf16, naming the op and the tensor.
TEST(BatchNormOps, ABf16ResidualStreamIsReadAsItsWidenedValues) {
  LOCKSTEP_SKIP_WITHOUT_BF16();
  for (int threads : {1, 3}) {
    ops::Context ctx(Device::cpu(), threads);
    ctx.set_precision(ops::Precision::BF16);
    for (const BnCase& c : bn_cases(true)) {
      if (!c.residual) continue;
      SCOPED_TRACE(bn_case_name(c, threads));
      const std::int64_t ch = c.shape[1];
      const DType out = c.bf16_out ? DType::BF16 : DType::F32;
      const Tensor x = random_tensor(c.shape, 60, -2, 3);
      Tensor gamma = random_tensor({ch}, 61, 0.5f, 1.5f), beta = random_tensor({ch}, 62);
      Tensor r16 = Tensor::empty(c.shape, DType::BF16);
      ops::cast(ctx, random_tensor(c.shape, 63, -1, 2), r16);
      const Tensor r = widen(ctx, r16);
      Tensor y[2], ye[2], mean[2], invstd[2], rm[2], rv[2];
      for (int k = 0; k < 2; ++k) {  // [0]: the bf16 residual, [1]: widened
        y[k] = Tensor::empty(c.shape, out);
        ye[k] = Tensor::empty(c.shape, out);
        mean[k] = Tensor::empty({ch});
        invstd[k] = Tensor::empty({ch});
        rm[k] = random_tensor({ch}, 64);
        rv[k] = random_tensor({ch}, 65, 0.5f, 2);
        const ops::BatchNormEpilogue e{k == 0 ? r16 : r, c.relu};
        ops::batchnorm_act_forward_train(ctx, x, gamma, beta, e, y[k], mean[k], invstd[k], rm[k],
                                         rv[k], 0.1f, 1e-5f);
        ops::batchnorm_act_forward_eval(ctx, x, gamma, beta, rm[k], rv[k], 1e-5f, e, ye[k]);
      }
      for (Tensor* t : {y, ye, mean, invstd, rm, rv})
        EXPECT_TRUE(bitwise_equal(f32_of(ctx, t[0]), f32_of(ctx, t[1])));
    }
    for (const Shape& s : {Shape{37, 67}, Shape{70000}}) {
      SCOPED_TRACE(str(shape_str(s), ", ", threads, " threads"));
      Tensor y16 = Tensor::empty(s, DType::BF16);
      ops::cast(ctx, random_tensor(s, 66, -1, 1), y16);
      const Tensor dy = random_tensor(s, 67), a = random_tensor(s, 68);
      Tensor dx16 = Tensor::empty(s), dx = Tensor::empty(s);
      ops::relu_backward_add(ctx, y16, dy, a, dx16);
      ops::relu_backward_add(ctx, widen(ctx, y16), dy, a, dx);
      EXPECT_TRUE(bitwise_equal(dx16, dx));
    }
  }
  ops::Context fp32;
  Tensor x = random_tensor({8, 4}, 1), r16 = Tensor::empty({8, 4}, DType::BF16);
  Tensor y = Tensor::empty({8, 4}), v = random_tensor({4}, 2, 0.5f, 1.5f);
  Tensor m = Tensor::empty({4}), is = Tensor::empty({4}), rm = Tensor::zeros({4}), rv = v.clone();
  expect_error_containing(
      [&] {
        ops::batchnorm_act_forward_train(fp32, x, v, v, {r16, true}, y, m, is, rm, rv, 0.1f, 1e-5f);
      },
      "batchnorm_act_forward_train: residual must be f32");
  expect_error_containing([&] { ops::relu_backward_add(fp32, r16, x, x, y); },
                          "relu_backward_add: y must be f32");
}

// An identity shortcut's input gradient: a + relu_backward(y, dy), bit for bit, on the CPU's loop
// and on the Backend's composition; aliased outputs are refused.
TEST(ReluBackwardAdd, IsReluBackwardThenAddBitForBit) {
  for (int threads : {1, 3}) {
    ops::Context ctx(Device::cpu(), threads);
    for (const Shape& s : {Shape{37, 67}, Shape{2, 5, 7, 9}, Shape{70000}}) {
      SCOPED_TRACE(str(shape_str(s), ", ", threads, " threads"));
      Tensor y = random_tensor(s, 50, -1, 1), dy = random_tensor(s, 51), a = random_tensor(s, 52);
      Tensor dx = Tensor::empty(s), dx_def = Tensor::empty(s), ref = Tensor::empty(s);
      ops::relu_backward_add(ctx, y, dy, a, dx);
      ctx.backend().ops::Backend::relu_backward_add(y, dy, a, dx_def);
      ops::relu_backward(ctx, y, dy, ref);
      ops::add(ctx, a, ref, ref);
      EXPECT_TRUE(bitwise_equal(dx, ref));
      EXPECT_TRUE(bitwise_equal(dx_def, ref));
    }
  }
  ops::Context ctx;
  Tensor y = random_tensor({8, 4}, 1), dy = random_tensor({8, 4}, 2), a = random_tensor({8, 4}, 3);
  expect_error_containing([&] { ops::relu_backward_add(ctx, y, dy, a, a); },
                          "relu_backward_add: dx must not share storage with y or a");
  Tensor short_dx = Tensor::empty({7, 4});
  expect_error_containing([&] { ops::relu_backward_add(ctx, y, dy, a, short_dx); },
                          "relu_backward_add");
}

// The row sums' AVX-512 path (picked at run time) gives the generic loops' bits: every BatchNorm op
// whose sums it runs, f32 and bf16 x, through no ReLU and through f32 and bf16 ReLU outputs, on
// widths with and without a tail of columns past the last group of 32.
TEST(BatchNormOps, AvxAndGenericRowSumsGiveTheSameBits) {
  LOCKSTEP_SKIP_WITHOUT_BF16();
  if (!ops::cpu::use_bn_avx512(true)) GTEST_SKIP() << "this CPU has no AVX-512F: one path only";
  ops::Context ctx(Device::cpu(), 3);
  ctx.set_precision(ops::Precision::BF16);
  for (const Shape& s : {Shape{2500, 40}, Shape{37, 67}, Shape{300, 64}}) {
    const std::int64_t ch = s[1];
    Tensor x32 = random_tensor(s, 80, -2, 3), x16 = Tensor::empty(s, DType::BF16);
    ops::cast(ctx, x32, x16);
    Tensor gamma = random_tensor({ch}, 81, 0.5f, 1.5f), beta = random_tensor({ch}, 82);
    Tensor dy = random_tensor(s, 83), r32 = random_tensor(s, 84, -1, 1),
           r16 = Tensor::empty(s, DType::BF16);
    ops::cast(ctx, r32, r16);
    for (const Tensor* x : {&x32, &x16}) {
      for (const Tensor* relu_y : std::initializer_list<const Tensor*>{nullptr, &r32, &r16}) {
        SCOPED_TRACE(str(shape_str(s), x == &x16 ? " bf16 x" : " f32 x",
                         relu_y == nullptr ? ", no ReLU"
                         : relu_y == &r16  ? ", bf16 y"
                                           : ", f32 y"));
        Tensor out[2][6];
        for (int avx = 0; avx < 2; ++avx) {
          ops::cpu::use_bn_avx512(avx == 1);
          Tensor y = Tensor::empty(s), mean = Tensor::empty({ch}), invstd = Tensor::empty({ch}),
                 rm = Tensor::zeros({ch}), rv = Tensor::zeros({ch}), dx = Tensor::empty(s),
                 dg = Tensor::zeros({ch}), db = Tensor::zeros({ch});
          ops::batchnorm_forward_train(ctx, *x, gamma, beta, y, mean, invstd, rm, rv, 0.1f, 1e-5f);
          if (relu_y)
            ops::batchnorm_relu_backward(ctx, *x, *relu_y, dy, gamma, mean, invstd, dx, dg, db);
          else
            ops::batchnorm_backward(ctx, *x, dy, gamma, mean, invstd, dx, dg, db);
          int k = 0;
          for (const Tensor& t : {y, mean, invstd, dx, dg, db})
            out[avx][k++] = t;
        }
        ops::cpu::use_bn_avx512(true);
        for (int k = 0; k < 6; ++k)
          EXPECT_TRUE(bitwise_equal(out[0][k], out[1][k])) << "output " << k;
      }
    }
  }
}

TEST(BatchNormEpilogue, RefusesBadArgumentsNamingTheOpAndTensor) {
  ops::Context ctx;
  Tensor x = random_tensor({8, 4}, 1), g = random_tensor({4}, 2), b = random_tensor({4}, 3);
  Tensor y = Tensor::empty({8, 4}), m = Tensor::empty({4}), is = Tensor::empty({4}),
         rm = Tensor::empty({4}), rv = Tensor::empty({4});
  ops::BatchNormEpilogue short_residual{random_tensor({7, 4}, 4), true};
  expect_error_containing(
      [&] {
        ops::batchnorm_act_forward_train(ctx, x, g, b, short_residual, y, m, is, rm, rv, 0.1f,
                                         1e-5f);
      },
      "batchnorm_act_forward_train: x is");
  ops::BatchNormEpilogue onto_residual{y, true};
  expect_error_containing(
      [&] { ops::batchnorm_act_forward_eval(ctx, x, g, b, rm, rv, 1e-5f, onto_residual, y); },
      "y must not share storage with the residual");
  Tensor y16 = Tensor::empty({8, 4}, DType::BF16);
  expect_error_containing(
      [&] { ops::batchnorm_act_forward_train(ctx, x, g, b, {}, y16, m, is, rm, rv, 0.1f, 1e-5f); },
      "y must be f32");
  Tensor dx = Tensor::empty({8, 4}), dg = Tensor::empty({4}), db = Tensor::empty({4});
  expect_error_containing([&] { ops::batchnorm_relu_backward(ctx, x, y, y, g, m, is, y, dg, db); },
                          "dx must not share storage with x or y");
}

}  // namespace
