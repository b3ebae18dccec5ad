// CPU kernels of the GPT layers: token + position embedding, LayerNorm (alone and fused with the
// residual sum before it), GELU (tanh form) and causal multi-head attention.
//
// Attention is blocked and causal: for each (batch, head) the queries go in blocks of
// kAttnBlock rows, and a block's scores are computed only against the keys it may see (the
// prefix up to its last row), so the GEMMs do about half the work of a full [T, T] product and
// no [T, T] matrix is ever stored. The forward keeps each row's log-sum-exp; the backward
// rebuilds the probabilities from it (one extra Q K^T per block) instead of saving them:
// FlashAttention's trade, which here also saves the memory traffic of a [B, H, T, T] tensor.
// All GEMMs are single-threaded sgemm calls (cpu_sgemm.hpp) on strided views of qkv (row stride 3C,
// no transposes or copies); the pool's threads take whole (batch, head) pairs, each with its own
// scratch tile, so dK and dV of a head are accumulated by one thread in a fixed order.
//
// Determinism: every reduction is over a fixed blocking (rows of a LayerNorm block, a head's
// query blocks in order, the batch in order for the position gradient, all positions in order
// for one column range of the token gradient), so results do not depend on the thread count.
//
// bf16 activations (bf16_rows.hpp): LayerNorm widens a bf16 input a row (or a backward block of
// rows) at a time and writes a bf16 output through one row of scratch; the GELU converts chunks;
// attention widens one (batch, head) pair's q, k and v (and out and dout) into a [T, 3D] ([T, D])
// scratch, runs the same blocked kernel on it with those row strides, and rounds the head's
// output (or dq, dk, dv) when it is done. Every f32 result is therefore the f32 kernel's.
#include <algorithm>
#include <cmath>

#include "lockstep/core/error.hpp"
#include "ops/bad_input.hpp"
#include "ops/cpu/bf16_rows.hpp"
#include "ops/cpu/cpu_backend.hpp"
#include "ops/cpu/cpu_sgemm.hpp"
#include "ops/cpu/parallel.hpp"
#include "ops/cpu/simd.hpp"
#include "ops/gelu_tanh.hpp"

