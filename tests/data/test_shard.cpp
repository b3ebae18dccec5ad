// Shard format v1: what the writer produces and every way the reader refuses a bad file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include "data_test_util.hpp"
#include "lockstep/data/dataset.hpp"
#include "lockstep/data/shard.hpp"
#include "lockstep/h5/h5.hpp"
#include "support/unprivileged.hpp"

using namespace lockstep;
using namespace lockstep::data;
using namespace lockstep::data::testing;

namespace {
// Runs fn, expects a lockstep::Error whose text holds every one of `parts`; returns the error.
Error expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const Error& e) {
    for (const auto& p : parts) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "expected '" << p << "' in: " << e.what();
    }
    return e;
  }
  ADD_FAILURE() << "expected a lockstep::Error";
  return Error("", "", "", 0);
}
void expect_regenerate_hint(const Error& e) {
  EXPECT_NE(e.hint().find("lockstep-shard"), std::string::npos) << e.what();
}
}  // namespace

TEST(ShardWriter, WritesEveryAttributeAndSampleOfFormatVersion1) {
  TempDir dir;
  SetSpec spec;
  spec.num_samples = 10;
  spec.num_shards = 1;
  auto paths = write_set(dir.path(), spec);
  ASSERT_EQ(paths.size(), 1u);
  EXPECT_EQ(std::filesystem::path(paths[0]).filename(), "train-00000-of-00001.h5");

  auto shard = ShardFile::open(paths[0]);
  const ShardMeta& m = shard->meta();
  EXPECT_EQ(m.shard_index, 0);
  EXPECT_EQ(m.num_shards, 1);
  EXPECT_EQ(m.num_classes, 5);
  EXPECT_EQ(m.sample_shape, (Shape{2, 3, 4}));
  EXPECT_EQ(m.dtype, DType::U8);
  EXPECT_EQ(m.num_samples, 10);
  EXPECT_TRUE(m.mean.empty());
  std::vector<std::uint8_t> x(static_cast<std::size_t>(10 * m.sample_bytes()));
  shard->read_x(0, 10, x.data());
  for (std::int64_t i = 0; i < 10; ++i) {
    auto ref = reference_sample(spec, i);
    EXPECT_TRUE(std::equal(ref.begin(), ref.end(), x.begin() + i * m.sample_bytes()))
        << "sample " << i;
  }
  auto y = shard->read_y();
  for (std::int64_t i = 0; i < 10; ++i)
    EXPECT_EQ(y[i], label_of(i, 5));
}

TEST(ShardWriter, StoresMeanAndStdAndDeflatedF32Samples) {
  TempDir dir;
  ShardMeta meta;
  meta.num_classes = 3;
  meta.sample_shape = {2, 5};
  meta.dtype = DType::F32;
  meta.mean = {0.25f, 0.5f};
  meta.stddev = {1.5f, 2.5f};
  ShardWriterOptions options;
  options.deflate_level = 6;
  std::vector<float> x(4 * 10);
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = 0.5f * static_cast<float>(i) - 3.0f;
  std::vector<std::int32_t> y{2, 0, 1, 2};
  ShardWriter w(dir / "f.h5", meta, options);
  w.append(Tensor::from_vector(x, {4, 2, 5}), Tensor::from_vector(y, {4}));
  w.close();
  auto shard = ShardFile::open(dir / "f.h5");
  EXPECT_EQ(shard->meta().dtype, DType::F32);
  EXPECT_EQ(shard->meta().mean, meta.mean);
  EXPECT_EQ(shard->meta().stddev, meta.stddev);
  std::vector<float> back(x.size());
  shard->read_x(0, 4, back.data());
  EXPECT_EQ(back, x);
  EXPECT_EQ(shard->read_y(), y);
}

TEST(ShardWriter, RefusesLabelsOutsideTheClassesNamingTheSample) {
  TempDir dir;
  ShardMeta meta;
  meta.num_classes = 3;
  meta.sample_shape = {1};
  std::vector<std::uint8_t> x{1, 2};
  std::vector<std::int32_t> y{0, 3};
  ShardWriter w(dir / "a.h5", meta);
  expect_error([&] { w.append(x.data(), y.data(), 2); }, {"a.h5", "sample 1", "3", "[0, 3)"});
}

