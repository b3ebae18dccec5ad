// Writes the seed inputs of every fuzz target into DIR/<target>/ (bench/fuzz.sh runs it once
// before the first fuzzing run; the minimised corpus under tests/fuzz/corpus/ grew from these).
// Seeds are small valid inputs made by lockstep's own writers, so the fuzzer starts from files
// that get past the first checks.
//   fuzz_make_seeds DIR
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/data_test_util.hpp"
#include "lockstep/data/shard.hpp"
#include "lockstep/train/checkpoint.hpp"

using namespace lockstep;
namespace fs = std::filesystem;

namespace {
const std::string kSep = "\n--8<--\n";

void put(const fs::path& dir, const std::string& name, const std::string& bytes) {
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary).write(bytes.data(), bytes.size());
}
std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
std::string idx(const std::vector<std::uint32_t>& dims, std::uint8_t fill) {
  std::string out{'\0', '\0', '\x08', static_cast<char>(dims.size())};
  std::size_t n = 1;
  for (auto d : dims) {
    n *= d;
    for (int s = 24; s >= 0; s -= 8)
      out.push_back(static_cast<char>((d >> s) & 0xff));
  }
  for (std::size_t i = 0; i < n; ++i)
    out.push_back(static_cast<char>(fill + i % 3));
  return out;
}
std::string gzip(const std::string& raw, const fs::path& scratch) {
  gzFile f = gzopen(scratch.c_str(), "wb9");
  gzwrite(f, raw.data(), static_cast<unsigned>(raw.size()));
  gzclose(f);
  return slurp(scratch);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_seeds DIR\n");
    return 2;
  }
  const fs::path out = argv[1];
  const fs::path scratch = out / ".scratch";
  fs::create_directories(scratch);

  // idx: an idx3 file, an idx1 file, a gzipped one, and a pair.
  put(out / "idx", "images3", idx({2, 3, 3}, 1));
  put(out / "idx", "labels1", idx({4}, 0));
  put(out / "idx", "images3.gz", gzip(idx({2, 2, 2}, 5), scratch / "x.gz"));
  put(out / "idx", "pair", idx({3, 2, 2}, 9) + kSep + idx({3}, 0));

  // csv: byte 0 selects dtype/label column/classes, byte 1 the sample shape (fuzz_csv.cpp).
  put(out / "csv", "f32_header", std::string("\x04\x01") + "p0,p1,label\n0.5,1e-3,1\n-2,3,0\n");
  put(out / "csv", "u8_index", std::string("\x09\x01") + "1,255,4\n0,0,9\r\n");
  put(out / "csv", "f32_quoted", std::string("\x00\x02", 2) + "\"2\", 0.25 ,+1,-0\n\n1,2,3,4\n");

  // config: the repository's configs and overrides.
  put(out / "config", "overrides",
      "[train]\nepochs = 2\nseed = 5\n[optim]\nname = adamw\nlr = 1e-3\n" + kSep +
          "optim.schedule=cosine\ndata.test=\nlog.every=10\n");
  put(out / "config", "bools", "[train]\neval = off\n[optim]\nnesterov = yes\nmomentum = 0.5\n");
  for (const char* name : {"ci_tiny.ini", "fashion_cnn.ini"}) {
    const fs::path src = fs::path(LOCKSTEP_SOURCE_DIR) / "configs" / name;
    if (fs::exists(src)) put(out / "config", name, slurp(src));
  }

  // model_spec: byte 0 the sample shape, byte 1 the classes (fuzz_model_spec.cpp).
  put(out / "model_spec", "mlp", std::string("\x02\x09") + "mlp:16,8");
  put(out / "model_spec", "lenet", std::string("\x06\x09") + "lenet");
  put(out / "model_spec", "resnet", std::string("\x01\x03") + "resnet:1");
  put(out / "model_spec", "layers",
      std::string("\x00\x04", 2) +
          "conv(4,3,pad=1)-bn-relu-maxpool(2)-conv(out=6, k=3, stride=1, bias=0)-gelu-"
          "avgpool(2,stride=1)-dropout(0.25)-gap-linear(5)");
  put(out / "model_spec", "res", std::string("\x03\x01") + "res(4,2)-res(4)-flatten-linear(2)");

  // shard: u8 with statistics, f32 deflated and shuffled with several chunks (an uncompressed
  // chunked /y would take a whole 64 KiB label chunk), and a contiguous one written with raw
  // HDF5 calls, its format attribute a variable-length string as h5py writes it.
  {
    data::ShardMeta m;
    m.num_classes = 3;
    m.sample_shape = {1, 2, 2};
    m.mean = {0.5f};
    m.stddev = {0.25f};
    data::ShardWriterOptions o;
    o.deflate_level = 1;
    o.chunk_samples = 2;
    const fs::path p = scratch / "u8.h5";
    data::ShardWriter w(p.string(), m, o);
    std::vector<std::uint8_t> x(5 * 4);
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] = static_cast<std::uint8_t>(i * 13);
    std::vector<std::int32_t> y{0, 1, 2, 1, 0};
    w.append(x.data(), y.data(), 5);
    w.close();
    put(out / "shard", "u8", slurp(p));
  }
  {
    data::ShardMeta m;
    m.num_classes = 2;
    m.sample_shape = {3};
    m.dtype = DType::F32;
    data::ShardWriterOptions o;
    o.deflate_level = 6;
    o.chunk_samples = 3;
    const fs::path p = scratch / "f32.h5";
    data::ShardWriter w(p.string(), m, o);
    std::vector<float> x{0.5f, -1, 2, 3, 4, 5, 1e-3f, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};
    std::vector<std::int32_t> y{0, 1, 1, 0, 1, 0};
    w.append(x.data(), y.data(), 6);
    w.close();
    put(out / "shard", "f32_deflate", slurp(p));
  }
  {
    data::testing::RawShard raw;
    raw.variable_length_format = true;
    raw.mean = {0.5f};
    raw.stddev = {0.2f};
    const fs::path p = scratch / "raw.h5";
    data::testing::write_raw_shard(p.string(), raw);
    put(out / "shard", "contiguous", slurp(p));
  }

  // checkpoint: a small checkpoint and a parameter export.
  {
    train::CheckpointState s;
    s.step = 12;
    s.epoch = 1;
    s.batch_in_epoch = 3;
    s.world_size = 2;
    s.config_ini = "[train]\nseed = 7\n";
    s.model_structure = "spec flatten-linear(2)\n";
    s.attrs = {{"rng", "philox:7:12"}, {"a/b", "c"}};
    s.tensors = {{"param/0.weight", Tensor::from_vector<float>({1, -2, 3, 4}, {2, 2})},
                 {"param/0.bias", Tensor::from_vector<float>({0.5f, 0}, {2})},
                 {"optim/step", Tensor::from_vector<std::int32_t>({12}, {})},
                 {"buffer/mask", Tensor::from_vector<std::uint8_t>({1, 0, 1}, {3})}};
    const fs::path p = scratch / "ckpt-00000012.h5";
    train::write_checkpoint(p.string(), s);
    put(out / "checkpoint", "checkpoint", slurp(p));
    const fs::path e = scratch / "export.h5";
    train::export_parameters(e.string(), {s.tensors[0], s.tensors[1]}, {s.tensors[3]},
                             {{"model_spec", "linear(2)"}});
    put(out / "checkpoint", "export", slurp(e));
  }
  fs::remove_all(scratch);
  std::printf("seeds written to %s\n", out.c_str());
  return 0;
}
