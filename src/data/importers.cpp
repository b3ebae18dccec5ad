#include "lockstep/data/importers.hpp"

#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>

namespace lockstep::data {

namespace {
constexpr const char* kIdxHint =
    "expected an idx file as distributed for MNIST / Fashion-MNIST (raw or .gz); download it again";

// gzopen/gzread read gzip and plain files alike.
struct GzFile {
  gzFile f = nullptr;
  std::string path;
  explicit GzFile(const std::string& p) : f(gzopen(p.c_str(), "rb")), path(p) {
    std::error_code ec;
    LOCKSTEP_CHECK_HINT(std::filesystem::is_regular_file(p, ec), kIdxHint, p, ": no such file");
    LOCKSTEP_CHECK(f != nullptr, p, ": cannot open for reading");
  }
  ~GzFile() {
    if (f) gzclose(f);
  }
  // Reads up to `bytes`; returns how many arrived. A corrupt gzip stream is an error.
  std::size_t read(void* out, std::size_t bytes) {
    std::size_t got = 0;
    auto* p = static_cast<char*>(out);
    while (got < bytes) {
      const auto want = static_cast<unsigned>(std::min<std::size_t>(bytes - got, 1u << 30));
      int r = gzread(f, p + got, want);
      if (r < 0) {
        int code = 0;
        const char* msg = gzerror(f, &code);
        LOCKSTEP_FAIL_HINT(kIdxHint, path, ": corrupted gzip data (", msg, ")");
      }
      if (r == 0) break;
      got += static_cast<std::size_t>(r);
    }
    return got;
  }
};

std::uint32_t big_endian(const unsigned char* b) {
  return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) |
         b[3];
}

std::string trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '"'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '"' || s.back() == '\r'))
    s.remove_suffix(1);
  return std::string(s);
}

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    std::size_t comma = line.find(',', start);
    out.push_back(trim(std::string_view(line).substr(
        start, comma == std::string::npos ? std::string::npos : comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

bool parse_double(const std::string& s, double& v) {
  if (s.empty()) return false;
  const char* b = s.data();
  if (*b == '+') ++b;
  auto [p, ec] = std::from_chars(b, s.data() + s.size(), v);
  return ec == std::errc() && p == s.data() + s.size();
}
}  // namespace

Tensor read_idx_u8(const std::string& path) {
  GzFile in(path);
  unsigned char head[4];
  LOCKSTEP_CHECK_HINT(in.read(head, 4) == 4, kIdxHint, path,
                      ": truncated (shorter than the 4-byte idx header)");
  LOCKSTEP_CHECK_HINT(head[0] == 0 && head[1] == 0 && head[3] >= 1 && head[3] <= 4, kIdxHint, path,
                      ": bad magic ", static_cast<int>(head[0]), ",", static_cast<int>(head[1]),
                      ",", static_cast<int>(head[2]), ",", static_cast<int>(head[3]),
                      " (not an idx file)");
  LOCKSTEP_CHECK_HINT(head[2] == 0x08, kIdxHint, path, ": idx element type 0x", std::hex,
                      static_cast<int>(head[2]), " is not unsigned byte (0x08)");
  Shape shape;
  std::uint64_t promised = 1;  // up to four 32-bit extents: the product can overflow 64 bits
  bool overflow = false;
  for (int d = 0; d < head[3]; ++d) {
    unsigned char b[4];
    LOCKSTEP_CHECK_HINT(in.read(b, 4) == 4, kIdxHint, path, ": truncated in the idx header");
    shape.push_back(big_endian(b));
    overflow =
        overflow || __builtin_mul_overflow(promised, std::uint64_t{big_endian(b)}, &promised);
  }
  // The header alone must not decide how much memory is taken (16 bytes can promise terabytes):
  // read in blocks that double from 1 MiB, so memory grows only with data that is actually there.
  std::vector<unsigned char> bytes;
  std::size_t got = 0;
  while (!overflow && got < promised) {
    const std::size_t block = std::max<std::size_t>(got, std::size_t{1} << 20);
    bytes.resize(got + static_cast<std::size_t>(std::min<std::uint64_t>(promised - got, block)));
    const std::size_t n = in.read(bytes.data() + got, bytes.size() - got);
    got += n;
    if (n == 0) break;
  }
  LOCKSTEP_CHECK_HINT(!overflow && got == promised, kIdxHint, path,
                      ": truncated: the header promises ", shape_str(shape), " = ",
                      overflow ? std::string("more than 2^64") : std::to_string(promised),
                      " bytes of data but the file has ", got);
  unsigned char extra;
  LOCKSTEP_CHECK_HINT(in.read(&extra, 1) == 0, kIdxHint, path, ": more data than the header's ",
                      shape_str(shape), " = ", promised,
                      " bytes (a wrong count in the header, or two files joined?)");
  Tensor t = Tensor::empty(shape, DType::U8);
  if (got > 0) std::memcpy(t.raw_data(), bytes.data(), got);
  return t;
}

LabeledArray read_idx_pair(const std::string& images_path, const std::string& labels_path) {
  Tensor images = read_idx_u8(images_path);
  Tensor labels = read_idx_u8(labels_path);
  LOCKSTEP_CHECK_HINT(images.ndim() == 3, kIdxHint, images_path,
                      ": images must be idx3 [n, rows, cols], found ", shape_str(images.shape()));
  LOCKSTEP_CHECK_HINT(labels.ndim() == 1, kIdxHint, labels_path,
                      ": labels must be idx1 [n], found ", shape_str(labels.shape()));
  LOCKSTEP_CHECK_HINT(images.dim(0) == labels.dim(0),
                      "pass the labels file that belongs to the images", images_path, " has ",
                      images.dim(0), " images but ", labels_path, " has ", labels.dim(0),
                      " labels");
  LabeledArray out;
  out.x = images.view({images.dim(0), 1, images.dim(1), images.dim(2)});
  const auto* l = labels.data<std::uint8_t>();
  out.y.assign(l, l + labels.numel());
  for (auto v : out.y)
    out.num_classes = std::max<std::int64_t>(out.num_classes, v + 1);
  return out;
}

LabeledArray read_csv(const std::string& path, const CsvOptions& options) {
  LOCKSTEP_CHECK(options.dtype == DType::U8 || options.dtype == DType::F32, path,
                 ": CSV samples are stored as u8 or f32, not ", dtype_name(options.dtype));
  LOCKSTEP_CHECK_HINT(!options.sample_shape.empty(), "pass --shape=C,H,W (or --shape=N)", path,
                      ": no sample shape given");
  std::ifstream in(path);
  std::error_code ec;
  LOCKSTEP_CHECK(std::filesystem::is_regular_file(path, ec) && in.good(), path,
                 ": no such file or not readable");
  const std::int64_t features = shape_numel(options.sample_shape);

  std::vector<std::string> header;
  std::int64_t label_col = -1;
  std::vector<double> values;
  std::vector<std::int32_t> labels;
  std::string line;
  std::int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (trim(line).empty()) continue;
    auto fields = split_csv(line);
    if (line_no == 1) {
      double v;
      bool numeric = std::all_of(fields.begin(), fields.end(),
                                 [&](const auto& f) { return parse_double(f, v); });
      if (!numeric) {
        header = fields;
        continue;
      }
    }
    if (label_col < 0) {
      const auto& k = options.label_column;
      if (!k.empty() &&
          std::all_of(k.begin(), k.end(), [](unsigned char ch) { return std::isdigit(ch); })) {
        // from_chars, not stoll: a 20-digit column must be this error, not std::out_of_range.
        auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), label_col);
        LOCKSTEP_CHECK(ec == std::errc() && end == k.data() + k.size(), path, ": label column ", k,
                       " does not exist");
      } else {
        auto it = std::find(header.begin(), header.end(), k);
        LOCKSTEP_CHECK_HINT(
            it != header.end(), "give the label column as a 0-based index or a header name", path,
            ": no column named '", k, "'", header.empty() ? " (the file has no header row)" : "");
        label_col = it - header.begin();
      }
      LOCKSTEP_CHECK(label_col < static_cast<std::int64_t>(fields.size()), path, ": label column ",
                     label_col, " does not exist (line ", line_no, " has ", fields.size(),
                     " columns)");
    }
    LOCKSTEP_CHECK_HINT(static_cast<std::int64_t>(fields.size()) == features + 1,
                        "--shape must account for every column but the label", path, " line ",
                        line_no, ": ", fields.size(), " columns, expected 1 label + ", features,
                        " features for sample shape ", shape_str(options.sample_shape));
    for (std::size_t c = 0; c < fields.size(); ++c) {
      double v;
      LOCKSTEP_CHECK(parse_double(fields[c], v), path, " line ", line_no, " column ", c, ": '",
                     fields[c], "' is not a number");
      if (static_cast<std::int64_t>(c) == label_col) {
        LOCKSTEP_CHECK(v >= 0 && v == std::floor(v) && v < 2147483647.0, path, " line ", line_no,
                       " column ", c, ": label '", fields[c], "' is not a non-negative integer");
        labels.push_back(static_cast<std::int32_t>(v));
      } else {
        // from_chars reads "nan" and "inf"; a NaN would poison the statistics and every step.
        LOCKSTEP_CHECK_HINT(std::isfinite(v), "fix or drop the row", path, " line ", line_no,
                            " column ", c, ": '", fields[c], "' is not a finite number");
        LOCKSTEP_CHECK_HINT(
            options.dtype != DType::F32 || std::fabs(v) <= std::numeric_limits<float>::max(),
            "rescale the data", path, " line ", line_no, " column ", c, ": '", fields[c],
            "' is outside the range of f32 (it would be stored as inf)");
        LOCKSTEP_CHECK_HINT(
            options.dtype != DType::U8 || (v >= 0 && v <= 255 && v == std::floor(v)),
            "store such data with --dtype=f32", path, " line ", line_no, " column ", c, ": '",
            fields[c], "' is not an integer in 0..255");
        values.push_back(v);
      }
    }
  }
  LOCKSTEP_CHECK(!labels.empty(), path, ": no data rows");
  LabeledArray out;
  const auto n = static_cast<std::int64_t>(labels.size());
  Shape shape{n};
  shape.insert(shape.end(), options.sample_shape.begin(), options.sample_shape.end());
  out.x = Tensor::empty(shape, options.dtype);
  if (options.dtype == DType::U8) {
    auto* p = out.x.data<std::uint8_t>();
    for (std::size_t i = 0; i < values.size(); ++i)
      p[i] = static_cast<std::uint8_t>(values[i]);
  } else {
    auto* p = out.x.data<float>();
    for (std::size_t i = 0; i < values.size(); ++i)
      p[i] = static_cast<float>(values[i]);
  }
  out.y = std::move(labels);
  std::int64_t max_label = *std::max_element(out.y.begin(), out.y.end());
  if (options.num_classes > 0) {
    LOCKSTEP_CHECK_HINT(max_label < options.num_classes, "raise --classes", path, ": label ",
                        max_label, " is outside [0, ", options.num_classes, ")");
    out.num_classes = options.num_classes;
  } else {
    out.num_classes = max_label + 1;
  }
  return out;
}

