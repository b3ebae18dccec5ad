// NodeLayout: which ranks share a node, as the hierarchical allreduce and the host checks see it.
#include <gtest/gtest.h>

#include "lockstep/comm/hierarchical.hpp"
#include "lockstep/core/error.hpp"

namespace lockstep::comm {
namespace {

TEST(NodeLayout, NumbersNodesInOrderOfTheirLowestRank) {
  NodeLayout layout({9, 4, 9, 4, 1});
  EXPECT_EQ(layout.nodes(), 3);
  EXPECT_EQ(layout.node_of(0), 0);
  EXPECT_EQ(layout.node_of(1), 1);
  EXPECT_EQ(layout.node_of(4), 2);
  EXPECT_EQ(layout.members(0), (std::vector<int>{0, 2}));
  EXPECT_EQ(layout.members(1), (std::vector<int>{1, 3}));
  EXPECT_EQ(layout.local_rank(2), 1);
  EXPECT_EQ(layout.local_rank(3), 1);
  EXPECT_EQ(layout.local_rank(4), 0);
  EXPECT_EQ(layout.max_ranks_per_node(), 2u);
}

TEST(NodeLayout, DescribesHostsWithTheirRanks) {
  NodeLayout named({0, 0, 1, 1, 1}, {"node1", "node1", "node2", "node2", "node2"});
  EXPECT_EQ(named.describe(), "2 nodes: node1 (ranks 0-1), node2 (ranks 2-4)");
  NodeLayout unnamed({0, 1, 0});
  EXPECT_EQ(unnamed.describe(), "2 nodes: node 0 (ranks 0,2), node 1 (rank 1)");
}

TEST(NodeLayout, DescribeRanksFoldsRuns) {
  EXPECT_EQ(describe_ranks({3}), "rank 3");
  EXPECT_EQ(describe_ranks({0, 1, 2, 5, 7, 8}), "ranks 0-2,5,7-8");
}

TEST(NodeLayout, RefusesHostNamesOfAnotherLength) {
  EXPECT_THROW(NodeLayout({0, 1}, {"a"}), Error);
  EXPECT_THROW(NodeLayout({}), Error);
}

TEST(AllreduceAlgorithm, ParsesTheThreeNamesAndNamesTheKeyOtherwise) {
  EXPECT_EQ(parse_allreduce_algorithm("auto", "dist.algorithm"), AllreduceAlgorithm::Auto);
  EXPECT_EQ(parse_allreduce_algorithm("flat", "dist.algorithm"), AllreduceAlgorithm::Flat);
  EXPECT_EQ(parse_allreduce_algorithm("hierarchical", "dist.algorithm"),
            AllreduceAlgorithm::Hierarchical);
  try {
    parse_allreduce_algorithm("ring", "dist.algorithm");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dist.algorithm = 'ring'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lockstep::comm
