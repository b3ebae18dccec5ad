// Importers behind lockstep-shard (idx, CSV, statistics) and the lockstep-shard app itself.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>

#include "data_test_util.hpp"
#include "lockstep/data/dataset.hpp"
#include "lockstep/data/importers.hpp"

using namespace lockstep;
using namespace lockstep::data;
using namespace lockstep::data::testing;

namespace {
constexpr const char* kFashionMnist = "/usr/share/datasets/fashion-mnist";

std::vector<unsigned char> idx_bytes(const std::vector<std::uint32_t>& dims,
                                     const std::vector<std::uint8_t>& data) {
  std::vector<unsigned char> out{0, 0, 0x08, static_cast<unsigned char>(dims.size())};
  for (auto d : dims) {
    for (int s = 24; s >= 0; s -= 8)
      out.push_back(static_cast<unsigned char>(d >> s));
  }
  out.insert(out.end(), data.begin(), data.end());
  return out;
}
void write_file(const std::string& path, const std::vector<unsigned char>& bytes, bool gzip) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
  } else {
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
  }
}
// Whole .gz file, decompressed with zlib directly (independent of the importer).
std::vector<unsigned char> gunzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  std::vector<unsigned char> out;
  unsigned char buf[1 << 16];
  int r;
  while ((r = gzread(f, buf, sizeof buf)) > 0)
    out.insert(out.end(), buf, buf + r);
  gzclose(f);
  return out;
}
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}
std::string app(const std::string& name) {
  // LOCKSTEP_BUILD_DIR when set, else next to this test binary (BUILD/tests/test_data).
  const char* build = std::getenv("LOCKSTEP_BUILD_DIR");
  std::string root =
      build ? std::string(build)
            : std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path().string();
  std::string path = root + "/apps/" + name;
  EXPECT_TRUE(std::filesystem::exists(path))
      << path << " is not built (build all targets, or set LOCKSTEP_BUILD_DIR)";
  return path;
}
// Runs a command, returns its exit status; stdout+stderr into *output.
int run(const std::string& cmd, std::string* output) {
  TempDir dir;
  int status = std::system((cmd + " > " + (dir / "out") + " 2>&1").c_str());
  std::ifstream in(dir / "out");
  output->assign(std::istreambuf_iterator<char>(in), {});
  return WEXITSTATUS(status);
}
}  // namespace

TEST(Idx, ReadsGzippedAndRawFilesAlike) {
  TempDir dir;
  std::vector<std::uint8_t> pixels(3 * 2 * 4);
  for (std::size_t i = 0; i < pixels.size(); ++i)
    pixels[i] = static_cast<std::uint8_t>(i * 10);
  write_file(dir / "img.gz", idx_bytes({3, 2, 4}, pixels), true);
  write_file(dir / "img", idx_bytes({3, 2, 4}, pixels), false);
  write_file(dir / "lab.gz", idx_bytes({3}, {2, 0, 1}), true);
  for (const char* name : {"img.gz", "img"}) {
    Tensor t = read_idx_u8(dir / name);
    EXPECT_EQ(t.shape(), (Shape{3, 2, 4}));
    EXPECT_EQ(t.to_vector<std::uint8_t>(), pixels);
  }
  auto pair = read_idx_pair(dir / "img.gz", dir / "lab.gz");
  EXPECT_EQ(pair.x.shape(), (Shape{3, 1, 2, 4}));
  EXPECT_EQ(pair.y, (std::vector<std::int32_t>{2, 0, 1}));
  EXPECT_EQ(pair.num_classes, 3);
}

