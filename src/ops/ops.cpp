// The ops front end: every check on shapes, dtypes and devices happens here, once, with the op
// and the tensors named, so backends can trust their arguments.
#include "lockstep/ops/ops.hpp"

#include <algorithm>
#include <utility>

#include "lockstep/core/allocator.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/ops/backend.hpp"

namespace lockstep::ops {
namespace {

void check_defined(const char* op, const char* name, const Tensor& t) {
  LOCKSTEP_CHECK(t.defined(), op, ": ", name, " is an undefined tensor");
}

void check_tensor(Context& ctx, const char* op, const char* name, const Tensor& t, DType dtype) {
  check_defined(op, name, t);
  LOCKSTEP_CHECK(t.dtype() == dtype, op, ": ", name, " must be ", dtype_name(dtype), ", got ",
                 t.describe());
  LOCKSTEP_CHECK_HINT(t.device() == ctx.device(), "move the tensor with Tensor::to or ops::copy",
                      op, ": ", name, " is ", t.describe(), " but the context runs on ",
                      ctx.device().str());
}

void check_f32(Context& ctx, const char* op, const char* name, const Tensor& t) {
  check_tensor(ctx, op, name, t, DType::F32);
}

// An activation (ops.hpp's conventions): f32, or bf16 on a context that computes in bf16.
void check_act(Context& ctx, const char* op, const char* name, const Tensor& t) {
  check_defined(op, name, t);
  const bool bf16 = ctx.precision() == Precision::BF16;
  LOCKSTEP_CHECK_HINT(t.dtype() == DType::F32 || (bf16 && t.dtype() == DType::BF16),
                      "bf16 activations are for contexts that compute in bf16 "
                      "(train.precision = bf16)",
                      op, ": ", name, " must be f32", bf16 ? " or bf16" : "", ", got ",
                      t.describe(), " on a ", precision_name(ctx.precision()), " context");
  check_tensor(ctx, op, name, t, t.dtype());
}

void check_same_dtype(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                      const Tensor& b) {
  LOCKSTEP_CHECK(a.dtype() == b.dtype(), op, ": ", name_a, " is ", a.describe(), " but ", name_b,
                 " is ", b.describe(), " (dtypes must match)");
}

void check_same_shape(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                      const Tensor& b) {
  LOCKSTEP_CHECK(a.shape() == b.shape(), op, ": ", name_a, " is ", a.describe(), " but ", name_b,
                 " is ", b.describe(), " (shapes must match)");
}

void check_ndim(const char* op, const char* name, const Tensor& t, int ndim) {
  LOCKSTEP_CHECK(t.ndim() == ndim, op, ": ", name, " must be ", ndim, "-D, got ", t.describe());
}

void check_shape(const char* op, const char* name, const Tensor& t, const Shape& expected) {
  LOCKSTEP_CHECK(t.shape() == expected, op, ": ", name, " must have shape ", shape_str(expected),
                 ", got ", t.describe());
}

// A [C] per-channel tensor for x of shape [N, C, ...].
void check_channel_vector(Context& ctx, const char* op, const char* name, const Tensor& t,
                          std::int64_t channels) {
  check_f32(ctx, op, name, t);
  check_shape(op, name, t, {channels});
}

void check_labels_tensor(Context& ctx, const char* op, const Tensor& rows, const Tensor& labels) {
  check_tensor(ctx, op, "labels", labels, DType::I32);
  LOCKSTEP_CHECK(labels.ndim() == 1 && labels.dim(0) == rows.dim(0), op, ": labels must be [",
                 rows.dim(0), "] to match ", rows.describe(), ", got ", labels.describe());
}

// An activation as the backend reads it: a bf16 one (a BatchNorm input or residual, a block
// output) widened to f32 (exact) where the backend reads only f32 (bf16_conv_bn_activations).
Tensor bn_x(Context& ctx, const Tensor& x) {
  if (x.dtype() != DType::BF16 || ctx.backend().bf16_conv_bn_activations()) return x;
  Tensor wide = ctx.transient(x.shape());
  ctx.backend().cast(x, wide);
  return wide;
}

}  // namespace

std::int64_t window_output_size(std::int64_t in, int kernel, int stride, int pad) {
  LOCKSTEP_CHECK(kernel >= 1 && stride >= 1 && pad >= 0, "window: kernel ", kernel, ", stride ",
                 stride, " and padding ", pad, " must be >= 1, >= 1 and >= 0");
  const std::int64_t padded = in + 2 * std::int64_t{pad};  // 2 * pad overflows as an int
  LOCKSTEP_CHECK_HINT(padded >= kernel, "use a smaller kernel or more padding", "window: kernel ",
                      kernel, " does not fit an input of size ", in, " with padding ", pad);
  return (padded - kernel) / stride + 1;
}

// ---- memory

void fill(Context& ctx, Tensor& t, float value) {
  check_defined("fill", "t", t);
  LOCKSTEP_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::I32,
                 "fill: t must be f32 or i32, got ", t.describe());
  LOCKSTEP_CHECK(t.device() == ctx.device(), "fill: t is ", t.describe(),
                 " but the context runs on ", ctx.device().str());
  ctx.backend().fill(t, value);
}

void copy(Context& ctx, const Tensor& src, Tensor& dst) {
  check_defined("copy", "src", src);
  check_defined("copy", "dst", dst);
  LOCKSTEP_CHECK(src.dtype() == dst.dtype() && src.numel() == dst.numel(), "copy: src is ",
                 src.describe(), " but dst is ", dst.describe(),
                 " (need the same dtype and number of elements)");
  if (src.device().is_cpu() && dst.device().is_cpu() && !ctx.device().is_cpu()) {
    copy_bytes(dst.device(), dst.raw_data(), src.device(), src.raw_data(), src.nbytes());
  } else if (ctx.device().is_cpu() && !(src.device().is_cpu() && dst.device().is_cpu())) {
    // A CPU context has no stream to order a device copy on: copy synchronously.
    copy_bytes(dst.device(), dst.raw_data(), src.device(), src.raw_data(), src.nbytes());
  } else {
    ctx.backend().copy(src, dst);
  }
}

void cast(Context& ctx, const Tensor& src, Tensor& dst) {
  check_defined("cast", "src", src);
  check_defined("cast", "dst", dst);
  const bool down = src.dtype() == DType::F32 && dst.dtype() == DType::BF16;
  const bool up = src.dtype() == DType::BF16 && dst.dtype() == DType::F32;
  LOCKSTEP_CHECK(down || up, "cast: src is ", src.describe(), " and dst is ", dst.describe(),
                 " (casts go f32 -> bf16 or bf16 -> f32)");
  LOCKSTEP_CHECK(src.numel() == dst.numel(), "cast: src is ", src.describe(), " but dst is ",
                 dst.describe(), " (need the same number of elements)");
  check_tensor(ctx, "cast", "src", src, src.dtype());
  check_tensor(ctx, "cast", "dst", dst, dst.dtype());
  ctx.backend().cast(src, dst);
}

void batch_transpose(Context& ctx, const Tensor& x, Tensor& y) {
  check_f32(ctx, "batch_transpose", "x", x);
  check_f32(ctx, "batch_transpose", "y", y);
  check_ndim("batch_transpose", "x", x, 3);
  check_ndim("batch_transpose", "y", y, 3);
  LOCKSTEP_CHECK(y.shape() == Shape({x.dim(0), x.dim(2), x.dim(1)}), "batch_transpose: x is ",
                 x.describe(), " so y must be [", x.dim(0), ", ", x.dim(2), ", ", x.dim(1),
                 "], got ", y.describe());
  const bool overlap = x.shares_storage(y) && x.offset() < y.offset() + y.numel() &&
                       y.offset() < x.offset() + x.numel();
  LOCKSTEP_CHECK(!overlap, "batch_transpose: x ", x.describe(), " and y ", y.describe(),
                 " overlap in memory; the transposition cannot run in place");
  ctx.backend().batch_transpose(x, y);
}

// ---- dense linear algebra

