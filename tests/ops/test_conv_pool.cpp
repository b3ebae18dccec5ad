// Convolution (oneDNN) and pooling against naive double-precision loops, in both image layouts
// (NCHW, and NHWC: the inputs transposed by the test's own loops, the outputs transposed back),
// and the layout conversion itself.
#include <gtest/gtest.h>

#include <limits>

#include "lockstep/core/error.hpp"
#include "lockstep/ops/ops.hpp"
#include "ops_test_util.hpp"

using namespace lockstep;
using lockstep::testing::all_close;
using lockstep::testing::from_layout;
using lockstep::testing::in_layout;
using lockstep::testing::random_tensor;
using lockstep::testing::to_double;

namespace {

struct ConvCase {
  std::int64_t n, c, h, w, o, kh, kw;
  int stride, pad;
};
const ConvCase kConvCases[] = {
    {1, 1, 5, 5, 2, 3, 3, 1, 0},   // batch 1, single channel
    {2, 3, 7, 6, 4, 3, 3, 2, 1},   // odd sizes, stride 2, padding
    {3, 2, 8, 9, 5, 2, 3, 2, 0},   // non-square kernel, stride leaves a remainder
    {2, 4, 6, 6, 3, 5, 5, 1, 2},   // "same" padding
    {2, 9, 7, 5, 10, 3, 3, 2, 1},  // >= 8 input channels: oneDNN's blocked layouts
    {1, 16, 6, 6, 8, 3, 3, 1, 1},
    {2, 3, 11, 11, 8, 7, 7, 2, 3},  // ResNet's stem: 7x7 stride 2 on 3 channels
    {2, 16, 6, 6, 32, 1, 1, 2, 0},  // a strided 1x1 downsample
};

const ops::ImageLayout kLayouts[] = {ops::ImageLayout::NCHW, ops::ImageLayout::NHWC};
const char* layout_name(ops::ImageLayout l) {
  return l == ops::ImageLayout::NHWC ? "NHWC" : "NCHW";
}

// Index helpers for NCHW / OIHW.
struct Dims4 {
  std::int64_t a, b, c, d;
  std::int64_t at(std::int64_t i, std::int64_t j, std::int64_t k, std::int64_t l) const {
    return ((i * b + j) * c + k) * d + l;
  }
};

// Calls f(n, o, oy, ox, ci, ky, kx, iy, ix) for every in-bounds tap of the convolution.
template <class F>
void for_each_tap(const ConvCase& k, std::int64_t oh, std::int64_t ow, F f) {
  for (std::int64_t n = 0; n < k.n; ++n)
    for (std::int64_t o = 0; o < k.o; ++o)
      for (std::int64_t oy = 0; oy < oh; ++oy)
        for (std::int64_t ox = 0; ox < ow; ++ox)
          for (std::int64_t ci = 0; ci < k.c; ++ci)
            for (std::int64_t ky = 0; ky < k.kh; ++ky)
              for (std::int64_t kx = 0; kx < k.kw; ++kx) {
                std::int64_t iy = oy * k.stride - k.pad + ky, ix = ox * k.stride - k.pad + kx;
                if (iy >= 0 && iy < k.h && ix >= 0 && ix < k.w) f(n, o, oy, ox, ci, ky, kx, iy, ix);
              }
}

}  // namespace