namespace lockstep::ops::cpu {

float* CpuBackend::scratch_floats(std::size_t n) {
  if (float_scratch_.size() < n) float_scratch_.resize(n);
  return float_scratch_.data();
}

namespace {

using simd::kWidth;
using simd::vf;

// Query rows per attention block: 64 keeps a block's score tile (64 x T floats, 256 KB at
// T = 1024) in L2 while the GEMMs are still wide enough for the sgemm kernels.
constexpr std::int64_t kAttnBlock = 64;
// Rows per LayerNorm-backward block: the unit of the deterministic weight-gradient reduction.
constexpr std::int64_t kLnRows = 32;

// Token ids are checked on the host before any parallel work, so the error names the first bad
// position whatever the thread count.
void check_tokens(const char* op, const std::int32_t* tokens, std::int64_t b, std::int64_t t,
                  std::int64_t vocab) {
  for (std::int64_t i = 0; i < b * t; ++i) {
    LOCKSTEP_CHECK_HINT(tokens[i] >= 0 && tokens[i] < vocab, kBadTokenHint,
                        bad_token_message(op, tokens[i], i, t, vocab));
  }
}

// ---- row kernels (compiled per SIMD level)

LOCKSTEP_SIMD_CLONES
void add_rows(const float* a, const float* b, float* y, std::int64_t n) {
  std::int64_t j = 0;
  for (; j + kWidth <= n; j += kWidth)
    simd::store(y + j, simd::load(a + j) + simd::load(b + j));
  for (; j < n; ++j)
    y[j] = a[j] + b[j];
}

LOCKSTEP_SIMD_CLONES
void accumulate_row(const float* x, float* y, std::int64_t n) {
  std::int64_t j = 0;
  for (; j + kWidth <= n; j += kWidth)
    simd::store(y + j, simd::load(y + j) + simd::load(x + j));
  for (; j < n; ++j)
    y[j] += x[j];
}

LOCKSTEP_SIMD_CLONES
void layernorm_rows(const float* x, const float* w, const float* bias, float eps, float* y,
                    float* mean, float* rstd, std::int64_t r0, std::int64_t r1, std::int64_t c) {
  const float inv_c = 1.0f / static_cast<float>(c);
  for (std::int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * c;
    float* yr = y + r * c;
    vf acc = simd::splat(0.0f);
    std::int64_t j = 0;
    for (; j + kWidth <= c; j += kWidth)
      acc += simd::load(xr + j);
    if (j < c) acc += simd::load_partial(xr + j, c - j, 0.0f);
    const float m = simd::hsum(acc) * inv_c;
    // Two passes (mean, then squared deviations): no cancellation for rows far from zero.
    acc = simd::splat(0.0f);
    for (j = 0; j + kWidth <= c; j += kWidth) {
      vf d = simd::load(xr + j) - m;
      acc += d * d;
    }
    if (j < c) {
      vf d = simd::load_partial(xr + j, c - j, m) - m;
      acc += d * d;
    }
    const float s = 1.0f / std::sqrt(simd::hsum(acc) * inv_c + eps);
    for (j = 0; j + kWidth <= c; j += kWidth) {
      vf v = (simd::load(xr + j) - m) * s * simd::load(w + j) + simd::load(bias + j);
      simd::store(yr + j, v);
    }
    for (; j < c; ++j)
      yr[j] = (xr[j] - m) * s * w[j] + bias[j];
    mean[r] = m;
    rstd[r] = s;
  }
}

// dx for rows [r0, r1) and this block's weight/bias gradient sums into part_w/part_b
// (overwritten), rows added in order. dy's rows are at dy + (r - r0) c (a block of widened rows,
// or the tensor from row r0); every other row-indexed pointer starts at row 0.
LOCKSTEP_SIMD_CLONES
void layernorm_backward_rows(const float* x, const float* dy, const float* w, const float* mean,
                             const float* rstd, const float* dres, float* dx, float* part_w,
                             float* part_b, std::int64_t r0, std::int64_t r1, std::int64_t c) {
  const float inv_c = 1.0f / static_cast<float>(c);
  for (std::int64_t j = 0; j < c; ++j) {
    part_w[j] = 0.0f;
    part_b[j] = 0.0f;
  }
  for (std::int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * c;
    const float* gr = dy + (r - r0) * c;
    float* dxr = dx + r * c;
    const float m = mean[r], s = rstd[r];
    // a = mean(dy w), b = mean(dy w xhat)
    vf sa = simd::splat(0.0f), sb = simd::splat(0.0f);
    std::int64_t j = 0;
    for (; j + kWidth <= c; j += kWidth) {
      vf g = simd::load(gr + j) * simd::load(w + j);
      vf xh = (simd::load(xr + j) - m) * s;
      sa += g;
      sb += g * xh;
      simd::store(part_w + j, simd::load(part_w + j) + simd::load(gr + j) * xh);
      simd::store(part_b + j, simd::load(part_b + j) + simd::load(gr + j));
    }
    float ta = 0.0f, tb = 0.0f;
    for (std::int64_t k = j; k < c; ++k) {
      float g = gr[k] * w[k], xh = (xr[k] - m) * s;
      ta += g;
      tb += g * xh;
      part_w[k] += gr[k] * xh;
      part_b[k] += gr[k];
    }
    const float a = (simd::hsum(sa) + ta) * inv_c, b = (simd::hsum(sb) + tb) * inv_c;
    for (j = 0; j + kWidth <= c; j += kWidth) {
      vf g = simd::load(gr + j) * simd::load(w + j);
      vf xh = (simd::load(xr + j) - m) * s;
      vf v = (g - a - xh * b) * s;
      if (dres) v += simd::load(dres + r * c + j);
      simd::store(dxr + j, v);
    }
    for (; j < c; ++j) {
      float g = gr[j] * w[j], xh = (xr[j] - m) * s;
      float v = (g - a - xh * b) * s;
      dxr[j] = dres ? v + dres[r * c + j] : v;
    }
  }
}

// ops/gelu_tanh.hpp's formula on vectors, operation for operation (tests/ops/test_gelu_formula.cpp
// checks they agree); simd::exp clamps its argument as gelu_tanh_exp does.
LOCKSTEP_SIMD_INLINE vf gelu_tanh(vf x) {
  vf u = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
  return x / (1.0f + simd::exp(-2.0f * u));
}

// d/dx of gelu_tanh, times the incoming gradient g.
LOCKSTEP_SIMD_INLINE vf gelu_tanh_grad(vf x, vf g) {
  vf x2 = x * x;
  vf e = simd::exp(-2.0f * kSqrt2OverPi * (x + kGeluCoeff * x2 * x));
  vf s = 1.0f / (1.0f + e);
  vf du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * x2);
  return g * (s + 2.0f * x * s * (s * e) * du);
}

LOCKSTEP_SIMD_CLONES
void gelu_tanh_range(const float* x, float* y, std::int64_t b, std::int64_t e) {
  std::int64_t i = b;
  for (; i + kWidth <= e; i += kWidth)
    simd::store(y + i, gelu_tanh(simd::load(x + i)));
  if (i < e) simd::store_partial(y + i, gelu_tanh(simd::load_partial(x + i, e - i, 0.0f)), e - i);
}

LOCKSTEP_SIMD_CLONES
void gelu_tanh_backward_range(const float* x, const float* dy, float* dx, std::int64_t b,
                              std::int64_t e) {
  std::int64_t i = b;
  for (; i + kWidth <= e; i += kWidth)
    simd::store(dx + i, gelu_tanh_grad(simd::load(x + i), simd::load(dy + i)));
  if (i < e) {
    vf v = gelu_tanh_grad(simd::load_partial(x + i, e - i, 0.0f),
                          simd::load_partial(dy + i, e - i, 0.0f));
    simd::store_partial(dx + i, v, e - i);
  }
}

// Row i of a score tile (already scaled) is for query t = first + i and sees keys [0, t]:
// softmax over them in place, zeros after, and lse[t] = max + log(sum).
LOCKSTEP_SIMD_CLONES
void causal_softmax_rows(float* s, std::int64_t ld, std::int64_t rows, std::int64_t first,
                         float* lse) {
  for (std::int64_t i = 0; i < rows; ++i) {
    float* row = s + i * ld;
    const std::int64_t valid = first + i + 1;
    vf vm = simd::splat(-INFINITY);
    std::int64_t j = 0;
    for (; j + kWidth <= valid; j += kWidth)
      vm = simd::vmax(vm, simd::load(row + j));
    if (j < valid) vm = simd::vmax(vm, simd::load_partial(row + j, valid - j, -INFINITY));
    const float m = simd::hmax(vm);
    vf vs = simd::splat(0.0f);
    for (j = 0; j + kWidth <= valid; j += kWidth) {
      vf p = simd::exp(simd::load(row + j) - m);
      simd::store(row + j, p);
      vs += p;
    }
    if (j < valid) {
      vf p = simd::exp(simd::load_partial(row + j, valid - j, 0.0f) - m);
      // lanes past `valid` must not count
      float tmp[kWidth];
      simd::store(tmp, p);
      for (std::int64_t k = valid - j; k < kWidth; ++k)
        tmp[k] = 0.0f;
      p = simd::load(tmp);
      simd::store_partial(row + j, p, valid - j);
      vs += p;
    }
    const float sum = simd::hsum(vs);
    lse[i] = m + std::log(sum);
    const float inv = 1.0f / sum;
    for (j = 0; j + kWidth <= valid; j += kWidth)
      simd::store(row + j, simd::load(row + j) * inv);
    for (; j < valid; ++j)
      row[j] *= inv;
    for (j = valid; j < ld; ++j)
      row[j] = 0.0f;
  }
}

// Backward tile: p = exp(s - lse) on the causal prefix (0 after), written over s; then
// ds = p * (dp - delta) written over dp.
LOCKSTEP_SIMD_CLONES
void causal_softmax_backward_rows(float* s, float* dp, std::int64_t ld, std::int64_t rows,
                                  std::int64_t first, const float* lse, const float* delta) {
  for (std::int64_t i = 0; i < rows; ++i) {
    float* srow = s + i * ld;
    float* drow = dp + i * ld;
    const std::int64_t valid = first + i + 1;
    const float l = lse[i], d = delta[i];
    std::int64_t j = 0;
    for (; j + kWidth <= valid; j += kWidth) {
      vf p = simd::exp(simd::load(srow + j) - l);
      simd::store(srow + j, p);
      simd::store(drow + j, p * (simd::load(drow + j) - d));
    }
    for (; j < valid; ++j) {
      float p = simd::exp(simd::splat(srow[j] - l))[0];
      srow[j] = p;
      drow[j] = p * (drow[j] - d);
    }
    for (j = valid; j < ld; ++j) {
      srow[j] = 0.0f;
      drow[j] = 0.0f;
    }
  }
}

// delta[t] = sum_d dout[t, d] * out[t, d] over one head's D features.
LOCKSTEP_SIMD_CLONES
void row_dots(const float* a, const float* b, std::int64_t ld, std::int64_t rows, std::int64_t d,
              float* out) {
  for (std::int64_t t = 0; t < rows; ++t) {
    const float* ar = a + t * ld;
    const float* br = b + t * ld;
    vf acc = simd::splat(0.0f);
    std::int64_t j = 0;
    for (; j + kWidth <= d; j += kWidth)
      acc += simd::load(ar + j) * simd::load(br + j);
    float tail = 0.0f;
    for (; j < d; ++j)
      tail += ar[j] * br[j];
    out[t] = simd::hsum(acc) + tail;
  }
}

// The strided views of one (batch, head) pair inside qkv [B, T, 3C] and out [B, T, C].
struct HeadView {
  std::int64_t t, c, d;  // sequence length, model width, head width
  std::int64_t ld_qkv() const { return 3 * c; }
  std::int64_t q_offset(std::int64_t b, std::int64_t h) const { return b * t * 3 * c + h * d; }
  std::int64_t o_offset(std::int64_t b, std::int64_t h) const { return b * t * c + h * d; }
};

// One (batch, head) pair of the forward: q, k and v rows ld apart (k and v being q's columns
// shifted, as in qkv), out rows ldo apart, the pair's lse, a score tile s.
void attention_head_forward(const float* q, const float* k, const float* v, std::int64_t ld,
                            float* o, std::int64_t ldo, float* l, float* s, std::int64_t t,
                            std::int64_t d, float scale) {
  for (std::int64_t r0 = 0; r0 < t; r0 += kAttnBlock) {
    const std::int64_t nq = std::min(kAttnBlock, t - r0), nk = r0 + nq;
    sgemm(false, true, nq, nk, d, scale, q + r0 * ld, ld, k, ld, 0.0f, s, nk);
    causal_softmax_rows(s, nk, nq, r0, l + r0);
    sgemm(false, false, nq, d, nk, 1.0f, s, nk, v, ld, 0.0f, o + r0 * ldo, ldo);
  }
}

// One (batch, head) pair of the backward: q, k, v and dq, dk, dv rows ld apart, out (o) and dout
// (g) rows ldo apart; p and ds are tiles, delta one value per query.
void attention_head_backward(const float* q, const float* k, const float* v, const float* o,
                             const float* g, std::int64_t ld, std::int64_t ldo, const float* l,
                             float* dq, float* dk, float* dv, float* p, float* ds, float* delta,
                             std::int64_t t, std::int64_t d, float scale) {
  row_dots(g, o, ldo, t, d, delta);
  // dK and dV accumulate over the query blocks. The last block sees every key, so going
  // backwards it writes all of them first (beta = 0) and the others add (no zeroing pass).
  const std::int64_t last_block = (t - 1) / kAttnBlock * kAttnBlock;
  for (std::int64_t r0 = last_block; r0 >= 0; r0 -= kAttnBlock) {
    const std::int64_t nq = std::min(kAttnBlock, t - r0), nk = r0 + nq;
    const float beta = r0 == last_block ? 0.0f : 1.0f;
    const float* qb = q + r0 * ld;
    const float* gb = g + r0 * ldo;
    sgemm(false, true, nq, nk, d, scale, qb, ld, k, ld, 0.0f, p, nk);
    sgemm(false, true, nq, nk, d, 1.0f, gb, ldo, v, ld, 0.0f, ds, nk);
    causal_softmax_backward_rows(p, ds, nk, nq, r0, l + r0, delta + r0);
    // dV[0:nk] += P^T dO_b;  dQ_b = scale dS K[0:nk];  dK[0:nk] += scale dS^T Q_b
    sgemm(true, false, nk, d, nq, 1.0f, p, nk, gb, ldo, beta, dv, ld);
    sgemm(false, false, nq, d, nk, scale, ds, nk, k, ld, 0.0f, dq + r0 * ld, ld);
    sgemm(true, false, nk, d, nq, scale, ds, nk, qb, ld, beta, dk, ld);
  }
}

// The rows of one (batch, head) pair's d features, starting at `first` with stride ld, widened
// into dst (rows ld_dst apart), or rounded back.
void widen_head(const std::uint16_t* first, std::int64_t ld, std::int64_t t, std::int64_t d,
                float* dst, std::int64_t ld_dst) {
  for (std::int64_t r = 0; r < t; ++r)
    widen_bf16(first + r * ld, dst + r * ld_dst, d);
}
void round_head(const float* src, std::int64_t ld_src, std::int64_t t, std::int64_t d,
                std::uint16_t* first, std::int64_t ld) {
  for (std::int64_t r = 0; r < t; ++r)
    round_to_bf16(src + r * ld_src, first + r * ld, d);
}

// Runs fn(unit, slot) for units [0, n) over the pool, contiguous ranges per thread; `slot` is
// the thread's index into per-thread scratch. When splitting is not worth it, everything runs on
// the calling thread with slot 0.
template <class F>
void for_units(ThreadPool& pool, std::int64_t n, bool worth_splitting, const F& fn) {
  const std::int64_t parts = worth_splitting ? std::min<std::int64_t>(pool.size(), n) : 1;
  if (parts <= 1) {
    for (std::int64_t u = 0; u < n; ++u)
      fn(u, 0);
    return;
  }
  struct Job {  // one pointer captured: std::function keeps it without allocating
    const F* fn;
    std::int64_t n, parts;
  } job{&fn, n, parts};
  const Job* jp = &job;
  pool.run([jp](int part, int) {
    if (part >= jp->parts) return;
    for (std::int64_t u = jp->n * part / jp->parts; u < jp->n * (part + 1) / jp->parts; ++u)
      (*jp->fn)(u, part);
  });
}

// Below this many multiply-adds an attention call stays on the calling thread.
constexpr double kAttnParallelFlops = 2.0e6;

}  // namespace

