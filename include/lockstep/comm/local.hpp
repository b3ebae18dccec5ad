// A communicator over one rank in this process, without MPI: every collective is the identity
// (the sum, max or concatenation over one rank is the rank's own value). For running the trainer
// in-process, in tests and single-process tools, exactly as a 1-rank MPI job would.
#pragma once

#include <memory>

#include "lockstep/comm/communicator.hpp"

namespace lockstep::comm {

std::unique_ptr<Communicator> make_single_rank_communicator();

}  // namespace lockstep::comm
