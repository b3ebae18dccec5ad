#include "comm/mpi_watch.hpp"

#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <optional>
#include <thread>
#include <vector>

#include "comm/mpi_check.hpp"
#include "lockstep/comm/bootstrap.hpp"
#include "lockstep/core/error.hpp"

namespace lockstep::comm::detail {
namespace {

// Tags on the watch's own communicator: nothing else is sent there.
constexpr int kQueryTag = 1;  // "my collective timed out; where are you?" + the asker's status
constexpr int kReplyTag = 2;  // the answer: the replier's status

double seconds_between(std::chrono::steady_clock::time_point a,
                       std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Linux rounds every sleep up by the thread's timer slack (50 us by default), which would make
// the shortest pauses several times longer than asked; 1 us keeps them what the policy says.
void tighten_timer_slack() {
  thread_local bool done = false;
  if (!done) {
    (void)prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
    done = true;
  }
}

}  // namespace

CollectiveWatch::CollectiveWatch(MPI_Comm comm, double timeout_s,
                                 std::function<std::int64_t()> current_step, WaitPolicy policy)
    : timeout_s_(timeout_s), current_step_(std::move(current_step)), policy_(policy) {
  LOCKSTEP_CHECK_HINT(timeout_s > 0, "set dist.timeout_s to a positive number of seconds",
                      "collective timeout must be positive, got ", timeout_s, " s");
  LOCKSTEP_CHECK_MPI(MPI_Comm_dup(comm, &comm_));
  LOCKSTEP_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  LOCKSTEP_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  LOCKSTEP_CHECK_MPI(MPI_Comm_size(comm_, &size_));
  // Where every rank runs, gathered now while all are alive, so that a report can name the host
  // and process of a rank that is gone.
  constexpr int kPlace = 128;
  char host[kPlace - 32] = {};
  gethostname(host, sizeof host - 1);
  std::vector<char> mine(kPlace, '\0'), all(static_cast<std::size_t>(size_) * kPlace, '\0');
  std::snprintf(mine.data(), kPlace, "%s, pid %ld", host, static_cast<long>(getpid()));
  LOCKSTEP_CHECK_MPI(
      MPI_Allgather(mine.data(), kPlace, MPI_CHAR, all.data(), kPlace, MPI_CHAR, comm_));
  for (int r = 0; r < size_; ++r)
    places_.emplace_back(&all[static_cast<std::size_t>(r) * kPlace]);
}

CollectiveWatch::~CollectiveWatch() {
  // Replies still unsent go to a peer that timed out and is ending the job; drop them.
  for (Reply& reply : replies_) {
    if (reply.request != MPI_REQUEST_NULL) {
      MPI_Cancel(&reply.request);
      MPI_Request_free(&reply.request);
    }
  }
  MPI_Comm_free(&comm_);
}

void CollectiveWatch::begin(const std::string& what, std::int64_t step) {
  ++seq_;
  step_ = step;
  what_ = what;
  in_flight_ = true;
  since_ = Clock::now();
}

void CollectiveWatch::end() {
  in_flight_ = false;
  since_ = Clock::now();
}

RankStatus CollectiveWatch::status() const {
  RankStatus s;
  s.seq = seq_;
  s.step = step_;
  s.current_step = current_step_ ? current_step_() : 0;
  s.in_flight = in_flight_ ? 1 : 0;
  s.seconds = seconds_between(since_, Clock::now());
  s.set_what(what_);
  return s;
}

void CollectiveWatch::wait(MPI_Request* requests, int count) {
  tighten_timer_slack();
  const auto start = Clock::now();
  for (;;) {
    int done = 0;
    LOCKSTEP_CHECK_MPI(MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE));
    if (done) return;
    const auto now = Clock::now();
    if (seconds_between(since_, now) > timeout_s_) time_out(-1);
    if (first_to_time_out_ >= 0) time_out(first_to_time_out_);
    auto pause =
        policy_.pause_after(std::chrono::duration_cast<std::chrono::microseconds>(now - start));
    if (pause.count() == 0) continue;  // MPI_Test itself yields the core when idle (MpiSession)
    serve();
    std::this_thread::sleep_for(pause);
  }
}

void CollectiveWatch::reap_replies() {
  for (auto it = replies_.begin(); it != replies_.end();) {
    int done = 0;
    LOCKSTEP_CHECK_MPI(MPI_Test(&it->request, &done, MPI_STATUS_IGNORE));
    it = done ? replies_.erase(it) : std::next(it);
  }
}

void CollectiveWatch::serve() {
  reap_replies();
  for (;;) {
    int arrived = 0;
    MPI_Status probe;
    LOCKSTEP_CHECK_MPI(MPI_Iprobe(MPI_ANY_SOURCE, kQueryTag, comm_, &arrived, &probe));
    if (!arrived) return;
    RankStatus asked;
    LOCKSTEP_CHECK_MPI(MPI_Recv(&asked, sizeof asked, MPI_BYTE, probe.MPI_SOURCE, kQueryTag, comm_,
                                MPI_STATUS_IGNORE));
    Reply& reply = replies_.emplace_back();
    reply.status = status();
    LOCKSTEP_CHECK_MPI(MPI_Isend(&reply.status, sizeof reply.status, MPI_BYTE, probe.MPI_SOURCE,
                                 kReplyTag, comm_, &reply.request));
    if (in_flight_ && asked.seq == seq_) {
      // We wait in the same collective: report as well, now.
      if (first_to_time_out_ < 0) first_to_time_out_ = probe.MPI_SOURCE;
    } else if (asked.seq > seq_) {
      // The asker waits for us. Say where we are, once: it ends the job within seconds.
      if (!told_behind_) {
        std::fputs(behind_report(rank_, reply.status, probe.MPI_SOURCE, asked).c_str(), stderr);
        std::fflush(stderr);
        told_behind_ = true;
      }
    }
  }
}

void CollectiveWatch::time_out(int first) {
  const RankStatus mine = status();
  std::vector<RankStatus> answers(static_cast<std::size_t>(size_));
  std::vector<MPI_Request> receives(static_cast<std::size_t>(size_), MPI_REQUEST_NULL);
  std::vector<MPI_Request> queries(static_cast<std::size_t>(size_), MPI_REQUEST_NULL);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    // Best effort from here on: a failing call must not keep the job from ending.
    MPI_Irecv(&answers[r], sizeof(RankStatus), MPI_BYTE, r, kReplyTag, comm_, &receives[r]);
    MPI_Isend(&mine, sizeof mine, MPI_BYTE, r, kQueryTag, comm_, &queries[r]);
  }
  std::vector<std::optional<RankStatus>> peers(static_cast<std::size_t>(size_));
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(kReportGraceSeconds));
  int missing = size_ - 1;
  while (missing > 0 && Clock::now() < deadline) {
    for (int r = 0; r < size_; ++r) {
      if (receives[r] == MPI_REQUEST_NULL || peers[r]) continue;
      int done = 0;
      if (MPI_Test(&receives[r], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) {
        peers[r] = answers[r];
        --missing;
      }
    }
    try {
      serve();  // peers that time out at the same moment ask us too
    } catch (const std::exception&) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::fputs(
      timeout_report(rank_, mine, peers, timeout_s_, kReportGraceSeconds, first, places_).c_str(),
      stderr);
  std::fflush(stderr);

  // Peers that wait in the same collective now report too (our query told them); give them the
  // grace period to hear from everyone before MPI_Abort takes the job down.
  bool others_reporting = false;
  for (int r = 0; r < size_; ++r)
    others_reporting =
        others_reporting || (peers[r] && peers[r]->in_flight && peers[r]->seq == seq_);
  if (others_reporting) {
    const auto linger =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(kReportGraceSeconds + 1.0));
    while (Clock::now() < linger) {
      try {
        serve();
      } catch (const std::exception&) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  abort_job(str("collective #", seq_, " timed out; ending the job"));
}

}  // namespace lockstep::comm::detail