TEST(ShardWriter, LeavesNoShardBehindWhenNotClosed) {
  TempDir dir;
  ShardMeta meta;
  meta.num_classes = 2;
  meta.sample_shape = {1};
  {
    ShardWriter w(dir / "a.h5", meta);
    std::uint8_t x = 1;
    std::int32_t y = 1;
    w.append(&x, &y, 1);
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "a.h5"));
  EXPECT_FALSE(std::filesystem::exists(dir / "a.h5.tmp"));
}

TEST(StaleShardFiles, AreTheNamedSetsFilesANewRunWouldNotOverwrite) {
  TempDir dir;
  for (const char* f :
       {"train-00000-of-00008.h5", "train-00007-of-00008.h5", "train-00000-of-00004.h5",
        "val-00000-of-00001.h5", "test-00000-of-00001.h5", "train-extra-00000-of-00001.h5",
        "train-00000-of-00004.h5.tmp", "notes.txt"})
    std::ofstream(dir / f) << "x";
  const std::vector<std::string> keep = {shard_file_name("train", 0, 4)};
  EXPECT_EQ(
      stale_shard_files(dir.path(), {"train", "val"}, keep),
      (std::vector<std::string>{dir / "train-00000-of-00008.h5", dir / "train-00007-of-00008.h5",
                                dir / "val-00000-of-00001.h5"}));
  EXPECT_TRUE(stale_shard_files(dir / "missing", {"train"}, keep).empty());
}

TEST(ShardFile, ReadsAShardWrittenWithPlainHdf5CallsAndVariableLengthStrings) {
  TempDir dir;
  RawShard raw;
  raw.variable_length_format = true;
  raw.mean = {0.5f};
  raw.stddev = {0.25f};
  write_raw_shard(dir / "raw.h5", raw);
  auto ds = ShardedDataset::open(dir / "raw.h5");
  EXPECT_EQ(ds->size(), 6);
  EXPECT_EQ(ds->sample_shape(), (Shape{1, 2, 2}));
  EXPECT_EQ(ds->num_classes(), 10);
  EXPECT_EQ(ds->mean(), std::vector<float>{0.5f});
  Tensor x, y;
  std::vector<std::int64_t> idx{5, 0};
  ds->gather(idx, x, y);
  // The raw writer stores byte i of /x as i: sample 5 is bytes 20..23.
  EXPECT_EQ(x.to_vector<std::uint8_t>(), (std::vector<std::uint8_t>{20, 21, 22, 23, 0, 1, 2, 3}));
  EXPECT_EQ(y.to_vector<std::int32_t>(), (std::vector<std::int32_t>{5, 0}));
}

TEST(ShardFile, MissingFileIsAnErrorNamingIt) {
  TempDir dir;
  auto e = expect_error([&] { ShardFile::open(dir / "nope.h5"); }, {"nope.h5", "does not exist"});
  expect_regenerate_hint(e);
}

TEST(ShardFile, XAndYOfDifferentLengthsAreAnErrorNamingTheFileAndBothLengths) {
  TempDir dir;
  RawShard raw;
  raw.y = {0, 1, 2, 3, 4};
  write_raw_shard(dir / "s.h5", raw);
  auto e = expect_error([&] { ShardFile::open(dir / "s.h5"); },
                        {"s.h5", "/y has 5 labels but /x has 6 samples"});
  expect_regenerate_hint(e);
}

TEST(ShardFile, WrongFormatNameIsAnError) {
  TempDir dir;
  RawShard raw;
  raw.format = "imagenet-shard";
  write_raw_shard(dir / "s.h5", raw);
  auto e = expect_error([&] { ShardFile::open(dir / "s.h5"); },
                        {"s.h5", "'format'", "imagenet-shard", "lockstep-shard"});
  expect_regenerate_hint(e);
}

