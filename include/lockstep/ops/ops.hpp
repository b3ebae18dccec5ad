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
//
// Activations in bf16: on a context that computes in bf16 (train.precision = bf16) the ops a
// GPT block's activations pass through also take and give bf16 tensors, each op's comment saying
// which (the "activation" tensors below: f32, or bf16 on a bf16 context). A bf16 input is read
// exactly (widened to f32) and everything is computed in f32; a bf16 output is the f32 result
// rounded once to nearest even (ops::cast's rounding). On the CPU and the emulated GPU a bf16
// op is therefore bitwise cast(f32 op(widened inputs)) (tests/ops/test_bf16_activations.cpp);
// on CUDA the libraries' epilogues may differ by their own roundings (docs/GPT.md). Parameters,
// their gradients, statistics (mean, rstd, lse) and the residual stream stay f32. Elsewhere a
// bf16 tensor is an error naming the op and the tensor.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
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
// In the context's precision (ops/precision.hpp). On a bf16 context a and b may also be bf16
// tensors, used as they are (f32 ones are rounded to bf16 first), and c may be a bf16 activation
// that the product overwrites (beta = 0: the f32 accumulation rounded once); c is f32 otherwise.
void gemm(Context& ctx, bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
          float beta, Tensor& c);
// gemm over the first k of the inner dimension: c = alpha * a[:, :k] @ b[:k, :] + beta * c, for
// row-major a [m, >= k] and b [>= k, n] (neither transposed). The LM head of a padded vocabulary
// computes dh = dlogits[:, :V] wte[:V] this way from its [rows, Vp] chunk: a GEMM over all Vp
// columns would add the padding's zeros in another K blocking, which changes the last bits of the
// sum (docs/GPT.md, "A padded vocabulary"), where this one is bitwise gemm on the [m, k] matrix.
void gemm_leading(Context& ctx, std::int64_t k, float alpha, const Tensor& a, const Tensor& b,
                  float beta, Tensor& c);
void add_row_bias(Context& ctx, Tensor& y, const Tensor& bias);  // y[n,f] += bias[f]
// db[f] += sum_n dy[n,f]; dy is an activation (f32, or bf16 on a bf16 context), db f32.
void sum_rows(Context& ctx, const Tensor& dy, Tensor& db);

// ---- elementwise (f32, same shapes)
void relu_forward(Context& ctx, const Tensor& x, Tensor& y);
void relu_backward(Context& ctx, const Tensor& y, const Tensor& dy, Tensor& dx);  // y = relu output
void gelu_forward(Context& ctx, const Tensor& x, Tensor& y);  // exact (erf) GELU
void gelu_backward(Context& ctx, const Tensor& x, const Tensor& dy, Tensor& dx);
// out = a + b. b may be a bf16 activation on a bf16 context (a block's residual stream plus its
// bf16 branch); a and out are f32.
void add(Context& ctx, const Tensor& a, const Tensor& b, Tensor& out);
void axpy(Context& ctx, float alpha, const Tensor& x, Tensor& y);  // y += alpha * x
void scale(Context& ctx, Tensor& x, float alpha);                  // x *= alpha
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
// are f32 (but see conv2d_forward's y below). On a bf16 context the activation inputs (x of forward
// and backward-weights, dy of backward-data and backward-weights) may also be bf16 tensors, used as
// they are (f32 ones are rounded to bf16 first), as gemm's operands: a layer rounds what two ops
// read only once. conv2d_forward's y may be a bf16 activation on a bf16 context too: the f32 result
// rounded once (what a BatchNorm after it reads; see bf16_conv_bn_activations).
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
// An NHWC batch is x viewed as [N*H*W, C]: the same statistics, with contiguous channels. On a bf16
// context x may be a bf16 activation (a convolution's rounded output): every op then gives the
// bits of the same op on x widened to f32 (exact), which is what it runs where the backend reads
// only f32 x.
// Training: batch statistics, running stats updated with momentum (running = (1-m) running +
// m * stat, unbiased variance, as PyTorch). save_mean/save_invstd ([C]) are for the backward.
void batchnorm_forward_train(Context& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                             Tensor& y, Tensor& save_mean, Tensor& save_invstd,
                             Tensor& running_mean, Tensor& running_var, float momentum, float eps);
void batchnorm_forward_eval(Context& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                            const Tensor& running_mean, const Tensor& running_var, float eps,
                            Tensor& y);
