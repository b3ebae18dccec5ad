#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <thread>

#include "lockstep/core/error.hpp"
#include "lockstep/core/rng.hpp"
#include "lockstep/core/tensor.hpp"
#include "lockstep/core/thread_pool.hpp"

using namespace lockstep;

TEST(Tensor, ViewsShareStorageAndOffsets) {
  Tensor t = Tensor::from_vector<float>({0, 1, 2, 3, 4, 5}, {3, 2});
  Tensor row = t.slice(1, 3);
  EXPECT_EQ(row.shape(), (Shape{2, 2}));
  EXPECT_EQ(row.to_vector<float>(), (std::vector<float>{2, 3, 4, 5}));
  Tensor tail = row.sub(1, {2});
  tail.data<float>()[0] = 42.0f;
  EXPECT_EQ(t.to_vector<float>()[3], 42.0f);
  EXPECT_TRUE(tail.shares_storage(t));
  Tensor copy = t.clone();
  copy.data<float>()[0] = -1.0f;
  EXPECT_EQ(t.to_vector<float>()[0], 0.0f);
}

TEST(Tensor, MismatchedShapesAndDtypesAreErrorsNamingTheTensor) {
  Tensor t = Tensor::zeros({2, 3});
  EXPECT_THROW(t.view({4, 2}), Error);
  EXPECT_THROW(t.slice(1, 3), Error);
  try {
    (void)t.data<std::int32_t>();
    FAIL() << "expected a dtype error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f32[2, 3]"), std::string::npos) << e.what();
  }
}

TEST(Tensor, ShapesWhoseSizeOverflowsAreErrorsNotWrappedCounts) {
  // Found by fuzzing the idx reader: shapes read from files multiplied past 2^63 (undefined
  // behaviour; in practice a wrapped, possibly small or negative element count).
  auto message = [](const std::function<void()>& fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  const std::int64_t big = std::int64_t{1} << 32;
  EXPECT_NE(message([&] {
              shape_numel({big, big});
            }).find("shape [4294967296, 4294967296] has more than 2^63 elements"),
            std::string::npos);
  // Fits as elements, not as bytes.
  EXPECT_NE(message([&] {
              Tensor::empty({std::int64_t{1} << 62}, DType::F32);
            }).find("more bytes than a 64-bit size holds"),
            std::string::npos);
  EXPECT_NE(message([&] {
              Tensor::empty({std::int64_t{1} << 62}, DType::F32);
            }).find("f32 tensor [4611686018427387904]"),
            std::string::npos);
  EXPECT_EQ(shape_numel({big, 0, big}), 0);  // a zero extent anywhere means no elements
  EXPECT_EQ(shape_numel({3037000499, 3037000499}), std::int64_t{9223372030926249001});
}

TEST(Error, CarriesHintAndPlace) {
  try {
    LOCKSTEP_FAIL_HINT("regenerate with lockstep-shard", "shard 3 of 8 is short");
  } catch (const Error& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("shard 3 of 8 is short"), std::string::npos);
    EXPECT_NE(w.find("hint: regenerate with lockstep-shard"), std::string::npos);
    EXPECT_NE(w.find("test_core.cpp:"), std::string::npos);
    return;
  }
  FAIL();
}

TEST(Philox, MatchesPublishedKnownAnswer) {
  // Random123 known-answer test for philox4x32-10: counter = key = 0.
  Philox zero(0, 0);
  auto b = zero.block(0);
  EXPECT_EQ(b[0], 0x6627e8d5u);
  EXPECT_EQ(b[1], 0xe169c58du);
  EXPECT_EQ(b[2], 0xbc57ac4cu);
  EXPECT_EQ(b[3], 0x9b00dbd8u);
}

TEST(Philox, ResultsDoNotDependOnThreadsOrOrder) {
  Philox rng(1234, hash_string("layer.weight"));
  std::vector<float> serial(10000), parallel(10000);
  rng.fill_uniform(serial.data(), 10000, -1.0f, 1.0f);
  ThreadPool pool(4);
  pool.parallel_for(10000, 1, [&](std::int64_t begin, std::int64_t end) {
    rng.fill_uniform(parallel.data() + begin, end - begin, -1.0f, 1.0f,
                     static_cast<std::uint64_t>(begin));
  });
  EXPECT_EQ(serial, parallel);
  double mean = 0;
  for (float v : serial)
    mean += v;
  EXPECT_NEAR(mean / 10000, 0.0, 0.03);
  EXPECT_NE(Philox(1234, 1).u32(0), Philox(1234, 2).u32(0));
}

TEST(ThreadPool, RunsEveryPartOnceAndPropagatesErrors) {
  ThreadPool pool(3);
  std::vector<int> hits(3, 0);
  pool.run([&](int part, int parts) {
    EXPECT_EQ(parts, 3);
    hits[static_cast<std::size_t>(part)]++;
  });
  EXPECT_EQ(hits, (std::vector<int>{1, 1, 1}));
  EXPECT_THROW(pool.run([](int part, int) {
    if (part == 2) LOCKSTEP_FAIL("boom");
  }),
               Error);
  std::int64_t total = 0;
  std::mutex m;
  pool.parallel_for(1000, 10, [&](std::int64_t b, std::int64_t e) {
    std::lock_guard<std::mutex> lock(m);
    total += e - b;
  });
  EXPECT_EQ(total, 1000);
}

TEST(Memory, AnImpossibleAllocationIsAnOutOfMemoryErrorNamingTheTensorAndTheSize) {
  try {
    Tensor::empty({std::int64_t{1} << 40, std::int64_t{1} << 20});
    ADD_FAILURE() << "allocated 4 EiB";
  } catch (const OutOfMemory& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("a f32 tensor [1099511627776, 1048576] on cpu"), std::string::npos) << what;
    EXPECT_NE(what.find("cannot allocate 4.0 EiB"), std::string::npos) << what;
  }
  EXPECT_THROW(Tensor::empty({std::int64_t{1} << 62, 8}), Error);  // more elements than int64
}
