// The GPT layers: embedding, LayerNorm (alone and after a residual sum), GELU (tanh form), causal
// attention: the kernels, their launchers and CudaBackend's methods of the family. Workspaces come
// from the caching allocator per call (the stream orders their reuse).
//
// Trade-offs, once for the file:
// - Deterministic everywhere, as common.cuh promises: no float atomics. The token-embedding
// gradient is a
//   scatter-add, so the tokens are sorted (CUB's stable radix sort of (token, position)) and one
//   block per distinct token sums its rows in position order; LayerNorm's weight gradient goes
//   through per-chunk partial sums added in a fixed order.
// - Attention, flash-style (Dao et al.): a block owns 64 query rows (4 threads per row, each
//   holding a quarter of the head's features in registers), streams the causal prefix of keys
//   and values through shared memory in tiles and keeps a running max and sum (online softmax),
//   so nothing of size [T, T] is ever written. The forward saves one log-sum-exp per row; the
//   backward recomputes the probabilities from it in two kernels, one owning key rows (dK, dV)
//   and one owning query rows (dQ), so every gradient row has one writer and needs no atomics
//   (FlashAttention-2 instead accumulates dQ atomically). fp32 on the CUDA cores: under bf16
//   precision cuDNN's fused attention (cuda_attention_cudnn.cpp) does the same on tensor cores,
//   and these kernels are the reference (train.attention = reference) and the fallback.
// - The naive path materialises the [B, heads, T, T] probabilities with one thread per output
//   element; it is the reference the flash kernels are checked and measured against.
// - bf16 activations (ops.hpp): the LayerNorm, GELU and flash kernels are templated on the type of
//   the activations they read and write (float, or bf16 as std::uint16_t: common.cuh's load_f32
//   and store_f32), so a bf16 tensor is widened as it is read and rounded as it is written, with
//   f32 arithmetic between, as the CPU computes it; cuDNN's attention takes bf16 q, k, v and
//   writes bf16 as they are. The naive attention, a reference only, runs on f32 copies.
// The warp helpers below are butterflies (every lane ends with the total), unlike
// block_reduce.cuh's, whose sum reaches lane 0 only; this file does not include that one.
#include <cuda_runtime.h>
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_attention_cudnn.hpp"  // defines: CudnnAttention
#include "ops/cuda/cuda_backend.hpp"
#include "ops/gelu_tanh.hpp"  // defines: gelu_tanh, gelu_tanh_grad

namespace lockstep::ops::cuda {
namespace {

// Butterfly sums: every lane ends with the total.
__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// ---------------------------------------------------------------- embedding

__global__ void embedding_forward_kernel(const std::int32_t* tokens, const float* wte,
                                         const float* wpe, float* y, i64 rows, i64 t, i64 c,
                                         i64 vocab, unsigned long long* bad) {
  LOCKSTEP_GRID_STRIDE(i, rows * c) {
    const i64 r = i / c, j = i % c;
    const std::int32_t tok = tokens[r];
    if (tok < 0 || tok >= vocab) {
      if (j == 0)
        atomicMin(bad,
                  (static_cast<unsigned long long>(r) << 32) | static_cast<std::uint32_t>(tok));
      y[i] = NAN;
      continue;
    }
    y[i] = wte[tok * c + j] + wpe[(r % t) * c + j];
  }
}

__global__ void position_grad_kernel(const float* dy, float* dwpe, i64 b, i64 t, i64 c) {
  LOCKSTEP_GRID_STRIDE(i, t * c) {
    const i64 p = i / c, j = i % c;
    float acc = 0.0f;
    for (i64 k = 0; k < b; ++k)
      acc += dy[(k * t + p) * c + j];
    dwpe[i] += acc;
  }
}

__global__ void iota_kernel(std::int32_t* v, i64 n) {
  LOCKSTEP_GRID_STRIDE(i, n) v[i] = static_cast<std::int32_t>(i);
}

// grid (n, column chunks): block x starts a run of equal sorted tokens, or exits.
__global__ void token_grad_kernel(const std::int32_t* keys, const std::int32_t* positions,
                                  const float* dy, float* dwte, i64 n, i64 c, i64 vocab) {
  const i64 head = blockIdx.x;
  const std::int32_t key = keys[head];
  if ((head > 0 && keys[head - 1] == key) || key < 0 || key >= vocab) return;
  const i64 col = static_cast<i64>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (col >= c) return;
  float acc = 0.0f;
  for (i64 k = head; k < n && keys[k] == key; ++k)
    acc += dy[static_cast<i64>(positions[k]) * c + col];
  dwte[static_cast<i64>(key) * c + col] += acc;
}

struct SortBuffers {
  std::int32_t *keys_out, *vals_in, *vals_out;
  void* temp;
  std::size_t temp_bytes;
};

std::size_t align256(std::size_t b) {
  return (b + 255) / 256 * 256;
}

std::size_t sort_temp_bytes(i64 n) {
  std::size_t bytes = 0;
  LOCKSTEP_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, static_cast<const std::int32_t*>(nullptr),
      static_cast<std::int32_t*>(nullptr), static_cast<const std::int32_t*>(nullptr),
      static_cast<std::int32_t*>(nullptr), static_cast<int>(n)));
  return bytes;
}

SortBuffers carve(void* workspace, i64 n) {
  auto* p = static_cast<char*>(workspace);
  const std::size_t ints = align256(static_cast<std::size_t>(n) * sizeof(std::int32_t));
  return {reinterpret_cast<std::int32_t*>(p), reinterpret_cast<std::int32_t*>(p + ints),
          reinterpret_cast<std::int32_t*>(p + 2 * ints), p + 3 * ints, sort_temp_bytes(n)};
}

// ---------------------------------------------------------------- LayerNorm

