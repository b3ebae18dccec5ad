// Every CUDA op against the CPU backend on fresh random inputs. Bounds are on scaled_error (the
// largest difference over the largest reference value) and follow from how the two backends
// differ:
//  - pure elementwise ops with the same formula: exact, or 1e-6 where a library function
//    (erff, expf, sqrtf) or an FMA contraction may differ by an ulp or two;
//  - sums of K products in a different order (GEMM, convolution, batch norm statistics): random
//    rounding grows like sqrt(K) * 6e-8, ~1e-6 for K of a few hundred; cuDNN's FFT and Winograd
//    algorithms round in a transformed domain, ~1e-5. Bounds sit 10x above that and 1e4x below
//    what any indexing bug gives (O(1));
//  - integer results and masks: exact.
#include <cstring>

#include "lockstep/core/error.hpp"
#include "support/cuda_test_support.hpp"

namespace lockstep::testing {
namespace {

const Device kGpu = Device::cuda(0);

Tensor gpu_empty(const Shape& s, DType t = DType::F32) {
  return Tensor::empty(s, t, kGpu);
}

using Ops = CudaVsCpu;

TEST_F(Ops, FillAndCopyBetweenDevicesAreExact) {
  Tensor f = gpu_empty({3, 5});
  ops::fill(gpu(), f, 2.5f);
  EXPECT_EQ(host(f).to_vector<float>(), std::vector<float>(15, 2.5f));
  Tensor i = gpu_empty({7}, DType::I32);
  ops::fill(gpu(), i, -3.0f);
  EXPECT_EQ(host(i).to_vector<std::int32_t>(), std::vector<std::int32_t>(7, -3));

  Tensor src = random_tensor({4, 33}, 1);
  Tensor on_gpu = gpu_empty({4, 33}), on_gpu2 = gpu_empty({4, 33}), back = Tensor::empty({4, 33});
  ops::copy(gpu(), src, on_gpu);      // host -> device
  ops::copy(gpu(), on_gpu, on_gpu2);  // device -> device
  ops::copy(gpu(), on_gpu2, back);    // device -> host, waits for the stream
  EXPECT_EQ(back.to_vector<float>(), src.to_vector<float>());
  // A view with an offset copies the right elements.
  Tensor row = on_gpu.slice(2, 3), row_back = Tensor::empty({1, 33});
  ops::copy(gpu(), row, row_back);
  EXPECT_EQ(row_back.to_vector<float>(), src.slice(2, 3).to_vector<float>());
}

TEST_F(Ops, GemmMatchesCpuForAllTransposes) {
  const std::int64_t m = 67, n = 45, k = 129;  // odd sizes: no accidental tiling alignment
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "trans_a " << ta << " trans_b " << tb);
      Tensor a = random_tensor(ta ? Shape{k, m} : Shape{m, k}, 10 + 2 * ta + tb);
      Tensor b = random_tensor(tb ? Shape{n, k} : Shape{k, n}, 20 + 2 * ta + tb);
      Tensor c_cpu = random_tensor({m, n}, 30);
      Tensor c_gpu = dev(c_cpu);
      ops::gemm(cpu(), ta, tb, 0.7f, a, b, 0.3f, c_cpu);
      ops::gemm(gpu(), ta, tb, 0.7f, dev(a), dev(b), 0.3f, c_gpu);
      EXPECT_CLOSE(c_gpu, c_cpu, 1e-5);
    }
}

TEST_F(Ops, RowBiasAddsAndSumRowsAccumulates) {
  Tensor y = random_tensor({37, 70}, 40), bias = random_tensor({70}, 41);
  Tensor y_gpu = dev(y);
  ops::add_row_bias(cpu(), y, bias);
  ops::add_row_bias(gpu(), y_gpu, dev(bias));
  EXPECT_CLOSE(y_gpu, y, 0.0);

  Tensor dy = random_tensor({300, 70}, 42);
  Tensor db = random_tensor({70}, 43);  // not zero: the op must add to it
  Tensor db_gpu = dev(db);
  ops::sum_rows(cpu(), dy, db);
  ops::sum_rows(gpu(), dev(dy), db_gpu);
  EXPECT_CLOSE(db_gpu, db, 1e-6);

  // Many rows: summed in slices of 256 rows, the slices then added in order (9 here, the last
  // short), over columns that are not a multiple of the 32 a block takes. Deterministic: twice the
  // same bits.
  Tensor tall = random_tensor({2100, 97}, 44);
  Tensor acc = random_tensor({97}, 45), acc_gpu = dev(acc), again = dev(acc);
  ops::sum_rows(cpu(), tall, acc);
  ops::sum_rows(gpu(), dev(tall), acc_gpu);
  ops::sum_rows(gpu(), dev(tall), again);
  EXPECT_CLOSE(acc_gpu, acc, 1e-5);
  EXPECT_CLOSE(again, acc_gpu, 0.0);
}

