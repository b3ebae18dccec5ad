// The ops interface: the only code that touches tensor memory. Layers, optimizers, the reducer
// and the trainer call these free functions; each checks shapes/dtypes/devices once (naming the
// op and the tensors) and forwards to the Context's Backend (CPU: OpenBLAS + oneDNN + own loops;
// CUDA: cuBLAS + cuDNN + own kernels).
//
// Conventions: tensors are contiguous, images [N, C, H, W] (stored NCHW unless an op's
// ImageLayout says NHWC), compute dtype f32, labels i32.
// Ops that produce a *parameter* gradient accumulate into it (dw += ...), as PyTorch does, so
// gradient accumulation and DDP bucket views need no extra copies; every other output is
// overwritten.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "lockstep/core/tensor.hpp"
#include "lockstep/ops/context.hpp"

namespace lockstep::ops {

// How an image batch of shape [N, C, H, W] lies in memory. Shapes are always given as
// [N, C, H, W]; NHWC ("channels-last", PyTorch's torch.channels_last) stores element
// (n, c, h, w) at ((n H + h) W + w) C + c, so the C values of a pixel are contiguous: the layout
// oneDNN's AMX kernels and cuDNN's tensor cores convolve in without a transposition.
enum class ImageLayout { NCHW, NHWC };

struct Conv2dParams {
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;
  ImageLayout layout = ImageLayout::NCHW;  // of x, y, dx and dy; weights are always [O, I, KH, KW]
};
// Output spatial size of a conv/pool window: (in + 2*pad - kernel) / stride + 1.
std::int64_t window_output_size(std::int64_t in, int kernel, int stride, int pad);

enum class PoolKind { Max, Avg };
struct Pool2dParams {
  int kernel_h = 2, kernel_w = 2;
  int stride_h = 2, stride_w = 2;
  int pad_h = 0, pad_w = 0;
  ImageLayout layout = ImageLayout::NCHW;  // of x, y, dx and dy (and of max pooling's workspace)
};

struct SgdParams {
  float lr = 0.01f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
  bool first_step = false;  // momentum buffer is initialised to the gradient (PyTorch semantics)
  // Fused updates only (flat_sgd_update): a step's verdict (f64 [2] on ctx's device,
  // ops/step_verdict.hpp). Given one, the update does nothing when the step's gradients are not
  // finite, and first_step is taken as (step - the updates skipped) == 1. Undefined: always apply.
  Tensor verdict;
  std::int64_t step = 1;  // 1-based; read only with a verdict
};

struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;
  std::int64_t step = 1;  // 1-based, for bias correction
  // Fused updates only (flat_adamw_update), as SgdParams::verdict: with a verdict the update is
  // skipped when the step's gradients are not finite, and bias-corrects for step - the updates
  // skipped.
  Tensor verdict;
};

// ---- memory
void fill(Context& ctx, Tensor& t, float value);          // f32 or i32
void copy(Context& ctx, const Tensor& src, Tensor& dst);  // same dtype and numel; any devices
// f32 -> bf16 (round to nearest even; NaN stays NaN; f32 subnormals may flush to zero, as
// AVX512-BF16 does) or bf16 -> f32 (exact); same numel, same device.
void cast(Context& ctx, const Tensor& src, Tensor& dst);
// y[b, j, i] = x[b, i, j] for f32 x [B, M, K] and y [B, K, M] (exact: a copy in another order).
// An NCHW image batch viewed as [N, C, H*W] becomes its NHWC form [N, H*W, C], and back with
// the roles swapped: how a model converts its activations where the layout changes.
void batch_transpose(Context& ctx, const Tensor& x, Tensor& y);

// ---- dense linear algebra (2-D f32): c = alpha * op(a) @ op(b) + beta * c
// In the context's precision (ops/precision.hpp); c is always f32. On a bf16 context a and b may
// also be bf16 tensors, used as they are (f32 ones are rounded to bf16 first).
void gemm(Context& ctx, bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
          float beta, Tensor& c);
void add_row_bias(Context& ctx, Tensor& y, const Tensor& bias);  // y[n,f] += bias[f]
void sum_rows(Context& ctx, const Tensor& dy, Tensor& db);       // db[f] += sum_n dy[n,f]