// One warp normalises row xr into yr. The lane reads back only the elements it wrote (a fused
// caller's sum), so no fence is needed.
template <class TY>
__device__ __forceinline__ void layernorm_row(const float* xr, const float* w, const float* bias,
                                              float eps, TY* yr, float* mean, float* rstd, i64 row,
                                              i64 c, int lane, float sum) {
  const float m = warp_sum(sum) / static_cast<float>(c);
  float v = 0.0f;
  for (i64 j = lane; j < c; j += 32) {
    const float d = xr[j] - m;
    v += d * d;
  }
  const float r = 1.0f / sqrtf(warp_sum(v) / static_cast<float>(c) + eps);
  for (i64 j = lane; j < c; j += 32)
    store_f32(yr, j, (xr[j] - m) * r * w[j] + bias[j]);
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// One warp per row.
template <class TY>
__global__ void layernorm_forward_kernel(const float* x, const float* w, const float* bias,
                                         float eps, TY* y, float* mean, float* rstd, i64 rows,
                                         i64 c) {
  const i64 row = (static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float* xr = x + row * c;
  float s = 0.0f;
  for (i64 j = lane; j < c; j += 32)
    s += xr[j];
  layernorm_row(xr, w, bias, eps, y + row * c, mean, rstd, row, c, lane, s);
}

// s = x + a, then the LayerNorm of s, one warp per row: the bits of add_kernel followed by
// layernorm_forward_kernel (the same lanes add the same elements in the same order), with x and a
// read once and s read back from cache instead of from memory by a second kernel.
template <class TA, class TY>
__global__ void residual_layernorm_forward_kernel(const float* x, const TA* a, const float* w,
                                                  const float* bias, float eps, float* s, TY* y,
                                                  float* mean, float* rstd, i64 rows, i64 c) {
  const i64 row = (static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  float* sr = s + row * c;
  float sum = 0.0f;
  for (i64 j = lane; j < c; j += 32) {
    const float v = x[row * c + j] + load_f32(a, row * c + j);
    sr[j] = v;
    sum += v;
  }
  layernorm_row(sr, w, bias, eps, y + row * c, mean, rstd, row, c, lane, sum);
}

template <class TG>
__global__ void layernorm_backward_dx_kernel(const float* x, const TG* dy, const float* w,
                                             const float* mean, const float* rstd,
                                             const float* dres, float* dx, i64 rows, i64 c) {
  const i64 row = (static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float* xr = x + row * c;
  const TG* gr = dy + row * c;
  const float m = mean[row], r = rstd[row];
  float a = 0.0f, b = 0.0f;
  for (i64 j = lane; j < c; j += 32) {
    const float g = load_f32(gr, j) * w[j];
    a += g;
    b += g * (xr[j] - m) * r;
  }
  a = warp_sum(a) / static_cast<float>(c);
  b = warp_sum(b) / static_cast<float>(c);
  for (i64 j = lane; j < c; j += 32) {
    const float xh = (xr[j] - m) * r;
    float v = (load_f32(gr, j) * w[j] - a - xh * b) * r;
    if (dres) v += dres[row * c + j];
    dx[row * c + j] = v;
  }
}

// Rows per chunk of the weight-gradient reduction; the chunk count depends only on the shape.
constexpr i64 kLnChunkRows = 128;

// grid (column tiles of 32, chunks), block (32, 8): partial sums of chunk `blockIdx.y`.
template <class TG>
__global__ void layernorm_param_partials_kernel(const float* x, const TG* dy, const float* mean,
                                                const float* rstd, float* part_w, float* part_b,
                                                i64 rows, i64 c) {
  __shared__ float sw[8][33], sb[8][33];
  const i64 col = static_cast<i64>(blockIdx.x) * 32 + threadIdx.x;
  const i64 r0 = static_cast<i64>(blockIdx.y) * kLnChunkRows;
  const i64 r1 = r0 + kLnChunkRows < rows ? r0 + kLnChunkRows : rows;
  float aw = 0.0f, ab = 0.0f;
  if (col < c) {
    for (i64 r = r0 + threadIdx.y; r < r1; r += 8) {
      const float g = load_f32(dy, r * c + col);
      aw += g * (x[r * c + col] - mean[r]) * rstd[r];
      ab += g;
    }
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && col < c) {
    float tw = 0.0f, tb = 0.0f;
    for (int k = 0; k < 8; ++k) {
      tw += sw[k][threadIdx.x];
      tb += sb[k][threadIdx.x];
    }
    part_w[blockIdx.y * c + col] = tw;
    part_b[blockIdx.y * c + col] = tb;
  }
}

// dw[j] += sum_k part_w[k, j] and db[j] += sum_k part_b[k, j], the chunks in a fixed order:
// block (32, 32) over 32 columns, row y of the block adding chunks y, y + 32, ..., then the 32 sums
// added in y order. One thread per column (3 blocks for C = 768) left 129 of an H200's 132 SMs
// idle while each thread added all 64 chunks of a gpt2-124m step in turn.
constexpr int kPartialLanes = 32;

__global__ void layernorm_param_sum_kernel(const float* part_w, const float* part_b, float* dw,
                                           float* db, i64 chunks, i64 c) {
  __shared__ float sw[kPartialLanes][33], sb[kPartialLanes][33];
  const i64 col = static_cast<i64>(blockIdx.x) * 32 + threadIdx.x;
  float tw = 0.0f, tb = 0.0f;
  if (col < c) {
    for (i64 k = threadIdx.y; k < chunks; k += kPartialLanes) {
      tw += part_w[k * c + col];
      tb += part_b[k * c + col];
    }
  }
  sw[threadIdx.y][threadIdx.x] = tw;
  sb[threadIdx.y][threadIdx.x] = tb;
  __syncthreads();
  if (threadIdx.y == 0 && col < c) {
    float w = 0.0f, b = 0.0f;
    for (int k = 0; k < kPartialLanes; ++k) {
      w += sw[k][threadIdx.x];
      b += sb[k][threadIdx.x];
    }
    dw[col] += w;
    db[col] += b;
  }
}

// ---------------------------------------------------------------- GELU (tanh form)
// The formula (and its clamp, without which the backward gives NaN below x = -10.3) is the one in
// ops/gelu_tanh.hpp, shared with the host tests and matching the CPU's.

// T: float, or bf16 (std::uint16_t). The backward may run in place (dx = dy).
template <class T>
__global__ void gelu_tanh_forward_kernel(const T* x, T* y, i64 n) {
  LOCKSTEP_GRID_STRIDE(i, n) {
    store_f32(y, i, gelu_tanh(load_f32(x, i)));
  }
}

template <class T>
__global__ void gelu_tanh_backward_kernel(const T* x, const T* dy, T* dx, i64 n) {
  LOCKSTEP_GRID_STRIDE(i, n) {
    store_f32(dx, i, gelu_tanh_grad(load_f32(x, i), load_f32(dy, i)));
  }
}

// ---------------------------------------------------------------- attention: shared pieces

// delta[bh, i] = dout_i . out_i over the head's features (the softmax backward's row term).
template <class T>
__global__ void attention_delta_kernel(const T* out, const T* dout, float* delta, i64 b, i64 t,
                                       i64 c, int heads) {
  const i64 d = c / heads;
  LOCKSTEP_GRID_STRIDE(idx, b * heads * t) {
    const i64 bh = idx / t, i = idx % t, bi = bh / heads, h = bh % heads;
    const T* o = out + (bi * t + i) * c + h * d;
    const T* g = dout + (bi * t + i) * c + h * d;
    float acc = 0.0f;
    for (i64 k = 0; k < d; ++k)
      acc += load_f32(o, k) * load_f32(g, k);
    delta[idx] = acc;
  }
}

// ---------------------------------------------------------------- attention: flash kernels

template <int D>
struct Flash {
  static constexpr int kGroup = 4;                 // threads per query (or key) row
  static constexpr int kSlice = D / kGroup;        // features per thread
  static constexpr int kRows = 64;                 // rows a block owns
  static constexpr int kTile = D <= 64 ? 64 : 32;  // rows per shared-memory tile
  static constexpr int kThreads = kRows * kGroup;
  static_assert(kSlice % 4 == 0, "float4 slices");
};

// Sum over the 4 threads of a row group (adjacent lanes), every thread gets the total.
__device__ __forceinline__ float group_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v;
}

template <int S>
__device__ __forceinline__ float slice_dot(const float (&a)[S], const float* b) {
  float acc = 0.0f;
#pragma unroll
  for (int k = 0; k < S; k += 4) {
    const float4 v = *reinterpret_cast<const float4*>(b + k);
    acc += a[k] * v.x + a[k + 1] * v.y + a[k + 2] * v.z + a[k + 3] * v.w;
  }
  return acc;
}

template <int S>
__device__ __forceinline__ void slice_axpy(float (&y)[S], float alpha, const float* x) {
#pragma unroll
  for (int k = 0; k < S; k += 4) {
    const float4 v = *reinterpret_cast<const float4*>(x + k);
    y[k] += alpha * v.x;
    y[k + 1] += alpha * v.y;
    y[k + 2] += alpha * v.z;
    y[k + 3] += alpha * v.w;
  }
}

// Block index -> (query or key tile, batch*head), heaviest tiles (the last ones, which see the
// longest causal prefix) first so the tail of the grid is short.
struct TileIndex {
  int tile, bh;
};
__device__ __forceinline__ TileIndex tile_index(int tiles, int bhs, bool heavy_last) {
  const int idx = blockIdx.x, rank = idx / bhs;
  return {heavy_last ? tiles - 1 - rank : rank, idx % bhs};
}

// Rows [first, first + rows) of one head's features (offset `feature`) from a [*, ld] matrix
// into a shared tile, zeros past `limit`, times `mul`.
template <int D, int ROWS, class T>
__device__ __forceinline__ void load_tile(float (*tile)[D], const T* src, i64 ld, int first,
                                          int limit, float mul) {
  for (int idx = threadIdx.x; idx < ROWS * D / 4; idx += blockDim.x) {
    const int r = idx / (D / 4), k = (idx % (D / 4)) * 4, row = first + r;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (row < limit) {
      const T* p = src + row * ld + k;
      v = make_float4(load_f32(p, 0) * mul, load_f32(p, 1) * mul, load_f32(p, 2) * mul,
                      load_f32(p, 3) * mul);
    }
    *reinterpret_cast<float4*>(&tile[r][k]) = v;
  }
}

template <int D, class T>
__global__ void __launch_bounds__(Flash<D>::kThreads)
    flash_forward_kernel(const T* __restrict__ qkv, T* __restrict__ out, float* __restrict__ lse,
                         int t, int c, int heads, float scale) {
  using F = Flash<D>;
  constexpr int S = F::kSlice, TILE = F::kTile;
  __shared__ __align__(16) float ks[TILE][D];
  __shared__ __align__(16) float vs[TILE][D];
  const int tiles = (t + F::kRows - 1) / F::kRows, bhs = static_cast<int>(gridDim.x) / tiles;
  const TileIndex ti = tile_index(tiles, bhs, true);
  const int b = ti.bh / heads, h = ti.bh % heads;
  const int row = threadIdx.x / F::kGroup, part = threadIdx.x % F::kGroup;
  const int i = ti.tile * F::kRows + row;
  const i64 ld = 3 * static_cast<i64>(c);
  const T* base = qkv + static_cast<i64>(b) * t * ld + h * D;

  float q[S], acc[S];
#pragma unroll
  for (int k = 0; k < S; ++k) {
    q[k] = i < t ? load_f32(base, i * ld + part * S + k) * scale : 0.0f;
    acc[k] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int last = min(t, (ti.tile + 1) * F::kRows);  // this block's queries see keys [0, last)
  for (int k0 = 0; k0 < last; k0 += TILE) {
    __syncthreads();  // the previous tile is no longer read
    load_tile<D, TILE>(ks, base + c, ld, k0, t, 1.0f);
    load_tile<D, TILE>(vs, base + 2 * c, ld, k0, t, 1.0f);
    __syncthreads();
    const int nk = min(TILE, last - k0);  // the same for the whole block: shuffles stay converged
    for (int jj = 0; jj < nk; jj += 8) {
      float s[8];
      float chunk_max = -INFINITY;
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const float dot = group_sum(slice_dot(q, &ks[jj + u][part * S]));
        const int j = k0 + jj + u;
        s[u] = (jj + u < nk && j <= i) ? dot : -INFINITY;
        chunk_max = fmaxf(chunk_max, s[u]);
      }
      const float m_new = fmaxf(m, chunk_max);
      // m = -inf means nothing seen yet (acc and l are zero); s = -inf is a masked key.
      const float corr = m == -INFINITY ? 0.0f : expf(m - m_new);
      l *= corr;
#pragma unroll
      for (int k = 0; k < S; ++k)
        acc[k] *= corr;
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const float p = s[u] == -INFINITY ? 0.0f : expf(s[u] - m_new);
        l += p;
        slice_axpy(acc, p, &vs[jj + u][part * S]);
      }
      m = m_new;
    }
  }
  if (i < t) {
    T* o = out + (static_cast<i64>(b) * t + i) * c + h * D + part * S;
    const float inv = 1.0f / l;
#pragma unroll
    for (int k = 0; k < S; ++k)
      store_f32(o, k, acc[k] * inv);
    if (part == 0) lse[static_cast<i64>(ti.bh) * t + i] = m + logf(l);
  }
}

// dK and dV: a block owns 64 key rows and walks the queries that see them (i >= j).
template <int D, class T>
__global__ void __launch_bounds__(Flash<D>::kThreads)
    flash_backward_kv_kernel(const T* __restrict__ qkv, const T* __restrict__ dout,
                             const float* __restrict__ lse, const float* __restrict__ delta,
                             T* __restrict__ dqkv, int t, int c, int heads, float scale) {
  using F = Flash<D>;
  constexpr int S = F::kSlice, TILE = F::kTile;
  __shared__ __align__(16) float qs[TILE][D];
  __shared__ __align__(16) float gs[TILE][D];
  __shared__ float ls[TILE], dls[TILE];
  const int tiles = (t + F::kRows - 1) / F::kRows, bhs = static_cast<int>(gridDim.x) / tiles;
  // Early key tiles see the most queries: run them first.
  const TileIndex ti = tile_index(tiles, bhs, false);
  const int b = ti.bh / heads, h = ti.bh % heads;
  const int row = threadIdx.x / F::kGroup, part = threadIdx.x % F::kGroup;
  const int j = ti.tile * F::kRows + row;
  const i64 ld = 3 * static_cast<i64>(c);
  const T* base = qkv + static_cast<i64>(b) * t * ld + h * D;
  const T* gbase = dout + static_cast<i64>(b) * t * c + h * D;
  const float* lrow = lse + static_cast<i64>(ti.bh) * t;
  const float* drow = delta + static_cast<i64>(ti.bh) * t;

  float kr[S], vr[S], dk[S], dv[S];
#pragma unroll
  for (int k = 0; k < S; ++k) {
    kr[k] = j < t ? load_f32(base, j * ld + c + part * S + k) : 0.0f;
    vr[k] = j < t ? load_f32(base, j * ld + 2 * c + part * S + k) : 0.0f;
    dk[k] = 0.0f;
    dv[k] = 0.0f;
  }
  for (int q0 = ti.tile * F::kRows; q0 < t; q0 += TILE) {
    __syncthreads();
    load_tile<D, TILE>(qs, base, ld, q0, t, scale);  // scaled: s = q.k and dK = sum ds q both
    load_tile<D, TILE>(gs, gbase, c, q0, t, 1.0f);   // carry the 1/sqrt(D)
    for (int r = threadIdx.x; r < TILE; r += blockDim.x) {
      ls[r] = q0 + r < t ? lrow[q0 + r] : 0.0f;
      dls[r] = q0 + r < t ? drow[q0 + r] : 0.0f;
    }
    __syncthreads();
    const int nq = min(TILE, t - q0);
    for (int ii = 0; ii < nq; ++ii) {
      const int i = q0 + ii;
      const float s = group_sum(slice_dot(kr, &qs[ii][part * S]));
      const float dp = group_sum(slice_dot(vr, &gs[ii][part * S]));
      const float p = (i >= j && j < t) ? expf(s - ls[ii]) : 0.0f;
      const float ds = p * (dp - dls[ii]);
      slice_axpy(dv, p, &gs[ii][part * S]);
      slice_axpy(dk, ds, &qs[ii][part * S]);
    }
  }
  if (j < t) {
    T* dst = dqkv + (static_cast<i64>(b) * t + j) * ld + h * D + part * S;
#pragma unroll
    for (int k = 0; k < S; ++k) {
      store_f32(dst, c + k, dk[k]);
      store_f32(dst, 2 * c + k, dv[k]);
    }
  }
}

// dQ: a block owns 64 query rows and walks their causal prefix of keys.
template <int D, class T>
__global__ void __launch_bounds__(Flash<D>::kThreads)
    flash_backward_q_kernel(const T* __restrict__ qkv, const T* __restrict__ dout,
                            const float* __restrict__ lse, const float* __restrict__ delta,
                            T* __restrict__ dqkv, int t, int c, int heads, float scale) {
  using F = Flash<D>;
  constexpr int S = F::kSlice, TILE = F::kTile;
  __shared__ __align__(16) float ks[TILE][D];
  __shared__ __align__(16) float vs[TILE][D];
  const int tiles = (t + F::kRows - 1) / F::kRows, bhs = static_cast<int>(gridDim.x) / tiles;
  const TileIndex ti = tile_index(tiles, bhs, true);
  const int b = ti.bh / heads, h = ti.bh % heads;
  const int row = threadIdx.x / F::kGroup, part = threadIdx.x % F::kGroup;
  const int i = ti.tile * F::kRows + row;
  const i64 ld = 3 * static_cast<i64>(c);
  const T* base = qkv + static_cast<i64>(b) * t * ld + h * D;
  const T* grow = dout + (static_cast<i64>(b) * t + i) * c + h * D + part * S;

  float q[S], g[S], dq[S];
#pragma unroll
  for (int k = 0; k < S; ++k) {
    q[k] = i < t ? load_f32(base, i * ld + part * S + k) * scale : 0.0f;
    g[k] = i < t ? load_f32(grow, k) : 0.0f;
    dq[k] = 0.0f;
  }
  const float li = i < t ? lse[static_cast<i64>(ti.bh) * t + i] : 0.0f;
  const float di = i < t ? delta[static_cast<i64>(ti.bh) * t + i] : 0.0f;
  const int last = min(t, (ti.tile + 1) * F::kRows);
  for (int k0 = 0; k0 < last; k0 += TILE) {
    __syncthreads();
    load_tile<D, TILE>(ks, base + c, ld, k0, t, 1.0f);
    load_tile<D, TILE>(vs, base + 2 * c, ld, k0, t, 1.0f);
    __syncthreads();
    const int nk = min(TILE, last - k0);
    for (int jj = 0; jj < nk; ++jj) {
      const int j = k0 + jj;
      const float s = group_sum(slice_dot(q, &ks[jj][part * S]));
      const float dp = group_sum(slice_dot(g, &vs[jj][part * S]));
      const float p = (j <= i && i < t) ? expf(s - li) : 0.0f;
      slice_axpy(dq, p * (dp - di), &ks[jj][part * S]);
    }
  }
  if (i < t) {
    T* dst = dqkv + (static_cast<i64>(b) * t + i) * ld + h * D + part * S;
#pragma unroll
    for (int k = 0; k < S; ++k)
      store_f32(dst, k, dq[k] * scale);
  }
}

template <int D, class T>
void launch_flash_forward(const T* qkv, T* out, float* lse, i64 b, i64 t, i64 c, int heads,
                          cudaStream_t s) {
  using F = Flash<D>;
  const i64 tiles = (t + F::kRows - 1) / F::kRows;
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  flash_forward_kernel<D, T><<<static_cast<unsigned>(tiles * b * heads), F::kThreads, 0, s>>>(
      qkv, out, lse, static_cast<int>(t), static_cast<int>(c), heads, scale);
  LOCKSTEP_CHECK_LAUNCH();
}

template <int D, class T>
void launch_flash_backward(const T* qkv, const T* dout, const float* lse, const float* delta,
                           T* dqkv, i64 b, i64 t, i64 c, int heads, cudaStream_t s) {
  using F = Flash<D>;
  const unsigned grid = static_cast<unsigned>((t + F::kRows - 1) / F::kRows * b * heads);
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  flash_backward_kv_kernel<D, T><<<grid, F::kThreads, 0, s>>>(
      qkv, dout, lse, delta, dqkv, static_cast<int>(t), static_cast<int>(c), heads, scale);
  LOCKSTEP_CHECK_LAUNCH();
  flash_backward_q_kernel<D, T><<<grid, F::kThreads, 0, s>>>(
      qkv, dout, lse, delta, dqkv, static_cast<int>(t), static_cast<int>(c), heads, scale);
  LOCKSTEP_CHECK_LAUNCH();
}

// ---------------------------------------------------------------- attention: naive reference

// att[bh, i, j] = scale q_i . k_j for j <= i (0 above the diagonal; the softmax skips it).
__global__ void naive_scores_kernel(const float* qkv, float* att, i64 b, i64 t, i64 c, int heads,
                                    float scale) {
  const i64 d = c / heads, ld = 3 * c;
  LOCKSTEP_GRID_STRIDE(idx, b * heads * t * t) {
    const i64 j = idx % t, i = (idx / t) % t, bh = idx / (t * t);
    const i64 bi = bh / heads, h = bh % heads;
    float acc = 0.0f;
    if (j <= i) {
      const float* q = qkv + (bi * t + i) * ld + h * d;
      const float* k = qkv + (bi * t + j) * ld + c + h * d;
      for (i64 x = 0; x < d; ++x)
        acc += q[x] * k[x];
    }
    att[idx] = acc * scale;
  }
}

// One warp per row (bh, i): probabilities over j <= i in place, zeros after, and lse.
__global__ void naive_softmax_kernel(float* att, float* lse, i64 rows, i64 t) {
  const i64 r = (static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const i64 i = r % t;
  float* row = att + r * t;
  float m = -INFINITY;
  for (i64 j = lane; j <= i; j += 32)
    m = fmaxf(m, row[j]);
  m = warp_max(m);
  float sum = 0.0f;
  for (i64 j = lane; j <= i; j += 32)
    sum += expf(row[j] - m);
  sum = warp_sum(sum);
  for (i64 j = lane; j < t; j += 32)
    row[j] = j <= i ? expf(row[j] - m) / sum : 0.0f;
  if (lane == 0) lse[r] = m + logf(sum);
}

// out[b, i, h, x] = sum_{j <= i} P[bh, i, j] v_j[x]
__global__ void naive_pv_kernel(const float* att, const float* qkv, float* out, i64 b, i64 t, i64 c,
                                int heads) {
  const i64 d = c / heads, ld = 3 * c;
  LOCKSTEP_GRID_STRIDE(idx, b * t * c) {
    const i64 x = idx % d, h = (idx / d) % heads, i = (idx / c) % t, bi = idx / (t * c);
    const float* p = att + ((bi * heads + h) * t + i) * t;
    const float* v = qkv + bi * t * ld + 2 * c + h * d + x;
    float acc = 0.0f;
    for (i64 j = 0; j <= i; ++j)
      acc += p[j] * v[j * ld];
    out[idx] = acc;
  }
}

// P and dS = P (dP - delta) for every (bh, i, j <= i), from lse (as the flash backward does).
__global__ void naive_dscores_kernel(const float* qkv, const float* dout, const float* lse,
                                     const float* delta, float* p_out, float* ds_out, i64 b, i64 t,
                                     i64 c, int heads, float scale) {
  const i64 d = c / heads, ld = 3 * c;
  LOCKSTEP_GRID_STRIDE(idx, b * heads * t * t) {
    const i64 j = idx % t, i = (idx / t) % t, bh = idx / (t * t);
    const i64 bi = bh / heads, h = bh % heads;
    float p = 0.0f, ds = 0.0f;
    if (j <= i) {
      const float* q = qkv + (bi * t + i) * ld + h * d;
      const float* k = qkv + (bi * t + j) * ld + c + h * d;
      const float* v = k + c;
      const float* g = dout + (bi * t + i) * c + h * d;
      float s = 0.0f, dp = 0.0f;
      for (i64 x = 0; x < d; ++x) {
        s += q[x] * k[x];
        dp += g[x] * v[x];
      }
      p = expf(s * scale - lse[bh * t + i]);
      ds = p * (dp - delta[bh * t + i]);
    }
    p_out[idx] = p;
    ds_out[idx] = ds;
  }
}

__global__ void naive_dq_kernel(const float* qkv, const float* ds, float* dqkv, i64 b, i64 t, i64 c,
                                int heads, float scale) {
  const i64 d = c / heads, ld = 3 * c;
  LOCKSTEP_GRID_STRIDE(idx, b * t * c) {
    const i64 x = idx % d, h = (idx / d) % heads, i = (idx / c) % t, bi = idx / (t * c);
    const float* row = ds + ((bi * heads + h) * t + i) * t;
    const float* k = qkv + bi * t * ld + c + h * d + x;
    float acc = 0.0f;
    for (i64 j = 0; j <= i; ++j)
      acc += row[j] * k[j * ld];
    dqkv[(bi * t + i) * ld + h * d + x] = acc * scale;
  }
}

__global__ void naive_dkv_kernel(const float* qkv, const float* dout, const float* p,
                                 const float* ds, float* dqkv, i64 b, i64 t, i64 c, int heads,
                                 float scale) {
  const i64 d = c / heads, ld = 3 * c;
  LOCKSTEP_GRID_STRIDE(idx, b * t * c) {
    const i64 x = idx % d, h = (idx / d) % heads, j = (idx / c) % t, bi = idx / (t * c);
    const i64 plane = (bi * heads + h) * t * t;
    const float* q = qkv + bi * t * ld + h * d + x;
    const float* g = dout + bi * t * c + h * d + x;
    float dk = 0.0f, dv = 0.0f;
    for (i64 i = j; i < t; ++i) {
      dk += ds[plane + i * t + j] * q[i * ld];
      dv += p[plane + i * t + j] * g[i * c];
    }
    dqkv[(bi * t + j) * ld + c + h * d + x] = dk * scale;
    dqkv[(bi * t + j) * ld + 2 * c + h * d + x] = dv;
  }
}

}  // namespace

// ---------------------------------------------------------------- launchers

// ---- embedding. bad_token: one device word; the first position whose token is outside
// [0, vocab) is recorded as (position << 32 | token) by atomicMin (the output row gets NaN).
void embedding_forward(const std::int32_t* tokens, const float* wte, const float* wpe, float* y,
                       i64 b, i64 t, i64 c, i64 vocab, unsigned long long* bad_token,
                       cudaStream_t s) {
  if (b * t * c == 0) return;
  embedding_forward_kernel<<<blocks_for(b * t * c), kThreads, 0, s>>>(tokens, wte, wpe, y, b * t, t,
                                                                      c, vocab, bad_token);
  LOCKSTEP_CHECK_LAUNCH();
}

// Workspace for embedding_backward, in bytes.
std::size_t embedding_backward_workspace(i64 n, i64 vocab) {
  (void)vocab;
  return 3 * align256(static_cast<std::size_t>(n) * sizeof(std::int32_t)) + sort_temp_bytes(n);
}

// dwpe[t] += sum_b dy[b, t]; dwte[v] += sum of dy rows with token v, summed in position order
// (a stable radix sort of the tokens groups them; no atomics).
void embedding_backward(const std::int32_t* tokens, const float* dy, float* dwte, float* dwpe,
                        i64 b, i64 t, i64 c, i64 vocab, void* workspace,
                        std::size_t workspace_bytes, cudaStream_t s) {
  const i64 n = b * t;
  if (n * c == 0) return;
  LOCKSTEP_CHECK(workspace_bytes >= embedding_backward_workspace(n, vocab),
                 "embedding backward: workspace too small");
  position_grad_kernel<<<blocks_for(t * c), kThreads, 0, s>>>(dy, dwpe, b, t, c);
  LOCKSTEP_CHECK_LAUNCH();
  SortBuffers sb = carve(workspace, n);
  iota_kernel<<<blocks_for(n), kThreads, 0, s>>>(sb.vals_in, n);
  LOCKSTEP_CHECK_LAUNCH();
  // All 32 key bits: an out-of-range token (reported by the forward) must still sort as itself,
  // so equal tokens stay adjacent and every run has exactly one writer.
  LOCKSTEP_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(sb.temp, sb.temp_bytes, tokens, sb.keys_out,
                                                      sb.vals_in, sb.vals_out, static_cast<int>(n),
                                                      0, 32, s));
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>((c + kThreads - 1) / kThreads));
  token_grad_kernel<<<grid, kThreads, 0, s>>>(sb.keys_out, sb.vals_out, dy, dwte, n, c, vocab);
  LOCKSTEP_CHECK_LAUNCH();
}