TEST_F(Ops, ElementwiseOpsMatchCpu) {
  const Shape s{1000, 13};
  Tensor x = random_tensor(s, 50, -3, 3), dy = random_tensor(s, 51);
  Tensor xg = dev(x), dyg = dev(dy);
  Tensor y = Tensor::empty(s), yg = gpu_empty(s), dx = Tensor::empty(s), dxg = gpu_empty(s);

  ops::relu_forward(cpu(), x, y);
  ops::relu_forward(gpu(), xg, yg);
  EXPECT_CLOSE(yg, y, 0.0);
  ops::relu_backward(cpu(), y, dy, dx);
  ops::relu_backward(gpu(), yg, dyg, dxg);
  EXPECT_CLOSE(dxg, dx, 0.0);

  ops::gelu_forward(cpu(), x, y);
  ops::gelu_forward(gpu(), xg, yg);
  EXPECT_CLOSE(yg, y, 1e-6);
  ops::gelu_backward(cpu(), x, dy, dx);
  ops::gelu_backward(gpu(), xg, dyg, dxg);
  EXPECT_CLOSE(dxg, dx, 1e-6);

  ops::add(cpu(), x, dy, y);
  ops::add(gpu(), xg, dyg, yg);
  EXPECT_CLOSE(yg, y, 0.0);

  ops::axpy(cpu(), -0.3f, x, dy);
  ops::axpy(gpu(), -0.3f, xg, dyg);
  EXPECT_CLOSE(dyg, dy, 1e-6);  // with or without an FMA contraction

  ops::scale(cpu(), x, 1.7f);
  ops::scale(gpu(), xg, 1.7f);
  EXPECT_CLOSE(xg, x, 0.0);
}

TEST_F(Ops, DropoutMaskIsTheCpuMaskBitForBit) {
  const Shape s{333, 31};  // not a multiple of 4: the last Philox block is partial
  Tensor x = random_tensor(s, 60), dy = random_tensor(s, 61);
  Tensor y = Tensor::empty(s), yg = gpu_empty(s);
  Tensor mask = Tensor::empty(s, DType::U8), maskg = gpu_empty(s, DType::U8);
  for (float p : {0.0f, 0.1f, 0.5f}) {
    SCOPED_TRACE(::testing::Message() << "p = " << p);
    ops::dropout_forward(cpu(), x, y, mask, p, 1234, 99);
    ops::dropout_forward(gpu(), dev(x), yg, maskg, p, 1234, 99);
    EXPECT_EQ(host(maskg).to_vector<std::uint8_t>(), mask.to_vector<std::uint8_t>());
    EXPECT_CLOSE(yg, y, 1e-7);
    Tensor dx = Tensor::empty(s), dxg = gpu_empty(s);
    ops::dropout_backward(cpu(), dy, mask, p, dx);
    ops::dropout_backward(gpu(), dev(dy), maskg, p, dxg);
    EXPECT_CLOSE(dxg, dx, 1e-7);
  }
}

TEST_F(Ops, NormalizeInputMatchesCpuForBytesAndFloats) {
  const Shape s{4, 3, 5, 6};
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(shape_numel(s)));
  for (std::size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = static_cast<std::uint8_t>((i * 37) % 256);
  Tensor xb = Tensor::from_vector(bytes, s);
  std::vector<float> mean{0.5f, 0.4f, 0.3f}, stddev{0.25f, 0.2f, 0.3f};
  Tensor y = Tensor::empty(s), yg = gpu_empty(s);
  ops::normalize_input(cpu(), xb, mean, stddev, y);
  ops::normalize_input(gpu(), dev(xb), mean, stddev, yg);
  EXPECT_CLOSE(yg, y, 1e-6);
  ops::normalize_input(cpu(), xb, {}, {}, y);  // no statistics: x / 255
  ops::normalize_input(gpu(), dev(xb), {}, {}, yg);
  EXPECT_CLOSE(yg, y, 1e-6);

  Tensor xf = random_tensor(s, 70);
  ops::normalize_input(cpu(), xf, mean, stddev, y);
  ops::normalize_input(gpu(), dev(xf), mean, stddev, yg);
  EXPECT_CLOSE(yg, y, 1e-6);
}

