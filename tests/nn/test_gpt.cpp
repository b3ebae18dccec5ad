// The GPT layers and model: finite-difference gradients of every layer, a float64
// re-implementation of a small GPT (forward loss and every parameter gradient, plain loops, no
// lockstep ops), the initial loss, overfitting one batch, the causal mask, the tied LM head, the
// grad-ready hook's order, and the spec's presets and errors.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "gradcheck.hpp"
#include "lockstep/core/rng.hpp"
#include "lockstep/nn/layers.hpp"
#include "lockstep/nn/model.hpp"

using namespace lockstep;
using namespace lockstep::nn;
using lockstep::testing::check_gradients;
using lockstep::testing::GradCheckOptions;
using lockstep::testing::init;
using lockstep::testing::random_tensor;

namespace {

// Every parameter U(-scale, scale) (biases and LayerNorm affine included), so that no term of
// the gradient hides behind an initial zero or one.
void randomise(const std::vector<Parameter*>& params, float scale, std::uint64_t seed) {
  for (std::size_t k = 0; k < params.size(); ++k) {
    Tensor& v = params[k]->value;
    Philox(seed, k).fill_uniform(v.data<float>(), v.numel(), -scale, scale);
  }
}

Tensor tokens(std::int64_t b, std::int64_t t, std::int64_t vocab, std::uint64_t seed) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(b * t));
  Philox rng(seed, 17);
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<std::int32_t>(rng.u32(i) % static_cast<std::uint32_t>(vocab));
  return Tensor::from_vector(v, {b, t});
}

std::string build_error(const std::string& spec, const Shape& sample, std::int64_t classes) {
  try {
    Model::build(spec, sample, classes, 1);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// ---------------------------------------------------------------- layer gradients

TEST(GptLayerGradients, LayerNormMatchesFiniteDifferences) {
  ops::Context ctx;
  LayerNorm ln(6);
  std::vector<Parameter*> params;
  ln.collect_parameters("", params);
  randomise(params, 1.0f, 3);
  check_gradients(ctx, ln, random_tensor({2, 3, 6}, 1));
}

TEST(GptLayerGradients, CausalSelfAttentionMatchesFiniteDifferences) {
  ops::Context ctx;
  CausalSelfAttention attn(8, 2, 1);
  init(attn);
  std::vector<Parameter*> params;
  attn.collect_parameters("", params);
  randomise(params, 0.5f, 4);
  check_gradients(ctx, attn, random_tensor({2, 5, 8}, 2));
}

TEST(GptLayerGradients, MlpMatchesFiniteDifferences) {
  ops::Context ctx;
  Mlp mlp(4, 1);
  std::vector<Parameter*> params;
  mlp.collect_parameters("", params);
  randomise(params, 0.6f, 5);
  check_gradients(ctx, mlp, random_tensor({2, 3, 4}, 3));
}

TEST(GptLayerGradients, TransformerBlockMatchesFiniteDifferences) {
  ops::Context ctx;
  TransformerBlock block(8, 2, 2);
  std::vector<Parameter*> params;
  block.collect_parameters("", params);
  randomise(params, 0.4f, 6);
  check_gradients(ctx, block, random_tensor({2, 4, 8}, 4));
}

TEST(GptLayerGradients, EmbeddingTablesMatchFiniteDifferences) {
  ops::Context ctx;
  Embedding emb(5, 6, 3);
  init(emb);
  // 8 tokens over 5 ids: repeated ids must sum their rows' gradients.
  Tensor x = Tensor::from_vector<std::int32_t>({4, 1, 4, 0, 1, 1, 2, 4}, {2, 4});
  GradCheckOptions opt;
  opt.check_input = false;  // integer tokens have no gradient
  check_gradients(ctx, emb, x, opt);
}

TEST(GptLayerGradients, LmHeadInputMatchesFiniteDifferences) {
  ops::Context ctx;
  Embedding emb(7, 4, 5);
  init(emb);
  TiedLmHead head(emb);
  check_gradients(ctx, head, random_tensor({2, 3, 5}, 5));
}

// ---------------------------------------------------------------- float64 reference GPT

using Vec = std::vector<double>;

Vec to_vec(const Tensor& t) {
  auto f = t.to_vector<float>();
  return {f.begin(), f.end()};
}

// y[n, o] = sum_i x[n, i] w[o, i] + b[o]
Vec linear(const Vec& x, const Vec& w, const Vec& b, std::int64_t n, std::int64_t in,
           std::int64_t out) {
  Vec y(static_cast<std::size_t>(n * out));
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t o = 0; o < out; ++o) {
      double s = b.empty() ? 0.0 : b[o];
      for (std::int64_t i = 0; i < in; ++i)
        s += x[r * in + i] * w[o * in + i];
      y[r * out + o] = s;
    }
  return y;
}

// Accumulates dw, db; returns dx.
Vec linear_back(const Vec& dy, const Vec& x, const Vec& w, Vec& dw, Vec* db, std::int64_t n,
                std::int64_t in, std::int64_t out) {
  Vec dx(static_cast<std::size_t>(n * in), 0.0);
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t o = 0; o < out; ++o) {
      const double g = dy[r * out + o];
      if (db) (*db)[o] += g;
      for (std::int64_t i = 0; i < in; ++i) {
        dw[o * in + i] += g * x[r * in + i];
        dx[r * in + i] += g * w[o * in + i];
      }
    }
  return dx;
}