// dx overwritten; dgamma, dbeta accumulated. dx may be a bf16 activation on a bf16 context (for a
// convolution's backward, which would round it anyway): the f32 result rounded once.
void batchnorm_backward(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& gamma,
                        const Tensor& save_mean, const Tensor& save_invstd, Tensor& dx,
                        Tensor& dgamma, Tensor& dbeta);

// Whether this context's backend writes bf16 convolution outputs and reads bf16 BatchNorm inputs
// and residuals in its own kernels (the CPU), so that a bf16 model keeps the activations between
// them (and a ResNet's residual stream) in bf16, as PyTorch's autocast does: half the bytes
// written, kept and read twice. Elsewhere (CUDA, and the emulated GPU that stands in for it) the
// ops above still accept bf16 but widen it in an extra pass, which a layer should not ask for.
bool bf16_conv_bn_activations(Context& ctx);

// ---- fused BatchNorm epilogues: a ResNet block's BatchNorm -> [+ shortcut] -> ReLU in one op, so
// the normalised values are not stored, read back, summed and stored again (each pass over a
// ResNet-50 activation costs as much as the BatchNorm's own; docs/PERFORMANCE.md).
struct BatchNormEpilogue {
  Tensor residual;    // added to the normalised x (undefined: none): x's shape, f32 or bf16 (below)
  bool relu = false;  // then max(., 0)
};
// y = relu?(batchnorm(x) + residual?), where y is f32 or (on a bf16 context) a bf16 activation.
// Composition, and so the bits on every backend: batchnorm_forward_train (_eval) into an f32 z,
// add(z, residual, z), relu_forward(z, z), then cast(z, y) when y is bf16. y shares storage with
// neither x nor the residual. The statistics and running averages are batchnorm_forward_train's.
// On a bf16 context the residual may be a bf16 activation (the previous block's output, a residual
// stream kept in bf16 as autocast keeps it): the bits of the same op on it widened (exact).
void batchnorm_act_forward_train(Context& ctx, const Tensor& x, const Tensor& gamma,
                                 const Tensor& beta, const BatchNormEpilogue& epilogue, Tensor& y,
                                 Tensor& save_mean, Tensor& save_invstd, Tensor& running_mean,
                                 Tensor& running_var, float momentum, float eps);
void batchnorm_act_forward_eval(Context& ctx, const Tensor& x, const Tensor& gamma,
                                const Tensor& beta, const Tensor& running_mean,
                                const Tensor& running_var, float eps,
                                const BatchNormEpilogue& epilogue, Tensor& y);
// The backward of batchnorm_act_forward_train with relu and no residual, y being its output (f32
// or bf16): dz = y > 0 ? dy : 0, then batchnorm_backward(x, dz, ...) into dx, dgamma, dbeta.
// Composition: relu_backward over y (widened to f32 first when bf16), then batchnorm_backward
// (dx f32, or bf16 as there).
void batchnorm_relu_backward(Context& ctx, const Tensor& x, const Tensor& y, const Tensor& dy,
                             const Tensor& gamma, const Tensor& save_mean,
                             const Tensor& save_invstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta);

// A ResNet block's input gradient with an identity shortcut: dx = a + (y > 0 ? dy : 0), a being
// the main branch's input gradient and y the block's output (after its closing ReLU). Composition:
// relu_backward(y, dy, dx), then add(a, dx, dx). dx shares storage with neither y nor a. On a bf16
// context y may be a bf16 activation (a block output kept in bf16): the bits of y widened.
void relu_backward_add(Context& ctx, const Tensor& y, const Tensor& dy, const Tensor& a,
                       Tensor& dx);

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
// The classifier and its loss fused chunk by chunk (nn::TiedLmHead::forward_loss): one chunk of
// rows [first_row, first_row + R) of a batch of N. logits [R, P] holds the chunk's logits, of
// which the first `classes` columns are real (P > classes: a padded vocabulary, whose columns are
// masked out: no probability, no gradient). In one pass per row it writes over the logits
//   dlogits = (softmax over the first `classes` columns - (1 - eps) onehot - eps / classes) * scale
// and 0 in the padded columns, and row_loss[first_row + r] (f64 [N]) = that row's loss, as
// softmax_xent_forward computes it; labels are the batch's i32 [N]. Bitwise what
// softmax_xent_forward then softmax_xent_backward give on the [R, classes] logits.
void softmax_xent_chunk(Context& ctx, Tensor& logits, const Tensor& labels, std::int64_t first_row,
                        std::int64_t classes, float scale, Tensor& row_loss,
                        float label_smoothing = 0.0f);