TEST(ShardFile, UnsupportedVersionIsAnErrorSayingWhichVersions) {
  TempDir dir;
  RawShard raw;
  raw.version = 3;
  write_raw_shard(dir / "s.h5", raw);
  expect_error([&] { ShardFile::open(dir / "s.h5"); }, {"s.h5", "version 3", "versions 1 and 2"});
  // Version 2 is encoded images: without its 'storage' attribute it is not read as raw.
  raw.version = 2;
  write_raw_shard(dir / "t.h5", raw);
  expect_error([&] { ShardFile::open(dir / "t.h5"); }, {"t.h5", "'storage'", "missing"});
}

TEST(ShardFile, MissingAttributeIsAnErrorNamingIt) {
  TempDir dir;
  RawShard raw;
  raw.num_classes.reset();
  write_raw_shard(dir / "s.h5", raw);
  auto e =
      expect_error([&] { ShardFile::open(dir / "s.h5"); }, {"s.h5", "'num_classes'", "missing"});
  expect_regenerate_hint(e);
  RawShard no_format;
  no_format.format.reset();
  write_raw_shard(dir / "t.h5", no_format);
  expect_error([&] { ShardFile::open(dir / "t.h5"); }, {"t.h5", "'format'", "missing"});
}

TEST(ShardFile, SampleShapeAttributeDisagreeingWithXIsAnError) {
  TempDir dir;
  RawShard raw;
  raw.sample_shape = std::vector<std::int64_t>{1, 2, 3};
  write_raw_shard(dir / "s.h5", raw);
  expect_error([&] { ShardFile::open(dir / "s.h5"); },
               {"s.h5", "/x has sample shape [1, 2, 2]", "[1, 2, 3]"});
}

TEST(ShardFile, MeanWithTheWrongNumberOfChannelsIsAnError) {
  TempDir dir;
  RawShard raw;
  raw.mean = {0.1f, 0.2f};
  raw.stddev = {0.3f, 0.4f};
  write_raw_shard(dir / "s.h5", raw);
  expect_error([&] { ShardFile::open(dir / "s.h5"); },
               {"s.h5", "'mean' has 2 values for 1 channels"});
}

TEST(ShardedDataset, LabelOutsideTheClassesIsAnErrorNamingShardIndexAndValue) {
  TempDir dir;
  RawShard raw;
  raw.shard_index = 1;
  raw.num_shards = 2;
  raw.y = {0, 1, 2, 10, 4, 5};
  write_raw_shard(dir / "d-00001-of-00002.h5", raw);
  raw.shard_index = 0;
  raw.y = {0, 1, 2, 3, 4, 5};
  write_raw_shard(dir / "d-00000-of-00002.h5", raw);
  auto e = expect_error(
      [&] { ShardedDataset::open(dir / "d"); },
      {"d-00001-of-00002.h5", "shard 1 of 2", "index 3", "is 10", "[0, num_classes = 10)"});
  expect_regenerate_hint(e);
}

class ShardSetDisagreement : public ::testing::Test {
 protected:
  // Two shards of one set; `tweak` breaks the second one.
  void write_pair(const std::function<void(RawShard&)>& tweak) {
    RawShard a;
    a.num_shards = 2;
    write_raw_shard(dir / "s-00000-of-00002.h5", a);
    RawShard b = a;
    b.shard_index = 1;
    tweak(b);
    write_raw_shard(dir / "s-00001-of-00002.h5", b);
  }
  TempDir dir;
};

TEST_F(ShardSetDisagreement, OnNumShardsIsAnErrorNamingBothFiles) {
  write_pair([](RawShard& b) { b.num_shards = 3; });
  expect_error([&] { ShardedDataset::open(dir / "s"); },
               {"'num_shards'", "s-00001-of-00002.h5", "s-00000-of-00002.h5", "says 3", "says 2"});
}

TEST_F(ShardSetDisagreement, OnSampleShapeIsAnError) {
  write_pair([](RawShard& b) {
    b.sample_shape = std::vector<std::int64_t>{4};
    b.x_dims = {6, 4};
  });
  expect_error([&] { ShardedDataset::open(dir / "s"); }, {"'sample_shape'", "[4]", "[1, 2, 2]"});
}