struct LnCache {
  Vec xhat, rstd;
};
Vec layernorm(const Vec& x, const Vec& w, const Vec& b, std::int64_t n, std::int64_t c,
              LnCache& cache) {
  Vec y(x.size());
  cache.xhat.assign(x.size(), 0.0);
  cache.rstd.assign(static_cast<std::size_t>(n), 0.0);
  for (std::int64_t r = 0; r < n; ++r) {
    double m = 0, v = 0;
    for (std::int64_t j = 0; j < c; ++j)
      m += x[r * c + j];
    m /= c;
    for (std::int64_t j = 0; j < c; ++j)
      v += (x[r * c + j] - m) * (x[r * c + j] - m);
    const double s = 1.0 / std::sqrt(v / c + 1e-5);
    cache.rstd[r] = s;
    for (std::int64_t j = 0; j < c; ++j) {
      cache.xhat[r * c + j] = (x[r * c + j] - m) * s;
      y[r * c + j] = cache.xhat[r * c + j] * w[j] + b[j];
    }
  }
  return y;
}

Vec layernorm_back(const Vec& dy, const LnCache& cache, const Vec& w, Vec& dw, Vec& db,
                   std::int64_t n, std::int64_t c) {
  Vec dx(dy.size());
  for (std::int64_t r = 0; r < n; ++r) {
    double a = 0, bb = 0;
    for (std::int64_t j = 0; j < c; ++j) {
      const double g = dy[r * c + j], xh = cache.xhat[r * c + j];
      dw[j] += g * xh;
      db[j] += g;
      a += g * w[j];
      bb += g * w[j] * xh;
    }
    a /= c;
    bb /= c;
    for (std::int64_t j = 0; j < c; ++j)
      dx[r * c + j] = cache.rstd[r] * (dy[r * c + j] * w[j] - a - cache.xhat[r * c + j] * bb);
  }
  return dx;
}

double gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
double gelu_grad(double x) {
  const double k = std::sqrt(2.0 / M_PI), th = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + th) + 0.5 * x * (1 - th * th) * k * (1 + 3 * 0.044715 * x * x);
}

// Causal attention on qkv [B, T, 3C]; keeps the probabilities for the backward.
Vec attention(const Vec& qkv, std::int64_t nb, std::int64_t t, std::int64_t c, std::int64_t heads,
              Vec& probs) {
  const std::int64_t d = c / heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  Vec out(static_cast<std::size_t>(nb * t * c), 0.0);
  probs.assign(static_cast<std::size_t>(nb * heads * t * t), 0.0);
  auto at = [&](std::int64_t b, std::int64_t s, std::int64_t part, std::int64_t h) {
    return (b * t + s) * 3 * c + part * c + h * d;
  };
  for (std::int64_t b = 0; b < nb; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t i = 0; i < t; ++i) {
        double* p = &probs[((b * heads + h) * t + i) * t];
        double mx = -1e300, sum = 0;
        for (std::int64_t s = 0; s <= i; ++s) {
          double dot = 0;
          for (std::int64_t x = 0; x < d; ++x)
            dot += qkv[at(b, i, 0, h) + x] * qkv[at(b, s, 1, h) + x];
          p[s] = dot * scale;
          mx = std::max(mx, p[s]);
        }
        for (std::int64_t s = 0; s <= i; ++s)
          sum += (p[s] = std::exp(p[s] - mx));
        for (std::int64_t s = 0; s <= i; ++s) {
          p[s] /= sum;
          for (std::int64_t x = 0; x < d; ++x)
            out[(b * t + i) * c + h * d + x] += p[s] * qkv[at(b, s, 2, h) + x];
        }
      }
  return out;
}