TEST(Idx, BadMagicTruncationAndMismatchedCountsAreErrorsNamingTheFile) {
  TempDir dir;
  write_file(dir / "text.gz", {'h', 'e', 'l', 'l', 'o', '!'}, true);
  auto e = error_of([&] { read_idx_u8(dir / "text.gz"); });
  EXPECT_NE(e.find("text.gz: bad magic"), std::string::npos) << e;

  auto full = idx_bytes({10, 28, 28}, std::vector<std::uint8_t>(10 * 784, 7));
  full.resize(full.size() - 100);
  write_file(dir / "short.gz", full, true);
  e = error_of([&] { read_idx_u8(dir / "short.gz"); });
  EXPECT_NE(e.find("short.gz: truncated"), std::string::npos) << e;
  EXPECT_NE(e.find("7740"), std::string::npos) << e;  // bytes present: 7840 - 100

  // A gzip stream cut in the middle.
  write_file(dir / "whole.gz", idx_bytes({10, 28, 28}, std::vector<std::uint8_t>(7840, 3)), true);
  auto gz = std::filesystem::file_size(dir / "whole.gz");
  std::filesystem::resize_file(dir / "whole.gz", gz / 2);
  e = error_of([&] { read_idx_u8(dir / "whole.gz"); });
  EXPECT_NE(e.find("whole.gz"), std::string::npos) << e;

  write_file(dir / "img", idx_bytes({2, 1, 1}, {1, 2}), false);
  write_file(dir / "lab", idx_bytes({3}, {0, 1, 1}), false);
  e = error_of([&] { read_idx_pair(dir / "img", dir / "lab"); });
  EXPECT_NE(e.find("has 2 images but"), std::string::npos) << e;

  e = error_of([&] { read_idx_u8(dir / "absent.gz"); });
  EXPECT_NE(e.find("absent.gz: no such file"), std::string::npos) << e;
}

