#include "lockstep/data/image_folder.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <exception>
#include <filesystem>
#include <fstream>

#include "lockstep/core/error.hpp"
#include "lockstep/core/file.hpp"
#include "lockstep/core/thread_pool.hpp"

namespace lockstep::data {

namespace fs = std::filesystem;

namespace {

bool is_image_name(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const char* ext : kImageExtensions) {
    const std::string e = ext;
    if (lower.size() > e.size() && lower.compare(lower.size() - e.size(), e.size(), e) == 0)
      return true;
  }
  return false;
}

bool hidden(const fs::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name[0] == '.';
}

// Every non-hidden file under dir (symlinks followed), sorted by path.
std::vector<fs::path> files_under(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  auto it =
      fs::recursive_directory_iterator(dir, fs::directory_options::follow_directory_symlink, ec);
  LOCKSTEP_CHECK(!ec, dir.string(), ": cannot list: ", ec.message());
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    LOCKSTEP_CHECK(!ec, dir.string(), ": cannot list: ", ec.message());
    if (hidden(it->path())) {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    // Not a directory: a file, or something that will fail to read (a dangling link) and be
    // reported by the decoder, naming it.
    if (!it->is_directory(ec)) files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

ImageList list_image_folder(const std::string& root, bool allow_empty_classes) {
  std::error_code ec;
  LOCKSTEP_CHECK_HINT(fs::is_directory(root, ec),
                      "--root must be a folder with one subfolder per class", root,
                      fs::exists(root, ec) ? " is not a folder" : " does not exist");
  ImageList list;
  std::vector<fs::path> classes;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    if (hidden(entry.path())) continue;
    if (entry.is_directory(ec))
      classes.push_back(entry.path());
    else
      ++list.ignored_files, list.ignored_example = entry.path().string();
  }
  LOCKSTEP_CHECK(!ec, root, ": cannot list: ", ec.message());
  std::sort(classes.begin(), classes.end());
  LOCKSTEP_CHECK_HINT(!classes.empty(),
                      "an ImageFolder holds one subfolder per class: ROOT/cat/1.jpg", root,
                      " has no class folders");
  for (std::size_t k = 0; k < classes.size(); ++k) {
    const std::string name = classes[k].filename().string();
    LOCKSTEP_CHECK_HINT(name.find('\n') == std::string::npos, "rename the folder",
                        classes[k].string(), ": a class name cannot hold a newline");
    list.class_names.push_back(name);
    std::int64_t found = 0;
    for (const auto& file : files_under(classes[k])) {
      if (!is_image_name(file.filename().string())) {
        ++list.ignored_files, list.ignored_example = file.string();
        continue;
      }
      list.paths.push_back(file.string());
      list.labels.push_back(static_cast<std::int32_t>(k));
      ++found;
    }
    if (found == 0) {
      LOCKSTEP_CHECK_HINT(allow_empty_classes,
                          "add its images, remove the folder, or pass --skip-bad to keep the "
                          "class without samples",
                          "class folder ", classes[k].string(), " (class ", k,
                          ") holds no .jpg, .jpeg or .png file");
      list.empty_classes.push_back(classes[k].string());
    }
  }
  list.num_classes = static_cast<std::int64_t>(classes.size());
  LOCKSTEP_CHECK(!list.paths.empty(), root, ": no image files in any class folder");
  return list;
}

ImageList read_image_list(const std::string& list_file, const std::string& base,
                          std::int64_t num_classes) {
  std::ifstream in(list_file);
  LOCKSTEP_CHECK(in.good(), list_file, ": cannot open the list: ", errno_text());
  const fs::path dir = base.empty() ? fs::path(list_file).parent_path() : fs::path(base);
  ImageList list;
  std::string line;
  std::int64_t max_label = -1;
  for (std::int64_t n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    const auto comma = line.rfind(',');
    LOCKSTEP_CHECK_HINT(comma != std::string::npos && comma > 0, "each line is PATH,LABEL",
                        list_file, ", line ", n, ": '", line, "' has no PATH,LABEL");
    const std::string path = line.substr(0, comma), label = line.substr(comma + 1);
    long long value = -1;
    std::size_t used = 0;
    try {
      value = std::stoll(label, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    LOCKSTEP_CHECK_HINT(used == label.size() && !label.empty() && value >= 0 && value < (1ll << 31),
                        "labels are integers 0, 1, ...", list_file, ", line ", n, ": label '",
                        label, "' is not a non-negative integer");
    LOCKSTEP_CHECK_HINT(num_classes == 0 || value < num_classes, "raise --classes or fix the label",
                        list_file, ", line ", n, ": label ", value, " is outside [0, ", num_classes,
                        ")");
    const fs::path p(path);
    list.paths.push_back((p.is_absolute() ? p : dir / p).string());
    list.labels.push_back(static_cast<std::int32_t>(value));
    max_label = std::max<std::int64_t>(max_label, value);
  }
  LOCKSTEP_CHECK(!list.paths.empty(), list_file, ": the list names no image");
  list.num_classes = num_classes > 0 ? num_classes : max_label + 1;
  return list;
}

std::int64_t image_shard_begin(std::int64_t entries, std::int64_t shard, std::int64_t count) {
  return entries * shard / count;
}

ImageShard convert_image_shard(const ImageList& list, std::int64_t begin, std::int64_t end,
                               const std::string& path, const ShardMeta& meta,
                               const ImageShardOptions& options) {
  const std::int64_t side = options.side;
  LOCKSTEP_CHECK(meta.dtype == DType::U8 && meta.sample_shape == Shape({3, side, side}), path,
                 ": image shards hold u8 [3, ", side, ", ", side, "] samples");
  const bool encoded = options.storage == SampleStorage::Encoded;
  LOCKSTEP_CHECK(meta.storage == options.storage, path, ": the shard's storage is ",
                 sample_storage_name(meta.storage), " but the conversion's is ",
                 sample_storage_name(options.storage));
  LOCKSTEP_CHECK_HINT(!encoded || options.fit == ImageFit::CenterCrop,
                      "use --fit=crop with --store=encoded, or --store=raw with --fit=pad", path,
                      ": encoded storage is decoded by the loader with --fit=crop's resize "
                      "and center crop; --fit=",
                      image_fit_name(options.fit), " cannot be stored that way");
  ImageShard shard;
  shard.writer = std::make_unique<ShardWriter>(path, meta, options.writer);
  shard.sum.assign(3, 0);
  shard.sum_sq.assign(3, 0);
  const std::size_t sample_bytes = static_cast<std::size_t>(3 * side * side);
  // Blocks of images are decoded by the threads in parallel, each image into its own slot, then
  // taken in list order: the shard is the same for any thread count. One HDF5 write per block.
  ThreadPool pool(std::max(1, options.threads));
  const std::int64_t block = 16 * pool.size();
  std::vector<std::uint8_t> slots(static_cast<std::size_t>(block) * sample_bytes), x;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(block));
  std::vector<std::vector<std::uint8_t>> files(encoded ? static_cast<std::size_t>(block) : 0);
  std::vector<std::int64_t> original(files.size());  // the files' sizes before any re-encoding
  std::vector<std::int64_t> sizes;
  std::vector<std::int32_t> y;
  for (std::int64_t first = begin; first < end; first += block) {
    const std::int64_t n = std::min(block, end - first);
    pool.parallel_for(n, 1, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t k = b; k < e; ++k) {
        errors[static_cast<std::size_t>(k)] = nullptr;
        try {
          const std::string& file = list.paths[static_cast<std::size_t>(first + k)];
          if (encoded) {
            // The bytes stored are the bytes decoded: a file changing meanwhile cannot slip in.
            auto& bytes = files[static_cast<std::size_t>(k)];
            bytes = read_image_bytes(file);
            const Image image = decode_image(bytes.data(), bytes.size(), file, side);
            resize_to_square(image, side, options.fit, slots.data() + k * sample_bytes);
            original[static_cast<std::size_t>(k)] = static_cast<std::int64_t>(bytes.size());
            if (options.jpeg_restarts) {
              // Kept only if it decodes to the pixels the file does (it must: the same
              // coefficients), else the file's own bytes are stored: the file decoded, so a
              // re-encoding that does not is never reported as a bad file.
              auto recoded = jpeg_with_restarts(bytes.data(), bytes.size());
              bool same = false;
              try {
                same = !recoded.empty() &&
                       decode_image(recoded.data(), recoded.size(), file, side).rgb == image.rgb;
              } catch (const Error&) {
              }
              if (same) bytes = std::move(recoded);
            }
          } else {
            const Image image = read_image(file, side);
            resize_to_square(image, side, options.fit, slots.data() + k * sample_bytes);
          }
        } catch (const Error&) {
          errors[static_cast<std::size_t>(k)] = std::current_exception();
        }
      }
    });
    x.clear();
    y.clear();
    sizes.clear();
    for (std::int64_t k = 0; k < n; ++k) {
      if (const auto& error = errors[static_cast<std::size_t>(k)]) {
        if (!options.skip_bad) std::rethrow_exception(error);
        try {
          std::rethrow_exception(error);
        } catch (const Error& e) {
          shard.skipped.push_back(e.message());
        }
        continue;
      }
      const std::uint8_t* sample = slots.data() + k * sample_bytes;
      for (int c = 0; c < 3; ++c) {
        std::int64_t s = 0, s2 = 0;
        for (std::int64_t p = 0; p < side * side; ++p) {
          const std::int64_t v = sample[c * side * side + p];
          s += v;
          s2 += v * v;
        }
        shard.sum[static_cast<std::size_t>(c)] += s;
        shard.sum_sq[static_cast<std::size_t>(c)] += s2;
      }
      shard.pixels += side * side;
      if (encoded) {
        const auto& bytes = files[static_cast<std::size_t>(k)];
        x.insert(x.end(), bytes.begin(), bytes.end());
        sizes.push_back(static_cast<std::int64_t>(bytes.size()));
        shard.encoded_bytes += sizes.back();
        shard.file_bytes += original[static_cast<std::size_t>(k)];
      } else {
        x.insert(x.end(), sample, sample + sample_bytes);
      }
      y.push_back(list.labels[static_cast<std::size_t>(first + k)]);
    }
    if (encoded)
      shard.writer->append_encoded(x.data(), sizes.data(), y.data(),
                                   static_cast<std::int64_t>(y.size()));
    else
      shard.writer->append(x.data(), y.data(), static_cast<std::int64_t>(y.size()));
  }
  return shard;
}

void image_stats(const std::vector<std::int64_t>& sum, const std::vector<std::int64_t>& sum_sq,
                 std::int64_t pixels, std::vector<float>& mean, std::vector<float>& stddev) {
  mean.clear();
  stddev.clear();
  if (pixels == 0) return;
  for (std::size_t c = 0; c < sum.size(); ++c) {
    const double n = static_cast<double>(pixels);
    const double m = static_cast<double>(sum[c]) / n;
    const double var = std::max(0.0, static_cast<double>(sum_sq[c]) / n - m * m);
    mean.push_back(static_cast<float>(m / 255.0));
    // A constant channel (all pixels equal) would have std 0, which the format refuses and
    // normalisation cannot divide by: 1/255 leaves such a channel as it is.
    stddev.push_back(static_cast<float>(std::max(std::sqrt(var), 1.0) / 255.0));
  }
}

}  // namespace lockstep::data