TEST_F(ShardSetDisagreement, OnNumClassesIsAnError) {
  write_pair([](RawShard& b) { b.num_classes = 7; });
  expect_error([&] { ShardedDataset::open(dir / "s"); }, {"'num_classes'", "says 7", "says 10"});
}

TEST_F(ShardSetDisagreement, OnDtypeIsAnError) {
  write_pair([](RawShard& b) { b.x_float = true; });
  expect_error([&] { ShardedDataset::open(dir / "s"); }, {"dtype", "f32", "u8"});
}

TEST_F(ShardSetDisagreement, OnMeanIsAnError) {
  write_pair([](RawShard& b) {
    b.mean = {0.5f};
    b.stddev = {0.5f};
  });
  expect_error([&] { ShardedDataset::open(dir / "s"); }, {"'mean'"});
}

TEST(ShardedDataset, MissingShardIndexIsAnErrorNamingIt) {
  TempDir dir;
  SetSpec spec;
  auto paths = write_set(dir.path(), spec);
  std::filesystem::remove(paths[2]);
  auto e = expect_error([&] { ShardedDataset::open(dir / "train"); },
                        {"incomplete", "shard 2 of 4 is missing"});
  expect_regenerate_hint(e);
}

TEST(ShardedDataset, TwoSetsInOneFolderAreAnErrorSuggestingAPrefix) {
  TempDir dir;
  SetSpec spec;
  write_set(dir.path(), spec);
  spec.name = "test";
  write_set(dir.path(), spec);
  // Told by the file names, before the sets' attributes disagree in a less telling way.
  auto e = expect_error([&] { ShardedDataset::open(dir.path()); }, {"of 2 sets (test, train)"});
  EXPECT_NE(e.hint().find("DIR/NAME"), std::string::npos);
  // A copy of a shard under another name: the index appears twice.
  TempDir other;
  spec.name = "train";
  auto paths = write_set(other.path(), spec);
  std::filesystem::copy_file(paths[0], other / "copy.h5");
  e = expect_error([&] { ShardedDataset::open(other.path()); }, {"appears twice", "copy.h5"});
  EXPECT_NE(e.hint().find("DIR/NAME"), std::string::npos);
}

TEST(ShardedDataset, EmptyShardSetIsAnError) {
  TempDir dir;
  expect_error([&] { ShardedDataset::open(dir.path()); }, {"empty shard set", "*.h5"});
  expect_error([&] { ShardedDataset::open(dir / "train"); },
               {"empty shard set", "train-*-of-*.h5"});
  expect_error([&] { ShardedDataset::open(std::vector<std::string>{}); }, {"empty shard set"});
}

TEST(ShardedDataset, TruncatedShardIsAnErrorNamingTheFile) {
  TempDir dir;
  SetSpec spec;
  spec.num_shards = 1;
  spec.num_samples = 400;
  auto paths = write_set(dir.path(), spec);
  std::filesystem::resize_file(paths[0], std::filesystem::file_size(paths[0]) / 2);
  auto e = expect_error([&] { ShardedDataset::open(paths[0]); }, {paths[0], "truncated"});
  expect_regenerate_hint(e);
}

TEST(ShardedDataset, GarbageFileIsAnErrorNamingTheFile) {
  TempDir dir;
  {
    std::ofstream out(dir / "junk.h5", std::ios::binary);
    for (int i = 0; i < 5000; ++i)
      out.put(static_cast<char>(i * 31 % 256));
  }
  auto e = expect_error([&] { ShardedDataset::open(dir / "junk.h5"); },
                        {"junk.h5", "cannot open as HDF5"});
  expect_regenerate_hint(e);
}

