#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "custom_model/custom_network.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/h5/h5.hpp"
#include "lockstep/nn/loss.hpp"
#include "lockstep/optim/adamw.hpp"
#include "lockstep/train/checkpoint.hpp"
#include "lockstep/train/state.hpp"
#include "support/training.hpp"

using namespace lockstep;
using namespace lockstep::train;
namespace fs = std::filesystem;

namespace {

// A fresh folder per test, removed afterwards.
class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / str("lockstep-ckpt-", info->name(), "-", ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

Tensor bf16_tensor(const std::vector<std::uint16_t>& bits, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::BF16);
  std::memcpy(t.raw_data(), bits.data(), bits.size() * 2);
  return t;
}

std::vector<unsigned char> bytes_of(const Tensor& t) {
  const auto* p = static_cast<const unsigned char*>(t.numel() > 0 ? t.raw_data() : nullptr);
  return std::vector<unsigned char>(p, p + t.nbytes());
}

// A small but complete state: every dtype, a scalar, an empty tensor, awkward names.
CheckpointState sample_state(std::int64_t step, float salt = 0.0f) {
  CheckpointState s;
  s.step = step;
  s.epoch = 3;
  s.batch_in_epoch = 17;
  s.world_size = 2;
  s.config_ini = "[train]\nglobal_batch = 64\nseed = 7\n\n[optim]\nlr = 0.1\n";
  s.model_structure = "flatten\nlinear(784->16)\nrelu\nlinear(16->10)\n";
  s.attrs = {{"rng", "philox:7:1234"}, {"parallel", "ddp"}, {"slash/key", "v"}, {"empty", ""}};
  s.tensors = {
      {"param/1.weight",
       Tensor::from_vector<float>({1.5f + salt, -2.0f, 3.25f, 1e-30f, -0.0f, 7.0f}, {2, 3})},
      {"buffer/2.bn.running_mean", Tensor::from_vector<double>({0.1, -1e300}, {2})},
      {"optim/step", Tensor::from_vector<std::int32_t>({-5}, {})},  // a scalar
      {"optim/mask", Tensor::from_vector<std::uint8_t>({0, 255, 7, 1}, {1, 2, 2})},
      {"param/0.half", bf16_tensor({0x3f80, 0xbf80, 0x7fc0}, {3})},
      {"param/empty", Tensor::empty({0, 4})},
  };
  return s;
}

void expect_same_state(const CheckpointState& a, const CheckpointState& b) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.epoch, b.epoch);
  EXPECT_EQ(a.batch_in_epoch, b.batch_in_epoch);
  EXPECT_EQ(a.world_size, b.world_size);
  EXPECT_EQ(a.config_ini, b.config_ini);
  EXPECT_EQ(a.model_structure, b.model_structure);
  EXPECT_EQ(a.attrs, b.attrs);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    SCOPED_TRACE(a.tensors[i].first);
    EXPECT_EQ(a.tensors[i].first, b.tensors[i].first);
    EXPECT_EQ(a.tensors[i].second.dtype(), b.tensors[i].second.dtype());
    EXPECT_EQ(a.tensors[i].second.shape(), b.tensors[i].second.shape());
    EXPECT_EQ(bytes_of(a.tensors[i].second), bytes_of(b.tensors[i].second));
  }
}