// ---- embedding

void CpuBackend::embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                                   Tensor& y) {
  const std::int64_t b = tokens.dim(0), t = tokens.dim(1), c = wte.dim(1);
  const std::int32_t* tok = tokens.data<std::int32_t>();
  check_tokens("embedding_forward", tok, b, t, wte.dim(0));
  const float* pte = wte.data<float>();
  const float* ppe = wpe.data<float>();
  float* py = y.data<float>();
  parallel_range(ctx_.pool(), b * t,
                 std::max<std::int64_t>(1, kParallelGrain / std::max<std::int64_t>(c, 1)),
                 [&](std::int64_t r0, std::int64_t r1) {
                   for (std::int64_t r = r0; r < r1; ++r)
                     add_rows(pte + tok[r] * c, ppe + (r % t) * c, py + r * c, c);
                 });
}

void CpuBackend::embedding_backward(const Tensor& tokens, const Tensor& dy, Tensor& dwte,
                                    Tensor& dwpe) {
  const std::int64_t b = tokens.dim(0), t = tokens.dim(1), c = dwte.dim(1);
  const std::int32_t* tok = tokens.data<std::int32_t>();
  check_tokens("embedding_backward", tok, b, t, dwte.dim(0));
  const float* pdy = dy.data<float>();
  float* pte = dwte.data<float>();
  float* ppe = dwpe.data<float>();
  // Positions: each row t sums the batch in order.
  parallel_range(ctx_.pool(), t,
                 std::max<std::int64_t>(1, kParallelGrain / std::max<std::int64_t>(b * c, 1)),
                 [&](std::int64_t t0, std::int64_t t1) {
                   for (std::int64_t p = t0; p < t1; ++p)
                     for (std::int64_t i = 0; i < b; ++i)
                       accumulate_row(pdy + (i * t + p) * c, ppe + p * c, c);
                 });
  // Tokens: a scatter-add, so threads split the columns and each walks every position in
  // order: repeated tokens never race and always sum in the same order.
  const std::int64_t n = b * t;
  parallel_range(ctx_.pool(), c,
                 std::max<std::int64_t>(kWidth, kParallelGrain / std::max<std::int64_t>(n, 1)),
                 [&](std::int64_t c0, std::int64_t c1) {
                   for (std::int64_t r = 0; r < n; ++r)
                     accumulate_row(pdy + r * c + c0, pte + tok[r] * c + c0, c1 - c0);
                 });
}