TEST(Conv2d, ForwardBackwardDataAndWeightsMatchDirectLoopsInBothLayouts) {
  for (int run = 0; run < 4; ++run) {  // 1 and 2 threads, each layout
    const int threads = 1 + run % 2;
    const ops::ImageLayout layout = kLayouts[run / 2];
    ops::Context ctx(Device::cpu(), threads);
    std::uint64_t stream = 100;
    for (const auto& k : kConvCases) {
      const std::int64_t oh = ops::window_output_size(k.h, static_cast<int>(k.kh), k.stride, k.pad);
      const std::int64_t ow = ops::window_output_size(k.w, static_cast<int>(k.kw), k.stride, k.pad);
      const ops::Conv2dParams p{k.stride, k.stride, k.pad, k.pad, layout};
      Tensor x = random_tensor({k.n, k.c, k.h, k.w}, ++stream);
      Tensor w = random_tensor({k.o, k.c, k.kh, k.kw}, ++stream);
      Tensor b = random_tensor({k.o}, ++stream);
      Tensor dy = random_tensor({k.n, k.o, oh, ow}, ++stream);
      const Dims4 xd{k.n, k.c, k.h, k.w}, wd{k.o, k.c, k.kh, k.kw}, yd{k.n, k.o, oh, ow};
      auto xv = to_double(x), wv = to_double(w), bv = to_double(b), dyv = to_double(dy);

      std::vector<double> y_ref(static_cast<std::size_t>(k.n * k.o * oh * ow));
      std::vector<double> dx_ref(xv.size(), 0.0), dw_ref(wv.size(), 0.0), db_ref(bv.size(), 0.0);
      for (std::size_t i = 0; i < y_ref.size(); ++i)
        y_ref[i] = bv[(i / (oh * ow)) % k.o];
      for_each_tap(
          k, oh, ow,
          [&](auto n, auto o, auto oy, auto ox, auto ci, auto ky, auto kx, auto iy, auto ix) {
            y_ref[yd.at(n, o, oy, ox)] += xv[xd.at(n, ci, iy, ix)] * wv[wd.at(o, ci, ky, kx)];
            dx_ref[xd.at(n, ci, iy, ix)] += dyv[yd.at(n, o, oy, ox)] * wv[wd.at(o, ci, ky, kx)];
            dw_ref[wd.at(o, ci, ky, kx)] += dyv[yd.at(n, o, oy, ox)] * xv[xd.at(n, ci, iy, ix)];
          });
      for (std::size_t i = 0; i < dyv.size(); ++i)
        db_ref[(i / (oh * ow)) % k.o] += dyv[i];

      const std::string what = "case n=" + std::to_string(k.n) + " c=" + std::to_string(k.c) + " " +
                               std::to_string(k.h) + "x" + std::to_string(k.w) +
                               " threads=" + std::to_string(threads) + " " + layout_name(layout);
      // The op's tensors in `layout`; the references stay NCHW.
      const Tensor x_in = in_layout(x, layout), dy_in = in_layout(dy, layout);
      Tensor y = Tensor::empty({k.n, k.o, oh, ow});
      ops::conv2d_forward(ctx, x_in, w, b, y, p);
      EXPECT_TRUE(all_close(from_layout(y, layout), y_ref, 1e-5, 1e-5)) << what;

      Tensor y_nobias = Tensor::empty({k.n, k.o, oh, ow});
      ops::conv2d_forward(ctx, x_in, w, Tensor(), y_nobias, p);
      std::vector<double> y_nobias_ref = y_ref;
      for (std::size_t i = 0; i < y_ref.size(); ++i)
        y_nobias_ref[i] -= bv[(i / (oh * ow)) % k.o];
      EXPECT_TRUE(all_close(from_layout(y_nobias, layout), y_nobias_ref, 1e-5, 1e-5)) << what;

      Tensor dx = random_tensor({k.n, k.c, k.h, k.w}, ++stream);  // overwritten
      ops::conv2d_backward_data(ctx, dy_in, w, dx, p);
      EXPECT_TRUE(all_close(from_layout(dx, layout), dx_ref, 1e-5, 1e-5)) << what;

      // Weight and bias gradients accumulate onto what is already there.
      Tensor dw = random_tensor({k.o, k.c, k.kh, k.kw}, ++stream),
             db = random_tensor({k.o}, ++stream);
      auto dw0 = to_double(dw), db0 = to_double(db);
      for (std::size_t i = 0; i < dw0.size(); ++i)
        dw_ref[i] += dw0[i];
      for (std::size_t i = 0; i < db0.size(); ++i)
        db_ref[i] += db0[i];
      ops::conv2d_backward_weights(ctx, x_in, dy_in, dw, db, p);
      EXPECT_TRUE(all_close(dw, dw_ref, 1e-5, 1e-5)) << what;
      EXPECT_TRUE(all_close(db, db_ref, 1e-5, 1e-5)) << what;

      Tensor no_db;
      ops::conv2d_backward_weights(ctx, x_in, dy_in, dw, no_db, p);  // a second pass adds again
      for (std::size_t i = 0; i < dw_ref.size(); ++i)
        dw_ref[i] += dw_ref[i] - dw0[i];
      EXPECT_TRUE(all_close(dw, dw_ref, 1e-5, 1e-5)) << what;
    }
  }
}