// ---- LayerNorm over rows of c features. TY, TA, TG: an activation's type (float or bf16).
template <class TY>
void layernorm_forward(const float* x, const float* w, const float* bias, float eps, TY* y,
                       float* mean, float* rstd, i64 rows, i64 c, cudaStream_t s) {
  if (rows == 0) return;
  constexpr int kRowsPerBlock = kThreads / 32;
  const unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  layernorm_forward_kernel<TY><<<blocks, kThreads, 0, s>>>(x, w, bias, eps, y, mean, rstd, rows, c);
  LOCKSTEP_CHECK_LAUNCH();
}

// s = x + a, then the LayerNorm of s (mean, rstd as above).
template <class TA, class TY>
void residual_layernorm_forward(const float* x, const TA* a, const float* w, const float* bias,
                                float eps, float* s, TY* y, float* mean, float* rstd, i64 rows,
                                i64 c, cudaStream_t st) {
  if (rows == 0) return;
  constexpr int kRowsPerBlock = kThreads / 32;
  const unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  residual_layernorm_forward_kernel<TA, TY>
      <<<blocks, kThreads, 0, st>>>(x, a, w, bias, eps, s, y, mean, rstd, rows, c);
  LOCKSTEP_CHECK_LAUNCH();
}

// Workspace (floats) for the weight/bias partial sums.
i64 layernorm_backward_workspace(i64 rows, i64 c) {
  return 2 * ((rows + kLnChunkRows - 1) / kLnChunkRows) * c;
}