// ---- LayerNorm

void CpuBackend::layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                   float eps, Tensor& y, Tensor& mean, Tensor& rstd) {
  const std::int64_t c = x.dim(-1), rows = c ? x.numel() / c : 0;
  const float* px = x.data<float>();
  const float* pw = weight.data<float>();
  const float* pb = bias.data<float>();
  float* pm = mean.data<float>();
  float* pr = rstd.data<float>();
  const std::int64_t grain =
      std::max<std::int64_t>(1, kParallelGrain / 4 / std::max<std::int64_t>(c, 1));
  if (y.dtype() == DType::BF16) {  // each row normalised into scratch, then rounded
    std::uint16_t* py = bf16_out(y);
    parallel_range(ctx_.pool(), rows, grain, [&](std::int64_t r0, std::int64_t r1) {
      float* row = thread_scratch(static_cast<std::size_t>(c));
      for (std::int64_t r = r0; r < r1; ++r) {
        layernorm_rows(px + r * c, pw, pb, eps, row, pm + r, pr + r, 0, 1, c);
        round_to_bf16(row, py + r * c, c);
      }
    });
    return;
  }
  float* py = y.data<float>();
  parallel_range(ctx_.pool(), rows, grain, [&](std::int64_t r0, std::int64_t r1) {
    layernorm_rows(px, pw, pb, eps, py, pm, pr, r0, r1, c);
  });
}

