// lockstep-train --doctor: a preflight check of a job's ranks, run under the same mpirun/srun and
// config as the job itself. Every rank looks at its own node (host, ranks there, /dev/shm, the
// network interfaces, GPUs, CUDA/cuDNN/NCCL, free space in checkpoint.dir, the data it would read);
// rank 0 gathers the answers, adds what only all ranks together show (config identical on every
// rank, the same GPU on two ranks of a node, clock skew, nodes without a fast interconnect), prints
// one line per rank and the problems found, and the job exits non-zero when one is an error.
// Nothing is trained and nothing is written.
#pragma once

#include <string>
#include <vector>

#include "lockstep/comm/communicator.hpp"
#include "lockstep/train/config.hpp"

namespace lockstep::train {

struct DoctorFinding {
  bool error = false;   // false: a warning
  std::string message;  // names the rank(s), host and key or path
};

// Collective over comm. Returns every rank's findings (the same on every rank) and prints the
// report on rank 0 (to stdout). `describe` is this rank's launch line (MpiSession::describe()).
std::vector<DoctorFinding> run_doctor(const Config& config, comm::Communicator& comm,
                                      const std::string& describe);

// /dev/shm space a job of `local_ranks` ranks per node needs: Open MPI's shared-memory transport
// and NCCL's intra-node buffers keep their segments there. 64 MiB per rank (a stated floor, not a
// measurement of every transport): Docker's default 64 MiB /dev/shm fails a 2-rank node.
std::uint64_t shm_bytes_needed(int local_ranks);

}  // namespace lockstep::train
