// The fused layer ops in a GPT (the residual sum with ln_2, the linear layers' GEMM + bias and
// c_fc's GELU in one op, c_proj's input gradient with the GELU backward in one op) change no bit
// of a training step: the losses and every gradient equal those of the separate ops the layers
// called before (written out below with ops:: calls, in the order they ran), in fp32 and bf16 on
// the CPU and on the emulated GPU, with train.recompute = none, gelu and block. Under bf16 the
// separate ops pass the block's activations in bf16 (ops.hpp, "Activations in bf16"), each linear
// output made in f32 and cast once, the residual stream in f32.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "lockstep/core/rng.hpp"
#include "lockstep/nn/layers.hpp"
#include "lockstep/nn/model.hpp"
#include "lockstep/nn/transformer.hpp"
#include "lockstep/ops/ops.hpp"
#include "support/device_test_support.hpp"
#include "support/precision_reference.hpp"

using namespace lockstep;
using namespace lockstep::nn;

namespace {

// T = 70 crosses the CPU attention's 64-row query blocks. The table unpadded (pad_vocab=1), so the
// separate ops below are the head's plain GEMMs; that the default padding changes no bit is
// FusedLoss's to check (test_recompute.cpp).
constexpr const char* kSpec = "gpt(layers=3,heads=2,dim=32,pad_vocab=1)";
constexpr std::int64_t kLayers = 3, kHeads = 2, kDim = 32, kVocab = 40, kBatch = 2, kSeq = 70;

Tensor tokens(std::uint64_t seed) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(kBatch * kSeq));
  Philox rng(seed, 29);
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<std::int32_t>(rng.u32(i) % static_cast<std::uint32_t>(kVocab));
  return Tensor::from_vector(v, {kBatch, kSeq});
}

struct Outcome {
  float loss = 0.0f;
  std::map<std::string, std::vector<float>> grads;
};

// One training step of the GPT as the separate ops computed it, on ctx, from the model's
// parameter values: nothing of nn:: runs.
class SeparateOps {
 public:
  SeparateOps(ops::Context& ctx, const Model& model)
      : ctx_(ctx), act_(ctx.precision() == ops::Precision::BF16 ? DType::BF16 : DType::F32) {
    for (const Parameter* p : model.parameters()) {
      value_[p->name] = p->value.to(ctx.device());
      grad_[p->name] = zeros(p->value.shape());
    }
  }

  Outcome step(const Tensor& x_host, const Tensor& y_host) {
    const Tensor x = x_host.to(ctx_.device()), labels = y_host.to(ctx_.device());
    const std::int64_t n = kBatch * kSeq, c = kDim;
    Tensor h = empty({kBatch, kSeq, c});
    ops::embedding_forward(ctx_, x, value_["0.wte"], value_["0.wpe"], h);
    std::vector<Block> blocks(kLayers);
    for (std::int64_t l = 0; l < kLayers; ++l) {
      Block& k = blocks[l];
      const std::string id = std::to_string(l + 1) + ".";
      k.x = h;
      k.ln1 = layernorm(k.x, id + "ln_1.", k.s1);
      k.qkv = linear(k.ln1.view({n, c}), id + "attn.c_attn.").view({kBatch, kSeq, 3 * c});
      k.att = empty({kBatch, kSeq, c}, act_);
      k.lse = empty({kBatch, kHeads, kSeq});
      ops::attention_forward(ctx_, k.qkv, kHeads, k.att, k.lse);
      Tensor a = linear(k.att.view({n, c}), id + "attn.c_proj.");
      k.x1 = empty({kBatch, kSeq, c});
      ops::add(ctx_, k.x, a.view({kBatch, kSeq, c}), k.x1);
      k.ln2 = layernorm(k.x1, id + "ln_2.", k.s2);
      k.fc = linear(k.ln2.view({n, c}), id + "mlp.c_fc.");
      k.act = empty({n, 4 * c}, act_);
      ops::gelu_tanh_forward(ctx_, k.fc, k.act);
      Tensor m = linear(k.act, id + "mlp.c_proj.");
      h = empty({kBatch, kSeq, c});
      ops::add(ctx_, k.x1, m.view({kBatch, kSeq, c}), h);
    }
    const std::string f = std::to_string(kLayers + 1) + ".";
    Stats sf;
    Tensor hf = layernorm(h, f, sf, DType::F32).view({n, c});  // the head's input stays f32
    Tensor logits = empty({n, kVocab}), loss = empty({1});
    ops::gemm(ctx_, false, true, 1.0f, hf, value_["0.wte"], 0.0f, logits);
    Tensor probs = empty({n, kVocab}), dlogits = empty({n, kVocab});
    ops::softmax_xent_forward(ctx_, logits, labels.view({n}), probs, loss);
    ops::softmax_xent_backward(ctx_, probs, labels.view({n}), 1.0f / static_cast<float>(n),
                               dlogits);

    // backward: the head's table gradient first, the embedding's scatter last
    ops::gemm(ctx_, true, false, 1.0f, dlogits, hf, 1.0f, grad_["0.wte"]);
    Tensor dhf = empty({n, c});
    ops::gemm(ctx_, false, false, 1.0f, dlogits, value_["0.wte"], 0.0f, dhf);
    Tensor dh = layernorm_backward(h, dhf.view({kBatch, kSeq, c}), f, sf, Tensor());
    for (std::int64_t l = kLayers - 1; l >= 0; --l) {
      Block& k = blocks[l];
      const std::string id = std::to_string(l + 1) + ".";
      Tensor dact = linear_backward(dh.view({n, c}), k.act, id + "mlp.c_proj.");
      Tensor dfc = empty({n, 4 * c}, act_);
      ops::gelu_tanh_backward(ctx_, k.fc, dact, dfc);
      Tensor dln2 = linear_backward(dfc, k.ln2.view({n, c}), id + "mlp.c_fc.");
      Tensor dx1 = layernorm_backward(k.x1, dln2.view({kBatch, kSeq, c}), id + "ln_2.", k.s2, dh);
      Tensor datt = linear_backward(dx1.view({n, c}), k.att.view({n, c}), id + "attn.c_proj.");
      Tensor dqkv = empty({kBatch, kSeq, 3 * c}, act_);
      ops::attention_backward(ctx_, k.qkv, k.att, datt.view({kBatch, kSeq, c}), k.lse, kHeads,
                              dqkv);
      Tensor dln1 = linear_backward(dqkv.view({n, 3 * c}), k.ln1.view({n, c}), id + "attn.c_attn.");
      dh = layernorm_backward(k.x, dln1.view({kBatch, kSeq, c}), id + "ln_1.", k.s1, dx1);
    }
    ops::embedding_backward(ctx_, x, dh, grad_["0.wte"], grad_["0.wpe"]);

    Outcome out;
    out.loss = loss.to(Device::cpu()).item();
    for (auto& [name, g] : grad_)
      out.grads[name] = g.to(Device::cpu()).to_vector<float>();
    return out;
  }