// dx = dres (may be null, or equal to dx) + dL/dx; dw, db accumulate.
template <class TG>
void layernorm_backward(const float* x, const TG* dy, const float* w, const float* mean,
                        const float* rstd, const float* dres, float* dx, float* dw, float* db,
                        i64 rows, i64 c, float* workspace, cudaStream_t s) {
  if (rows == 0 || c == 0) return;
  constexpr int kRowsPerBlock = kThreads / 32;
  const unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  layernorm_backward_dx_kernel<TG>
      <<<blocks, kThreads, 0, s>>>(x, dy, w, mean, rstd, dres, dx, rows, c);
  LOCKSTEP_CHECK_LAUNCH();
  const i64 chunks = (rows + kLnChunkRows - 1) / kLnChunkRows;
  float* part_w = workspace;
  float* part_b = workspace + chunks * c;
  const dim3 grid(static_cast<unsigned>((c + 31) / 32), static_cast<unsigned>(chunks));
  layernorm_param_partials_kernel<TG>
      <<<grid, dim3(32, 8), 0, s>>>(x, dy, mean, rstd, part_w, part_b, rows, c);
  LOCKSTEP_CHECK_LAUNCH();
  layernorm_param_sum_kernel<<<static_cast<unsigned>((c + 31) / 32), dim3(32, kPartialLanes), 0,
                               s>>>(part_w, part_b, dw, db, chunks, c);
  LOCKSTEP_CHECK_LAUNCH();
}