void gemm(Context& ctx, bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
          float beta, Tensor& c) {
  // bf16 operands are the precision policy's own format: accepted only where it is bf16.
  const DType ab =
      ctx.precision() == Precision::BF16 && a.dtype() == DType::BF16 ? DType::BF16 : DType::F32;
  const DType bb =
      ctx.precision() == Precision::BF16 && b.dtype() == DType::BF16 ? DType::BF16 : DType::F32;
  check_tensor(ctx, "gemm", "a", a, ab);
  check_tensor(ctx, "gemm", "b", b, bb);
  check_act(ctx, "gemm", "c", c);
  LOCKSTEP_CHECK(c.dtype() == DType::F32 || beta == 0.0f,
                 "gemm: a bf16 c is overwritten by the product (beta = 0), got beta = ", beta);
  check_ndim("gemm", "a", a, 2);
  check_ndim("gemm", "b", b, 2);
  check_ndim("gemm", "c", c, 2);
  const std::int64_t m = trans_a ? a.dim(1) : a.dim(0), ka = trans_a ? a.dim(0) : a.dim(1);
  const std::int64_t kb = trans_b ? b.dim(1) : b.dim(0), n = trans_b ? b.dim(0) : b.dim(1);
  LOCKSTEP_CHECK(ka == kb && c.dim(0) == m && c.dim(1) == n,
                 "gemm: op(a) = ", trans_a ? "a^T" : "a", " of ", a.describe(),
                 " times op(b) = ", trans_b ? "b^T" : "b", " of ", b.describe(),
                 " does not give c = ", c.describe(), " (need [", m, ", ", ka, "] x [", kb, ", ", n,
                 "] = [", m, ", ", n, "])");
  LOCKSTEP_CHECK(!c.shares_storage(a) && !c.shares_storage(b),
                 "gemm: c must not share storage with a or b");
  ctx.backend().gemm(trans_a, trans_b, alpha, a, b, beta, c);
}

void gemm_leading(Context& ctx, std::int64_t k, float alpha, const Tensor& a, const Tensor& b,
                  float beta, Tensor& c) {
  const char* op = "gemm_leading";
  const DType ab =
      ctx.precision() == Precision::BF16 && a.dtype() == DType::BF16 ? DType::BF16 : DType::F32;
  const DType bb =
      ctx.precision() == Precision::BF16 && b.dtype() == DType::BF16 ? DType::BF16 : DType::F32;
  check_tensor(ctx, op, "a", a, ab);
  check_tensor(ctx, op, "b", b, bb);
  check_f32(ctx, op, "c", c);
  check_ndim(op, "a", a, 2);
  check_ndim(op, "b", b, 2);
  check_ndim(op, "c", c, 2);
  LOCKSTEP_CHECK(
      k >= 1 && k <= a.dim(1) && k <= b.dim(0) && c.dim(0) == a.dim(0) && c.dim(1) == b.dim(1), op,
      ": a[:, :", k, "] of ", a.describe(), " times b[:", k, ", :] of ", b.describe(),
      " does not give c = ", c.describe(), " (need k <= ", a.dim(1), " and <= ", b.dim(0),
      ", and c [", a.dim(0), ", ", b.dim(1), "])");
  LOCKSTEP_CHECK(!c.shares_storage(a) && !c.shares_storage(b), op,
                 ": c must not share storage with a or b");
  ctx.backend().gemm_leading(k, alpha, a, b, beta, c);
}

void add_row_bias(Context& ctx, Tensor& y, const Tensor& bias) {
  check_f32(ctx, "add_row_bias", "y", y);
  check_f32(ctx, "add_row_bias", "bias", bias);
  check_ndim("add_row_bias", "bias", bias, 1);
  LOCKSTEP_CHECK(y.ndim() >= 1 && y.dim(-1) == bias.dim(0), "add_row_bias: y is ", y.describe(),
                 " but bias is ", bias.describe(), " (last dimension must match)");
  ctx.backend().add_row_bias(y, bias);
}

void sum_rows(Context& ctx, const Tensor& dy, Tensor& db) {
  check_act(ctx, "sum_rows", "dy", dy);
  check_f32(ctx, "sum_rows", "db", db);
  check_ndim("sum_rows", "db", db, 1);
  LOCKSTEP_CHECK(dy.ndim() >= 1 && dy.dim(-1) == db.dim(0), "sum_rows: dy is ", dy.describe(),
                 " but db is ", db.describe(), " (last dimension must match)");
  ctx.backend().sum_rows(dy, db);
}

// ---- elementwise

void relu_forward(Context& ctx, const Tensor& x, Tensor& y) {
  check_f32(ctx, "relu_forward", "x", x);
  check_f32(ctx, "relu_forward", "y", y);
  check_same_shape("relu_forward", "x", x, "y", y);
  ctx.backend().relu_forward(x, y);
}

void relu_backward(Context& ctx, const Tensor& y, const Tensor& dy, Tensor& dx) {
  check_f32(ctx, "relu_backward", "y", y);
  check_f32(ctx, "relu_backward", "dy", dy);
  check_f32(ctx, "relu_backward", "dx", dx);
  check_same_shape("relu_backward", "y", y, "dy", dy);
  check_same_shape("relu_backward", "y", y, "dx", dx);
  ctx.backend().relu_backward(y, dy, dx);
}

void gelu_forward(Context& ctx, const Tensor& x, Tensor& y) {
  check_f32(ctx, "gelu_forward", "x", x);
  check_f32(ctx, "gelu_forward", "y", y);
  check_same_shape("gelu_forward", "x", x, "y", y);
  ctx.backend().gelu_forward(x, y);
}

void gelu_backward(Context& ctx, const Tensor& x, const Tensor& dy, Tensor& dx) {
  check_f32(ctx, "gelu_backward", "x", x);
  check_f32(ctx, "gelu_backward", "dy", dy);
  check_f32(ctx, "gelu_backward", "dx", dx);
  check_same_shape("gelu_backward", "x", x, "dy", dy);
  check_same_shape("gelu_backward", "x", x, "dx", dx);
  ctx.backend().gelu_backward(x, dy, dx);
}

void add(Context& ctx, const Tensor& a, const Tensor& b, Tensor& out) {
  check_f32(ctx, "add", "a", a);
  check_act(ctx, "add", "b", b);
  check_f32(ctx, "add", "out", out);
  check_same_shape("add", "a", a, "b", b);
  check_same_shape("add", "a", a, "out", out);
  ctx.backend().add(a, b, out);
}

void relu_backward_add(Context& ctx, const Tensor& y, const Tensor& dy, const Tensor& a,
                       Tensor& dx) {
  const char* op = "relu_backward_add";
  check_act(ctx, op, "y", y);
  check_f32(ctx, op, "dy", dy);
  check_f32(ctx, op, "a", a);
  check_f32(ctx, op, "dx", dx);
  check_same_shape(op, "y", y, "dy", dy);
  check_same_shape(op, "y", y, "a", a);
  check_same_shape(op, "y", y, "dx", dx);
  LOCKSTEP_CHECK(!dx.shares_storage(y) && !dx.shares_storage(a), op,
                 ": dx must not share storage with y or a");
  ctx.backend().relu_backward_add(bn_x(ctx, y), dy, a, dx);
}

void axpy(Context& ctx, float alpha, const Tensor& x, Tensor& y) {
  check_f32(ctx, "axpy", "x", x);
  check_f32(ctx, "axpy", "y", y);
  LOCKSTEP_CHECK(x.numel() == y.numel(), "axpy: x is ", x.describe(), " but y is ", y.describe(),
                 " (need the same number of elements)");
  ctx.backend().axpy(alpha, x, y);
}

void scale(Context& ctx, Tensor& x, float alpha) {
  check_f32(ctx, "scale", "x", x);
  ctx.backend().scale(x, alpha);
}

