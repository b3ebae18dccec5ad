// Token shards: what the writer puts in a file is what the reader gets back, and every way a
// file can be wrong is an Error naming the file and the field.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

#include "data_test_util.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/data/dataset.hpp"
#include "lockstep/data/token_dataset.hpp"
#include "lockstep/data/token_shard.hpp"
#include "token_test_util.hpp"

using namespace lockstep;
using namespace lockstep::data;
using namespace lockstep::data::testing;

namespace {
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}
bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}
}  // namespace

TEST(TokenShard, WriterAndReaderAgreeOnEveryAttributeAndId) {
  TempDir dir;
  auto paths = write_token_shards(dir.path(), "train", {7, 5}, 300, "gpt2-ish");
  ASSERT_EQ(paths.size(), 2u);
  EXPECT_EQ(std::filesystem::path(paths[1]).filename(), "train-00001-of-00002.h5");
  EXPECT_FALSE(std::filesystem::exists(paths[1] + ".tmp"));
  auto f = TokenShardFile::open(paths[1]);
  EXPECT_EQ(f->meta().shard_index, 1);
  EXPECT_EQ(f->meta().num_shards, 2);
  EXPECT_EQ(f->meta().tokenizer, "gpt2-ish");
  EXPECT_EQ(f->meta().vocab_size, 300);
  EXPECT_EQ(f->meta().eot_token, 299);
  EXPECT_EQ(f->meta().num_tokens, 5);
  std::vector<std::int32_t> ids(5);
  f->read(0, 5, ids.data());
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(ids[i], token_at(7 + i, 300));
  std::vector<std::uint16_t> narrow(3);
  f->read(1, 3, narrow.data());
  EXPECT_EQ(narrow[0], token_at(8, 300));
  EXPECT_TRUE(is_token_shard(paths[0]));
}

TEST(TokenShard, IdsAreUint16WhenTheVocabularyFitsElseUint32) {
  TempDir dir;
  for (std::int64_t vocab :
       {std::int64_t{256}, std::int64_t{65536}, std::int64_t{65537}, std::int64_t{200000}}) {
    auto paths = write_token_shards(dir.path(), "v" + std::to_string(vocab), {10}, vocab);
    hid_t fid = H5Fopen(paths[0].c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(fid, "tokens", H5P_DEFAULT);
    hid_t t = H5Dget_type(d);
    EXPECT_EQ(H5Tget_size(t), vocab <= 65536 ? 2u : 4u) << vocab;
    EXPECT_EQ(H5Tget_sign(t), H5T_SGN_NONE);
    H5Tclose(t);
    H5Dclose(d);
    H5Fclose(fid);
    auto f = TokenShardFile::open(paths[0]);
    std::vector<std::int32_t> ids(10);
    f->read(0, 10, ids.data());
    for (int i = 0; i < 10; ++i)
      EXPECT_EQ(ids[i], token_at(i, vocab));
  }
}

TEST(TokenShard, WriterRefusesIdsOutsideTheVocabularyAndLeavesNoFile) {
  TempDir dir;
  TokenShardMeta m;
  m.tokenizer = "bytes";
  m.vocab_size = 256;
  {
    TokenShardWriter w(dir / "t.h5", m);
    std::vector<std::int32_t> ids{1, 2, 256};
    const std::string msg = error_of([&] { w.append(ids); });
    EXPECT_TRUE(contains(msg, "token 2 is 256, outside [0, vocab_size = 256)")) << msg;
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "t.h5"));
  EXPECT_FALSE(std::filesystem::exists(dir / "t.h5.tmp"));
  m.eot_token = 256;
  EXPECT_TRUE(contains(error_of([&] { TokenShardWriter(dir / "u.h5", m); }), "eot_token"));
}

