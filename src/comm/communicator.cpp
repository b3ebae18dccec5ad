#include "lockstep/comm/communicator.hpp"

#include "lockstep/core/error.hpp"

namespace lockstep::comm {
namespace {
std::string shorten(const std::string& s) {
  constexpr std::size_t kShown = 48;
  return s.size() <= kShown ? s : s.substr(0, kShown) + str("... (", s.size(), " chars)");
}
}  // namespace

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "?";
}

void Communicator::abort(const std::string& why) {
  LOCKSTEP_FAIL("the ", backend(), " communicator of rank ", rank(),
                " cannot end its collectives in flight (", why,
                "): MPI has no call for it; end the job instead (MPI_Abort)");
}

void check_same_on_all_ranks(Communicator& comm, const std::string& what,
                             const std::string& value) {
  std::vector<std::string> all = comm.allgather(value);
  for (int r = 1; r < static_cast<int>(all.size()); ++r) {
    LOCKSTEP_CHECK_HINT(all[r] == all[0],
                        "start every rank with the same binary, config file and overrides", what,
                        " differs between ranks: rank 0 has \"", shorten(all[0]), "\", rank ", r,
                        " has \"", shorten(all[r]), "\"");
  }
}

}  // namespace lockstep::comm