void dropout_forward(Context& ctx, const Tensor& x, Tensor& y, Tensor& mask, float p,
                     std::uint64_t seed, std::uint64_t stream) {
  check_f32(ctx, "dropout_forward", "x", x);
  check_f32(ctx, "dropout_forward", "y", y);
  check_tensor(ctx, "dropout_forward", "mask", mask, DType::U8);
  check_same_shape("dropout_forward", "x", x, "y", y);
  check_same_shape("dropout_forward", "x", x, "mask", mask);
  LOCKSTEP_CHECK(p >= 0.0f && p <= 1.0f, "dropout_forward: p = ", p, " must be in [0, 1]");
  ctx.backend().dropout_forward(x, y, mask, p, seed, stream);
}

void dropout_backward(Context& ctx, const Tensor& dy, const Tensor& mask, float p, Tensor& dx) {
  check_f32(ctx, "dropout_backward", "dy", dy);
  check_tensor(ctx, "dropout_backward", "mask", mask, DType::U8);
  check_f32(ctx, "dropout_backward", "dx", dx);
  check_same_shape("dropout_backward", "dy", dy, "mask", mask);
  check_same_shape("dropout_backward", "dy", dy, "dx", dx);
  LOCKSTEP_CHECK(p >= 0.0f && p <= 1.0f, "dropout_backward: p = ", p, " must be in [0, 1]");
  ctx.backend().dropout_backward(dy, mask, p, dx);
}

void normalize_input(Context& ctx, const Tensor& x, const std::vector<float>& mean,
                     const std::vector<float>& stddev, Tensor& y) {
  check_defined("normalize_input", "x", x);
  LOCKSTEP_CHECK(x.dtype() == DType::U8 || x.dtype() == DType::F32,
                 "normalize_input: x must be u8 or f32, got ", x.describe());
  LOCKSTEP_CHECK(x.device() == ctx.device(), "normalize_input: x is ", x.describe(),
                 " but the context runs on ", ctx.device().str());
  check_f32(ctx, "normalize_input", "y", y);
  check_same_shape("normalize_input", "x", x, "y", y);
  LOCKSTEP_CHECK(x.ndim() >= 1, "normalize_input: x must have a batch dimension, got ",
                 x.describe());
  const std::int64_t channels = x.ndim() >= 2 ? x.dim(1) : 1;
  for (const auto* v : {&mean, &stddev}) {
    const char* what = v == &mean ? "mean" : "std";
    LOCKSTEP_CHECK_HINT(v->empty() || static_cast<std::int64_t>(v->size()) == channels,
                        "give one value per channel (dimension 1 of x), or none",
                        "normalize_input: ", v->size(), " ", what, " values for x = ", x.describe(),
                        " with ", channels, " channels");
  }
  for (std::size_t c = 0; c < stddev.size(); ++c) {
    LOCKSTEP_CHECK(stddev[c] > 0.0f, "normalize_input: std[", c, "] = ", stddev[c],
                   " must be positive");
  }
  ctx.backend().normalize_input(x, mean, stddev, y);
}

// ---- convolution and pooling

namespace {
// Names are the caller's: x/w/y for forward, dx/w/dy for backward-data, x/dw/dy for weights;
// `inputs` says which of x and y the op reads (those may be bf16 on a bf16 context).
struct ConvNames {
  const char *x, *w, *y;
};
enum class ConvInputs { X, Y, Both };
void check_conv(Context& ctx, const char* op, const Tensor& x, const Tensor& w, const Tensor& y,
                const Conv2dParams& p, ConvNames n, ConvInputs inputs) {
  // bf16 activations are the precision policy's own format: accepted only where it is bf16, and
  // never for backward-data's dx (an f32 sum).
  auto activation = [&](const char* name, const Tensor& t, bool input) {
    const bool bf16 = input && ctx.precision() == Precision::BF16 && t.dtype() == DType::BF16;
    check_tensor(ctx, op, name, t, bf16 ? DType::BF16 : DType::F32);
  };
  activation(n.x, x, inputs != ConvInputs::Y);
  check_f32(ctx, op, n.w, w);
  activation(n.y, y, true);  // dy, or the forward's output (f32, or bf16 rounded once)
  check_ndim(op, n.x, x, 4);
  check_ndim(op, n.w, w, 4);
  check_ndim(op, n.y, y, 4);
  LOCKSTEP_CHECK(w.dim(1) == x.dim(1), op, ": ", n.w, " is ", w.describe(), " but ", n.x, " is ",
                 x.describe(), " (", n.w, " must be [out, ", x.dim(1), ", kh, kw])");
  const Shape expected = {
      x.dim(0), w.dim(0),
      window_output_size(x.dim(2), static_cast<int>(w.dim(2)), p.stride_h, p.pad_h),
      window_output_size(x.dim(3), static_cast<int>(w.dim(3)), p.stride_w, p.pad_w)};
  LOCKSTEP_CHECK(y.shape() == expected, op, ": ", n.y, " is ", y.describe(), " but ", n.x, " ",
                 x.describe(), " with ", n.w, " ", w.describe(), ", stride ", p.stride_h, "x",
                 p.stride_w, ", padding ", p.pad_h, "x", p.pad_w, " gives ", shape_str(expected));
}

void check_pool(Context& ctx, const char* op, const Tensor& x, const Tensor& y,
                const Pool2dParams& p) {
  check_f32(ctx, op, "x", x);
  check_f32(ctx, op, "y", y);
  check_ndim(op, "x", x, 4);
  check_ndim(op, "y", y, 4);
  LOCKSTEP_CHECK(p.pad_h * 2 <= p.kernel_h && p.pad_w * 2 <= p.kernel_w, op, ": padding ", p.pad_h,
                 "x", p.pad_w, " must be at most half the kernel ", p.kernel_h, "x", p.kernel_w);
  const Shape expected = {x.dim(0), x.dim(1),
                          window_output_size(x.dim(2), p.kernel_h, p.stride_h, p.pad_h),
                          window_output_size(x.dim(3), p.kernel_w, p.stride_w, p.pad_w)};
  LOCKSTEP_CHECK(y.shape() == expected, op, ": output is ", y.describe(), " but x ", x.describe(),
                 " with kernel ", p.kernel_h, "x", p.kernel_w, ", stride ", p.stride_h, "x",
                 p.stride_w, ", padding ", p.pad_h, "x", p.pad_w, " gives ", shape_str(expected));
}
}  // namespace

void conv2d_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y,
                    const Conv2dParams& p) {
  check_conv(ctx, "conv2d_forward", x, w, y, p, {"x", "w", "y"}, ConvInputs::X);
  if (b.defined()) check_channel_vector(ctx, "conv2d_forward", "b", b, w.dim(0));
  if (y.dtype() == DType::BF16 &&
      !ctx.backend().bf16_conv_bn_activations()) {  // the f32 result, rounded once
    Tensor wide = ctx.transient(y.shape());
    ctx.backend().conv2d_forward(x, w, b, wide, p);
    ctx.backend().cast(wide, y);
    return;
  }
  ctx.backend().conv2d_forward(x, w, b, y, p);
}

bool bf16_conv_bn_activations(Context& ctx) {
  return ctx.backend().bf16_conv_bn_activations();
}

void conv2d_backward_data(Context& ctx, const Tensor& dy, const Tensor& w, Tensor& dx,
                          const Conv2dParams& p) {
  check_conv(ctx, "conv2d_backward_data", dx, w, dy, p, {"dx", "w", "dy"}, ConvInputs::Y);
  ctx.backend().conv2d_backward_data(dy, w, dx, p);
}

void conv2d_backward_weights(Context& ctx, const Tensor& x, const Tensor& dy, Tensor& dw,
                             Tensor& db, const Conv2dParams& p) {
  check_conv(ctx, "conv2d_backward_weights", x, dw, dy, p, {"x", "dw", "dy"}, ConvInputs::Both);
  if (db.defined()) check_channel_vector(ctx, "conv2d_backward_weights", "db", db, dw.dim(0));
  ctx.backend().conv2d_backward_weights(x, dy, dw, db, p);
}

void pool2d_forward(Context& ctx, PoolKind kind, const Tensor& x, Tensor& y, Tensor& workspace,
                    const Pool2dParams& p) {
  check_pool(ctx, "pool2d_forward", x, y, p);
  ctx.backend().pool2d_forward(kind, x, y, workspace, p);
}

