// The MPI-free halves of the collective watch (mpi_watch.hpp), tested without a job: the back-off
// schedule of a wait, and what a rank knows and prints about a hung collective. When a collective
// on the MPI path outlives dist.timeout_s, the rank asks every peer where it stands and prints
// timeout_report() from the answers; a peer asked about a collective it has not reached prints
// behind_report().
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace lockstep::comm::detail {

// The polling schedule of a wait. Spin first (MPI_Test, which yields the core when there is
// nothing to progress): most collectives finish within it and must not pay for a sleep, and Open
// MPI advances a collective's messages (each rendezvous handshake of a large one) only while some
// thread polls. 1 ms covers a 4 MiB allreduce here; with 200 us a 1 MiB one took 2.8x as long,
// its handshakes waiting for sleeping peers. Then sleep `fraction` of the time waited so far,
// within [min_sleep, max_sleep]: small enough that a long allreduce stays at the speed of the
// blocking call (measured, docs/DISTRIBUTED.md), while a rank waiting minutes for a hung peer
// wakes at most 1/max_sleep times a second (~1.5% of a core).
struct WaitPolicy {
  std::chrono::microseconds spin{1000};
  std::chrono::microseconds min_sleep{10};
  std::chrono::microseconds max_sleep{2000};
  double fraction = 1.0 / 64;

  // The pause after `waited` of polling (zero: poll again at once).
  std::chrono::microseconds pause_after(std::chrono::microseconds waited) const;
};

// How long a rank that timed out waits for its peers' answers before reporting.
inline constexpr double kReportGraceSeconds = 2.0;

// One rank's position, sent as raw bytes between ranks of the same binary: a fixed size, no
// pointers. Sequence numbers count the collectives of one communicator from 1, in issue order,
// which is the same on every rank.
struct RankStatus {
  std::int64_t seq = 0;           // the collective in flight, else the last finished (0: none)
  std::int64_t step = 0;          // the training step that collective was issued in
  std::int64_t current_step = 0;  // the training step the rank's caller is in now
  std::int64_t in_flight = 0;     // 1: waiting in collective `seq`; 0: idle since it finished
  double seconds = 0;             // how long it has been waiting in, or idle since, `seq`
  char what[112] = {};            // the collective's name ("allreduce(f32[1024] on cpu, sum)")

  void set_what(const std::string& name);  // truncated to fit, always NUL-terminated
  std::string name() const;
};
static_assert(std::is_trivially_copyable_v<RankStatus> && sizeof(RankStatus) == 4 * 8 + 8 + 112,
              "RankStatus travels as bytes, without padding");

// "at training step 12", or "before the first training step" for step 0.
std::string step_phrase(std::int64_t step);

// The report of rank `my_rank`, whose collective (mine.seq) timed out after timeout_s; peers[r]
// is rank r's answer (nullopt: none within grace_s; peers[my_rank] is ignored). `first` is the rank
// whose timeout expired and asked this one, or -1 when this rank's own did. Every line starts with
// "rank <my_rank>: "; the first names the collective, the step and the missing ranks. `places[r]`,
// when given, says where rank r runs ("node2, pid 4242"): each peer line names it, and a last line
// "suspect hosts: node2" lists the hosts of the missing ranks, for a requeue script to avoid.
std::string timeout_report(int my_rank, const RankStatus& mine,
                           const std::vector<std::optional<RankStatus>>& peers, double timeout_s,
                           double grace_s, int first = -1,
                           const std::vector<std::string>& places = {});

// The host of a place ("node2" of "node2, pid 4242").
std::string place_host(const std::string& place);

// What rank `my_rank` (status `mine`) prints when rank `asker` reports that its collective
// `asked.seq` timed out, which this rank has not reached or is not waiting in.
std::string behind_report(int my_rank, const RankStatus& mine, int asker, const RankStatus& asked);

}  // namespace lockstep::comm::detail