// ---- GELU, tanh form. T: float or bf16.
template <class T>
void gelu_tanh_forward(const T* x, T* y, i64 n, cudaStream_t s) {
  if (n == 0) return;
  gelu_tanh_forward_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(x, y, n);
  LOCKSTEP_CHECK_LAUNCH();
}

template <class T>
void gelu_tanh_backward(const T* x, const T* dy, T* dx, i64 n, cudaStream_t s) {
  if (n == 0) return;
  gelu_tanh_backward_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(x, dy, dx, n);
  LOCKSTEP_CHECK_LAUNCH();
}

// ---- causal attention. qkv [b, t, 3c], out [b, t, c], lse [b, heads, t]; T: float or bf16.
// The flash kernels handle head widths 16, 32, 64 and 128; flash_attention_supported says so.
bool flash_attention_supported(i64 head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128;
}

template <class T>
void flash_attention_forward(const T* qkv, T* out, float* lse, i64 b, i64 t, i64 c, int heads,
                             cudaStream_t s) {
  if (b * t == 0) return;
  switch (c / heads) {
    case 16:
      return launch_flash_forward<16>(qkv, out, lse, b, t, c, heads, s);
    case 32:
      return launch_flash_forward<32>(qkv, out, lse, b, t, c, heads, s);
    case 64:
      return launch_flash_forward<64>(qkv, out, lse, b, t, c, heads, s);
    case 128:
      return launch_flash_forward<128>(qkv, out, lse, b, t, c, heads, s);
    default:
      LOCKSTEP_FAIL("flash attention: head width ", c / heads, " is not 16, 32, 64 or 128");
  }
}