std::string read_error(const std::string& file) {
  try {
    (void)read_checkpoint(file);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<char> slurp(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void spit(const std::string& file, const std::vector<char>& bytes) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Edits a written checkpoint with plain HDF5 calls (as a buggy writer or a bit flip on an
// unprotected copy might), then reseals the header so only the inner checks can notice.
template <class Edit>
void edit_and_reseal(const std::string& file, Edit edit) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  edit(f);
  ASSERT_GE(H5Fclose(f), 0);
  detail::reseal_checkpoint_for_test(file);
}

}  // namespace

TEST_F(CheckpointTest, RoundTripKeepsEveryDtypeShapeNameAndOrderBitwise) {
  const CheckpointState state = sample_state(1234);
  const std::string file = checkpoint_path(dir_.string(), state.step);
  write_checkpoint(file, state);
  expect_same_state(state, read_checkpoint(file));
  EXPECT_EQ(state.tensor("optim/mask").dtype(), DType::U8);
  EXPECT_THROW((void)state.tensor("param/missing"), Error);
}

TEST_F(CheckpointTest, NamesWithSlashesDotsAndPercentSignsAreStoredAsGiven) {
  CheckpointState s;
  const std::vector<std::string> names = {
      "param/3.weight", "optim/5.bn1.running_mean/exp_avg", "odd%2Fname", ".", "..", "a//b/", "%"};
  for (std::size_t i = 0; i < names.size(); ++i) {
    s.tensors.push_back({names[i], Tensor::from_vector<float>({float(i)}, {1})});
  }
  const std::string file = path("names.h5");
  write_checkpoint(file, s);
  const CheckpointState back = read_checkpoint(file);
  ASSERT_EQ(back.tensors.size(), names.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(back.tensors[i].first, names[i]);
    EXPECT_EQ(back.tensors[i].second.to_vector<float>(), std::vector<float>{float(i)});
  }
  // Escaping is a bijection, and an escaped name never holds a '/'.
  for (const auto& n : names) {
    EXPECT_EQ(h5::escape_name(n).find('/'), std::string::npos) << n;
    EXPECT_EQ(h5::unescape_name(h5::escape_name(n)), n);
  }
  EXPECT_EQ(h5::escape_name("param/1.w"), "param%2F1.w");
  EXPECT_THROW(h5::unescape_name("bad%zz"), Error);
}

TEST_F(CheckpointTest, DuplicateOrEmptyTensorNamesAreRejected) {
  CheckpointState s;
  s.tensors = {{"param/a", Tensor::zeros({1})}, {"param/a", Tensor::zeros({2})}};
  EXPECT_THROW(write_checkpoint(path("dup.h5"), s), Error);
  s.tensors = {{"", Tensor::zeros({1})}};
  EXPECT_THROW(write_checkpoint(path("empty.h5"), s), Error);
  EXPECT_FALSE(fs::exists(path("dup.h5")));
  EXPECT_FALSE(fs::exists(path("empty.h5")));
}

TEST_F(CheckpointTest, PathsHaveEightDigitStepsThatSortByStep) {
  EXPECT_EQ(checkpoint_path("/runs/a", 1234), "/runs/a/ckpt-00001234.h5");
  EXPECT_EQ(checkpoint_path("d", 0), "d/ckpt-00000000.h5");
  EXPECT_EQ(checkpoint_path("d", 123456789012), "d/ckpt-123456789012.h5");
  EXPECT_THROW(checkpoint_path("d", -1), Error);
}

TEST_F(CheckpointTest, WriteReplacesAtomicallyAndRemovesStaleTempFiles) {
  // What a writer killed mid-write leaves behind: a partial file under a temporary name.
  const std::string stale = path(".tmp-ckpt-00000009.h5.4242");
  spit(stale, std::vector<char>(1000, 'x'));
  std::vector<std::string> warnings;
  auto warn = [&](const std::string& m) { warnings.push_back(m); };
  EXPECT_EQ(find_latest_checkpoint(dir_.string(), warn), std::nullopt);
  EXPECT_TRUE(warnings.empty()) << "temporary files are not checkpoints";

  const std::string file = checkpoint_path(dir_.string(), 5);
  write_checkpoint(file, sample_state(5, 0.0f));
  write_checkpoint(file, sample_state(5, 1.0f));  // overwrite: the new one wins whole
  EXPECT_FALSE(fs::exists(stale));
  std::set<std::string> left;
  for (const auto& e : fs::directory_iterator(dir_))
    left.insert(e.path().filename().string());
  EXPECT_EQ(left, std::set<std::string>{"ckpt-00000005.h5"});
  expect_same_state(sample_state(5, 1.0f), read_checkpoint(file));
}

TEST_F(CheckpointTest, TruncatedFilesAreErrorsNamingTheFile) {
  const std::string file = path("ckpt-00000001.h5");
  write_checkpoint(file, sample_state(1));
  const auto size = fs::file_size(file);
  for (std::uintmax_t cut :
       {size - 1, size / 2, std::uintmax_t{600}, std::uintmax_t{100}, std::uintmax_t{0}}) {
    write_checkpoint(file, sample_state(1));
    fs::resize_file(file, cut);
    const std::string error = read_error(file);
    SCOPED_TRACE(str("cut at ", cut));
    EXPECT_NE(error.find(file), std::string::npos) << error;
    EXPECT_NE(error.find("truncated"), std::string::npos) << error;
  }
}

TEST_F(CheckpointTest, AnyFlippedByteIsAnErrorNeverACrash) {
  const std::string file = path("ckpt-00000001.h5");
  write_checkpoint(file, sample_state(1));
  const std::vector<char> good = slurp(file);
  // Every 97th byte covers the header, HDF5's superblock and object headers, and tensor data.
  int checked = 0;
  for (std::size_t at = 0; at < good.size(); at += 97) {
    std::vector<char> bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x5a);
    spit(file, bad);
    const std::string error = read_error(file);
    EXPECT_NE(error, "") << "flipped byte " << at << " went unnoticed";
    EXPECT_NE(error.find(file), std::string::npos) << error;
    if (at >= 512) {
      EXPECT_NE(error.find("checksum mismatch"), std::string::npos) << error;
    }
    ++checked;
  }
  EXPECT_GT(checked, 10);
}

TEST_F(CheckpointTest, NonCheckpointFilesAreRejectedWithAHint) {
  const std::string file = path("ckpt-00000003.h5");
  spit(file, std::vector<char>(4096, '\0'));
  EXPECT_NE(read_error(file).find("not a lockstep checkpoint"), std::string::npos);
  // A valid HDF5 file that is an export, not a checkpoint.
  export_parameters(file, {{"w", Tensor::zeros({2})}}, {}, {});
  EXPECT_NE(read_error(file).find("not a lockstep checkpoint"), std::string::npos);
  EXPECT_NE(read_error(path("absent.h5")).find("cannot open"), std::string::npos);
}

TEST_F(CheckpointTest, MissingCompleteMarkerIsAnError) {
  const std::string file = path("ckpt-00000002.h5");
  write_checkpoint(file, sample_state(2));
  edit_and_reseal(file, [](hid_t f) { ASSERT_GE(H5Adelete(f, "complete"), 0); });
  const std::string error = read_error(file);
  EXPECT_NE(error.find("incomplete"), std::string::npos) << error;

  // The header's own marker: a header cut short before its last line.
  write_checkpoint(file, sample_state(2));
  std::vector<char> bytes = slurp(file);
  const std::string text(bytes.data(), 512);
  const auto at = text.find("complete\n");
  ASSERT_NE(at, std::string::npos);
  std::memset(bytes.data() + at, 0, 9);
  spit(file, bytes);
  EXPECT_NE(read_error(file).find("complete marker"), std::string::npos) << read_error(file);
}

TEST_F(CheckpointTest, ContentThatDisagreesWithItsChecksumIsAnError) {
  const std::string file = path("ckpt-00000002.h5");
  // A tensor value changed behind the writer's back.
  write_checkpoint(file, sample_state(2));
  edit_and_reseal(file, [](hid_t f) {
    hid_t d = H5Dopen2(f, "/tensors/param%2F1.weight", H5P_DEFAULT);
    ASSERT_GE(d, 0);
    const float values[6] = {9, 9, 9, 9, 9, 9};
    ASSERT_GE(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values), 0);
    H5Dclose(d);
  });
  std::string error = read_error(file);
  EXPECT_NE(error.find("checksum mismatch"), std::string::npos) << error;

  // Metadata changed: the config text (same length, so the dataset can be rewritten in place).
  write_checkpoint(file, sample_state(2));
  edit_and_reseal(file, [](hid_t f) {
    hid_t d = H5Dopen2(f, "/meta/config_ini", H5P_DEFAULT);
    ASSERT_GE(d, 0);
    hid_t type = H5Dget_type(d);
    std::string text = sample_state(2).config_ini;
    text[text.find("0.1")] = '9';
    ASSERT_GE(H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, text.data()), 0);
    H5Tclose(type);
    H5Dclose(d);
  });
  error = read_error(file);
  EXPECT_NE(error.find("checksum mismatch"), std::string::npos) << error;

  // The sampler position disagrees with the header's copy of it.
  write_checkpoint(file, sample_state(2));
  edit_and_reseal(file, [](hid_t f) {
    hid_t a = H5Aopen(f, "epoch", H5P_DEFAULT);
    ASSERT_GE(a, 0);
    const std::int64_t epoch = 99;
    ASSERT_GE(H5Awrite(a, H5T_NATIVE_INT64, &epoch), 0);
    H5Aclose(a);
  });
  error = read_error(file);
  EXPECT_NE(error.find("epoch 99"), std::string::npos) << error;
}