TEST(TokenShard, ReaderRefusesBrokenFilesNamingTheFileAndField) {
  TempDir dir;
  struct Case {
    std::function<void(RawTokenShard&)> breakit;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {[](RawTokenShard& r) { r.format = "hdf5"; }, "attribute 'format' is 'hdf5'"},
      {[](RawTokenShard& r) { r.version = 2; }, "version 2 is not supported"},
      {[](RawTokenShard& r) { r.kind = "audio"; }, "attribute 'kind' is 'audio'"},
      {[](RawTokenShard& r) { r.tokenizer.reset(); }, "attribute 'tokenizer' is missing"},
      {[](RawTokenShard& r) { r.vocab_size.reset(); }, "attribute 'vocab_size' is missing"},
      {[](RawTokenShard& r) { r.eot_token = 256; }, "attribute 'eot_token' is 256"},
      {[](RawTokenShard& r) { r.shard_index = 3; }, "attribute 'shard_index' is 3"},
      {[](RawTokenShard& r) { r.file_type = H5T_STD_U32LE; }, "/tokens must hold uint16"},
      {[](RawTokenShard& r) { r.file_type = H5T_STD_I16LE; }, "/tokens must hold uint16"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    RawTokenShard r;
    cases[i].breakit(r);
    const std::string path = dir / ("bad" + std::to_string(i) + ".h5");
    write_raw_token_shard(path, r);
    const std::string msg = error_of([&] { TokenShardFile::open(path); });
    EXPECT_TRUE(contains(msg, path)) << msg;
    EXPECT_TRUE(contains(msg, cases[i].expected)) << "case " << i << ": " << msg;
  }
}

TEST(TokenShard, AnImageShardIsRecognisedAndRefusedAsTokens) {
  TempDir dir;
  SetSpec spec;
  spec.num_shards = 1;
  auto paths = write_set(dir.path(), spec);
  EXPECT_FALSE(is_token_shard(paths[0]));
  EXPECT_FALSE(is_token_shard(dir / "missing.h5"));
  const std::string msg = error_of([&] { TokenShardFile::open(paths[0]); });
  EXPECT_TRUE(contains(msg, paths[0] + " is an image shard")) << msg;
}

TEST(TokenShard, AnIdAtOrAboveTheVocabularyFailsAtOpenInMemoryAndAtReadOnDemand) {
  TempDir dir;
  RawTokenShard r;
  r.tokens = {0, 1, 2, 3, 4, 5, 6, 7, 8, 300, 10, 11, 12};  // position 9 is outside [0, 256)
  write_raw_token_shard(dir / "t-00000-of-00001.h5", r);
  std::string msg = error_of([&] { TokenDataset::open(dir / "t", 4); });
  EXPECT_TRUE(contains(msg, dir / "t-00000-of-00001.h5")) << msg;
  EXPECT_TRUE(contains(msg, "token 9 is 300, outside [0, vocab_size = 256)")) << msg;

  auto ds = TokenDataset::open(dir / "t", 4, /*memory_budget_bytes=*/0);  // reads no ids
  ASSERT_FALSE(ds->in_memory());
  Tensor x, y;
  const std::vector<std::int64_t> clean{0};  // tokens 0..4
  EXPECT_NO_THROW(ds->gather(clean, x, y));
  const std::vector<std::int64_t> bad{2};  // tokens 8..12
  msg = error_of([&] { ds->gather(bad, x, y); });
  EXPECT_TRUE(contains(msg, "token 9 is 300")) << msg;
  EXPECT_TRUE(contains(msg, dir / "t-00000-of-00001.h5")) << msg;
}

TEST(TokenShard, ShardsOfOneSetMustAgreeAndBeComplete) {
  TempDir dir;
  write_token_shards(dir.path(), "a", {4, 4, 4}, 300, "one");
  std::filesystem::remove(dir / "a-00001-of-00003.h5");
  std::string msg = error_of([&] { TokenDataset::open(dir / "a", 2); });
  EXPECT_TRUE(contains(msg, "shard 1 of 3 is missing")) << msg;

  write_token_shards(dir.path(), "b", {4, 4}, 300, "one");
  TempDir other;
  auto theirs = write_token_shards(other.path(), "b", {4, 4}, 300, "two");
  std::filesystem::copy_file(theirs[1], dir / "b-00001-of-00002.h5",
                             std::filesystem::copy_options::overwrite_existing);
  msg = error_of([&] { TokenDataset::open(dir / "b", 2); });
  EXPECT_TRUE(contains(msg, "disagree on 'tokenizer'")) << msg;
  EXPECT_TRUE(contains(msg, "two")) << msg;
}

TEST(TokenShard, WriteTokenSetSplitsIntoNearEqualShardsInOrder) {
  TempDir dir;
  std::vector<std::int32_t> ids;
  for (int i = 0; i < 10; ++i)
    ids.push_back(i);
  TokenShardMeta m;
  m.tokenizer = "bytes";
  m.vocab_size = 256;
  auto paths = write_token_set(ids, dir / "out", "train", 3, m);
  ASSERT_EQ(paths.size(), 3u);
  std::vector<std::int64_t> sizes;
  for (const auto& p : paths)
    sizes.push_back(TokenShardFile::open(p)->meta().num_tokens);
  EXPECT_EQ(sizes, (std::vector<std::int64_t>{3, 3, 4}));
  auto ds = TokenDataset::open(dir / "out/train", 1);
  std::vector<std::int32_t> back(10);
  ds->read_tokens(0, 10, back.data());
  EXPECT_EQ(back, ids);
  EXPECT_TRUE(contains(error_of([&] { write_token_set(ids, dir / "o2", "t", 11, m); }),
                       "cannot split 10 tokens"));
}