// ---- elementwise (f32, same shapes)
void relu_forward(Context& ctx, const Tensor& x, Tensor& y);
void relu_backward(Context& ctx, const Tensor& y, const Tensor& dy, Tensor& dx);  // y = relu output
void gelu_forward(Context& ctx, const Tensor& x, Tensor& y);  // exact (erf) GELU
void gelu_backward(Context& ctx, const Tensor& x, const Tensor& dy, Tensor& dx);
void add(Context& ctx, const Tensor& a, const Tensor& b, Tensor& out);  // out = a + b
void axpy(Context& ctx, float alpha, const Tensor& x, Tensor& y);       // y += alpha * x
void scale(Context& ctx, Tensor& x, float alpha);                       // x *= alpha
// Inverted dropout: keep with probability 1-p, scale kept values by 1/(1-p). The keep decision for
// element i is Philox(seed, stream).uniform(i) >= p, so it is the same on every device and thread
// count. mask is u8, same shape as x.
void dropout_forward(Context& ctx, const Tensor& x, Tensor& y, Tensor& mask, float p,
                     std::uint64_t seed, std::uint64_t stream);
void dropout_backward(Context& ctx, const Tensor& dy, const Tensor& mask, float p, Tensor& dx);
// Input conversion: y = (x / 255 - mean[c]) / std[c] for u8 x of shape [N, C, ...] (mean/std in
// the [0, 1] pixel scale; empty vectors mean 0 and 1). f32 x is copied with the same formula
// minus the /255.
void normalize_input(Context& ctx, const Tensor& x, const std::vector<float>& mean,
                     const std::vector<float>& stddev, Tensor& y);

// ---- convolution and pooling (f32 [N, C, H, W] in the params' layout); w is [O, I, KH, KW], b is
// [O] or undefined. Convolutions compute in the context's precision (ops/precision.hpp); outputs
// stay f32. On a bf16 context the activation inputs (x of forward and backward-weights, dy of
// backward-data and backward-weights) may also be bf16 tensors, used as they are (f32 ones are
// rounded to bf16 first), as gemm's operands: a layer rounds what two ops read only once.
void conv2d_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y,
                    const Conv2dParams& p);
void conv2d_backward_data(Context& ctx, const Tensor& dy, const Tensor& w, Tensor& dx,
                          const Conv2dParams& p);
// dw += dL/dw, db += dL/db (db may be undefined).
void conv2d_backward_weights(Context& ctx, const Tensor& x, const Tensor& dy, Tensor& dw,
                             Tensor& db, const Conv2dParams& p);
// workspace is backend-owned state the backward pass needs (max: argmax); pass an undefined
// Tensor on the first call and keep what comes back.
void pool2d_forward(Context& ctx, PoolKind kind, const Tensor& x, Tensor& y, Tensor& workspace,
                    const Pool2dParams& p);
void pool2d_backward(Context& ctx, PoolKind kind, const Tensor& dy, const Tensor& workspace,
                     Tensor& dx, const Pool2dParams& p);

// ---- batch normalisation over x of shape [N, C] or [N, C, H, W] (NCHW), statistics per channel.
// An NHWC batch is x viewed as [N*H*W, C]: the same statistics, with contiguous channels.
// Training: batch statistics, running stats updated with momentum (running = (1-m) running +
// m * stat, unbiased variance, as PyTorch). save_mean/save_invstd ([C]) are for the backward.
void batchnorm_forward_train(Context& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                             Tensor& y, Tensor& save_mean, Tensor& save_invstd,
                             Tensor& running_mean, Tensor& running_var, float momentum, float eps);
void batchnorm_forward_eval(Context& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                            const Tensor& running_mean, const Tensor& running_var, float eps,
                            Tensor& y);
// dx overwritten; dgamma, dbeta accumulated.
void batchnorm_backward(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& gamma,
                        const Tensor& save_mean, const Tensor& save_invstd, Tensor& dx,
                        Tensor& dgamma, Tensor& dbeta);

// ---- loss: softmax cross-entropy over logits [N, C] with i32 labels [N].
// probs [N, C] receives softmax(logits); loss [1] receives the mean over N of -log p[label].
// Labels outside [0, C) are an error naming the first bad one. probs may be logits itself, and
// dlogits may be probs (in place: a language model's [N, vocab] rows need not be stored twice).
// label_smoothing = eps in [0, 1) is torch.nn.CrossEntropyLoss's: the target is
// (1 - eps) onehot + eps / C, so a row's loss is (1 - eps) (-log p[label]) + eps mean_k(-log p_k);
// eps = 0 computes exactly what the unsmoothed loss does, bit for bit.
void softmax_xent_forward(Context& ctx, const Tensor& logits, const Tensor& labels, Tensor& probs,
                          Tensor& loss, float label_smoothing = 0.0f);
