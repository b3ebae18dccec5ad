#include "comm/mpi_allreduce.hpp"

#include "comm/mpi_check.hpp"

namespace lockstep::comm::detail {
namespace {

// Tags of the short allreduce's messages (collectives never match point-to-point messages).
constexpr int kFoldTag = 101, kExchangeTag = 102, kUnfoldTag = 103;

// Recursive doubling as MPICH does it: with p = pof2 + rem ranks, the first 2*rem ranks pair up
// and fold (odd ranks take their even neighbour's data), leaving pof2 ranks that exchange with
// partners at distance 1, 2, 4, ..., combining each time; folded-out ranks get the result last.
void short_allreduce(void* data, int count, MPI_Datatype type, std::size_t bytes, MPI_Op op,
                     MPI_Comm comm, CollectiveWatch& watch, std::vector<std::byte>& scratch) {
  int rank = 0, size = 1;
  LOCKSTEP_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  LOCKSTEP_CHECK_MPI(MPI_Comm_size(comm, &size));
  if (size == 1 || count == 0) return;
  if (scratch.size() < bytes) scratch.resize(bytes);
  void* incoming = scratch.data();
  int pof2 = 1;
  while (pof2 * 2 <= size)
    pof2 *= 2;
  const int rem = size - pof2;

  int position = rank - rem;  // in the power-of-two group; -1: folded out
  if (rank < 2 * rem) {
    MPI_Request r;
    if (rank % 2 == 0) {
      LOCKSTEP_CHECK_MPI(MPI_Isend(data, count, type, rank + 1, kFoldTag, comm, &r));
      watch.wait(r);
      position = -1;
    } else {
      LOCKSTEP_CHECK_MPI(MPI_Irecv(incoming, count, type, rank - 1, kFoldTag, comm, &r));
      watch.wait(r);
      LOCKSTEP_CHECK_MPI(MPI_Reduce_local(incoming, data, count, type, op));
      position = rank / 2;
    }
  }
  if (position >= 0) {
    for (int distance = 1; distance < pof2; distance *= 2) {
      const int partner_position = position ^ distance;
      const int partner =
          partner_position < rem ? partner_position * 2 + 1 : partner_position + rem;
      MPI_Request r[2];
      LOCKSTEP_CHECK_MPI(MPI_Irecv(incoming, count, type, partner, kExchangeTag, comm, &r[0]));
      LOCKSTEP_CHECK_MPI(MPI_Isend(data, count, type, partner, kExchangeTag, comm, &r[1]));
      watch.wait(r, 2);
      LOCKSTEP_CHECK_MPI(MPI_Reduce_local(incoming, data, count, type, op));
    }
  }
  if (rank < 2 * rem) {
    MPI_Request r;
    if (rank % 2 == 1)
      LOCKSTEP_CHECK_MPI(MPI_Isend(data, count, type, rank - 1, kUnfoldTag, comm, &r));
    else
      LOCKSTEP_CHECK_MPI(MPI_Irecv(data, count, type, rank + 1, kUnfoldTag, comm, &r));
    watch.wait(r);
  }
}

}  // namespace

void allreduce_in_place(void* data, int count, MPI_Datatype type, std::size_t bytes, MPI_Op op,
                        MPI_Comm comm, CollectiveWatch& watch, std::vector<std::byte>& scratch) {
  if (bytes <= kShortAllreduceBytes) {
    short_allreduce(data, count, type, bytes, op, comm, watch, scratch);
    return;
  }
  MPI_Request request;
  LOCKSTEP_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, data, count, type, op, comm, &request));
  watch.wait(request);
}

}  // namespace lockstep::comm::detail