Vec attention_back(const Vec& dout, const Vec& qkv, const Vec& probs, std::int64_t nb,
                   std::int64_t t, std::int64_t c, std::int64_t heads) {
  const std::int64_t d = c / heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  Vec dqkv(qkv.size(), 0.0);
  auto at = [&](std::int64_t b, std::int64_t s, std::int64_t part, std::int64_t h) {
    return (b * t + s) * 3 * c + part * c + h * d;
  };
  for (std::int64_t b = 0; b < nb; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t i = 0; i < t; ++i) {
        const double* p = &probs[((b * heads + h) * t + i) * t];
        const double* g = &dout[(b * t + i) * c + h * d];
        Vec dp(static_cast<std::size_t>(i + 1), 0.0);
        double pdp = 0;
        for (std::int64_t s = 0; s <= i; ++s) {
          for (std::int64_t x = 0; x < d; ++x) {
            dp[s] += g[x] * qkv[at(b, s, 2, h) + x];
            dqkv[at(b, s, 2, h) + x] += p[s] * g[x];
          }
          pdp += p[s] * dp[s];
        }
        for (std::int64_t s = 0; s <= i; ++s) {
          const double ds = p[s] * (dp[s] - pdp) * scale;
          for (std::int64_t x = 0; x < d; ++x) {
            dqkv[at(b, i, 0, h) + x] += ds * qkv[at(b, s, 1, h) + x];
            dqkv[at(b, s, 1, h) + x] += ds * qkv[at(b, i, 0, h) + x];
          }
        }
      }
  return dqkv;
}

struct Reference {
  double loss = 0;
  std::map<std::string, Vec> grad;
};

// GPT-2 in double: model.parameters() give the values (by name), nothing else of lockstep runs.
Reference reference_gpt(const Model& model, std::int64_t layers, std::int64_t heads, std::int64_t c,
                        std::int64_t vocab, const Tensor& x, const Tensor& y) {
  std::map<std::string, Vec> p;
  Reference ref;
  for (const Parameter* q : model.parameters()) {
    p[q->name] = to_vec(q->value);
    ref.grad[q->name] = Vec(p[q->name].size(), 0.0);
  }
  auto& g = ref.grad;
  const std::int64_t nb = x.dim(0), t = x.dim(1), n = nb * t;
  const auto tok = x.to_vector<std::int32_t>();
  const auto lab = y.to_vector<std::int32_t>();
  auto name = [](std::int64_t layer, const std::string& rest) {
    return std::to_string(layer) + "." + rest;
  };

  // forward
  Vec h(static_cast<std::size_t>(n * c));
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t j = 0; j < c; ++j)
      h[r * c + j] = p["0.wte"][tok[r] * c + j] + p["0.wpe"][(r % t) * c + j];
  struct BlockCache {
    Vec x, ln1, qkv, probs, att, x1, ln2, fc, act;
    LnCache c1, c2;
  };
  std::vector<BlockCache> caches(static_cast<std::size_t>(layers));
  for (std::int64_t l = 0; l < layers; ++l) {
    BlockCache& k = caches[l];
    const std::int64_t id = l + 1;
    k.x = h;
    k.ln1 = layernorm(h, p[name(id, "ln_1.weight")], p[name(id, "ln_1.bias")], n, c, k.c1);
    k.qkv = linear(k.ln1, p[name(id, "attn.c_attn.weight")], p[name(id, "attn.c_attn.bias")], n, c,
                   3 * c);
    k.att = attention(k.qkv, nb, t, c, heads, k.probs);
    Vec a =
        linear(k.att, p[name(id, "attn.c_proj.weight")], p[name(id, "attn.c_proj.bias")], n, c, c);
    k.x1 = h;
    for (std::size_t i = 0; i < a.size(); ++i)
      k.x1[i] += a[i];
    k.ln2 = layernorm(k.x1, p[name(id, "ln_2.weight")], p[name(id, "ln_2.bias")], n, c, k.c2);
    k.fc = linear(k.ln2, p[name(id, "mlp.c_fc.weight")], p[name(id, "mlp.c_fc.bias")], n, c, 4 * c);
    k.act = k.fc;
    for (double& v : k.act)
      v = gelu(v);
    Vec m = linear(k.act, p[name(id, "mlp.c_proj.weight")], p[name(id, "mlp.c_proj.bias")], n,
                   4 * c, c);
    h = k.x1;
    for (std::size_t i = 0; i < m.size(); ++i)
      h[i] += m[i];
  }
  const std::int64_t f = layers + 1;
  LnCache cf;
  Vec hf = layernorm(h, p[name(f, "weight")], p[name(f, "bias")], n, c, cf);
  Vec logits = linear(hf, p["0.wte"], {}, n, c, vocab);
  Vec dlogits(logits.size());
  for (std::int64_t r = 0; r < n; ++r) {
    double mx = -1e300, sum = 0;
    for (std::int64_t v = 0; v < vocab; ++v)
      mx = std::max(mx, logits[r * vocab + v]);
    for (std::int64_t v = 0; v < vocab; ++v)
      sum += std::exp(logits[r * vocab + v] - mx);
    ref.loss += (std::log(sum) + mx - logits[r * vocab + lab[r]]) / n;
    for (std::int64_t v = 0; v < vocab; ++v)
      dlogits[r * vocab + v] =
          (std::exp(logits[r * vocab + v] - mx) / sum - (v == lab[r] ? 1.0 : 0.0)) / n;
  }

  // backward; the tied table collects the head's term here and the embedding's at the end
  Vec dh = linear_back(dlogits, hf, p["0.wte"], g["0.wte"], nullptr, n, c, vocab);
  dh = layernorm_back(dh, cf, p[name(f, "weight")], g[name(f, "weight")], g[name(f, "bias")], n, c);
  for (std::int64_t l = layers - 1; l >= 0; --l) {
    BlockCache& k = caches[l];
    const std::int64_t id = l + 1;
    Vec dact =
        linear_back(dh, k.act, p[name(id, "mlp.c_proj.weight")], g[name(id, "mlp.c_proj.weight")],
                    &g[name(id, "mlp.c_proj.bias")], n, 4 * c, c);
    for (std::size_t i = 0; i < dact.size(); ++i)
      dact[i] *= gelu_grad(k.fc[i]);
    Vec dln2 =
        linear_back(dact, k.ln2, p[name(id, "mlp.c_fc.weight")], g[name(id, "mlp.c_fc.weight")],
                    &g[name(id, "mlp.c_fc.bias")], n, c, 4 * c);
    Vec dx1 = layernorm_back(dln2, k.c2, p[name(id, "ln_2.weight")], g[name(id, "ln_2.weight")],
                             g[name(id, "ln_2.bias")], n, c);
    for (std::size_t i = 0; i < dx1.size(); ++i)
      dx1[i] += dh[i];
    Vec datt =
        linear_back(dx1, k.att, p[name(id, "attn.c_proj.weight")],
                    g[name(id, "attn.c_proj.weight")], &g[name(id, "attn.c_proj.bias")], n, c, c);
    Vec dqkv = attention_back(datt, k.qkv, k.probs, nb, t, c, heads);
    Vec dln1 = linear_back(dqkv, k.ln1, p[name(id, "attn.c_attn.weight")],
                           g[name(id, "attn.c_attn.weight")], &g[name(id, "attn.c_attn.bias")], n,
                           c, 3 * c);
    dh = layernorm_back(dln1, k.c1, p[name(id, "ln_1.weight")], g[name(id, "ln_1.weight")],
                        g[name(id, "ln_1.bias")], n, c);
    for (std::size_t i = 0; i < dh.size(); ++i)
      dh[i] += dx1[i];
  }
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t j = 0; j < c; ++j) {
      g["0.wte"][tok[r] * c + j] += dh[r * c + j];
      g["0.wpe"][(r % t) * c + j] += dh[r * c + j];
    }
  return ref;
}