TEST(ShardedDataset, CorruptedCompressedChunkIsAnErrorNamingTheFile) {
  TempDir dir;
  SetSpec spec;
  spec.num_shards = 1;
  spec.num_samples = 64;
  spec.deflate_level = 4;
  spec.chunk_samples = 64;  // one chunk
  auto paths = write_set(dir.path(), spec);
  ASSERT_GT(damage_first_chunk(paths[0], static_cast<char>(0xA5)), 16u);
  // Metadata is intact, so the damage shows when /x is read: at open in memory mode.
  auto e = expect_error([&] { ShardedDataset::open(paths[0]); }, {paths[0], "/x"});
  expect_regenerate_hint(e);
  // ... and in the batch that touches it on demand.
  auto ds = ShardedDataset::open(paths[0], 0);
  Tensor x, y;
  std::vector<std::int64_t> idx{3};
  expect_error([&] { ds->gather(idx, x, y); }, {paths[0], "shard 0 of 1", "/x"});
}

TEST(ShardFile, NonFiniteStoredStatisticsAreReportedAsSuch) {
  TempDir dir;
  RawShard raw;
  raw.mean = {std::numeric_limits<float>::quiet_NaN()};
  raw.stddev = {1.0f};
  write_raw_shard(dir / "nan-mean.h5", raw);
  expect_error(
      [&] { ShardFile::open(dir / "nan-mean.h5"); },
      {"nan-mean.h5", "attribute 'mean' of channel 0 is nan, not a finite number", "NaN or Inf"});
  raw.mean = {0.5f};
  raw.stddev = {std::numeric_limits<float>::infinity()};
  write_raw_shard(dir / "inf-std.h5", raw);
  expect_error([&] { ShardFile::open(dir / "inf-std.h5"); },
               {"attribute 'std' of channel 0 is inf, not a finite number"});
  // A set of two such shards says the same, not "shard 1 says [nan] but shard 0 says [nan]".
  raw.mean = {std::numeric_limits<float>::quiet_NaN()};
  raw.stddev = {1.0f};
  raw.num_shards = 2;
  for (std::int64_t s : {0, 1}) {
    raw.shard_index = s;
    write_raw_shard(dir / shard_file_name("set", s, 2), raw);
  }
  expect_error([&] { ShardedDataset::open(dir / "set"); }, {"not a finite number"});
  // The writer refuses to store them too.
  ShardMeta meta;
  meta.num_classes = 2;
  meta.sample_shape = {1, 2};
  meta.mean = {std::numeric_limits<float>::quiet_NaN()};
  meta.stddev = {1.0f};
  expect_error([&] { ShardWriter w(dir / "w.h5", meta); }, {"not a finite number"});
}

TEST(ShardFile, PermissionDeniedIsReportedAsPermissionDenied) {
  TempDir dir;
  std::filesystem::permissions(dir.path(), std::filesystem::perms::all);  // others may enter
  SetSpec spec;
  spec.num_shards = 1;
  const std::string file = write_set(dir.path(), spec).at(0);
  std::filesystem::permissions(file, std::filesystem::perms::none);
  std::string e = lockstep::test::run_unprivileged([&] {
    ShardFile::open(file);
    return std::string("opened");
  });
  EXPECT_NE(e.find(file + ": cannot open: Permission denied"), std::string::npos) << e;
  // An unreadable folder is not "no files match".
  std::filesystem::create_directory(dir / "closed");
  write_set(dir / "closed", spec);
  std::filesystem::permissions(dir / "closed", std::filesystem::perms::owner_all);
  e = lockstep::test::run_unprivileged([&] {
    ShardedDataset::open(dir / "closed");
    return std::string("opened");
  });
  EXPECT_NE(e.find("shard folder " + (dir / "closed") + " (from '" + (dir / "closed") +
                   "'): cannot list: Permission denied"),
            std::string::npos)
      << e;
}