// Each row's sum is added and normalised while it is still in L1: the bits of add followed by
// layernorm_forward (the same float additions, then layernorm_rows on the stored sum), with one
// pass less over memory. A bf16 branch a is widened a row at a time, a bf16 y rounded likewise.
void CpuBackend::residual_layernorm_forward(const Tensor& x, const Tensor& a, const Tensor& weight,
                                            const Tensor& bias, float eps, Tensor& s, Tensor& y,
                                            Tensor& mean, Tensor& rstd) {
  const std::int64_t c = x.dim(-1), rows = c ? x.numel() / c : 0;
  const bool a16 = a.dtype() == DType::BF16, y16 = y.dtype() == DType::BF16;
  const float* px = x.data<float>();
  const float* pa = a16 ? nullptr : a.data<float>();
  const std::uint16_t* pa16 = a16 ? bf16_in(a) : nullptr;
  const float* pw = weight.data<float>();
  const float* pb = bias.data<float>();
  float* ps = s.data<float>();
  float* py = y16 ? nullptr : y.data<float>();
  std::uint16_t* py16 = y16 ? bf16_out(y) : nullptr;
  float* pm = mean.data<float>();
  float* pr = rstd.data<float>();
  parallel_range(ctx_.pool(), rows,
                 std::max<std::int64_t>(1, kParallelGrain / 4 / std::max<std::int64_t>(c, 1)),
                 [&](std::int64_t r0, std::int64_t r1) {
                   float* wide = a16 ? thread_scratch(static_cast<std::size_t>(c), 0) : nullptr;
                   float* out = y16 ? thread_scratch(static_cast<std::size_t>(c), 1) : nullptr;
                   for (std::int64_t r = r0; r < r1; ++r) {
                     const float* ar = wide;
                     if (a16)
                       widen_bf16(pa16 + r * c, wide, c);
                     else
                       ar = pa + r * c;
                     add_rows(px + r * c, ar, ps + r * c, c);
                     float* yr = y16 ? out : py + r * c;
                     layernorm_rows(ps + r * c, pw, pb, eps, yr, pm + r, pr + r, 0, 1, c);
                     if (y16) round_to_bf16(out, py16 + r * c, c);
                   }
                 });
}