void pool2d_backward(Context& ctx, PoolKind kind, const Tensor& dy, const Tensor& workspace,
                     Tensor& dx, const Pool2dParams& p) {
  check_pool(ctx, "pool2d_backward", dx, dy, p);
  if (kind == PoolKind::Max) {
    LOCKSTEP_CHECK_HINT(workspace.defined(), "pass the workspace that pool2d_forward filled",
                        "pool2d_backward: max pooling needs the forward pass's workspace, got an "
                        "undefined tensor");
  }
  ctx.backend().pool2d_backward(kind, dy, workspace, dx, p);
}

// ---- batch normalisation

namespace {
std::int64_t check_bn_input(Context& ctx, const char* op, const Tensor& x) {
  check_act(ctx, op, "x", x);
  LOCKSTEP_CHECK(x.ndim() == 2 || x.ndim() == 4, op, ": x must be [N, C] or [N, C, H, W], got ",
                 x.describe());
  return x.dim(1);
}
// The per-channel vectors and settings of a training-mode forward; returns C.
std::int64_t check_bn_train(Context& ctx, const char* op, const Tensor& x, const Tensor& gamma,
                            const Tensor& beta, const Tensor& save_mean, const Tensor& save_invstd,
                            const Tensor& running_mean, const Tensor& running_var, float momentum,
                            float eps) {
  const std::int64_t c = check_bn_input(ctx, op, x);
  check_channel_vector(ctx, op, "gamma", gamma, c);
  check_channel_vector(ctx, op, "beta", beta, c);
  check_channel_vector(ctx, op, "save_mean", save_mean, c);
  check_channel_vector(ctx, op, "save_invstd", save_invstd, c);
  check_channel_vector(ctx, op, "running_mean", running_mean, c);
  check_channel_vector(ctx, op, "running_var", running_var, c);
  LOCKSTEP_CHECK_HINT(c == 0 || x.numel() / c > 1, "use a batch larger than 1", op,
                      ": expected more than 1 value per channel when training, got ", x.describe());
  LOCKSTEP_CHECK(momentum >= 0.0f && momentum <= 1.0f && eps > 0.0f, op, ": momentum ", momentum,
                 " must be in [0, 1] and eps ", eps, " positive");
  return c;
}

// The same for evaluation mode (the running statistics).
std::int64_t check_bn_eval(Context& ctx, const char* op, const Tensor& x, const Tensor& gamma,
                           const Tensor& beta, const Tensor& running_mean,
                           const Tensor& running_var, float eps) {
  const std::int64_t c = check_bn_input(ctx, op, x);
  check_channel_vector(ctx, op, "gamma", gamma, c);
  check_channel_vector(ctx, op, "beta", beta, c);
  check_channel_vector(ctx, op, "running_mean", running_mean, c);
  check_channel_vector(ctx, op, "running_var", running_var, c);
  LOCKSTEP_CHECK(eps > 0.0f, op, ": eps ", eps, " must be positive");
  return c;
}

// A backward's gradients: dy and dx of x's shape (dx f32 or a bf16 activation), the per-channel
// vectors; returns C.
std::int64_t check_bn_backward(Context& ctx, const char* op, const Tensor& x, const Tensor& dy,
                               const Tensor& gamma, const Tensor& save_mean,
                               const Tensor& save_invstd, const Tensor& dx, const Tensor& dgamma,
                               const Tensor& dbeta) {
  const std::int64_t c = check_bn_input(ctx, op, x);
  check_f32(ctx, op, "dy", dy);
  check_act(ctx, op, "dx", dx);
  check_same_shape(op, "x", x, "dy", dy);
  check_same_shape(op, "x", x, "dx", dx);
  check_channel_vector(ctx, op, "gamma", gamma, c);
  check_channel_vector(ctx, op, "save_mean", save_mean, c);
  check_channel_vector(ctx, op, "save_invstd", save_invstd, c);
  check_channel_vector(ctx, op, "dgamma", dgamma, c);
  check_channel_vector(ctx, op, "dbeta", dbeta, c);
  return c;
}
}  // namespace

void batchnorm_forward_train(Context& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                             Tensor& y, Tensor& save_mean, Tensor& save_invstd,
                             Tensor& running_mean, Tensor& running_var, float momentum, float eps) {
  const char* op = "batchnorm_forward_train";
  check_bn_train(ctx, op, x, gamma, beta, save_mean, save_invstd, running_mean, running_var,
                 momentum, eps);
  check_f32(ctx, op, "y", y);
  check_same_shape(op, "x", x, "y", y);
  ctx.backend().batchnorm_forward_train(bn_x(ctx, x), gamma, beta, y, save_mean, save_invstd,
                                        running_mean, running_var, momentum, eps);
}

void batchnorm_forward_eval(Context& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                            const Tensor& running_mean, const Tensor& running_var, float eps,
                            Tensor& y) {
  const char* op = "batchnorm_forward_eval";
  check_bn_eval(ctx, op, x, gamma, beta, running_mean, running_var, eps);
  check_f32(ctx, op, "y", y);
  check_same_shape(op, "x", x, "y", y);
  ctx.backend().batchnorm_forward_eval(bn_x(ctx, x), gamma, beta, running_mean, running_var, eps,
                                       y);
}

void batchnorm_backward(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& gamma,
                        const Tensor& save_mean, const Tensor& save_invstd, Tensor& dx,
                        Tensor& dgamma, Tensor& dbeta) {
  check_bn_backward(ctx, "batchnorm_backward", x, dy, gamma, save_mean, save_invstd, dx, dgamma,
                    dbeta);
  ctx.backend().batchnorm_backward(bn_x(ctx, x), dy, gamma, save_mean, save_invstd, dx, dgamma,
                                   dbeta);
}

namespace {
// The epilogue as the backend reads it: a bf16 residual widened where it reads only f32.
BatchNormEpilogue bn_epilogue(Context& ctx, const BatchNormEpilogue& e) {
  return {e.residual.defined() ? bn_x(ctx, e.residual) : Tensor(), e.relu};
}

void check_bn_epilogue(Context& ctx, const char* op, const Tensor& x,
                       const BatchNormEpilogue& epilogue, const Tensor& y) {
  check_act(ctx, op, "y", y);
  check_same_shape(op, "x", x, "y", y);
  LOCKSTEP_CHECK(!y.shares_storage(x), op, ": y must not share storage with x");
  if (epilogue.residual.defined()) {
    check_act(ctx, op, "residual", epilogue.residual);
    check_same_shape(op, "x", x, "residual", epilogue.residual);
    LOCKSTEP_CHECK(!y.shares_storage(epilogue.residual), op,
                   ": y must not share storage with the residual");
  }
}
}  // namespace

void batchnorm_act_forward_train(Context& ctx, const Tensor& x, const Tensor& gamma,
                                 const Tensor& beta, const BatchNormEpilogue& epilogue, Tensor& y,
                                 Tensor& save_mean, Tensor& save_invstd, Tensor& running_mean,
                                 Tensor& running_var, float momentum, float eps) {
  const char* op = "batchnorm_act_forward_train";
  check_bn_train(ctx, op, x, gamma, beta, save_mean, save_invstd, running_mean, running_var,
                 momentum, eps);
  check_bn_epilogue(ctx, op, x, epilogue, y);
  ctx.backend().batchnorm_act_forward_train(bn_x(ctx, x), gamma, beta, bn_epilogue(ctx, epilogue),
                                            y, save_mean, save_invstd, running_mean, running_var,
                                            momentum, eps);
}

void batchnorm_act_forward_eval(Context& ctx, const Tensor& x, const Tensor& gamma,
                                const Tensor& beta, const Tensor& running_mean,
                                const Tensor& running_var, float eps,
                                const BatchNormEpilogue& epilogue, Tensor& y) {
  const char* op = "batchnorm_act_forward_eval";
  check_bn_eval(ctx, op, x, gamma, beta, running_mean, running_var, eps);
  check_bn_epilogue(ctx, op, x, epilogue, y);
  ctx.backend().batchnorm_act_forward_eval(bn_x(ctx, x), gamma, beta, running_mean, running_var,
                                           eps, bn_epilogue(ctx, epilogue), y);
}