// dlogits = (probs - (1 - eps) onehot(labels) - eps / C) * scale   (scale = 1/N for a mean over
// N samples)
void softmax_xent_backward(Context& ctx, const Tensor& probs, const Tensor& labels, float scale,
                           Tensor& dlogits, float label_smoothing = 0.0f);
// Number of rows whose argmax equals the label (synchronises with the device).
std::int64_t count_correct(Context& ctx, const Tensor& logits, const Tensor& labels);

// ---- reductions (synchronise with the device)
double sum_squares(Context& ctx, const Tensor& x);  // f32 in, accumulated in double
bool all_finite(Context& ctx, const Tensor& x);

// ---- optimizer updates (f32; param, grad and state tensors have the same shape)
// SGD as torch.optim.SGD: g = grad + wd*param; buf = momentum*buf + (1-dampening)*g (buf = g on
// the first step); g = nesterov ? g + momentum*buf : buf; param -= lr*g. momentum_buf may be
// undefined when momentum == 0.
void sgd_update(Context& ctx, Tensor& param, const Tensor& grad, Tensor& momentum_buf,
                const SgdParams& p);
// AdamW as torch.optim.AdamW: param *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// param -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps).
void adamw_update(Context& ctx, Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                  const AdamWParams& p);

// ---- fused ops over flat buffers: one launch (GPU) or one parallel loop (CPU) for many tensors.
// A flat buffer holds tensors ("segments") back to back, each starting on a kFlatAlignBytes
// boundary of the buffer; the elements between segments are padding, which these ops never read
// or write. They work on the segment elements in a range [begin, end) of the buffer, so a
// ZeRO-1 shard update is the same call as the whole-model update, with the shard's range.
inline constexpr std::int64_t kFlatAlignBytes = 256;  // cuBLAS/cuDNN's preferred alignment

struct FlatSegment {
  std::int64_t offset = 0;  // first element; a multiple of kFlatAlignBytes / 4
  std::int64_t numel = 0;   // > 0
  std::int32_t slot = 0;    // where flat_sum_squares reports it (the parameter's index)
  bool decay = true;        // whether the optimizer updates apply weight decay to it
};

struct FlatRange {
  std::int64_t begin = 0, end = 0;  // elements of the flat buffer
};

// The backend's preparation of one list of segments (chunk tables, on the device for CUDA):
// made once per layout by make_flat_plan, used by every step on contexts of the same device.
class FlatPlan {
 public:
  virtual ~FlatPlan() = default;
  const std::vector<FlatSegment>& segments() const { return segments_; }  // by offset
  std::int64_t numel() const { return numel_; }  // of the flat buffers it describes
  std::int32_t slots() const { return slots_; }  // largest slot + 1
  Device device() const { return device_; }

 protected:
  FlatPlan(std::vector<FlatSegment> segments, std::int64_t numel, Device device);

 private:
  std::vector<FlatSegment> segments_;
  std::int64_t numel_;
  std::int32_t slots_ = 0;
  Device device_;
};

// Checks the segments (aligned, in order, disjoint, inside numel, distinct slots) and builds the
// plan for ctx's backend.
std::shared_ptr<const FlatPlan> make_flat_plan(Context& ctx, std::vector<FlatSegment> segments,
                                               std::int64_t numel);
// sgd_update / adamw_update on every segment element in `range` of the flat buffers, with
// weight_decay 0 where the segment says decay = false: on the CPU bit for bit what the
// per-tensor ops give. param and grad span the plan's numel; the state tensors hold the
// elements [state_origin, state_origin + numel) of the layout (0 and the whole layout, or a
// ZeRO-1 shard that covers the range).
void flat_sgd_update(Context& ctx, const FlatPlan& plan, FlatRange range, Tensor& param,
                     const Tensor& grad, Tensor& momentum_buf, std::int64_t state_origin,
                     const SgdParams& p);
void flat_adamw_update(Context& ctx, const FlatPlan& plan, FlatRange range, Tensor& param,
                       const Tensor& grad, Tensor& m, Tensor& v, std::int64_t state_origin,
                       const AdamWParams& p);
// What flat_sum_squares adds up: the squares (in double), or only whether every element is
// finite (x * 0 in float: 0 where finite, NaN where not; half the work on a CPU without AVX).
enum class FlatSums { Squares, FinitenessOnly };
// sums (f64 [slots + 1] on ctx's device) receives the sum of squares of each segment's elements
// in `range` at its slot (0 for slots without any), and at [slots] their total, added in slot
// order; accumulated in double, so the total is finite exactly when every element is.
// Does not synchronise: read sums when the value is needed.
void flat_sum_squares(Context& ctx, const FlatPlan& plan, FlatRange range, const Tensor& x,
                      Tensor& sums, FlatSums what = FlatSums::Squares);