TEST_F(CheckpointTest, FindLatestSkipsDamagedCheckpointsWithAWarningEach) {
  for (std::int64_t step : {10, 20, 30})
    write_checkpoint(checkpoint_path(dir_.string(), step), sample_state(step));
  fs::resize_file(checkpoint_path(dir_.string(), 30), 700);
  spit(checkpoint_path(dir_.string(), 40), std::vector<char>(2048, 'g'));
  spit(path("notes.txt"), std::vector<char>(10, 'n'));
  std::vector<std::string> warnings;
  auto latest =
      find_latest_checkpoint(dir_.string(), [&](const std::string& m) { warnings.push_back(m); });
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(*latest, checkpoint_path(dir_.string(), 20));
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find("ckpt-00000040.h5"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[1].find("ckpt-00000030.h5"), std::string::npos) << warnings[1];
  EXPECT_NE(warnings[1].find("skipped"), std::string::npos) << warnings[1];

  EXPECT_EQ(find_latest_checkpoint(path("no-such-folder"), nullptr), std::nullopt);
}

TEST_F(CheckpointTest, AFileNamedWithAStepBeyond64BitsIsNotACheckpoint) {
  // std::stoll on its digits threw std::out_of_range out of find_latest_checkpoint and prune.
  write_checkpoint(checkpoint_path(dir_.string(), 7), sample_state(7));
  spit(path("ckpt-99999999999999999999.h5"), std::vector<char>(10, 'x'));
  EXPECT_EQ(find_latest_checkpoint(dir_.string(), nullptr), checkpoint_path(dir_.string(), 7));
  prune_checkpoints(dir_.string(), 1);
  EXPECT_TRUE(fs::exists(path("ckpt-99999999999999999999.h5")));
}