// One training-style pass: loss and gradients with the mean over all B * T positions.
double loss_and_grads(ops::Context& ctx, Model& m, const Tensor& x, const Tensor& y) {
  SoftmaxCrossEntropy loss;
  m.zero_grad(ctx);
  Tensor logits = m.forward(ctx, x);
  double value = loss.forward(ctx, logits, y).item();
  m.backward(ctx, loss.backward(ctx, 1.0f / static_cast<float>(y.numel())));
  return value;
}

// The next-token labels of a batch: row r of x predicts x[r + 1] (the last one wraps).
Tensor next_tokens(const Tensor& x) {
  auto v = x.to_vector<std::int32_t>();
  std::vector<std::int32_t> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i)
    out[i] = v[(i + 1) % v.size()];
  return Tensor::from_vector(out, {x.numel()});
}

TEST(GptReference, LossAndEveryGradientMatchAFloat64ReImplementation) {
  // T = 70 crosses the CPU attention's 64-row query blocks; 3 heads of width 4.
  const std::int64_t layers = 2, heads = 3, c = 12, vocab = 11, nb = 2, t = 70;
  for (int threads : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << threads << " thread(s)");
    ops::Context ctx(Device::cpu(), threads);
    Model m = Model::build("gpt(layers=2,heads=3,dim=12)", {t}, vocab, 21);
    randomise(m.parameters(), 0.3f, 22);
    Tensor x = tokens(nb, t, vocab, 23), y = tokens(nb * t, 1, vocab, 24).view({nb * t});
    double loss = loss_and_grads(ctx, m, x, y);
    Reference ref = reference_gpt(m, layers, heads, c, vocab, x, y);
    EXPECT_NEAR(loss, ref.loss, 1e-6 * ref.loss);
    ASSERT_EQ(ref.grad.size(), m.parameters().size());
    for (const Parameter* p : m.parameters()) {
      const Vec& want = ref.grad.at(p->name);
      auto got = p->grad.to_vector<float>();
      double scale = 1e-12, err = 0;
      for (std::size_t i = 0; i < want.size(); ++i) {
        scale = std::max(scale, std::abs(want[i]));
        err = std::max(err, std::abs(got[i] - want[i]));
      }
      // float32 against float64 through ~20 layers of sums: ~1e-6 of the largest entry; a
      // wrong term is off by O(1) of it.
      EXPECT_LE(err / scale, 2e-5) << p->name << " (largest gradient " << scale << ")";
    }
  }
}

// ---------------------------------------------------------------- model behaviour