void channel_stats(const Tensor& x, std::vector<float>& mean, std::vector<float>& stddev) {
  LOCKSTEP_CHECK(
      x.ndim() >= 2 && x.device().is_cpu() && (x.dtype() == DType::U8 || x.dtype() == DType::F32),
      "channel_stats needs a host u8/f32 tensor [n, C, ...], got ", x.describe());
  const std::int64_t n = x.dim(0), c = x.dim(1),
                     inner = x.numel() / std::max<std::int64_t>(1, n * c);
  const double scale = x.dtype() == DType::U8 ? 1.0 / 255.0 : 1.0;
  auto value = [&](std::int64_t i) {
    return x.dtype() == DType::U8 ? x.data<std::uint8_t>()[i] * scale : double(x.data<float>()[i]);
  };
  std::vector<double> sum(c, 0.0), sq(c, 0.0);
  for (std::int64_t s = 0; s < n; ++s)
    for (std::int64_t ch = 0; ch < c; ++ch)
      for (std::int64_t k = 0, base = (s * c + ch) * inner; k < inner; ++k)
        sum[ch] += value(base + k);
  const double count = double(n) * double(inner);
  for (std::int64_t ch = 0; ch < c; ++ch)
    sum[ch] /= count;  // now the mean
  // Second pass around the mean: no cancellation, unlike E[x^2] - E[x]^2.
  for (std::int64_t s = 0; s < n; ++s)
    for (std::int64_t ch = 0; ch < c; ++ch)
      for (std::int64_t k = 0, base = (s * c + ch) * inner; k < inner; ++k) {
        double d = value(base + k) - sum[ch];
        sq[ch] += d * d;
      }
  mean.resize(c);
  stddev.resize(c);
  for (std::int64_t ch = 0; ch < c; ++ch) {
    mean[ch] = static_cast<float>(sum[ch]);
    // A constant channel would divide by zero in normalisation; 1 leaves it merely centred.
    double sd = std::sqrt(sq[ch] / count);
    stddev[ch] = sd > 0 ? static_cast<float>(sd) : 1.0f;
  }
}