TEST_F(CheckpointTest, PruneKeepsTheNewestCompleteOnes) {
  for (std::int64_t step = 1; step <= 5; ++step) {
    write_checkpoint(checkpoint_path(dir_.string(), step), sample_state(step));
  }
  prune_checkpoints(dir_.string(), 2);
  std::set<std::string> left;
  for (const auto& e : fs::directory_iterator(dir_))
    left.insert(e.path().filename().string());
  EXPECT_EQ(left, (std::set<std::string>{"ckpt-00000004.h5", "ckpt-00000005.h5"}));
  EXPECT_THROW(prune_checkpoints(dir_.string(), 0), Error);
}

TEST_F(CheckpointTest, PruneNeverCountsNorDeletesDamagedFiles) {
  for (std::int64_t step = 1; step <= 5; ++step) {
    write_checkpoint(checkpoint_path(dir_.string(), step), sample_state(step));
  }
  fs::resize_file(checkpoint_path(dir_.string(), 5), 1000);  // newest: damaged
  fs::resize_file(checkpoint_path(dir_.string(), 3), 1000);  // between good ones
  spit(path(".tmp-ckpt-00000006.h5.1"), std::vector<char>(10, 'x'));
  prune_checkpoints(dir_.string(), 2);
  std::set<std::string> left;
  for (const auto& e : fs::directory_iterator(dir_))
    left.insert(e.path().filename().string());
  // 4 and 2 are the two newest complete; 1 goes. The damaged ones stay: 5 for resume to report,
  // 3 as evidence (a file the run cannot read is never deleted).
  EXPECT_EQ(left, (std::set<std::string>{"ckpt-00000002.h5", "ckpt-00000003.h5", "ckpt-00000004.h5",
                                         "ckpt-00000005.h5"}));
}

TEST_F(CheckpointTest, ExportIsPlainHdf5WithNamedDatasetsAndLargeAttributes) {
  const std::string file = path("model.h5");
  const std::string structure(100000, 's');  // over HDF5's 64 KiB compact-attribute limit
  std::vector<std::pair<std::string, Tensor>> params = {
      {"0.weight", Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2})},
      {"block/1.bias", Tensor::from_vector<float>({-1, 1}, {2})}};
  std::vector<std::pair<std::string, Tensor>> buffers = {
      {"2.running_var", Tensor::from_vector<float>({0.5f}, {1})}};
  export_parameters(file, params, buffers, {{"model_spec", "linear:2"}, {"structure", structure}});

  const ExportedParameters back = read_exported_parameters(file);
  ASSERT_EQ(back.params.size(), 2u);
  EXPECT_EQ(back.params[1].first, "block/1.bias");
  EXPECT_EQ(back.params[0].second.shape(), (Shape{3, 2}));
  EXPECT_EQ(back.params[0].second.to_vector<float>(), params[0].second.to_vector<float>());
  ASSERT_EQ(back.buffers.size(), 1u);
  EXPECT_EQ(back.buffers[0].second.to_vector<float>(), std::vector<float>{0.5f});
  EXPECT_EQ(back.attrs.at("model_spec"), "linear:2");
  EXPECT_EQ(back.attrs.at("structure"), structure);

  // Other tools open the dataset by its documented path with no lockstep code.
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  hid_t d = H5Dopen2(f, "/parameters/0.weight", H5P_DEFAULT);
  ASSERT_GE(d, 0);
  float values[6] = {};
  ASSERT_GE(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values), 0);
  EXPECT_EQ(values[5], 6.0f);
  H5Dclose(d);
  H5Fclose(f);
}

