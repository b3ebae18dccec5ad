// Launchers for the GPT kernels (transformer.cu): embedding, LayerNorm, GELU (tanh form) and
// causal multi-head attention, flash-style and naive. Plain pointers and sizes, one stream each,
// like kernels.hpp; CudaBackend unpacks Tensors and owns the workspaces sized by the *_bytes
// functions. Every reduction is deterministic (fixed grids, no float atomics).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace lockstep::ops::cuda {

using i64 = std::int64_t;

// ---- embedding. bad_token: one device word; the first position whose token is outside
// [0, vocab) is recorded as (position << 32 | token) by atomicMin (the output row gets NaN).
void embedding_forward(const std::int32_t* tokens, const float* wte, const float* wpe, float* y,
                       i64 b, i64 t, i64 c, i64 vocab, unsigned long long* bad_token,
                       cudaStream_t s);
// Workspace for embedding_backward, in bytes.
std::size_t embedding_backward_workspace(i64 n, i64 vocab);
// dwpe[t] += sum_b dy[b, t]; dwte[v] += sum of dy rows with token v, summed in position order
// (a stable radix sort of the tokens groups them; no atomics).
void embedding_backward(const std::int32_t* tokens, const float* dy, float* dwte, float* dwpe,
                        i64 b, i64 t, i64 c, i64 vocab, void* workspace,
                        std::size_t workspace_bytes, cudaStream_t s);

// ---- LayerNorm over rows of c features.
void layernorm_forward(const float* x, const float* w, const float* bias, float eps, float* y,
                       float* mean, float* rstd, i64 rows, i64 c, cudaStream_t s);
// Workspace (floats) for the weight/bias partial sums.
i64 layernorm_backward_workspace(i64 rows, i64 c);
// dx = dres (may be null, or equal to dx) + dL/dx; dw, db accumulate.
void layernorm_backward(const float* x, const float* dy, const float* w, const float* mean,
                        const float* rstd, const float* dres, float* dx, float* dw, float* db,
                        i64 rows, i64 c, float* workspace, cudaStream_t s);

// ---- GELU, tanh form.
void gelu_tanh_forward(const float* x, float* y, i64 n, cudaStream_t s);
void gelu_tanh_backward(const float* x, const float* dy, float* dx, i64 n, cudaStream_t s);

// ---- causal attention. qkv [b, t, 3c], out [b, t, c], lse [b, heads, t].
// The flash kernels handle head widths 16, 32, 64 and 128; flash_attention_supported says so.
bool flash_attention_supported(i64 head_dim);
void flash_attention_forward(const float* qkv, float* out, float* lse, i64 b, i64 t, i64 c,
                             int heads, cudaStream_t s);
// delta: workspace of b * heads * t floats.
void flash_attention_backward(const float* qkv, const float* out, const float* dout,
                              const float* lse, float* dqkv, float* delta, i64 b, i64 t, i64 c,
                              int heads, cudaStream_t s);
// The reference: materialises the [b, heads, t, t] probabilities (workspace: scores of that
// size for the forward; twice that plus b * heads * t for the backward).
i64 naive_attention_workspace(i64 b, i64 t, int heads, bool backward);
void naive_attention_forward(const float* qkv, float* out, float* lse, float* workspace, i64 b,
                             i64 t, i64 c, int heads, cudaStream_t s);
void naive_attention_backward(const float* qkv, const float* out, const float* dout,
                              const float* lse, float* dqkv, float* workspace, i64 b, i64 t, i64 c,
                              int heads, cudaStream_t s);

}  // namespace lockstep::ops::cuda
