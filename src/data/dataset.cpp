#include "lockstep/data/dataset.hpp"

#include <glob.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <regex>
#include <set>

#include "lockstep/core/thread_pool.hpp"

namespace lockstep::data {

namespace {
std::vector<std::string> glob_files(const std::string& pattern) {
  glob_t g{};
  std::vector<std::string> out;
  if (::glob(pattern.c_str(), 0, nullptr, &g) == 0) {
    for (std::size_t i = 0; i < g.gl_pathc; ++i)
      out.emplace_back(g.gl_pathv[i]);
  }
  globfree(&g);
  std::sort(out.begin(), out.end());
  return out;
}
}  // namespace

std::vector<std::string> resolve_shard_files(const std::string& spec) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(spec, ec)) return {spec};
  std::string pattern;
  if (spec.find_first_of("*?[") != std::string::npos) {
    pattern = spec;
  } else if (fs::is_directory(spec, ec)) {
    pattern = (fs::path(spec) / "*.h5").string();
  } else {
    pattern = spec + "-*-of-*.h5";
  }
  auto files = glob_files(pattern);
  if (files.empty()) {
    // An unreadable folder globs to nothing: say that, not "no files match".
    const fs::path dir =
        fs::is_directory(spec, ec) ? fs::path(spec) : fs::path(pattern).parent_path();
    const std::string folder = dir.empty() ? "." : dir.string();
    LOCKSTEP_CHECK_HINT(!fs::is_directory(folder, ec) || ::access(folder.c_str(), R_OK | X_OK) == 0,
                        "give this user read permission (ls -ld " + folder + ")", "shard folder ",
                        folder, " (from '", spec, "'): cannot list: ", std::strerror(errno));
  }
  LOCKSTEP_CHECK_HINT(!files.empty(),
                      "give a shard file, a folder, a glob, or DIR/NAME for DIR/NAME-*-of-*.h5; "
                      "make shards with lockstep-shard",
                      "empty shard set: no files match ", pattern, " (from '", spec, "')");
  return files;
}

std::shared_ptr<ShardedDataset> ShardedDataset::open(const std::string& spec,
                                                     std::int64_t memory_budget_bytes,
                                                     const ResidentAllocator& allocator) {
  return open(resolve_shard_files(spec), memory_budget_bytes, allocator);
}

