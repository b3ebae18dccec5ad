// lockstep-bench allreduce: nccl-tests-style table of MPI allreduce speed, lockstep's
// Communicator (sync calls through its communication thread, and back-to-back async calls as
// the Reducer issues them), its hierarchical allreduce (comm/hierarchical.hpp) over the job's
// nodes, and MPI_Allreduce called directly, sizes interleaved in the same run. Run under
// mpirun / srun, e.g. `mpirun -np 2 build/apps/lockstep-bench allreduce`; --layout=0,0,1,1
// simulates a node layout for the hierarchical column (default: the real one).
// time = median over --reps of (max over ranks of the mean time per call in one rep);
// algbw = bytes / time; busbw = algbw * 2(n-1)/n (the bytes each rank's link must carry).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench.hpp"
#include "lockstep/comm/bootstrap.hpp"
#include "lockstep/comm/hierarchical.hpp"
#include "lockstep/comm/mpi_communicator.hpp"
#include "lockstep/core/clock.hpp"
#include "lockstep/core/error.hpp"

namespace lockstep::bench {
namespace {

struct Timing {
  double us = 0, algbw = 0, busbw = 0;
};

// The 1/5/15-minute load averages, recorded with every run: timings here share 2 cores.
std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

int run_allreduce(const Args& args) {
  comm::MpiSession session(nullptr, nullptr);
  return comm::run_or_abort([&] {
    const bool quick = args.get_int("quick", 0) != 0;
    const long long minbytes = args.get_int("minbytes", 4);
    const long long maxbytes = args.get_int("maxbytes", quick ? 64 << 10 : 64 << 20);
    const long long step = args.get_int("step", 4);
    const int reps = static_cast<int>(args.get_int("reps", quick ? 3 : 7));
    const int warmup = static_cast<int>(args.get_int("warmup", quick ? 2 : 5));
    // Calls per rep: enough to move ~32 MiB (small messages), at least 2, at most 200.
    const long long target_bytes = args.get_int("target-bytes", quick ? 1 << 20 : 32 << 20);
    LOCKSTEP_CHECK(minbytes >= 4 && maxbytes >= minbytes && step >= 2 && reps >= 1,
                   "allreduce bench: need 4 <= --minbytes <= --maxbytes, --step >= 2, --reps >= 1");

    auto comm = comm::make_mpi_communicator(session);
    const int W = comm->size();
    comm::NodeLayout layout = comm::NodeLayout::detect(*comm);
    if (const std::string ids = args.get("layout", ""); !ids.empty()) {
      std::vector<int> node_of_rank;
      std::stringstream list(ids);
      for (std::string id; std::getline(list, id, ',');)
        node_of_rank.push_back(std::stoi(id));
      layout = comm::NodeLayout(node_of_rank);
    }
    comm::HierarchicalOptions hier_options;
    hier_options.segment_bytes = static_cast<std::size_t>(
        args.get_int("segment-bytes", static_cast<long long>(comm::kHierarchicalSegmentBytes)));
    auto hier = comm::make_hierarchical_communicator(*comm, layout, hier_options);
    const bool root = comm->rank() == 0;
    const double bus_factor = 2.0 * (W - 1) / W;

    // Every rank's view of itself, so a log shows what the launcher and MPI made of the job.
    const std::vector<std::string> ranks = comm->allgather(session.describe());
    if (root) {
      std::fprintf(stderr, "# lockstep allreduce bench: %d ranks on %d node(s), f32 sum, %s\n", W,
                   session.nodes(), comm::thread_level_name(session.thread_level()));
      for (const std::string& line : ranks)
        std::fprintf(stderr, "# %s\n", line.c_str());
      std::fprintf(stderr, "# hierarchical over %s; load average %s\n", layout.describe().c_str(),
                   load_average().c_str());
      std::fprintf(stderr, "#%11s %10s | %33s | %33s | %33s | %33s | %7s\n", "", "",
                   "lockstep flat sync (comm thread)", "lockstep flat async (8 queued)",
                   "lockstep hierarchical (sync)", "raw MPI_Allreduce (caller)", "");
      std::fprintf(stderr,
                   "#%11s %10s | %10s %10s %11s | %10s %10s %11s | %10s %10s %11s | %10s %10s "
                   "%11s | %7s\n",
                   "bytes", "count", "time(us)", "algbw", "busbw", "time(us)", "algbw", "busbw",
                   "time(us)", "algbw", "busbw", "time(us)", "algbw", "busbw", "hier/mpi");
    }

    std::ostringstream json;
    json << "{\"benchmark\": \"allreduce\", \"ranks\": " << W << ", \"nodes\": " << session.nodes()
         << ", \"layout\": \"" << layout.describe() << "\", \"load_avg\": \"" << load_average()
         << "\""
         << ", \"dtype\": \"f32\", \"op\": \"sum\", \"reps\": " << reps
         << ", \"machine\": " << machine_json() << ", \"results\": [";
    bool first = true;

    for (long long bytes = minbytes; bytes <= maxbytes; bytes *= step) {
      const std::int64_t count = bytes / 4;
      const long long iters = std::clamp(target_bytes / bytes, 2LL, 200LL);
      std::vector<Tensor> tensors;
      for (int k = 0; k < 8; ++k)
        tensors.push_back(Tensor::zeros({count}));

      // Correctness before speed: rank r contributes r + 1.
      std::vector<float> ones(count, static_cast<float>(comm->rank() + 1));
      tensors[0].copy_from(ones);
      comm->allreduce(tensors[0]);
      tensors[1].copy_from(ones);
      hier->allreduce(tensors[1]);
      const float expected = W * (W + 1) / 2.0f;
      for (int k = 0; k < 2; ++k) {
        for (float v : tensors[k].to_vector<float>()) {
          LOCKSTEP_CHECK(v == expected, "allreduce bench: wrong sum ", v, " (expected ", expected,
                         ") at ", bytes, " bytes", k ? " (hierarchical)" : "");
        }
      }
      tensors[1].copy_from(std::vector<float>(count, 0.0f));
      tensors[0].copy_from(std::vector<float>(count, 0.0f));  // zeros stay zeros: no overflow

      auto sync_call = [&](long long n) {
        for (long long i = 0; i < n; ++i)
          comm->allreduce(tensors[0]);
      };
      auto async_call = [&](long long n) {
        std::vector<comm::WorkPtr> works;
        for (long long i = 0; i < n; ++i) {
          works.push_back(comm->allreduce_async(tensors[i % tensors.size()]));
          if (works.size() == tensors.size()) {
            for (auto& w : works)
              w->wait();
            works.clear();
          }
        }
        for (auto& w : works)
          w->wait();
      };
      auto hier_call = [&](long long n) {
        for (long long i = 0; i < n; ++i)
          hier->allreduce(tensors[0]);
      };
      auto raw_call = [&](long long n) {
        for (long long i = 0; i < n; ++i)
          comm::mpi_allreduce_on_caller(*comm, tensors[0]);
      };
      auto measure = [&](const auto& call, std::vector<double>& samples) {
        comm->barrier();
        auto t0 = Clock::now();
        call(iters);
        std::vector<double> us{
            std::chrono::duration<double, std::micro>(Clock::now() - t0).count() /
            static_cast<double>(iters)};
        comm->allreduce(us, comm::ReduceOp::Max);  // the slowest rank defines the time
        samples.push_back(us[0]);
      };

      sync_call(warmup);
      async_call(warmup);
      hier_call(warmup);
      raw_call(warmup);
      std::vector<double> sync_us, async_us, hier_us, raw_us;
      for (int r = 0; r < reps; ++r) {  // interleaved, so drift hits all four alike
        measure(sync_call, sync_us);
        measure(async_call, async_us);
        measure(hier_call, hier_us);
        measure(raw_call, raw_us);
      }
      auto timing = [&](const std::vector<double>& samples) {
        Timing t;
        t.us = median(samples);
        t.algbw = static_cast<double>(bytes) / (t.us * 1e-6) / 1e9;
        t.busbw = t.algbw * bus_factor;
        return t;
      };
      Timing s = timing(sync_us), a = timing(async_us), h = timing(hier_us), m = timing(raw_us);
      if (root) {
        std::fprintf(stderr,
                     " %11lld %10lld | %10.2f %10.3f %11.3f | %10.2f %10.3f %11.3f | %10.2f "
                     "%10.3f %11.3f | %10.2f %10.3f %11.3f | %7.2f\n",
                     bytes, static_cast<long long>(count), s.us, s.algbw, s.busbw, a.us, a.algbw,
                     a.busbw, h.us, h.algbw, h.busbw, m.us, m.algbw, m.busbw, h.us / m.us);
        json << (first ? "" : ",") << "\n  {\"bytes\": " << bytes << ", \"count\": " << count
             << ", \"iters\": " << iters << ", \"sync_us\": " << s.us
             << ", \"sync_busbw_gbs\": " << s.busbw << ", \"async_us\": " << a.us
             << ", \"async_busbw_gbs\": " << a.busbw << ", \"hier_us\": " << h.us
             << ", \"hier_busbw_gbs\": " << h.busbw << ", \"mpi_us\": " << m.us
             << ", \"mpi_busbw_gbs\": " << m.busbw << ", \"sync_over_mpi\": " << s.us / m.us << "}";
        first = false;
      }
    }
    json << "\n]}\n";
    if (root) write_output(args, json.str());
    hier.reset();
    comm.reset();
    return 0;
  });
}

LOCKSTEP_BENCH("allreduce",
               "f32 allreduce, lockstep flat and hierarchical vs raw MPI (mpirun -np N; "
               "--minbytes --maxbytes --step --reps --warmup --quick --layout=0,0,1,1 "
               "--segment-bytes)",
               "minbytes maxbytes step reps warmup quick target-bytes layout segment-bytes",
               run_allreduce);

}  // namespace
}  // namespace lockstep::bench