 private:
  struct Stats {
    Tensor mean, rstd;
  };
  struct Block {
    Tensor x, ln1, qkv, att, lse, x1, ln2, fc, act;
    Stats s1, s2;
  };

  Tensor empty(const Shape& s, DType dtype = DType::F32) {
    return Tensor::empty(s, dtype, ctx_.device());
  }
  Tensor zeros(const Shape& s) {
    Tensor t = empty(s);
    ops::fill(ctx_, t, 0.0f);
    return t;
  }

  // y in the block's activation dtype unless told.
  Tensor layernorm(const Tensor& x, const std::string& name, Stats& st) {
    return layernorm(x, name, st, act_);
  }
  Tensor layernorm(const Tensor& x, const std::string& name, Stats& st, DType dtype) {
    const std::int64_t rows = x.numel() / kDim;
    Tensor y = empty(x.shape(), dtype);
    st.mean = empty({rows});
    st.rstd = empty({rows});
    ops::layernorm_forward(ctx_, x, value_[name + "weight"], value_[name + "bias"], 1e-5f, y,
                           st.mean, st.rstd);
    return y;
  }

  Tensor layernorm_backward(const Tensor& x, const Tensor& dy, const std::string& name,
                            const Stats& st, const Tensor& dresidual) {
    Tensor dx = empty(x.shape());
    ops::layernorm_backward(ctx_, x, dy, value_[name + "weight"], st.mean, st.rstd, dresidual, dx,
                            grad_[name + "weight"], grad_[name + "bias"]);
    return dx;
  }

  // y = x W^T, then += b (f32 x: a bf16 context's GEMM rounds it, as the layer's cast did), in
  // f32, then rounded to the activation dtype.
  Tensor linear(const Tensor& x, const std::string& name) {
    const Tensor& w = value_[name + "weight"];
    Tensor y = empty({x.dim(0), w.dim(0)});
    ops::gemm(ctx_, false, true, 1.0f, x, w, 0.0f, y);
    ops::add_row_bias(ctx_, y, value_[name + "bias"]);
    if (act_ == DType::F32) return y;
    Tensor y16 = empty(y.shape(), act_);
    ops::cast(ctx_, y, y16);
    return y16;
  }

  // The weight and bias gradients overwrite (zero_grad leaves them stale); returns dy W, in x's
  // dtype (the input gradient of a bf16 activation is one).
  Tensor linear_backward(const Tensor& dy, const Tensor& x, const std::string& name) {
    const Tensor& w = value_[name + "weight"];
    ops::gemm(ctx_, true, false, 1.0f, dy, x, 0.0f, grad_[name + "weight"]);
    ops::fill(ctx_, grad_[name + "bias"], 0.0f);
    ops::sum_rows(ctx_, dy, grad_[name + "bias"]);
    Tensor dx = empty({dy.dim(0), w.dim(1)}, x.dtype());
    ops::gemm(ctx_, false, false, 1.0f, dy, w, 0.0f, dx);
    return dx;
  }