void batchnorm_relu_backward(Context& ctx, const Tensor& x, const Tensor& y, const Tensor& dy,
                             const Tensor& gamma, const Tensor& save_mean,
                             const Tensor& save_invstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const char* op = "batchnorm_relu_backward";
  check_bn_backward(ctx, op, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta);
  check_act(ctx, op, "y", y);
  check_same_shape(op, "x", x, "y", y);
  LOCKSTEP_CHECK(!dx.shares_storage(x) && !dx.shares_storage(y), op,
                 ": dx must not share storage with x or y");
  ctx.backend().batchnorm_relu_backward(bn_x(ctx, x), y, dy, gamma, save_mean, save_invstd, dx,
                                        dgamma, dbeta);
}

// ---- loss

namespace {

// Label smoothing eps must be in [0, 1): eps = 1 would ignore the labels altogether.
void check_label_smoothing(const char* op, float label_smoothing) {
  LOCKSTEP_CHECK(label_smoothing >= 0.0f && label_smoothing < 1.0f, op,
                 ": label_smoothing must be in [0, 1), got ", label_smoothing);
}

}  // namespace

void softmax_xent_forward(Context& ctx, const Tensor& logits, const Tensor& labels, Tensor& probs,
                          Tensor& loss, float label_smoothing) {
  const char* op = "softmax_xent_forward";
  check_label_smoothing(op, label_smoothing);
  check_f32(ctx, op, "logits", logits);
  check_ndim(op, "logits", logits, 2);
  LOCKSTEP_CHECK(logits.dim(1) >= 1, op, ": logits need at least one class, got ",
                 logits.describe());
  check_labels_tensor(ctx, op, logits, labels);
  check_f32(ctx, op, "probs", probs);
  check_same_shape(op, "logits", logits, "probs", probs);
  check_f32(ctx, op, "loss", loss);
  LOCKSTEP_CHECK(loss.numel() == 1, op, ": loss must have one element, got ", loss.describe());
  ctx.backend().softmax_xent_forward(logits, labels, probs, loss, label_smoothing);
}

void softmax_xent_backward(Context& ctx, const Tensor& probs, const Tensor& labels, float scale,
                           Tensor& dlogits, float label_smoothing) {
  const char* op = "softmax_xent_backward";
  check_label_smoothing(op, label_smoothing);
  check_f32(ctx, op, "probs", probs);
  check_ndim(op, "probs", probs, 2);
  check_labels_tensor(ctx, op, probs, labels);
  check_f32(ctx, op, "dlogits", dlogits);
  check_same_shape(op, "probs", probs, "dlogits", dlogits);
  ctx.backend().softmax_xent_backward(probs, labels, scale, dlogits, label_smoothing);
}

std::int64_t count_correct(Context& ctx, const Tensor& logits, const Tensor& labels) {
  const char* op = "count_correct";
  check_f32(ctx, op, "logits", logits);
  check_ndim(op, "logits", logits, 2);
  LOCKSTEP_CHECK(logits.dim(1) >= 1, op, ": logits need at least one class, got ",
                 logits.describe());
  check_labels_tensor(ctx, op, logits, labels);
  return ctx.backend().count_correct(logits, labels);
}

void softmax_xent_chunk(Context& ctx, Tensor& logits, const Tensor& labels, std::int64_t first_row,
                        std::int64_t classes, float scale, Tensor& row_loss,
                        float label_smoothing) {
  const char* op = "softmax_xent_chunk";
  check_label_smoothing(op, label_smoothing);
  check_f32(ctx, op, "logits", logits);
  check_ndim(op, "logits", logits, 2);
  LOCKSTEP_CHECK(classes >= 1 && classes <= logits.dim(1), op, ": classes = ", classes,
                 " must be in [1, ", logits.dim(1), "] for logits ", logits.describe());
  check_tensor(ctx, op, "labels", labels, DType::I32);
  check_ndim(op, "labels", labels, 1);
  LOCKSTEP_CHECK(first_row >= 0 && first_row + logits.dim(0) <= labels.dim(0), op, ": rows [",
                 first_row, ", ", first_row + logits.dim(0), ") of logits ", logits.describe(),
                 " are not rows of the batch's labels ", labels.describe());
  check_tensor(ctx, op, "row_loss", row_loss, DType::F64);
  check_shape(op, "row_loss", row_loss, {labels.dim(0)});
  ctx.backend().softmax_xent_chunk(logits, labels, first_row, classes, scale, row_loss,
                                   label_smoothing);
}

void mean_row_loss(Context& ctx, const Tensor& row_loss, Tensor& loss) {
  const char* op = "mean_row_loss";
  check_tensor(ctx, op, "row_loss", row_loss, DType::F64);
  check_ndim(op, "row_loss", row_loss, 1);
  check_f32(ctx, op, "loss", loss);
  LOCKSTEP_CHECK(loss.numel() == 1, op, ": loss must have one element, got ", loss.describe());
  ctx.backend().mean_row_loss(row_loss, loss);
}

// ---- reductions

double sum_squares(Context& ctx, const Tensor& x) {
  check_f32(ctx, "sum_squares", "x", x);
  return ctx.backend().sum_squares(x);
}

bool all_finite(Context& ctx, const Tensor& x) {
  check_f32(ctx, "all_finite", "x", x);
  return ctx.backend().all_finite(x);
}

// ---- optimizer updates

void sgd_update(Context& ctx, Tensor& param, const Tensor& grad, Tensor& momentum_buf,
                const SgdParams& p) {
  const char* op = "sgd_update";
  check_f32(ctx, op, "param", param);
  check_f32(ctx, op, "grad", grad);
  check_same_shape(op, "param", param, "grad", grad);
  if (p.momentum != 0.0f) {
    LOCKSTEP_CHECK_HINT(momentum_buf.defined(), "allocate a momentum buffer like the parameter", op,
                        ": momentum ", p.momentum, " needs a momentum buffer for ",
                        param.describe());
    check_f32(ctx, op, "momentum_buf", momentum_buf);
    check_same_shape(op, "param", param, "momentum_buf", momentum_buf);
  }
  LOCKSTEP_CHECK(!p.nesterov || (p.momentum > 0.0f && p.dampening == 0.0f), op,
                 ": nesterov needs momentum > 0 and dampening 0 (got momentum ", p.momentum,
                 ", dampening ", p.dampening, ")");
  LOCKSTEP_CHECK(!p.verdict.defined(), op,
                 ": a verdict is for the fused update (flat_sgd_update), not the per-tensor one");
  ctx.backend().sgd_update(param, grad, momentum_buf, p);
}

void adamw_update(Context& ctx, Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                  const AdamWParams& p) {
  const char* op = "adamw_update";
  check_f32(ctx, op, "param", param);
  check_f32(ctx, op, "grad", grad);
  check_f32(ctx, op, "m", m);
  check_f32(ctx, op, "v", v);
  check_same_shape(op, "param", param, "grad", grad);
  check_same_shape(op, "param", param, "m", m);
  check_same_shape(op, "param", param, "v", v);
  LOCKSTEP_CHECK(p.step >= 1, op, ": step is 1-based, got ", p.step);
  LOCKSTEP_CHECK(!p.verdict.defined(), op,
                 ": a verdict is for the fused update (flat_adamw_update), not the per-tensor one");
  ctx.backend().adamw_update(param, grad, m, v, p);
}

// ---- fused ops over flat buffers

FlatPlan::FlatPlan(std::vector<FlatSegment> segments, std::int64_t numel, Device device)
    : segments_(std::move(segments)), numel_(numel), device_(device) {
  for (const FlatSegment& s : segments_)
    slots_ = std::max(slots_, s.slot + 1);
}

