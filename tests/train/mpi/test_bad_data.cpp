// A NaN in one rank's input reaches every rank as a non-finite averaged gradient: every rank must
// stop with "bad data" (the rank that holds the sample naming it by shard and index, the others
// naming that rank), never with a learning-rate hint.
#include <gtest/gtest.h>

#include <limits>
#include <numeric>

#include "lockstep/train/loop.hpp"
#include "lockstep/train/setup.hpp"
#include "support/mpi_env.hpp"
#include "support/tiny_run.hpp"

namespace lockstep::test {

TEST(TrainMpi, NonFiniteInputOnOneRankIsBadDataOnEveryRank) {
  std::unique_ptr<TempDir> dir;
  std::string path;
  if (world().rank() == 0) {
    dir = std::make_unique<TempDir>();
    path = write_spoiled_tiny_set(dir->path(), "dirty",
                                  {{21, 1, std::numeric_limits<float>::quiet_NaN()}});
  }
  path = world().broadcast(path, 0);
  train::Config c = tiny_config(path);
  c.train_global_batch = 16;
  std::string what;
  try {
    train::train_loop(*train::setup_run(c, world()));
  } catch (const Error& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("bad data at step"), std::string::npos)
      << "rank " << world().rank() << ": " << what;
  EXPECT_EQ(what.find("optim.lr"), std::string::npos) << what;
  // Exactly one rank holds sample 21 (shard 0's index 21) in that step and names it.
  const bool names_it =
      what.find("dirty-00000-of-00002.h5 (shard 0 of 2): 1 sample, index 21") != std::string::npos;
  std::vector<std::int64_t> count = {names_it ? 1 : 0};
  world().allreduce(count, comm::ReduceOp::Sum);
  EXPECT_EQ(count[0], 1);
  if (!names_it) {
    EXPECT_NE(what.find("'s batch (named there)"), std::string::npos) << what;
  }
  world().barrier();  // rank 0's folder lives until every rank is done with it
}

}  // namespace lockstep::test
