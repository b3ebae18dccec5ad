// CPU backend: construction, memory ops and GEMM.
//
// Threading model (why it is this way: docs/PERFORMANCE.md, "Ops (CPU)").
// A Context owns ctx.threads() threads (its ThreadPool, the caller being thread 0) and every
// kernel of its backend runs on those threads only, so two Contexts driven from two std::threads
// (the DataParallel baseline) never share a worker, a lock or a scratch buffer.
//  * GEMM: each GEMM is cut into ctx.threads() blocks of rows (or columns) of C, each a
//    single-threaded sgemm (oneDNN's or OpenBLAS's, cpu_sgemm.hpp) on one pool thread; OpenBLAS's
//    thread count is process-global (openblas_set_num_threads), so it is set to 1 once. The cut
//    depends only on the shape and ctx.threads(), so results are deterministic per thread count;
//    1 and 2 threads can differ in the last bits (the kernels treat edge tiles differently).
//  * Convolution: Debian's oneDNN runs on OpenMP (libgomp). omp_set_num_threads() is a
//    per-calling-thread setting, so the backend sets it to ctx.threads() right before executing
//    a primitive; each calling std::thread gets its own OpenMP team. libgomp workers spin before
//    sleeping unless OMP_WAIT_POLICY=PASSIVE is in the environment when the library loads, which
//    launchers (and the tests) must export on shared cores.
//  * Own loops (pooling, elementwise, bias, batchnorm, loss, optimizer): ctx.pool(), and only above
//    kParallelGrain elements. Reductions use fixed blocks (kReduceBlock, per-channel or
//    per-column loops) summed in a fixed order, so they are bitwise independent of the thread
//    count; GEMM and the oneDNN convolution are the exceptions: deterministic for a given
//    thread count only.
// Nothing here is process-global and mutable except the one-time OpenBLAS setting.
#include "ops/cpu/cpu_backend.hpp"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "lockstep/core/error.hpp"
#include "ops/cpu/bf16_rows.hpp"
#include "ops/cpu/cpu_sgemm.hpp"
#include "ops/cpu/parallel.hpp"