TEST(GptModel, InitialLossIsAboutLnVocab) {
  ops::Context ctx(Device::cpu(), 2);
  for (std::int64_t vocab : {256, 1000}) {
    Model m = Model::build("gpt-tiny", {64}, vocab, 5);
    Tensor x = tokens(4, 64, vocab, 6);
    SoftmaxCrossEntropy loss;
    double value = loss.forward(ctx, m.forward(ctx, x), next_tokens(x)).item();
    // GPT-2's initialisation gives logits of standard deviation ~0.02 sqrt(dim) = 0.23, which
    // adds about half their variance, 0.03, to ln V.
    EXPECT_NEAR(value, std::log(static_cast<double>(vocab)), 0.1) << "vocab " << vocab;
  }
}

TEST(GptModel, AdamWOverfitsOneBatch) {
  ops::Context ctx(Device::cpu(), 2);
  const std::int64_t vocab = 32;
  Model m = Model::build("gpt(layers=2,heads=2,dim=32)", {16}, vocab, 8);
  Tensor x = tokens(4, 16, vocab, 9), y = next_tokens(x);
  std::vector<Tensor> mom, var;
  for (Parameter* p : m.parameters()) {
    mom.push_back(Tensor::zeros(p->value.shape()));
    var.push_back(Tensor::zeros(p->value.shape()));
  }
  const double first = loss_and_grads(ctx, m, x, y);
  double last = first;
  for (int step = 1; step <= 200; ++step) {
    if (step > 1) last = loss_and_grads(ctx, m, x, y);
    for (std::size_t k = 0; k < m.parameters().size(); ++k) {
      Parameter& p = *m.parameters()[k];
      ops::adamw_update(ctx, p.value, p.grad, mom[k], var[k],
                        {.lr = 1e-2f, .weight_decay = 0.0f, .step = step, .verdict = {}});
    }
  }
  EXPECT_NEAR(first, std::log(32.0), 0.1);
  EXPECT_LT(last, 0.05) << "loss went from " << first << " to " << last;
}

TEST(GptModel, ChangingFutureTokensLeavesEarlierLogitsUnchanged) {
  ops::Context ctx(Device::cpu(), 2);
  const std::int64_t vocab = 50, t = 80, k = 45;
  Model m = Model::build("gpt(layers=2,heads=2,dim=32)", {t}, vocab, 10);
  Tensor x = tokens(2, t, vocab, 11);
  Tensor changed = x.clone();
  auto* p = changed.data<std::int32_t>();
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t s = k; s < t; ++s)
      p[b * t + s] = (p[b * t + s] + 7) % vocab;
  auto before = m.forward(ctx, x).to_vector<float>();
  auto after = m.forward(ctx, changed).to_vector<float>();
  std::int64_t earlier_differ = 0, later_differ = 0;
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t s = 0; s < t; ++s)
      for (std::int64_t v = 0; v < vocab; ++v) {
        const std::size_t i = static_cast<std::size_t>((b * t + s) * vocab + v);
        (s < k ? earlier_differ : later_differ) += before[i] != after[i];
      }
  EXPECT_EQ(earlier_differ, 0);
  EXPECT_GT(later_differ, 0);
}

TEST(GptModel, TiedTableGradientIsTheSumOfTheHeadAndEmbeddingUses) {
  ops::Context ctx;
  const std::int64_t vocab = 9, t = 6, c = 8;
  Model m = Model::build("gpt(layers=1,heads=2,dim=8)", {t}, vocab, 12);
  randomise(m.parameters(), 0.3f, 13);
  Tensor x = tokens(2, t, vocab, 14), y = next_tokens(x);
  // Run the layers one by one to see the head's input and the embedding's output gradient.
  SoftmaxCrossEntropy loss;
  m.zero_grad(ctx);
  std::vector<Tensor> inputs;
  Tensor h = x;
  for (std::size_t k = 0; k < m.num_layers(); ++k) {
    inputs.push_back(h);
    h = m.layer(k).forward(ctx, h);
  }
  loss.forward(ctx, h, y);
  Tensor d = loss.backward(ctx, 1.0f / static_cast<float>(y.numel())).clone();
  Tensor head_input = inputs.back().clone();
  Tensor grad = d, d_embedding_out;
  for (std::size_t k = m.num_layers(); k-- > 0;) {
    grad = m.layer(k).backward(ctx, grad);
    if (k == 1) d_embedding_out = grad.clone();  // block 1's input is the embedding's output
  }
  ASSERT_EQ(m.parameters()[0]->name, "0.wte");
  auto got = m.parameters()[0]->grad.to_vector<float>();
  auto dl = d.to_vector<float>(), hin = head_input.to_vector<float>();
  auto de = d_embedding_out.to_vector<float>();
  auto tok = x.to_vector<std::int32_t>();
  std::vector<double> want(static_cast<std::size_t>(vocab * c), 0.0);
  for (std::int64_t r = 0; r < 2 * t; ++r)
    for (std::int64_t j = 0; j < c; ++j) {
      for (std::int64_t v = 0; v < vocab; ++v)  // the head: dlogits^T h
        want[v * c + j] += dl[r * vocab + v] * hin[r * c + j];
      want[tok[r] * c + j] += de[r * c + j];  // the embedding: scatter of its output gradient
    }
  for (std::size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-6) << "wte[" << i << "]";
}

