// The GPT ops (embedding, LayerNorm, GELU tanh, causal attention) and softmax cross-entropy at a
// GPT vocabulary, against double-precision references written out here with plain loops.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "lockstep/core/error.hpp"
#include "lockstep/ops/ops.hpp"
#include "ops_test_util.hpp"

using namespace lockstep;
using lockstep::testing::all_close;
using lockstep::testing::bitwise_equal;
using lockstep::testing::expect_error_containing;
using lockstep::testing::random_tensor;
using lockstep::testing::to_double;

namespace {

Tensor tokens_tensor(std::int64_t b, std::int64_t t, std::int32_t vocab, std::uint64_t stream) {
  Philox rng(5, stream);
  std::vector<std::int32_t> v(static_cast<std::size_t>(b * t));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<std::int32_t>(rng.u32(i) % static_cast<std::uint32_t>(vocab));
  return Tensor::from_vector(v, {b, t});
}

// ---- embedding

TEST(Embedding, ForwardAddsTokenAndPositionRows) {
  ops::Context ctx;
  const std::int64_t b = 3, t = 5, v = 7, p = 8, c = 19;
  Tensor tok = tokens_tensor(b, t, static_cast<std::int32_t>(v), 1);
  Tensor wte = random_tensor({v, c}, 2), wpe = random_tensor({p, c}, 3);
  Tensor y = Tensor::empty({b, t, c});
  ops::embedding_forward(ctx, tok, wte, wpe, y);
  auto tk = tok.to_vector<std::int32_t>();
  auto te = to_double(wte), pe = to_double(wpe);
  std::vector<double> want(static_cast<std::size_t>(b * t * c));
  for (std::int64_t i = 0; i < b; ++i)
    for (std::int64_t s = 0; s < t; ++s)
      for (std::int64_t j = 0; j < c; ++j)
        want[(i * t + s) * c + j] = te[tk[i * t + s] * c + j] + pe[s * c + j];
  EXPECT_TRUE(all_close(y, want, 0, 1e-7));
}

TEST(Embedding, BackwardScatterAddsRepeatedTokensAndSumsPositionsOverTheBatch) {
  const std::int64_t b = 4, t = 6, v = 5, p = 9, c = 37;  // 24 tokens over 5 ids: many repeats
  Tensor tok = tokens_tensor(b, t, static_cast<std::int32_t>(v), 4);
  Tensor dy = random_tensor({b, t, c}, 5);
  Tensor dwte0 = random_tensor({v, c}, 6), dwpe0 = random_tensor({p, c}, 7);
  auto tk = tok.to_vector<std::int32_t>();
  auto g = to_double(dy);
  std::vector<double> want_te = to_double(dwte0), want_pe = to_double(dwpe0);
  for (std::int64_t i = 0; i < b; ++i)
    for (std::int64_t s = 0; s < t; ++s)
      for (std::int64_t j = 0; j < c; ++j) {
        want_te[tk[i * t + s] * c + j] += g[(i * t + s) * c + j];
        want_pe[s * c + j] += g[(i * t + s) * c + j];
      }
  Tensor results[2][2];
  for (int threads : {1, 2}) {
    ops::Context ctx(Device::cpu(), threads);
    Tensor dwte = dwte0.clone(), dwpe = dwpe0.clone();
    ops::embedding_backward(ctx, tok, dy, dwte, dwpe);
    EXPECT_TRUE(all_close(dwte, want_te, 1e-6, 1e-6));
    EXPECT_TRUE(all_close(dwpe, want_pe, 1e-6, 1e-6));
    results[threads - 1][0] = dwte;
    results[threads - 1][1] = dwpe;
  }
  EXPECT_TRUE(bitwise_equal(results[0][0], results[1][0]));
  EXPECT_TRUE(bitwise_equal(results[0][1], results[1][1]));
}

TEST(Embedding, TokenOutsideTheVocabularyIsAnErrorNamingItsPosition) {
  ops::Context ctx;
  Tensor tok = Tensor::from_vector(std::vector<std::int32_t>{1, 2, 3, 9}, {2, 2});
  Tensor wte = random_tensor({5, 4}, 1), wpe = random_tensor({2, 4}, 2);
  Tensor y = Tensor::empty({2, 2, 4});
  expect_error_containing([&] { ops::embedding_forward(ctx, tok, wte, wpe, y); },
                          "token id 9 at [1, 1] is outside [0, 5)");
}

TEST(Embedding, SequenceLongerThanThePositionTableIsAnError) {
  ops::Context ctx;
  Tensor tok = tokens_tensor(1, 6, 5, 1);
  Tensor wte = random_tensor({5, 4}, 1), wpe = random_tensor({4, 4}, 2);
  Tensor y = Tensor::empty({1, 6, 4});
  expect_error_containing([&] { ops::embedding_forward(ctx, tok, wte, wpe, y); },
                          "6 positions but the position embedding");
}

// ---- LayerNorm

struct LnRef {
  std::vector<double> y, mean, rstd, dx, dw, db;
};
LnRef layernorm_reference(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& dy,
                          const Tensor& dres, double eps) {
  const std::int64_t c = x.dim(-1), rows = x.numel() / c;
  auto xv = to_double(x), wv = to_double(w), bv = to_double(bias), g = to_double(dy);
  std::vector<double> rv = dres.defined() ? to_double(dres) : std::vector<double>(xv.size(), 0.0);
  LnRef r;
  r.y.resize(xv.size());
  r.dx.resize(xv.size());
  r.dw.assign(static_cast<std::size_t>(c), 0.0);
  r.db.assign(static_cast<std::size_t>(c), 0.0);
  for (std::int64_t i = 0; i < rows; ++i) {
    double m = 0, var = 0;
    for (std::int64_t j = 0; j < c; ++j)
      m += xv[i * c + j];
    m /= c;
    for (std::int64_t j = 0; j < c; ++j)
      var += (xv[i * c + j] - m) * (xv[i * c + j] - m);
    var /= c;
    const double s = 1.0 / std::sqrt(var + eps);
    r.mean.push_back(m);
    r.rstd.push_back(s);
    double a = 0, bsum = 0;
    for (std::int64_t j = 0; j < c; ++j) {
      const double xh = (xv[i * c + j] - m) * s;
      r.y[i * c + j] = xh * wv[j] + bv[j];
      a += g[i * c + j] * wv[j];
      bsum += g[i * c + j] * wv[j] * xh;
      r.dw[j] += g[i * c + j] * xh;
      r.db[j] += g[i * c + j];
    }
    a /= c;
    bsum /= c;
    for (std::int64_t j = 0; j < c; ++j) {
      const double xh = (xv[i * c + j] - m) * s;
      r.dx[i * c + j] = rv[i * c + j] + s * (g[i * c + j] * wv[j] - a - xh * bsum);
    }
  }
  return r;
}

TEST(LayerNorm, ForwardAndBackwardMatchDoubleReference) {
  // 75 rows (not a multiple of the 32-row reduction block), 45 features (not of the SIMD width),
  // rows offset far from zero (the variance must not cancel).
  const std::int64_t b = 3, t = 25, c = 45;
  Tensor x = random_tensor({b, t, c}, 10, 95.0f, 105.0f);
  Tensor w = random_tensor({c}, 11, 0.5f, 1.5f), bias = random_tensor({c}, 12);
  Tensor dy = random_tensor({b, t, c}, 13), dres = random_tensor({b, t, c}, 14);
  const float eps = 1e-5f;
  for (bool with_residual : {false, true}) {
    SCOPED_TRACE(with_residual ? "with residual gradient" : "without residual gradient");
    LnRef r = layernorm_reference(x, w, bias, dy, with_residual ? dres : Tensor(), eps);
    ops::Context ctx(Device::cpu(), 2);
    Tensor y = Tensor::empty(x.shape()), mean = Tensor::empty({b * t}),
           rstd = Tensor::empty({b * t});
    ops::layernorm_forward(ctx, x, w, bias, eps, y, mean, rstd);
    EXPECT_TRUE(all_close(y, r.y, 1e-4, 1e-4));  // x ~ 100: float x - mean keeps ~5 digits
    EXPECT_TRUE(all_close(mean, r.mean, 1e-6, 0));
    EXPECT_TRUE(all_close(rstd, r.rstd, 1e-4, 0));
    Tensor dx = Tensor::empty(x.shape());
    Tensor dw = Tensor::zeros({c}), db = Tensor::zeros({c});
    ops::layernorm_backward(ctx, x, dy, w, mean, rstd, with_residual ? dres : Tensor(), dx, dw, db);
    EXPECT_TRUE(all_close(dx, r.dx, 1e-3, 1e-3));
    EXPECT_TRUE(all_close(dw, r.dw, 1e-3, 1e-3));
    EXPECT_TRUE(all_close(db, r.db, 1e-5, 1e-5));
  }
}

TEST(LayerNorm, BackwardAccumulatesParameterGradientsAndMayAddTheResidualInPlace) {
  const std::int64_t rows = 40, c = 33;
  Tensor x = random_tensor({rows, c}, 20), w = random_tensor({c}, 21),
         bias = random_tensor({c}, 22);
  Tensor dy = random_tensor({rows, c}, 23), dres = random_tensor({rows, c}, 24);
  LnRef r = layernorm_reference(x, w, bias, dy, dres, 1e-5);
  ops::Context ctx;
  Tensor y = Tensor::empty({rows, c}), mean = Tensor::empty({rows}), rstd = Tensor::empty({rows});
  ops::layernorm_forward(ctx, x, w, bias, 1e-5f, y, mean, rstd);
  Tensor dw0 = random_tensor({c}, 25), db0 = random_tensor({c}, 26);
  Tensor dw = dw0.clone(), db = db0.clone();
  Tensor dx = dres.clone();  // dx is the residual gradient: added in place
  ops::layernorm_backward(ctx, x, dy, w, mean, rstd, dx, dx, dw, db);
  EXPECT_TRUE(all_close(dx, r.dx, 1e-5, 1e-5));
  std::vector<double> want_w = to_double(dw0), want_b = to_double(db0);
  for (std::int64_t j = 0; j < c; ++j) {
    want_w[j] += r.dw[j];
    want_b[j] += r.db[j];
  }
  EXPECT_TRUE(all_close(dw, want_w, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(db, want_b, 1e-5, 1e-5));
}

TEST(LayerNorm, ResultsAreBitwiseIndependentOfThreadCount) {
  const std::int64_t rows = 300, c = 128;
  Tensor x = random_tensor({rows, c}, 30), w = random_tensor({c}, 31),
         bias = random_tensor({c}, 32);
  Tensor dy = random_tensor({rows, c}, 33);
  std::vector<Tensor> out;
  for (int threads : {1, 2}) {
    ops::Context ctx(Device::cpu(), threads);
    Tensor y = Tensor::empty({rows, c}), mean = Tensor::empty({rows}), rstd = Tensor::empty({rows});
    ops::layernorm_forward(ctx, x, w, bias, 1e-5f, y, mean, rstd);
    Tensor dx = Tensor::empty({rows, c}), dw = Tensor::zeros({c}), db = Tensor::zeros({c});
    ops::layernorm_backward(ctx, x, dy, w, mean, rstd, Tensor(), dx, dw, db);
    out.insert(out.end(), {y, dx, dw, db});
  }
  for (int i = 0; i < 4; ++i)
    EXPECT_TRUE(bitwise_equal(out[i], out[i + 4])) << "output " << i;
}

// ---- GELU (tanh form)

TEST(GeluTanh, ForwardAndBackwardMatchDoubleReference) {
  // Wide range: the tails saturate (tanh -> +-1), the middle is where the curvature is.
  const std::int64_t n = 1001;
  Tensor x = random_tensor({n}, 40, -12.0f, 12.0f), dy = random_tensor({n}, 41);
  ops::Context ctx;
  Tensor y = Tensor::empty({n}), dx = Tensor::empty({n});
  ops::gelu_tanh_forward(ctx, x, y);
  ops::gelu_tanh_backward(ctx, x, dy, dx);
  auto xv = to_double(x), g = to_double(dy);
  std::vector<double> wy, wdx;
  const double k = std::sqrt(2.0 / M_PI);
  for (std::size_t i = 0; i < xv.size(); ++i) {
    const double v = xv[i], u = k * (v + 0.044715 * v * v * v), th = std::tanh(u);
    wy.push_back(0.5 * v * (1 + th));
    wdx.push_back(g[i] *
                  (0.5 * (1 + th) + 0.5 * v * (1 - th * th) * k * (1 + 3 * 0.044715 * v * v)));
  }
  EXPECT_TRUE(all_close(y, wy, 1e-6, 1e-6));
  EXPECT_TRUE(all_close(dx, wdx, 1e-6, 1e-6));
}

// ---- causal attention

struct AttnRef {
  std::vector<double> out, dqkv;
};
// Plain O(T^2) attention per (batch, head) in double, with the textbook softmax backward.
AttnRef attention_reference(const Tensor& qkv, const Tensor& dout, int heads) {
  const std::int64_t nb = qkv.dim(0), t = qkv.dim(1), c = qkv.dim(2) / 3, d = c / heads;
  auto in = to_double(qkv), g = to_double(dout);
  AttnRef r;
  r.out.assign(static_cast<std::size_t>(nb * t * c), 0.0);
  r.dqkv.assign(in.size(), 0.0);
  auto at = [&](std::int64_t b, std::int64_t s, std::int64_t which, std::int64_t h,
                std::int64_t j) { return ((b * t + s) * 3 + which) * c + h * d + j; };
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (std::int64_t b = 0; b < nb; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t i = 0; i < t; ++i) {
        std::vector<double> p(static_cast<std::size_t>(i + 1));
        double mx = -1e300;
        for (std::int64_t s = 0; s <= i; ++s) {
          double dot = 0;
          for (std::int64_t j = 0; j < d; ++j)
            dot += in[at(b, i, 0, h, j)] * in[at(b, s, 1, h, j)];
          p[s] = dot * scale;
          mx = std::max(mx, p[s]);
        }
        double sum = 0;
        for (auto& e : p)
          sum += (e = std::exp(e - mx));
        for (auto& e : p)
          e /= sum;
        std::vector<double> dp(p.size());
        double dot_pdp = 0;
        for (std::int64_t s = 0; s <= i; ++s) {
          for (std::int64_t j = 0; j < d; ++j) {
            r.out[(b * t + i) * c + h * d + j] += p[s] * in[at(b, s, 2, h, j)];
            dp[s] += g[(b * t + i) * c + h * d + j] * in[at(b, s, 2, h, j)];
            r.dqkv[at(b, s, 2, h, j)] += p[s] * g[(b * t + i) * c + h * d + j];
          }
          dot_pdp += p[s] * dp[s];
        }
        for (std::int64_t s = 0; s <= i; ++s) {
          const double ds = p[s] * (dp[s] - dot_pdp) * scale;
          for (std::int64_t j = 0; j < d; ++j) {
            r.dqkv[at(b, i, 0, h, j)] += ds * in[at(b, s, 1, h, j)];
            r.dqkv[at(b, s, 1, h, j)] += ds * in[at(b, i, 0, h, j)];
          }
        }
      }
  return r;
}

struct AttnCase {
  std::int64_t b, t, c;
  int heads;
};

TEST(Attention, ForwardAndBackwardMatchDoubleReference) {
  // T crosses the 64-row query blocks (130 = 2 full blocks + 2 rows), head widths 5 and 24 are
  // not multiples of the SIMD width, and one head covers the whole width.
  for (AttnCase k : {AttnCase{2, 7, 10, 2}, AttnCase{1, 130, 48, 2}, AttnCase{2, 70, 24, 1},
                     AttnCase{1, 65, 36, 3}}) {
    SCOPED_TRACE(::testing::Message()
                 << "B " << k.b << " T " << k.t << " C " << k.c << " heads " << k.heads);
    Tensor qkv = random_tensor({k.b, k.t, 3 * k.c}, 50, -2.0f, 2.0f);
    Tensor dout = random_tensor({k.b, k.t, k.c}, 51);
    AttnRef r = attention_reference(qkv, dout, k.heads);
    ops::Context ctx(Device::cpu(), 2);
    Tensor out = Tensor::empty({k.b, k.t, k.c}), lse = Tensor::empty({k.b, k.heads, k.t});
    ops::attention_forward(ctx, qkv, k.heads, out, lse);
    EXPECT_TRUE(all_close(out, r.out, 1e-5, 1e-5));
    Tensor dqkv = random_tensor({k.b, k.t, 3 * k.c}, 52);  // overwritten, whatever it held
    ops::attention_backward(ctx, qkv, out, dout, lse, k.heads, dqkv);
    EXPECT_TRUE(all_close(dqkv, r.dqkv, 1e-4, 1e-5));
  }
}

TEST(Attention, LogSumExpIsThatOfTheScaledCausalScores) {
  const std::int64_t t = 9, c = 8;
  Tensor qkv = random_tensor({1, t, 3 * c}, 60, -3.0f, 3.0f);
  ops::Context ctx;
  Tensor out = Tensor::empty({1, t, c}), lse = Tensor::empty({1, 1, t});
  ops::attention_forward(ctx, qkv, 1, out, lse);
  auto in = to_double(qkv);
  std::vector<double> want;
  for (std::int64_t i = 0; i < t; ++i) {
    double sum = 0;
    for (std::int64_t s = 0; s <= i; ++s) {
      double dot = 0;
      for (std::int64_t j = 0; j < c; ++j)
        dot += in[i * 3 * c + j] * in[s * 3 * c + c + j];
      sum += std::exp(dot / std::sqrt(static_cast<double>(c)));
    }
    want.push_back(std::log(sum));
  }
  EXPECT_TRUE(all_close(lse, want, 1e-5, 1e-5));
}

TEST(Attention, FutureTokensDoNotChangeEarlierOutputs) {
  const std::int64_t t = 80, c = 16;
  Tensor qkv = random_tensor({1, t, 3 * c}, 70);
  Tensor changed = qkv.clone();
  float* p = changed.data<float>();
  for (std::int64_t i = 3 * c * 50; i < 3 * c * t; ++i)
    p[i] = p[i] * -3.0f + 1.0f;  // positions 50.. rewritten
  ops::Context ctx;
  Tensor o1 = Tensor::empty({1, t, c}), o2 = Tensor::empty({1, t, c});
  Tensor l1 = Tensor::empty({1, 2, t}), l2 = Tensor::empty({1, 2, t});
  ops::attention_forward(ctx, qkv, 2, o1, l1);
  ops::attention_forward(ctx, changed, 2, o2, l2);
  EXPECT_TRUE(bitwise_equal(o1.view({t, c}).slice(0, 50), o2.view({t, c}).slice(0, 50)));
  EXPECT_FALSE(bitwise_equal(o1.view({t, c}).slice(50, t), o2.view({t, c}).slice(50, t)));
}

TEST(Attention, ResultsAreBitwiseIndependentOfThreadCount) {
  const std::int64_t b = 3, t = 100, c = 32;
  const int heads = 4;
  Tensor qkv = random_tensor({b, t, 3 * c}, 80), dout = random_tensor({b, t, c}, 81);
  std::vector<Tensor> res;
  for (int threads : {1, 2}) {
    ops::Context ctx(Device::cpu(), threads);
    Tensor out = Tensor::empty({b, t, c}), lse = Tensor::empty({b, heads, t});
    Tensor dqkv = Tensor::empty({b, t, 3 * c});
    ops::attention_forward(ctx, qkv, heads, out, lse);
    ops::attention_backward(ctx, qkv, out, dout, lse, heads, dqkv);
    res.insert(res.end(), {out, lse, dqkv});
  }
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(bitwise_equal(res[i], res[i + 3])) << "output " << i;
}

TEST(Attention, WidthNotDivisibleByHeadsIsAnError) {
  ops::Context ctx;
  Tensor qkv = random_tensor({1, 4, 30}, 1), out = Tensor::empty({1, 4, 10});
  Tensor lse = Tensor::empty({1, 3, 4});
  expect_error_containing([&] { ops::attention_forward(ctx, qkv, 3, out, lse); },
                          "C divisible by heads = 3");
}

// ---- the attention kernel choice (train.attention): cuDNN's fused attention is CUDA's alone.
// On the CPU and on the emulated GPU (whose kernels are the CPU's), auto is the reference, bit
// for bit, and cudnn is refused saying where and why; the names parse both ways.
std::vector<Device> devices_without_cudnn() {
  std::vector<Device> d{Device::cpu()};
  if (emu_available()) d.push_back(Device::emu(0));
  return d;
}

TEST(Attention, AutoIsTheReferenceBitForBitWhereThereIsNoCudnn) {
  const std::int64_t b = 2, t = 37, c = 32;
  const int heads = 2;
  Tensor qkv = random_tensor({b, t, 3 * c}, 90), dout = random_tensor({b, t, c}, 91);
  for (const Device& device : devices_without_cudnn()) {
    SCOPED_TRACE(device.str());
    ops::Context ctx(device);
    const ops::AttentionChoice choice =
        ops::choose_attention(ctx, ops::AttentionKernel::Auto, b, t, heads, c / heads);
    EXPECT_EQ(choice.kernel, ops::AttentionKernel::Reference);
    EXPECT_NE(choice.detail.find("CUDA"), std::string::npos) << choice.detail;
    std::vector<Tensor> res;
    for (auto kernel : {ops::AttentionKernel::Auto, ops::AttentionKernel::Reference}) {
      Tensor out = Tensor::empty({b, t, c}, DType::F32, device);
      Tensor lse = Tensor::empty({b, heads, t}, DType::F32, device);
      Tensor dqkv = Tensor::empty({b, t, 3 * c}, DType::F32, device);
      Tensor q = qkv.to(device), d = dout.to(device);
      ops::attention_forward(ctx, q, heads, out, lse, kernel);
      ops::attention_backward(ctx, q, out, d, lse, heads, dqkv, kernel);
      for (const Tensor& x : {out, lse, dqkv})
        res.push_back(x.to(Device::cpu()));
    }
    for (int i = 0; i < 3; ++i)
      EXPECT_TRUE(bitwise_equal(res[i], res[i + 3])) << "output " << i;
  }
}

TEST(Attention, CudnnWhereItCannotRunIsAnErrorNamingTheDeviceAndWhy) {
  const std::int64_t b = 1, t = 8, c = 16;
  for (const Device& device : devices_without_cudnn()) {
    SCOPED_TRACE(device.str());
    ops::Context ctx(device);
    const std::string where = "cannot run on " + device.str();
    expect_error_containing(
        [&] { (void)ops::choose_attention(ctx, ops::AttentionKernel::Cudnn, b, t, 2, c / 2); },
        where);
    expect_error_containing(
        [&] { (void)ops::choose_attention(ctx, ops::AttentionKernel::Cudnn, b, t, 2, c / 2); },
        "CUDA GPUs only");
    Tensor qkv = random_tensor({b, t, 3 * c}, 92).to(device);
    Tensor out = Tensor::empty({b, t, c}, DType::F32, device);
    Tensor lse = Tensor::empty({b, 2, t}, DType::F32, device);
    expect_error_containing(
        [&] { ops::attention_forward(ctx, qkv, 2, out, lse, ops::AttentionKernel::Cudnn); }, where);
    // Reference and naive are what was asked, wherever.
    EXPECT_EQ(ops::choose_attention(ctx, ops::AttentionKernel::Reference, b, t, 2, 8).kernel,
              ops::AttentionKernel::Reference);
    EXPECT_EQ(ops::choose_attention(ctx, ops::AttentionKernel::Naive, b, t, 2, 8).kernel,
              ops::AttentionKernel::Naive);
  }
}

TEST(Attention, KernelNamesParseBackAndAnUnknownOneListsTheChoices) {
  for (auto k : {ops::AttentionKernel::Auto, ops::AttentionKernel::Reference,
                 ops::AttentionKernel::Cudnn, ops::AttentionKernel::Naive})
    EXPECT_EQ(ops::attention_kernel_from_name(ops::attention_kernel_name(k)), k);
  expect_error_containing([] { (void)ops::attention_kernel_from_name("flash"); },
                          "expected auto, reference, cudnn or naive");
}

// ---- cross-entropy at a GPT vocabulary

TEST(SoftmaxXent, GptVocabularyMatchesDoubleReferenceAlsoInPlace) {
  const std::int64_t n = 6, v = 50257;
  Tensor logits = random_tensor({n, v}, 90, -8.0f, 8.0f);
  std::vector<std::int32_t> lab = {0, 50256, 17, 25000, 3, 49999};
  Tensor labels = Tensor::from_vector(lab, {n});
  auto x = to_double(logits);
  std::vector<double> want_p(x.size());
  double want_loss = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    double mx = -1e300, sum = 0;
    for (std::int64_t j = 0; j < v; ++j)
      mx = std::max(mx, x[i * v + j]);
    for (std::int64_t j = 0; j < v; ++j)
      sum += std::exp(x[i * v + j] - mx);
    for (std::int64_t j = 0; j < v; ++j)
      want_p[i * v + j] = std::exp(x[i * v + j] - mx) / sum;
    want_loss += (std::log(sum) - (x[i * v + lab[i]] - mx)) / n;
  }
  std::vector<double> want_d = want_p;
  for (std::int64_t i = 0; i < n; ++i)
    want_d[i * v + lab[i]] -= 1.0;
  for (double& d : want_d)
    d *= 0.5;
  ops::Context ctx(Device::cpu(), 2);
  Tensor probs = Tensor::empty({n, v}), loss = Tensor::empty({1}), d = Tensor::empty({n, v});
  ops::softmax_xent_forward(ctx, logits, labels, probs, loss);
  EXPECT_NEAR(loss.item(), want_loss, 1e-5 * want_loss);
  EXPECT_TRUE(all_close(probs, want_p, 1e-5, 1e-12));
  ops::softmax_xent_backward(ctx, probs, labels, 0.5f, d);
  EXPECT_TRUE(all_close(d, want_d, 1e-5, 1e-12));
  // In place: probabilities over the logits, the gradient over the probabilities.
  Tensor inplace = logits.clone();
  Tensor loss2 = Tensor::empty({1});
  ops::softmax_xent_forward(ctx, inplace, labels, inplace, loss2);
  EXPECT_EQ(loss2.item(), loss.item());
  EXPECT_TRUE(bitwise_equal(inplace, probs));
  ops::softmax_xent_backward(ctx, inplace, labels, 0.5f, inplace);
  EXPECT_TRUE(bitwise_equal(inplace, d));
}

}  // namespace