struct ConvCase {
  Shape x, w;
  ops::Conv2dParams p;
};

TEST_F(Ops, ConvolutionForwardAndBackwardMatchCpu) {
  const ConvCase cases[] = {
      {{4, 3, 11, 9}, {8, 3, 3, 3}, {2, 1, 1, 0}},      // strided, asymmetric padding
      {{2, 16, 14, 14}, {32, 16, 5, 5}, {1, 1, 2, 2}},  // "same" 5x5, FFT/Winograd territory
      {{3, 8, 7, 7}, {4, 8, 1, 1}, {1, 1, 0, 0}},       // 1x1
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message() << "x " << shape_str(c.x) << " w " << shape_str(c.w));
    std::int64_t oh =
        ops::window_output_size(c.x[2], static_cast<int>(c.w[2]), c.p.stride_h, c.p.pad_h);
    std::int64_t ow =
        ops::window_output_size(c.x[3], static_cast<int>(c.w[3]), c.p.stride_w, c.p.pad_w);
    Shape ys{c.x[0], c.w[0], oh, ow};
    Tensor x = random_tensor(c.x, 80), w = random_tensor(c.w, 81), b = random_tensor({c.w[0]}, 82);
    Tensor y = Tensor::empty(ys), yg = gpu_empty(ys);
    ops::conv2d_forward(cpu(), x, w, b, y, c.p);
    ops::conv2d_forward(gpu(), dev(x), dev(w), dev(b), yg, c.p);
    EXPECT_CLOSE(yg, y, 1e-4);

    Tensor dy = random_tensor(ys, 83);
    Tensor dx = Tensor::empty(c.x), dxg = gpu_empty(c.x);
    ops::conv2d_backward_data(cpu(), dy, w, dx, c.p);
    ops::conv2d_backward_data(gpu(), dev(dy), dev(w), dxg, c.p);
    EXPECT_CLOSE(dxg, dx, 1e-4);

    Tensor dw = random_tensor(c.w, 84), db = random_tensor({c.w[0]}, 85);  // accumulated into
    Tensor dwg = dev(dw), dbg = dev(db);
    ops::conv2d_backward_weights(cpu(), x, dy, dw, db, c.p);
    ops::conv2d_backward_weights(gpu(), dev(x), dev(dy), dwg, dbg, c.p);
    EXPECT_CLOSE(dwg, dw, 1e-4);
    EXPECT_CLOSE(dbg, db, 1e-5);
  }
}

TEST_F(Ops, ConvolutionIsBitwiseRepeatable) {
  // Only deterministic cuDNN algorithms are chosen, so the same inputs give the same bits.
  ops::Conv2dParams p{1, 1, 1, 1};
  Tensor x = dev(random_tensor({8, 16, 12, 12}, 90)), w = dev(random_tensor({16, 16, 3, 3}, 91));
  Tensor dy = dev(random_tensor({8, 16, 12, 12}, 92));
  std::vector<float> first;
  for (int run = 0; run < 2; ++run) {
    Tensor dw = gpu_empty({16, 16, 3, 3}), db;
    ops::fill(gpu(), dw, 0.0f);
    ops::conv2d_backward_weights(gpu(), x, dy, dw, db, p);
    std::vector<float> got = host(dw).to_vector<float>();
    if (run == 0)
      first = got;
    else
      EXPECT_EQ(0, std::memcmp(got.data(), first.data(), got.size() * sizeof(float)));
  }
}

