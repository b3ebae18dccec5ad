// The per-element arithmetic of the CPU optimizer updates, shared by the per-tensor ops
// (cpu_loss_optim.cpp) and the fused flat-buffer ops (cpu_flat.cpp): one copy of the formulas,
// so both give the same bits for every element, however the elements are cut into ranges.
#pragma once

#include <cmath>
#include <cstdint>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "lockstep/ops/ops.hpp"
#include "ops/cpu/parallel.hpp"

namespace lockstep::ops::cpu {

// SGD as torch.optim.SGD (see ops.hpp). buf may be null when p.momentum == 0.
struct SgdLoop {
  float lr, wd, mu, damp;
  bool first, nesterov;

  SgdLoop(const SgdParams& p, bool decay)
      : lr(p.lr),
        wd(decay ? p.weight_decay : 0.0f),
        mu(p.momentum),
        damp(1.0f - p.dampening),
        first(p.first_step),
        nesterov(p.nesterov) {}

  // Elements [0, n) of w, g and buf.
  void operator()(float* w, const float* g, float* buf, std::int64_t n) const {
    // Locals, not members: a store through w or buf could alias a member as far as the compiler
    // knows, which would make it reload them every element and vectorise badly.
    const float lr = this->lr, wd = this->wd, mu = this->mu, damp = this->damp;
    const bool first = this->first, nesterov = this->nesterov;
    if (mu == 0.0f) {
      LOCKSTEP_IVDEP
      for (std::int64_t i = 0; i < n; ++i)
        w[i] -= lr * (g[i] + wd * w[i]);
      return;
    }
    LOCKSTEP_IVDEP
    for (std::int64_t i = 0; i < n; ++i) {
      const float gi = g[i] + wd * w[i];
      const float b = first ? gi : mu * buf[i] + damp * gi;
      buf[i] = b;
      w[i] -= lr * (nesterov ? gi + mu * b : b);
    }
  }
};

// AdamW as torch.optim.AdamW: step_size = lr / bc1, denominator = sqrt(v) / sqrt(bc2) + eps.
struct AdamWLoop {
  float decay, b1, b2, eps, step_size, inv_sqrt_bc2, one_b1, one_b2;

  AdamWLoop(const AdamWParams& p, bool apply_decay) {
    const double t = static_cast<double>(p.step);
    decay = 1.0f - p.lr * (apply_decay ? p.weight_decay : 0.0f);
    b1 = p.beta1;
    b2 = p.beta2;
    eps = p.eps;
    step_size = static_cast<float>(p.lr / (1.0 - std::pow(static_cast<double>(b1), t)));
    inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(static_cast<double>(b2), t)));
    one_b1 = 1.0f - b1;
    one_b2 = 1.0f - b2;
  }

  // Elements [0, n) of w, g, m and v.
  void operator()(float* pw, const float* pg, float* pm, float* pv, std::int64_t n) const {
    const float decay = this->decay, b1 = this->b1, b2 = this->b2, eps = this->eps;
    const float step_size = this->step_size, inv_sqrt_bc2 = this->inv_sqrt_bc2;
    const float one_b1 = this->one_b1, one_b2 = this->one_b2;
    std::int64_t i = 0;
#if defined(__SSE2__)
    // std::sqrt keeps errno semantics, which stops GCC from vectorising this loop; _mm_sqrt_ps
    // is the same correctly rounded square root four at a time, and the operations below are
    // the scalar loop's, in the same order, so every element gets the same bits on either path.
    const __m128 vb1 = _mm_set1_ps(b1), vb2 = _mm_set1_ps(b2), v1b1 = _mm_set1_ps(one_b1);
    const __m128 v1b2 = _mm_set1_ps(one_b2), vdecay = _mm_set1_ps(decay);
    const __m128 vstep = _mm_set1_ps(step_size), vbc2 = _mm_set1_ps(inv_sqrt_bc2);
    const __m128 veps = _mm_set1_ps(eps);
    for (; i + 4 <= n; i += 4) {
      const __m128 g = _mm_loadu_ps(pg + i);
      const __m128 mi = _mm_add_ps(_mm_mul_ps(vb1, _mm_loadu_ps(pm + i)), _mm_mul_ps(v1b1, g));
      const __m128 vi =
          _mm_add_ps(_mm_mul_ps(vb2, _mm_loadu_ps(pv + i)), _mm_mul_ps(_mm_mul_ps(v1b2, g), g));
      _mm_storeu_ps(pm + i, mi);
      _mm_storeu_ps(pv + i, vi);
      const __m128 denom = _mm_add_ps(_mm_mul_ps(_mm_sqrt_ps(vi), vbc2), veps);
      const __m128 w = _mm_sub_ps(_mm_mul_ps(_mm_loadu_ps(pw + i), vdecay),
                                  _mm_div_ps(_mm_mul_ps(vstep, mi), denom));
      _mm_storeu_ps(pw + i, w);
    }
#endif
    for (; i < n; ++i) {
      const float g = pg[i];
      const float mi = b1 * pm[i] + one_b1 * g;
      const float vi = b2 * pv[i] + one_b2 * g * g;
      pm[i] = mi;
      pv[i] = vi;
      pw[i] = pw[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
    }
  }
};

}  // namespace lockstep::ops::cpu