std::shared_ptr<const FlatPlan> make_flat_plan(Context& ctx, std::vector<FlatSegment> segments,
                                               std::int64_t numel) {
  constexpr std::int64_t align = kFlatAlignBytes / static_cast<std::int64_t>(sizeof(float));
  std::sort(segments.begin(), segments.end(),
            [](const FlatSegment& a, const FlatSegment& b) { return a.offset < b.offset; });
  std::vector<bool> slot_used;
  std::int64_t end = 0;
  for (const FlatSegment& s : segments) {
    LOCKSTEP_CHECK(s.numel > 0 && s.offset >= end && s.offset % align == 0,
                   "make_flat_plan: segment of slot ", s.slot, " at [", s.offset, ", ",
                   s.offset + s.numel, ") must be non-empty, start on a ", kFlatAlignBytes,
                   "-byte boundary and not overlap the previous one (ending at ", end, ")");
    LOCKSTEP_CHECK(s.slot >= 0, "make_flat_plan: negative slot ", s.slot);
    if (slot_used.size() <= static_cast<std::size_t>(s.slot))
      slot_used.resize(static_cast<std::size_t>(s.slot) + 1, false);
    LOCKSTEP_CHECK(!slot_used[static_cast<std::size_t>(s.slot)], "make_flat_plan: slot ", s.slot,
                   " used by two segments");
    slot_used[static_cast<std::size_t>(s.slot)] = true;
    end = s.offset + s.numel;
  }
  LOCKSTEP_CHECK(end <= numel, "make_flat_plan: segments end at element ", end,
                 " but the flat buffer has ", numel);
  return ctx.backend().make_flat_plan(std::move(segments), numel);
}

namespace {

void check_flat(Context& ctx, const char* op, const FlatPlan& plan, FlatRange range) {
  LOCKSTEP_CHECK(plan.device() == ctx.device(), op, ": the plan was made for ", plan.device().str(),
                 " but the context runs on ", ctx.device().str());
  LOCKSTEP_CHECK(0 <= range.begin && range.begin <= range.end && range.end <= plan.numel(), op,
                 ": range [", range.begin, ", ", range.end, ") is outside the flat buffer of ",
                 plan.numel(), " elements");
}

void check_flat_buffer(Context& ctx, const char* op, const char* name, const Tensor& t,
                       const FlatPlan& plan) {
  check_f32(ctx, op, name, t);
  LOCKSTEP_CHECK(t.numel() == plan.numel(), op, ": ", name, " is ", t.describe(),
                 " but the flat layout has ", plan.numel(), " elements");
}

void check_flat_state(Context& ctx, const char* op, const char* name, const Tensor& t,
                      std::int64_t origin, FlatRange range) {
  check_f32(ctx, op, name, t);
  LOCKSTEP_CHECK(
      range.begin == range.end || (origin <= range.begin && range.end <= origin + t.numel()), op,
      ": ", name, " holds elements [", origin, ", ", origin + t.numel(),
      ") of the layout, which does not cover the range [", range.begin, ", ", range.end, ")");
}

}  // namespace

namespace {
void check_verdict(Context& ctx, const char* op, const Tensor& verdict) {
  check_tensor(ctx, op, "verdict", verdict, DType::F64);
  LOCKSTEP_CHECK(verdict.numel() == 2, op, ": verdict must be f64 [2], got ", verdict.describe());
}
}  // namespace

void flat_sgd_update(Context& ctx, const FlatPlan& plan, FlatRange range, Tensor& param,
                     const Tensor& grad, Tensor& momentum_buf, std::int64_t state_origin,
                     const SgdParams& p) {
  const char* op = "flat_sgd_update";
  check_flat(ctx, op, plan, range);
  check_flat_buffer(ctx, op, "param", param, plan);
  check_flat_buffer(ctx, op, "grad", grad, plan);
  if (p.momentum != 0.0f) {
    LOCKSTEP_CHECK_HINT(momentum_buf.defined(), "allocate a momentum buffer like the parameters",
                        op, ": momentum ", p.momentum, " needs a momentum buffer");
    check_flat_state(ctx, op, "momentum_buf", momentum_buf, state_origin, range);
  }
  LOCKSTEP_CHECK(!p.nesterov || (p.momentum > 0.0f && p.dampening == 0.0f), op,
                 ": nesterov needs momentum > 0 and dampening 0 (got momentum ", p.momentum,
                 ", dampening ", p.dampening, ")");
  if (p.verdict.defined()) {
    check_verdict(ctx, op, p.verdict);
    LOCKSTEP_CHECK(p.step >= 1, op, ": step is 1-based, got ", p.step);
  }
  ctx.backend().flat_sgd_update(plan, range, param, grad, momentum_buf, state_origin, p);
}

void flat_adamw_update(Context& ctx, const FlatPlan& plan, FlatRange range, Tensor& param,
                       const Tensor& grad, Tensor& m, Tensor& v, std::int64_t state_origin,
                       const AdamWParams& p) {
  const char* op = "flat_adamw_update";
  check_flat(ctx, op, plan, range);
  check_flat_buffer(ctx, op, "param", param, plan);
  check_flat_buffer(ctx, op, "grad", grad, plan);
  check_flat_state(ctx, op, "m", m, state_origin, range);
  check_flat_state(ctx, op, "v", v, state_origin, range);
  LOCKSTEP_CHECK(m.numel() == v.numel(), op, ": m is ", m.describe(), " but v is ", v.describe());
  LOCKSTEP_CHECK(p.step >= 1, op, ": step is 1-based, got ", p.step);
  if (p.verdict.defined()) check_verdict(ctx, op, p.verdict);
  ctx.backend().flat_adamw_update(plan, range, param, grad, m, v, state_origin, p);
}

void flat_sum_squares(Context& ctx, const FlatPlan& plan, FlatRange range, const Tensor& x,
                      Tensor& sums, FlatSums what) {
  const char* op = "flat_sum_squares";
  check_flat(ctx, op, plan, range);
  check_flat_buffer(ctx, op, "x", x, plan);
  check_tensor(ctx, op, "sums", sums, DType::F64);
  LOCKSTEP_CHECK(sums.numel() == plan.slots() + 1, op,
                 ": sums must have slots + 1 = ", plan.slots() + 1, " elements, got ",
                 sums.describe());
  ctx.backend().flat_sum_squares(plan, range, x, sums, what);
}

void verdict_add(Context& ctx, const Tensor& total, Tensor& verdict, bool first) {
  const char* op = "verdict_add";
  check_verdict(ctx, op, verdict);
  check_tensor(ctx, op, "total", total, DType::F64);
  LOCKSTEP_CHECK(total.numel() == 1, op, ": total must be f64 [1], got ", total.describe());
  ctx.backend().verdict_add(total, verdict, first);
}

void verdict_close(Context& ctx, Tensor& verdict, std::int64_t taken) {
  check_verdict(ctx, "verdict_close", verdict);
  LOCKSTEP_CHECK(taken >= 0, "verdict_close: taken must be >= 0, got ", taken);
  ctx.backend().verdict_close(verdict, taken);
}

void clip_by_verdict(Context& ctx, Tensor& x, const Tensor& verdict, double max_norm) {
  const char* op = "clip_by_verdict";
  check_f32(ctx, op, "x", x);
  check_verdict(ctx, op, verdict);
  LOCKSTEP_CHECK(max_norm > 0.0, op, ": max_norm must be positive, got ", max_norm);
  ctx.backend().clip_by_verdict(x, verdict, max_norm);
}

// ---- transformer (GPT) ops

