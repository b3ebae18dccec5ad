// lockstep-shard images: an ImageFolder or a list of JPEG/PNG files to image shards, under MPI.
//
// Why whole shards per rank: shard s always holds list entries [s*M/K, (s+1)*M/K) (M files, K
// shards), whichever rank decodes it, so the shards are the same for any number of ranks; rank r
// converts shards r, r+N, r+2N, ... A file skipped with --skip-bad shortens only its own shard.
// The per-channel mean/std need every shard's pixels: each rank keeps its shards open (as
// PATH.tmp) until the exact integer sums are reduced, then writes them and publishes the files,
// so no valid-looking shard without statistics ever exists, and the sums, being integers, give
// the same statistics in any order.
#include <sched.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <thread>

#include "image_commands.hpp"
#include "lockstep/comm/bootstrap.hpp"
#include "lockstep/comm/mpi_communicator.hpp"
#include "lockstep/data/dataset.hpp"
#include "lockstep/data/image_folder.hpp"

namespace lockstep::shard_app {

namespace {

using data::ImageList;

// Thrown on every rank once a failing rank has printed its error.
struct OtherRankFailed {};

// Runs step on every rank. If it threw anywhere, the lowest rank that threw prints its error
// (once, not once per rank when all ranks fail alike), then every rank throws OtherRankFailed:
// no rank is left waiting in a collective for one that has given up. The barrier after the
// print keeps the other ranks from exiting first: mpirun ends the job at the first non-zero
// exit, which could otherwise kill the failing rank before its message is out.
void together(comm::Communicator& comm, const std::function<void()>& step) {
  std::exception_ptr error;
  try {
    step();
  } catch (...) {
    error = std::current_exception();
  }
  std::vector<std::int64_t> first{error ? comm.rank() : comm.size()};
  comm.allreduce(first, comm::ReduceOp::Min);
  if (first[0] == comm.size()) return;
  if (first[0] == comm.rank()) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "lockstep-shard images: error: %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "lockstep-shard images: error: an unknown exception\n");
    }
    std::fflush(stderr);
  }
  comm.barrier();
  throw OtherRankFailed{};
}

// The list as one string, for rank 0 to broadcast: a length-prefixed field after another.
std::string encode_list(const ImageList& list) {
  std::string out;
  auto put = [&](const std::string& field) { out += std::to_string(field.size()) + ':' + field; };
  auto put_all = [&](const std::vector<std::string>& fields) {
    put(std::to_string(fields.size()));
    for (const auto& f : fields)
      put(f);
  };
  put(std::to_string(list.num_classes));
  put(std::to_string(list.ignored_files));
  put(list.ignored_example);
  put_all(list.class_names);
  put_all(list.empty_classes);
  put_all(list.paths);
  for (auto label : list.labels)
    put(std::to_string(label));
  return out;
}

ImageList decode_list(const std::string& in) {
  std::size_t pos = 0;
  auto take = [&] {
    const std::size_t colon = in.find(':', pos);
    const std::size_t n = std::stoull(in.substr(pos, colon - pos));
    pos = colon + 1 + n;
    return in.substr(colon + 1, n);
  };
  auto take_all = [&] {
    std::vector<std::string> fields(std::stoull(take()));
    for (auto& f : fields)
      f = take();
    return fields;
  };
  ImageList list;
  list.num_classes = std::stoll(take());
  list.ignored_files = std::stoll(take());
  list.ignored_example = take();
  list.class_names = take_all();
  list.empty_classes = take_all();
  list.paths = take_all();
  for (std::size_t i = 0; i < list.paths.size(); ++i)
    list.labels.push_back(static_cast<std::int32_t>(std::stol(take())));
  return list;
}