  ops::Context& ctx_;
  const DType act_;  // the activations between a block's layers
  std::map<std::string, Tensor> value_, grad_;
};

// The model's step on ctx: a first step on other tokens, then an evaluation forward (whose caches
// the next training forward replaces), then the step that is compared.
Outcome model_step(ops::Context& ctx, Model& m, Recompute mode) {
  set_recompute(m, mode);
  SoftmaxCrossEntropy loss = SoftmaxCrossEntropy::for_training(m);
  SoftmaxCrossEntropy eval_loss;
  const float scale = 1.0f / static_cast<float>(kBatch * kSeq);
  Outcome out;
  for (std::uint64_t step = 0; step < 2; ++step) {
    Tensor x = tokens(40 + step).to(ctx.device());
    Tensor y = tokens(50 + step).view({kBatch * kSeq}).to(ctx.device());
    m.zero_grad(ctx);
    m.set_training(true);
    out.loss = m.forward_loss(ctx, x, y, loss, scale).to(Device::cpu()).item();
    m.backward_loss(ctx);
    if (step == 0) {
      m.set_training(false);
      eval_loss.forward(ctx, m.forward(ctx, tokens(60).to(ctx.device())), y);
    }
  }
  for (Parameter* p : m.parameters())
    out.grads[p->name] = p->grad.to(Device::cpu()).to_vector<float>();
  return out;
}

void expect_bitwise(const Outcome& want, const Outcome& got, const std::string& what) {
  EXPECT_EQ(std::memcmp(&want.loss, &got.loss, sizeof(float)), 0)
      << what << ": loss " << got.loss << ", separate ops " << want.loss;
  ASSERT_EQ(want.grads.size(), got.grads.size()) << what;
  for (const auto& [name, w] : want.grads) {
    const std::vector<float>& g = got.grads.at(name);
    ASSERT_EQ(w.size(), g.size()) << what << ": " << name;
    std::size_t differ = 0;
    for (std::size_t i = 0; i < w.size(); ++i)
      differ += std::memcmp(&w[i], &g[i], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << what << ": gradient of " << name << " differs in " << differ << " of "
                          << w.size() << " elements";
  }
}

// The separate ops' outcome on the model's parameters, with the tokens of model_step's last step.
Outcome separate_ops_step(ops::Context& ctx, const Model& m) {
  return SeparateOps(ctx, m).step(tokens(41), tokens(51).view({kBatch * kSeq}));
}

void check_every_mode(ops::Context& model_ctx, ops::Context& reference_ctx,
                      const std::string& where) {
  Model m = Model::build(kSpec, {kSeq}, kVocab, 31, model_ctx.device());
  const Outcome want = separate_ops_step(reference_ctx, m);
  // The step trained: a loss near ln V and gradients that are not all zero.
  ASSERT_NEAR(want.loss, std::log(static_cast<float>(kVocab)), 0.2);
  double sum = 0.0;
  for (float g : want.grads.at("2.mlp.c_fc.bias"))
    sum += std::abs(g);
  ASSERT_GT(sum, 0.0);
  for (Recompute mode : {Recompute::None, Recompute::Gelu, Recompute::Block}) {
    const char* name = mode == Recompute::None   ? "none"
                       : mode == Recompute::Gelu ? "gelu"
                                                 : "block";
    expect_bitwise(want, model_step(model_ctx, m, mode), where + ", recompute = " + name);
  }
}

}  // namespace

TEST(FusedLayers, AGptStepIsBitwiseTheSeparateOpsOnTheCpu) {
  ops::Context ctx(Device::cpu(), 2);
  check_every_mode(ctx, ctx, "cpu fp32");
}

TEST(FusedLayers, AGptStepIsBitwiseTheSeparateOpsOnTheCpuUnderBf16) {
  LOCKSTEP_SKIP_WITHOUT_BF16();
  ops::Context ctx(Device::cpu(), 2);
  ctx.set_precision(ops::Precision::BF16);
  check_every_mode(ctx, ctx, "cpu bf16");
}

// The emulated GPU's kernels are the CPU's: its model step is the CPU's separate ops, bit for bit.
TEST(FusedLayers, AGptStepOnTheEmulatedGpuIsBitwiseTheSeparateOpsOnTheCpu) {
  const std::string why = lockstep::testing::device_skip_reason("emu");
  if (!why.empty()) GTEST_SKIP() << why;
  ops::Context cpu(Device::cpu(), 1);
  ops::Context emu(Device::emu(0));
  check_every_mode(emu, cpu, "emu fp32");
  if (lockstep::testing::bf16_unavailable().empty()) {
    cpu.set_precision(ops::Precision::BF16);
    emu.set_precision(ops::Precision::BF16);
    check_every_mode(emu, cpu, "emu bf16");
  }
}