TEST(ShardedDataset, AFlippedByteInAnUncompressedChunkIsAnErrorNotAWrongSample) {
  // Without a checksum a damaged sample was read back silently; the writer now adds HDF5's
  // Fletcher-32 filter to every chunk, which the reader's HDF5 verifies.
  TempDir dir;
  SetSpec spec;
  spec.num_shards = 1;
  spec.num_samples = 8;
  spec.deflate_level = 0;
  spec.chunk_samples = 8;  // one chunk
  auto paths = write_set(dir.path(), spec);
  haddr_t offset = 0;
  hsize_t size = 0;
  {
    hid_t f = H5Fopen(paths[0].c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t x = H5Dopen2(f, "x", H5P_DEFAULT);
    hsize_t origin[4] = {0, 0, 0, 0};
    unsigned mask = 0;
    ASSERT_GE(H5Dget_chunk_info_by_coord(x, origin, &mask, &offset, &size), 0);
    H5Dclose(x);
    H5Fclose(f);
  }
  ASSERT_GT(size, 30u);
  {
    std::fstream io(paths[0], std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(static_cast<std::streamoff>(offset + 30));  // sample 1, element 6
    const char byte = static_cast<char>(io.get());
    io.seekp(static_cast<std::streamoff>(offset + 30));
    io.put(static_cast<char>(byte ^ 0x10));
  }
  auto e = expect_error([&] { ShardedDataset::open(paths[0]); }, {paths[0], "/x"});
  expect_regenerate_hint(e);
}

TEST(ShardFile, AFlippedByteInTheAttributesIsACorruptedFileNotAMissingAttribute) {
  // The root group's object header (holding the attributes) is checksummed: HDF5 then fails to
  // look the attribute up at all, which was reported as "attribute 'num_classes' is missing".
  TempDir dir;
  SetSpec spec;
  spec.num_shards = 1;
  auto paths = write_set(dir.path(), spec);
  std::string bytes;
  {
    std::ifstream in(paths[0], std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const std::size_t at = bytes.find("num_classes");
  ASSERT_NE(at, std::string::npos);
  bytes[at + 4] ^= 0x01;  // "num_Classes"
  {
    std::ofstream out(paths[0], std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  Error e = [&] {
#if defined(__SANITIZE_ADDRESS__)
    // HDF5 1.10.8 itself leaks 56 bytes when a metadata checksum fails (like H1 in
    // docs/FUZZING.md); that lockstep closes every HDF5 object it opened is checked below.
    __lsan::ScopedDisabler hdf5_own_leak;
#endif
    return expect_error([&] { ShardFile::open(paths[0]); }, {paths[0], "corrupted file?"});
  }();
  EXPECT_EQ(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  expect_regenerate_hint(e);
  EXPECT_EQ(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL), 0);
}

namespace {
bool has_fletcher32(const std::string& path, const char* dataset) {
  h5::Scope quiet;  // H5Pget_filter_by_id2 prints an error stack when the filter is absent
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, dataset, H5P_DEFAULT);
  hid_t dcpl = H5Dget_create_plist(d);
  unsigned flags = 0;
  std::size_t nvalues = 0;
  const bool found = H5Pget_filter_by_id2(dcpl, H5Z_FILTER_FLETCHER32, &flags, &nvalues, nullptr, 0,
                                          nullptr, nullptr) >= 0;
  H5Pclose(dcpl);
  H5Dclose(d);
  H5Fclose(f);
  return found;
}
}  // namespace

TEST(ShardWriter, ChecksumsEveryChunkOfXAndY) {
  TempDir dir;
  SetSpec spec;
  spec.num_shards = 1;
  for (int level : {0, 4}) {
    spec.deflate_level = level;
    auto paths = write_set(dir.path(), spec);
    EXPECT_TRUE(has_fletcher32(paths[0], "x")) << "deflate " << level;
    EXPECT_TRUE(has_fletcher32(paths[0], "y")) << "deflate " << level;
  }
}

TEST(ShardFile, ReadsAChunkedDeflatedShardWithoutChecksumsAsWrittenBeforeThem) {
  // Shards written before the writer added Fletcher-32 (HDF5's earliest object format, chunks
  // deflated without a checksum) must read as before.
  TempDir dir;
  RawShard raw;
  raw.x_chunk_samples = 4;  // 6 samples: one full chunk and one partial
  raw.deflate_level = 4;
  write_raw_shard(dir / "old.h5", raw);
  ASSERT_FALSE(has_fletcher32(dir / "old.h5", "x"));
  auto ds = ShardedDataset::open(dir / "old.h5");
  ASSERT_EQ(ds->size(), 6);
  Tensor x, y;
  std::vector<std::int64_t> idx{5, 0, 3};
  ds->gather(idx, x, y);
  // The raw writer stores byte i of /x as i: sample s is bytes 4s..4s+3.
  EXPECT_EQ(x.to_vector<std::uint8_t>(),
            (std::vector<std::uint8_t>{20, 21, 22, 23, 0, 1, 2, 3, 12, 13, 14, 15}));
  EXPECT_EQ(y.to_vector<std::int32_t>(), (std::vector<std::int32_t>{5, 0, 3}));
}

TEST(ShardFile, DatasetsClaimingSamplesWithNoStoredDataAreAnErrorNotAnAllocation) {
  // A few KB of HDF5 can declare /x and /y of 2^40 samples without storing any: reading /y then
  // asked for 4 TiB (std::bad_alloc, not an Error). Every sample must have stored data.
  TempDir dir;
  const std::string path = dir / "hollow.h5";
  {
    RawShard raw;
    raw.sample_shape = std::vector<std::int64_t>{1};
    raw.x_dims = {0, 1};
    raw.y = {};
    write_raw_shard(path, raw);
    hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    H5Ldelete(f, "x", H5P_DEFAULT);
    H5Ldelete(f, "y", H5P_DEFAULT);
    const hsize_t n = hsize_t{1} << 40;
    hsize_t xdims[2] = {n, 1};
    hid_t xs = H5Screate_simple(2, xdims, nullptr);
    hid_t ys = H5Screate_simple(1, &n, nullptr);
    H5Dclose(H5Dcreate2(f, "x", H5T_STD_U8LE, xs, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    H5Dclose(H5Dcreate2(f, "y", H5T_STD_I32LE, ys, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    H5Sclose(xs);
    H5Sclose(ys);
    H5Fclose(f);
  }
  ASSERT_LT(std::filesystem::file_size(path), 100000u);
  auto e = expect_error([&] { ShardFile::open(path)->read_y(); },
                        {path, "/x has no data stored for its 1099511627776 samples"});
  expect_regenerate_hint(e);

  // The same with chunked datasets, one chunk of each written.
  {
    hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    H5Ldelete(f, "x", H5P_DEFAULT);
    H5Ldelete(f, "y", H5P_DEFAULT);
    const hsize_t n = hsize_t{1} << 40, one = 1;
    hsize_t xdims[2] = {n, 1}, xchunk[2] = {4, 1}, ychunk = 4;
    hid_t xs = H5Screate_simple(2, xdims, nullptr), ys = H5Screate_simple(1, &n, nullptr);
    hid_t xp = H5Pcreate(H5P_DATASET_CREATE), yp = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(xp, 2, xchunk);
    H5Pset_chunk(yp, 1, &ychunk);
    hid_t x = H5Dcreate2(f, "x", H5T_STD_U8LE, xs, H5P_DEFAULT, xp, H5P_DEFAULT);
    hid_t y = H5Dcreate2(f, "y", H5T_STD_I32LE, ys, H5P_DEFAULT, yp, H5P_DEFAULT);
    const std::uint8_t pixel = 7;
    const std::int32_t label = 1;
    hid_t ms = H5Screate_simple(1, &one, nullptr);
    hsize_t origin[2] = {0, 0}, count[2] = {1, 1};
    H5Sselect_hyperslab(xs, H5S_SELECT_SET, origin, nullptr, count, nullptr);
    H5Sselect_hyperslab(ys, H5S_SELECT_SET, origin, nullptr, count, nullptr);
    H5Dwrite(x, H5T_NATIVE_UINT8, ms, xs, H5P_DEFAULT, &pixel);
    H5Dwrite(y, H5T_NATIVE_INT32, ms, ys, H5P_DEFAULT, &label);
    for (hid_t id : {x, y})
      H5Dclose(id);
    for (hid_t id : {xp, yp})
      H5Pclose(id);
    for (hid_t id : {xs, ys, ms})
      H5Sclose(id);
    H5Fclose(f);
  }
  expect_error([&] { ShardFile::open(path)->read_y(); },
               {path, "/x has no data stored for some of its 1099511627776 samples"});
}