void CpuBackend::layernorm_backward(const Tensor& x, const Tensor& dy, const Tensor& weight,
                                    const Tensor& mean, const Tensor& rstd, const Tensor& dresidual,
                                    Tensor& dx, Tensor& dweight, Tensor& dbias) {
  const std::int64_t c = x.dim(-1), rows = c ? x.numel() / c : 0;
  if (rows == 0) return;
  const std::int64_t blocks = (rows + kLnRows - 1) / kLnRows;
  float* partial = scratch_floats(static_cast<std::size_t>(blocks * 2 * c));
  const bool dy16 = dy.dtype() == DType::BF16;  // widened a block of rows at a time
  const float* px = x.data<float>();
  const float* pdy = dy16 ? nullptr : dy.data<float>();
  const std::uint16_t* pdy16 = dy16 ? bf16_in(dy) : nullptr;
  const float* pw = weight.data<float>();
  const float* pm = mean.data<float>();
  const float* pr = rstd.data<float>();
  const float* pres = dresidual.defined() ? dresidual.data<float>() : nullptr;
  float* pdx = dx.data<float>();
  parallel_range(
      ctx_.pool(), blocks,
      std::max<std::int64_t>(1, kParallelGrain / 8 / std::max<std::int64_t>(kLnRows * c, 1)),
      [&](std::int64_t b0, std::int64_t b1) {
        float* wide = dy16 ? thread_scratch(static_cast<std::size_t>(kLnRows * c)) : nullptr;
        for (std::int64_t blk = b0; blk < b1; ++blk) {
          float* part = partial + blk * 2 * c;
          const std::int64_t r0 = blk * kLnRows, r1 = std::min(rows, r0 + kLnRows);
          const float* g = wide;
          if (dy16)
            widen_bf16(pdy16 + r0 * c, wide, (r1 - r0) * c);
          else
            g = pdy + r0 * c;
          layernorm_backward_rows(px, g, pw, pm, pr, pres, pdx, part, part + c, r0, r1, c);
        }
      });
  // Sum the block partials in block order, columns split over the threads.
  float* pdw = dweight.data<float>();
  float* pdb = dbias.data<float>();
  parallel_range(ctx_.pool(), c,
                 std::max<std::int64_t>(kWidth, kParallelGrain / std::max<std::int64_t>(blocks, 1)),
                 [&](std::int64_t c0, std::int64_t c1) {
                   for (std::int64_t blk = 0; blk < blocks; ++blk) {
                     const float* part = partial + blk * 2 * c;
                     accumulate_row(part + c0, pdw + c0, c1 - c0);
                     accumulate_row(part + c + c0, pdb + c0, c1 - c0);
                   }
                 });
}

