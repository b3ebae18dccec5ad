// Every op of every backend against the CPU backend, from one table (in the manner of ggml's
// test-backend-ops): each row makes its inputs on the host, runs the op on a context, and names
// the tensors it wrote. The test runs each row on the CPU (the reference) and on every device
// kind (the emulated GPU everywhere, CUDA where a GPU answers) from the same inputs, and compares
// every output: bitwise on the emulated device, whose kernels are the CPU's (anything else is an
// ordering or translation bug), and within the row's bound on CUDA (the bounds follow
// test_cuda_ops.cpp: exact for integer results and masks, ~1e-6 for elementwise formulas,
// 1e-5..1e-4 for sums of products in another order).
//
// How to add an op: one row in rows() below — a name, a CUDA bound, and a function that takes the
// context and an Io (in(i) gives the i-th input moved to the context's device; out(t) records an
// output) and calls the op. Inputs come from the shared generators (uniform floats, labels,
// tokens, bytes), seeded by the row, so a row is reproducible on its own. A row whose last field
// is true runs on contexts that compute in bf16 (train.precision = bf16), where the CPU can.
//
// bf16 outputs (ops.hpp, "Activations in bf16") are compared widened: bitwise on the emulated
// device, and on CUDA within the row's bound plus kBf16Step, one bf16 step of the largest element
// (2^-7 of it): f32 results that differ in their last bits round to neighbouring bf16 values.
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "lockstep/core/bf16.hpp"
#include "support/device_test_support.hpp"
#include "support/precision_reference.hpp"

namespace lockstep::testing {
namespace {

// What one run of a row sees: its inputs on the run's device, and the outputs it reports.
class Io {
 public:
  Io(ops::Context& ctx, const std::vector<Tensor>& host_inputs) : ctx_(ctx) {
    for (const Tensor& t : host_inputs)
      inputs_.push_back(t.to(ctx.device()));
  }
  ops::Context& ctx() { return ctx_; }
  Tensor& in(std::size_t i) { return inputs_.at(i); }
  Tensor empty(const Shape& s, DType t = DType::F32) { return Tensor::empty(s, t, ctx_.device()); }
  Tensor zeros(const Shape& s, DType t = DType::F32) {
    Tensor z = empty(s, t);
    ops::fill(ctx_, z, 0.0f);
    return z;
  }
  void out(const Tensor& t) { outputs_.push_back(t.to(Device::cpu())); }
  void out_value(double v) { outputs_.push_back(Tensor::from_vector(std::vector<double>{v}, {1})); }
  const std::vector<Tensor>& outputs() const { return outputs_; }