TEST(Idx, AHeaderPromisingMoreThanTheFileHoldsIsTruncationNotAnAllocation) {
  // 16 bytes promising 65535^3 bytes made the reader allocate ~280 TB up front
  // (std::bad_alloc, not an Error); four dimensions of 2^32-1 overflowed the element count.
  TempDir dir;
  for (const auto& dims : std::vector<std::vector<std::uint32_t>>{
           {65535, 65535, 65535}, {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}) {
    for (bool gz : {false, true}) {
      SCOPED_TRACE(std::to_string(dims.size()) + (gz ? " dims, gzipped" : " dims, raw"));
      write_file(dir / "big", idx_bytes(dims, {1, 2, 3}), gz);
      auto e = error_of([&] { read_idx_u8(dir / "big"); });
      EXPECT_NE(e.find("big: truncated"), std::string::npos) << e;
    }
  }
}

TEST(Idx, BytesAfterTheDataTheHeaderPromisesAreAnError) {
  // A header whose count is too small (e.g. 10 of 60000 images) must not silently drop the rest.
  TempDir dir;
  for (bool gz : {false, true}) {
    write_file(dir / "long", idx_bytes({2, 1, 2}, {1, 2, 3, 4, 5}), gz);
    auto e = error_of([&] { read_idx_u8(dir / "long"); });
    EXPECT_NE(e.find("long: more data than the header's [2, 1, 2] = 4 bytes"), std::string::npos)
        << e;
  }
}

TEST(Csv, ReadsAHeaderAndANamedLabelColumnAnywhereInTheRow) {
  TempDir dir;
  std::ofstream(dir / "a.csv") << "p0,p1,label,p2,p3\n0.5,1,2,-3,4e-1\r\n1,2,0,3,4\n";
  CsvOptions o;
  o.label_column = "label";
  o.sample_shape = {2, 2};
  auto d = read_csv(dir / "a.csv", o);
  EXPECT_EQ(d.x.shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(d.x.to_vector<float>(), (std::vector<float>{0.5f, 1, -3, 0.4f, 1, 2, 3, 4}));
  EXPECT_EQ(d.y, (std::vector<std::int32_t>{2, 0}));
  EXPECT_EQ(d.num_classes, 3);
}

TEST(Csv, ReadsU8WithoutHeaderByColumnIndex) {
  TempDir dir;
  std::ofstream(dir / "b.csv") << "1,255,4\n0,0,9\n";
  CsvOptions o;
  o.label_column = "0";
  o.sample_shape = {2};
  o.dtype = DType::U8;
  o.num_classes = 10;
  auto d = read_csv(dir / "b.csv", o);
  EXPECT_EQ(d.x.to_vector<std::uint8_t>(), (std::vector<std::uint8_t>{255, 4, 0, 9}));
  EXPECT_EQ(d.y, (std::vector<std::int32_t>{1, 0}));
  EXPECT_EQ(d.num_classes, 10);
}

TEST(Csv, BadRowsAreErrorsNamingFileLineAndColumn) {
  TempDir dir;
  std::ofstream(dir / "c.csv") << "1,2,3\n1,2\n";
  CsvOptions o;
  o.sample_shape = {2};
  auto e = error_of([&] { read_csv(dir / "c.csv", o); });
  EXPECT_NE(e.find("c.csv line 2: 2 columns"), std::string::npos) << e;

  std::ofstream(dir / "d.csv") << "1,2,3.5\n";
  o.dtype = DType::U8;
  e = error_of([&] { read_csv(dir / "d.csv", o); });
  EXPECT_NE(e.find("d.csv line 1 column 2: '3.5' is not an integer in 0..255"), std::string::npos)
      << e;

  std::ofstream(dir / "e.csv") << "a,b,c\n1,2,3\n";
  o.dtype = DType::F32;
  o.label_column = "label";
  e = error_of([&] { read_csv(dir / "e.csv", o); });
  EXPECT_NE(e.find("no column named 'label'"), std::string::npos) << e;

  // A column index too large for an integer is the same error, not std::out_of_range.
  o.label_column = "99999999999999999999";
  e = error_of([&] { read_csv(dir / "c.csv", o); });
  EXPECT_NE(e.find("c.csv: label column 99999999999999999999 does not exist"), std::string::npos)
      << e;
}

TEST(Csv, NonFiniteValuesAreErrorsNamingFileLineAndColumn) {
  // std::from_chars reads nan/inf in any case; a float beyond f32's range would become inf when
  // stored. Each must be an error naming the file, the line and the (0-based) column.
  TempDir dir;
  CsvOptions o;
  o.sample_shape = {2};
  struct Case {
    const char* text;
    const char* expected;
  };
  for (const Case& c : std::vector<Case>{
           {"1,2,3\n0,nan,1\n", "bad.csv line 2 column 1: 'nan' is not a finite number"},
           {"0,1,-Infinity\n", "bad.csv line 1 column 2: '-Infinity' is not a finite number"},
           {"0,INF,1\n", "bad.csv line 1 column 1: 'INF' is not a finite number"},
           {"0,1,1e39\n", "bad.csv line 1 column 2: '1e39' is outside the range of f32"},
           {"0,1,2\n1,-1e300,2\n", "bad.csv line 2 column 1: '-1e300' is outside the range of f32"},
           {"nan,1,2\n", "bad.csv line 1 column 0: label 'nan' is not a non-negative integer"},
       }) {
    SCOPED_TRACE(c.text);
    std::ofstream(dir / "bad.csv") << c.text;
    auto e = error_of([&] { read_csv(dir / "bad.csv", o); });
    EXPECT_NE(e.find(c.expected), std::string::npos) << e;
  }
  // NaN in a u8 file is refused too (it is not an integer in 0..255).
  o.dtype = DType::U8;
  std::ofstream(dir / "bad.csv") << "0,nan,1\n";
  auto e = error_of([&] { read_csv(dir / "bad.csv", o); });
  EXPECT_NE(e.find("bad.csv line 1 column 1: 'nan' is not a finite number"), std::string::npos)
      << e;
  // The largest finite f32 is still accepted, as is a subnormal.
  o.dtype = DType::F32;
  std::ofstream(dir / "ok.csv") << "0,3.4028234e38,1e-40\n";
  auto d = read_csv(dir / "ok.csv", o);
  EXPECT_EQ(d.x.to_vector<float>(), (std::vector<float>{3.4028234e38f, 1e-40f}));
}

TEST(ChannelStats, MatchHandComputedMeanAndPopulationStd) {
  // Channel 0 holds 0 and 255 (mean 0.5, std 0.5 in pixel units), channel 1 holds 51 (0.2, std 0
  // -> stored as 1 so normalisation never divides by zero).
  Tensor x = Tensor::from_vector<std::uint8_t>({0, 255, 51, 51, 255, 0, 51, 51}, {2, 2, 2});
  std::vector<float> mean, stddev;
  channel_stats(x, mean, stddev);
  EXPECT_FLOAT_EQ(mean[0], 0.5f);
  EXPECT_FLOAT_EQ(stddev[0], 0.5f);
  EXPECT_FLOAT_EQ(mean[1], 0.2f);
  EXPECT_FLOAT_EQ(stddev[1], 1.0f);
  Tensor f = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 1, 2});
  channel_stats(f, mean, stddev);
  EXPECT_FLOAT_EQ(mean[0], 3.5f);
  EXPECT_NEAR(stddev[0], std::sqrt(17.5 / 6.0), 1e-6);
}