TEST(Conv2d, WrongShapesAreErrorsNamingTheTensors) {
  ops::Context ctx;
  Tensor x = Tensor::zeros({2, 3, 8, 8}), w = Tensor::zeros({4, 2, 3, 3});
  Tensor y = Tensor::zeros({2, 4, 6, 6});
  try {
    ops::conv2d_forward(ctx, x, w, Tensor(), y, {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("conv2d_forward"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("f32[4, 2, 3, 3]"), std::string::npos) << e.what();
  }
  Tensor w_ok = Tensor::zeros({4, 3, 3, 3}), y_bad = Tensor::zeros({2, 4, 7, 7});
  EXPECT_THROW(ops::conv2d_forward(ctx, x, w_ok, Tensor(), y_bad, {}), Error);
  EXPECT_THROW(ops::window_output_size(2, 5, 1, 1), Error);
}

namespace {
struct PoolCase {
  std::int64_t n, c, h, w;
  int k, stride, pad;
};
const PoolCase kPoolCases[] = {
    {1, 1, 4, 4, 2, 2, 0},  // batch 1
    {2, 3, 7, 7, 2, 2, 0},  // odd size: the last row/column is dropped (floor)
    {2, 2, 9, 8, 3, 2, 1},  // overlapping windows with padding
    {3, 2, 5, 6, 3, 1, 1},
    {2, 70, 5, 5, 3, 2, 1},  // ResNet's stem pooling, more channels than one NHWC block holds
    {2, 5, 7, 7, 7, 7, 0},   // global average pooling: one window over the whole image
};
}  // namespace

TEST(Pool2d, MaxAndAveragePoolingMatchDirectLoopsInBothLayouts) {
  for (int run = 0; run < 4; ++run) {  // 1 and 2 threads, each layout
    const int threads = 1 + run % 2;
    const ops::ImageLayout layout = kLayouts[run / 2];
    ops::Context ctx(Device::cpu(), threads);
    std::uint64_t stream = 200;
    for (const auto& k : kPoolCases) {
      const std::int64_t oh = ops::window_output_size(k.h, k.k, k.stride, k.pad);
      const std::int64_t ow = ops::window_output_size(k.w, k.k, k.stride, k.pad);
      const ops::Pool2dParams p{k.k, k.k, k.stride, k.stride, k.pad, k.pad, layout};
      Tensor x = random_tensor({k.n, k.c, k.h, k.w}, ++stream);
      Tensor dy = random_tensor({k.n, k.c, oh, ow}, ++stream);
      auto xv = to_double(x), dyv = to_double(dy);
      const Dims4 xd{k.n, k.c, k.h, k.w}, yd{k.n, k.c, oh, ow};
      std::vector<double> max_ref(dyv.size()), avg_ref(dyv.size());
      std::vector<double> dmax_ref(xv.size(), 0.0), davg_ref(xv.size(), 0.0);
      for (std::int64_t n = 0; n < k.n; ++n)
        for (std::int64_t c = 0; c < k.c; ++c)
          for (std::int64_t oy = 0; oy < oh; ++oy)
            for (std::int64_t ox = 0; ox < ow; ++ox) {
              double best = -std::numeric_limits<double>::infinity(), sum = 0.0;
              std::int64_t arg = -1;
              for (int ky = 0; ky < k.k; ++ky)
                for (int kx = 0; kx < k.k; ++kx) {
                  std::int64_t iy = oy * k.stride - k.pad + ky, ix = ox * k.stride - k.pad + kx;
                  if (iy < 0 || iy >= k.h || ix < 0 || ix >= k.w) continue;  // padding: -inf / 0
                  double v = xv[xd.at(n, c, iy, ix)];
                  sum += v;
                  if (v > best) best = v, arg = xd.at(n, c, iy, ix);
                }
              const std::int64_t o = yd.at(n, c, oy, ox);
              max_ref[o] = best;
              avg_ref[o] = sum / (k.k * k.k);  // padding counts in the divisor (PyTorch default)
              dmax_ref[arg] += dyv[o];
              for (int ky = 0; ky < k.k; ++ky)
                for (int kx = 0; kx < k.k; ++kx) {
                  std::int64_t iy = oy * k.stride - k.pad + ky, ix = ox * k.stride - k.pad + kx;
                  if (iy >= 0 && iy < k.h && ix >= 0 && ix < k.w)
                    davg_ref[xd.at(n, c, iy, ix)] += dyv[o] / (k.k * k.k);
                }
            }
      const std::string what = std::to_string(k.h) + "x" + std::to_string(k.w) + " k" +
                               std::to_string(k.k) + " s" + std::to_string(k.stride) + " p" +
                               std::to_string(k.pad) + " threads " + std::to_string(threads) + " " +
                               layout_name(layout);
      const Tensor x_in = in_layout(x, layout), dy_in = in_layout(dy, layout);
      Tensor y = Tensor::empty({k.n, k.c, oh, ow}), ws;
      ops::pool2d_forward(ctx, ops::PoolKind::Max, x_in, y, ws, p);
      EXPECT_TRUE(all_close(from_layout(y, layout), max_ref, 0, 0)) << what;
      ASSERT_TRUE(ws.defined()) << "max pooling returns its argmax workspace";
      Tensor dx = random_tensor({k.n, k.c, k.h, k.w}, ++stream);  // overwritten
      ops::pool2d_backward(ctx, ops::PoolKind::Max, dy_in, ws, dx, p);
      EXPECT_TRUE(all_close(from_layout(dx, layout), dmax_ref, 1e-6, 1e-6)) << what;

      Tensor ws_avg;
      ops::pool2d_forward(ctx, ops::PoolKind::Avg, x_in, y, ws_avg, p);
      EXPECT_TRUE(all_close(from_layout(y, layout), avg_ref, 1e-5, 1e-6)) << what;
      ops::pool2d_backward(ctx, ops::PoolKind::Avg, dy_in, ws_avg, dx, p);
      EXPECT_TRUE(all_close(from_layout(dx, layout), davg_ref, 1e-5, 1e-6)) << what;
    }
  }
}

TEST(Pool2d, MaxBackwardWithoutTheForwardWorkspaceIsAnError) {
  ops::Context ctx;
  Tensor dy = Tensor::zeros({1, 1, 2, 2}), dx = Tensor::zeros({1, 1, 4, 4});
  EXPECT_THROW(ops::pool2d_backward(ctx, ops::PoolKind::Max, dy, Tensor(), dx, {}), Error);
}

TEST(Pool2d, ChannelsLastIsTheNchwResultTransposedBitForBit) {
  // Both layouts visit each window in the same order and add each gradient in the same order.
  ops::Context ctx(Device::cpu(), 2);
  std::uint64_t stream = 300;
  for (const auto& k : kPoolCases) {
    const std::int64_t oh = ops::window_output_size(k.h, k.k, k.stride, k.pad);
    const std::int64_t ow = ops::window_output_size(k.w, k.k, k.stride, k.pad);
    Tensor x = random_tensor({k.n, k.c, k.h, k.w}, ++stream);
    Tensor dy = random_tensor({k.n, k.c, oh, ow}, ++stream);
    for (ops::PoolKind kind : {ops::PoolKind::Max, ops::PoolKind::Avg}) {
      Tensor out[2], grad[2];
      for (ops::ImageLayout layout : kLayouts) {
        const ops::Pool2dParams p{k.k, k.k, k.stride, k.stride, k.pad, k.pad, layout};
        const int i = layout == ops::ImageLayout::NHWC;
        Tensor y = Tensor::empty({k.n, k.c, oh, ow}), dx = Tensor::empty(x.shape()), ws;
        ops::pool2d_forward(ctx, kind, in_layout(x, layout), y, ws, p);
        ops::pool2d_backward(ctx, kind, in_layout(dy, layout), ws, dx, p);
        out[i] = from_layout(y, layout);
        grad[i] = from_layout(dx, layout);
      }
      EXPECT_TRUE(lockstep::testing::bitwise_equal(out[1], out[0])) << k.c << "x" << k.h;
      EXPECT_TRUE(lockstep::testing::bitwise_equal(grad[1], grad[0])) << k.c << "x" << k.h;
    }
  }
}

TEST(BatchTranspose, SwapsTheLastTwoDimensionsOfEveryBatchEntry) {
  for (int threads : {1, 2}) {
    ops::Context ctx(Device::cpu(), threads);
    // Tiles of 32 with remainders on both sides, and a batch large enough to split over threads.
    for (const Shape& s : {Shape{3, 5, 7}, Shape{2, 33, 70}, Shape{64, 64, 49}, Shape{1, 1, 9}}) {
      Tensor x = random_tensor(s, 400), y = random_tensor({s[0], s[2], s[1]}, 401);
      ops::batch_transpose(ctx, x, y);
      std::vector<float> xv = x.to_vector<float>(), yv = y.to_vector<float>();
      bool same = true;
      for (std::int64_t b = 0; b < s[0]; ++b)
        for (std::int64_t i = 0; i < s[1]; ++i)
          for (std::int64_t j = 0; j < s[2]; ++j)
            same &= yv[static_cast<std::size_t>((b * s[2] + j) * s[1] + i)] ==
                    xv[static_cast<std::size_t>((b * s[1] + i) * s[2] + j)];
      EXPECT_TRUE(same) << shape_str(s) << " threads " << threads;
      Tensor back = Tensor::empty(s);
      ops::batch_transpose(ctx, y, back);
      EXPECT_TRUE(lockstep::testing::bitwise_equal(back, x)) << shape_str(s);
    }
  }
}

TEST(BatchTranspose, WrongShapesAndOverlapAreErrors) {
  ops::Context ctx;
  Tensor x = Tensor::zeros({2, 3, 4});
  Tensor same_shape = Tensor::zeros({2, 3, 4});
  try {
    ops::batch_transpose(ctx, x, same_shape);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 4, 3]"), std::string::npos) << e.what();
  }
  Tensor buffer = Tensor::zeros({48});
  Tensor a = buffer.sub(0, {2, 3, 4}), b = buffer.sub(12, {2, 4, 3});
  EXPECT_THROW(ops::batch_transpose(ctx, a, b), Error);  // b starts inside a
  Tensor c = buffer.sub(24, {2, 4, 3});
  EXPECT_NO_THROW(ops::batch_transpose(ctx, a, c));  // the same storage, apart
}
