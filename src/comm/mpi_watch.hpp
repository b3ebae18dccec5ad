// CollectiveWatch: how the MPI communicator's thread waits for a collective. Every collective is
// started non-blocking and polled (WaitPolicy in hang_report.hpp): MPI_Test continuously for 1 ms,
// then with sleeps of a growing fraction of the time waited, so that a rank waiting for a late or
// hung peer costs almost no CPU. Open MPI progresses a non-blocking collective only inside MPI
// calls, so the polls also drive it; the fraction bounds how much a sleep can delay it.
// A collective still unfinished after timeout_s ends the job like NCCL's watchdog on the GPU path
// (and PyTorch's desync report): this rank asks every peer, over point-to-point messages on a
// communicator of its own, where it stands (RankStatus), waits a short grace period, prints
// which ranks did not arrive (hang_report.hpp) and calls MPI_Abort. Peers answer from their own
// communication threads, which also poll for questions while idle (serve()).
// Internal to comm/; every method runs on the communication thread, except set_step's reader.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <string>
#include <vector>

#include "comm/hang_report.hpp"

namespace lockstep::comm::detail {

class CollectiveWatch {
 public:
  // Duplicates `comm` for the status messages (collective, so every rank constructs it at the
  // same point). `current_step` returns the caller's training step (any thread may set it).
  CollectiveWatch(MPI_Comm comm, double timeout_s, std::function<std::int64_t()> current_step,
                  WaitPolicy policy = {});
  ~CollectiveWatch();
  CollectiveWatch(const CollectiveWatch&) = delete;
  CollectiveWatch& operator=(const CollectiveWatch&) = delete;

  double timeout_s() const { return timeout_s_; }

  // Brackets one collective: `step` is the training step it was issued in.
  void begin(const std::string& what, std::int64_t step);
  void end();
  // Returns once every request has completed (throws lockstep::Error on an MPI error). If the
  // collective begun last is older than the timeout, or a peer reports that it timed out in it,
  // reports and ends the job instead.
  void wait(MPI_Request* requests, int count);
  void wait(MPI_Request& request) { wait(&request, 1); }
  // Answers the status queries that have arrived; call regularly while idle.
  void serve();

 private:
  using Clock = std::chrono::steady_clock;
  RankStatus status() const;
  // Reports and ends the job; `first` is the peer whose timeout triggered ours, or -1.
  [[noreturn]] void time_out(int first);
  void reap_replies();

  MPI_Comm comm_ = MPI_COMM_NULL;  // our own duplicate: status messages only
  int rank_ = 0, size_ = 1;
  std::vector<std::string> places_;  // per rank: "host, pid N"
  double timeout_s_;
  std::function<std::int64_t()> current_step_;
  WaitPolicy policy_;

  // The collective begun last (in flight while in_flight_).
  std::int64_t seq_ = 0;
  std::int64_t step_ = 0;
  std::string what_;
  bool in_flight_ = false;
  Clock::time_point since_ = Clock::now();  // begin of it, or its end when idle

  int first_to_time_out_ = -1;  // a peer that reported a timeout in our collective: report too
  bool told_behind_ = false;    // printed behind_report once already
  struct Reply {
    RankStatus status;
    MPI_Request request = MPI_REQUEST_NULL;
  };
  std::list<Reply> replies_;  // answers still being sent (their buffers must stay put)
};

}  // namespace lockstep::comm::detail