// loss [1] (f32) = the mean of row_loss (f64 [N]), summed as softmax_xent_forward sums its rows
// (in fixed blocks of rows, in order), so the chunked loss is bitwise the whole one.
void mean_row_loss(Context& ctx, const Tensor& row_loss, Tensor& loss);

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
// backward. x (the residual stream) is f32; y is an activation (bf16 on a bf16 context when the
// layers after it take bf16).
void layernorm_forward(Context& ctx, const Tensor& x, const Tensor& weight, const Tensor& bias,
                       float eps, Tensor& y, Tensor& mean, Tensor& rstd);
// dx = dresidual + dL/dx (dresidual may be undefined, meaning zero, or the same tensor as dx: a
// pre-LN block adds its residual gradient in the same pass); dweight and dbias accumulate. dy has
// y's dtype (an activation); x, dx and dresidual are f32.
void layernorm_backward(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd, const Tensor& dresidual, Tensor& dx,
                        Tensor& dweight, Tensor& dbias);
// GELU, tanh form (GPT-2's): y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). x, y (and dy,
// dx) are activations of one dtype: f32, or bf16 on a bf16 context. The backward may run in
// place (dx the same tensor as dy).
void gelu_tanh_forward(Context& ctx, const Tensor& x, Tensor& y);
void gelu_tanh_backward(Context& ctx, const Tensor& x, const Tensor& dy, Tensor& dx);
// Causal multi-head self-attention core, from the fused projection qkv [B, T, 3C] (q, k, v are
// features [0, C), [C, 2C), [2C, 3C); head h uses features [h D, (h + 1) D) of each, D = C / heads)
// to out [B, T, C]: out_t = sum_{s <= t} softmax_s(q_t . k_s / sqrt(D)) v_s per head.
// lse [B, heads, T] receives each row's log-sum-exp of the scaled scores (natural log), all the
// backward needs to rebuild the probabilities: no [T, T] matrix is kept between the passes. The
// kernels agree on what lse means, so any backward reads any forward's lse. qkv, out, dout and
// dqkv are activations of one dtype (bf16 on a bf16 context: cuDNN's inputs as they are; the
// reference kernels widen them and compute in f32); lse is f32.
enum class AttentionKernel {
  Auto,       // cuDNN's where it can run (choose_attention says when), else Reference
  Reference,  // lockstep's own: blocked causal attention (CPU), a flash-style fp32 kernel (CUDA)
  Cudnn,      // cuDNN's fused scaled-dot-product attention (flash) in bf16 with f32 statistics:
              // CUDA under bf16 precision only; anywhere else an error saying why
  Naive,      // CUDA: materialises the [B, heads, T, T] scores; the measured reference of the
              // flash kernels (elsewhere the same as Reference)
};
const char* attention_kernel_name(AttentionKernel k);  // "auto", "reference", "cudnn", "naive"
// Parses the names above; throws lockstep::Error listing them.
AttentionKernel attention_kernel_from_name(const std::string& name);

// What `requested` runs on ctx for qkv [b, t, 3 heads head_dim]: the kernel (Auto resolved) and
// one line saying why or how ("cuDNN 9.19.0 fused flash attention, bf16, deterministic
// backward"; for an Auto that resolved to Reference, why cuDNN's cannot run). Cuda needs a CUDA
// device, bf16 precision, a cuDNN that loads and builds both graphs of this shape (built once per
// shape and context, and cached); where any is missing, requesting Cudnn throws lockstep::Error
// naming the device and the reason. The attention ops call it for Auto and Cudnn themselves.
struct AttentionChoice {
  AttentionKernel kernel;
  std::string detail;
};
AttentionChoice choose_attention(Context& ctx, AttentionKernel requested, std::int64_t b,
                                 std::int64_t t, int heads, std::int64_t head_dim);
void attention_forward(Context& ctx, const Tensor& qkv, int heads, Tensor& out, Tensor& lse,
                       AttentionKernel kernel = AttentionKernel::Auto);
// dqkv (overwritten) from dout, with qkv, out and lse from the forward.
void attention_backward(Context& ctx, const Tensor& qkv, const Tensor& out, const Tensor& dout,
                        const Tensor& lse, int heads, Tensor& dqkv,
                        AttentionKernel kernel = AttentionKernel::Auto);

