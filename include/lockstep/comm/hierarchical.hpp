// Hierarchical allreduce for the MPI (CPU) path, for jobs spread over several nodes: the ranks
// of a node add their buffers in a shared-memory window, one leader per node allreduces the node
// sums with the other leaders, and every rank copies the result back out of shared memory. Only
// one copy of the data per node crosses the network instead of one per rank. The node sums
// are added in local-rank order, so the result is bitwise the same on every rank and in every
// run with the same layout; against a flat allreduce it differs only by the order of the sum.
// NodeLayout says which ranks share a node; tests inject simulated layouts.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/comm/communicator.hpp"

namespace lockstep::comm {

// dist.algorithm: how gradient buckets are allreduced between MPI ranks.
enum class AllreduceAlgorithm { Auto, Flat, Hierarchical };
const char* allreduce_algorithm_name(AllreduceAlgorithm a);  // "auto", "flat", "hierarchical"
// Throws naming `key` and the accepted values for anything else.
AllreduceAlgorithm parse_allreduce_algorithm(const std::string& value, const std::string& key);

// Which node each rank runs on. Node ids are dense (0..nodes()-1) and numbered in the order of
// each node's lowest rank, so node 0 holds rank 0. A node may hold any number of ranks, and the
// ranks of one node need not be consecutive.
class NodeLayout {
 public:
  // node_of_rank[r] = any id for rank r's node (renumbered here); hosts[r] = its host name
  // for messages (empty: "node N").
  explicit NodeLayout(const std::vector<int>& node_of_rank, std::vector<std::string> hosts = {});
  // The real layout: ranks grouped as MPI groups them into shared-memory domains
  // (MPI_Comm_split_type(SHARED): Open MPI's "same node", which follows the host name a rank
  // was launched under), with each rank's host name. Collective over `mpi`.
  static NodeLayout detect(Communicator& mpi);

  int ranks() const { return static_cast<int>(node_of_rank_.size()); }
  int nodes() const { return static_cast<int>(members_.size()); }
  int node_of(int rank) const { return node_of_rank_.at(rank); }
  const std::vector<int>& members(int node) const { return members_.at(node); }  // ascending
  int local_rank(int rank) const;  // position of rank among its node's members
  std::size_t max_ranks_per_node() const;
  std::string host(int node) const;  // "node1" (or "node 1" when no host names are known)
  // "2 nodes: node1 (ranks 0-1), node2 (ranks 2-3)"
  std::string describe() const;

 private:
  std::vector<int> node_of_rank_;
  std::vector<std::vector<int>> members_;
  std::vector<std::string> hosts_;  // per node
};

// "ranks 0-1", "rank 3", "ranks 0,2,4": a rank list for messages.
std::string describe_ranks(const std::vector<int>& ranks);

// Auto is flat for now: on every link measured on the namespace cluster (unshaped, 10 and
// 1 Gbit/s; docs/MULTINODE.md) the hierarchical allreduce of 2-64 MiB buckets took 0.9-1.9x the
// time of the flat one, since there the ranks share two cores and its extra copies and node
// barriers cost more than the bytes it keeps off the link. Hierarchical stays one setting away
// for clusters where a measurement favours it; Flat and Hierarchical are returned as given.
AllreduceAlgorithm resolve_allreduce_algorithm(AllreduceAlgorithm requested,
                                               const NodeLayout& layout);

// Why 4 MiB: the shared-memory window holds (ranks on the node + 2) segments, so it bounds that
// memory to 24 MiB at 4 ranks per node, while each segment still carries enough bytes that the
// leaders' per-segment allreduce is bandwidth-bound (at 1 Gbit/s 4 MiB take 34 ms against
// ~0.1 ms of latency); larger buckets are pipelined segment after segment. Measured on the
// namespace cluster (docs/MULTINODE.md): 1 MiB segments doubled the time of a 32 MiB bucket
// (a fixed cost per segment: 3 node barriers), 16 MiB were within noise of 4 MiB.
inline constexpr std::size_t kHierarchicalSegmentBytes = std::size_t{4} << 20;

struct HierarchicalOptions {
  std::size_t segment_bytes = kHierarchicalSegmentBytes;
};

// A Communicator whose tensor allreduce is hierarchical over `layout`; every other call is
// forwarded to `mpi`. `mpi` must come from make_mpi_communicator and outlive the result; the
// hierarchical allreduces run on its communication thread, in order with its other calls, so
// no second MPI thread is needed. Each node of `layout` must lie inside one shared-memory
// domain of MPI (an error names the ranks otherwise). Collective over `mpi`.
std::unique_ptr<Communicator> make_hierarchical_communicator(
    Communicator& mpi, const NodeLayout& layout, const HierarchicalOptions& options = {});

// The communicator gradients should use under `algorithm` on `layout`: a hierarchical one, or
// nullptr for "use `mpi` as it is" (flat). Collective over `mpi`.
std::unique_ptr<Communicator> make_gradient_communicator(Communicator& mpi,
                                                         AllreduceAlgorithm algorithm,
                                                         const NodeLayout& layout);

// Throws on every rank when `value` differs between ranks, naming the hosts and their ranks
// with each value ("node1 (ranks 0-1) has cpu, node2 (ranks 2-3) has cuda"), e.g. a device kind:
// mixed CPU/GPU nodes would otherwise pick different gradient transports and hang.
// Collective over `comm`.
void check_same_on_all_hosts(Communicator& comm, const NodeLayout& layout, const std::string& what,
                             const std::string& value, const std::string& hint);

// This process's host name (gethostname).
std::string this_host();

}  // namespace lockstep::comm