// ---- a step's verdict on the device, for a training loop that never waits for its gradient
// check (train/loop.cpp, Note [Deferred gradient check]). `verdict` is f64 [2] on ctx's device
// (ops/step_verdict.hpp says what it holds); none of these synchronises.
// verdict[0] = (first ? 0 : verdict[0]) + total[0], for `total` f64 [1] (flat_sum_squares' total
// of one range; a ZeRO-1 shard adds its ranges one after the other, as the host would).
void verdict_add(Context& ctx, const Tensor& total, Tensor& verdict, bool first);
// Closes the step's check (after any allreduce of verdict[0]): verdict[1] less `taken` (the
// skipped updates the host has counted since the last close), plus one when verdict[0] is not
// finite.
void verdict_close(Context& ctx, Tensor& verdict, std::int64_t taken);
// Global-norm clipping from the verdict: x *= clip_coefficient(max_norm, verdict[0]) (rounded to
// f32) when that is below 1, as optim::clip_grad_norm does from a norm read on the host, bit for
// bit; nothing when the step is not finite. x: f32, the flat gradients.
void clip_by_verdict(Context& ctx, Tensor& x, const Tensor& verdict, double max_norm);

// ---- transformer (GPT) ops. Activations are [B, T, C] row-major: a token's C features are
// contiguous. Reductions are deterministic (fixed blocking, no float atomics), as everywhere.
//
// Token + learned position embedding: y[b, t, :] = wte[tokens[b, t], :] + wpe[t, :] for i32
// tokens [B, T], wte [V, C], wpe [P, C] with T <= P. A token id outside [0, V) is an error naming
// the first one (on a GPU: reported by the next call that waits for the device, as bad labels).
void embedding_forward(Context& ctx, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       Tensor& y);
// dwte[tokens[b, t], :] += dy[b, t, :] (a scatter-add: repeated tokens sum) and
// dwpe[t, :] += sum_b dy[b, t, :]; both accumulate, as parameter gradients do.
void embedding_backward(Context& ctx, const Tensor& tokens, const Tensor& dy, Tensor& dwte,
                        Tensor& dwpe);
// LayerNorm over the last dimension C of x [..., C]: y = (x - mean) * rstd * weight + bias with
// rstd = 1 / sqrt(biased variance + eps). mean and rstd (f32, one per row) are saved for the
// backward.
void layernorm_forward(Context& ctx, const Tensor& x, const Tensor& weight, const Tensor& bias,
                       float eps, Tensor& y, Tensor& mean, Tensor& rstd);
// dx = dresidual + dL/dx (dresidual may be undefined, meaning zero, or the same tensor as dx: a
// pre-LN block adds its residual gradient in the same pass); dweight and dbias accumulate.
void layernorm_backward(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd, const Tensor& dresidual, Tensor& dx,
                        Tensor& dweight, Tensor& dbias);
// GELU, tanh form (GPT-2's): y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_tanh_forward(Context& ctx, const Tensor& x, Tensor& y);
void gelu_tanh_backward(Context& ctx, const Tensor& x, const Tensor& dy, Tensor& dx);
// Causal multi-head self-attention core, from the fused projection qkv [B, T, 3C] (q, k, v are
// features [0, C), [C, 2C), [2C, 3C); head h uses features [h D, (h + 1) D) of each, D = C / heads)
// to out [B, T, C]: out_t = sum_{s <= t} softmax_s(q_t . k_s / sqrt(D)) v_s per head.
// lse [B, heads, T] receives each row's log-sum-exp of the scaled scores, all the backward needs
// to rebuild the probabilities: no [T, T] matrix is kept between the passes.
enum class AttentionKernel {
  Auto,   // the fast path: blocked causal attention (CPU), a flash-style kernel (CUDA)
  Naive,  // CUDA: materialises the [B, heads, T, T] scores; the measured reference
};
void attention_forward(Context& ctx, const Tensor& qkv, int heads, Tensor& out, Tensor& lse,
                       AttentionKernel kernel = AttentionKernel::Auto);
// dqkv (overwritten) from dout, with qkv, out and lse from the forward.
void attention_backward(Context& ctx, const Tensor& qkv, const Tensor& out, const Tensor& dout,
                        const Tensor& lse, int heads, Tensor& dqkv,
                        AttentionKernel kernel = AttentionKernel::Auto);

}  // namespace lockstep::ops
