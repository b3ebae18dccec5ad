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
// tokens, bytes), seeded by the row, so a row is reproducible on its own.
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "support/device_test_support.hpp"

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

struct Row {
  std::string name;
  double cuda_bound;  // scaled_error bound on CUDA; 0: exact
  std::function<std::vector<Tensor>()> inputs;
  std::function<void(Io&)> run;
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
  const std::vector<Tensor> want = run_row(row, cpu);
  const std::vector<Tensor> got = run_row(row, dev);
  ASSERT_EQ(got.size(), want.size());
  ASSERT_FALSE(want.empty()) << row.name << " reports no output: it would test nothing";
  for (std::size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << row.name << " output " << i << ": " << want[i].describe());
    if (kind == "emu" || row.cuda_bound == 0 || want[i].dtype() != DType::F32) {
      EXPECT_TRUE(same_bytes(got[i], want[i])) << "not bitwise equal to the CPU's";
    } else {
      EXPECT_LE(scaled_error(got[i], want[i]), row.cuda_bound);
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