// delta: workspace of b * heads * t floats.
template <class T>
void flash_attention_backward(const T* qkv, const T* out, const T* dout, const float* lse, T* dqkv,
                              float* delta, i64 b, i64 t, i64 c, int heads, cudaStream_t s) {
  if (b * t == 0) return;
  attention_delta_kernel<T>
      <<<blocks_for(b * heads * t), kThreads, 0, s>>>(out, dout, delta, b, t, c, heads);
  LOCKSTEP_CHECK_LAUNCH();
  switch (c / heads) {
    case 16:
      return launch_flash_backward<16>(qkv, dout, lse, delta, dqkv, b, t, c, heads, s);
    case 32:
      return launch_flash_backward<32>(qkv, dout, lse, delta, dqkv, b, t, c, heads, s);
    case 64:
      return launch_flash_backward<64>(qkv, dout, lse, delta, dqkv, b, t, c, heads, s);
    case 128:
      return launch_flash_backward<128>(qkv, dout, lse, delta, dqkv, b, t, c, heads, s);
    default:
      LOCKSTEP_FAIL("flash attention: head width ", c / heads, " is not 16, 32, 64 or 128");
  }
}

// The reference: materialises the [b, heads, t, t] probabilities (workspace: scores of that
// size for the forward; twice that plus b * heads * t for the backward).
i64 naive_attention_workspace(i64 b, i64 t, int heads, bool backward) {
  const i64 plane = b * heads * t * t;
  return backward ? 2 * plane + b * heads * t : plane;
}