std::shared_ptr<ShardedDataset> ShardedDataset::open(const std::vector<std::string>& files,
                                                     std::int64_t memory_budget_bytes,
                                                     const ResidentAllocator& allocator) {
  LOCKSTEP_CHECK_HINT(!files.empty(), "make shards with lockstep-shard",
                      "empty shard set: no shard files given");
  // A folder holding train and test (or two versions of a set): say so before the files'
  // attributes disagree in some less telling way.
  static const std::regex shard_name(R"((.*)-\d+-of-\d+\.h5)");
  std::set<std::string> sets;
  for (const auto& f : files) {
    std::smatch m;
    const std::string base = std::filesystem::path(f).filename().string();
    if (std::regex_match(base, m, shard_name)) sets.insert(m[1].str());
  }
  if (sets.size() > 1) {
    std::string names;
    for (const auto& n : sets)
      names += (names.empty() ? "" : ", ") + n;
    LOCKSTEP_FAIL_HINT("name one set: DIR/NAME reads DIR/NAME-*-of-*.h5", "the shard files are of ",
                       sets.size(), " sets (", names, "), e.g. ", files.front());
  }
  // Without a chunk cache until the mode is known: an in-memory read goes straight into the
  // block, while through a cache it would leave a full cache (4 MiB) behind in every shard,
  // 23 MiB per process for Fashion-MNIST (bench/rss.sh). HDF5 shares one cache among all handles
  // of a dataset, so on-demand sets reopen their shards below, after these handles are closed.
  std::vector<std::unique_ptr<ShardFile>> opened;
  for (const auto& f : files)
    opened.push_back(ShardFile::open(f, /*chunk_cache_bytes=*/0));

  // The files must be the shards 0..n-1 of one set: same description, each index exactly once.
  const ShardMeta& first = opened[0]->meta();
  auto disagree = [&](const ShardFile& s, const char* field, const std::string& mine,
                      const std::string& theirs) {
    LOCKSTEP_FAIL_HINT(
        "all shards of a set must come from one lockstep-shard run; regenerate the set",
        "shards of one set disagree on '", field, "': ", s.where(), " says ", mine, " but ",
        opened[0]->where(), " says ", theirs);
  };
  auto vec_str = [](const std::vector<float>& v) {
    std::string s = "[";
    for (std::size_t i = 0; i < v.size(); ++i)
      s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
  };
  std::map<std::int64_t, const ShardFile*> by_index;
  for (const auto& s : opened) {
    const ShardMeta& m = s->meta();
    if (m.num_shards != first.num_shards)
      disagree(*s, "num_shards", std::to_string(m.num_shards), std::to_string(first.num_shards));
    if (m.sample_shape != first.sample_shape)
      disagree(*s, "sample_shape", shape_str(m.sample_shape), shape_str(first.sample_shape));
    if (m.num_classes != first.num_classes)
      disagree(*s, "num_classes", std::to_string(m.num_classes), std::to_string(first.num_classes));
    if (m.storage != first.storage)
      disagree(*s, "storage", sample_storage_name(m.storage), sample_storage_name(first.storage));
    if (m.dtype != first.dtype)
      disagree(*s, "dtype of /x", dtype_name(m.dtype), dtype_name(first.dtype));
    if (m.mean != first.mean) disagree(*s, "mean", vec_str(m.mean), vec_str(first.mean));
    if (m.stddev != first.stddev) disagree(*s, "std", vec_str(m.stddev), vec_str(first.stddev));
    if (m.class_names != first.class_names)
      disagree(*s, "class_names", std::to_string(m.class_names.size()) + " names",
               std::to_string(first.class_names.size()) + " names, or other ones");
    auto [it, inserted] = by_index.emplace(m.shard_index, s.get());
    LOCKSTEP_CHECK_HINT(inserted,
                        "a folder may hold several sets (train, test): open DIR/NAME instead",
                        "shard index ", m.shard_index, " appears twice: in ", it->second->path(),
                        " and in ", s->path());
  }
  for (std::int64_t i = 0; i < first.num_shards; ++i) {
    LOCKSTEP_CHECK_HINT(by_index.count(i), kRegenerateHint, "shard set is incomplete: shard ", i,
                        " of ", first.num_shards, " is missing (have ", opened.size(),
                        " files, e.g. ", opened[0]->path(), ")");
  }

  std::shared_ptr<ShardedDataset> ds(new ShardedDataset());
  ds->meta_ = first;
  ds->meta_.shard_index = 0;
  std::sort(opened.begin(), opened.end(), [](const auto& a, const auto& b) {
    return a->meta().shard_index < b->meta().shard_index;
  });
  ds->offsets_.push_back(0);
  for (auto& s : opened) {
    ds->files_.push_back(s->path());
    ds->offsets_.push_back(ds->offsets_.back() + s->meta().num_samples);
  }
  ds->size_ = ds->offsets_.back();
  ds->meta_.num_samples = ds->size_;
  ds->shards_ = std::move(opened);

  ds->labels_.reserve(static_cast<std::size_t>(ds->size_));
  for (auto& s : ds->shards_) {
    auto y = s->read_y();
    ds->labels_.insert(ds->labels_.end(), y.begin(), y.end());
  }

  const std::int64_t x_bytes = ds->size_ * ds->sample_bytes();
  const std::int64_t label_bytes = ds->size_ * static_cast<std::int64_t>(sizeof(std::int32_t));
  // Encoded sets are read on demand: their bytes are not the samples (held in memory they would
  // need a block of another size and a table of offsets; the page cache holds them instead).
  if (ds->meta_.storage == SampleStorage::Raw && x_bytes + label_bytes <= memory_budget_bytes) {
    ResidentBlock block;
    if (allocator) {
      block = allocator(x_bytes, ds->describe());
      LOCKSTEP_CHECK(block.data != nullptr || x_bytes == 0, "holding the set ", ds->describe(),
                     " in memory: the allocator returned no block for ",
                     format_bytes(static_cast<double>(x_bytes)));
    } else {
      Shape shape{ds->size_};
      shape.insert(shape.end(), ds->meta_.sample_shape.begin(), ds->meta_.sample_shape.end());
      try {
        auto heap = std::make_shared<Tensor>(Tensor::empty(shape, ds->meta_.dtype));
        block.data = heap->raw_data();
        block.owner = std::move(heap);
      } catch (const OutOfMemory&) {
        rethrow_with_context(str("holding the set ", ds->files_.front(), " ... in memory (",
                                 format_bytes(static_cast<double>(x_bytes)),
                                 ", within the memory budget of ",
                                 format_bytes(static_cast<double>(memory_budget_bytes)),
                                 "; a smaller budget reads it on demand)"));
      }
    }
    auto* base = static_cast<char*>(block.data);
    if (block.fill) {
      try {
        for (std::size_t s = 0; s < ds->shards_.size(); ++s) {
          ds->shards_[s]->read_x(0, ds->shards_[s]->meta().num_samples,
                                 base + ds->offsets_[s] * ds->sample_bytes());
        }
      } catch (...) {
        // The ranks waiting for this copy learn that it failed instead of waiting forever.
        if (block.filled) block.filled(false);
        throw;
      }
      ds->bytes_read_ += x_bytes;
    }
    if (block.filled) block.filled(true);
    ds->resident_ = base;
    ds->resident_owner_ = std::move(block.owner);
    ds->shared_copy_ = !block.fill;
  } else {
    for (auto& shard : ds->shards_) {
      const std::string path = shard->path();
      shard.reset();
      shard = ShardFile::open(path);
    }
  }
  return ds;
}