// ---- fused layer ops: a GEMM with what follows it, a residual sum with the LayerNorm that reads
// it. On the CPU and the emulated GPU each is the composition its comment names, bit for bit
// (tests/ops/test_fused_ops.cpp holds them to it), so layers call these once for every device and
// lose nothing where nothing is fused; CUDA folds the pieces into cuBLASLt epilogues or one kernel.
//
// s = x + a and y = LayerNorm(s) (mean, rstd and eps as layernorm_forward), in one pass over each
// row: a pre-LN block's residual sum and the LayerNorm that reads it. x and s (the residual
// stream) are f32; a (the branch) and y are activations, each f32 or bf16 on a bf16 context.
// Composition: add, then layernorm_forward.
void residual_layernorm_forward(Context& ctx, const Tensor& x, const Tensor& a,
                                const Tensor& weight, const Tensor& bias, float eps, Tensor& s,
                                Tensor& y, Tensor& mean, Tensor& rstd);

// What a linear layer applies to its output, inside its GEMM where the backend can.
enum class Activation {
  None,
  GeluTanh,  // gelu_tanh_forward's GELU (GPT-2's; cuBLASLt's GELU epilogue is this form too)
};

// y = act(x w^T + b) for x [N, in], w [out, in], b [out] (undefined: no bias) and y [N, out]. With
// act = GeluTanh, pre_act [N, out] receives x w^T + b, the activation's input, which the backward
// reads; with None, pass an undefined pre_act. The GEMM is in the context's precision, and on a
// bf16 context x may be bf16 (as for gemm), and y may be a bf16 activation (pre_act then too):
// pre_act = bf16(x w^T + b) from the f32 accumulation, y = bf16(act(pre_act)). w and b are f32.
// Composition: gemm (beta 0), add_row_bias, gelu_tanh_forward; with a bf16 y, the gemm and the
// bias in f32, then cast, then the GELU in bf16 (the CPU: one oneDNN matmul with the bias and a
// bf16 destination, the same bits).
// CUDA under bf16: one cuBLASLt call with the BIAS or GELU_AUX_BIAS epilogue (with a bf16 y the
// bias is read in bf16, cuBLASLt's rule, and the GELU applied before pre_act is rounded).
void linear_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& b, Activation act,
                    Tensor& y, Tensor& pre_act);

struct LinearBackward {
  // dw = dy^T x and db = the column sums instead of adding them: gradients that zero_grad left
  // stale (nn::Parameter::grad_stale). The composition fills db with zeros, then adds.
  bool overwrite_dw = false;
  bool overwrite_db = false;
  // The activation that made x from input_pre_act (the layer before's linear_forward: an MLP's
  // c_proj reads c_fc's GELU). With GeluTanh, dx receives dL/d input_pre_act =
  // gelu_tanh'(input_pre_act) * (dy w): that activation's backward, folded into the input-gradient
  // GEMM. Composition: gemm into dx, then gelu_tanh_backward over dx in place.
  Activation input_act = Activation::None;
  Tensor input_pre_act;  // [N, in], of dx's dtype
};
// The backward of linear_forward with act = None (dy is dL/d(x w^T + b)):
//   dw (+)= dy^T x,   db (+)= sum over rows of dy,   dx = dy w (or the pre-activation gradient).
// db and dx may be undefined (no bias; no input gradient wanted). dy16 is dy rounded to bf16,
// which a layer on a bf16 context passes so that both GEMMs read one copy (undefined: the GEMMs
// take dy); the bias gradient sums the f32 dy. On a bf16 context dy may itself be a bf16
// activation (then dy16 is undefined), and dx a bf16 activation (input_pre_act then too), written
// as gemm writes a bf16 c and, through a GELU, that rounded again by its bf16 backward.
// Composition: gemm, fill + sum_rows, gemm.
// CUDA under bf16: BGRADB folds an overwritten db into the dw GEMM (the bias gradient is then the
// sum of dy16, as PyTorch's autocast computes it), DGELU the GELU backward into the dx GEMM (one
// rounding of a bf16 dx instead of two).
void linear_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy,
                     const Tensor& dy16, Tensor& dw, Tensor& db, Tensor& dx,
                     const LinearBackward& p = {});

// y = act(pre_act) bit for bit as linear_forward(x, w, b, act, y, pre_act) wrote it, for an
// activation recompute (train.recompute = gelu); the arguments are that call's. Composition:
// gelu_tanh_forward(pre_act, y). A backend whose forward applied the activation in the GEMM's
// epilogue (CUDA under bf16: cuBLASLt's GELU need not give gelu_tanh_forward's bits) runs that
// GEMM again, writing pre_act's values over it once more.
void linear_recompute_activation(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& b,
                                 Activation act, Tensor& pre_act, Tensor& y);

}  // namespace lockstep::ops