namespace {
// tokens [B, T] i32 against wte [V, C] and wpe [P, C]; returns C.
std::int64_t check_embedding(Context& ctx, const char* op, const Tensor& tokens, const Tensor& wte,
                             const Tensor& wpe, const char* wte_name, const char* wpe_name) {
  check_tensor(ctx, op, "tokens", tokens, DType::I32);
  check_ndim(op, "tokens", tokens, 2);
  check_f32(ctx, op, wte_name, wte);
  check_f32(ctx, op, wpe_name, wpe);
  check_ndim(op, wte_name, wte, 2);
  check_ndim(op, wpe_name, wpe, 2);
  LOCKSTEP_CHECK(wte.dim(1) == wpe.dim(1), op, ": ", wte_name, " is ", wte.describe(), " but ",
                 wpe_name, " is ", wpe.describe(), " (both must be [*, C])");
  LOCKSTEP_CHECK_HINT(
      tokens.dim(1) <= wpe.dim(0), "use sequences no longer than the model's context (its ctx)", op,
      ": tokens ", tokens.describe(), " have ", tokens.dim(1),
      " positions but the position embedding ", wpe.describe(), " has only ", wpe.dim(0));
  return wte.dim(1);
}

void check_layernorm_params(Context& ctx, const char* op, const Tensor& x, const Tensor& weight,
                            const Tensor& mean, const Tensor& rstd) {
  check_f32(ctx, op, "x", x);
  LOCKSTEP_CHECK(x.ndim() >= 1, op, ": x must have a feature dimension, got ", x.describe());
  const std::int64_t c = x.dim(-1), rows = c ? x.numel() / c : 0;
  check_channel_vector(ctx, op, "weight", weight, c);
  check_channel_vector(ctx, op, "mean", mean, rows);
  check_channel_vector(ctx, op, "rstd", rstd, rows);
}

// qkv [B, T, 3C] with C divisible by heads; returns C.
std::int64_t check_qkv(Context& ctx, const char* op, const Tensor& qkv, int heads) {
  check_act(ctx, op, "qkv", qkv);
  check_ndim(op, "qkv", qkv, 3);
  LOCKSTEP_CHECK(heads >= 1, op, ": heads must be positive, got ", heads);
  LOCKSTEP_CHECK(qkv.dim(2) % 3 == 0 && (qkv.dim(2) / 3) % heads == 0, op, ": qkv ", qkv.describe(),
                 " must be [B, T, 3C] with C divisible by heads = ", heads);
  return qkv.dim(2) / 3;
}
}  // namespace

void embedding_forward(Context& ctx, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       Tensor& y) {
  const char* op = "embedding_forward";
  const std::int64_t c = check_embedding(ctx, op, tokens, wte, wpe, "wte", "wpe");
  check_f32(ctx, op, "y", y);
  check_shape(op, "y", y, {tokens.dim(0), tokens.dim(1), c});
  ctx.backend().embedding_forward(tokens, wte, wpe, y);
}

void embedding_backward(Context& ctx, const Tensor& tokens, const Tensor& dy, Tensor& dwte,
                        Tensor& dwpe) {
  const char* op = "embedding_backward";
  const std::int64_t c = check_embedding(ctx, op, tokens, dwte, dwpe, "dwte", "dwpe");
  check_f32(ctx, op, "dy", dy);
  check_shape(op, "dy", dy, {tokens.dim(0), tokens.dim(1), c});
  ctx.backend().embedding_backward(tokens, dy, dwte, dwpe);
}

void layernorm_forward(Context& ctx, const Tensor& x, const Tensor& weight, const Tensor& bias,
                       float eps, Tensor& y, Tensor& mean, Tensor& rstd) {
  const char* op = "layernorm_forward";
  check_layernorm_params(ctx, op, x, weight, mean, rstd);
  check_channel_vector(ctx, op, "bias", bias, x.dim(-1));
  check_act(ctx, op, "y", y);
  check_same_shape(op, "x", x, "y", y);
  LOCKSTEP_CHECK(eps > 0.0f, op, ": eps ", eps, " must be positive");
  ctx.backend().layernorm_forward(x, weight, bias, eps, y, mean, rstd);
}

void layernorm_backward(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd, const Tensor& dresidual, Tensor& dx,
                        Tensor& dweight, Tensor& dbias) {
  const char* op = "layernorm_backward";
  check_layernorm_params(ctx, op, x, weight, mean, rstd);
  check_act(ctx, op, "dy", dy);
  check_f32(ctx, op, "dx", dx);
  check_same_shape(op, "x", x, "dy", dy);
  check_same_shape(op, "x", x, "dx", dx);
  if (dresidual.defined()) {
    check_f32(ctx, op, "dresidual", dresidual);
    check_same_shape(op, "x", x, "dresidual", dresidual);
  }
  check_channel_vector(ctx, op, "dweight", dweight, x.dim(-1));
  check_channel_vector(ctx, op, "dbias", dbias, x.dim(-1));
  LOCKSTEP_CHECK(!dx.shares_storage(x) && !dx.shares_storage(dy), op,
                 ": dx must not share storage with x or dy");
  ctx.backend().layernorm_backward(x, dy, weight, mean, rstd, dresidual, dx, dweight, dbias);
}

void gelu_tanh_forward(Context& ctx, const Tensor& x, Tensor& y) {
  check_act(ctx, "gelu_tanh_forward", "x", x);
  check_act(ctx, "gelu_tanh_forward", "y", y);
  check_same_dtype("gelu_tanh_forward", "x", x, "y", y);
  check_same_shape("gelu_tanh_forward", "x", x, "y", y);
  ctx.backend().gelu_tanh_forward(x, y);
}

void gelu_tanh_backward(Context& ctx, const Tensor& x, const Tensor& dy, Tensor& dx) {
  check_act(ctx, "gelu_tanh_backward", "x", x);
  check_act(ctx, "gelu_tanh_backward", "dy", dy);
  check_act(ctx, "gelu_tanh_backward", "dx", dx);
  check_same_dtype("gelu_tanh_backward", "x", x, "dy", dy);
  check_same_dtype("gelu_tanh_backward", "x", x, "dx", dx);
  check_same_shape("gelu_tanh_backward", "x", x, "dy", dy);
  check_same_shape("gelu_tanh_backward", "x", x, "dx", dx);
  ctx.backend().gelu_tanh_backward(x, dy, dx);
}

const char* attention_kernel_name(AttentionKernel k) {
  switch (k) {
    case AttentionKernel::Auto:
      return "auto";
    case AttentionKernel::Reference:
      return "reference";
    case AttentionKernel::Cudnn:
      return "cudnn";
    case AttentionKernel::Naive:
      return "naive";
  }
  return "?";
}

AttentionKernel attention_kernel_from_name(const std::string& name) {
  for (AttentionKernel k : {AttentionKernel::Auto, AttentionKernel::Reference,
                            AttentionKernel::Cudnn, AttentionKernel::Naive})
    if (name == attention_kernel_name(k)) return k;
  LOCKSTEP_FAIL("unknown attention kernel '", name, "' (expected auto, reference, cudnn or naive)");
}

AttentionChoice choose_attention(Context& ctx, AttentionKernel requested, std::int64_t b,
                                 std::int64_t t, int heads, std::int64_t head_dim) {
  if (requested == AttentionKernel::Reference || requested == AttentionKernel::Naive)
    return {requested, "lockstep's own kernels, in f32"};
  AttentionChoice c = ctx.backend().cudnn_attention(ctx.precision(), b, t, heads, head_dim);
  if (c.kernel == AttentionKernel::Cudnn || requested == AttentionKernel::Auto) return c;
  LOCKSTEP_FAIL_HINT("use the reference kernels there (attention auto or reference)",
                     "cuDNN's fused attention cannot run on ", ctx.device().str(), " for qkv [", b,
                     ", ", t, ", 3 x ", heads, " heads x ", head_dim, "] in ",
                     precision_name(ctx.precision()), ": ", c.detail);
}

namespace {
// The kernel the backend runs: Auto resolved, Cudnn checked (ops never pass Auto down).
AttentionKernel resolve_attention(Context& ctx, AttentionKernel kernel, std::int64_t b,
                                  std::int64_t t, int heads, std::int64_t c) {
  if (kernel != AttentionKernel::Auto && kernel != AttentionKernel::Cudnn) return kernel;
  return choose_attention(ctx, kernel, b, t, heads, c / heads).kernel;
}
}  // namespace

void attention_forward(Context& ctx, const Tensor& qkv, int heads, Tensor& out, Tensor& lse,
                       AttentionKernel kernel) {
  const char* op = "attention_forward";
  const std::int64_t c = check_qkv(ctx, op, qkv, heads);
  const std::int64_t b = qkv.dim(0), t = qkv.dim(1);
  check_act(ctx, op, "out", out);
  check_same_dtype(op, "qkv", qkv, "out", out);
  check_shape(op, "out", out, {b, t, c});
  check_f32(ctx, op, "lse", lse);
  check_shape(op, "lse", lse, {b, heads, t});
  LOCKSTEP_CHECK(!out.shares_storage(qkv) && !lse.shares_storage(qkv), op,
                 ": out and lse must not share storage with qkv");
  ctx.backend().attention_forward(qkv, heads, out, lse,
                                  resolve_attention(ctx, kernel, b, t, heads, c));
}