TEST(GptModel, GradReadyHookReportsTheTiedTableOnceAfterBothUses) {
  ops::Context ctx;
  const std::int64_t vocab = 13, t = 5;
  Model m = Model::build("gpt(layers=2,heads=2,dim=8)", {t}, vocab, 15);
  Tensor x = tokens(3, t, vocab, 16), y = next_tokens(x);
  std::vector<std::string> seen;
  std::vector<float> wte_at_hook;
  m.set_grad_ready_hook([&](Parameter& p) {
    seen.push_back(p.name);
    if (p.name == "0.wte") wte_at_hook = p.grad.to_vector<float>();
  });
  loss_and_grads(ctx, m, x, y);
  std::vector<std::string> expected;
  for (auto it = m.parameters().rbegin(); it != m.parameters().rend(); ++it)
    expected.push_back((*it)->name);
  EXPECT_EQ(seen, expected);  // once each, in reverse order: the Reducer's rule
  EXPECT_EQ(seen.back(), "0.wte");
  EXPECT_EQ(wte_at_hook, m.parameters()[0]->grad.to_vector<float>())
      << "the table was reported before its last contribution";
}

TEST(GptModel, ShorterSequencesThanTheContextUseTheFirstPositions) {
  ops::Context ctx;
  Model full = Model::build("gpt(layers=1,heads=2,dim=8,ctx=32)", {32}, 7, 3);
  Model part = Model::build("gpt(layers=1,heads=2,dim=8,ctx=32)", {10}, 7, 3);
  Tensor x = tokens(1, 32, 7, 4);
  Tensor prefix = Tensor::from_vector(
      std::vector<std::int32_t>(x.data<std::int32_t>(), x.data<std::int32_t>() + 10), {1, 10});
  auto a = full.forward(ctx, x).to_vector<float>();
  auto b = part.forward(ctx, prefix).to_vector<float>();
  ASSERT_EQ(b.size(), 10u * 7u);
  for (std::size_t i = 0; i < b.size(); ++i)
    EXPECT_NEAR(a[i], b[i], 1e-6);
}

// ---------------------------------------------------------------- specs

TEST(GptSpec, ExpandsToEmbeddingBlocksFinalNormAndTiedHead) {
  Model m = Model::build("gpt(layers=2,heads=4,dim=64,ctx=128)", {100}, 256, 1);
  EXPECT_EQ(m.layer_spec(),
            "embed(vocab=256,ctx=128,dim=64)-block(heads=4,depth=2)-block(heads=4,depth=2)-ln-"
            "lmhead");
  EXPECT_EQ(m.outputs_per_sample(), 100);
  // wte + wpe + per block (2 LN + qkv + proj + fc + proj) + final LN; the head adds nothing.
  const std::int64_t c = 64;
  const std::int64_t block =
      2 * 2 * c + (3 * c * c + 3 * c) + (c * c + c) + (4 * c * c + 4 * c) + (4 * c * c + c);
  EXPECT_EQ(m.num_parameters(), 256 * c + 128 * c + 2 * block + 2 * c);
  EXPECT_EQ(m.parameters().front()->name, "0.wte");
  EXPECT_EQ(m.parameters().back()->name, "3.bias");
}

TEST(GptSpec, PresetsHaveTheDocumentedShapesAndAcceptOverrides) {
  Model tiny = Model::build("gpt-tiny", {128}, 256, 1);
  EXPECT_EQ(tiny.layer_spec(),
            "embed(vocab=256,ctx=128,dim=128)-block(heads=2,depth=2)-block(heads=2,depth=2)-ln-"
            "lmhead");
  Model mini = Model::build("gpt-mini(ctx=512)", {300}, 300, 1);
  EXPECT_EQ(mini.layer_spec().substr(0, 31), "embed(vocab=300,ctx=512,dim=256");
  EXPECT_EQ(mini.num_layers(), 4u + 3u);
  // gpt2-124m's expansion, on a 1-layer, 1000-token override to keep the test small (the
  // preset's own vocab, 50257, shows in VocabularyDifferentFromTheData...).
  Model small = Model::build("gpt2-124m(layers=1,vocab=1000)", {64}, 1000, 1);
  EXPECT_EQ(small.layer_spec(),
            "embed(vocab=1000,ctx=1024,dim=768)-block(heads=12,depth=1)-ln-lmhead");
}