// ---- GELU (tanh form)

// bf16 tensors go through in chunks: widened, the f32 kernel, rounded (element by element the
// f32 kernel's bits: its vector and tail code compute the same formula).
void CpuBackend::gelu_tanh_forward(const Tensor& x, Tensor& y) {
  if (x.dtype() == DType::BF16) {
    const std::uint16_t* px = bf16_in(x);
    std::uint16_t* py = bf16_out(y);
    parallel_range(ctx_.pool(), x.numel(), kParallelGrain / 8, [&](std::int64_t b, std::int64_t e) {
      float* buf = thread_scratch(kBf16Chunk);
      for (std::int64_t c0 = b; c0 < e; c0 += kBf16Chunk) {
        const std::int64_t n = std::min(kBf16Chunk, e - c0);
        widen_bf16(px + c0, buf, n);
        gelu_tanh_range(buf, buf, 0, n);
        round_to_bf16(buf, py + c0, n);
      }
    });
    return;
  }
  const float* px = x.data<float>();
  float* py = y.data<float>();
  parallel_range(ctx_.pool(), x.numel(), kParallelGrain / 8,
                 [&](std::int64_t b, std::int64_t e) { gelu_tanh_range(px, py, b, e); });
}

void CpuBackend::gelu_tanh_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  if (x.dtype() == DType::BF16) {  // dx may be dy: each chunk is read before it is written
    const std::uint16_t* px = bf16_in(x);
    const std::uint16_t* pdy = bf16_in(dy);
    std::uint16_t* pdx = bf16_out(dx);
    parallel_range(ctx_.pool(), x.numel(), kParallelGrain / 8, [&](std::int64_t b, std::int64_t e) {
      float* bx = thread_scratch(kBf16Chunk, 0);
      float* bg = thread_scratch(kBf16Chunk, 1);
      for (std::int64_t c0 = b; c0 < e; c0 += kBf16Chunk) {
        const std::int64_t n = std::min(kBf16Chunk, e - c0);
        widen_bf16(px + c0, bx, n);
        widen_bf16(pdy + c0, bg, n);
        gelu_tanh_backward_range(bx, bg, bg, 0, n);
        round_to_bf16(bg, pdx + c0, n);
      }
    });
    return;
  }
  const float* px = x.data<float>();
  const float* pdy = dy.data<float>();
  float* pdx = dx.data<float>();
  parallel_range(ctx_.pool(), x.numel(), kParallelGrain / 8, [&](std::int64_t b, std::int64_t e) {
    gelu_tanh_backward_range(px, pdy, pdx, b, e);
  });
}

// ---- causal self-attention

void CpuBackend::attention_forward(const Tensor& qkv, int heads, Tensor& out, Tensor& lse,
                                   AttentionKernel kernel) {
  (void)kernel;  // one CPU path
  const std::int64_t nb = qkv.dim(0), t = qkv.dim(1), c = qkv.dim(2) / 3;
  const HeadView hv{t, c, c / heads};
  const std::int64_t d = hv.d, ld = hv.ld_qkv();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const bool bf16 = qkv.dtype() == DType::BF16;
  float* plse = lse.data<float>();
  const std::int64_t units = nb * heads;
  // Per slot: the score tile, and for bf16 the pair's widened q, k, v [T, 3D] and output [T, D].
  const std::int64_t tile = std::min(kAttnBlock, t) * t;
  const std::int64_t per_slot = tile + (bf16 ? 4 * t * d : 0);
  const double flops = 2.0 * static_cast<double>(units) * static_cast<double>(t) * t * d;
  const int slots = flops >= kAttnParallelFlops ? ctx_.pool().size() : 1;
  float* scratch = scratch_floats(static_cast<std::size_t>(slots * per_slot));
  if (!bf16) {
    const float* pqkv = qkv.data<float>();
    float* pout = out.data<float>();
    for_units(ctx_.pool(), units, slots > 1, [&](std::int64_t u, int slot) {
      const std::int64_t bi = u / heads, h = u % heads;
      const float* q = pqkv + hv.q_offset(bi, h);
      attention_head_forward(q, q + c, q + 2 * c, ld, pout + hv.o_offset(bi, h), c, plse + u * t,
                             scratch + slot * per_slot, t, d, scale);
    });
    return;
  }
  const std::uint16_t* pqkv = bf16_in(qkv);
  std::uint16_t* pout = bf16_out(out);
  for_units(ctx_.pool(), units, slots > 1, [&](std::int64_t u, int slot) {
    const std::int64_t bi = u / heads, h = u % heads;
    float* s = scratch + slot * per_slot;
    float* q = s + tile;  // [T, 3D]: q, k, v side by side, as in qkv
    float* o = q + 3 * t * d;
    const std::uint16_t* first = pqkv + hv.q_offset(bi, h);
    for (int part = 0; part < 3; ++part)
      widen_head(first + part * c, ld, t, d, q + part * d, 3 * d);
    attention_head_forward(q, q + d, q + 2 * d, 3 * d, o, d, plse + u * t, s, t, d, scale);
    round_head(o, d, t, d, pout + hv.o_offset(bi, h), c);
  });
}