void attention_backward(Context& ctx, const Tensor& qkv, const Tensor& out, const Tensor& dout,
                        const Tensor& lse, int heads, Tensor& dqkv, AttentionKernel kernel) {
  const char* op = "attention_backward";
  const std::int64_t c = check_qkv(ctx, op, qkv, heads);
  const std::int64_t b = qkv.dim(0), t = qkv.dim(1);
  for (const auto& [name, tensor] :
       {std::pair<const char*, const Tensor*>{"out", &out}, {"dout", &dout}, {"dqkv", &dqkv}}) {
    check_act(ctx, op, name, *tensor);
    check_same_dtype(op, "qkv", qkv, name, *tensor);
  }
  check_shape(op, "out", out, {b, t, c});
  check_shape(op, "dout", dout, {b, t, c});
  check_f32(ctx, op, "lse", lse);
  check_shape(op, "lse", lse, {b, heads, t});
  check_same_shape(op, "qkv", qkv, "dqkv", dqkv);
  LOCKSTEP_CHECK(!dqkv.shares_storage(qkv) && !dqkv.shares_storage(out) &&
                     !dqkv.shares_storage(dout) && !dqkv.shares_storage(lse),
                 op, ": dqkv must not share storage with the other arguments");
  ctx.backend().attention_backward(qkv, out, dout, lse, heads, dqkv,
                                   resolve_attention(ctx, kernel, b, t, heads, c));
}

// ---- fused layer ops

void residual_layernorm_forward(Context& ctx, const Tensor& x, const Tensor& a,
                                const Tensor& weight, const Tensor& bias, float eps, Tensor& s,
                                Tensor& y, Tensor& mean, Tensor& rstd) {
  const char* op = "residual_layernorm_forward";
  check_layernorm_params(ctx, op, x, weight, mean, rstd);
  check_channel_vector(ctx, op, "bias", bias, x.dim(-1));
  check_act(ctx, op, "a", a);
  check_f32(ctx, op, "s", s);
  check_act(ctx, op, "y", y);
  check_same_shape(op, "x", x, "a", a);
  check_same_shape(op, "x", x, "s", s);
  check_same_shape(op, "x", x, "y", y);
  LOCKSTEP_CHECK(eps > 0.0f, op, ": eps ", eps, " must be positive");
  LOCKSTEP_CHECK(!s.shares_storage(x) && !s.shares_storage(a) && !y.shares_storage(s) &&
                     !y.shares_storage(x) && !y.shares_storage(a),
                 op, ": s and y must not share storage with each other or with x and a");
  ctx.backend().residual_layernorm_forward(x, a, weight, bias, eps, s, y, mean, rstd);
}

namespace {

// x [N, in] (f32, or bf16 on a bf16 context), w [out, in], b [out] or undefined; returns N.
std::int64_t check_linear(Context& ctx, const char* op, const Tensor& x, const Tensor& w,
                          const Tensor& b) {
  const DType xt =
      ctx.precision() == Precision::BF16 && x.dtype() == DType::BF16 ? DType::BF16 : DType::F32;
  check_tensor(ctx, op, "x", x, xt);
  check_f32(ctx, op, "w", w);
  check_ndim(op, "x", x, 2);
  check_ndim(op, "w", w, 2);
  LOCKSTEP_CHECK(x.dim(1) == w.dim(1), op, ": x is ", x.describe(), " but w is ", w.describe(),
                 " (need x [N, in] and w [out, in])");
  if (b.defined()) check_channel_vector(ctx, op, "b", b, w.dim(0));
  return x.dim(0);
}

void check_activation(const char* op, Activation act) {
  LOCKSTEP_CHECK(act == Activation::None || act == Activation::GeluTanh, op,
                 ": unknown activation ", static_cast<int>(act));
}

}  // namespace

void linear_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& b, Activation act,
                    Tensor& y, Tensor& pre_act) {
  const char* op = "linear_forward";
  const std::int64_t n = check_linear(ctx, op, x, w, b);
  check_activation(op, act);
  check_act(ctx, op, "y", y);
  check_shape(op, "y", y, {n, w.dim(0)});
  LOCKSTEP_CHECK(!y.shares_storage(x) && !y.shares_storage(w), op,
                 ": y must not share storage with x or w");
  if (act != Activation::None) {
    check_act(ctx, op, "pre_act", pre_act);
    check_same_dtype(op, "y", y, "pre_act", pre_act);
    check_same_shape(op, "y", y, "pre_act", pre_act);
    LOCKSTEP_CHECK(!pre_act.shares_storage(y) && !pre_act.shares_storage(x), op,
                   ": pre_act must not share storage with x or y");
  }
  ctx.backend().linear_forward(x, w, b, act, y, pre_act);
}

void linear_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy,
                     const Tensor& dy16, Tensor& dw, Tensor& db, Tensor& dx,
                     const LinearBackward& p) {
  const char* op = "linear_backward";
  const std::int64_t n = check_linear(ctx, op, x, w, Tensor());
  check_activation(op, p.input_act);
  check_act(ctx, op, "dy", dy);
  check_shape(op, "dy", dy, {n, w.dim(0)});
  if (dy16.defined()) {
    LOCKSTEP_CHECK(dy.dtype() == DType::F32, op,
                   ": dy16 is the bf16 copy of an f32 dy, but dy is already ", dy.describe());
    LOCKSTEP_CHECK(ctx.precision() == Precision::BF16, op,
                   ": dy16 is a bf16 copy of dy, for a bf16 context only; this one computes in ",
                   precision_name(ctx.precision()));
    check_tensor(ctx, op, "dy16", dy16, DType::BF16);
    check_same_shape(op, "dy", dy, "dy16", dy16);
  }
  check_f32(ctx, op, "dw", dw);
  check_same_shape(op, "w", w, "dw", dw);
  if (db.defined()) check_channel_vector(ctx, op, "db", db, w.dim(0));
  if (dx.defined()) {
    check_act(ctx, op, "dx", dx);
    check_shape(op, "dx", dx, {n, w.dim(1)});
    LOCKSTEP_CHECK(!dx.shares_storage(dy) && !dx.shares_storage(w) && !dx.shares_storage(x), op,
                   ": dx must not share storage with x, w or dy");
    if (p.input_act != Activation::None) {
      check_act(ctx, op, "input_pre_act", p.input_pre_act);
      check_same_dtype(op, "dx", dx, "input_pre_act", p.input_pre_act);
      check_same_shape(op, "dx", dx, "input_pre_act", p.input_pre_act);
    }
  }
  LOCKSTEP_CHECK(!dw.shares_storage(dy) && !dw.shares_storage(x), op,
                 ": dw must not share storage with x or dy");
  ctx.backend().linear_backward(x, w, dy, dy16, dw, db, dx, p);
}

void linear_recompute_activation(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& b,
                                 Activation act, Tensor& pre_act, Tensor& y) {
  const char* op = "linear_recompute_activation";
  const std::int64_t n = check_linear(ctx, op, x, w, b);
  check_activation(op, act);
  LOCKSTEP_CHECK(act != Activation::None, op,
                 ": there is no activation to recompute (act = None: y is the GEMM's own output)");
  check_act(ctx, op, "y", y);
  check_shape(op, "y", y, {n, w.dim(0)});
  check_act(ctx, op, "pre_act", pre_act);
  check_same_dtype(op, "y", y, "pre_act", pre_act);
  check_same_shape(op, "y", y, "pre_act", pre_act);
  LOCKSTEP_CHECK(!pre_act.shares_storage(y) && !y.shares_storage(x), op,
                 ": y must not share storage with x or pre_act");
  ctx.backend().linear_recompute_activation(x, w, b, act, pre_act, y);
}

}  // namespace lockstep::ops