TEST(GptSpec, Gpt2SmallHasGpt2sParameterCount) {
  // 124,439,808 with the 50257-token table counted once (tied), as GPT-2 small.
  const std::int64_t c = 768, l = 12, v = 50257, p = 1024;
  const std::int64_t block =
      4 * c + (3 * c * c + 3 * c) + (c * c + c) + (4 * c * c + 4 * c) + (4 * c * c + c);
  EXPECT_EQ(v * c + p * c + l * block + 2 * c, 124439808);
  // The same count from the built model, at one layer and a 500-token table to stay small.
  Model one = Model::build("gpt2-124m(layers=1,vocab=500)", {8}, 500, 1);
  EXPECT_EQ(one.num_parameters(), 500 * c + p * c + block + 2 * c);
}

TEST(GptSpec, ContextLongerThanTheModelsIsAnErrorNamingCtx) {
  std::string e = build_error("gpt(layers=1,heads=2,dim=8,ctx=32)", {64}, 10);
  EXPECT_NE(e.find("T = 64 tokens but the model's context is ctx = 32"), std::string::npos) << e;
  EXPECT_NE(e.find("^~~~~"), std::string::npos) << e;  // under ctx=32
  e = build_error("gpt-tiny", {256}, 256);
  EXPECT_NE(e.find("preset 'gpt-tiny'"), std::string::npos) << e;
  EXPECT_NE(e.find("ctx = 128"), std::string::npos) << e;
}

TEST(GptSpec, VocabularyDifferentFromTheDataIsAnErrorNamingVocab) {
  std::string e = build_error("gpt2-124m", {64}, 256);
  EXPECT_NE(e.find("vocab = 50257 but the data has 256 classes"), std::string::npos) << e;
  e = build_error("gpt(layers=1,heads=2,dim=8,vocab=100)", {16}, 99);
  EXPECT_NE(e.find("vocab = 100 but the data has 99 classes"), std::string::npos) << e;
}

TEST(GptSpec, OtherMistakesAreErrorsThatSayWhat) {
  EXPECT_NE(build_error("gpt(layers=1,heads=3,dim=8)", {16}, 10).find("not a multiple of heads"),
            std::string::npos);
  EXPECT_NE(
      build_error("gpt(layers=1,heads=2,dim=8)", {1, 28, 28}, 10).find("sample shape must be [T]"),
      std::string::npos);
  EXPECT_NE(build_error("gpt(layers=1,heads=2,dim=8)-relu", {16}, 10).find("cannot be combined"),
            std::string::npos);
  EXPECT_NE(build_error("gpt-mini-relu", {16}, 10).find("cannot be combined"), std::string::npos);
  EXPECT_NE(build_error("gpt(heads=2,dim=8)", {16}, 10).find("needs argument 'layers'"),
            std::string::npos);
  EXPECT_NE(build_error("flatten-lmhead", {16}, 10).find("lmhead needs an embed layer"),
            std::string::npos);
}

TEST(GptSpec, SameSeedGivesTheSameInitialisationWithGpt2Statistics) {
  Model a = Model::build("gpt(layers=4,heads=2,dim=64)", {16}, 300, 42);
  Model b = Model::build("gpt(layers=4,heads=2,dim=64)", {16}, 300, 42);
  for (std::size_t k = 0; k < a.parameters().size(); ++k)
    EXPECT_EQ(a.parameters()[k]->value.to_vector<float>(),
              b.parameters()[k]->value.to_vector<float>());
  auto stddev = [&](const std::string& name) {
    for (const Parameter* p : a.parameters()) {
      if (p->name != name) continue;
      double s = 0;
      const Tensor model = unpadded(*p, p->value);  // the vocabulary's rows of the table
      for (float v : model.to_vector<float>())
        s += static_cast<double>(v) * v;
      return std::sqrt(s / static_cast<double>(model.numel()));
    }
    ADD_FAILURE() << "no parameter " << name;
    return 0.0;
  };
  EXPECT_NEAR(stddev("0.wte"), 0.02, 0.001);
  EXPECT_NEAR(stddev("0.wpe"), 0.01, 0.001);
  EXPECT_NEAR(stddev("2.attn.c_attn.weight"), 0.02, 0.001);
  EXPECT_NEAR(stddev("2.attn.c_proj.weight"), 0.02 / std::sqrt(8.0), 0.0005);
  EXPECT_NEAR(stddev("3.mlp.c_proj.weight"), 0.02 / std::sqrt(8.0), 0.0005);
  EXPECT_EQ(stddev("2.attn.c_attn.bias"), 0.0);
  for (float v : a.parameters()[2]->value.to_vector<float>())  // 1.ln_1.weight
    ASSERT_EQ(v, 1.0f);
  // The table's 84 padding rows (300 -> 384) are zero, its 300 rows those of an unpadded table.
  const Parameter& wte = *a.parameters()[0];
  ASSERT_EQ(wte.value.dim(0), 384);
  const std::vector<float> all = wte.value.to_vector<float>();
  for (std::size_t i = 300 * 64; i < all.size(); ++i)
    ASSERT_EQ(all[i], 0.0f) << "padding element " << i;
  Model unpadded_model = Model::build("gpt(layers=4,heads=2,dim=64,pad_vocab=1)", {16}, 300, 42);
  EXPECT_EQ(unpadded_model.parameters()[0]->value.to_vector<float>(),
            unpadded(wte, wte.value).to_vector<float>());
}