void CpuBackend::attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& dout,
                                    const Tensor& lse, int heads, Tensor& dqkv,
                                    AttentionKernel kernel) {
  (void)kernel;
  const std::int64_t nb = qkv.dim(0), t = qkv.dim(1), c = qkv.dim(2) / 3;
  const HeadView hv{t, c, c / heads};
  const std::int64_t d = hv.d, ld = hv.ld_qkv();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const bool bf16 = qkv.dtype() == DType::BF16;
  const float* plse = lse.data<float>();
  const std::int64_t units = nb * heads;
  // Per slot: the probability tile, the dP/dS tile and delta (one value per query); for bf16 also
  // the pair's widened q, k, v [T, 3D], out and dout [T, D] each, and dq, dk, dv [T, 3D].
  const std::int64_t tile = std::min(kAttnBlock, t) * t;
  const std::int64_t per_slot = 2 * tile + t + (bf16 ? 8 * t * d : 0);
  const double flops = 5.0 * static_cast<double>(units) * static_cast<double>(t) * t * d;
  const int slots = flops >= kAttnParallelFlops ? ctx_.pool().size() : 1;
  float* scratch = scratch_floats(static_cast<std::size_t>(slots * per_slot));
  if (!bf16) {
    const float* pqkv = qkv.data<float>();
    const float* pout = out.data<float>();
    const float* pdout = dout.data<float>();
    float* pdqkv = dqkv.data<float>();
    for_units(ctx_.pool(), units, slots > 1, [&](std::int64_t u, int slot) {
      const std::int64_t bi = u / heads, h = u % heads;
      const float* q = pqkv + hv.q_offset(bi, h);
      float* dq = pdqkv + hv.q_offset(bi, h);
      float* p = scratch + slot * per_slot;
      attention_head_backward(q, q + c, q + 2 * c, pout + hv.o_offset(bi, h),
                              pdout + hv.o_offset(bi, h), ld, c, plse + u * t, dq, dq + c,
                              dq + 2 * c, p, p + tile, p + 2 * tile, t, d, scale);
    });
    return;
  }
  const std::uint16_t* pqkv = bf16_in(qkv);
  const std::uint16_t* pout = bf16_in(out);
  const std::uint16_t* pdout = bf16_in(dout);
  std::uint16_t* pdqkv = bf16_out(dqkv);
  for_units(ctx_.pool(), units, slots > 1, [&](std::int64_t u, int slot) {
    const std::int64_t bi = u / heads, h = u % heads;
    float* p = scratch + slot * per_slot;
    float* q = p + 2 * tile + t;  // [T, 3D]
    float* o = q + 3 * t * d;     // [T, D]
    float* g = o + t * d;         // [T, D]
    float* dq = g + t * d;        // [T, 3D]
    const std::uint16_t* first = pqkv + hv.q_offset(bi, h);
    for (int part = 0; part < 3; ++part)
      widen_head(first + part * c, ld, t, d, q + part * d, 3 * d);
    widen_head(pout + hv.o_offset(bi, h), c, t, d, o, d);
    widen_head(pdout + hv.o_offset(bi, h), c, t, d, g, d);
    attention_head_backward(q, q + d, q + 2 * d, o, g, 3 * d, d, plse + u * t, dq, dq + d,
                            dq + 2 * d, p, p + tile, p + 2 * tile, t, d, scale);
    std::uint16_t* dfirst = pdqkv + hv.q_offset(bi, h);
    for (int part = 0; part < 3; ++part)
      round_head(dq + part * d, 3 * d, t, d, dfirst + part * c, ld);
  });
}

}  // namespace lockstep::ops::cpu
