#include "lockstep/data/cifar.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "lockstep/core/error.hpp"
#include "lockstep/core/file.hpp"

namespace lockstep::data {

namespace {

constexpr const char* kCifarHint =
    "expected the binary version of CIFAR (cifar-10-binary.tar.gz or cifar-100-binary.tar.gz, "
    "extracted): download it again";
constexpr std::int64_t kPixels = 3 * 32 * 32;

std::vector<char> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LOCKSTEP_CHECK_HINT(in.good(), kCifarHint, path, ": cannot open: ", errno_text());
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Appends the records of `files` (label bytes first, the label used at `label_byte`).
LabeledArray read_records(const std::vector<std::string>& files, int label_bytes, int label_byte,
                          std::int64_t num_classes) {
  const std::int64_t record = label_bytes + kPixels;
  std::vector<std::vector<char>> contents;
  std::int64_t n = 0;
  for (const auto& f : files) {
    contents.push_back(read_all(f));
    const auto size = static_cast<std::int64_t>(contents.back().size());
    LOCKSTEP_CHECK_HINT(size > 0 && size % record == 0, kCifarHint, f, ": ", size,
                        " bytes is not a whole number of ", record, "-byte records (", label_bytes,
                        " label byte(s) and 3072 pixels): truncated, or not ",
                        label_bytes == 1 ? "CIFAR-10" : "CIFAR-100");
    n += size / record;
  }
  LabeledArray out;
  out.x = Tensor::empty({n, 3, 32, 32}, DType::U8);
  out.y.resize(static_cast<std::size_t>(n));
  out.num_classes = num_classes;
  auto* x = out.x.data<std::uint8_t>();
  std::int64_t i = 0;
  for (std::size_t f = 0; f < files.size(); ++f) {
    const auto& bytes = contents[f];
    for (std::int64_t r = 0; r < static_cast<std::int64_t>(bytes.size()) / record; ++r, ++i) {
      const char* rec = bytes.data() + r * record;
      const int label = static_cast<unsigned char>(rec[label_byte]);
      LOCKSTEP_CHECK_HINT(label < num_classes, kCifarHint, files[f], ": record ", r, " has label ",
                          label, ", outside [0, ", num_classes, ")");
      out.y[static_cast<std::size_t>(i)] = label;
      std::memcpy(x + i * kPixels, rec + label_bytes, kPixels);
    }
  }
  return out;
}

// One name a line (trailing blank lines dropped); empty when the file is absent.
std::vector<std::string> read_names(const std::string& path, std::int64_t expected) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return {};
  std::ifstream in(path);
  std::vector<std::string> names;
  for (std::string line; std::getline(in, line);) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' '))
      line.pop_back();
    names.push_back(line);
  }
  while (!names.empty() && names.back().empty())
    names.pop_back();
  LOCKSTEP_CHECK_HINT(static_cast<std::int64_t>(names.size()) == expected, kCifarHint, path,
                      ": has ", names.size(), " class names, expected ", expected);
  return names;
}

}  // namespace

CifarSplits read_cifar(const std::string& dir, bool coarse) {
  namespace fs = std::filesystem;
  auto at = [&](const char* name) { return (fs::path(dir) / name).string(); };
  std::error_code ec;
  CifarSplits s;
  if (fs::exists(at("data_batch_1.bin"), ec)) {
    LOCKSTEP_CHECK_HINT(!coarse, "--labels=coarse is for CIFAR-100", dir,
                        " holds CIFAR-10, which has no coarse labels");
    s.kind = "cifar-10";
    std::vector<std::string> train;
    for (int b = 1; b <= 5; ++b) {
      train.push_back(at(("data_batch_" + std::to_string(b) + ".bin").c_str()));
      LOCKSTEP_CHECK_HINT(fs::exists(train.back(), ec), kCifarHint, train.back(),
                          " is missing (CIFAR-10 has five training batches)");
    }
    s.train = read_records(train, 1, 0, 10);
    s.test = read_records({at("test_batch.bin")}, 1, 0, 10);
    s.train.class_names = read_names(at("batches.meta.txt"), 10);
  } else if (fs::exists(at("train.bin"), ec)) {
    s.kind = "cifar-100";
    const std::int64_t k = coarse ? 20 : 100;
    s.train = read_records({at("train.bin")}, 2, coarse ? 0 : 1, k);
    s.test = read_records({at("test.bin")}, 2, coarse ? 0 : 1, k);
    s.train.class_names =
        read_names(at(coarse ? "coarse_label_names.txt" : "fine_label_names.txt"), k);
  } else {
    LOCKSTEP_FAIL_HINT(kCifarHint, dir,
                       " holds neither CIFAR-10's data_batch_1.bin nor CIFAR-100's train.bin");
  }
  s.test.class_names = s.train.class_names;
  return s;
}

}  // namespace lockstep::data