// ---------------------------------------------------------------- a padded vocabulary

TEST(GptSpec, TheTokenTableIsPaddedTo128RowsByDefaultAndPadVocabSetsTheMultiple) {
  auto table = [](const Model& m) -> const Parameter& { return *m.parameters().front(); };
  Model padded = Model::build("gpt(layers=1,heads=2,dim=8)", {16}, 300, 1);
  EXPECT_EQ(table(padded).value.shape(), (Shape{384, 8}));
  EXPECT_EQ(table(padded).padded_rows, 84);
  EXPECT_EQ(table(padded).grad.shape(), (Shape{384, 8}));
  // The default is not written into the layer spec: a checkpoint's structure is what it was.
  EXPECT_EQ(padded.layer_spec(), "embed(vocab=300,ctx=16,dim=8)-block(heads=2,depth=1)-ln-lmhead");
  Model none = Model::build("gpt(layers=1,heads=2,dim=8,pad_vocab=1)", {16}, 300, 1);
  EXPECT_EQ(table(none).value.shape(), (Shape{300, 8}));
  EXPECT_EQ(table(none).padded_rows, 0);
  EXPECT_EQ(none.layer_spec(),
            "embed(vocab=300,ctx=16,dim=8,pad_vocab=1)-block(heads=2,depth=1)-ln-lmhead");
  // What describes the model does not see the padding: parameters, structure, FLOPs, logits.
  EXPECT_EQ(padded.num_parameters(), none.num_parameters());
  EXPECT_NE(padded.structure().find("param 0.wte [300, 8]"), std::string::npos)
      << padded.structure();
  EXPECT_EQ(padded.forward_flops(), none.forward_flops());
  ops::Context ctx;
  EXPECT_EQ(padded.forward(ctx, tokens(2, 16, 300, 3)).shape(), (Shape{32, 300}));
  // Presets take it as an override, and an embed layer as an argument.
  Model tiny = Model::build("gpt-tiny(pad_vocab=64)", {32}, 100, 1);
  EXPECT_EQ(table(tiny).value.dim(0), 128);
  Model layers = Model::build("embed(vocab=100,ctx=8,dim=8,pad_vocab=48)-ln-lmhead", {8}, 100, 1);
  EXPECT_EQ(table(layers).value.dim(0), 144);
  // A vocabulary that is a multiple already has no padding (GPT-2's 50304, bytes' 256).
  EXPECT_EQ(table(Model::build("gpt-tiny", {32}, 256, 1)).padded_rows, 0);
}

TEST(GptSpec, APaddingBeyondWhatI32TokensAddressIsAnErrorNamingPadVocab) {
  // 2147483647 ids fit an i32, but not the 2147483648 rows of their padding to 128: refused
  // before anything is allocated (the table would be 64 GiB at dim 8).
  std::string e = build_error("gpt(layers=1,heads=1,dim=8)", {4}, 2147483647);
  EXPECT_NE(e.find("vocab = 2147483647 padded to a multiple of pad_vocab = 128 needs 2147483648 "
                   "rows, more than i32 token ids address (2147483647)"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("pad_vocab=1"), std::string::npos) << e;  // the hint
  e = build_error("embed(vocab=2147483600,ctx=4,dim=8,pad_vocab=1000)-ln-lmhead", {4}, 2147483600);
  EXPECT_NE(e.find("needs 2147484000 rows"), std::string::npos) << e;
  EXPECT_NE(e.find("^~~~"), std::string::npos) << e;  // the caret under the embed layer
  e = build_error("gpt(layers=1,heads=1,dim=8,pad_vocab=0)", {4}, 10);
  EXPECT_NE(e.find("pad_vocab"), std::string::npos) << e;
  try {
    Embedding(2147483647, 4, 8);
    ADD_FAILURE() << "a table of 2147483648 rows was accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("pad_vocab = 128"), std::string::npos) << err.what();
  }
}

}  // namespace

TEST(GptSpec, SpecContextIsTheStatedCtxOrZero) {
  EXPECT_EQ(spec_context("gpt-tiny"), 128);
  EXPECT_EQ(spec_context("gpt-mini(ctx=64)"), 64);
  EXPECT_EQ(spec_context("gpt(layers=1,heads=2,dim=32,ctx=32,vocab=256)"), 32);
  EXPECT_EQ(spec_context("gpt(2,2,64)"), 0);  // left to the data
  EXPECT_EQ(spec_context("mlp:32"), 0);
}
