// The NCCL communicator's teardown decision (src/comm/teardown.hpp), tested where it is made: in
// a destructor, with and without an exception unwinding through it. The GPU half, a real NCCL
// communicator destroyed mid-throw, is NcclCommunicator.DestroyedWhileAnErrorUnwinds... in
// tests/mpi (skipped without GPUs).
#include <gtest/gtest.h>

#include <exception>
#include <stdexcept>

#include "comm/teardown.hpp"

namespace lockstep::comm::detail {
namespace {

// Records what a communicator's destructor would decide, as ~NcclCommunicator asks it.
struct DecidesInDestructor {
  Teardown* out;
  ~DecidesInDestructor() { *out = teardown_for(std::uncaught_exceptions()); }
};

TEST(Teardown, ANormalEndDestroysAndFlushesWithThePeers) {
  Teardown decided = Teardown::Abort;
  { DecidesInDestructor d{&decided}; }
  EXPECT_EQ(decided, Teardown::Destroy);
}

TEST(Teardown, AnEndWhileAnErrorUnwindsAborts) {
  Teardown decided = Teardown::Destroy;
  try {
    DecidesInDestructor d{&decided};
    throw std::runtime_error("a rank fails with a collective in flight");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(decided, Teardown::Abort);
}

TEST(Teardown, AnEndInsideACatchBlockDestroys) {
  // Handled errors do not count: the communicator is then destroyed after the catch, normally.
  Teardown decided = Teardown::Abort;
  try {
    throw std::runtime_error("handled");
  } catch (const std::runtime_error&) {
    DecidesInDestructor d{&decided};
  }
  EXPECT_EQ(decided, Teardown::Destroy);
}

}  // namespace
}  // namespace lockstep::comm::detail