TEST_F(CheckpointTest, ModelComposedInCppResumesBitwiseFromItsNamedTensors) {
  // examples/custom_model's network, with a layer of its own: saved and restored by parameter
  // name like a spec-built model, so two more steps after the restore equal two more steps of the
  // run that never stopped.
  ops::Context ctx(Device::cpu(), 1);
  nn::SoftmaxCrossEntropy loss;
  auto train = [&](nn::Model& m, optim::Sgd& sgd, int from, int to) {
    for (int step = from; step < to; ++step) {
      test::SyntheticBatch b = test::synthetic_batch(8, {1, 8, 8}, 4, step);
      m.zero_grad(ctx);
      loss.forward(ctx, m.forward(ctx, b.x), b.y);
      m.backward(ctx, loss.backward(ctx, 1.0f / 8));
      sgd.step(ctx);
    }
  };
  nn::Model uninterrupted(custom_model::custom_network(8, 4, 6, 4), {1, 8, 8}, 4, /*seed=*/1);
  optim::Sgd sgd(uninterrupted.parameters(), {.lr = 0.1f, .momentum = 0.9f});
  train(uninterrupted, sgd, 0, 2);
  TrainState saved(uninterrupted, sgd, RunLayout{});
  saved.step = 2;
  const std::string file = saved.save(dir_.string(), 1);

  nn::Model resumed(custom_model::custom_network(8, 4, 6, 4), {1, 8, 8}, 4, /*seed=*/9);
  optim::Sgd resumed_sgd(resumed.parameters(), {.lr = 0.1f, .momentum = 0.9f});
  TrainState restored(resumed, resumed_sgd, RunLayout{});
  restored.restore(ctx, read_checkpoint(file), file);
  EXPECT_EQ(restored.step, 2);
  EXPECT_EQ(test::parameter_values(resumed), test::parameter_values(uninterrupted));
  train(uninterrupted, sgd, 2, 4);
  train(resumed, resumed_sgd, 2, 4);
  EXPECT_EQ(test::parameter_values(resumed), test::parameter_values(uninterrupted));
}