void naive_attention_forward(const float* qkv, float* out, float* lse, float* workspace, i64 b,
                             i64 t, i64 c, int heads, cudaStream_t s) {
  if (b * t == 0) return;
  const float scale = 1.0f / sqrtf(static_cast<float>(c / heads));
  const i64 scores = b * heads * t * t, rows = b * heads * t;
  naive_scores_kernel<<<blocks_for(scores), kThreads, 0, s>>>(qkv, workspace, b, t, c, heads,
                                                              scale);
  LOCKSTEP_CHECK_LAUNCH();
  constexpr int kRowsPerBlock = kThreads / 32;
  naive_softmax_kernel<<<static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock),
                         kThreads, 0, s>>>(workspace, lse, rows, t);
  LOCKSTEP_CHECK_LAUNCH();
  naive_pv_kernel<<<blocks_for(b * t * c), kThreads, 0, s>>>(workspace, qkv, out, b, t, c, heads);
  LOCKSTEP_CHECK_LAUNCH();
}

void naive_attention_backward(const float* qkv, const float* out, const float* dout,
                              const float* lse, float* dqkv, float* workspace, i64 b, i64 t, i64 c,
                              int heads, cudaStream_t s) {
  if (b * t == 0) return;
  const float scale = 1.0f / sqrtf(static_cast<float>(c / heads));
  const i64 plane = b * heads * t * t;
  float* p = workspace;
  float* ds = workspace + plane;
  float* delta = workspace + 2 * plane;
  attention_delta_kernel<float>
      <<<blocks_for(b * heads * t), kThreads, 0, s>>>(out, dout, delta, b, t, c, heads);
  LOCKSTEP_CHECK_LAUNCH();
  naive_dscores_kernel<<<blocks_for(plane), kThreads, 0, s>>>(qkv, dout, lse, delta, p, ds, b, t, c,
                                                              heads, scale);
  LOCKSTEP_CHECK_LAUNCH();
  naive_dq_kernel<<<blocks_for(b * t * c), kThreads, 0, s>>>(qkv, ds, dqkv, b, t, c, heads, scale);
  LOCKSTEP_CHECK_LAUNCH();
  naive_dkv_kernel<<<blocks_for(b * t * c), kThreads, 0, s>>>(qkv, dout, p, ds, dqkv, b, t, c,
                                                              heads, scale);
  LOCKSTEP_CHECK_LAUNCH();
}

// ---- CudaBackend's methods
void CudaBackend::embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                                    Tensor& y) {
  activate();
  token_positions_ = tokens.dim(1);
  token_vocab_ = wte.dim(0);
  cuda::embedding_forward(tokens.data<std::int32_t>(), wte.data<float>(), wpe.data<float>(),
                          y.data<float>(), tokens.dim(0), tokens.dim(1), wte.dim(1), wte.dim(0),
                          &results()->bad_token, stream_);
}
void CudaBackend::embedding_backward(const Tensor& tokens, const Tensor& dy, Tensor& dwte,
                                     Tensor& dwpe) {
  activate();
  const std::int64_t n = tokens.numel();
  const std::size_t bytes = embedding_backward_workspace(n, dwte.dim(0));
  Tensor ws = Tensor::empty({static_cast<std::int64_t>(bytes)}, DType::U8, device_);
  cuda::embedding_backward(tokens.data<std::int32_t>(), dy.data<float>(), dwte.data<float>(),
                           dwpe.data<float>(), tokens.dim(0), tokens.dim(1), dwte.dim(1),
                           dwte.dim(0), ws.raw_data(), bytes, stream_);
}
namespace {
// An activation's elements as the kernels take them: float, or bf16 as its 16-bit patterns.
const std::uint16_t* bf16_in(const Tensor& t) {
  return static_cast<const std::uint16_t*>(t.raw_data());
}
bool is_bf16(const Tensor& t) {
  return t.dtype() == DType::BF16;
}
}  // namespace

void CudaBackend::layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                    float eps, Tensor& y, Tensor& mean, Tensor& rstd) {
  activate();
  const std::int64_t c = x.dim(-1), rows = c ? x.numel() / c : 0;
  auto run = [&](auto* py) {
    cuda::layernorm_forward(x.data<float>(), weight.data<float>(), bias.data<float>(), eps, py,
                            mean.data<float>(), rstd.data<float>(), rows, c, stream_);
  };
  if (is_bf16(y))
    run(bf16_data(y));
  else
    run(y.data<float>());
}
void CudaBackend::residual_layernorm_forward(const Tensor& x, const Tensor& a, const Tensor& weight,
                                             const Tensor& bias, float eps, Tensor& s, Tensor& y,
                                             Tensor& mean, Tensor& rstd) {
  activate();
  const std::int64_t c = x.dim(-1), rows = c ? x.numel() / c : 0;
  auto run = [&](const auto* pa, auto* py) {
    cuda::residual_layernorm_forward(x.data<float>(), pa, weight.data<float>(), bias.data<float>(),
                                     eps, s.data<float>(), py, mean.data<float>(),
                                     rstd.data<float>(), rows, c, stream_);
  };
  auto with_y = [&](const auto* pa) {
    if (is_bf16(y))
      run(pa, bf16_data(y));
    else
      run(pa, y.data<float>());
  };
  if (is_bf16(a))
    with_y(bf16_in(a));
  else
    with_y(a.data<float>());
}
void CudaBackend::layernorm_backward(const Tensor& x, const Tensor& dy, const Tensor& weight,
                                     const Tensor& mean, const Tensor& rstd,
                                     const Tensor& dresidual, Tensor& dx, Tensor& dweight,
                                     Tensor& dbias) {
  activate();
  const std::int64_t c = x.dim(-1), rows = c ? x.numel() / c : 0;
  Tensor ws = Tensor::empty({std::max<std::int64_t>(layernorm_backward_workspace(rows, c), 1)},
                            DType::F32, device_);
  auto run = [&](const auto* pdy) {
    cuda::layernorm_backward(
        x.data<float>(), pdy, weight.data<float>(), mean.data<float>(), rstd.data<float>(),
        dresidual.defined() ? dresidual.data<float>() : nullptr, dx.data<float>(),
        dweight.data<float>(), dbias.data<float>(), rows, c, ws.data<float>(), stream_);
  };
  if (is_bf16(dy))
    run(bf16_in(dy));
  else
    run(dy.data<float>());
}
void CudaBackend::gelu_tanh_forward(const Tensor& x, Tensor& y) {
  activate();
  if (is_bf16(x))
    cuda::gelu_tanh_forward(bf16_in(x), bf16_data(y), x.numel(), stream_);
  else
    cuda::gelu_tanh_forward(x.data<float>(), y.data<float>(), x.numel(), stream_);
}
void CudaBackend::gelu_tanh_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  activate();
  if (is_bf16(x))
    cuda::gelu_tanh_backward(bf16_in(x), bf16_in(dy), bf16_data(dx), x.numel(), stream_);
  else
    cuda::gelu_tanh_backward(x.data<float>(), dy.data<float>(), dx.data<float>(), x.numel(),
                             stream_);
}
// AttentionKernel::Cudnn: cuDNN's fused attention reads and writes bf16. The activations of a GPT
// block under bf16 are bf16 already and go to it as they are; f32 tensors (the op called on them
// directly) are cast at the op's boundary (the rounding is the CPU's, common.cuh). Every cast back
// is exact where the value came from bf16: out, widened by the forward, is bf16 again in the
// backward bit for bit, so no bf16 state is kept between the passes.
CudnnAttention& CudaBackend::fused_attention() {
  if (!fused_attention_) fused_attention_ = std::make_unique<CudnnAttention>(device_, stream_);
  return *fused_attention_;
}
AttentionChoice CudaBackend::cudnn_attention(Precision p, std::int64_t b, std::int64_t t, int heads,
                                             std::int64_t head_dim) {
  activate();
  return fused_attention().check(p, b, t, heads, head_dim);
}