TEST(LockstepShard, IdxCommandWritesShardsAndBadInputIsAnErrorNamingTheFile) {
  TempDir dir;
  std::vector<std::uint8_t> pixels(7 * 4);
  for (std::size_t i = 0; i < pixels.size(); ++i)
    pixels[i] = static_cast<std::uint8_t>(i);
  write_file(dir / "img.gz", idx_bytes({7, 2, 2}, pixels), true);
  write_file(dir / "lab.gz", idx_bytes({7}, {0, 1, 2, 3, 4, 5, 6}), true);
  std::string out;
  ASSERT_EQ(run(app("lockstep-shard") + " idx --images=" + (dir / "img.gz") +
                    " --labels=" + (dir / "lab.gz") + " --out=" + (dir / "sh") +
                    " --name=mini --shards=3 --deflate=5",
                &out),
            0)
      << out;
  auto ds = ShardedDataset::open(dir / "sh/mini");
  EXPECT_EQ(ds->size(), 7);
  EXPECT_EQ(ds->files().size(), 3u);
  EXPECT_EQ(ds->sample_shape(), (Shape{1, 2, 2}));
  ASSERT_EQ(ds->mean().size(), 1u);
  EXPECT_NEAR(ds->mean()[0], 13.5 / 255.0, 1e-6);  // mean of 0..27
  ASSERT_EQ(run(app("lockstep-shard") + " inspect " + (dir / "sh/mini"), &out), 0) << out;
  EXPECT_NE(out.find("samples:      7"), std::string::npos) << out;

  write_file(dir / "bad.gz", {'n', 'o', 'p', 'e', '!', '!'}, true);
  EXPECT_EQ(run(app("lockstep-shard") + " idx --images=" + (dir / "bad.gz") +
                    " --labels=" + (dir / "lab.gz") + " --out=" + (dir / "x"),
                &out),
            1);
  EXPECT_NE(out.find("bad.gz: bad magic"), std::string::npos) << out;
  EXPECT_EQ(run(app("lockstep-shard") + " idx --imgs=a", &out), 1);
}

TEST(LockstepShard, FashionMnistMatchesTheIdxFilesAndStoresTrainStatsInBoth) {
  if (!std::filesystem::exists(std::string(kFashionMnist) + "/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << kFashionMnist << " not present (Debian package dataset-fashion-mnist)";
  }
  TempDir dir;
  std::string out;
  ASSERT_EQ(run(app("lockstep-shard") + " fashion-mnist --out=" + dir.path() + " --shards=3", &out),
            0)
      << out;
  auto train = ShardedDataset::open(dir / "train", 0);
  auto test = ShardedDataset::open(dir / "test", 0);
  EXPECT_EQ(train->size(), 60000);
  EXPECT_EQ(test->size(), 10000);
  EXPECT_EQ(train->sample_shape(), (Shape{1, 28, 28}));
  EXPECT_EQ(train->num_classes(), 10);
  EXPECT_EQ(train->dtype(), DType::U8);
  EXPECT_EQ(train->mean(), test->mean());
  EXPECT_EQ(train->stddev(), test->stddev());
  EXPECT_NEAR(train->mean()[0], 0.2860, 1e-3);  // the published Fashion-MNIST figures
  EXPECT_NEAR(train->stddev()[0], 0.3530, 1e-3);

  auto images = gunzip(std::string(kFashionMnist) + "/t10k-images-idx3-ubyte.gz");
  auto labels = gunzip(std::string(kFashionMnist) + "/t10k-labels-idx1-ubyte.gz");
  std::vector<std::int64_t> idx{0, 1, 3333, 3334, 6667, 9999};  // across shard boundaries
  Tensor x, y;
  test->gather(idx, x, y);
  for (std::size_t j = 0; j < idx.size(); ++j) {
    EXPECT_EQ(0,
              std::memcmp(images.data() + 16 + idx[j] * 784, x.data<std::uint8_t>() + j * 784, 784))
        << "test image " << idx[j];
    EXPECT_EQ(y.data<std::int32_t>()[j], labels[8 + idx[j]]) << "test label " << idx[j];
  }
}