 private:
  ops::Context& ctx_;
  std::vector<Tensor> inputs_;
  std::vector<Tensor> outputs_;
};

// A bf16 value's neighbour is at most 2^-7 of it away (8 significand bits).
constexpr double kBf16Step = 1.0 / 128.0;

struct Row {
  std::string name;
  double cuda_bound;  // scaled_error bound on CUDA; 0: exact
  std::function<std::vector<Tensor>()> inputs;
  std::function<void(Io&)> run;
  bool bf16 = false;  // run on contexts computing in bf16 (skipped where the CPU cannot)
};

Tensor uniform(const Shape& s, std::uint64_t stream, float lo = -1.0f, float hi = 1.0f) {
  return random_tensor(s, stream, lo, hi);
}
Tensor bytes(const Shape& s, std::uint64_t stream) {
  Tensor t = Tensor::empty(s, DType::U8);
  Philox rng(41, stream);
  for (std::int64_t i = 0; i < t.numel(); ++i)
    t.data<std::uint8_t>()[i] = static_cast<std::uint8_t>(rng.u32(static_cast<std::uint64_t>(i)));
  return t;
}
// Values that probe the formulas' tails: GELU-tanh's derivative overflows expf below -10 unless
// clamped, exp-based ops meet large magnitudes.
Tensor extremes() {
  return Tensor::from_vector(
      std::vector<float>{-1e4f, -100.0f, -20.0f, -10.5f, -10.0f, -5.0f, -1.0f, -1e-3f, 0.0f, 1e-3f,
                         1.0f, 5.0f, 10.0f, 10.5f, 20.0f, 100.0f},
      {16});
}

// Values bf16 holds exactly (uniform ones rounded to nearest even): a bf16 GEMM's rounding of
// its operands is then exact, so the CPU and CUDA differ only in their summation order (and
// formulas), and a bias gradient summed from dy rounded to bf16 (cuBLASLt's BGRADB) is the f32
// dy's sum.
Tensor bf16_exact(const Shape& s, std::uint64_t stream, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = uniform(s, stream, lo, hi);
  auto* bits = static_cast<std::uint32_t*>(t.raw_data());
  for (std::int64_t i = 0; i < t.numel(); ++i)
    bits[i] = (bits[i] + 0x7fffu + ((bits[i] >> 16) & 1u)) & 0xffff0000u;
  return t;
}

// A host tensor's values as f32: bf16 ones widened (exactly), others as they are.
Tensor widened(const Tensor& t) {
  if (t.dtype() != DType::BF16) return t;
  Tensor w = Tensor::empty(t.shape());
  const auto* bits = static_cast<const std::uint16_t*>(t.raw_data());
  for (std::int64_t i = 0; i < t.numel(); ++i)
    w.data<float>()[i] = bf16_to_float(bits[i]);
  return w;
}

// A bf16 copy of a host tensor, made on the run's context (an activation input).
Tensor bf16_of(Io& io, const Tensor& t) {
  Tensor h = io.empty(t.shape(), DType::BF16);
  ops::cast(io.ctx(), t, h);
  return h;
}

bool same_on_host(const Tensor& a, const Tensor& b) {
  Tensor x = a.to(Device::cpu()), y = b.to(Device::cpu());
  return std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

// linear_backward twice from the same inputs (x, w, dy, then two gradient start values each for
// dw and db): first overwriting stale gradients, then accumulating; dx through the GELU of
// input_pre_act when one is given. Reports dw, db, dx of each.
void linear_backward_both_ways(Io& io, const Tensor& x, const Tensor& w, const Tensor& dy,
                               std::size_t first_grad, const Tensor& input_pre_act) {
  Tensor dy16;
  if (io.ctx().precision() == ops::Precision::BF16) {  // as nn::Linear passes it
    dy16 = io.empty(dy.shape(), DType::BF16);
    ops::cast(io.ctx(), dy, dy16);
  }
  for (bool overwrite : {true, false}) {
    const std::size_t k = first_grad + (overwrite ? 0 : 2);
    Tensor dx = io.empty({x.dim(0), x.dim(1)});
    ops::LinearBackward p;
    p.overwrite_dw = p.overwrite_db = overwrite;
    if (input_pre_act.defined()) {
      p.input_act = ops::Activation::GeluTanh;
      p.input_pre_act = input_pre_act;
    }
    ops::linear_backward(io.ctx(), x, w, dy, dy16, io.in(k), io.in(k + 1), dx, p);
    io.out(io.in(k));
    io.out(io.in(k + 1));
    io.out(dx);
  }
}

// The inputs of a linear layer's row: x [rows, in], w [out, in], b [out], dy [rows, out], the
// GELU input of the layer before [rows, in], and two start values each of dw and db.
std::vector<Tensor> linear_inputs(std::int64_t rows, std::int64_t in, std::int64_t out,
                                  std::uint64_t seed) {
  return {bf16_exact({rows, in}, seed),
          bf16_exact({out, in}, seed + 1),
          uniform({out}, seed + 2),
          bf16_exact({rows, out}, seed + 3),
          uniform({rows, in}, seed + 4, -4, 4),
          uniform({out, in}, seed + 5),
          uniform({out}, seed + 6),
          uniform({out, in}, seed + 7),
          uniform({out}, seed + 8)};
}

// Forward (y; with gelu also the GELU's output, its pre_act, and 1 when the GELU recompute gave
// the forward's bits on this device), then the backward both ways, with gelu also through the
// GELU of input 4 (the layer before's pre_act).
void linear_row(Io& io, const Tensor& bias, bool gelu) {
  const Tensor &x = io.in(0), &w = io.in(1), &dy = io.in(3);
  const std::int64_t rows = x.dim(0), out = w.dim(0);
  Tensor y = io.empty({rows, out}), none;
  ops::linear_forward(io.ctx(), x, w, bias, ops::Activation::None, y, none);
  io.out(y);
  linear_backward_both_ways(io, x, w, dy, 5, Tensor());
  if (!gelu) return;
  Tensor g = io.empty({rows, out}), pre = io.empty({rows, out}), again = io.empty({rows, out});
  ops::linear_forward(io.ctx(), x, w, bias, ops::Activation::GeluTanh, g, pre);
  ops::linear_recompute_activation(io.ctx(), x, w, bias, ops::Activation::GeluTanh, pre, again);
  io.out(g);
  io.out(pre);
  io.out_value(same_on_host(again, g) ? 1.0 : 0.0);
  linear_backward_both_ways(io, x, w, dy, 5, io.in(4));
}

// A GPT block's linear layer under bf16: x, dy, y, pre_act and dx bf16 activations (the bias
// bf16-exact, since cuBLASLt reads it in bf16). Forward (y; with gelu the GELU's output, pre_act,
// and 1 when the recompute gave the forward's bits), then the backward both ways.
void linear_row_bf16(Io& io, bool gelu) {
  const Tensor x = bf16_of(io, io.in(0)), dy = bf16_of(io, io.in(3));
  const Tensor &w = io.in(1), &bias = io.in(2);
  const std::int64_t rows = x.dim(0), out = w.dim(0), in = w.dim(1);
  Tensor y = io.empty({rows, out}, DType::BF16), none;
  ops::linear_forward(io.ctx(), x, w, bias, ops::Activation::None, y, none);
  io.out(y);
  Tensor pre_in = gelu ? bf16_of(io, io.in(4)) : Tensor();
  for (bool overwrite : {true, false}) {
    const std::size_t k = 5 + (overwrite ? 0 : 2);
    Tensor dx = io.empty({rows, in}, DType::BF16);
    ops::LinearBackward p;
    p.overwrite_dw = p.overwrite_db = overwrite;
    if (gelu) {
      p.input_act = ops::Activation::GeluTanh;
      p.input_pre_act = pre_in;
    }
    ops::linear_backward(io.ctx(), x, w, dy, Tensor(), io.in(k), io.in(k + 1), dx, p);
    io.out(io.in(k));
    io.out(io.in(k + 1));
    io.out(dx);
  }
  if (!gelu) return;
  Tensor g = io.empty({rows, out}, DType::BF16), pre = io.empty({rows, out}, DType::BF16),
         again = io.empty({rows, out}, DType::BF16);
  ops::linear_forward(io.ctx(), x, w, bias, ops::Activation::GeluTanh, g, pre);
  ops::linear_recompute_activation(io.ctx(), x, w, bias, ops::Activation::GeluTanh, pre, again);
  io.out(g);
  io.out(pre);
  io.out_value(same_on_host(again, g) ? 1.0 : 0.0);
}

std::vector<Tensor> linear_inputs_bf16(std::int64_t rows, std::int64_t in, std::int64_t out,
                                       std::uint64_t seed) {
  std::vector<Tensor> v = linear_inputs(rows, in, out, seed);
  v[2] = bf16_exact({out}, seed + 2);
  return v;
}

const ops::Conv2dParams kConv{1, 1, 1, 1};
const ops::Pool2dParams kPool{};
// Channels-last (NHWC) forms: cuDNN's NHWC tensors with channels-last filters, the NHWC pooling
// kernels; a strided 3x3 as in a ResNet stage's first block.
const ops::Conv2dParams kConvNhwc{2, 2, 1, 1, ops::ImageLayout::NHWC};
const ops::Pool2dParams kPoolNhwc{3, 3, 2, 2, 1, 1, ops::ImageLayout::NHWC};

std::vector<Row> rows() {
  std::vector<Row> r;
  r.push_back({"fill", 0, [] { return std::vector<Tensor>{}; },
               [](Io& io) {
                 Tensor f = io.empty({3, 5}), i = io.empty({7}, DType::I32);
                 ops::fill(io.ctx(), f, 2.5f);
                 ops::fill(io.ctx(), i, -3.0f);
                 io.out(f);
                 io.out(i);
               }});
  r.push_back({"copy_and_views", 0,
               [] {
                 return std::vector<Tensor>{uniform({4, 33}, 1)};
               },
               [](Io& io) {
                 Tensor a = io.empty({4, 33}), row = io.empty({1, 33});
                 ops::copy(io.ctx(), io.in(0), a);
                 ops::copy(io.ctx(), a.slice(2, 3), row);
                 io.out(a);
                 io.out(row);
               }});
  r.push_back({"batch_transpose", 0,
               [] {
                 return std::vector<Tensor>{uniform({3, 37, 70}, 3)};
               },
               [](Io& io) {
                 Tensor t = io.empty({3, 70, 37}), back = io.empty({3, 37, 70});
                 ops::batch_transpose(io.ctx(), io.in(0), t);
                 ops::batch_transpose(io.ctx(), t, back);
                 io.out(t);
                 io.out(back);
               }});
  r.push_back({"cast_bf16_roundtrip", 0, [] { return std::vector<Tensor>{uniform({257}, 2)}; },
               [](Io& io) {
                 Tensor h = io.empty({257}, DType::BF16), back = io.empty({257});
                 ops::cast(io.ctx(), io.in(0), h);
                 ops::cast(io.ctx(), h, back);
                 io.out(back);
               }});
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    r.push_back({std::string("gemm_") + (ta ? "t" : "n") + (tb ? "t" : "n"), 1e-5,
                 [=] {
                   const std::int64_t m = 67, n = 45, k = 129;
                   return std::vector<Tensor>{uniform(ta ? Shape{k, m} : Shape{m, k}, 10 + t),
                                              uniform(tb ? Shape{n, k} : Shape{k, n}, 20 + t),
                                              uniform({m, n}, 30)};
                 },
                 [=](Io& io) {
                   ops::gemm(io.ctx(), ta, tb, 0.7f, io.in(0), io.in(1), 0.3f, io.in(2));
                   io.out(io.in(2));
                 }});
  }
  // The first 129 of a's 150 columns and b's 140 rows: rows read with their own length.
  r.push_back({"gemm_leading", 1e-5,
               [] {
                 return std::vector<Tensor>{uniform({67, 150}, 14), uniform({140, 45}, 24),
                                            uniform({67, 45}, 31)};
               },
               [](Io& io) {
                 ops::gemm_leading(io.ctx(), 129, 0.7f, io.in(0), io.in(1), 0.3f, io.in(2));
                 io.out(io.in(2));
               }});
  r.push_back({"row_bias_and_sum_rows", 1e-6,
               [] {
                 return std::vector<Tensor>{uniform({37, 19}, 3), uniform({19}, 4)};
               },
               [](Io& io) {
                 ops::add_row_bias(io.ctx(), io.in(0), io.in(1));
                 Tensor db = io.zeros({19});
                 ops::sum_rows(io.ctx(), io.in(0), db);
                 io.out(io.in(0));
                 io.out(db);
               }});
  r.push_back({"relu", 0,
               [] {
                 return std::vector<Tensor>{uniform({1000}, 5), uniform({1000}, 6)};
               },
               [](Io& io) {
                 Tensor y = io.empty({1000}), dx = io.empty({1000});
                 ops::relu_forward(io.ctx(), io.in(0), y);
                 ops::relu_backward(io.ctx(), y, io.in(1), dx);
                 io.out(y);
                 io.out(dx);
               }});
  r.push_back({"gelu_erf", 1e-6,
               [] {
                 return std::vector<Tensor>{uniform({1000}, 7, -6, 6), uniform({1000}, 8)};
               },
               [](Io& io) {
                 Tensor y = io.empty({1000}), dx = io.empty({1000});
                 ops::gelu_forward(io.ctx(), io.in(0), y);
                 ops::gelu_backward(io.ctx(), io.in(0), io.in(1), dx);
                 io.out(y);
                 io.out(dx);
               }});
  r.push_back({"gelu_tanh_extremes", 1e-6,
               [] {
                 return std::vector<Tensor>{
                     extremes(), Tensor::from_vector(std::vector<float>(16, 1.0f), {16})};
               },
               [](Io& io) {
                 Tensor y = io.empty({16}), dx = io.empty({16});
                 ops::gelu_tanh_forward(io.ctx(), io.in(0), y);
                 ops::gelu_tanh_backward(io.ctx(), io.in(0), io.in(1), dx);
                 io.out(y);
                 io.out(dx);
               }});
  r.push_back({"add_axpy_scale", 1e-6,
               [] {
                 return std::vector<Tensor>{uniform({513}, 9), uniform({513}, 10)};
               },
               [](Io& io) {
                 Tensor s = io.empty({513});
                 ops::add(io.ctx(), io.in(0), io.in(1), s);
                 ops::axpy(io.ctx(), -0.25f, io.in(0), s);
                 ops::scale(io.ctx(), s, 3.0f);
                 io.out(s);
               }});
  r.push_back({"dropout", 0, [] { return std::vector<Tensor>{uniform({4096}, 11)}; },
               [](Io& io) {
                 Tensor y = io.empty({4096}), mask = io.empty({4096}, DType::U8),
                        dx = io.empty({4096});
                 ops::dropout_forward(io.ctx(), io.in(0), y, mask, 0.3f, 99, 7);
                 ops::dropout_backward(io.ctx(), io.in(0), mask, 0.3f, dx);
                 io.out(y);
                 io.out(mask);
                 io.out(dx);
               }});
  r.push_back(
      {"normalize_u8", 1e-6,
       [] {
         return std::vector<Tensor>{bytes({5, 3, 4, 4}, 12)};
       },
       [](Io& io) {
         Tensor y = io.empty({5, 3, 4, 4});
         ops::normalize_input(io.ctx(), io.in(0), {0.5f, 0.4f, 0.45f}, {0.25f, 0.2f, 0.3f}, y);
         io.out(y);
       }});
  r.push_back({"conv2d", 1e-4,
               [] {
                 return std::vector<Tensor>{uniform({2, 3, 9, 9}, 13), uniform({4, 3, 3, 3}, 14),
                                            uniform({4}, 15), uniform({2, 4, 9, 9}, 16)};
               },
               [](Io& io) {
                 Tensor y = io.empty({2, 4, 9, 9}), dx = io.empty({2, 3, 9, 9}),
                        dw = io.zeros({4, 3, 3, 3}), db = io.zeros({4});
                 ops::conv2d_forward(io.ctx(), io.in(0), io.in(1), io.in(2), y, kConv);
                 ops::conv2d_backward_data(io.ctx(), io.in(3), io.in(1), dx, kConv);
                 ops::conv2d_backward_weights(io.ctx(), io.in(0), io.in(3), dw, db, kConv);
                 io.out(y);
                 io.out(dx);
                 io.out(dw);
                 io.out(db);
               }});
  r.push_back({"conv2d_nhwc", 1e-4,
               [] {
                 return std::vector<Tensor>{uniform({2, 24, 9, 9}, 50), uniform({16, 24, 3, 3}, 51),
                                            uniform({16}, 52), uniform({2, 16, 5, 5}, 53)};
               },
               [](Io& io) {
                 Tensor y = io.empty({2, 16, 5, 5}), dx = io.empty({2, 24, 9, 9}),
                        dw = io.zeros({16, 24, 3, 3}), db = io.zeros({16});
                 ops::conv2d_forward(io.ctx(), io.in(0), io.in(1), io.in(2), y, kConvNhwc);
                 ops::conv2d_backward_data(io.ctx(), io.in(3), io.in(1), dx, kConvNhwc);
                 ops::conv2d_backward_weights(io.ctx(), io.in(0), io.in(3), dw, db, kConvNhwc);
                 ops::conv2d_backward_weights(io.ctx(), io.in(0), io.in(3), dw, db, kConvNhwc);
                 io.out(y);
                 io.out(dx);
                 io.out(dw);  // twice the gradient: the transposed one accumulates
                 io.out(db);
               }});
  for (ops::PoolKind kind : {ops::PoolKind::Max, ops::PoolKind::Avg}) {
    r.push_back({kind == ops::PoolKind::Max ? "maxpool_nhwc" : "avgpool_nhwc", 1e-6,
                 [] {
                   return std::vector<Tensor>{uniform({2, 5, 9, 9}, 54), uniform({2, 5, 5, 5}, 55)};
                 },
                 [kind](Io& io) {
                   Tensor y = io.empty({2, 5, 5, 5}), dx = io.empty({2, 5, 9, 9}), ws;
                   ops::pool2d_forward(io.ctx(), kind, io.in(0), y, ws, kPoolNhwc);
                   ops::pool2d_backward(io.ctx(), kind, io.in(1), ws, dx, kPoolNhwc);
                   io.out(y);
                   io.out(dx);
                   if (ws.defined()) io.out(ws);
                 }});
  }
  for (ops::PoolKind kind : {ops::PoolKind::Max, ops::PoolKind::Avg}) {
    r.push_back({kind == ops::PoolKind::Max ? "maxpool" : "avgpool", 1e-6,
                 [] {
                   return std::vector<Tensor>{uniform({2, 3, 8, 8}, 17), uniform({2, 3, 4, 4}, 18)};
                 },
                 [kind](Io& io) {
                   Tensor y = io.empty({2, 3, 4, 4}), dx = io.empty({2, 3, 8, 8}), ws;
                   ops::pool2d_forward(io.ctx(), kind, io.in(0), y, ws, kPool);
                   ops::pool2d_backward(io.ctx(), kind, io.in(1), ws, dx, kPool);
                   io.out(y);
                   io.out(dx);
                 }});
  }
  r.push_back({"batchnorm", 1e-5,
               [] {
                 return std::vector<Tensor>{uniform({6, 4, 5, 5}, 19), uniform({4}, 20, 0.5f, 1.5f),
                                            uniform({4}, 21), uniform({6, 4, 5, 5}, 22)};
               },
               [](Io& io) {
                 Tensor y = io.empty({6, 4, 5, 5}), mean = io.empty({4}), invstd = io.empty({4}),
                        rm = io.zeros({4}), rv = io.empty({4}), ye = io.empty({6, 4, 5, 5}),
                        dx = io.empty({6, 4, 5, 5}), dg = io.zeros({4}), dbeta = io.zeros({4});
                 ops::fill(io.ctx(), rv, 1.0f);
                 ops::batchnorm_forward_train(io.ctx(), io.in(0), io.in(1), io.in(2), y, mean,
                                              invstd, rm, rv, 0.1f, 1e-5f);
                 ops::batchnorm_forward_eval(io.ctx(), io.in(0), io.in(1), io.in(2), rm, rv, 1e-5f,
                                             ye);
                 ops::batchnorm_backward(io.ctx(), io.in(0), io.in(3), io.in(1), mean, invstd, dx,
                                         dg, dbeta);
                 for (const Tensor& t : {y, mean, invstd, rm, rv, ye, dx, dg, dbeta})
                   io.out(t);
               }});
  // A channels-last BatchNorm2d hands the ops its [N*H*W, C] rows: many rows, few channels (on
  // CUDA: three chunks of the rows kernels' 1024 rows, a partial block of 32 channels).
  r.push_back({"batchnorm_rows", 1e-5,
               [] {
                 return std::vector<Tensor>{uniform({2500, 40}, 56), uniform({40}, 57, 0.5f, 1.5f),
                                            uniform({40}, 58), uniform({2500, 40}, 59)};
               },
               [](Io& io) {
                 Tensor y = io.empty({2500, 40}), mean = io.empty({40}), invstd = io.empty({40}),
                        rm = io.zeros({40}), rv = io.empty({40}), dx = io.empty({2500, 40}),
                        dg = io.zeros({40}), dbeta = io.zeros({40});
                 ops::fill(io.ctx(), rv, 1.0f);
                 ops::batchnorm_forward_train(io.ctx(), io.in(0), io.in(1), io.in(2), y, mean,
                                              invstd, rm, rv, 0.1f, 1e-5f);
                 ops::batchnorm_backward(io.ctx(), io.in(0), io.in(3), io.in(1), mean, invstd, dx,
                                         dg, dbeta);
                 for (const Tensor& t : {y, mean, invstd, rm, rv, dx, dg, dbeta})
                   io.out(t);
               }});
  // The fused BatchNorm epilogues of a ResNet block (BN -> ReLU; BN -> + shortcut -> ReLU) over
  // channels-last rows, with the ReLU's backward folded into the BatchNorm's; under bf16 the
  // outputs and the input gradient a convolution reads are bf16.
  for (bool bf16 : {false, true}) {
    r.push_back({bf16 ? "batchnorm_act_rows_bf16" : "batchnorm_act_rows", 1e-5,
                 [] {
                   return std::vector<Tensor>{uniform({2500, 40}, 60, -2, 3),
                                              uniform({40}, 61, 0.5f, 1.5f), uniform({40}, 62),
                                              uniform({2500, 40}, 63), uniform({2500, 40}, 64)};
                 },
                 [bf16](Io& io) {
                   const DType act = bf16 ? DType::BF16 : DType::F32;
                   const Shape rows{2500, 40};
                   Tensor y = io.empty(rows, act), ys = io.empty(rows), ye = io.empty(rows, act),
                          mean = io.empty({40}), invstd = io.empty({40}), rm = io.zeros({40}),
                          rv = io.empty({40}), dx = io.empty(rows, act), dg = io.zeros({40}),
                          dbeta = io.zeros({40});
                   ops::fill(io.ctx(), rv, 1.0f);
                   ops::batchnorm_act_forward_train(io.ctx(), io.in(0), io.in(1), io.in(2),
                                                    {io.in(3), true}, ys, mean, invstd, rm, rv,
                                                    0.1f, 1e-5f);
                   ops::batchnorm_act_forward_train(io.ctx(), io.in(0), io.in(1), io.in(2),
                                                    {Tensor(), true}, y, mean, invstd, rm, rv, 0.1f,
                                                    1e-5f);
                   ops::batchnorm_act_forward_eval(io.ctx(), io.in(0), io.in(1), io.in(2), rm, rv,
                                                   1e-5f, {Tensor(), true}, ye);
                   ops::batchnorm_relu_backward(io.ctx(), io.in(0), y, io.in(4), io.in(1), mean,
                                                invstd, dx, dg, dbeta);
                   for (const Tensor& t : {y, ys, ye, mean, invstd, rm, rv, dx, dg, dbeta})
                     io.out(t);
                 },
                 bf16});
  }
  // A convolution's bf16 output read by the BatchNorm ops as their x (the CPU writes and reads it
  // in its kernels; a device that does not widens it around f32 kernels: the same values).
  r.push_back({"conv_bn_bf16_activations", 1e-3,
               [] {
                 return std::vector<Tensor>{uniform({2, 24, 9, 9}, 65), uniform({16, 24, 3, 3}, 66),
                                            uniform({16}, 67, 0.5f, 1.5f), uniform({16}, 68),
                                            uniform({50, 16}, 69)};
               },
               [](Io& io) {
                 const Shape rows{50, 16};
                 Tensor y = io.empty({2, 16, 5, 5}, DType::BF16), a = io.empty(rows, DType::BF16),
                        b = io.empty(rows), e = io.empty(rows), mean = io.empty({16}),
                        invstd = io.empty({16}), rm = io.zeros({16}), rv = io.empty({16}),
                        dx = io.empty(rows, DType::BF16), dx2 = io.empty(rows), dg = io.zeros({16}),
                        dbeta = io.zeros({16});
                 ops::fill(io.ctx(), rv, 1.0f);
                 ops::conv2d_forward(io.ctx(), io.in(0), io.in(1), Tensor(), y, kConvNhwc);
                 const Tensor x = y.view(rows);  // channels-last [N*H*W, C]
                 ops::batchnorm_act_forward_train(io.ctx(), x, io.in(2), io.in(3), {Tensor(), true},
                                                  a, mean, invstd, rm, rv, 0.1f, 1e-5f);
                 ops::batchnorm_relu_backward(io.ctx(), x, a, io.in(4), io.in(2), mean, invstd, dx,
                                              dg, dbeta);
                 ops::batchnorm_forward_train(io.ctx(), x, io.in(2), io.in(3), b, mean, invstd, rm,
                                              rv, 0.1f, 1e-5f);
                 ops::batchnorm_backward(io.ctx(), x, io.in(4), io.in(2), mean, invstd, dx2, dg,
                                         dbeta);
                 ops::batchnorm_forward_eval(io.ctx(), x, io.in(2), io.in(3), rm, rv, 1e-5f, e);
                 for (const Tensor& t : {y, a, b, e, mean, invstd, rm, rv, dx, dx2, dg, dbeta})
                   io.out(t);
               },
               true});
  // A residual stream kept in bf16: a block's output written bf16 with a bf16 residual (the block
  // before's output), then the identity shortcut's gradient through that bf16 output.
  r.push_back({"bf16_residual_stream", 1e-3,
               [] {
                 return std::vector<Tensor>{uniform({50, 16}, 73),         uniform({50, 16}, 74),
                                            uniform({16}, 75, 0.5f, 1.5f), uniform({16}, 76),
                                            uniform({50, 16}, 77),         uniform({50, 16}, 78)};
               },
               [](Io& io) {
                 const Shape rows{50, 16};
                 Tensor r = io.empty(rows, DType::BF16), y = io.empty(rows, DType::BF16),
                        ye = io.empty(rows, DType::BF16), mean = io.empty({16}),
                        invstd = io.empty({16}), rm = io.zeros({16}), rv = io.empty({16}),
                        dx = io.empty(rows);
                 ops::fill(io.ctx(), rv, 1.0f);
                 ops::cast(io.ctx(), io.in(1), r);
                 ops::batchnorm_act_forward_train(io.ctx(), io.in(0), io.in(2), io.in(3), {r, true},
                                                  y, mean, invstd, rm, rv, 0.1f, 1e-5f);
                 ops::batchnorm_act_forward_eval(io.ctx(), io.in(0), io.in(2), io.in(3), rm, rv,
                                                 1e-5f, {r, true}, ye);
                 ops::relu_backward_add(io.ctx(), y, io.in(4), io.in(5), dx);
                 for (const Tensor& t : {y, ye, mean, invstd, rm, rv, dx})
                   io.out(t);
               },
               true});
  r.push_back({"relu_backward_add", 1e-6,
               [] {
                 return std::vector<Tensor>{uniform({70, 33}, 70, -1, 1), uniform({70, 33}, 71),
                                            uniform({70, 33}, 72)};
               },
               [](Io& io) {
                 Tensor dx = io.empty({70, 33});
                 ops::relu_backward_add(io.ctx(), io.in(0), io.in(1), io.in(2), dx);
                 io.out(dx);
               }});
  r.push_back(
      {"softmax_xent_and_accuracy", 1e-6,
       [] {
         return std::vector<Tensor>{uniform({33, 10}, 23, -4, 4), random_labels(33, 10, 24)};
       },
       [](Io& io) {
         Tensor probs = io.empty({33, 10}), loss = io.empty({1}), dlogits = io.empty({33, 10});
         ops::softmax_xent_forward(io.ctx(), io.in(0), io.in(1), probs, loss);
         ops::softmax_xent_backward(io.ctx(), probs, io.in(1), 1.0f / 33, dlogits);
         io.out(probs);
         io.out(loss);
         io.out(dlogits);
         io.out_value(static_cast<double>(ops::count_correct(io.ctx(), io.in(0), io.in(1))));
       }});
  r.push_back(
      {"softmax_xent_label_smoothing", 1e-6,
       [] {
         return std::vector<Tensor>{uniform({33, 10}, 26, -4, 4), random_labels(33, 10, 27)};
       },
       [](Io& io) {
         Tensor probs = io.empty({33, 10}), loss = io.empty({1});
         Tensor dlogits = io.empty({33, 10});
         ops::softmax_xent_forward(io.ctx(), io.in(0), io.in(1), probs, loss, 0.1f);
         ops::softmax_xent_backward(io.ctx(), probs, io.in(1), 1.0f / 33, dlogits, 0.1f);
         io.out(probs);
         io.out(loss);
         io.out(dlogits);
       }});
  // The fused loss over a chunk: rows 7..39 of a batch of 50, 10 classes padded to 16 columns
  // (whose values must not matter), with and without label smoothing; then the batch's mean.
  for (float smoothing : {0.0f, 0.1f}) {
    r.push_back(
        {smoothing > 0 ? "softmax_xent_chunk_smoothing" : "softmax_xent_chunk", 1e-6,
         [] {
           return std::vector<Tensor>{uniform({33, 16}, 28, -4, 4), random_labels(50, 10, 29)};
         },
         [smoothing](Io& io) {
           Tensor row_loss =
               Tensor::from_vector(std::vector<double>(50, 0.0), {50}).to(io.ctx().device());
           Tensor loss = io.empty({1});
           ops::softmax_xent_chunk(io.ctx(), io.in(0), io.in(1), 7, 10, 1.0f / 50, row_loss,
                                   smoothing);
           ops::mean_row_loss(io.ctx(), row_loss, loss);
           io.out(io.in(0));  // dlogits, zero in the padded columns
           // f64 outputs compare bitwise; the CUDA kernel's row loss is f32 arithmetic, so
           // compare it rounded to f32 within the bound.
           std::vector<float> rows;
           for (double v : row_loss.to(Device::cpu()).to_vector<double>())
             rows.push_back(static_cast<float>(v));
           io.out(Tensor::from_vector(rows, {50}));
           io.out(loss);
         }});
  }
  r.push_back({"reductions", 1e-6, [] { return std::vector<Tensor>{uniform({100003}, 25)}; },
               [](Io& io) {
                 io.out_value(ops::sum_squares(io.ctx(), io.in(0)));
                 io.out_value(ops::all_finite(io.ctx(), io.in(0)) ? 1.0 : 0.0);
                 Tensor head = io.in(0).slice(0, 8);
                 ops::scale(io.ctx(), head, INFINITY);  // nonzero values: +-inf
                 io.out_value(ops::all_finite(io.ctx(), io.in(0)) ? 1.0 : 0.0);
               }});
  r.push_back(
      {"sgd_and_adamw", 1e-6,
       [] {
         return std::vector<Tensor>{uniform({300}, 26), uniform({300}, 27), uniform({300}, 28)};
       },
       [](Io& io) {
         Tensor buf = io.zeros({300}), m = io.zeros({300}), v = io.zeros({300});
         ops::SgdParams sp;
         sp.lr = 0.1f;
         sp.momentum = 0.9f;
         sp.weight_decay = 1e-3f;
         sp.first_step = true;
         ops::sgd_update(io.ctx(), io.in(0), io.in(1), buf, sp);
         ops::AdamWParams ap;
         ops::adamw_update(io.ctx(), io.in(2), io.in(1), m, v, ap);
         for (const Tensor& t : {io.in(0), buf, io.in(2), m, v})
           io.out(t);
       }});
  r.push_back(
      {"flat_updates_and_sums", 1e-6,
       [] {
         return std::vector<Tensor>{uniform({512}, 29), uniform({512}, 30), uniform({512}, 31)};
       },
       [](Io& io) {
         std::vector<ops::FlatSegment> segs = {
             {0, 100, 0, true}, {128, 300, 1, false}, {448, 64, 2, true}};
         auto plan = ops::make_flat_plan(io.ctx(), segs, 512);
         Tensor buf = io.zeros({512}), m = io.zeros({512}), v = io.zeros({512});
         ops::SgdParams sp;
         sp.lr = 0.05f;
         sp.momentum = 0.9f;
         sp.weight_decay = 0.01f;
         sp.first_step = true;
         ops::flat_sgd_update(io.ctx(), *plan, {0, 512}, io.in(0), io.in(1), buf, 0, sp);
         ops::flat_adamw_update(io.ctx(), *plan, {0, 512}, io.in(2), io.in(1), m, v, 0, {});
         Tensor sums = io.empty({4}, DType::F64);
         ops::flat_sum_squares(io.ctx(), *plan, {0, 512}, io.in(1), sums);
         for (const Tensor& t : {io.in(0), buf, io.in(2), m, v})
           io.out(t);
         io.out(sums);
       }});
  r.push_back({"step_verdict", 1e-6,
               [] {
                 return std::vector<Tensor>{uniform({512}, 36), uniform({512}, 37),
                                            Tensor::from_vector<double>({2.0, 1.0}, {2}),
                                            Tensor::from_vector<double>({1.5}, {1})};
               },
               [](Io& io) {
                 // The verdict's sum (0 + 2 + 1.5: a norm above max_norm, so the clip acts), closed
                 // with one skip taken, the clip, an update it lets through as a first step (step
                 // 2, 1 skipped), then a non-finite verdict the next updates must ignore.
                 Tensor& verdict = io.in(2);
                 ops::verdict_add(io.ctx(), io.in(2).sub(0, {1}), verdict, /*first=*/true);
                 ops::verdict_add(io.ctx(), io.in(3), verdict, /*first=*/false);
                 ops::verdict_close(io.ctx(), verdict, /*taken=*/0);
                 ops::clip_by_verdict(io.ctx(), io.in(1), verdict, 1.0);
                 std::vector<ops::FlatSegment> segs = {{0, 300, 0, true}, {320, 192, 1, false}};
                 auto plan = ops::make_flat_plan(io.ctx(), segs, 512);
                 Tensor buf = io.zeros({512}), m = io.zeros({512}), v = io.zeros({512});
                 Tensor w = io.in(0).clone();
                 ops::SgdParams sp;
                 sp.lr = 0.05f;
                 sp.momentum = 0.9f;
                 sp.verdict = verdict;
                 sp.step = 2;
                 ops::flat_sgd_update(io.ctx(), *plan, {0, 512}, io.in(0), io.in(1), buf, 0, sp);
                 ops::AdamWParams ap;
                 ap.step = 5;
                 ap.verdict = verdict;
                 ops::flat_adamw_update(io.ctx(), *plan, {0, 512}, w, io.in(1), m, v, 0, ap);
                 io.out(verdict);
                 for (const Tensor& t : {io.in(1), io.in(0), buf, w, m, v})
                   io.out(t);
                 Tensor bad = Tensor::from_vector<double>({NAN, 0.0}, {2}).to(io.ctx().device());
                 ops::verdict_close(io.ctx(), bad, 0);
                 sp.verdict = bad;
                 ops::flat_sgd_update(io.ctx(), *plan, {0, 512}, io.in(0), io.in(1), buf, 0, sp);
                 io.out(bad);
                 io.out(io.in(0));
               }});
  r.push_back(
      {"embedding", 1e-6,
       [] {
         Philox rng(3, 32);
         std::vector<std::int32_t> tok(2 * 8);
         for (std::size_t i = 0; i < tok.size(); ++i)
           tok[i] = static_cast<std::int32_t>(rng.u32(i) % 50);
         return std::vector<Tensor>{Tensor::from_vector(tok, {2, 8}), uniform({50, 16}, 33),
                                    uniform({8, 16}, 34), uniform({2, 8, 16}, 35)};
       },
       [](Io& io) {
         Tensor y = io.empty({2, 8, 16}), dwte = io.zeros({50, 16}), dwpe = io.zeros({8, 16});
         ops::embedding_forward(io.ctx(), io.in(0), io.in(1), io.in(2), y);
         ops::embedding_backward(io.ctx(), io.in(0), io.in(3), dwte, dwpe);
         io.out(y);
         io.out(dwte);
         io.out(dwpe);
       }});
  r.push_back({"layernorm", 1e-5,
               [] {
                 return std::vector<Tensor>{uniform({12, 48}, 36, -3, 3), uniform({48}, 37),
                                            uniform({48}, 38), uniform({12, 48}, 39),
                                            uniform({12, 48}, 40)};
               },
               [](Io& io) {
                 Tensor y = io.empty({12, 48}), mean = io.empty({12}), rstd = io.empty({12}),
                        dx = io.empty({12, 48}), dw = io.zeros({48}), db = io.zeros({48});
                 ops::layernorm_forward(io.ctx(), io.in(0), io.in(1), io.in(2), 1e-5f, y, mean,
                                        rstd);
                 ops::layernorm_backward(io.ctx(), io.in(0), io.in(3), io.in(1), mean, rstd,
                                         io.in(4), dx, dw, db);
                 for (const Tensor& t : {y, mean, rstd, dx, dw, db})
                   io.out(t);
               }});
  r.push_back({"residual_layernorm", 1e-5,
               [] {
                 return std::vector<Tensor>{uniform({3, 11, 48}, 43, -3, 3),
                                            uniform({3, 11, 48}, 44), uniform({48}, 45, 0.5f, 1.5f),
                                            uniform({48}, 46)};
               },
               [](Io& io) {
                 Tensor s = io.empty({3, 11, 48}), y = io.empty({3, 11, 48}), mean = io.empty({33}),
                        rstd = io.empty({33});
                 ops::residual_layernorm_forward(io.ctx(), io.in(0), io.in(1), io.in(2), io.in(3),
                                                 1e-5f, s, y, mean, rstd);
                 for (const Tensor& t : {s, y, mean, rstd})
                   io.out(t);
               }});
  // The fused linear ops. fp32: the compositions on every backend. bf16: cuBLASLt's epilogues on
  // CUDA (BIAS and BGRADB at the GEMMs' bound, the inputs being bf16-exact; GELU_AUX_BIAS and
  // DGELU within 2e-3, below bf16's own rounding of 2^-8, which the GELU's output and input
  // gradient meet before any GEMM reads them: cuBLASLt's GELU is its own formula), then the same
  // with a 4-byte-aligned bias and widths that are not multiples of 8, which cuBLASLt's rules
  // send to the composition.
  r.push_back({"linear_fp32", 1e-5, [] { return linear_inputs(37, 45, 29, 50); },
               [](Io& io) { linear_row(io, io.in(2), true); }});
  r.push_back({"linear_bf16_bias_epilogues", 1e-5, [] { return linear_inputs(64, 96, 128, 60); },
               [](Io& io) { linear_row(io, io.in(2), false); }, true});
  r.push_back({"linear_bf16_gelu_epilogues", 2e-3, [] { return linear_inputs(64, 96, 128, 60); },
               [](Io& io) { linear_row(io, io.in(2), true); }, true});
  r.push_back({"linear_bf16_unaligned", 2e-3,
               [] {
                 std::vector<Tensor> in = linear_inputs(37, 13, 21, 70);
                 in.push_back(uniform({22}, 79));
                 return in;
               },
               [](Io& io) { linear_row(io, io.in(9).sub(1, {21}), true); }, true});
  // bf16 activations (the layers of a GPT block under bf16). CUDA's bounds: the f32 rows' own,
  // plus kBf16Step on bf16 outputs; the GELU epilogues add 2^-8 more, one rounding that cuBLASLt
  // skips (its GELU reads the unrounded product, DGELU rounds dx once where the composition rounds
  // the product first); cuDNN's attention is held to test_cuda_attention_cudnn.cpp's 8 u_b of the
  // largest gradient (its probabilities and dS are rounded to bf16 for the tensor cores).
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    r.push_back({std::string("gemm_bf16_output_") + (ta ? "t" : "n") + (tb ? "t" : "n"), 1e-5,
                 [=] {
                   const std::int64_t m = 67, n = 48, k = 129;
                   return std::vector<Tensor>{bf16_exact(ta ? Shape{k, m} : Shape{m, k}, 80 + t),
                                              bf16_exact(tb ? Shape{n, k} : Shape{k, n}, 84 + t)};
                 },
                 [=](Io& io) {
                   Tensor c = io.empty({67, 48}, DType::BF16);
                   ops::gemm(io.ctx(), ta, tb, 0.7f, io.in(0), bf16_of(io, io.in(1)), 0.0f, c);
                   io.out(c);
                 },
                 true});
  }
  r.push_back({"bf16_branch_add_and_bias_sum", 1e-6,
               [] {
                 return std::vector<Tensor>{uniform({37, 300}, 88), uniform({37, 300}, 89)};
               },
               [](Io& io) {
                 Tensor out = io.empty({37, 300}), db = io.zeros({300});
                 const Tensor b = bf16_of(io, io.in(1));
                 ops::add(io.ctx(), io.in(0), b, out);
                 ops::sum_rows(io.ctx(), b, db);
                 io.out(out);
                 io.out(db);
               },
               true});
  r.push_back(
      {"gelu_tanh_bf16", 1e-6,
       [] {
         return std::vector<Tensor>{uniform({1000}, 90, -6, 6), uniform({1000}, 91), extremes()};
       },
       [](Io& io) {
         for (std::size_t i : {std::size_t{0}, std::size_t{2}}) {
           const Tensor x = bf16_of(io, io.in(i));
           const Tensor dy = i == 0 ? bf16_of(io, io.in(1)) : bf16_of(io, io.in(2));
           Tensor y = io.empty(x.shape(), DType::BF16), dx = io.empty(x.shape(), DType::BF16);
           ops::gelu_tanh_forward(io.ctx(), x, y);
           ops::gelu_tanh_backward(io.ctx(), x, dy, dx);
           io.out(y);
           io.out(dx);
         }
       },
       true});
  r.push_back(
      {"layernorm_bf16", 1e-5,
       [] {
         return std::vector<Tensor>{uniform({3, 11, 48}, 92, -3, 3), uniform({3, 11, 48}, 93),
                                    uniform({48}, 94, 0.5f, 1.5f),   uniform({48}, 95),
                                    uniform({3, 11, 48}, 96),        uniform({3, 11, 48}, 97)};
       },
       [](Io& io) {
         const Shape sh{3, 11, 48};
         Tensor y = io.empty(sh, DType::BF16), mean = io.empty({33}), rstd = io.empty({33});
         ops::layernorm_forward(io.ctx(), io.in(0), io.in(2), io.in(3), 1e-5f, y, mean, rstd);
         for (const Tensor& t : {y, mean, rstd})
           io.out(t);
         Tensor s = io.empty(sh), y2 = io.empty(sh, DType::BF16);
         ops::residual_layernorm_forward(io.ctx(), io.in(0), bf16_of(io, io.in(1)), io.in(2),
                                         io.in(3), 1e-5f, s, y2, mean, rstd);
         for (const Tensor& t : {s, y2, mean, rstd})
           io.out(t);
         Tensor dx = io.empty(sh), dw = io.zeros({48}), db = io.zeros({48});
         ops::layernorm_backward(io.ctx(), s, bf16_of(io, io.in(4)), io.in(2), mean, rstd, io.in(5),
                                 dx, dw, db);
         for (const Tensor& t : {dx, dw, db})
           io.out(t);
       },
       true});
  r.push_back({"linear_bf16_activations_bias", 1e-5,
               [] { return linear_inputs_bf16(64, 96, 128, 100); },
               [](Io& io) { linear_row_bf16(io, false); }, true});
  r.push_back({"linear_bf16_activations_gelu", 2e-3 + 1.0 / 256,
               [] { return linear_inputs_bf16(64, 96, 128, 100); },
               [](Io& io) { linear_row_bf16(io, true); }, true});
  for (ops::AttentionKernel kernel :
       {ops::AttentionKernel::Reference, ops::AttentionKernel::Auto}) {
    const bool reference = kernel == ops::AttentionKernel::Reference;
    r.push_back(
        {reference ? "attention_bf16_reference" : "attention_bf16_auto",
         reference ? 1e-4 : 8.0 / 256,
         [] {
           return std::vector<Tensor>{uniform({2, 64, 3 * 128}, 110), uniform({2, 64, 128}, 111)};
         },
         [kernel](Io& io) {
           const Tensor qkv = bf16_of(io, io.in(0)), dout = bf16_of(io, io.in(1));
           Tensor out = io.empty({2, 64, 128}, DType::BF16), lse = io.empty({2, 2, 64}),
                  dqkv = io.empty({2, 64, 3 * 128}, DType::BF16);
           ops::attention_forward(io.ctx(), qkv, 2, out, lse, kernel);
           ops::attention_backward(io.ctx(), qkv, out, dout, lse, 2, dqkv, kernel);
           io.out(out);
           io.out(lse);
           io.out(dqkv);
         },
         true});
  }
  r.push_back({"attention", 1e-4,
               [] {
                 return std::vector<Tensor>{uniform({2, 16, 3 * 32}, 41), uniform({2, 16, 32}, 42)};
               },
               [](Io& io) {
                 Tensor out = io.empty({2, 16, 32}), lse = io.empty({2, 2, 16}),
                        dqkv = io.empty({2, 16, 3 * 32});
                 ops::attention_forward(io.ctx(), io.in(0), 2, out, lse);
                 ops::attention_backward(io.ctx(), io.in(0), out, io.in(1), lse, 2, dqkv);
                 io.out(out);
                 io.out(lse);
                 io.out(dqkv);
               }});
  return r;
}

const std::vector<Row>& table() {
  static const std::vector<Row> t = rows();
  return t;
}

std::vector<Tensor> run_row(const Row& row, ops::Context& ctx) {
  Io io(ctx, row.inputs());
  row.run(io);
  return io.outputs();
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

class BackendOps : public ::testing::TestWithParam<std::tuple<std::string, std::size_t>> {};

TEST_P(BackendOps, MatchTheCpuBackend) {
  const auto& [kind, index] = GetParam();
  const std::string why = device_skip_reason(kind);
  if (!why.empty()) GTEST_SKIP() << why;
  const Row& row = table().at(index);
  ops::Context cpu;
  ops::Context dev(kind == "cuda" ? Device::cuda(0) : Device::emu(0));
  if (row.bf16) {
    LOCKSTEP_SKIP_WITHOUT_BF16();  // the CPU reference (and the emulated GPU's kernels)
    cpu.set_precision(ops::Precision::BF16);
    dev.set_precision(ops::Precision::BF16);
  }
  const std::vector<Tensor> want = run_row(row, cpu);
  const std::vector<Tensor> got = run_row(row, dev);
  ASSERT_EQ(got.size(), want.size());
  ASSERT_FALSE(want.empty()) << row.name << " reports no output: it would test nothing";
  for (std::size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << row.name << " output " << i << ": " << want[i].describe());
    const bool bf16 = want[i].dtype() == DType::BF16;
    if (kind == "emu" || row.cuda_bound == 0 || (want[i].dtype() != DType::F32 && !bf16)) {
      EXPECT_TRUE(same_bytes(got[i], want[i])) << "not bitwise equal to the CPU's";
    } else {
      ASSERT_EQ(got[i].dtype(), want[i].dtype());
      EXPECT_LE(scaled_error(widened(got[i]), widened(want[i])),
                row.cuda_bound + (bf16 ? kBf16Step : 0.0));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Table, BackendOps,
    ::testing::Combine(::testing::Values("emu", "cuda"),
                       ::testing::Range<std::size_t>(0, table().size())),
    [](const ::testing::TestParamInfo<std::tuple<std::string, std::size_t>>& i) {
      const std::size_t index = std::get<1>(i.param);
      return std::get<0>(i.param) + "_" + table().at(index).name;
    });

}  // namespace
}  // namespace lockstep::testing
