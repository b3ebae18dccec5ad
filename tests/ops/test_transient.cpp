// Context::transient: a buffer is handed out again only once no Tensor shares it, the smallest
// free one that fits is chosen, and a steady sequence of requests stops allocating.
#include <gtest/gtest.h>

#include "lockstep/ops/context.hpp"

using namespace lockstep;

TEST(Transient, ABufferIsReusedOnlyOnceNoTensorSharesIt) {
  ops::Context ctx;
  Tensor a = ctx.transient({4, 8});
  Tensor b = ctx.transient({4, 8});
  EXPECT_NE(a.raw_data(), b.raw_data()) << "a is still held";
  Tensor view = a.view({32});
  const void* where = a.raw_data();
  a = Tensor();
  Tensor c = ctx.transient({4, 8});
  EXPECT_NE(c.raw_data(), where) << "a view of a's buffer is still held";
  view = Tensor();
  Tensor d = ctx.transient({2, 8});
  EXPECT_EQ(d.raw_data(), where) << "a's buffer is free again and fits";
  EXPECT_EQ(d.shape(), (Shape{2, 8}));
  EXPECT_EQ(ctx.transient_bytes(), 3u * 32 * sizeof(float));
}

TEST(Transient, TheSmallestFreeBufferThatFitsIsChosen) {
  ops::Context ctx;
  Tensor big = ctx.transient({1000}), small = ctx.transient({100}), mid = ctx.transient({500});
  const void* at_small = small.raw_data();
  const void* at_mid = mid.raw_data();
  big = small = mid = Tensor();
  EXPECT_EQ(ctx.transient({90}).raw_data(), at_small);
  EXPECT_EQ(ctx.transient({400}).raw_data(), at_mid);
  Tensor i32 = ctx.transient({10}, DType::I32);  // another dtype never shares a float buffer
  EXPECT_EQ(i32.dtype(), DType::I32);
  EXPECT_EQ(ctx.transient_bytes(), (1000 + 100 + 500) * sizeof(float) + 10 * sizeof(std::int32_t));
}

TEST(Transient, ARepeatedPatternOfRequestsStopsAllocating) {
  ops::Context ctx;
  auto step = [&] {  // a forward keeping two outputs, then a backward passing gradients down
    Tensor y1 = ctx.transient({64, 32}), y2 = ctx.transient({64, 16});
    Tensor g2 = ctx.transient({64, 16});
    Tensor g1 = ctx.transient({64, 32});
    g2 = Tensor();
    Tensor g0 = ctx.transient({64, 8});
  };
  step();
  const std::size_t after_one = ctx.transient_bytes();
  for (int i = 0; i < 3; ++i)
    step();
  EXPECT_EQ(ctx.transient_bytes(), after_one);
}