namespace {
// src as bf16: itself, or a rounded copy of an f32 tensor.
Tensor as_bf16(const Tensor& src, Device device, cudaStream_t s) {
  if (is_bf16(src)) return src;
  Tensor dst = Tensor::empty(src.shape(), DType::BF16, device);
  f32_to_bf16(src.data<float>(), bf16_data(dst), src.numel(), s);
  return dst;
}
// src as f32: itself, or a widened copy of a bf16 tensor.
Tensor as_f32(const Tensor& src, Device device, cudaStream_t s) {
  if (!is_bf16(src)) return src;
  Tensor dst = Tensor::empty(src.shape(), DType::F32, device);
  bf16_to_f32(bf16_in(src), dst.data<float>(), src.numel(), s);
  return dst;
}
// An output of dst's shape in `dtype`: dst itself when it has that dtype, else a temporary that
// finish() copies into dst (rounded or widened).
struct OutputAs {
  Tensor& dst;
  Tensor buffer;
  OutputAs(Tensor& d, DType dtype, Device device)
      : dst(d), buffer(d.dtype() == dtype ? d : Tensor::empty(d.shape(), dtype, device)) {}
  void finish(cudaStream_t s) {
    if (buffer.raw_data() == dst.raw_data()) return;
    if (is_bf16(dst))
      f32_to_bf16(buffer.data<float>(), bf16_data(dst), dst.numel(), s);
    else
      bf16_to_f32(bf16_in(buffer), dst.data<float>(), dst.numel(), s);
  }
};
}  // namespace

// Reference: the flash kernels (in the activations' own dtype), or the naive path at head widths
// they do not cover (on f32 copies).
void CudaBackend::attention_forward(const Tensor& qkv, int heads, Tensor& out, Tensor& lse,
                                    AttentionKernel kernel) {
  activate();
  const std::int64_t b = qkv.dim(0), t = qkv.dim(1), c = qkv.dim(2) / 3;
  if (kernel == AttentionKernel::Cudnn) {
    Tensor qkv16 = as_bf16(qkv, device_, stream_);
    OutputAs o(out, DType::BF16, device_);
    fused_attention().forward(bf16_in(qkv16), bf16_data(o.buffer), lse.data<float>(), b, t, c,
                              heads);
    o.finish(stream_);
    return;
  }
  if (kernel != AttentionKernel::Naive && flash_attention_supported(c / heads)) {
    if (is_bf16(qkv))
      flash_attention_forward(bf16_in(qkv), bf16_data(out), lse.data<float>(), b, t, c, heads,
                              stream_);
    else
      flash_attention_forward(qkv.data<float>(), out.data<float>(), lse.data<float>(), b, t, c,
                              heads, stream_);
    return;
  }
  Tensor ws =
      Tensor::empty({std::max<std::int64_t>(naive_attention_workspace(b, t, heads, false), 1)},
                    DType::F32, device_);
  Tensor qkv32 = as_f32(qkv, device_, stream_);
  OutputAs o(out, DType::F32, device_);
  naive_attention_forward(qkv32.data<float>(), o.buffer.data<float>(), lse.data<float>(),
                          ws.data<float>(), b, t, c, heads, stream_);
  o.finish(stream_);
}
void CudaBackend::attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& dout,
                                     const Tensor& lse, int heads, Tensor& dqkv,
                                     AttentionKernel kernel) {
  activate();
  const std::int64_t b = qkv.dim(0), t = qkv.dim(1), c = qkv.dim(2) / 3;
  if (kernel == AttentionKernel::Cudnn) {
    Tensor qkv16 = as_bf16(qkv, device_, stream_), out16 = as_bf16(out, device_, stream_),
           dout16 = as_bf16(dout, device_, stream_);
    OutputAs d(dqkv, DType::BF16, device_);
    fused_attention().backward(bf16_in(qkv16), bf16_in(out16), bf16_in(dout16), lse.data<float>(),
                               bf16_data(d.buffer), b, t, c, heads);
    d.finish(stream_);
    return;
  }
  if (kernel != AttentionKernel::Naive && flash_attention_supported(c / heads)) {
    Tensor delta = Tensor::empty({std::max<std::int64_t>(b * heads * t, 1)}, DType::F32, device_);
    if (is_bf16(qkv))
      flash_attention_backward(bf16_in(qkv), bf16_in(out), bf16_in(dout), lse.data<float>(),
                               bf16_data(dqkv), delta.data<float>(), b, t, c, heads, stream_);
    else
      flash_attention_backward(qkv.data<float>(), out.data<float>(), dout.data<float>(),
                               lse.data<float>(), dqkv.data<float>(), delta.data<float>(), b, t, c,
                               heads, stream_);
    return;
  }
  Tensor ws =
      Tensor::empty({std::max<std::int64_t>(naive_attention_workspace(b, t, heads, true), 1)},
                    DType::F32, device_);
  Tensor qkv32 = as_f32(qkv, device_, stream_), out32 = as_f32(out, device_, stream_),
         dout32 = as_f32(dout, device_, stream_);
  OutputAs d(dqkv, DType::F32, device_);
  naive_attention_backward(qkv32.data<float>(), out32.data<float>(), dout32.data<float>(),
                           lse.data<float>(), d.buffer.data<float>(), ws.data<float>(), b, t, c,
                           heads, stream_);
  d.finish(stream_);
}

}  // namespace lockstep::ops::cuda