TEST_F(Ops, PoolingMatchesCpu) {
  struct Case {
    Shape x;
    ops::Pool2dParams p;
  };
  const Case cases[] = {
      {{2, 3, 8, 7}, {2, 2, 2, 2, 0, 0}},  // the classic 2x2/2
      {{2, 3, 9, 9}, {3, 3, 2, 2, 1, 1}},  // overlapping windows with padding
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message() << "x " << shape_str(c.x) << " kernel " << c.p.kernel_h);
    Shape ys{c.x[0], c.x[1], ops::window_output_size(c.x[2], c.p.kernel_h, c.p.stride_h, c.p.pad_h),
             ops::window_output_size(c.x[3], c.p.kernel_w, c.p.stride_w, c.p.pad_w)};
    Tensor x = random_tensor(c.x, 100), dy = random_tensor(ys, 101);
    for (ops::PoolKind kind : {ops::PoolKind::Max, ops::PoolKind::Avg}) {
      Tensor y = Tensor::empty(ys), yg = gpu_empty(ys), ws, wsg;
      ops::pool2d_forward(cpu(), kind, x, y, ws, c.p);
      ops::pool2d_forward(gpu(), kind, dev(x), yg, wsg, c.p);
      EXPECT_CLOSE(yg, y, kind == ops::PoolKind::Max ? 0.0 : 1e-6);
      Tensor dx = Tensor::empty(c.x), dxg = gpu_empty(c.x);
      ops::pool2d_backward(cpu(), kind, dy, ws, dx, c.p);
      ops::pool2d_backward(gpu(), kind, dev(dy), wsg, dxg, c.p);
      EXPECT_CLOSE(dxg, dx, 1e-6);  // overlapping windows sum in a different order
    }
  }
}

TEST_F(Ops, BatchNormTrainEvalAndBackwardMatchCpu) {
  for (const Shape& s : {Shape{8, 4, 5, 5}, Shape{16, 6}}) {
    SCOPED_TRACE(::testing::Message() << "x " << shape_str(s));
    const Shape cs{s[1]};
    Tensor x = random_tensor(s, 110, -2, 3), gamma = random_tensor(cs, 111, 0.5, 1.5),
           beta = random_tensor(cs, 112);
    Tensor rm = random_tensor(cs, 113), rv = random_tensor(cs, 114, 0.5, 2);
    Tensor rmg = dev(rm), rvg = dev(rv);
    Tensor y = Tensor::empty(s), yg = gpu_empty(s);
    Tensor mean = Tensor::empty(cs), invstd = Tensor::empty(cs), meang = gpu_empty(cs),
           invstdg = gpu_empty(cs);
    ops::batchnorm_forward_train(cpu(), x, gamma, beta, y, mean, invstd, rm, rv, 0.1f, 1e-5f);
    ops::batchnorm_forward_train(gpu(), dev(x), dev(gamma), dev(beta), yg, meang, invstdg, rmg, rvg,
                                 0.1f, 1e-5f);
    EXPECT_CLOSE(yg, y, 1e-5);
    EXPECT_CLOSE(meang, mean, 1e-5);
    EXPECT_CLOSE(invstdg, invstd, 1e-5);
    EXPECT_CLOSE(rmg, rm, 1e-5);
    EXPECT_CLOSE(rvg, rv, 1e-5);

    ops::batchnorm_forward_eval(cpu(), x, gamma, beta, rm, rv, 1e-5f, y);
    ops::batchnorm_forward_eval(gpu(), dev(x), dev(gamma), dev(beta), rmg, rvg, 1e-5f, yg);
    EXPECT_CLOSE(yg, y, 1e-5);

    Tensor dy = random_tensor(s, 115);
    Tensor dx = Tensor::empty(s), dxg = gpu_empty(s);
    Tensor dgamma = random_tensor(cs, 116), dbeta = random_tensor(cs, 117);  // accumulated into
    Tensor dgammag = dev(dgamma), dbetag = dev(dbeta);
    ops::batchnorm_backward(cpu(), x, dy, gamma, mean, invstd, dx, dgamma, dbeta);
    ops::batchnorm_backward(gpu(), dev(x), dev(dy), dev(gamma), meang, invstdg, dxg, dgammag,
                            dbetag);
    EXPECT_CLOSE(dxg, dx, 1e-4);
    EXPECT_CLOSE(dgammag, dgamma, 1e-5);
    EXPECT_CLOSE(dbetag, dbeta, 1e-5);
  }
}