ShardedDataset::~ShardedDataset() = default;

std::string ShardedDataset::describe() const {
  return files_.size() == 1 ? files_.front()
                            : str(files_.front(), ", ... (", files_.size(), " shards)");
}

ShardedDataset::Location ShardedDataset::locate(std::int64_t index) const {
  LOCKSTEP_CHECK(index >= 0 && index < size_, "sample index ", index,
                 " is outside the dataset [0, ", size_, ") of ", files_.front(), " ...");
  const auto s = static_cast<std::size_t>(
      std::upper_bound(offsets_.begin(), offsets_.end(), index) - offsets_.begin() - 1);
  return {shards_[s].get(), index - offsets_[s]};
}

std::string ShardedDataset::describe_samples(std::vector<std::int64_t> indices) const {
  std::sort(indices.begin(), indices.end());
  indices.erase(std::unique(indices.begin(), indices.end()), indices.end());
  std::string out;
  for (std::size_t i = 0; i < indices.size();) {
    const Location first = locate(indices[i]);
    std::size_t j = i;
    std::int64_t last = first.index;
    while (j < indices.size() && locate(indices[j]).shard == first.shard)
      last = locate(indices[j++]).index;
    out += str(out.empty() ? "" : "; ", first.shard->where(), ": ", j - i,
               j - i == 1 ? " sample, index " : " samples in [", first.index,
               j - i == 1 ? "" : str(", ", last, "]"));
    i = j;
  }
  return out;
}

std::vector<std::int64_t> ShardedDataset::shard_sizes() const {
  std::vector<std::int64_t> out;
  for (std::size_t s = 0; s + 1 < offsets_.size(); ++s)
    out.push_back(offsets_[s + 1] - offsets_[s]);
  return out;
}

void ShardedDataset::allocate(std::span<const std::int64_t> indices, Tensor& x, Tensor& y) const {
  const auto k = static_cast<std::int64_t>(indices.size());
  Shape x_shape{k};
  x_shape.insert(x_shape.end(), meta_.sample_shape.begin(), meta_.sample_shape.end());
  if (!x.defined() || x.shape() != x_shape || x.dtype() != meta_.dtype || !x.device().is_cpu())
    x = Tensor::empty(x_shape, meta_.dtype);
  if (!y.defined() || y.shape() != Shape{k} || y.dtype() != DType::I32 || !y.device().is_cpu())
    y = Tensor::empty({k}, DType::I32);
  auto* yo = y.data<std::int32_t>();
  for (std::int64_t j = 0; j < k; ++j) {
    LOCKSTEP_CHECK(indices[j] >= 0 && indices[j] < size_, "sample index ", indices[j],
                   " is outside the dataset [0, ", size_, ") of ", files_.front(), " ...");
    yo[j] = labels_[static_cast<std::size_t>(indices[j])];
  }
}