std::vector<std::string> write_shard_set(const LabeledArray& data, const std::string& out_dir,
                                         const std::string& name, std::int64_t num_shards,
                                         const std::vector<float>& mean,
                                         const std::vector<float>& stddev,
                                         ShardWriterOptions options) {
  const std::int64_t n = data.x.dim(0);
  LOCKSTEP_CHECK(static_cast<std::int64_t>(data.y.size()) == n, name, ": ", n, " samples but ",
                 data.y.size(), " labels");
  LOCKSTEP_CHECK_HINT(num_shards >= 1 && num_shards <= n, "use fewer shards", name,
                      ": cannot split ", n, " samples into ", num_shards, " non-empty shards");
  std::filesystem::create_directories(out_dir);
  ShardMeta meta;
  meta.num_shards = num_shards;
  meta.num_classes = data.num_classes;
  meta.sample_shape = Shape(data.x.shape().begin() + 1, data.x.shape().end());
  meta.dtype = data.x.dtype();
  meta.mean = mean;
  meta.stddev = stddev;
  meta.class_names = data.class_names;
  std::vector<std::string> paths;
  const Tensor y = Tensor::from_vector(data.y, {n});
  for (std::int64_t s = 0; s < num_shards; ++s) {
    const std::int64_t begin = s * n / num_shards, end = (s + 1) * n / num_shards;
    meta.shard_index = s;
    auto path = (std::filesystem::path(out_dir) / shard_file_name(name, s, num_shards)).string();
    ShardWriter w(path, meta, options);
    w.append(data.x.slice(begin, end), y.slice(begin, end));
    w.close();
    paths.push_back(path);
  }
  return paths;
}

}  // namespace lockstep::data