int run_images(Options& o) {
  const std::string root = o.get("root"), list_file = o.get("list"), base = o.get("base");
  const std::int64_t classes = o.get_int("classes", 0);
  const std::string out = o.need("out"), name = o.get("name", "train");
  const std::string train_set = o.get("train-set");
  data::ImageShardOptions opts;
  opts.side = o.get_int("resize", 0);
  opts.fit = data::image_fit_from_name(o.get("fit", "crop"));
  opts.storage = data::sample_storage_from_name(o.get("store", "raw"));
  opts.skip_bad = o.get("skip-bad", "0") != "0";
  const std::string restarts = o.get("jpeg-restarts", "1");
  LOCKSTEP_CHECK_HINT(restarts == "0" || restarts == "1",
                      "--jpeg-restarts=0 stores the JPEG files' bytes as they are",
                      "--jpeg-restarts=", restarts, ": expected 0 or 1");
  opts.jpeg_restarts = restarts == "1";
  opts.writer.deflate_level = static_cast<int>(o.get_int("deflate", data::kDefaultDeflateLevel));
  std::int64_t shards = o.get_int("shards", 0);
  const std::int64_t threads = o.get_int("threads", 0);
  o.check_all_used();
  LOCKSTEP_CHECK_HINT(root.empty() != list_file.empty(), "see lockstep-shard --help",
                      "give exactly one of --root=DIR (an ImageFolder) and --list=FILE");
  LOCKSTEP_CHECK_HINT(opts.side >= 1, "e.g. --resize=224 (ImageNet), --resize=32 (CIFAR-sized)",
                      "missing --resize=S: the side of the square samples");
  LOCKSTEP_CHECK_HINT(root.empty() || (classes == 0 && base.empty()), "they go with --list",
                      "--classes and --base do not apply to --root");
  LOCKSTEP_CHECK_HINT(
      opts.storage == data::SampleStorage::Raw || opts.fit == data::ImageFit::CenterCrop,
      "--store=encoded goes with --fit=crop; --fit=pad needs --store=raw",
      "--store=encoded: the loader decodes to --fit=crop's resize and center crop, "
      "not --fit=pad's");

  comm::MpiSession session(nullptr, nullptr);
  // The collectives after decoding wait for the slowest rank's whole share (hours for ImageNet):
  // no collective timeout.
  auto comm = comm::make_mpi_communicator(session, {.timeout_s = 1e9});
  const int rank = comm->rank(), world = comm->size();
  // Default: the node's cores shared by its converting ranks, and never more than the cores this
  // rank may run on (mpirun binds each of 2 ranks to one core, Slurm to --cpus-per-task).
  if (threads > 0) {
    opts.threads = static_cast<int>(threads);
  } else {
    cpu_set_t mask;
    const int allowed = sched_getaffinity(0, sizeof mask, &mask) == 0 ? CPU_COUNT(&mask) : 1;
    const int share =
        static_cast<int>(std::thread::hardware_concurrency()) / std::max(1, comm->local_size());
    opts.threads = std::max(1, std::min(allowed, share));
  }
  const auto start = std::chrono::steady_clock::now();

  ImageList list;
  std::vector<float> train_mean, train_std;
  std::vector<std::string> planned;
  // Rank 0 lists the files and broadcasts the list: one walk of the folder, not one per rank (a
  // metadata storm on a parallel file system), and every rank converts the same list.
  together(*comm, [&] {
    if (rank == 0)
      list = root.empty() ? data::read_image_list(list_file, base, classes)
                          : data::list_image_folder(root, opts.skip_bad);
  });
  const std::string encoded = comm->broadcast(rank == 0 ? encode_list(list) : std::string(), 0);
  if (rank != 0) list = decode_list(encoded);
  together(*comm, [&] {
    const auto m = static_cast<std::int64_t>(list.paths.size());
    const std::int64_t sample_bytes = 3 * opts.side * opts.side;
    if (shards == 0)
      shards = std::clamp<std::int64_t>(
          (m * sample_bytes + data::kDefaultImageShardBytes - 1) / data::kDefaultImageShardBytes, 1,
          m);
    LOCKSTEP_CHECK_HINT(shards >= 1 && shards <= m, "use fewer shards", "cannot split ", m,
                        " images into ", shards, " shards");
    if (!train_set.empty()) {
      // A validation folder must use the training set's labels and statistics: a class missing
      // from it would otherwise shift every later label by one.
      auto train = data::ShardedDataset::open(train_set, 0);
      LOCKSTEP_CHECK_HINT(
          train->num_classes() == list.num_classes && train->class_names() == list.class_names,
          "both folders need the same class subfolders", "the classes here (", list.num_classes,
          ") are not those of --train-set=", train_set, " (", train->num_classes(), ")");
      train_mean = train->mean();
      train_std = train->stddev();
    }
    for (std::int64_t s = 0; s < shards; ++s)
      planned.push_back(data::shard_file_name(name, s, shards));
    if (rank == 0) {
      std::filesystem::create_directories(out);
      const auto stale = data::stale_shard_files(out, {name}, planned);
      LOCKSTEP_CHECK_HINT(stale.empty(), "remove them, or write to another --out or --name", out,
                          " holds shards of set '", name, "' that this run would not replace (",
                          stale.front(), ", ...): readers would mix them with the new ones");
    }
  });

  data::ShardMeta meta;
  meta.num_shards = shards;
  meta.num_classes = list.num_classes;
  meta.sample_shape = {3, opts.side, opts.side};
  meta.dtype = DType::U8;
  meta.class_names = list.class_names;
  meta.storage = opts.storage;
  std::vector<data::ImageShard> mine;
  // sum[3], sum_sq[3], pixels, written, skipped, encoded bytes, the files' bytes
  std::vector<std::int64_t> totals(11, 0);
  std::string skipped;
  together(*comm, [&] {
    for (std::int64_t s = rank; s < shards; s += world) {
      const auto m = static_cast<std::int64_t>(list.paths.size());
      meta.shard_index = s;
      const auto path =
          (std::filesystem::path(out) / planned[static_cast<std::size_t>(s)]).string();
      mine.push_back(data::convert_image_shard(list, data::image_shard_begin(m, s, shards),
                                               data::image_shard_begin(m, s + 1, shards), path,
                                               meta, opts));
      const auto& shard = mine.back();
      for (int c = 0; c < 3; ++c) {
        totals[static_cast<std::size_t>(c)] += shard.sum[static_cast<std::size_t>(c)];
        totals[static_cast<std::size_t>(3 + c)] += shard.sum_sq[static_cast<std::size_t>(c)];
      }
      totals[6] += shard.pixels;
      totals[7] += shard.writer->num_samples();
      totals[8] += static_cast<std::int64_t>(shard.skipped.size());
      totals[9] += shard.encoded_bytes;
      totals[10] += shard.file_bytes;
      for (const auto& why : shard.skipped)
        skipped += "  skipped " + why + "\n";
    }
  });
  comm->allreduce(totals, comm::ReduceOp::Sum);
  const auto skipped_by_rank = comm->allgather(skipped);
  std::vector<float> mean = train_mean, stddev = train_std;
  if (train_set.empty())
    data::image_stats({totals[0], totals[1], totals[2]}, {totals[3], totals[4], totals[5]},
                      totals[6], mean, stddev);
  together(*comm, [&] {
    LOCKSTEP_CHECK_HINT(totals[7] > 0, "see the skipped files above", "no image of ",
                        list.paths.size(), " could be decoded");
    for (auto& shard : mine) {
      shard.writer->set_stats(mean, stddev);
      shard.writer->close();
    }
  });
  if (rank == 0) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (const auto& lines : skipped_by_rank)
      std::fputs(lines.c_str(), stderr);
    std::printf(
        "wrote %lld shard(s) of set '%s' in %s: %lld images of u8 [3, %lld, %lld] (%s%s), %lld "
        "classes; %lld skipped; %d rank(s) x %d thread(s), %.1f s, %.0f images/s\n",
        static_cast<long long>(shards), name.c_str(), out.c_str(),
        static_cast<long long>(totals[7]), static_cast<long long>(opts.side),
        static_cast<long long>(opts.side), data::image_fit_name(opts.fit),
        opts.storage == data::SampleStorage::Encoded
            ? (", stored encoded: " + format_bytes(static_cast<double>(totals[9])) +
               " of JPEG/PNG (the files: " + format_bytes(static_cast<double>(totals[10])) +
               (opts.jpeg_restarts ? "; JPEGs re-encoded losslessly with restart markers"
                                   : "; as they are") +
               "), decoded by the loader")
                  .c_str()
            : "",
        static_cast<long long>(list.num_classes), static_cast<long long>(totals[8]), world,
        opts.threads, seconds,
        static_cast<double>(totals[7] + totals[8]) / std::max(seconds, 1e-9));
    for (std::size_t k = 0; k < list.class_names.size() && k < 20; ++k)
      std::printf("  class %zu: %s\n", k, list.class_names[k].c_str());
    if (list.class_names.size() > 20) std::printf("  ... (%zu classes)\n", list.class_names.size());
    for (const auto& empty : list.empty_classes)
      std::printf("  empty class folder (kept as a class without samples): %s\n", empty.c_str());
    if (list.ignored_files > 0)
      std::printf("  ignored %lld file(s) without a .jpg, .jpeg or .png name, e.g. %s\n",
                  static_cast<long long>(list.ignored_files), list.ignored_example.c_str());
    for (std::size_t c = 0; c < mean.size(); ++c)
      std::printf("  channel %zu: mean %.6f std %.6f%s\n", c, mean[c], stddev[c],
                  train_set.empty() ? "" : " (from --train-set)");
  }
  return 0;
}

}  // namespace

int cmd_images(Options options) {
  try {
    return run_images(options);
  } catch (const OtherRankFailed&) {
    return 1;  // the failing rank has said why, before any rank returned
  }
}

}  // namespace lockstep::shard_app