namespace lockstep::ops {

std::unique_ptr<Backend> make_cpu_backend(Context& ctx) {
  return std::make_unique<cpu::CpuBackend>(ctx);
}

namespace cpu {
namespace {

// Below this many multiply-adds a GEMM runs on the calling thread: splitting it would cost more
// in wake-up latency than it saves (about 20 us of single-core sgemm).
constexpr double kGemmParallelFlops = 4.0e6;
// Blocks of C handed to one thread are a multiple of this many rows/columns, so the sgemm
// micro-kernels (up to 16 wide in this build) see full tiles except at the matrix edge.
constexpr std::int64_t kGemmSplitAlign = 16;

}  // namespace

void init_openblas_once() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

double* CpuBackend::scratch_doubles(std::size_t n) {
  if (scratch_.size() < n) scratch_.resize(n);
  return scratch_.data();
}

void CpuBackend::fill(Tensor& t, float value) {
  std::int64_t n = t.numel();
  if (t.dtype() == DType::F32) {
    float* p = t.data<float>();
    parallel_range(ctx_.pool(), n, kParallelGrain,
                   [&](std::int64_t b, std::int64_t e) { std::fill(p + b, p + e, value); });
  } else {
    std::int32_t* p = t.data<std::int32_t>();
    auto v = static_cast<std::int32_t>(value);
    parallel_range(ctx_.pool(), n, kParallelGrain,
                   [&](std::int64_t b, std::int64_t e) { std::fill(p + b, p + e, v); });
  }
}

void CpuBackend::copy(const Tensor& src, Tensor& dst) {
  const char* s = static_cast<const char*>(src.raw_data());
  char* d = static_cast<char*>(dst.raw_data());
  if (s == d) return;
  auto bytes = static_cast<std::int64_t>(src.nbytes());
  parallel_range(ctx_.pool(), bytes, 4 * kParallelGrain, [&](std::int64_t b, std::int64_t e) {
    std::memmove(d + b, s + b, static_cast<std::size_t>(e - b));
  });
}

void CpuBackend::batch_transpose(const Tensor& x, Tensor& y) {
  const std::int64_t batch = x.dim(0), m = x.dim(1), k = x.dim(2);
  const float* px = x.data<float>();
  float* py = y.data<float>();
  // Square tiles: a tile's rows are read and its columns written while both stay in L1.
  constexpr std::int64_t kTile = 32;
  const std::int64_t row_tiles = (m + kTile - 1) / kTile;
  const std::int64_t grain =
      std::max<std::int64_t>(1, kParallelGrain / (kTile * std::max<std::int64_t>(k, 1)));
  parallel_range(ctx_.pool(), batch * row_tiles, grain, [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t b = t / row_tiles, i0 = (t % row_tiles) * kTile;
      const std::int64_t i1 = std::min(m, i0 + kTile);
      const float* xb = px + b * m * k;
      float* yb = py + b * m * k;
      for (std::int64_t j0 = 0; j0 < k; j0 += kTile) {
        const std::int64_t j1 = std::min(k, j0 + kTile);
        for (std::int64_t i = i0; i < i1; ++i)
          for (std::int64_t j = j0; j < j1; ++j)
            yb[j * m + i] = xb[i * k + j];
      }
    }
  });
}

void CpuBackend::gemm(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
                      float beta, Tensor& c) {
  gemm_k(trans_a, trans_b, trans_a ? a.dim(0) : a.dim(1), alpha, a, b, beta, c);
}

// The sgemm reads a and b through their own row lengths (lda, ldb), so k may stop short of them.
void CpuBackend::gemm_leading(std::int64_t k, float alpha, const Tensor& a, const Tensor& b,
                              float beta, Tensor& c) {
  gemm_k(false, false, k, alpha, a, b, beta, c);
}

void CpuBackend::gemm_k(bool trans_a, bool trans_b, std::int64_t k, float alpha, const Tensor& a,
                        const Tensor& b, float beta, Tensor& c) {
  const std::int64_t m = c.dim(0), n = c.dim(1);
  if (m == 0 || n == 0) return;
  if (k == 0 && c.dtype() == DType::BF16) {  // beta is 0 (ops.cpp): +0.0 is all zero bits
    std::memset(c.raw_data(), 0, c.nbytes());
    return;
  }
  if (k == 0) {  // BLAS would leave C untouched for beta=1, but define it for all betas
    float* pc = c.data<float>();
    for (std::int64_t i = 0; i < m * n; ++i)
      pc[i] = beta == 0.0f ? 0.0f : beta * pc[i];
    return;
  }
  if (ctx_.precision() == Precision::BF16) {
    gemm_bf16(trans_a, trans_b, k, alpha, a, b, beta, c);
    return;
  }
  float* pc = c.data<float>();
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  const std::int64_t lda = a.dim(1), ldb = b.dim(1), ldc = n;

  auto block = [&](std::int64_t m0, std::int64_t m1, std::int64_t n0, std::int64_t n1) {
    const float* a0 = trans_a ? pa + m0 : pa + m0 * lda;
    const float* b0 = trans_b ? pb + n0 * ldb : pb + n0;
    sgemm(trans_a, trans_b, m1 - m0, n1 - n0, k, alpha, a0, lda, b0, ldb, beta, pc + m0 * ldc + n0,
          ldc);
  };

  const double flops =
      2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const bool split_rows = m >= n;
  const std::int64_t dim = split_rows ? m : n;
  const std::int64_t units = (dim + kGemmSplitAlign - 1) / kGemmSplitAlign;
  if (ctx_.threads() == 1 || flops < kGemmParallelFlops || units < 2) {
    block(0, m, 0, n);
    return;
  }
  parallel_range(ctx_.pool(), units, 1, [&](std::int64_t ub, std::int64_t ue) {
    std::int64_t lo = ub * kGemmSplitAlign, hi = std::min(ue * kGemmSplitAlign, dim);
    if (split_rows) {
      block(lo, hi, 0, n);
    } else {
      block(0, m, lo, hi);
    }
  });
}

void CpuBackend::add_row_bias(Tensor& y, const Tensor& bias) {
  const std::int64_t f = bias.numel(), rows = f ? y.numel() / f : 0;
  float* py = y.data<float>();
  const float* pb = bias.data<float>();
  parallel_range(ctx_.pool(), rows,
                 std::max<std::int64_t>(1, kParallelGrain / std::max<std::int64_t>(f, 1)),
                 [&](std::int64_t r0, std::int64_t r1) {
                   for (std::int64_t r = r0; r < r1; ++r) {
                     float* row = py + r * f;
                     for (std::int64_t j = 0; j < f; ++j)
                       row[j] += pb[j];
                   }
                 });
}

void CpuBackend::sum_rows(const Tensor& dy, Tensor& db) {
  // Each column is summed over the rows in row order by one thread, whatever the pool size: the
  // result is independent of the thread count. Columns go in blocks of kCols so the running sums
  // stay in registers/L1 while the rows stream past.
  constexpr std::int64_t kCols = 256;
  // A bf16 dy is widened a row segment at a time: the same additions as for its f32 copy.
  const std::int64_t f = db.numel(), rows = f ? dy.numel() / f : 0;
  const bool bf16 = dy.dtype() == DType::BF16;
  const float* pdy = bf16 ? nullptr : dy.data<float>();
  const std::uint16_t* pdy16 = bf16 ? bf16_in(dy) : nullptr;
  float* pdb = db.data<float>();
  const std::int64_t blocks = (f + kCols - 1) / kCols;
  const std::int64_t grain =
      std::max<std::int64_t>(1, kParallelGrain / std::max<std::int64_t>(rows * kCols, 1));
  parallel_range(ctx_.pool(), blocks, grain, [&](std::int64_t b0, std::int64_t b1) {
    float acc[kCols], wide[kCols];
    for (std::int64_t blk = b0; blk < b1; ++blk) {
      const std::int64_t c0 = blk * kCols, w = std::min(kCols, f - c0);
      for (std::int64_t j = 0; j < w; ++j)
        acc[j] = 0.0f;
      for (std::int64_t r = 0; r < rows; ++r) {
        const float* row = wide;
        if (bf16)
          widen_bf16(pdy16 + r * f + c0, wide, w);
        else
          row = pdy + r * f + c0;
        for (std::int64_t j = 0; j < w; ++j)
          acc[j] += row[j];
      }
      for (std::int64_t j = 0; j < w; ++j)
        pdb[c0 + j] += acc[j];
    }
  });
}

}  // namespace cpu
}  // namespace lockstep::ops
