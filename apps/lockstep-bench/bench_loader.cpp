// lockstep-bench loader: how fast the data layer feeds a training loop.
//   lockstep-bench loader --data=DIR/train [--batch=256] [--reps=3] [--consume=20000]
//                         [--consume-batches=100] [--world=1] [--rank=0] [--out=PATH]
//                         [--rrc=0] [--flip=0] [--decode-threads=1] [--avx512-resampler=1]
// --rrc/--flip: the training augmentation (for encoded image shards, the decode and crop of
// each original, docs/IMAGES.md); encoded sets are read on demand only.
// --avx512-resampler=0: the image resampler without its AVX-512 code (the same bytes; for a
// before/after of that code in one binary, on a CPU that has AVX-512).
// For each mode (in memory, on demand) it measures: the time to open the set, the loader's
// throughput with a consumer that takes batches as fast as they come (median epoch of --reps)
// and its CPU time per sample (every thread of the process, median epoch: the figure to compare
// on a loaded machine),
// and, against a consumer that needs batch/consume seconds per batch (a stand-in for the training
// step), the fraction of the consumer's time spent waiting for data.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "bench.hpp"
#include "lockstep/core/clock.hpp"
#include "lockstep/data/image.hpp"
#include "lockstep/data/loader.hpp"

namespace lockstep::bench {
namespace {

struct ModeResult {
  std::string mode;
  double open_s = 0;
  std::vector<double> samples_per_s;      // one per epoch
  std::vector<double> cpu_ms_per_sample;  // one per epoch: every thread of the process
  double consume_wait_fraction = 0;
  double consume_achieved = 0;  // samples/s the throttled consumer reached
  std::int64_t bytes_read = 0;
};

ModeResult run_mode(const std::string& mode, const Args& a) {
  const std::string spec = a.get("data", "");
  const std::int64_t batch = a.get_int("batch", 256);
  const int reps = static_cast<int>(a.get_int("reps", 3));
  const double consume = a.get_double("consume", 20000);
  const std::int64_t consume_batches = a.get_int("consume-batches", 100);
  const int world = static_cast<int>(a.get_int("world", 1));
  const int rank = static_cast<int>(a.get_int("rank", 0));
  data::LoaderOptions options;
  options.augment.random_resized_crop = a.get_int("rrc", 0) != 0;
  options.augment.flip = a.get_int("flip", 0) != 0;
  options.decode_threads = static_cast<int>(a.get_int("decode-threads", 1));

  ModeResult r;
  r.mode = mode;
  auto t0 = Clock::now();
  auto ds =
      data::ShardedDataset::open(spec, mode == "in-memory" ? data::kDefaultMemoryBudgetBytes : 0);
  r.open_s = seconds_since(t0);
  LOCKSTEP_CHECK(ds->in_memory() == (mode == "in-memory"), spec,
                 " does not fit the default memory budget");

  data::DistributedSampler sampler(ds->size(), world, rank, true, 1234);
  data::Loader loader(ds, sampler, batch, options);
  std::int64_t epoch = 0;
  for (int rep = 0; rep < reps; ++rep, ++epoch) {
    loader.start_epoch(epoch);
    std::int64_t samples = 0;
    t0 = Clock::now();
    const double cpu0 = process_cpu_seconds();
    while (auto b = loader.next())
      samples += b->x.dim(0);
    r.samples_per_s.push_back(static_cast<double>(samples) / seconds_since(t0));
    r.cpu_ms_per_sample.push_back((process_cpu_seconds() - cpu0) * 1e3 /
                                  static_cast<double>(std::max<std::int64_t>(samples, 1)));
  }

  // Throttled consumer: each batch "costs" batch/consume seconds (deadline-based, so sleep
  // overshoot does not accumulate).
  if (consume > 0) {
    loader.start_epoch(epoch++);
    loader.reset_data_wait();
    const auto step = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(static_cast<double>(batch) / consume));
    t0 = Clock::now();
    auto deadline = t0;
    std::int64_t samples = 0;
    for (std::int64_t i = 0; i < consume_batches; ++i) {
      auto b = loader.next();
      if (!b) break;
      samples += b->x.dim(0);
      deadline = std::max(deadline, Clock::now()) + step;
      std::this_thread::sleep_until(deadline);
    }
    const double total = seconds_since(t0);
    r.consume_wait_fraction = loader.data_wait_seconds() / total;
    r.consume_achieved = static_cast<double>(samples) / total;
  }
  r.bytes_read = ds->bytes_read();
  return r;
}

int bench_loader(const Args& a) {
  LOCKSTEP_CHECK_HINT(!a.get("data", "").empty(),
                      "make shards with lockstep-shard fashion-mnist --out=DIR",
                      "lockstep-bench loader needs --data=DIR/NAME");
  const bool encoded =
      data::ShardedDataset::open(a.get("data", ""), 0)->storage() == data::SampleStorage::Encoded;
  const bool avx512_resampler = a.get_int("avx512-resampler", 1) != 0;
  data::allow_avx512_resampler(avx512_resampler);
  std::vector<ModeResult> results;
  if (!encoded) results.push_back(run_mode("in-memory", a));
  results.push_back(run_mode("on-demand", a));

  std::string json = str(
      "{\"benchmark\": \"loader\", \"machine\": ", machine_json(), ", \"data\": \"",
      a.get("data", ""), "\", \"batch\": ", a.get_int("batch", 256),
      ", \"world\": ", a.get_int("world", 1), ", \"prefetch_depth\": ", data::kDefaultPrefetchDepth,
      ", \"consume\": ", a.get_double("consume", 20000),
      ", \"avx512_resampler_allowed\": ", avx512_resampler ? "true" : "false", ", \"modes\": [");
  std::fprintf(stderr, "%-10s %8s %14s %14s %16s %14s\n", "mode", "open_s", "samples/s",
               "wait@consume", "consumed/s", "cpu_ms/sample");
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    std::string reps, cpus;
    for (std::size_t k = 0; k < r.samples_per_s.size(); ++k) {
      reps += str(k ? ", " : "", static_cast<long long>(r.samples_per_s[k]));
      cpus += str(k ? ", " : "", r.cpu_ms_per_sample[k]);
    }
    json +=
        str(i ? ", " : "", "{\"mode\": \"", r.mode, "\", \"open_s\": ", r.open_s,
            ", \"samples_per_s_median\": ", median(r.samples_per_s), ", \"samples_per_s\": [", reps,
            "], \"cpu_ms_per_sample_median\": ", median(r.cpu_ms_per_sample),
            ", \"cpu_ms_per_sample\": [", cpus,
            "], \"wait_fraction_at_consume\": ", r.consume_wait_fraction,
            ", \"consumed_per_s\": ", r.consume_achieved, ", \"bytes_read\": ", r.bytes_read, "}");
    std::fprintf(stderr, "%-10s %8.3f %14.0f %13.1f%% %16.0f %14.3f\n", r.mode.c_str(), r.open_s,
                 median(r.samples_per_s), 100.0 * r.consume_wait_fraction, r.consume_achieved,
                 median(r.cpu_ms_per_sample));
  }
  const double ratio = median(results.front().samples_per_s) / median(results.back().samples_per_s);
  json += str("], \"in_memory_over_on_demand\": ", ratio, "}\n");
  std::fprintf(stderr, "in-memory / on-demand throughput: %.1fx\n", ratio);
  write_output(a, json);
  return 0;
}

LOCKSTEP_BENCH("loader",
               "data loader throughput, in-memory vs on-demand, and data wait at --consume",
               "avx512-resampler batch consume consume-batches data decode-threads flip rank reps "
               "rrc world",
               bench_loader);

}  // namespace
}  // namespace lockstep::bench