void ShardedDataset::decode(std::span<const std::int64_t> indices, Tensor& x, std::int64_t epoch,
                            const AugmentOptions& augment, ThreadPool* pool) const {
  const auto k = static_cast<std::int64_t>(indices.size());
  const std::int64_t sb = sample_bytes(), side = meta_.sample_shape[2];
  auto* xo = x.data<std::uint8_t>();
  auto work = [&](std::int64_t begin, std::int64_t end) {
    thread_local std::vector<std::uint8_t> bytes;  // the largest sample's size, once per thread
    std::int64_t read = 0;
    for (std::int64_t j = begin; j < end; ++j) {
      const Location at = locate(indices[j]);
      at.shard->read_encoded(at.index, bytes);
      read += static_cast<std::int64_t>(bytes.size());
      auto decode_as = [&](const std::string& where) {
        decode_sample(bytes.data(), bytes.size(), where, side, augment, epoch, indices[j],
                      xo + j * sb);
      };
      // The sample's name is for error messages only, so it is made when a decode fails: the
      // sample is decoded again under it, and fails again the same way (decoding is
      // deterministic).
      try {
        decode_as(std::string());
      } catch (const Error&) {
        decode_as(str(at.shard->where(), ", sample ", at.index));
        throw;
      }
    }
    release_if_outsized(bytes);
    bytes_read_ += read;
  };
  if (pool == nullptr || k <= 1) {
    work(0, k);
    return;
  }
  pool->parallel_for(k, 1, work);
}

void ShardedDataset::gather_augmented(std::span<const std::int64_t> indices, Tensor& x, Tensor& y,
                                      std::int64_t epoch, const AugmentOptions& augment,
                                      ThreadPool* pool) const {
  if (meta_.storage == SampleStorage::Raw) {
    Dataset::gather_augmented(indices, x, y, epoch, augment, pool);
    return;
  }
  allocate(indices, x, y);
  decode(indices, x, epoch, augment, pool);
}

void ShardedDataset::gather(std::span<const std::int64_t> indices, Tensor& x, Tensor& y) const {
  const auto k = static_cast<std::int64_t>(indices.size());
  allocate(indices, x, y);
  const std::int64_t sb = sample_bytes();
  auto* xo = static_cast<char*>(x.raw_data());
  if (meta_.storage == SampleStorage::Encoded) {
    decode(indices, x, 0, AugmentOptions{}, nullptr);
    return;
  }
  if (resident_ != nullptr) {
    const char* base = resident_;
    for (std::int64_t j = 0; j < k; ++j)
      std::memcpy(xo + j * sb, base + indices[j] * sb, sb);
    return;
  }

  // On demand: visit the requested samples in index order so that neighbours become one
  // contiguous run, read each run with one hyperslab read, then scatter to batch positions.
  // (One read of the union of a shard's runs was 10x slower with HDF5 1.10: building and
  // walking the irregular selection costs more than the calls it saves.)
  std::vector<std::int64_t> order(static_cast<std::size_t>(k));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](std::int64_t a, std::int64_t b) { return indices[a] < indices[b]; });
  std::vector<char> run_buffer;
  std::int64_t bytes = 0;
  for (std::size_t p = 0; p < order.size();) {
    const std::int64_t first = indices[order[p]];
    const auto s = static_cast<std::size_t>(
        std::upper_bound(offsets_.begin(), offsets_.end(), first) - offsets_.begin() - 1);
    // Extend the run while the next distinct index is adjacent and in the same shard.
    std::size_t q = p + 1;
    std::int64_t last = first;
    while (q < order.size()) {
      std::int64_t idx = indices[order[q]];
      if (idx == last || (idx == last + 1 && idx < offsets_[s + 1])) {
        last = idx;
        ++q;
      } else {
        break;
      }
    }
    const std::int64_t count = last - first + 1;
    run_buffer.resize(static_cast<std::size_t>(count * sb));
    shards_[s]->read_x(first - offsets_[s], count, run_buffer.data());
    bytes += count * sb;
    for (std::size_t r = p; r < q; ++r) {
      std::memcpy(xo + order[r] * sb, run_buffer.data() + (indices[order[r]] - first) * sb, sb);
    }
    p = q;
  }
  bytes_read_ += bytes;
}

}  // namespace lockstep::data