// A GPT whose 40-token table is padded to 128 rows (the default) is saved without the padding:
// parameters and AdamW's moments as 40 rows, so the file is what a model without padding writes
// (and what lockstep wrote before it padded vocabularies). The padded model resumes from both.
TEST_F(CheckpointTest, APaddedTokenTableIsStoredAsTheVocabularysRowsAndResumesFromThem) {
  ops::Context ctx(Device::cpu(), 1);
  const std::int64_t vocab = 40, t = 16;
  auto build = [&](const char* spec) { return nn::Model::build(spec, {t}, vocab, 3); };
  auto adamw = [](nn::Model& m) { return optim::AdamW(m.parameters(), {.lr = 1e-2f}); };
  auto train = [&](nn::Model& m, optim::AdamW& opt, int from, int to) {
    nn::SoftmaxCrossEntropy loss = nn::SoftmaxCrossEntropy::for_training(m);
    for (int step = from; step < to; ++step) {
      std::vector<std::int32_t> ids(2 * (t + 1));
      for (std::size_t i = 0; i < ids.size(); ++i)
        ids[i] = static_cast<std::int32_t>((i * 7 + static_cast<std::size_t>(step) * 3) % vocab);
      Tensor x =
          Tensor::from_vector(std::vector<std::int32_t>(ids.begin(), ids.begin() + 2 * t), {2, t});
      Tensor y =
          Tensor::from_vector(std::vector<std::int32_t>(ids.begin() + 1, ids.end() - 1), {2 * t});
      opt.flat_params()->zero_grad(ctx);
      m.forward_loss(ctx, x, y, loss, 1.0f / (2 * t));
      m.backward_loss(ctx);
      opt.step(ctx);
    }
  };
  auto vocabulary_rows = [](const nn::Model& m) {
    std::vector<std::vector<float>> out;
    for (const nn::Parameter* p : m.parameters())
      out.push_back(nn::unpadded(*p, p->value).to_vector<float>());
    return out;
  };
  nn::Model padded = build("gpt(layers=1,heads=2,dim=8)");
  ASSERT_EQ(padded.parameters()[0]->value.dim(0), 128);
  optim::AdamW opt = adamw(padded);
  train(padded, opt, 0, 2);
  TrainState saved(padded, opt, RunLayout{});
  saved.step = 2;
  const std::string file = saved.save(dir_.string(), 1);
  const CheckpointState c = read_checkpoint(file);
  EXPECT_EQ(c.tensor("param/0.wte").shape(), (Shape{vocab, 8}));
  EXPECT_EQ(c.tensor("optim/0.wte.exp_avg").shape(), (Shape{vocab, 8}));
  EXPECT_EQ(c.tensor("optim/0.wte.exp_avg_sq").shape(), (Shape{vocab, 8}));

  nn::Model resumed = build("gpt(layers=1,heads=2,dim=8)");
  optim::AdamW resumed_opt = adamw(resumed);
  TrainState restored(resumed, resumed_opt, RunLayout{});
  restored.restore(ctx, c, file);
  EXPECT_EQ(test::parameter_values(resumed), test::parameter_values(padded));  // padding: zeros
  train(padded, opt, 2, 4);
  train(resumed, resumed_opt, 2, 4);
  EXPECT_EQ(test::parameter_values(resumed), test::parameter_values(padded));

  // The same run without padding writes the same tensors (one chunk of 32 rows: bitwise), under
  // the structure lockstep wrote before padding, which the padded model's still is.
  nn::Model plain = build("gpt(layers=1,heads=2,dim=8,pad_vocab=1)");
  optim::AdamW plain_opt = adamw(plain);
  train(plain, plain_opt, 0, 2);
  CheckpointState old = TrainState(plain, plain_opt, RunLayout{}).to_checkpoint();
  std::string structure = old.model_structure;
  structure.replace(structure.find(",pad_vocab=1"), 12, "");
  EXPECT_EQ(structure, padded.structure());
  old.model_structure = structure;
  old.step = 2;
  for (const auto& [name, tensor] : old.tensors)
    EXPECT_EQ(tensor.to_vector<float>(), c.tensor(name).to_vector<float>()) << name;
  nn::Model from_old = build("gpt(layers=1,heads=2,dim=8)");
  optim::AdamW from_old_opt = adamw(from_old);
  TrainState(from_old, from_old_opt, RunLayout{}).restore(ctx, old, "old.h5");
  train(plain, plain_opt, 2, 4);
  train(from_old, from_old_opt, 2, 4);
  EXPECT_EQ(vocabulary_rows(from_old), vocabulary_rows(plain));
  const std::vector<float> table = from_old.parameters()[0]->value.to_vector<float>();
  EXPECT_TRUE(std::all_of(table.begin() + vocab * 8, table.end(), [](float v) { return v == 0; }))
      << "the padding rows changed";
}

TEST(CheckpointResume, PositionInEpochIsKeptInSamples) {
  // 17 batches of 64 = 1088 samples: with batches of 32, 34 of them; of 128, 8 (1024 samples:
  // 64 are seen again rather than skipped).
  EXPECT_EQ(rescale_batch_in_epoch(17, 64, 64), 17);
  EXPECT_EQ(rescale_batch_in_epoch(17, 64, 32), 34);
  EXPECT_EQ(rescale_batch_in_epoch(17, 64, 128), 8);
  EXPECT_THROW(rescale_batch_in_epoch(1, 0, 64), Error);
}

TEST(CheckpointHash, Crc32MatchesTheStandardCheckValue) {
  // CRC-32/ISO-HDLC's published check value (CRC of "123456789"), as zlib.crc32 gives.
  EXPECT_EQ(detail::crc32("123456789", 9), 0xCBF43926u);
  EXPECT_EQ(detail::crc32("", 0), 0u);
  // Chaining equals hashing the concatenation.
  EXPECT_EQ(detail::crc32("6789", 4, detail::crc32("12345", 5)), 0xCBF43926u);
}