TEST_F(Ops, SoftmaxCrossEntropyAndAccuracyMatchCpu) {
  const std::int64_t n = 37;
  const int classes = 10;
  Tensor logits = random_tensor({n, classes}, 120, -5, 5);
  Tensor labels = random_labels(n, classes, 121);
  Tensor probs = Tensor::empty({n, classes}), probsg = gpu_empty({n, classes});
  Tensor loss = Tensor::empty({1}), lossg = gpu_empty({1});
  ops::softmax_xent_forward(cpu(), logits, labels, probs, loss);
  ops::softmax_xent_forward(gpu(), dev(logits), dev(labels), probsg, lossg);
  EXPECT_CLOSE(probsg, probs, 1e-6);
  EXPECT_CLOSE(lossg, loss, 1e-6);

  Tensor dl = Tensor::empty({n, classes}), dlg = gpu_empty({n, classes});
  ops::softmax_xent_backward(cpu(), probs, labels, 1.0f / n, dl);
  ops::softmax_xent_backward(gpu(), probsg, dev(labels), 1.0f / n, dlg);
  EXPECT_CLOSE(dlg, dl, 1e-6);

  EXPECT_EQ(ops::count_correct(gpu(), dev(logits), dev(labels)),
            ops::count_correct(cpu(), logits, labels));
  // Labels equal to each row's argmax: every row is correct on both.
  Tensor argmax = Tensor::empty({n}, DType::I32);
  auto lv = logits.to_vector<float>();
  for (std::int64_t i = 0; i < n; ++i)
    argmax.data<std::int32_t>()[i] = static_cast<std::int32_t>(
        std::max_element(lv.begin() + i * classes, lv.begin() + (i + 1) * classes) -
        (lv.begin() + i * classes));
  EXPECT_EQ(ops::count_correct(gpu(), dev(logits), dev(argmax)), n);
}

TEST_F(Ops, ReductionsMatchCpu) {
  Tensor x = random_tensor({100003}, 140, -4, 4);  // prime length: ragged grid tail
  double want = ops::sum_squares(cpu(), x), got = ops::sum_squares(gpu(), dev(x));
  EXPECT_NEAR(got, want, 1e-12 * want);  // both square in double; only the order differs

  EXPECT_TRUE(ops::all_finite(gpu(), dev(x)));
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    Tensor y = x.clone();
    y.data<float>()[77777] = bad;
    EXPECT_FALSE(ops::all_finite(gpu(), dev(y))) << bad;
    EXPECT_EQ(ops::all_finite(cpu(), y), false) << bad;
  }
}

TEST_F(Ops, OptimizerUpdatesMatchCpu) {
  const Shape s{4097};
  Tensor grad = random_tensor(s, 150);
  struct SgdCase {
    ops::SgdParams p;
    const char* name;
  };
  const SgdCase sgd_cases[] = {
      {{0.1f, 0.0f, 0.0f, 0.0f, false, false, Tensor(), 1}, "plain"},
      {{0.1f, 0.9f, 0.0f, 1e-4f, false, true, Tensor(), 1}, "momentum, first step"},
      {{0.1f, 0.9f, 0.1f, 1e-4f, false, false, Tensor(), 1}, "momentum, dampening"},
      {{0.1f, 0.9f, 0.0f, 5e-4f, true, false, Tensor(), 1}, "nesterov"},
  };
  for (const auto& c : sgd_cases) {
    SCOPED_TRACE(c.name);
    Tensor param = random_tensor(s, 151), buf = random_tensor(s, 152);
    Tensor paramg = dev(param), bufg = dev(buf);
    ops::sgd_update(cpu(), param, grad, buf, c.p);
    ops::sgd_update(gpu(), paramg, dev(grad), bufg, c.p);
    EXPECT_CLOSE(paramg, param, 1e-6);
    if (c.p.momentum != 0.0f) {
      EXPECT_CLOSE(bufg, buf, 1e-6);
    }
  }
  ops::AdamWParams a;
  a.lr = 1e-2f;
  a.step = 3;
  Tensor param = random_tensor(s, 153), m = random_tensor(s, 154, -0.1f, 0.1f),
         v = random_tensor(s, 155, 0.0f, 0.01f);
  Tensor paramg = dev(param), mg = dev(m), vg = dev(v);
  ops::adamw_update(cpu(), param, grad, m, v, a);
  ops::adamw_update(gpu(), paramg, dev(grad), mg, vg, a);
  EXPECT_CLOSE(paramg, param, 1e-6);
  EXPECT_CLOSE(mg, m, 1e-6);
  EXPECT_CLOSE(vg, v, 1e-6);
}

}  // namespace
}  // namespace lockstep::testing
