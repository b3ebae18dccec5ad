// Layout changes: ops::batch_transpose (NCHW <-> NHWC activations, a model's conversions where
// the image layout changes) and the filter transpositions of channels-last convolutions
// (cuda_conv.cpp), with their launchers.
//
// Trade-offs: a 32x32 tile through shared memory (padded against bank conflicts), so both the
// reads and the writes are coalesced; one block per tile in a grid-stride loop over all tiles of
// all batch entries, so no grid dimension limits the shapes. The accumulating form adds a
// transposed filter gradient into the f32 one (parameter gradients accumulate).
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_backend.hpp"

namespace lockstep::ops::cuda {
namespace {

constexpr int kTile = 32;
constexpr int kTileRows = 8;  // threads per block: kTile x kTileRows, each moving 4 elements

template <class T, bool kAccumulate>
__global__ void batch_transpose_kernel(const T* x, T* y, i64 batch, i64 m, i64 k) {
  __shared__ T tile[kTile][kTile + 1];
  const i64 tiles_m = (m + kTile - 1) / kTile, tiles_k = (k + kTile - 1) / kTile;
  const i64 total = batch * tiles_m * tiles_k;
  for (i64 t = blockIdx.x; t < total; t += gridDim.x) {
    const i64 b = t / (tiles_m * tiles_k), r = t % (tiles_m * tiles_k);
    const i64 i0 = (r / tiles_k) * kTile, j0 = (r % tiles_k) * kTile;
    const T* xb = x + b * m * k;
    T* yb = y + b * m * k;
    for (int row = threadIdx.y; row < kTile; row += kTileRows) {
      const i64 i = i0 + row, j = j0 + threadIdx.x;
      if (i < m && j < k) tile[row][threadIdx.x] = xb[i * k + j];
    }
    __syncthreads();
    for (int row = threadIdx.y; row < kTile; row += kTileRows) {
      const i64 j = j0 + row, i = i0 + threadIdx.x;
      if (i < m && j < k) {
        if constexpr (kAccumulate)
          yb[j * m + i] += tile[threadIdx.x][row];
        else
          yb[j * m + i] = tile[threadIdx.x][row];
      }
    }
    __syncthreads();  // the tile is refilled by the next iteration
  }
}

template <class T, bool kAccumulate>
void launch_transpose(const T* x, T* y, i64 batch, i64 m, i64 k, cudaStream_t s) {
  const i64 tiles = batch * ((m + kTile - 1) / kTile) * ((k + kTile - 1) / kTile);
  if (tiles <= 0) return;
  const unsigned blocks = static_cast<unsigned>(tiles < kMaxBlocks ? tiles : kMaxBlocks);
  batch_transpose_kernel<T, kAccumulate>
      <<<blocks, dim3(kTile, kTileRows), 0, s>>>(x, y, batch, m, k);
  LOCKSTEP_CHECK_LAUNCH();
}

}  // namespace

void batch_transpose(const float* x, float* y, i64 batch, i64 m, i64 k, bool accumulate,
                     cudaStream_t s) {
  if (accumulate)
    launch_transpose<float, true>(x, y, batch, m, k, s);
  else
    launch_transpose<float, false>(x, y, batch, m, k, s);
}

void batch_transpose(const std::uint16_t* x, std::uint16_t* y, i64 batch, i64 m, i64 k,
                     cudaStream_t s) {
  launch_transpose<std::uint16_t, false>(x, y, batch, m, k, s);
}

void CudaBackend::batch_transpose(const Tensor& x, Tensor& y) {
  activate();
  cuda::batch_transpose(x.data<float>(), y.data<float>(), x.dim(0), x.dim(1), x.dim(2),
                        /*accumulate=*/false, stream_);
}

}  // namespace lockstep::ops::cuda
